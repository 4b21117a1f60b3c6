//! Turns the planner's intent into objects: the stable workload's template
//! and partition, the canary Deployment, the canary Service, the stable
//! Service's pin, HTTPRoute weights and the nginx canary Ingress. Pure: Git
//! objects and observed revisions in, desired objects out.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::api::{HeaderModifier, RequestMatch, RolloutSpec};
use super::plan::{Intent, StableTemplate, StepRoute, is_service_ref};

pub const ROLLOUT_ID_LABEL: &str = "gitcanary.io/rollout-id";
/// On canary pods and in the canary Deployment's selector, which (being
/// immutable) must not change when a newer release restarts the canary.
pub const CANARY_LABEL: &str = "gitcanary.io/canary";
pub const BATCH_ID_LABEL: &str = "gitcanary.io/rollout-batch-id";
/// On the stable workload: the hash of the Git template it runs.
pub const STABLE_HASH_ANNOTATION: &str = "gitcanary.io/stable-template-hash";
/// On the canary Deployment: the hash of the Git template it runs.
pub const CANARY_HASH_ANNOTATION: &str = "gitcanary.io/canary-template-hash";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    /// `serving.knative.dev/v1` Service: Knative routes its own traffic.
    KnativeService,
}

impl WorkloadKind {
    pub fn parse(api_version: &str, kind: &str) -> Option<WorkloadKind> {
        if super::knative::is_knative_service(api_version, kind) {
            return Some(WorkloadKind::KnativeService);
        }
        match (api_version, kind) {
            ("apps/v1", "Deployment") => Some(WorkloadKind::Deployment),
            ("apps/v1", "StatefulSet") => Some(WorkloadKind::StatefulSet),
            _ => None,
        }
    }
    /// The pod label that tells revisions apart.
    pub fn revision_label(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "pod-template-hash",
            WorkloadKind::StatefulSet => "controller-revision-hash",
            WorkloadKind::KnativeService => super::knative::REVISION_LABEL,
        }
    }
    /// The API group of the workload's kind.
    pub fn group(self) -> &'static str {
        match self {
            WorkloadKind::Deployment | WorkloadKind::StatefulSet => "apps",
            WorkloadKind::KnativeService => super::knative::GROUP,
        }
    }
}

/// What `workloadRef` may name, for messages.
pub const SUPPORTED_WORKLOADS: &str = "use apps/v1 Deployment or StatefulSet, or serving.knative.dev/v1 Service";

