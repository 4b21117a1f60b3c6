//! The plan stage of one app, pure: from what observe gathered of the app
//! (its resolved objects, its Rollouts, what left Git), everything the
//! executor does is decided here, with no request: replicas left to
//! autoscalers, each Rollout's plan and overlays, then the app's writes,
//! prunes and releases. (Where the objects may land is checked before
//! observe reads anything of the app: see `sync::observe_app`.)

use std::collections::BTreeMap;

use crate::manifest::{Manifest, ObjectKey, Problem};
use crate::model::{InventoryEntry, LeftGit};
use crate::plan::autoscaled::{LeftToAutoscaler, leave_replicas_to_autoscalers};
use crate::plan::{AppInputs, AppPlan, LiveObjects, Planned, RevisionKeys, plan_app};
use crate::rollout::desired::plan_rollouts;
use crate::rollout::model::{RolloutWork, RolloutsObserved};

/// Everything an app's plan reads of the app, as observe gathered it.
pub struct AppObserved<'a> {
    pub app: &'a str,
    /// The app's objects, resolved against the cluster's kinds.
    pub objects: Vec<Planned<'a>>,
    /// Manifests of kinds that CRDs of this revision add.
    pub pending: Vec<&'a Manifest>,
    pub rollouts: RolloutsObserved,
    /// The inventory entries that left Git, as the cluster has them now.
    pub left_git: BTreeMap<ObjectKey, LeftGit>,
    /// The app's inventory as the last sync left it.
    pub inventory: &'a [InventoryEntry],
    /// Why that inventory cannot be read, when it cannot.
    pub unreadable_inventory: Option<&'a str>,
}

/// What every app's plan shares: the live objects of the revision's kinds,
/// the revision's keys, and the agent's settings that decide.
pub struct PlanContext<'a> {
    pub live: &'a LiveObjects,
    pub revision: &'a RevisionKeys,
    pub instance: &'a str,
    pub default_namespace: &'a str,
    pub prune: bool,
}

/// An app planned, ready for the executor.
pub struct Prepared<'a> {
    pub plan: AppPlan<'a>,
    pub rollouts: Vec<RolloutWork>,
    /// Workloads whose replica count is an autoscaler's, not Git's.
    pub autoscaled: Vec<LeftToAutoscaler>,
}

/// The app's plan; the problems that keep it from being applied at all.
pub fn plan<'a>(observed: AppObserved<'a>, context: &PlanContext<'_>) -> Result<Prepared<'a>, Vec<Problem>> {
    let AppObserved {
        app,
        mut objects,
        pending,
        rollouts,
        left_git,
        inventory,
        unreadable_inventory,
    } = observed;
    let autoscaled = leave_replicas_to_autoscalers(&mut objects, context.live);
    // Rollouts overlay the objects they govern before anything is compared.
    let (rollouts, problems) = plan_rollouts(&mut objects, rollouts, context.instance);
    if !problems.is_empty() {
        return Err(problems);
    }
    let plan = plan_app(AppInputs {
        app,
        objects,
        pending,
        live: context.live,
        previous: inventory,
        left_git: &left_git,
        revision: context.revision,
        unreadable_inventory,
        has_rollouts: !rollouts.is_empty(),
        instance: context.instance,
        default_namespace: context.default_namespace,
        prune: context.prune,
    });
    Ok(Prepared {
        plan,
        rollouts,
        autoscaled,
    })
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
