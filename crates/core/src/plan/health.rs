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
    WorkloadProgress::of(object).is_none_or(|progress| progress.is_available())
}

/// How far a Deployment's or StatefulSet's controller has rolled out its
/// spec, as its status says. One reading for the app's health and for a
/// Rollout's observe (its canary's ready pods, its stable rolled out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadProgress {
    /// The controller has seen the latest spec (observedGeneration).
    seen_latest: bool,
    want: i64,
    /// Pods of any spec.
    replicas: i64,
    /// Pods of the latest spec.
    updated: i64,
    /// Available pods (a Deployment), ready pods (a StatefulSet).
    ready: i64,
}

impl WorkloadProgress {
    /// None for a kind that is not a Deployment or a StatefulSet.
    pub fn of(object: &Value) -> Option<WorkloadProgress> {
        WorkloadProgress::of_kind(object, object["kind"].as_str()?)
    }

    /// As [`WorkloadProgress::of`], for an object known to be of `kind`.
    pub fn of_kind(object: &Value, kind: &str) -> Option<WorkloadProgress> {
        let int = |value: &Value| value.as_i64().unwrap_or(0);
        let status = &object["status"];
        let ready = match kind {
            "Deployment" => int(&status["availableReplicas"]),
            "StatefulSet" => int(&status["readyReplicas"]),
            _ => return None,
        };
        Some(WorkloadProgress {
            seen_latest: int(&status["observedGeneration"]) >= int(&object["metadata"]["generation"]),
            want: object["spec"]["replicas"].as_i64().unwrap_or(1),
            replicas: int(&status["replicas"]),
            updated: int(&status["updatedReplicas"]),
            ready,
        })
    }

    /// Every wanted pod runs the latest spec and is available (old ones may linger).
    pub fn is_available(&self) -> bool {
        self.seen_latest && self.updated >= self.want && self.ready >= self.want
    }

    /// As wanted, and no pod of an older spec is left.
    pub fn is_complete(&self) -> bool {
        self.seen_latest && self.updated == self.want && self.ready == self.want && self.replicas == self.want
    }

    /// Whether the controller has seen the latest spec (observedGeneration).
    pub fn seen_latest(&self) -> bool {
        self.seen_latest
    }

    /// Ready pods of the latest spec where the status alone can say: the
    /// controller has seen it and every pod it counts is ready, so every
    /// updated one is. `None`: the pods must be looked at (a pod's readiness
    /// in a watch may be a moment old, and two such moments can cancel out
    /// in any count the status has).
    pub fn ready_of_latest_when_all_ready(&self) -> Option<i32> {
        (self.seen_latest && self.ready == self.replicas).then_some(self.updated as i32)
    }

    /// Ready pods of the latest spec; none until the controller has seen it.
    pub fn ready_of_latest(&self) -> i32 {
        if !self.seen_latest {
            return 0;
        }
        self.updated.min(self.ready) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(generation: i64, observed: i64, want: i64, replicas: i64, updated: i64, available: i64) -> Value {
        json!({"kind": "Deployment", "metadata": {"generation": generation}, "spec": {"replicas": want},
            "status": {"observedGeneration": observed, "replicas": replicas, "updatedReplicas": updated,
                       "availableReplicas": available, "readyReplicas": 0}})
    }

    #[test]
    fn ready_canary_pods_are_counted_from_the_stateful_set_only_when_every_pod_is_ready() {
        let set = |generation: i64, observed: i64, replicas: i64, ready: i64, updated: i64| {
            json!({
                "metadata": {"generation": generation},
                "status": {"observedGeneration": observed, "replicas": replicas, "readyReplicas": ready, "updatedReplicas": updated},
            })
        };
        let ready = |set: Value| {
            WorkloadProgress::of_kind(&set, "StatefulSet")
                .expect("a StatefulSet")
                .ready_of_latest_when_all_ready()
        };
        assert_eq!(ready(set(2, 2, 3, 3, 1)), Some(1));
        assert_eq!(ready(set(2, 2, 3, 3, 3)), Some(3));
        // A pod not Ready: which one is not known from the counts.
        assert_eq!(ready(set(2, 2, 3, 2, 1)), None);
        // The controller has not seen the latest spec yet.
        assert_eq!(ready(set(3, 2, 3, 3, 1)), None);
        assert!(
            !WorkloadProgress::of_kind(&set(3, 2, 3, 3, 1), "StatefulSet")
                .expect("a StatefulSet")
                .seen_latest()
        );
        // No pod at all: none ready.
        assert_eq!(ready(json!({"status": {}})), Some(0));
    }

    #[test]
    fn a_surge_is_available_but_not_complete_and_an_unseen_spec_counts_no_pod() {
        let surging = WorkloadProgress::of(&deployment(2, 2, 3, 4, 3, 3)).expect("a workload");
        assert!(surging.is_available() && !surging.is_complete());
        assert!(is_healthy(&deployment(2, 2, 3, 4, 3, 3)));
        let done = WorkloadProgress::of(&deployment(2, 2, 3, 3, 3, 3)).expect("a workload");
        assert!(done.is_complete());
        let unseen = WorkloadProgress::of(&deployment(3, 2, 3, 3, 3, 3)).expect("a workload");
        assert_eq!(unseen.ready_of_latest(), 0);
        assert!(!unseen.is_available() && !unseen.is_complete() && !is_healthy(&deployment(3, 2, 3, 3, 3, 3)));
        assert_eq!(
            WorkloadProgress::of(&deployment(2, 2, 3, 3, 2, 3)).map(|p| p.ready_of_latest()),
            Some(2)
        );
    }

    #[test]
    fn a_statefulset_counts_ready_pods_and_other_kinds_are_healthy_when_present() {
        let set = json!({"kind": "StatefulSet", "metadata": {"generation": 1}, "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 0}});
        assert!(WorkloadProgress::of(&set).is_some_and(|p| p.is_complete()));
        assert_eq!(WorkloadProgress::of(&json!({"kind": "ConfigMap"})), None);
        assert!(is_healthy(&json!({"kind": "ConfigMap"})));
    }
}
