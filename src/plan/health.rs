//! What the sync reports as an app's health: workloads rolled out and
//! available, other objects present. Pure.

use serde_json::{Value, json};

/// What [`is_healthy`] reads of an object, and no more (a copy of every
/// unchanged object would double the memory of a large sync).
pub fn health_view(object: &Value) -> Value {
    json!({
        "kind": object["kind"],
        "metadata": {"generation": object["metadata"]["generation"]},
        "spec": {"replicas": object["spec"]["replicas"]},
        "status": object["status"],
    })
}

/// Workloads are healthy when rolled out and available; other objects when present.
pub fn is_healthy(object: &Value) -> bool {
    let kind = object["kind"].as_str().unwrap_or_default();
    if !matches!(kind, "Deployment" | "StatefulSet") {
        return true;
    }
    let status = &object["status"];
    let want = object["spec"]["replicas"].as_i64().unwrap_or(1);
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    let updated = status["updatedReplicas"].as_i64().unwrap_or(0);
    let ready = match kind {
        "Deployment" => status["availableReplicas"].as_i64().unwrap_or(0),
        _ => status["readyReplicas"].as_i64().unwrap_or(0),
    };
    observed >= generation && updated >= want && ready >= want
}
