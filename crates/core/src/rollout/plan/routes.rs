//! Whether a step's routes are in force: the HTTPRoute carries the step's
//! weight and each gateway serving it (an `Accepted` parent the route
//! names) has seen that generation. A route no gateway reports on is taken
//! on the grace period alone, as before any gateway could be asked; a
//! gateway that refuses the route serves none of it, old or new, and is
//! not waited for. Pure.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use super::{Intent, Observed, parse_percent};
use crate::rollout::api::{HeaderModifier, RequestMatch, RolloutSpec};

/// How soon a release waiting on a gateway (to take a step's route, or to
/// stop sending to a canary that is going) looks again; the gateway's
/// status write wakes a sync too.
pub const RECHECK: Duration = Duration::from_secs(1);

/// Whether the canary can take traffic now: a Service can select its pods
/// only once they run a known revision, and only a Rollout that keeps a
/// canary Service routes to one. Until then Git's routes stay in force.
pub fn route(spec: &RolloutSpec, observed: &Observed, intent: &mut Intent) {
    let keeps_service = !spec.strategy.canary.canary_service_disabled();
    intent.route_canary = intent.canary_replicas.is_some() && !observed.canary_revision.is_empty() && keeps_service;
    if !intent.route_canary {
        intent.traffic = None;
        intent.matches.clear();
        intent.header_modifier = None;
        intent.mirror = None;
    }
    // Pods of a canary Deployment being removed (an abort's, a promote's)
    // still match the stable Service's own selector: it stays on the stable
    // pods until they are gone (the canary Deployment is deleted in the
    // foreground, so it is observed until then), or it would send them its
    // share. A StatefulSet's canary pods are its own, rolled back in place.
    let canary_deployment = spec.workload_ref.kind == "Deployment";
    let canary_pods_remain =
        canary_deployment && intent.canary_replicas.is_none() && !observed.canary_revision.is_empty();
    // A canary Deployment's pods match the stable Service too: it is pinned
    // from the release's first pass, before the canary has a pod.
    let canary_wanted = canary_deployment && intent.canary_replicas.is_some();
    let blue_green = spec.strategy.style == crate::rollout::api::Style::BlueGreen;
    let pin_wanted =
        intent.pin_stable_service && (intent.route_canary || blue_green || canary_wanted) || canary_pods_remain;
    intent.pin_stable_service = pin_wanted && !observed.stable_revision.is_empty();
    // This pass pins it; the canary's first pods wait for the next, which
    // sees the pin live. No stable revision yet (a rebuilt cluster makes
    // the stable workload in this pass): nothing to pin to, so the canary
    // waits for one too.
    intent.await_pin = canary_wanted
        && pin_wanted
        && !spec.strategy.canary.traffic_routings.is_empty()
        && observed.canary_revision.is_empty()
        && (observed.stable_revision.is_empty() || !observed.stable_services_pinned);
}

/// How soon a release waiting for its stable Service's pin looks again:
/// at once the first time (the pass that wrote the pin has its write in the
/// watch cache, as the API server stored it, so the next pass reads it
/// back), then as for a gateway.
pub const PIN_RECHECK: Duration = Duration::ZERO;

/// The step's message while the canary waits for the pin.
pub const AWAITING_PIN: &str =
    "waiting for the stable Service to select the stable pods alone before making canary pods";

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
    /// Headers changed on the requests `matches` send to the canary.
    pub header_modifier: Option<HeaderModifier>,
    /// Percent of the stable's requests copied to the canary.
    pub mirror: Option<u32>,
}

impl StepRoute {
    /// As `status.canaryStatus.traffic` shows it.
    pub fn describe(route: Option<&StepRoute>) -> String {
        let Some(route) = route else {
            return "0%".to_string();
        };
        let matching = if route.matches.is_empty() {
            ""
        } else {
            " + matching requests"
        };
        let mirrored = route.mirror.map(|p| format!(" + {p}% mirrored")).unwrap_or_default();
        format!("{}%{matching}{mirrored}", route.percent)
    }
}

/// The route a step sets: its `traffic`, its `matches` (with which a step
/// without `traffic` sends no other request to the canary, as in Kruise),
/// their header changes, and its mirror.
pub fn step_traffic(spec: &RolloutSpec, index: u32) -> Option<StepRoute> {
    let step = spec.strategy.canary.steps.get(index.checked_sub(1)? as usize)?;
    let percent = step.traffic.as_deref().and_then(|t| parse_percent(t).ok());
    if percent.is_none() && step.matches.is_empty() && step.mirror.is_none() {
        return None;
    }
    Some(StepRoute {
        percent: percent.unwrap_or(0),
        matches: step.matches.clone(),
        header_modifier: step.request_header_modifier.clone(),
        mirror: step.mirror.as_ref().map(|m| m.percent),
    })
}

/// The route in force at a step: the last step at or before it that sets one.
pub fn traffic_at(spec: &RolloutSpec, index: u32) -> Option<StepRoute> {
    (1..=index).rev().find_map(|i| step_traffic(spec, i))
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

/// What a Gateway serving one of the release's HTTPRoutes says it can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySeen {
    pub route: String,
    /// `namespace/name`.
    pub gateway: String,
    /// Its GatewayClass; empty when the Gateway could not be read.
    pub class: String,
    /// What its class lists in `status.supportedFeatures`, or why that
    /// could not be read (a Gateway or class that is missing or unreadable,
    /// a class that lists nothing).
    pub features: Result<BTreeSet<String>, String>,
}

