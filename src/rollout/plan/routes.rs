//! Whether a step's routes are in force: the HTTPRoute carries the step's
//! weight and each gateway serving it (an `Accepted` parent the route
//! names) has seen that generation. A route no gateway reports on is taken
//! on the grace period alone, as before any gateway could be asked; a
//! gateway that refuses the route serves none of it, old or new, and is
//! not waited for. Pure.

use std::time::Duration;

use serde_json::Value;

use crate::rollout::api::RequestMatch;

/// How soon a release waiting on a gateway (to take a step's route, or to
/// stop sending to a canary that is going) looks again; the gateway's
/// status write wakes a sync too.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Whether a rule's backendRef names the Service `name` (a Service is the
/// default kind): the one test the overlay and the read-back share.
pub fn is_service_ref(backend: &Value, name: &str) -> bool {
    backend.is_object()
        && backend["name"].as_str() == Some(name)
        && backend["kind"].as_str().is_none_or(|k| k == "Service")
}

/// What a step asks of the routes: a share of every request, and the
/// requests that reach the canary whatever the share (A/B).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepRoute {
    pub percent: u32,
    pub matches: Vec<RequestMatch>,
}

impl StepRoute {
    /// As `status.canaryStatus.traffic` shows it.
    pub fn describe(route: Option<&StepRoute>) -> String {
        match route {
            Some(route) if !route.matches.is_empty() => format!("{}% + matching requests", route.percent),
            Some(route) => format!("{}%", route.percent),
            None => "0%".to_string(),
        }
    }
}

/// What observe read of one HTTPRoute of the release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteSeen {
    pub name: String,
    /// The weight of the canary backend in the rules that send to the
    /// stable Service (the lowest, when rules differ); `None` when none has
    /// one, or no rule sends to the stable Service (then the release does
    /// not touch the route).
    pub canary_weight: Option<u32>,
    /// Some rule sends to the stable Service.
    pub splits: bool,
    /// Some rule sends requests to the canary Service (a weight other than 0).
    pub to_canary: bool,
    pub generation: i64,
    /// The oldest generation a gateway serving the route reports; `None`
    /// when none reports one.
    pub accepted_generation: Option<i64>,
}

impl RouteSeen {
    /// The generation a gateway serving the route has taken, when it is
    /// behind the route's own.
    fn behind(&self) -> Option<i64> {
        self.accepted_generation.filter(|accepted| *accepted < self.generation)
    }
}

