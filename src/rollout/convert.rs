//! `gitcanary convert`: Kruise Rollout files (`rollouts.kruise.io/v1alpha1`
//! and `v1beta1`) rewritten as gitcanary's, so a team moves a repository in
//! one commit. Pure: text in, text and notes out.

use serde_json::{Map, Value, json};

use super::api::API_VERSION;

const KRUISE_GROUP: &str = "rollouts.kruise.io/";

/// A file converted: its new text (None when it holds no Kruise Rollout, so
/// it is left as it is), and what could not be carried over, each as
/// `file:line: note`.
#[derive(Debug, Default, PartialEq)]
pub struct Converted {
    pub text: Option<String>,
    pub notes: Vec<String>,
    /// A Rollout left as it was: converted, it would release what Kruise
    /// holds back (a disabled or paused Rollout). Its note says why.
    pub refused: bool,
}

/// Converts every Kruise Rollout document of `text` (the file `path`); other
/// documents are kept as they are, comments included. A document that
/// does not parse is an error naming its line.
pub fn convert_file(path: &str, text: &str) -> Result<Converted, String> {
    let mut converted = Converted::default();
    let mut out = Vec::new();
    let mut changed = false;
    for document in crate::manifest::parse::split_documents(text) {
        let object: Value = serde_saphyr::from_str(document.text).map_err(|e| {
            let line = e.location().map_or(0, |l| l.line() as usize) + document.first_line - 1;
            format!(
                "{path}:{line}: not YAML: {}",
                e.to_string().lines().next().unwrap_or_default()
            )
        })?;
        let is_kruise = object["kind"] == "Rollout"
            && object["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with(KRUISE_GROUP));
        if !is_kruise {
            out.push(document.text.trim_end_matches('\n').to_string());
            continue;
        }
        let line = document.content_line;
        if let Some(why) = held_back(&object) {
            converted.notes.push(format!("{path}:{line}: not converted: {why}"));
            converted.refused = true;
            out.push(document.text.trim_end_matches('\n').to_string());
            continue;
        }
        let mut notes = Vec::new();
        let rollout = convert_rollout(&object, &mut notes);
        converted
            .notes
            .extend(notes.into_iter().map(|n| format!("{path}:{line}: {n}")));
        let yaml = serde_saphyr::to_string(&rollout).map_err(|e| format!("{path}:{line}: {e}"))?;
        out.push(yaml.trim_end_matches('\n').to_string());
        changed = true;
    }
    if changed {
        let documents: Vec<&str> = out
            .iter()
            .map(String::as_str)
            .filter(|d| !d.trim().is_empty())
            .collect();
        converted.text = Some(documents.join("\n---\n") + "\n");
    }
    Ok(converted)
}

/// Why a Kruise Rollout cannot be converted as it stands: gitcanary would
/// release what Kruise holds back.
fn held_back(kruise: &Value) -> Option<&'static str> {
    if kruise["spec"]["disabled"] == json!(true) {
        return Some(
            "spec.disabled is true, and gitcanary has no disabled Rollout (it would release the next change): enable it, or leave the Rollout out",
        );
    }
    if kruise["spec"]["strategy"]["paused"] == json!(true) {
        return Some(
            "spec.strategy.paused is true, and gitcanary pauses at steps only (it would go on): resume it, or give a step `pause: {}`",
        );
    }
    None
}