fn labels_of(object: &Value, path: &[&str]) -> BTreeMap<String, String> {
    let mut node = object;
    for key in path {
        node = &node[*key];
    }
    node.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn set_map(object: &mut Value, path: &[&str], entries: &BTreeMap<String, String>) {
    let mut node = object;
    for key in path {
        if !node[*key].is_object() {
            node[*key] = Value::Object(Map::new());
        }
        node = &mut node[*key];
    }
    let map = node.as_object_mut().expect("made a mapping above");
    for (k, v) in entries {
        map.insert(k.clone(), Value::String(v.clone()));
    }
}

/// The labels canary pods carry: Git's, the patched ones, and the rollout id.
pub fn canary_pod_labels(spec: &RolloutSpec, git_workload: &Value, rollout_id: &str) -> BTreeMap<String, String> {
    let mut labels = labels_of(git_workload, &["spec", "template", "metadata", "labels"]);
    if let Some(patch) = &spec.strategy.canary.patch_pod_template_metadata {
        labels.extend(patch.labels.clone());
    }
    labels.insert(ROLLOUT_ID_LABEL.to_string(), rollout_id.to_string());
    labels
}

/// The canary Service's selector before the revision label: the stable
/// selector minus `remove`, plus `add`.
pub fn canary_selector(spec: &RolloutSpec, stable_service: &Value) -> BTreeMap<String, String> {
    let mut selector = labels_of(stable_service, &["spec", "selector"]);
    if let Some(change) = spec.strategy.canary.canary_service.as_ref().map(|c| &c.selector) {
        for key in &change.remove {
            selector.remove(key);
        }
        selector.extend(change.add.clone());
    }
    selector
}

/// Why the canary Service would select no canary pod, with the fix; checked
/// before the first canary pod is created.
pub fn selector_problem(
    spec: &RolloutSpec,
    stable_service: &Value,
    pod_labels: &BTreeMap<String, String>,
) -> Option<String> {
    if spec.strategy.canary.canary_service_disabled() {
        return None;
    }
    let service = stable_service["metadata"]["name"].as_str().unwrap_or_default();
    let patched = spec
        .strategy
        .canary
        .patch_pod_template_metadata
        .as_ref()
        .map(|p| p.labels.clone())
        .unwrap_or_default();
    for (key, value) in canary_selector(spec, stable_service) {
        match pod_labels.get(&key) {
            Some(actual) if *actual == value => {}
            Some(actual) if patched.contains_key(&key) => {
                return Some(format!(
                    "the canary Service {} would select {key}={value}, but patchPodTemplateMetadata sets {key}={actual} on canary pods, so it would select none: add \"{key}\" to canaryService.selector.remove (or set canaryService.selector.add.{key}: {actual})",
                    spec.strategy.canary.canary_name(service)
                ));
            }
            actual => {
                return Some(format!(
                    "the canary Service {} would select {key}={value}, but canary pods have {}: fix the Service selector or add \"{key}\" to canaryService.selector.remove",
                    spec.strategy.canary.canary_name(service),
                    actual.map_or("no such label".to_string(), |a| format!("{key}={a}"))
                ));
            }
        }
    }
    None
}

/// The stable workload: Git's, with the stable template kept while a
/// release is in flight (Deployment) or the partition set (StatefulSet).
pub fn stable_workload(
    kind: WorkloadKind,
    git: &Value,
    stable_template: Option<&Value>,
    intent: &Intent,
    stable_hash: &str,
) -> Value {
    let mut desired = git.clone();
    let replicas = git["spec"]["replicas"].as_i64().unwrap_or(1);
    if !desired["spec"].is_object() {
        // Refused by validation; never a panic on what Git holds.
        return desired;
    }
    match (kind, intent.canary_replicas) {
        (WorkloadKind::StatefulSet, Some(canary)) => {
            // Git's template with the highest ordinals updated first.
            desired["spec"]["updateStrategy"] = json!({
                "type": "RollingUpdate",
                "rollingUpdate": {"partition": (replicas - i64::from(canary)).max(0)}
            });
        }
        _ if intent.stable_template == StableTemplate::Live => {
            if let Some(template) = stable_template {
                desired["spec"]["template"] = template.clone();
            }
        }
        _ => {}
    }
    if !stable_hash.is_empty() {
        mark_stable_hash(&mut desired, stable_hash);
    }
    desired
}

/// Records on the workload the hash of the Git template that is stable.
pub fn mark_stable_hash(workload: &mut Value, stable_hash: &str) {
    set_map(
        workload,
        &["metadata", "annotations"],
        &BTreeMap::from([(STABLE_HASH_ANNOTATION.to_string(), stable_hash.to_string())]),
    );
}

/// The canary Deployment for a Deployment workload.
pub fn canary_deployment(spec: &RolloutSpec, git: &Value, replicas: i32, rollout_id: &str, canary_hash: &str) -> Value {
    let mut canary = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": spec.strategy.canary.canary_name(git["metadata"]["name"].as_str().unwrap_or_default()),
            "namespace": git["metadata"]["namespace"].clone(),
            "labels": git["metadata"]["labels"].clone(),
            "annotations": {CANARY_HASH_ANNOTATION: canary_hash},
        },
        "spec": git["spec"].clone(),
    });
    if !canary["metadata"]["labels"].is_object() {
        canary["metadata"].as_object_mut().expect("a mapping").remove("labels");
    }
    if !canary["spec"].is_object() {
        canary["spec"] = json!({}); // refused by validation; never a panic
    }
    canary["spec"]["replicas"] = json!(replicas);
    let marker = BTreeMap::from([(CANARY_LABEL.to_string(), "true".to_string())]);
    set_map(&mut canary, &["spec", "selector", "matchLabels"], &marker);
    let mut labels = canary_pod_labels(spec, git, rollout_id);
    labels.extend(marker);
    set_map(&mut canary, &["spec", "template", "metadata", "labels"], &labels);
    if let Some(patch) = &spec.strategy.canary.patch_pod_template_metadata
        && !patch.annotations.is_empty()
    {
        set_map(
            &mut canary,
            &["spec", "template", "metadata", "annotations"],
            &patch.annotations,
        );
    }
    canary
}

/// The canary Service: the stable one's ports, the derived selector and
/// the canary revision.
pub fn canary_service(spec: &RolloutSpec, stable: &Value, kind: WorkloadKind, canary_revision: &str) -> Value {
    let mut selector = canary_selector(spec, stable);
    selector.insert(kind.revision_label().to_string(), canary_revision.to_string());
    let ports: Vec<Value> = stable["spec"]["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| {
                    let mut p = p.clone();
                    if let Some(m) = p.as_object_mut() {
                        m.remove("nodePort");
                    }
                    p
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": spec.strategy.canary.canary_name(stable["metadata"]["name"].as_str().unwrap_or_default()),
            "namespace": stable["metadata"]["namespace"].clone(),
        },
        "spec": {"type": "ClusterIP", "ports": ports, "selector": selector},
    })
}

/// The stable Service pinned to the stable revision (see `Intent::pin_stable_service`).
pub fn pinned_stable_service(stable: &Value, kind: WorkloadKind, stable_revision: &str) -> Value {
    let mut pinned = stable.clone();
    set_map(
        &mut pinned,
        &["spec", "selector"],
        &BTreeMap::from([(kind.revision_label().to_string(), stable_revision.to_string())]),
    );
    pinned
}

/// Whether a live Service selects the stable revision's pods alone.
pub fn is_pinned(live: &Value, kind: WorkloadKind, stable_revision: &str) -> bool {
    !stable_revision.is_empty() && live["spec"]["selector"][kind.revision_label()].as_str() == Some(stable_revision)
}

