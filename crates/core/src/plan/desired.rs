//! Desired objects as gitcanary applies them, and the checks that let a
//! resync skip what is already in place. Pure.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::quantity;
use crate::manifest::Manifest;
use crate::{APPLIED_HASH_ANNOTATION, MANAGED_BY_LABEL, SOURCE_ANNOTATION};

/// The object to apply for a manifest: namespace filled in for namespaced
/// kinds (removed for cluster-scoped ones), inventory label and source
/// annotation added, and the hash of all that recorded in an annotation.
pub fn prepare(manifest: &Manifest, namespaced: bool, instance: &str, default_namespace: &str) -> Value {
    let mut object = manifest.object.clone();
    fold_string_data(&mut object);
    let metadata = object["metadata"]
        .as_object_mut()
        .expect("validated: metadata is a mapping");
    if namespaced {
        metadata
            .entry("namespace")
            .or_insert_with(|| Value::String(default_namespace.to_string()));
    } else {
        metadata.remove("namespace");
    }
    ensure_map(metadata, "labels").insert(MANAGED_BY_LABEL.to_string(), Value::String(instance.to_string()));
    ensure_map(metadata, "annotations").insert(
        SOURCE_ANNOTATION.to_string(),
        Value::String(format!("{}:{}", manifest.file, manifest.line)),
    );
    let hash = canonical_hash(&object);
    let metadata = object["metadata"].as_object_mut().expect("still a mapping");
    ensure_map(metadata, "annotations").insert(APPLIED_HASH_ANNOTATION.to_string(), Value::String(hash));
    object
}

/// A core Secret's `stringData` as the API server stores it: base64 in
/// `data`, each `stringData` key winning over the same key of `data`. The
/// server never keeps `stringData`, so a Secret applied with it would never
/// match what is live and be written again at every sync.
fn fold_string_data(object: &mut Value) {
    if object["apiVersion"] != "v1" || object["kind"] != "Secret" {
        return;
    }
    let Some(map) = object.as_object_mut() else { return };
    let Some(Value::Object(strings)) = map.get("stringData").cloned() else {
        return;
    };
    if strings.values().any(|v| !v.is_string()) {
        return; // left for the API server to refuse with its own words
    }
    map.remove("stringData");
    let data = ensure_map(map, "data");
    for (key, value) in strings {
        data.insert(
            key,
            Value::String(base64(value.as_str().unwrap_or_default().as_bytes())),
        );
    }
}

/// Standard base64 with padding, as Secret `data` holds it.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// On a workload whose replicas an autoscaler owns: `Kind/name` of that
/// autoscaler, for `kubectl get` and for the rollout planner.
pub const REPLICAS_FROM_ANNOTATION: &str = "gitcanary.io/replicas-from";

/// The autoscaler a desired workload's replicas were left to, if any.
pub fn replicas_from(desired: &Value) -> Option<&str> {
    desired["metadata"]["annotations"][REPLICAS_FROM_ANNOTATION].as_str()
}

/// Records the hash of an object changed after [`prepare`] (by a rollout
/// overlay, or to leave its replicas to an autoscaler). A count an
/// autoscaler owns is left out, so its moves are not a change of Git's.
pub fn rehash(object: &mut Value) {
    if let Some(annotations) = object["metadata"]["annotations"].as_object_mut() {
        annotations.remove(APPLIED_HASH_ANNOTATION);
    }
    let hash = if replicas_from(object).is_some() {
        let mut content = object.clone();
        if let Some(spec) = content["spec"].as_object_mut() {
            spec.remove("replicas");
        }
        canonical_hash(&content)
    } else {
        canonical_hash(object)
    };
    if let Some(metadata) = object["metadata"].as_object_mut() {
        ensure_map(metadata, "annotations").insert(APPLIED_HASH_ANNOTATION.to_string(), Value::String(hash));
    }
}

fn ensure_map<'a>(parent: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = parent.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut().expect("just made a mapping")
}

