//! What the rollout engine's stages hand each other: the Rollout found in
//! its app (`Target`), what observe read (`RolloutObserved`), and what the
//! plan leaves to do (`RolloutWork`, `CanaryWrite`, `RolloutSummary`).
//! Types only, so that observe, desired and the engine import it and not
//! each other.

use std::collections::BTreeMap;

use serde_json::Value;

use super::api::{RolloutSpec, RolloutStatus, WrittenBack};
use super::overlay::{self, WorkloadKind};
use super::plan::{GatewaySeen, Observed, Plan, Revisions};
use crate::manifest::{ObjectKey, Problem};
use crate::model::{Deletion, Resolved};
use crate::plan::Planned;

/// A Rollout of the app and the workload it governs, found among the app's objects.
pub struct Target {
    /// Index of the Rollout among the app's objects.
    pub index: usize,
    pub spec: RolloutSpec,
    pub namespace: String,
    pub name: String,
    pub kind: WorkloadKind,
    /// Index of the governed workload among the app's objects.
    pub workload: usize,
}

impl Target {
    /// Validation refuses a Rollout whose objects the app does not hold; these
    /// lookups fail only for what validation let through.
    pub fn find(planned: &[Planned<'_>], index: usize) -> Result<Target, Problem> {
        let manifest = planned[index].manifest;
        let spec: RolloutSpec = serde_json::from_value(manifest.object["spec"].clone())
            .map_err(|e| manifest.problem(format!("invalid Rollout spec: {e}")))?;
        let namespace = planned[index].namespace().unwrap_or("default").to_string();
        let workload_ref = &spec.workload_ref;
        let kind = WorkloadKind::parse(&workload_ref.api_version, &workload_ref.kind).ok_or_else(|| {
            manifest.problem(format!(
                "workloadRef {} {} is not supported: {}",
                workload_ref.api_version,
                workload_ref.kind,
                overlay::SUPPORTED_WORKLOADS
            ))
        })?;
        let workload = find_in(
            planned,
            kind.group(),
            &workload_ref.kind,
            &namespace,
            &workload_ref.name,
        )
        .ok_or_else(|| {
            manifest.problem(format!(
                "workloadRef names {} {namespace}/{}, which this app does not hold",
                workload_ref.kind, workload_ref.name
            ))
        })?;
        Ok(Target {
            index,
            name: manifest.name().to_string(),
            spec,
            namespace,
            kind,
            workload,
        })
    }
}

pub fn find_in(planned: &[Planned<'_>], group: &str, kind: &str, namespace: &str, name: &str) -> Option<usize> {
    planned.iter().position(|p| {
        p.manifest.group() == group && p.manifest.kind() == kind && p.name() == name && p.namespace() == Some(namespace)
    })
}

/// An app's Rollouts as observe found them, before any is planned: each
/// with its target and what was read, or the problem that keeps the app
/// from being applied.
pub struct RolloutsObserved(pub Vec<Result<(Target, RolloutObserved), Problem>>);

/// Everything a Rollout's plan is made from that the cluster holds.
pub struct RolloutObserved {
    /// What the planner reads (the selector check is added by `desired`).
    pub planner: Observed,
    pub previous: Option<RolloutStatus>,
    /// The live Rollout's uid, which its canary objects name.
    pub rollout_uid: Option<String>,
    /// The last GitHub comment whose command was handled.
    pub last_command_comment: u64,
    pub revisions: Revisions,
    /// The template the stable pods run, when the workload exists.
    pub stable_template: Option<Value>,
    /// A Knative Service serves Git's template on its newest Revision, so
    /// Git's own traffic may take over.
    pub knative_settled: bool,
    /// Canary objects that exist, by (kind, name).
    pub canary_live: BTreeMap<(&'static str, String), Value>,
    /// The canary kinds the API server serves.
    pub canary_kinds: BTreeMap<&'static str, Resolved>,
    /// The Gateways serving the release's routes, read for a release that mirrors.
    pub gateways: Vec<GatewaySeen>,
    /// The Rollout's status file in Git could not be read: nothing of the
    /// app is applied, rather than release blind.
    pub record_problem: Option<String>,
}

/// What remains to do for one rollout once its app has been applied.
#[derive(Debug)]
pub struct RolloutWork {
    pub namespace: String,
    pub name: String,
    /// The live Rollout's uid as observed; `None` for one this sync creates.
    pub rollout_uid: Option<String>,
    /// The app the Rollout belongs to.
    pub app: String,
    /// Images of the template in Git, for the status written on promote.
    pub images: Vec<String>,
    pub spec: RolloutSpec,
    /// The last GitHub comment whose command was handled.
    pub last_command_comment: u64,
    pub kind: WorkloadKind,
    pub workload: String,
    pub plan: Plan,
    /// `file:line` of the Rollout.
    pub source: String,
    /// Canary objects to write before the app's objects (routes may name them).
    pub canary_writes: Vec<CanaryWrite>,
    /// Canary routes (canary Ingresses) of this instance to delete before
    /// the app's objects are written: their share goes back on stable first.
    pub route_deletions: Vec<Deletion>,
    /// The other canary objects of this instance to delete once the routes
    /// are back on stable: the Services they named, then the workload.
    pub canary_deletions: Vec<Deletion>,
    pub revisions: Revisions,
}

/// A canary object that differs from what the cluster has.
#[derive(Debug)]
pub struct CanaryWrite {
    pub key: ObjectKey,
    pub resolved: Resolved,
    pub object: Value,
    /// The live object by that name, if any.
    pub live: Option<Value>,
    /// The live object is this instance's: conflicts are forced.
    pub ours: bool,
}

impl RolloutWork {
    pub fn requeue(&self) -> Option<crate::rollout::plan::Requeue> {
        self.plan.requeue
    }

    /// What GitHub reporting needs to know of this rollout.
    pub fn summary(&self) -> RolloutSummary {
        RolloutSummary {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            spec: self.spec.clone(),
            status: self.plan.status.clone(),
            changed: self.plan.changed,
            last_command_comment: self.last_command_comment,
        }
    }
}

/// A rollout after a sync, for reporting.
#[derive(Debug, Clone)]
pub struct RolloutSummary {
    pub namespace: String,
    pub name: String,
    pub spec: RolloutSpec,
    pub status: RolloutStatus,
    /// The status changed in this sync.
    pub changed: bool,
    pub last_command_comment: u64,
}

/// The canary objects a release of `spec` may make: (apiVersion, kind,
/// name); `None` for a workload kind no release governs.
pub fn canary_object_names(spec: &RolloutSpec) -> Option<Vec<(&'static str, &'static str, String)>> {
    let workload = &spec.workload_ref;
    let kind = WorkloadKind::parse(&workload.api_version, &workload.kind)?;
    let canary = &spec.strategy.canary;
    let mut names = Vec::new();
    if kind == WorkloadKind::Deployment {
        names.push(("apps/v1", "Deployment", canary.canary_name(&workload.name)));
    }
    for routing in &canary.traffic_routings {
        names.push(("v1", "Service", canary.canary_name(&routing.service)));
        if let Some(ingress) = &routing.ingress {
            names.push(("networking.k8s.io/v1", "Ingress", canary.canary_name(&ingress.name)));
        }
    }
    for (run, _) in super::jobs::job_runs(spec) {
        names.push(("batch/v1", "Job", super::jobs::job_name(spec, &run)));
    }
    Some(names)
}

/// A canary pod of a release, by the batch (step) that made it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchPod {
    pub name: String,
    /// The step whose batch made it (`gitcanary.io/rollout-batch-id`).
    pub batch: String,
    pub ready: bool,
    pub restarts: i32,
}

/// The batch pods of releases, by Rollout (namespace, name).
pub type BatchPods = BTreeMap<(String, String), Vec<BatchPod>>;

/// What the agent wrote to Git for pending write-backs since their
/// Rollouts' statuses were written, by (namespace, name): the next plan of
/// each records it in the status (one writer of the status).
pub type WrittenBacks = BTreeMap<(String, String), WrittenBack>;