/// The HTTPRoute with every rule that sends to the stable Service split
/// between it and the canary Service (and, for a step that mirrors,
/// copying requests to the canary), each such rule preceded (for a step
/// with `matches`) by a rule sending the matching requests to the canary
/// alone, with the step's header changes; other rules untouched.
pub fn weighted_route(spec: &RolloutSpec, route: &Value, service: &str, step: &StepRoute) -> Value {
    let mut route = route.clone();
    let canary = spec.strategy.canary.canary_name(service);
    let (traffic, matches) = (step.percent.min(100), step.matches.as_slice());
    let Some(rules) = route["spec"]["rules"].as_array_mut() else {
        return route;
    };
    let mut split = Vec::with_capacity(rules.len());
    for mut rule in std::mem::take(rules) {
        let Some(refs) = rule.get_mut("backendRefs").and_then(Value::as_array_mut) else {
            split.push(rule);
            continue;
        };
        let Some(stable) = refs.iter().position(|r| is_service_ref(r, service)) else {
            split.push(rule);
            continue;
        };
        refs.retain(|r| r["name"].as_str() != Some(canary.as_str()));
        // Validation keeps the canary's name from being the stable's; never a panic.
        let Some(last) = refs.len().checked_sub(1) else {
            split.push(rule);
            continue;
        };
        let stable = stable.min(last);
        refs[stable]["weight"] = json!(100 - traffic);
        let mut canary_ref = refs[stable].clone();
        canary_ref["name"] = json!(canary);
        canary_ref["weight"] = json!(traffic);
        refs.insert(stable + 1, canary_ref.clone());
        let narrowed = narrowed(&rule["matches"], matches);
        // No match left (or none asked): no rule, since an empty list would match every request.
        if !narrowed.is_empty() {
            let mut matched = rule.clone();
            if let Some(canary_ref) = canary_ref.as_object_mut() {
                canary_ref.remove("weight");
            }
            matched["backendRefs"] = json!([canary_ref]);
            matched["matches"] = json!(narrowed);
            if let Some(modifier) = &step.header_modifier {
                modify_headers(&mut matched, modifier);
            }
            if let Some(name) = rule["name"].as_str() {
                matched["name"] = json!(format!("{name}{}", spec.strategy.canary.canary_name("")));
            }
            split.push(matched);
        }
        if let Some(percent) = step.mirror {
            push_filter(&mut rule, mirror_filter(&canary_ref, percent));
        }
        split.push(rule);
    }
    *rules = split;
    route
}

fn push_filter(rule: &mut Value, filter: Value) {
    match rule.get_mut("filters").and_then(Value::as_array_mut) {
        Some(filters) => filters.push(filter),
        None => rule["filters"] = json!([filter]),
    }
}

/// A `RequestMirror` filter copying `percent` of a rule's requests to the
/// canary backend (Gateway API's default, every request, left unsaid).
fn mirror_filter(canary_ref: &Value, percent: u32) -> Value {
    let mut backend = Map::new();
    for key in ["group", "kind", "name", "namespace", "port"] {
        if let Some(value) = canary_ref.get(key) {
            backend.insert(key.to_string(), value.clone());
        }
    }
    let mut mirror = json!({"backendRef": backend});
    if percent < 100 {
        mirror["percent"] = json!(percent);
    }
    json!({"type": "RequestMirror", "requestMirror": mirror})
}

/// The step's header changes on the canary's rule: merged into Git's
/// `RequestHeaderModifier` where the rule has one (a rule takes one), the
/// step's entry winning for a header both name.
fn modify_headers(rule: &mut Value, modifier: &HeaderModifier) {
    let step = serde_json::to_value(modifier).unwrap_or_default();
    let filters = rule.get("filters").and_then(Value::as_array);
    let Some(at) = filters.and_then(|f| f.iter().position(|f| f["type"] == "RequestHeaderModifier")) else {
        push_filter(
            rule,
            json!({"type": "RequestHeaderModifier", "requestHeaderModifier": step}),
        );
        return;
    };
    let git = &mut rule["filters"][at]["requestHeaderModifier"];
    if !git.is_object() {
        *git = json!({});
    }
    // A header the step names, in any list, is the step's alone.
    let ours: Vec<String> = (modifier.set.iter().chain(&modifier.add))
        .map(|h| h.name.to_ascii_lowercase())
        .chain(modifier.remove.iter().map(|r| r.to_ascii_lowercase()))
        .collect();
    let theirs = |entry: &Value| {
        let name = entry["name"].as_str().or(entry.as_str()).unwrap_or_default();
        !ours.contains(&name.to_ascii_lowercase())
    };
    for key in ["set", "add", "remove"] {
        let mut list: Vec<Value> = git[key].as_array().cloned().unwrap_or_default();
        list.retain(theirs);
        list.extend(step[key].as_array().cloned().unwrap_or_default());
        if list.is_empty() {
            if let Some(git) = git.as_object_mut() {
                git.remove(key);
            }
        } else {
            git[key] = json!(list);
        }
    }
}