/// Reads a live HTTPRoute for the release of `service`, whose canary Service is `canary`.
pub fn seen(route: &Value, service: &str, canary: &str) -> RouteSeen {
    let rules = route["spec"]["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
    let stable_rules: Vec<&Vec<Value>> = rules
        .iter()
        .filter_map(|rule| rule["backendRefs"].as_array())
        .filter(|refs| refs.iter().any(|r| is_service_ref(r, service)))
        .collect();
    let canary_weight = stable_rules
        .iter()
        .filter_map(|refs| {
            let canary_ref = refs.iter().find(|r| is_service_ref(r, canary))?;
            // Gateway API's default weight is 1.
            Some(canary_ref["weight"].as_u64().unwrap_or(1).min(u64::from(u32::MAX)) as u32)
        })
        .min();
    let to_canary = rules
        .iter()
        .filter_map(|rule| rule["backendRefs"].as_array())
        .flatten()
        .any(|r| is_service_ref(r, canary) && r["weight"].as_u64() != Some(0));
    let namespace = route["metadata"]["namespace"].as_str().unwrap_or_default();
    let parent_key = |p: &Value| {
        (
            p["name"].as_str().unwrap_or_default().to_string(),
            p["namespace"].as_str().unwrap_or(namespace).to_string(),
        )
    };
    let named: Vec<_> = route["spec"]["parentRefs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(parent_key)
        .collect();
    let accepted_generation = route["status"]["parents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| named.contains(&parent_key(&p["parentRef"])))
        .filter_map(|p| p["conditions"].as_array())
        .flatten()
        .filter(|c| c["type"] == "Accepted" && c["status"] == "True")
        .filter_map(|c| c["observedGeneration"].as_i64())
        .min();
    RouteSeen {
        name: route["metadata"]["name"].as_str().unwrap_or_default().to_string(),
        canary_weight,
        splits: !stable_rules.is_empty(),
        to_canary,
        generation: route["metadata"]["generation"].as_i64().unwrap_or(0),
        accepted_generation,
    }
}

/// Why the step's share of `percent` is not yet in force on `routes`, if
/// it is not. `None` for `routes`: they were not read in this pass.
pub fn lag(routes: Option<&[RouteSeen]>, percent: u32) -> Option<String> {
    let Some(routes) = routes else {
        return Some("reading the routes back".to_string());
    };
    routes.iter().find_map(|route| {
        let name = &route.name;
        if route.splits && route.canary_weight != Some(percent) {
            let live = route
                .canary_weight
                .map_or("no canary backend".to_string(), |w| format!("weight {w}"));
            return Some(format!("HTTPRoute {name} holds {live}, not {percent}"));
        }
        route.behind().map(|accepted| {
            format!(
                "the gateway has accepted generation {accepted} of HTTPRoute {name}, not yet {}",
                route.generation
            )
        })
    })
}

/// Why the canary's objects must stay a while longer as a release ends: a
/// route still sends requests to the canary, or a gateway has not yet taken
/// the route that stopped doing so. Deleting the canary Service or its pods
/// first would fail the requests the gateway still sends there.
pub fn still_to_canary(routes: &[RouteSeen]) -> Option<String> {
    routes.iter().find_map(|route| {
        let name = &route.name;
        if route.to_canary {
            return Some(format!("HTTPRoute {name} still sends requests to the canary"));
        }
        route.behind().map(|_| {
            format!(
                "the gateway has not yet taken generation {} of HTTPRoute {name}, which sends nothing to the canary",
                route.generation
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(weight: Option<u32>, generation: i64, parents: Value) -> Value {
        let mut canary = json!({"name": "echo-canary", "port": 80});
        if let Some(weight) = weight {
            canary["weight"] = json!(weight);
        }
        json!({
            "metadata": {"name": "echo", "namespace": "demo", "generation": generation},
            "spec": {
                "parentRefs": [{"name": "gateway", "namespace": "edge"}],
                "rules": [
                    {"backendRefs": [{"name": "echo", "port": 80, "weight": 80}, canary]},
                    {"backendRefs": [{"name": "other", "port": 80}]}
                ]
            },
            "status": {"parents": parents}
        })
    }

    fn parent(name: &str, status: &str, generation: Option<i64>) -> Value {
        let mut accepted = json!({"type": "Accepted", "status": status});
        if let Some(generation) = generation {
            accepted["observedGeneration"] = json!(generation);
        }
        json!({"parentRef": {"name": name, "namespace": "edge"}, "conditions": [accepted]})
    }

    fn lag_of(route: &Value, percent: u32) -> Option<String> {
        lag(Some(&[seen(route, "echo", "echo-canary")]), percent)
    }

    #[test]
    fn a_step_is_in_force_once_the_gateway_accepted_the_generation_carrying_its_weight() {
        assert_eq!(
            lag_of(&route(Some(20), 4, json!([parent("gateway", "True", Some(4))])), 20),
            None
        );
        assert_eq!(
            lag_of(&route(Some(20), 4, json!([parent("gateway", "True", Some(3))])), 20).as_deref(),
            Some("the gateway has accepted generation 3 of HTTPRoute echo, not yet 4")
        );
    }

    #[test]
    fn a_route_without_the_weight_is_not_in_force() {
        let accepted = json!([parent("gateway", "True", Some(4))]);
        assert_eq!(
            lag_of(&route(Some(10), 4, accepted.clone()), 20).as_deref(),
            Some("HTTPRoute echo holds weight 10, not 20")
        );
        let none = lag(Some(&[seen(&route(None, 4, accepted), "echo", "other-canary")]), 20);
        assert_eq!(none.as_deref(), Some("HTTPRoute echo holds no canary backend, not 20"));
    }

    #[test]
    fn only_gateways_the_route_names_and_that_serve_it_are_waited_for() {
        let parents = json!([
            parent("gateway", "True", Some(4)),
            // A gateway the route no longer names, and one that refuses it: neither serves it.
            parent("old", "True", Some(1)),
            parent("gateway", "False", Some(2)),
        ]);
        assert_eq!(lag_of(&route(Some(20), 4, parents), 20), None);
        // A generation not reported is not taken as behind.
        assert_eq!(
            lag_of(&route(Some(20), 4, json!([parent("gateway", "True", None)])), 20),
            None
        );
    }

    #[test]
    fn a_route_no_gateway_reports_on_or_that_does_not_send_to_stable_is_taken_as_written() {
        let unreported = seen(&route(Some(20), 4, json!([])), "echo", "echo-canary");
        assert_eq!(unreported.accepted_generation, None);
        assert_eq!(lag(Some(&[unreported]), 20), None);
        let elsewhere = seen(&route(None, 4, json!([])), "api", "api-canary");
        assert!(!elsewhere.splits);
        assert_eq!(lag(Some(&[elsewhere]), 20), None);
        // The default weight of a backend is 1.
        assert_eq!(
            seen(&route(None, 1, json!([])), "echo", "echo-canary").canary_weight,
            Some(1)
        );
        // Not read in this pass: wait for the next.
        assert!(lag(None, 20).is_some());
    }

    #[test]
    fn a_canary_goes_only_once_no_gateway_sends_to_it() {
        let accepted = |generation| json!([parent("gateway", "True", Some(generation))]);
        let split = seen(&route(Some(20), 4, accepted(4)), "echo", "echo-canary");
        assert!(still_to_canary(&[split]).is_some());
        // Git's route again, not yet taken by the gateway.
        let mut restored = route(None, 5, accepted(4));
        restored["spec"]["rules"][0]["backendRefs"] = json!([{"name": "echo", "port": 80}]);
        let written = seen(&restored, "echo", "echo-canary");
        assert!(!written.to_canary);
        assert!(still_to_canary(&[written]).is_some());
        restored["status"]["parents"] = accepted(5);
        assert_eq!(still_to_canary(&[seen(&restored, "echo", "echo-canary")]), None);
        // A canary backend at weight 0 sends nothing.
        assert_eq!(
            still_to_canary(&[seen(&route(Some(0), 4, accepted(4)), "echo", "echo-canary")]),
            None
        );
    }
}