/// One Kruise Rollout as gitcanary's; `notes` gets what was left behind.
pub fn convert_rollout(kruise: &Value, notes: &mut Vec<String>) -> Value {
    let spec = &kruise["spec"];
    let mut metadata = Map::new();
    for key in ["name", "namespace", "labels", "annotations"] {
        if let Some(value) = kruise["metadata"].get(key) {
            metadata.insert(key.to_string(), value.clone());
        }
    }
    if let Some(Value::Object(annotations)) = metadata.get_mut("annotations") {
        let style = annotations.remove("rollouts.kruise.io/rolling-style");
        if let Some(style) = style.as_ref().and_then(Value::as_str)
            && style != "canary"
        {
            notes.push(format!(
                "annotation rollouts.kruise.io/rolling-style: {style} dropped: gitcanary runs a Deployment's canary as a second Deployment"
            ));
        }
        if annotations.remove("rollouts.kruise.io/trafficrouting").is_some() {
            notes.push(
                "annotation rollouts.kruise.io/trafficrouting dropped: name the routes in trafficRoutings".into(),
            );
        }
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    let mut new_spec = Map::new();
    let workload = spec
        .pointer("/objectRef/workloadRef")
        .or_else(|| spec.get("workloadRef"));
    match workload {
        Some(workload) => {
            new_spec.insert("workloadRef".into(), workload.clone());
        }
        None => notes.push("no workloadRef (spec.workloadRef or spec.objectRef.workloadRef): add one".into()),
    }
    if let Some(id) = spec
        .get("rolloutID")
        .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
    {
        new_spec.insert("rolloutID".into(), id.clone());
    }
    let strategy = &spec["strategy"];
    let v1beta1 = kruise["apiVersion"] == "rollouts.kruise.io/v1beta1";
    let deployment = workload.is_some_and(|w| w["kind"] == "Deployment");
    if v1beta1
        && deployment
        && strategy.get("canary").is_some()
        && strategy["canary"]["enableExtraWorkloadForCanary"] != json!(true)
    {
        notes.push("Kruise released this Deployment in place (no enableExtraWorkloadForCanary: true, its partition style); gitcanary runs the canary as a second Deployment beside it".into());
    }
    if strategy.get("trafficRoutingRef").is_some() {
        notes.push("spec.strategy.trafficRoutingRef dropped: name the routes in trafficRoutings".into());
    }
    let mut new_strategy = Map::new();
    for style in ["canary", "blueGreen"] {
        if let Some(Value::Object(fields)) = strategy.get(style) {
            new_strategy.insert(style.into(), Value::Object(convert_strategy(fields, style, notes)));
        }
    }
    new_spec.insert("strategy".into(), Value::Object(new_strategy));
    json!({"apiVersion": API_VERSION, "kind": "Rollout", "metadata": metadata, "spec": new_spec})
}

/// `canary` or `blueGreen`: steps' `weight` becomes `traffic`, the routings'
/// grace period the strategy's; what gitcanary lacks is dropped with a note.
fn convert_strategy(fields: &Map<String, Value>, style: &str, notes: &mut Vec<String>) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in fields {
        match key.as_str() {
            "steps" => {
                let steps = value.as_array().into_iter().flatten().enumerate();
                let steps: Vec<Value> = steps.map(|(i, step)| convert_step(step, i + 1, notes)).collect();
                out.insert("steps".into(), Value::Array(steps));
            }
            "trafficRoutings" => convert_routings(value, style, &mut out, notes),
            "enableExtraWorkloadForCanary" if *value == json!(false) => notes.push(format!(
                "{style}.enableExtraWorkloadForCanary: false dropped: gitcanary runs a Deployment's canary as a second Deployment (true)"
            )),
            "enableExtraWorkloadForCanary" | "failureThreshold" | "disableGenerateCanaryService" | "patchPodTemplateMetadata" => {
                out.insert(key.clone(), value.clone());
            }
            other => notes.push(format!("{style}.{other} dropped: gitcanary has no such field")),
        }
    }
    let through_gateway = fields["trafficRoutings"]
        .as_array()
        .is_some_and(|routings| routings.iter().any(|r| r.get("gateway").is_some()));
    if through_gateway {
        matches_win_on_a_gateway(&mut out, notes);
    }
    out
}