/// The matches of a rule (Git's) narrowed by a step's: each of Git's with
/// each of the step's, their headers and query parameters joined, and the
/// step's path where Git's has none or the step's lies within it. A pair
/// that no request could match (the step's path outside Git's, one header
/// asked two ways) is dropped.
fn narrowed(git: &Value, step: &[RequestMatch]) -> Vec<Value> {
    let git: Vec<Value> = match git.as_array() {
        Some(list) if !list.is_empty() => list.clone(),
        _ => vec![json!({})],
    };
    let mut out = Vec::new();
    for base in &git {
        for m in step {
            let mut joined = if base.is_object() { base.clone() } else { json!({}) };
            let step_json = serde_json::to_value(m).unwrap_or_default();
            if let Some(path) = step_json.get("path") {
                if !joined["path"].is_null() && !path_within(path, &joined["path"]) {
                    continue;
                }
                joined["path"] = path.clone();
            }
            let mut possible = true;
            for key in ["headers", "queryParams"] {
                let mut list = joined[key].as_array().cloned().unwrap_or_default();
                for named in step_json[key].as_array().into_iter().flatten() {
                    match list.iter().find(|n| same_name(n, named, key == "headers")) {
                        Some(existing) if same_test(existing, named) => {}
                        Some(_) => possible = false,
                        None => list.push(named.clone()),
                    }
                }
                if !list.is_empty() {
                    joined[key] = json!(list);
                }
            }
            if possible {
                out.push(joined);
            }
        }
    }
    out
}

/// Header names compare without case, query parameter names with it.
fn same_name(a: &Value, b: &Value, ignore_case: bool) -> bool {
    match (a["name"].as_str(), b["name"].as_str()) {
        (Some(a), Some(b)) if ignore_case => a.eq_ignore_ascii_case(b),
        (a, b) => a == b,
    }
}

fn same_test(a: &Value, b: &Value) -> bool {
    a["value"] == b["value"] && a["type"].as_str().unwrap_or("Exact") == b["type"].as_str().unwrap_or("Exact")
}

/// Whether every request the step's path matches, Git's path matches too.
fn path_within(step: &Value, git: &Value) -> bool {
    let kind = |p: &Value| p["type"].as_str().unwrap_or("PathPrefix").to_string();
    let value = |p: &Value| p["value"].as_str().unwrap_or("/").to_string();
    let (step_value, git_value) = (value(step), value(git));
    match (kind(step).as_str(), kind(git).as_str()) {
        (_, "PathPrefix") if git_value.trim_end_matches('/').is_empty() => kind(step) != "RegularExpression",
        ("PathPrefix" | "Exact", "PathPrefix") => {
            let prefix = git_value.trim_end_matches('/');
            step_value == prefix || step_value.starts_with(&format!("{prefix}/"))
        }
        ("Exact", "Exact") => step_value == git_value,
        _ => false,
    }
}

/// The nginx canary Ingress: the stable Ingress's rules pointed at the
/// canary Service, with nginx's canary annotations.
pub fn canary_ingress(
    spec: &RolloutSpec,
    ingress: &Value,
    service: &str,
    traffic: u32,
    matches: &[RequestMatch],
) -> Value {
    let canary_service = spec.strategy.canary.canary_name(service);
    let mut rules = ingress["spec"]["rules"].clone();
    if let Some(rules) = rules.as_array_mut() {
        for rule in rules {
            let paths = rule.get_mut("http").and_then(|http| http.get_mut("paths"));
            let Some(paths) = paths.and_then(Value::as_array_mut) else {
                continue;
            };
            for path in paths {
                if path["backend"]["service"]["name"].as_str() == Some(service) {
                    path["backend"]["service"]["name"] = json!(canary_service);
                }
            }
        }
    }
    let mut ingress_spec = json!({"rules": rules});
    if let Some(class) = ingress["spec"]["ingressClassName"].as_str() {
        ingress_spec["ingressClassName"] = json!(class);
    }
    let mut annotations = json!({
        "nginx.ingress.kubernetes.io/canary": "true",
        "nginx.ingress.kubernetes.io/canary-weight": traffic.min(100).to_string(),
    });
    // Validation lets through a match of one header and one of one cookie only.
    for header in matches.iter().flat_map(|m| m.headers.iter()) {
        if header.name == super::api::NGINX_COOKIE {
            annotations["nginx.ingress.kubernetes.io/canary-by-cookie"] = json!(header.value);
            continue;
        }
        annotations["nginx.ingress.kubernetes.io/canary-by-header"] = json!(header.name);
        let value_key = match header.kind.as_deref() {
            Some("RegularExpression") => "nginx.ingress.kubernetes.io/canary-by-header-pattern",
            _ => "nginx.ingress.kubernetes.io/canary-by-header-value",
        };
        annotations[value_key] = json!(header.value);
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": spec.strategy.canary.canary_name(ingress["metadata"]["name"].as_str().unwrap_or_default()),
            "namespace": ingress["metadata"]["namespace"].clone(),
            "annotations": annotations,
        },
        "spec": ingress_spec,
    })
}

/// Each kind of workload Rollouts release, with a namespace they release it in.
pub type Released = std::collections::BTreeSet<(WorkloadKind, String)>;

