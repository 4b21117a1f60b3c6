//! Workloads a HorizontalPodAutoscaler scales. Their replica count is the
//! autoscaler's: gitcanary applies the live count, as Argo CD does for a
//! field its `RespectIgnoreDifferences` leaves alone, so a sync never scales
//! a workload back to Git's number. Git's count is used only to create the
//! workload. Pure.

use serde_json::{Value, json};

pub use super::desired::{REPLICAS_FROM_ANNOTATION, replicas_from};
use super::{LiveObjects, Planned, desired};

/// A workload whose replicas were left to an autoscaler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftToAutoscaler {
    /// `Kind namespace/name` of the workload.
    pub workload: String,
    /// `Kind/name` of the autoscaler.
    pub autoscaler: String,
    /// What Git asks for, if anything.
    pub git: Option<i64>,
    /// What is applied: the live count, or Git's to create the workload.
    pub applied: Option<i64>,
}

impl std::fmt::Display for LeftToAutoscaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = |n: Option<i64>| n.map_or("none".to_string(), |n| n.to_string());
        write!(
            f,
            "{}: spec.replicas is left to {} (Git says {}, applied {})",
            self.workload,
            self.autoscaler,
            count(self.git),
            count(self.applied)
        )
    }
}

/// The workload an autoscaler in the same namespace targets, as `(group, kind, name)`.
fn target_of(autoscaler: &Planned<'_>) -> Option<(String, String, String)> {
    let target = &autoscaler.desired["spec"]["scaleTargetRef"];
    let group = target["apiVersion"]
        .as_str()
        .map(|v| v.rsplit_once('/').map_or("", |(group, _)| group).to_string())?;
    Some((
        group,
        target["kind"].as_str()?.to_string(),
        target["name"].as_str()?.to_string(),
    ))
}

fn is_autoscaler(item: &Planned<'_>) -> bool {
    item.key.group == "autoscaling" && item.key.kind == "HorizontalPodAutoscaler"
}

/// The kinds whose `spec.replicas` gitcanary leaves to an autoscaler.
fn is_scalable(group: &str, kind: &str) -> bool {
    group == "apps" && matches!(kind, "Deployment" | "StatefulSet" | "ReplicaSet")
}

/// Gives each workload an autoscaler among `objects` targets the live
/// replica count (Git's when it does not exist yet) and the annotation
/// naming the autoscaler. Returns what it left, for `diff` and the log.
pub fn leave_replicas_to_autoscalers(objects: &mut [Planned<'_>], live: &LiveObjects) -> Vec<LeftToAutoscaler> {
    let targets: Vec<_> = objects
        .iter()
        .filter(|item| is_autoscaler(item))
        .filter_map(|item| Some((item.key.namespace.clone(), item.name().to_string(), target_of(item)?)))
        .collect();
    let mut left = Vec::new();
    for (namespace, autoscaler, (group, kind, name)) in targets {
        if !is_scalable(&group, &kind) {
            continue;
        }
        let Some(workload) = objects.iter_mut().find(|item| {
            item.key.namespace == namespace && item.key.group == group && item.key.kind == kind && item.key.name == name
        }) else {
            continue;
        };
        let current = live.get(&workload.key).and_then(|l| l["spec"]["replicas"].as_i64());
        // A spec that is not a mapping is left for the API server to refuse.
        let Some(spec) = workload.desired["spec"].as_object_mut() else {
            continue;
        };
        let git = spec.get("replicas").and_then(Value::as_i64);
        let applied = current.or(git);
        match applied {
            Some(count) => spec.insert("replicas".to_string(), json!(count)),
            None => spec.remove("replicas"),
        };
        let from = format!("HorizontalPodAutoscaler/{autoscaler}");
        if let Some(annotations) = workload.desired["metadata"]["annotations"].as_object_mut() {
            annotations.insert(REPLICAS_FROM_ANNOTATION.to_string(), json!(from));
        }
        // The hash leaves the autoscaler's count out (see `desired::rehash`).
        desired::rehash(&mut workload.desired);
        left.push(LeftToAutoscaler {
            workload: workload.key.to_string(),
            autoscaler: from,
            git,
            applied,
        });
    }
    left
}
