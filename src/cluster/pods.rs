//! The pods of the workloads Rollouts release, by the revision each runs:
//! whether it carries its batch label. One watch per workload kind and
//! scope keeps them, selected by a label: a canary Deployment's marker
//! (its pods only), `controller-revision-hash` (every StatefulSet's and
//! DaemonSet's pods, so watched in the namespaces released in only), a
//! Knative Revision's name (every Revision's pods), so that a release step
//! labels its batch without listing them. What the watch holds is trusted only where it holds as
//! many canary pods as the step asks for; otherwise the caller lists.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::kept::Kept;
use gitcanary_core::rollout::overlay::{BATCH_ID_LABEL, CANARY_LABEL, WorkloadKind};

/// What a pod says of the revision it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodHeld {
    /// The value of the workload kind's revision label.
    pub revision: String,
    /// It carries the batch label already.
    pub batched: bool,
    /// The version seen: a batch label is written on that version only, so
    /// that a pod the watch saw before its label was written is not
    /// labelled again with a later step.
    pub resource_version: String,
}

impl PodHeld {
    pub fn of(pod: &Pod, kind: WorkloadKind) -> PodHeld {
        let labels = pod.metadata.labels.as_ref();
        PodHeld {
            revision: labels
                .and_then(|l| l.get(kind.revision_label()))
                .cloned()
                .unwrap_or_default(),
            batched: labels.is_some_and(|l| l.contains_key(BATCH_ID_LABEL)),
            resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
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

/// The canary pods (of revision `canary`) to label with their batch, with
/// the version seen, from what the watch holds; `None` when it holds fewer
/// than the `expected` canary pods (some may not have reached it yet): the
/// caller lists them.
pub fn unbatched(pods: &HashMap<String, PodHeld>, canary: &str, expected: usize) -> Option<Vec<(String, String)>> {
    let of_canary: Vec<(&String, &PodHeld)> = pods.iter().filter(|(_, p)| p.revision == canary).collect();
    if of_canary.len() < expected {
        return None;
    }
    let mut names: Vec<(String, String)> = of_canary
        .into_iter()
        .filter(|(_, p)| !p.batched)
        .map(|(name, p)| (name.clone(), p.resource_version.clone()))
        .collect();
    names.sort();
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(list: &[(&str, &str, bool)]) -> HashMap<String, PodHeld> {
        list.iter()
            .map(|(name, revision, batched)| {
                let held = PodHeld {
                    revision: revision.to_string(),
                    batched: *batched,
                    resource_version: format!("{name}-1"),
                };
                (name.to_string(), held)
            })
            .collect()
    }

    #[test]
    fn canary_pods_to_label_come_from_the_watch_once_it_holds_as_many_as_expected() {
        let held = pods(&[
            ("echo-canary-b", "new", false),
            ("echo-canary-a", "new", true),
            ("echo-old", "old", false),
        ]);
        let canary_b = ("echo-canary-b".to_string(), "echo-canary-b-1".to_string());
        assert_eq!(unbatched(&held, "new", 2), Some(vec![canary_b.clone()]));
        assert_eq!(unbatched(&held, "new", 1), Some(vec![canary_b]));
        assert_eq!(
            unbatched(&held, "new", 3),
            None,
            "a third canary pod may not have reached the watch"
        );
        assert_eq!(
            unbatched(&held, "old", 1),
            Some(vec![("echo-old".to_string(), "echo-old-1".to_string())])
        );
        assert_eq!(unbatched(&held, "gone", 0), Some(vec![]));
    }
}
