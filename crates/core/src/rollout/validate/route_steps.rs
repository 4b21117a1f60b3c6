//! What a step may ask of an HTTPRoute beyond a share and matches: header
//! changes on the canary's requests and a mirror; and what the route Git
//! holds can take of the rules a release adds.

use serde_json::Value;

use crate::rollout::api::{CanaryStrategy, HeaderModifier, bounded_line};
use crate::rollout::plan::{is_service_ref, parse_percent};

/// Gateway API's most rules in one HTTPRoute, and most entries in each
/// list of a header filter.
pub const ROUTE_RULES_MAX: usize = 16;
const HEADER_ENTRIES_MAX: usize = 16;

/// `requestHeaderModifier` and `mirror` of each step.
pub fn step_problems(canary: &CanaryStrategy, knative: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let nginx = canary.traffic_routings.iter().any(|r| r.ingress.is_some());
    let gateway = canary.traffic_routings.iter().any(|r| r.gateway.is_some());
    let mut shared_before: Option<(usize, u32)> = None;
    for (i, step) in canary.steps.iter().enumerate() {
        let n = i + 1;
        let share = step.traffic.as_deref().and_then(|t| parse_percent(t).ok());
        if let Some(modifier) = &step.request_header_modifier {
            if step.matches.is_empty() {
                problems.push(format!(
                    "step {n}: requestHeaderModifier changes the requests the step's matches send to the canary, and the step has no matches"
                ));
            }
            if nginx || knative {
                problems.push(format!(
                    "step {n}: requestHeaderModifier needs an HTTPRoute: {} cannot change a request's headers",
                    if knative {
                        "a Knative Service's routes"
                    } else {
                        "an nginx Ingress's canary annotations"
                    }
                ));
            }
            problems.extend(header_problems(n, modifier));
        }
        if let Some(mirror) = &step.mirror {
            if !(1..=100).contains(&mirror.percent) {
                problems.push(format!(
                    "step {n}: mirror percent {} is not between 1 and 100",
                    mirror.percent
                ));
            }
            if knative || nginx || !gateway {
                problems.push(format!(
                    "step {n}: mirror needs an HTTPRoute (Gateway API's RequestMirror filter): {} cannot copy requests",
                    if knative {
                        "a Knative Service's routes"
                    } else if nginx {
                        "an nginx Ingress's canary annotations"
                    } else {
                        "a release without a trafficRouting"
                    }
                ));
            }
            if canary.canary_service_disabled() {
                problems.push(format!(
                    "step {n}: mirror copies requests to the canary Service, and canaryService.disabled is true"
                ));
            }
            if share.is_some_and(|p| p > 0) || !step.matches.is_empty() {
                problems.push(format!(
                    "step {n}: a step mirrors to the canary or sends it requests, not both: the copy of a request the canary answers would reach it twice (mirror first, then shift traffic in a later step)"
                ));
            }
            if let Some((p, before)) = shared_before {
                problems.push(format!(
                    "step {n}: mirror sends the canary no request of its own, which would drop step {p}'s {before}%: mirror before the steps that shift traffic"
                ));
            }
        }
        if let Some(percent) = share.filter(|p| *p > 0) {
            shared_before = Some((n, percent));
        }
    }
    problems
}

fn header_problems(n: usize, modifier: &HeaderModifier) -> Vec<String> {
    let mut problems = Vec::new();
    let names = modifier
        .set
        .iter()
        .chain(&modifier.add)
        .map(|h| h.name.as_str())
        .chain(modifier.remove.iter().map(String::as_str));
    // Gateway API's own rule for a header name (an HTTP token), and lengths.
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    for name in names {
        if name.is_empty() || name.len() > 256 || !name.bytes().all(token) {
            problems.push(format!(
                "step {n}: requestHeaderModifier names header {:?}: a header name is 1 to 256 letters, digits and !#$%&'*+-.^_`|~",
                bounded_line(name, 80)
            ));
        }
    }
    let values = modifier.set.iter().chain(&modifier.add).map(|h| h.value.as_str());
    if values.clone().any(|v| v.chars().any(char::is_control)) {
        problems.push(format!(
            "step {n}: requestHeaderModifier holds a control character (a line break, an escape) in a value: a header cannot carry one"
        ));
    }
    if values.clone().any(|v| v.is_empty() || v.len() > 4096) {
        problems.push(format!(
            "step {n}: requestHeaderModifier: a header's value is 1 to 4096 characters"
        ));
    }
    for (list, entries) in [("set", &modifier.set), ("add", &modifier.add)] {
        let mut seen = std::collections::BTreeSet::new();
        if entries.iter().any(|h| !seen.insert(h.name.to_ascii_lowercase())) {
            problems.push(format!("step {n}: requestHeaderModifier.{list} names a header twice"));
        }
    }
    let lists = [
        ("set", modifier.set.len()),
        ("add", modifier.add.len()),
        ("remove", modifier.remove.len()),
    ];
    for (list, len) in lists {
        if len > HEADER_ENTRIES_MAX {
            problems.push(format!(
                "step {n}: requestHeaderModifier.{list} has {len} entries; an HTTPRoute takes at most {HEADER_ENTRIES_MAX}"
            ));
        }
    }
    problems
}

/// What the HTTPRoute Git holds can take of a release of `service`: the
/// canary's rule added before each rule sending to the stable Service
/// (steps with matches) must keep the route within Gateway API's 16 rules,
/// and its name (the rule's own and the canary suffix) must not be another
/// rule's.
pub fn route_problems(canary: &CanaryStrategy, route: &Value, service: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let rules = route["spec"]["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
    let sends_to_stable = |rule: &&Value| {
        rule["backendRefs"]
            .as_array()
            .is_some_and(|refs| refs.iter().any(|r| is_service_ref(r, service)))
    };
    let mirrors = |rule: &Value| {
        rule["filters"]
            .as_array()
            .is_some_and(|filters| filters.iter().any(|f| f["type"] == "RequestMirror"))
    };
    if canary.steps.iter().any(|s| s.mirror.is_some()) && rules.iter().filter(sends_to_stable).any(mirrors) {
        problems.push(format!(
            "a rule that sends to Service {service} mirrors already: a step's mirror would be a second, which needs a gateway with HTTPRouteRequestMultipleMirrors"
        ));
    }
    if canary.steps.iter().all(|s| s.matches.is_empty()) {
        return problems;
    }
    let to_stable: Vec<&Value> = rules.iter().filter(sends_to_stable).collect();
    let with_canary_rules = rules.len() + to_stable.len();
    if with_canary_rules > ROUTE_RULES_MAX {
        problems.push(format!(
            "its {} rules, with a rule for the canary before each of the {} that send to Service {service} (steps with matches), would be {with_canary_rules}; an HTTPRoute takes at most {ROUTE_RULES_MAX}",
            rules.len(),
            to_stable.len()
        ));
    }
    let names: Vec<&str> = rules.iter().filter_map(|r| r["name"].as_str()).collect();
    for name in to_stable.iter().filter_map(|r| r["name"].as_str()) {
        let canary_rule = canary.canary_name(name);
        if names.contains(&canary_rule.as_str()) {
            problems.push(format!(
                "rule {name:?} gets a rule {canary_rule:?} for the canary's matching requests, and another rule has that name: rename it, or set canarySuffix"
            ));
        }
    }
    problems
}