/// The routings, each's `gracePeriodSeconds` made the strategy's (the
/// longest), `customNetworkRefs` dropped with a note.
fn convert_routings(value: &Value, style: &str, out: &mut Map<String, Value>, notes: &mut Vec<String>) {
    let mut grace: Option<u64> = None;
    let mut routings = Vec::new();
    for routing in value.as_array().into_iter().flatten() {
        let Some(routing) = routing.as_object() else {
            notes.push(format!(
                "{style}.trafficRoutings: an entry that is not a mapping dropped"
            ));
            continue;
        };
        let mut routing = routing.clone();
        match routing.remove("gracePeriodSeconds") {
            Some(Value::Number(n)) if n.as_u64().is_some() => {
                let seconds = n.as_u64().unwrap_or_default();
                grace = Some(grace.map_or(seconds, |g| g.max(seconds)));
            }
            Some(other) => notes.push(format!(
                "{style}.trafficRoutings: gracePeriodSeconds {other} dropped: not a number of seconds"
            )),
            None => {}
        }
        if routing.remove("customNetworkRefs").is_some() {
            notes.push(format!(
                "{style}.trafficRoutings: customNetworkRefs dropped: gitcanary routes through an HTTPRoute or an nginx Ingress"
            ));
        }
        routings.push(Value::Object(routing));
    }
    out.insert("trafficRoutings".into(), Value::Array(routings));
    if let Some(grace) = grace {
        out.insert("gracePeriodSeconds".into(), json!(grace));
    }
}

/// On a Gateway, Kruise sends a step with matches only the matching
/// requests, its weight ignored; gitcanary would add the share: it is
/// dropped, so the converted step means what Kruise did.
fn matches_win_on_a_gateway(out: &mut Map<String, Value>, notes: &mut Vec<String>) {
    let steps = out.get_mut("steps").and_then(Value::as_array_mut).into_iter().flatten();
    for (i, step) in steps.enumerate() {
        let Some(step) = step.as_object_mut() else { continue };
        let has_matches = step
            .get("matches")
            .and_then(Value::as_array)
            .is_some_and(|m| !m.is_empty());
        if has_matches && let Some(traffic) = step.remove("traffic") {
            notes.push(format!(
                "step {}: traffic {traffic} dropped: on a Gateway Kruise sends a step with matches the matching requests only, and so does the converted step",
                i + 1
            ));
        }
    }
}