/// Gateway API's names for mirroring every request, and a share of them.
pub const MIRROR_FEATURE: &str = "HTTPRouteRequestMirror";
pub const PERCENT_MIRROR_FEATURE: &str = "HTTPRouteRequestPercentageMirror";

/// The feature names a GatewayClass lists: `[{name: X}]` since Gateway API
/// v1.2, plain strings before.
pub fn supported_features(class: &Value) -> Option<BTreeSet<String>> {
    let listed = class["status"]["supportedFeatures"].as_array()?;
    let names: BTreeSet<String> = listed
        .iter()
        .filter_map(|f| f.as_str().or_else(|| f["name"].as_str()))
        .map(str::to_string)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Why a release whose steps mirror cannot start: a Gateway serving its
/// route does not say it can mirror. One that cannot may answer every
/// request of a rule with a mirror with an error (Traefik answers 500 and
/// reports nothing), so a mirror is written only where the class lists it.
pub fn mirror_problem(spec: &RolloutSpec, gateways: &[GatewaySeen]) -> Option<String> {
    let percents: Vec<u32> = spec
        .strategy
        .canary
        .steps
        .iter()
        .filter_map(|s| Some(s.mirror.as_ref()?.percent))
        .collect();
    if percents.is_empty() {
        return None;
    }
    let mut needed = vec![MIRROR_FEATURE];
    if percents.iter().any(|p| *p < 100) {
        needed.push(PERCENT_MIRROR_FEATURE);
    }
    if gateways.is_empty() {
        return Some(
            "a step mirrors, and the release's HTTPRoutes name no Gateway to ask whether it can: name one in parentRefs"
                .to_string(),
        );
    }
    gateways.iter().find_map(|seen| {
        let (route, gateway, class) = (&seen.route, &seen.gateway, &seen.class);
        let features = match &seen.features {
            Ok(features) => features,
            Err(why) => {
                return Some(format!(
                    "a step mirrors, and whether Gateway {gateway} (serving HTTPRoute {route}) can mirror is unknown: {why}"
                ));
            }
        };
        let missing: Vec<&str> = needed.iter().copied().filter(|f| !features.contains(*f)).collect();
        (!missing.is_empty()).then(|| {
            format!(
                "a step mirrors, and GatewayClass {class} of Gateway {gateway} (serving HTTPRoute {route}) does not list {} among its supportedFeatures: the route would break rather than mirror",
                missing.join(" or ")
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

    #[test]
    fn a_release_mirrors_only_through_gateways_whose_class_lists_mirroring() {
        let mut spec = RolloutSpec::default();
        assert_eq!(mirror_problem(&spec, &[]), None, "no mirror step, nothing asked");
        spec.strategy.canary.steps = vec![crate::rollout::api::CanaryStep {
            mirror: Some(crate::rollout::api::Mirror { percent: 100 }),
            ..Default::default()
        }];
        let class = |features: Value| json!({"status": {"supportedFeatures": features}});
        let seen = |features: Option<BTreeSet<String>>| GatewaySeen {
            route: "echo".into(),
            gateway: "edge/web".into(),
            class: "traefik".into(),
            features: features.ok_or_else(|| "GatewayClass traefik lists no supportedFeatures".to_string()),
        };
        let traefik = supported_features(&class(
            json!([{"name": "HTTPRouteQueryParamMatching"}, {"name": "Gateway"}]),
        ));
        let problem = mirror_problem(&spec, &[seen(traefik)]).unwrap();
        assert!(
            problem.contains(
                "GatewayClass traefik of Gateway edge/web (serving HTTPRoute echo) does not list HTTPRouteRequestMirror"
            ),
            "{problem}"
        );
        let mirrors = supported_features(&class(json!(["HTTPRouteRequestMirror"])));
        assert_eq!(
            mirror_problem(&spec, &[seen(mirrors.clone())]),
            None,
            "v1.1's plain names read too"
        );
        spec.strategy.canary.steps[0].mirror = Some(crate::rollout::api::Mirror { percent: 10 });
        let problem = mirror_problem(&spec, &[seen(mirrors)]).unwrap();
        assert!(
            problem.contains("does not list HTTPRouteRequestPercentageMirror"),
            "{problem}"
        );
        let both = supported_features(&class(
            json!([{"name": MIRROR_FEATURE}, {"name": PERCENT_MIRROR_FEATURE}]),
        ));
        assert_eq!(mirror_problem(&spec, &[seen(both)]), None);
        assert_eq!(supported_features(&class(json!([]))), None);
        let problem = mirror_problem(&spec, &[seen(None)]).unwrap();
        assert!(
            problem.contains("can mirror is unknown: GatewayClass traefik lists no supportedFeatures"),
            "{problem}"
        );
        assert!(mirror_problem(&spec, &[]).unwrap().contains("name no Gateway"));
    }
}
