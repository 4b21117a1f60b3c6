//! The pods of the workloads Rollouts release, by the revision each runs:
//! whether it is Ready and carries its batch label. One watch per workload
//! kind and scope keeps them, selected by a label only those pods carry (a
//! canary Deployment's marker, a StatefulSet's `controller-revision-hash`,
//! a Knative Revision's name), so that a release step counts its ready
//! canary pods and labels its batch without listing them. What the watch
//! holds is trusted only where it agrees with the workload's own count;
//! otherwise the caller lists as before.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::kept::Kept;
use gitcanary_core::rollout::overlay::{BATCH_ID_LABEL, CANARY_LABEL, WorkloadKind};

/// What a pod says of the revision it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodHeld {
    /// The value of the workload kind's revision label.
    pub revision: String,
    pub ready: bool,
    /// It carries the batch label already.
    pub batched: bool,
}

impl PodHeld {
    pub fn of(pod: &Pod, kind: WorkloadKind) -> PodHeld {
        let labels = pod.metadata.labels.as_ref();
        PodHeld {
            revision: labels
                .and_then(|l| l.get(kind.revision_label()))
                .cloned()
                .unwrap_or_default(),
            ready: is_ready(pod),
            batched: labels.is_some_and(|l| l.contains_key(BATCH_ID_LABEL)),
        }
    }
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The label that selects the pods a Rollout of `kind` reads: a canary
/// Deployment's pods only, or every pod of a StatefulSet or Knative Revision.
pub fn selector(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::Deployment => CANARY_LABEL,
        WorkloadKind::StatefulSet | WorkloadKind::KnativeService => kind.revision_label(),
    }
}

/// The pods kept for each workload kind's Rollouts.
#[derive(Default)]
pub struct RevisionPods {
    deployments: Kept<PodHeld>,
    stateful_sets: Kept<PodHeld>,
    knative: Kept<PodHeld>,
}

impl RevisionPods {
    pub fn of(&self, kind: WorkloadKind) -> &Kept<PodHeld> {
        match kind {
            WorkloadKind::Deployment => &self.deployments,
            WorkloadKind::StatefulSet => &self.stateful_sets,
            WorkloadKind::KnativeService => &self.knative,
        }
    }
}

/// How many pods of a StatefulSet's `update` revision are Ready, from what
/// the watch holds, when it agrees with the StatefulSet's own `status`: as
/// many pods of each revision (`currentReplicas`, `updatedReplicas`) and
/// as many Ready (`readyReplicas`). A watch that has not seen a pod's
/// latest change yet is not believed.
pub fn stateful_set_canary_ready(
    pods: &HashMap<String, PodHeld>,
    current: &str,
    update: &str,
    status: &serde_json::Value,
) -> Option<i32> {
    let count = |revision: &str, ready_only: bool| {
        pods.values()
            .filter(|p| p.revision == revision && (p.ready || !ready_only))
            .count() as i64
    };
    let field = |name: &str| status[name].as_i64().unwrap_or(0);
    let ready = if current == update {
        count(update, true)
    } else {
        count(update, true) + count(current, true)
    };
    let agrees = ready == field("readyReplicas")
        && count(update, false) == field("updatedReplicas")
        && count(current, false) == field("currentReplicas");
    agrees.then_some(count(update, true) as i32)
}

/// The canary pods (of revision `canary`) to label with their batch, from
/// what the watch holds; `None` when it holds fewer than the `expected`
/// canary pods (some may not have reached it yet): the caller lists them.
pub fn unbatched(pods: &HashMap<String, PodHeld>, canary: &str, expected: usize) -> Option<Vec<String>> {
    let of_canary: Vec<(&String, &PodHeld)> = pods.iter().filter(|(_, p)| p.revision == canary).collect();
    if of_canary.len() < expected {
        return None;
    }
    let mut names: Vec<String> = of_canary
        .into_iter()
        .filter(|(_, p)| !p.batched)
        .map(|(name, _)| name.clone())
        .collect();
    names.sort();
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(list: &[(&str, &str, bool, bool)]) -> HashMap<String, PodHeld> {
        list.iter()
            .map(|(name, revision, ready, batched)| {
                let held = PodHeld {
                    revision: revision.to_string(),
                    ready: *ready,
                    batched: *batched,
                };
                (name.to_string(), held)
            })
            .collect()
    }

    #[test]
    fn ready_canary_pods_are_counted_from_the_watch_only_when_it_agrees_with_the_stateful_set() {
        let status = |ready: i64, current: i64, updated: i64| serde_json::json!({"readyReplicas": ready, "currentReplicas": current, "updatedReplicas": updated});
        let held = pods(&[
            ("db-0", "db-old", true, false),
            ("db-1", "db-old", false, false),
            ("db-2", "db-new", true, false),
            ("other-0", "other-1", true, false),
        ]);
        assert_eq!(
            stateful_set_canary_ready(&held, "db-old", "db-new", &status(2, 2, 1)),
            Some(1)
        );
        // The StatefulSet counted a pod's readiness the watch has not seen yet.
        assert_eq!(
            stateful_set_canary_ready(&held, "db-old", "db-new", &status(3, 2, 1)),
            None
        );
        assert_eq!(
            stateful_set_canary_ready(&held, "db-old", "db-new", &status(1, 2, 1)),
            None
        );
        // Or a pod replaced by one of the new revision the watch has not seen yet.
        assert_eq!(
            stateful_set_canary_ready(&held, "db-old", "db-new", &status(2, 1, 2)),
            None
        );
        // Every pod on one revision.
        let held = pods(&[("db-0", "db-new", true, false), ("db-1", "db-new", true, false)]);
        assert_eq!(
            stateful_set_canary_ready(&held, "db-new", "db-new", &status(2, 2, 2)),
            Some(2)
        );
        assert_eq!(
            stateful_set_canary_ready(&held, "db-old", "db-new", &status(2, 0, 2)),
            Some(2)
        );
        // A StatefulSet with no pod reports no counts.
        assert_eq!(
            stateful_set_canary_ready(&pods(&[]), "db-old", "db-new", &serde_json::json!({})),
            Some(0)
        );
    }

    #[test]
    fn canary_pods_to_label_come_from_the_watch_once_it_holds_as_many_as_expected() {
        let held = pods(&[
            ("echo-canary-b", "new", true, false),
            ("echo-canary-a", "new", false, true),
            ("echo-old", "old", true, false),
        ]);
        assert_eq!(unbatched(&held, "new", 2), Some(vec!["echo-canary-b".to_string()]));
        assert_eq!(unbatched(&held, "new", 1), Some(vec!["echo-canary-b".to_string()]));
        assert_eq!(
            unbatched(&held, "new", 3),
            None,
            "a third canary pod may not have reached the watch"
        );
        assert_eq!(unbatched(&held, "old", 1), Some(vec!["echo-old".to_string()]));
        assert_eq!(unbatched(&held, "gone", 0), Some(vec![]));
    }
}