/// Where the Rollouts of `manifests` release which kind of workload: what
/// decides where the agent watches ReplicaSets, pods or Knative Revisions
/// for their observe. A Rollout of an app with problems (which syncs
/// nothing) or naming a workload of no supported kind reads nothing.
pub fn released_workloads(manifests: &crate::manifest::ManifestSet, default_namespace: &str) -> Released {
    // The app's kinds first (kept with it), then `is_rollout` on its manifests.
    let rollout_kind = |(_, kind): &(String, String)| kind == super::api::KIND;
    manifests
        .apps
        .values()
        .filter(|app| app.problems.is_empty() && app.kinds().iter().any(rollout_kind))
        .flat_map(|app| app.manifests.iter().filter(|m| super::api::is_rollout(m)))
        .filter_map(|rollout| {
            let workload = &rollout.object["spec"]["workloadRef"];
            let kind = WorkloadKind::parse(
                workload["apiVersion"].as_str().unwrap_or_default(),
                workload["kind"].as_str().unwrap_or_default(),
            )?;
            Some((kind, rollout.namespace().unwrap_or(default_namespace).to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workloads_released_are_each_rollouts_kind_in_its_namespace_and_nothing_else() {
        let rollout = |namespace: &str, api_version: &str, kind: &str| {
            let namespace = if namespace.is_empty() {
                String::new()
            } else {
                format!("  namespace: {namespace}\n")
            };
            format!(
                "apiVersion: {}\nkind: Rollout\nmetadata:\n  name: r\n{namespace}spec:\n  workloadRef: {{apiVersion: {api_version}, kind: {kind}, name: w}}\n",
                crate::rollout::api::API_VERSION
            )
        };
        let files = [
            ("web/rollout.yaml", rollout("shop", "apps/v1", "Deployment")),
            ("db/rollout.yaml", rollout("", "apps/v1", "StatefulSet")),
            ("fn/rollout.yaml", rollout("edge", "serving.knative.dev/v1", "Service")),
            ("odd/rollout.yaml", rollout("odd", "apps/v1", "DaemonSet")),
            (
                "plain/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: plain\n".to_string(),
            ),
        ];
        let set = crate::manifest::parse::load_files(files.into_iter().map(|(p, c)| (p.to_string(), c.into_bytes())));
        let released: Vec<_> = released_workloads(&set, "apps").into_iter().collect();
        assert_eq!(
            released,
            [
                (WorkloadKind::Deployment, "shop".to_string()),
                (WorkloadKind::StatefulSet, "apps".to_string()),
                (WorkloadKind::KnativeService, "edge".to_string()),
            ]
        );
    }

    /// Git's route as a step of `percent` with `matches` routes it.
    fn split(route: &Value, percent: u32, matches: &[RequestMatch]) -> Value {
        let step = StepRoute {
            percent,
            matches: matches.to_vec(),
            ..StepRoute::default()
        };
        weighted_route(&RolloutSpec::default(), route, "echo", &step)
    }
    use crate::rollout::api::{CanaryService, PodTemplateMetadata, SelectorChange};

    #[test]
    fn a_service_is_pinned_once_its_live_selector_names_the_stable_revision() {
        let git = json!({"spec": {"selector": {"app": "echo"}}});
        assert!(!is_pinned(&git, WorkloadKind::Deployment, "abc"));
        let pinned = pinned_stable_service(&git, WorkloadKind::Deployment, "abc");
        assert!(is_pinned(&pinned, WorkloadKind::Deployment, "abc"));
        assert!(
            !is_pinned(&pinned, WorkloadKind::Deployment, "def"),
            "pinned to an older revision"
        );
        assert!(
            !is_pinned(&pinned, WorkloadKind::Deployment, ""),
            "no stable revision known"
        );
    }

    fn spec_with(patch: Option<(&str, &str)>, remove: &[&str]) -> RolloutSpec {
        let mut spec = RolloutSpec::default();
        spec.strategy.canary.patch_pod_template_metadata = patch.map(|(k, v)| PodTemplateMetadata {
            labels: BTreeMap::from([(k.to_string(), v.to_string())]),
            annotations: BTreeMap::new(),
        });
        spec.strategy.canary.canary_service = Some(CanaryService {
            disabled: false,
            selector: SelectorChange {
                add: BTreeMap::new(),
                remove: remove.iter().map(|s| s.to_string()).collect(),
            },
        });
        spec
    }

    fn service() -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": "demo"},
               "spec": {"selector": {"app": "echo", "version": "base"}, "ports": [{"port": 80, "nodePort": 30080}]}})
    }

    fn workload() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "echo", "namespace": "demo"},
               "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "echo"}},
                        "template": {"metadata": {"labels": {"app": "echo", "version": "base"}},
                                     "spec": {"containers": [{"name": "echo", "image": "echo:2"}]}}}})
    }

    #[test]
    fn canary_service_drops_overridden_label_only_when_told() {
        let spec = spec_with(Some(("version", "canary")), &[]);
        let labels = canary_pod_labels(&spec, &workload(), "abc1234");
        let problem = selector_problem(&spec, &service(), &labels).expect("a conflict");
        assert!(problem.contains("version=base"), "{problem}");
        assert!(
            problem.contains("patchPodTemplateMetadata sets version=canary"),
            "{problem}"
        );
        assert!(
            problem.contains("add \"version\" to canaryService.selector.remove"),
            "{problem}"
        );

        let fixed = spec_with(Some(("version", "canary")), &["version"]);
        assert_eq!(selector_problem(&fixed, &service(), &labels), None);
        let canary = canary_service(&fixed, &service(), WorkloadKind::Deployment, "7f9c");
        assert_eq!(canary["metadata"]["name"], "echo-canary");
        assert_eq!(
            canary["spec"]["selector"],
            json!({"app": "echo", "pod-template-hash": "7f9c"})
        );
        assert!(canary["spec"]["ports"][0].get("nodePort").is_none());
    }

    #[test]
    fn canary_deployment_carries_patched_labels_and_the_rollout_id() {
        let spec = spec_with(Some(("version", "canary")), &["version"]);
        let canary = canary_deployment(&spec, &workload(), 2, "abc1234", "h2");
        assert_eq!(canary["metadata"]["name"], "echo-canary");
        assert_eq!(canary["spec"]["replicas"], 2);
        assert_eq!(canary["spec"]["selector"]["matchLabels"][CANARY_LABEL], "true");
        let labels = &canary["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["version"], "canary");
        assert_eq!(labels[ROLLOUT_ID_LABEL], "abc1234");
        assert_eq!(canary["metadata"]["annotations"][CANARY_HASH_ANNOTATION], "h2");
    }

    /// Step 1 of release abc: one canary pod, 10% of traffic.
    fn mid_release() -> Intent {
        Intent {
            stable_template: StableTemplate::Live,
            canary_replicas: Some(1),
            traffic: Some(10),
            matches: Vec::new(),
            header_modifier: None,
            mirror: None,
            hold_canary: false,
            pin_stable_service: true,
            await_pin: false,
            route_canary: true,
            rollout_id: "abc".into(),
        }
    }

    #[test]
    fn stable_keeps_its_template_while_a_release_runs() {
        let live_template = json!({"metadata": {"labels": {"app": "echo"}}, "spec": {"containers": [{"name": "echo", "image": "echo:1"}]}});
        let intent = mid_release();
        let stable = stable_workload(
            WorkloadKind::Deployment,
            &workload(),
            Some(&live_template),
            &intent,
            "h1",
        );
        assert_eq!(stable["spec"]["template"], live_template);
        assert_eq!(
            stable["spec"]["replicas"], 4,
            "other changes to the workload go through"
        );
        assert_eq!(stable["metadata"]["annotations"][STABLE_HASH_ANNOTATION], "h1");
        let sts = stable_workload(
            WorkloadKind::StatefulSet,
            &workload(),
            Some(&live_template),
            &intent,
            "h1",
        );
        assert_eq!(sts["spec"]["template"]["spec"]["containers"][0]["image"], "echo:2");
        assert_eq!(sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"], 3);
    }

    #[test]
    fn route_weights_touch_only_rules_of_the_stable_service() {
        let route = json!({"spec": {"rules": [
            {"backendRefs": [{"name": "echo", "port": 80}]},
            {"backendRefs": [{"name": "other", "port": 80}]}
        ]}});
        let weighted = split(&route, 30, &[]);
        assert_eq!(
            weighted["spec"]["rules"][0]["backendRefs"],
            json!([{"name": "echo", "port": 80, "weight": 70}, {"name": "echo-canary", "port": 80, "weight": 30}])
        );
        assert_eq!(weighted["spec"]["rules"][1], route["spec"]["rules"][1]);
        // Applying twice gives the same route.
        assert_eq!(split(&weighted, 30, &[]), weighted);
    }

    fn header(kind: Option<&str>, name: &str, value: &str) -> RequestMatch {
        RequestMatch {
            headers: vec![super::super::api::NamedMatch {
                kind: kind.map(str::to_string),
                name: name.into(),
                value: value.into(),
            }],
            ..RequestMatch::default()
        }
    }

    #[test]
    fn a_step_with_matches_sends_matching_requests_to_the_canary_before_the_split() {
        let route = json!({"spec": {"rules": [
            {"name": "api", "matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "headers": [{"name": "tenant", "value": "a"}]}],
             "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x", "value": "1"}]}}],
             "backendRefs": [{"name": "echo", "port": 80}]},
            {"backendRefs": [{"name": "other", "port": 80}]}
        ]}});
        let matches = [
            header(None, "x-canary", "yes"),
            header(Some("RegularExpression"), "user", "^qa-"),
        ];
        let routed = split(&route, 0, &matches);
        let rules = routed["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 3, "{routed:#}");
        // First the matched requests, to the canary alone, within Git's own match and with its filters.
        assert_eq!(rules[0]["name"], "api-canary");
        assert_eq!(rules[0]["backendRefs"], json!([{"name": "echo-canary", "port": 80}]));
        assert_eq!(rules[0]["filters"], route["spec"]["rules"][0]["filters"]);
        assert_eq!(
            rules[0]["matches"],
            json!([
                {"path": {"type": "PathPrefix", "value": "/api"}, "headers": [{"name": "tenant", "value": "a"}, {"name": "x-canary", "value": "yes"}]},
                {"path": {"type": "PathPrefix", "value": "/api"}, "headers": [{"name": "tenant", "value": "a"}, {"type": "RegularExpression", "name": "user", "value": "^qa-"}]}
            ])
        );
        // Then Git's rule, none of the rest to the canary (no traffic given).
        assert_eq!(
            rules[1]["backendRefs"],
            json!([{"name": "echo", "port": 80, "weight": 100}, {"name": "echo-canary", "port": 80, "weight": 0}])
        );
        assert_eq!(rules[1]["matches"], route["spec"]["rules"][0]["matches"]);
        assert_eq!(rules[2], route["spec"]["rules"][1]);
    }

    #[test]
    fn a_steps_path_only_narrows_gits_and_impossible_pairs_are_dropped() {
        let route = json!({"spec": {"rules": [
            {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}], "backendRefs": [{"name": "echo", "port": 80}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}, {"headers": [{"name": "X-Canary", "value": "no"}]}],
             "backendRefs": [{"name": "echo", "port": 80}]}
        ]}});
        let inside = RequestMatch {
            path: Some(super::super::api::PathMatch {
                kind: None,
                value: Some("/api/v2".into()),
            }),
            ..RequestMatch::default()
        };
        let routed = split(&route, 0, &[inside]);
        let rules = routed["spec"]["rules"].as_array().unwrap();
        // /api/v2 lies within /api: narrowed there; not within /admin, and Git's header-only
        // match of the second rule takes it.
        assert_eq!(rules[0]["matches"], json!([{"path": {"value": "/api/v2"}}]));
        assert_eq!(
            rules[2]["matches"],
            json!([{"path": {"value": "/api/v2"}, "headers": [{"name": "X-Canary", "value": "no"}]}])
        );
        // A header Git's match asks another value of: no request could match it, so that pair goes.
        let routed = split(&route, 0, &[header(None, "x-canary", "yes")]);
        let rules = routed["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 4);
        assert_eq!(
            rules[2]["matches"],
            json!([{"path": {"type": "PathPrefix", "value": "/admin"}, "headers": [{"name": "x-canary", "value": "yes"}]}])
        );
        // Nothing left to match: no canary rule at all (an empty list would match everything).
        let only_no = json!({"spec": {"rules": [
            {"matches": [{"headers": [{"name": "x-canary", "value": "no"}]}], "backendRefs": [{"name": "echo", "port": 80}]}
        ]}});
        let routed = split(&only_no, 0, &[header(None, "x-canary", "yes")]);
        assert_eq!(routed["spec"]["rules"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn the_steps_header_changes_go_on_the_canarys_rule_only_merged_into_gits() {
        use crate::rollout::api::HeaderValue;
        let route = json!({"spec": {"rules": [
            {"name": "api", "backendRefs": [{"name": "echo", "port": 80}],
             "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                 "set": [{"name": "X-Env", "value": "prod"}, {"name": "x-keep", "value": "1"}],
                 "add": [{"name": "X-Trace", "value": "on"}], "remove": ["x-debug"]}}]},
            {"backendRefs": [{"name": "other", "port": 80}]}
        ]}});
        let step = StepRoute {
            percent: 0,
            matches: vec![header(None, "x-canary", "yes")],
            header_modifier: Some(HeaderModifier {
                set: vec![HeaderValue {
                    name: "x-env".into(),
                    value: "canary".into(),
                }],
                add: vec![HeaderValue {
                    name: "x-release".into(),
                    value: "r2".into(),
                }],
                remove: vec!["X-Debug".into(), "x-trace".into()],
            }),
            mirror: None,
        };
        let routed = weighted_route(&RolloutSpec::default(), &route, "echo", &step);
        let rules = routed["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0]["name"], "api-canary");
        assert_eq!(
            rules[0]["filters"],
            json!([{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                "set": [{"name": "x-keep", "value": "1"}, {"name": "x-env", "value": "canary"}],
                "add": [{"name": "x-release", "value": "r2"}],
                "remove": ["X-Debug", "x-trace"]}}]),
            "one filter (Gateway API takes one a rule), where a header the step names is the step's alone"
        );
        assert_eq!(
            rules[1]["filters"], route["spec"]["rules"][0]["filters"],
            "Git's rule keeps Git's headers"
        );
        // A rule without filters gets the step's as they are.
        let bare = json!({"spec": {"rules": [{"backendRefs": [{"name": "echo", "port": 80}]}]}});
        let routed = weighted_route(&RolloutSpec::default(), &bare, "echo", &step);
        assert_eq!(
            routed["spec"]["rules"][0]["filters"],
            json!([{"type": "RequestHeaderModifier", "requestHeaderModifier": {
                "set": [{"name": "x-env", "value": "canary"}], "add": [{"name": "x-release", "value": "r2"}],
                "remove": ["X-Debug", "x-trace"]}}])
        );
        assert_eq!(routed["spec"]["rules"][1].get("filters"), None);
    }

    #[test]
    fn a_mirror_step_copies_the_stable_rules_requests_to_the_canary_service() {
        let route = json!({"spec": {"rules": [
            {"backendRefs": [{"name": "echo", "port": 8080, "namespace": "shop"}],
             "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}}]},
            {"backendRefs": [{"name": "other", "port": 80}]}
        ]}});
        let mirror = |percent| StepRoute {
            mirror: Some(percent),
            ..StepRoute::default()
        };
        let routed = weighted_route(&RolloutSpec::default(), &route, "echo", &mirror(25));
        let rules = routed["spec"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["backendRefs"][1]["weight"], 0, "the canary answers nothing");
        assert_eq!(
            rules[0]["filters"],
            json!([
                {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}},
                {"type": "RequestMirror", "requestMirror": {
                    "backendRef": {"name": "echo-canary", "namespace": "shop", "port": 8080}, "percent": 25}}
            ]),
            "Git's own mirror kept"
        );
        assert_eq!(rules[1], route["spec"]["rules"][1]);
        let routed = weighted_route(&RolloutSpec::default(), &route, "echo", &mirror(100));
        assert_eq!(
            routed["spec"]["rules"][0]["filters"][1]["requestMirror"],
            json!({"backendRef": {"name": "echo-canary", "namespace": "shop", "port": 8080}}),
            "every request: Gateway API's default, left unsaid"
        );
        // The next step's route is Git's with its own share: the copy goes.
        let shifted = weighted_route(&RolloutSpec::default(), &route, "echo", &StepRoute::default());
        assert_eq!(
            shifted["spec"]["rules"][0]["filters"],
            route["spec"]["rules"][0]["filters"]
        );
    }

    #[test]
    fn a_rule_without_matches_takes_the_steps_as_they_are() {
        let route = json!({"spec": {"rules": [{"backendRefs": [{"name": "echo", "port": 80}]}]}});
        let routed = split(&route, 10, &[header(None, "x-canary", "yes")]);
        assert_eq!(
            routed["spec"]["rules"][0]["matches"],
            json!([{"headers": [{"name": "x-canary", "value": "yes"}]}])
        );
        assert_eq!(routed["spec"]["rules"][1]["backendRefs"][1]["weight"], 10);
    }

    #[test]
    fn an_nginx_canary_takes_its_one_header() {
        let ingress = json!({"metadata": {"name": "echo"}, "spec": {"rules": []}});
        let exact = canary_ingress(
            &RolloutSpec::default(),
            &ingress,
            "echo",
            0,
            &[header(None, "x-canary", "yes")],
        );
        let annotations = &exact["metadata"]["annotations"];
        assert_eq!(annotations["nginx.ingress.kubernetes.io/canary-by-header"], "x-canary");
        assert_eq!(annotations["nginx.ingress.kubernetes.io/canary-by-header-value"], "yes");
        let pattern = canary_ingress(
            &RolloutSpec::default(),
            &ingress,
            "echo",
            0,
            &[header(Some("RegularExpression"), "u", "^qa")],
        );
        assert_eq!(
            pattern["metadata"]["annotations"]["nginx.ingress.kubernetes.io/canary-by-header-pattern"],
            "^qa"
        );
        let cookie = canary_ingress(
            &RolloutSpec::default(),
            &ingress,
            "echo",
            0,
            &[
                header(None, "canary-by-cookie", "beta"),
                header(None, "x-canary", "yes"),
            ],
        );
        let annotations = &cookie["metadata"]["annotations"];
        assert_eq!(annotations["nginx.ingress.kubernetes.io/canary-by-cookie"], "beta");
        assert_eq!(annotations["nginx.ingress.kubernetes.io/canary-by-header"], "x-canary");
    }

    #[test]
    fn nginx_canary_ingress_points_at_the_canary_service() {
        let ingress = json!({"metadata": {"name": "echo", "namespace": "demo"}, "spec": {"ingressClassName": "nginx", "rules": [
            {"host": "echo.example", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "echo", "port": {"number": 80}}}}]}}
        ]}});
        let canary = canary_ingress(&RolloutSpec::default(), &ingress, "echo", 20, &[]);
        assert_eq!(canary["metadata"]["name"], "echo-canary");
        assert_eq!(
            canary["metadata"]["annotations"]["nginx.ingress.kubernetes.io/canary-weight"],
            "20"
        );
        assert_eq!(
            canary["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"],
            "echo-canary"
        );
    }

    #[test]
    fn objects_git_holds_in_the_wrong_shape_never_panic_an_overlay() {
        let intent = mid_release();
        let odd = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "echo"}, "spec": "x"});
        let template = json!({"spec": {}});
        assert_eq!(
            stable_workload(WorkloadKind::Deployment, &odd, Some(&template), &intent, "h")["spec"],
            "x"
        );
        stable_workload(WorkloadKind::StatefulSet, &odd, None, &intent, "h");
        let spec = spec_with(None, &[]);
        assert_eq!(canary_deployment(&spec, &odd, 1, "abc", "h")["spec"]["replicas"], 1);
        let route = json!({"spec": {"rules": ["all to echo", {"backendRefs": ["echo", {"name": "echo"}]}]}});
        let weighted = split(&route, 10, &[]);
        assert_eq!(weighted["spec"]["rules"][0], "all to echo");
        assert_eq!(weighted["spec"]["rules"][1]["backendRefs"][1]["weight"], 90);
        let ingress = json!({"metadata": {"name": "echo"}, "spec": {"rules": ["x", {"http": "y"}]}});
        assert_eq!(
            canary_ingress(&RolloutSpec::default(), &ingress, "echo", 10, &[])["spec"]["rules"][0],
            "x"
        );
    }
}