/// A step: `weight: 20` (v1alpha1) is `traffic: 20%`; `replicas`, `pause`,
/// `matches` and (with matches) `requestHeaderModifier` are the same.
fn convert_step(step: &Value, n: usize, notes: &mut Vec<String>) -> Value {
    let mut out = Map::new();
    if !step.is_object() {
        notes.push(format!("step {n}: not a mapping; left empty"));
    }
    for (key, value) in step.as_object().into_iter().flatten() {
        match key.as_str() {
            "weight" => {
                let traffic = match value {
                    Value::Number(n) => format!("{n}%"),
                    other => other.as_str().unwrap_or_default().to_string(),
                };
                out.insert("traffic".into(), json!(traffic));
            }
            "traffic" | "replicas" | "pause" | "matches" => {
                out.insert(key.clone(), value.clone());
            }
            "requestHeaderModifier" if step.get("matches").and_then(Value::as_array).is_some_and(|m| !m.is_empty()) => {
                out.insert(key.clone(), value.clone());
            }
            "requestHeaderModifier" => notes.push(format!(
                "step {n}: requestHeaderModifier dropped: it changes the requests a step's matches send to the canary, and this step has none"
            )),
            other => notes.push(format!("step {n}: {other} dropped: gitcanary has no such step field")),
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kruise's v1alpha1 gateway example, in its shape.
    const V1ALPHA1: &str = "# the release of echoserver\napiVersion: v1\nkind: Service\nmetadata: {name: echoserver}\n---\napiVersion: rollouts.kruise.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: rollouts-demo\n  annotations: {rollouts.kruise.io/rolling-style: partition}\nspec:\n  objectRef:\n    workloadRef:\n      apiVersion: apps/v1\n      kind: Deployment\n      name: echoserver\n  rolloutID: r1\n  strategy:\n    canary:\n      steps:\n      - weight: 20\n        pause: {}\n      - weight: 100\n        requestHeaderModifier: {set: [{name: x, value: y}]}\n      trafficRoutings:\n      - service: echoserver\n        gracePeriodSeconds: 5\n        gateway:\n          httpRouteName: echoserver\n";

    #[test]
    fn a_v1alpha1_rollout_becomes_gitcanarys_and_what_is_left_behind_is_said() {
        let converted = convert_file("app/rollout.yaml", V1ALPHA1).unwrap();
        let text = converted.text.expect("converted");
        let mut documents = text.split("\n---\n");
        assert_eq!(
            documents.next().unwrap(),
            "# the release of echoserver\napiVersion: v1\nkind: Service\nmetadata: {name: echoserver}",
            "other documents kept as they are"
        );
        let rollout: Value = serde_saphyr::from_str(documents.next().unwrap()).unwrap();
        assert_eq!(
            rollout,
            json!({
                "apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout",
                "metadata": {"name": "rollouts-demo"},
                "spec": {
                    "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "echoserver"},
                    "rolloutID": "r1",
                    "strategy": {"canary": {
                        "steps": [{"traffic": "20%", "pause": {}}, {"traffic": "100%"}],
                        "trafficRoutings": [{"service": "echoserver", "gateway": {"httpRouteName": "echoserver"}}],
                        "gracePeriodSeconds": 5,
                    }},
                },
            })
        );
        assert_eq!(
            converted.notes,
            [
                "app/rollout.yaml:6: annotation rollouts.kruise.io/rolling-style: partition dropped: gitcanary runs a Deployment's canary as a second Deployment",
                "app/rollout.yaml:6: step 2: requestHeaderModifier dropped: it changes the requests a step's matches send to the canary, and this step has none",
            ]
        );
    }

    #[test]
    fn what_converted_would_mean_otherwise_is_dropped_with_a_note_or_left_as_it_was() {
        let v1beta1 = |strategy: &str| {
            format!(
                "apiVersion: rollouts.kruise.io/v1beta1\nkind: Rollout\nmetadata: {{name: r}}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: d}}\n  strategy:\n{strategy}"
            )
        };
        // Matches win over the weight on a Gateway in Kruise: the share goes.
        let ab = v1beta1(
            "    canary:\n      enableExtraWorkloadForCanary: true\n      steps:\n      - {traffic: 50%, matches: [{headers: [{name: x-beta, value: \"1\"}]}]}\n      trafficRoutings: [{service: s, gateway: {httpRouteName: h}}]\n",
        );
        let converted = convert_file("r.yaml", &ab).unwrap();
        let rollout: Value = serde_saphyr::from_str(converted.text.as_deref().unwrap()).unwrap();
        assert_eq!(rollout["spec"]["strategy"]["canary"]["steps"][0].get("traffic"), None);
        assert!(
            converted.notes[0].contains("step 1: traffic \"50%\" dropped"),
            "{:?}",
            converted.notes
        );
        // A Deployment Kruise released in place is said to be released beside it now.
        let in_place = v1beta1(
            "    canary:\n      steps: [{traffic: 10%}]\n      trafficRoutings: [{service: s, ingress: {name: i}}]\n",
        );
        let converted = convert_file("r.yaml", &in_place).unwrap();
        assert!(
            converted.notes[0].contains("Kruise released this Deployment in place"),
            "{:?}",
            converted.notes
        );
        // A disabled or paused Rollout is not converted: it would go live.
        let disabled =
            v1beta1("    canary: {steps: [{traffic: 10%}]}\n").replace("  strategy:", "  disabled: true\n  strategy:");
        let paused = v1beta1("    paused: true\n    canary: {steps: [{traffic: 10%}]}\n");
        for held in [disabled, paused] {
            let converted = convert_file("r.yaml", &held).unwrap();
            assert!(converted.refused && converted.text.is_none(), "{held}: {converted:?}");
            assert!(
                converted.notes[0].starts_with("r.yaml:1: not converted:"),
                "{:?}",
                converted.notes
            );
        }
    }

    #[test]
    fn a_file_without_a_kruise_rollout_is_left_alone_and_bad_yaml_names_its_line() {
        let plain = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n";
        assert_eq!(convert_file("a.yaml", plain).unwrap(), Converted::default());
        let broken = format!("{plain}---\nkind: [\n");
        let error = convert_file("a.yaml", &broken).unwrap_err();
        assert!(error.starts_with("a.yaml:5: not YAML"), "{error}");
    }
}