/// A hash of the object's content that does not depend on key order.
pub fn canonical_hash(value: &Value) -> String {
    let mut hasher = Sha256::new();
    feed(&mut hasher, value);
    hex::encode(&hasher.finalize()[..16])
}

fn feed(hasher: &mut Sha256, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<_> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for key in keys {
                hasher.update(serde_json::to_string(key).unwrap_or_default().as_bytes());
                hasher.update(b":");
                feed(hasher, &map[key]);
                hasher.update(b",");
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for item in items {
                feed(hasher, item);
                hasher.update(b",");
            }
            hasher.update(b"]");
        }
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}

/// True when every field the desired object sets has the same value live,
/// as the API server would store it: fields the server defaulted, or other
/// managers own, are ignored; lists must have the same length; an empty
/// list or map is the same as none (the server drops them); in built-in
/// kinds, resource quantities compare by amount (`2000m` is `2`). A zero
/// value (`false`, `0`, `""`) is a value: where the server drops it, its
/// dry-run answer says so (`AppPlan::settle`).
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    subset_in(desired, live, false, !is_custom_resource(desired), false)
}

/// [`is_subset`] for a pod template (or a canary object) gitcanary compares
/// with what the server stored to tell which revision it is: there a zero
/// value the server drops (`readOnly: false`, an env `value: ""`) is the
/// same as none, with no dry-run to ask, or the release would never see
/// its template rolled out.
pub fn is_stored_as(desired: &Value, live: &Value) -> bool {
    subset_in(desired, live, false, !is_custom_resource(desired), true)
}

/// An object of a group no Kubernetes release serves: its fields mean what
/// its CRD says, and a `limits` there is not a resource list.
fn is_custom_resource(object: &Value) -> bool {
    let Some(api_version) = object["apiVersion"].as_str() else {
        return false; // a part of an object (a pod template): built-in
    };
    match api_version.split_once('/') {
        None => false,
        Some((group, _)) => group.contains('.') && !group.ends_with(".k8s.io"),
    }
}

/// [`is_subset`], `quantities` true under a key that holds resource
/// quantities (in a built-in kind: `built_in`); with `zero_is_absent`, as
/// [`is_stored_as`].
fn subset_in(desired: &Value, live: &Value, quantities: bool, built_in: bool, zero_is_absent: bool) -> bool {
    match (desired, live) {
        (Value::Null, _) => true,
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(key, value)| {
            let quantities = quantities || (built_in && quantity::holds_quantities(key));
            match have.get(key) {
                Some(have) => subset_in(value, have, quantities, built_in, zero_is_absent),
                None => is_empty(value) || (zero_is_absent && is_zero(value)),
            }
        }),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len()
                && want
                    .iter()
                    .zip(have)
                    .all(|(w, h)| subset_in(w, h, quantities, built_in, zero_is_absent))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::String(a), Value::String(b)) if quantities => a == b || quantity::same_quantity(a, b),
        (Value::String(a), Value::Number(b)) | (Value::Number(b), Value::String(a)) if quantities => {
            quantity::same_quantity(a, &b.to_string())
        }
        // YAML may give `"80"` where the server stores 80 (int-or-string fields).
        (Value::String(a), Value::Number(b)) | (Value::Number(b), Value::String(a)) => *a == b.to_string(),
        (a, b) => a == b,
    }
}

/// Whether applying `desired` would leave the live object as it is, given
/// the server's dry-run answer to it: equal but for what the server keeps
/// by itself (versions, field managers, and the status, unless Git sets one:
/// a custom resource without a status subresource takes it from Git).
pub fn applies_as_is(live: &Value, answer: &Value, desired: &Value) -> bool {
    let keeps_status = desired.get("status").is_none_or(is_empty);
    let content = |object: &Value| {
        let mut object = object.clone();
        if let Some(map) = object.as_object_mut()
            && keeps_status
        {
            map.remove("status");
        }
        if let Some(metadata) = object["metadata"].as_object_mut() {
            for field in ["managedFields", "resourceVersion", "generation"] {
                metadata.remove(field);
            }
        }
        object
    };
    !answer.is_null() && content(live) == content(answer)
}

