//! Whether a step's routes are in force: the HTTPRoute carries the step's
//! weight and its gateway has accepted that generation of it. A route no
//! gateway reports on (no `status.parents`) is taken on the grace period
//! alone, as before any gateway could be asked. Pure.

use serde_json::Value;

/// What observe read of one HTTPRoute of the release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteSeen {
    pub name: String,
    /// The weight of the canary backend in the rules that send to the
    /// stable Service (the lowest, when rules differ); `None` when none has one.
    pub canary_weight: Option<u32>,
    pub generation: i64,
    /// The oldest generation a gateway reports Accepted; `None` when no
    /// gateway reports on the route.
    pub accepted_generation: Option<i64>,
    /// A gateway's refusal, as it words it.
    pub refused: Option<String>,
}

/// Reads a live HTTPRoute for the release of `service`, whose canary Service is `canary`.
pub fn seen(route: &Value, service: &str, canary: &str) -> RouteSeen {
    let rules = route["spec"]["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
    let canary_weight = rules
        .iter()
        .filter_map(|rule| rule["backendRefs"].as_array())
        .filter(|refs| refs.iter().any(|r| r["name"].as_str() == Some(service)))
        .filter_map(|refs| {
            let canary_ref = refs.iter().find(|r| r["name"].as_str() == Some(canary))?;
            // Gateway API's default weight is 1.
            Some(canary_ref["weight"].as_u64().unwrap_or(1) as u32)
        })
        .min();
    let parents = route["status"]["parents"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let accepted: Vec<&Value> = parents
        .iter()
        .filter_map(|p| p["conditions"].as_array())
        .flatten()
        .filter(|c| c["type"] == "Accepted")
        .collect();
    let refused = accepted.iter().find(|c| c["status"] != "True").map(|c| {
        format!(
            "{}: {}",
            c["reason"].as_str().unwrap_or("not accepted"),
            c["message"].as_str().unwrap_or_default()
        )
    });
    RouteSeen {
        name: route["metadata"]["name"].as_str().unwrap_or_default().to_string(),
        canary_weight,
        generation: route["metadata"]["generation"].as_i64().unwrap_or(0),
        accepted_generation: accepted
            .iter()
            .map(|c| c["observedGeneration"].as_i64().unwrap_or(0))
            .min(),
        refused,
    }
}

/// Why the step's share of `percent` is not yet in force on `routes`, if it is not.
pub fn lag(routes: &[RouteSeen], percent: u32) -> Option<String> {
    routes.iter().find_map(|route| {
        let name = &route.name;
        if route.canary_weight != Some(percent) {
            let live = route
                .canary_weight
                .map_or("no canary backend".to_string(), |w| format!("weight {w}"));
            return Some(format!("HTTPRoute {name} holds {live}, not {percent}"));
        }
        if let Some(refused) = &route.refused {
            return Some(format!("the gateway does not accept HTTPRoute {name}: {refused}"));
        }
        match route.accepted_generation {
            Some(accepted) if accepted < route.generation => Some(format!(
                "the gateway has accepted generation {accepted} of HTTPRoute {name}, not yet {}",
                route.generation
            )),
            _ => None,
        }
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
            "metadata": {"name": "echo", "generation": generation},
            "spec": {"rules": [
                {"backendRefs": [{"name": "echo", "port": 80, "weight": 80}, canary]},
                {"backendRefs": [{"name": "other", "port": 80}]}
            ]},
            "status": {"parents": parents}
        })
    }

    fn accepted(status: &str, generation: i64) -> Value {
        json!([{"parentRef": {"name": "gateway"}, "conditions": [
            {"type": "Accepted", "status": status, "observedGeneration": generation, "reason": if status == "True" { "Accepted" } else { "UnsupportedValue" }, "message": "weights"},
            {"type": "ResolvedRefs", "status": "True", "observedGeneration": generation}
        ]}])
    }

    #[test]
    fn a_step_is_in_force_once_the_gateway_accepted_the_generation_carrying_its_weight() {
        let caught_up = seen(&route(Some(20), 4, accepted("True", 4)), "echo", "echo-canary");
        assert_eq!(lag(&[caught_up], 20), None);
        let behind = seen(&route(Some(20), 4, accepted("True", 3)), "echo", "echo-canary");
        assert_eq!(
            lag(&[behind], 20).as_deref(),
            Some("the gateway has accepted generation 3 of HTTPRoute echo, not yet 4")
        );
    }

    #[test]
    fn a_route_without_the_weight_or_refused_is_not_in_force() {
        let old = seen(&route(Some(10), 4, accepted("True", 4)), "echo", "echo-canary");
        assert_eq!(
            lag(&[old], 20).as_deref(),
            Some("HTTPRoute echo holds weight 10, not 20")
        );
        let none = seen(&route(None, 4, accepted("True", 4)), "echo", "other-canary");
        assert_eq!(
            lag(&[none], 20).as_deref(),
            Some("HTTPRoute echo holds no canary backend, not 20")
        );
        let refused = seen(&route(Some(20), 4, accepted("False", 4)), "echo", "echo-canary");
        assert_eq!(
            lag(&[refused], 20).as_deref(),
            Some("the gateway does not accept HTTPRoute echo: UnsupportedValue: weights")
        );
    }

    #[test]
    fn a_route_no_gateway_reports_on_is_taken_as_written() {
        let unreported = seen(&route(Some(20), 4, json!([])), "echo", "echo-canary");
        assert_eq!(unreported.accepted_generation, None);
        assert_eq!(lag(&[unreported], 20), None);
        // The default weight of a backend is 1.
        assert_eq!(
            seen(&route(None, 1, json!([])), "echo", "echo-canary").canary_weight,
            Some(1)
        );
    }
}