/// A zero value, which the server drops from a field that omits it when empty.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::String(text) => text.is_empty(),
        Value::Number(number) => number.as_f64() == Some(0.0),
        _ => false,
    }
}

/// What the server stores as nothing at all (`env: []`, `annotations: {}`).
/// Not a zero value: `allowPrivilegeEscalation: false` removed by hand is
/// drift, since absent means true.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        for (text, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("hunter2?>", "aHVudGVyMj8+"),
        ] {
            assert_eq!(base64(text.as_bytes()), encoded, "{text}");
        }
    }

    #[test]
    fn a_secrets_string_data_is_applied_as_the_server_stores_it() {
        let manifest = Manifest {
            app: "web".into(),
            file: "web/secret.yaml".into(),
            line: 1,
            object: serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                "data": {"kept": "a2VwdA==", "user": "b2xk"}, "stringData": {"user": "admin", "password": "hunter2"}}),
        };
        let object = prepare(&manifest, true, "agent", "demo");
        assert!(object.get("stringData").is_none());
        assert_eq!(
            object["data"],
            serde_json::json!({"kept": "a2VwdA==", "user": "YWRtaW4=", "password": "aHVudGVyMg=="})
        );
        // Any other kind keeps its fields as they are.
        let other = Manifest {
            object: serde_json::json!({"apiVersion": "example.com/v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"a": "b"}}),
            ..manifest
        };
        assert_eq!(
            prepare(&other, true, "agent", "demo")["stringData"],
            serde_json::json!({"a": "b"})
        );
    }
    use serde_json::json;

    fn manifest(object: Value) -> Manifest {
        Manifest {
            app: "web".into(),
            file: "web/cm.yaml".into(),
            line: 3,
            object,
        }
    }

    #[test]
    fn prepared_objects_carry_inventory_and_namespace() {
        let object = prepare(
            &manifest(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})),
            true,
            "agent-1",
            "default",
        );
        assert_eq!(object["metadata"]["namespace"], "default");
        let configured = prepare(
            &manifest(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})),
            true,
            "agent-1",
            "team-a",
        );
        assert_eq!(configured["metadata"]["namespace"], "team-a", "--default-namespace");
        assert_eq!(object["metadata"]["labels"][MANAGED_BY_LABEL], "agent-1");
        assert_eq!(object["metadata"]["annotations"][SOURCE_ANNOTATION], "web/cm.yaml:3");
        assert!(object["metadata"]["annotations"][APPLIED_HASH_ANNOTATION].is_string());
    }

    #[test]
    fn hash_ignores_key_order_but_not_values() {
        let a = json!({"a": 1, "b": {"c": [1, 2]}});
        let b = json!({"b": {"c": [1, 2]}, "a": 1});
        let c = json!({"b": {"c": [2, 1]}, "a": 1});
        assert_eq!(canonical_hash(&a), canonical_hash(&b));
        assert_ne!(canonical_hash(&a), canonical_hash(&c));
    }

    #[test]
    fn defaulted_fields_are_not_drift_but_edits_are() {
        let desired = json!({"spec": {"replicas": 2, "ports": [{"port": 80}]}});
        let live =
            json!({"spec": {"replicas": 2, "ports": [{"port": 80, "protocol": "TCP"}], "sessionAffinity": "None"}});
        assert!(is_subset(&desired, &live));
        let edited = json!({"spec": {"replicas": 5, "ports": [{"port": 80, "protocol": "TCP"}]}});
        assert!(!is_subset(&desired, &edited));
        let extra_port = json!({"spec": {"replicas": 2, "ports": [{"port": 80}, {"port": 81}]}});
        assert!(!is_subset(&desired, &extra_port));
    }

    #[test]
    fn quantities_compare_by_amount_where_the_server_stores_quantities() {
        let desired = json!({"spec": {"containers": [{"name": "app", "resources": {
            "limits": {"cpu": "2000m", "memory": "1Gi"}, "requests": {"cpu": 0.5, "memory": "129000000"}}}],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1024Mi"}}]}});
        let live = json!({"spec": {"containers": [{"name": "app", "resources": {
            "limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "129e6"}}}],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]}});
        assert!(is_subset(&desired, &live));
        let more = json!({"spec": {"containers": [{"name": "app", "resources": {
            "limits": {"cpu": "2001m", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "129e6"}}}],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]}});
        assert!(!is_subset(&desired, &more), "a real change of amount is drift");
        // Elsewhere a string is text: an image tag `1.0` is not `1`, nor a
        // custom resource's `limits`, whose meaning its CRD gives.
        let widget =
            |cpu: &str| json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"limits": {"cpu": cpu}}});
        assert!(!is_subset(&widget("1.0"), &widget("1")));
        let quota = |cpu: &str| json!({"apiVersion": "v1", "kind": "ResourceQuota", "spec": {"hard": {"cpu": cpu}}});
        assert!(is_subset(&quota("4000m"), &quota("4")));
        assert!(!is_subset(&json!({"image": "1.0"}), &json!({"image": "1"})));
        assert!(!is_subset(
            &json!({"data": {"cpu": "2000m"}}),
            &json!({"data": {"cpu": "2"}})
        ));
    }

    #[test]
    fn an_apply_the_server_would_store_as_it_is_changes_nothing() {
        let live = json!({"metadata": {"name": "a", "resourceVersion": "7", "generation": 2,
            "managedFields": [{"manager": "kube-controller-manager"}], "annotations": {"h": "1"}},
            "spec": {"cpu": "2"}, "status": {"ready": 1}});
        let answer = json!({"metadata": {"name": "a", "resourceVersion": "8", "generation": 2,
            "managedFields": [{"manager": "gitcanary"}], "annotations": {"h": "1"}},
            "spec": {"cpu": "2"}, "status": {"ready": 2}});
        let desired = json!({"spec": {"cpu": "2000m"}});
        assert!(applies_as_is(&live, &answer, &desired));
        let mut changed = answer.clone();
        changed["spec"]["cpu"] = json!("3");
        assert!(!applies_as_is(&live, &changed, &desired));
        let mut rehashed = answer.clone();
        rehashed["metadata"]["annotations"]["h"] = json!("2");
        assert!(
            !applies_as_is(&live, &rehashed, &desired),
            "gitcanary's own annotations are written too"
        );
        assert!(!applies_as_is(&live, &Value::Null, &desired), "no answer is no proof");
        let with_status = json!({"spec": {"cpu": "2"}, "status": {"ready": 2}});
        assert!(
            !applies_as_is(&live, &answer, &with_status),
            "a status Git sets is Git's"
        );
    }

    #[test]
    fn an_empty_list_or_map_is_the_same_as_none_but_a_zero_value_is_a_value() {
        let desired = json!({"metadata": {"annotations": {}}, "spec": {"env": [], "selector": null}});
        assert!(is_subset(&desired, &json!({"metadata": {}, "spec": {}})));
        assert!(!is_subset(
            &json!({"spec": {"env": [{"name": "A"}]}}),
            &json!({"spec": {}})
        ));
        // Absent means true: someone removing it is drift.
        let locked =
            json!({"securityContext": {"allowPrivilegeEscalation": false}, "automountServiceAccountToken": false});
        assert!(!is_subset(&locked, &json!({"securityContext": {}})));
        assert!(!is_subset(&json!({"runAsUser": 0}), &json!({})));
        assert!(!is_subset(&json!({"data": {"empty": ""}}), &json!({"data": {}})));
        // A template compared to tell its revision: what the server drops is none.
        let template = json!({"spec": {"hostNetwork": false, "containers": [{"name": "a",
            "env": [{"name": "E", "value": ""}], "ports": [{"containerPort": 80, "hostPort": 0}]}]}});
        let stored =
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "E"}], "ports": [{"containerPort": 80}]}]}});
        assert!(is_stored_as(&template, &stored));
        assert!(!is_subset(&template, &stored));
        assert!(!is_stored_as(
            &json!({"spec": {"hostNetwork": true}}),
            &json!({"spec": {}})
        ));
    }
}
