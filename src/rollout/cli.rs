//! What `gitcanary promote`, `abort` and `status` do.

use jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde_json::json;

use super::api::{CanaryStep, IntOrPercent, Phase, Rollout, StepState, describe_matches};
use super::api::{LAST_COMMENT_ANNOTATION, annotation_of};
use super::plan::parse_percent;
use super::signal;
use crate::cluster::{Cluster, Writer};
use crate::{Error, Result};

pub use super::api::Signal;

/// Sets the signal annotation to a fresh token for the running release; the
/// engine acts on each token once.
pub async fn send_signal(cluster: &Cluster, namespace: &str, name: &str, signal: Signal) -> Result<()> {
    send_signal_token(
        &cluster.writer(None),
        namespace,
        name,
        signal,
        &format!("the CLI at {}", Timestamp::now()),
        None,
    )
    .await
}

/// The release and step a decision was made on (on GitHub, from a snapshot
/// that may be behind): a signal for it is sent only while the Rollout is
/// still there, so an approval of one pause never passes a later one.
#[derive(Debug, Clone, Copy)]
pub struct DecidedOn<'a> {
    pub canary_commit: &'a str,
    /// The pause decided on; `None` for an abort, which stops any step.
    pub step: Option<u32>,
}

/// Sets the signal annotation to a token naming the running release and
/// `by` (a pull-request comment, say). Refused when nothing waits for the
/// signal: a promote kept for later would pass the next release's gate.
/// Sent through `writer`: a replica's writer fenced to the Rollout's app
/// sends nothing once it no longer holds the app's shard.
pub async fn send_signal_token(
    writer: &Writer<'_>,
    namespace: &str,
    name: &str,
    signal: Signal,
    by: &str,
    decided_on: Option<DecidedOn<'_>>,
) -> Result<()> {
    // The signal is written only onto the Rollout as it was checked: when
    // the agent moved it on meanwhile, it is read and checked again.
    for _ in 0..5 {
        match send_if_unchanged(writer, namespace, name, signal, by, decided_on).await {
            Err(Error::Kube { source, .. }) if matches!(&*source, kube::Error::Api(status) if status.code == 409) => {
                continue;
            }
            done => return done,
        }
    }
    Err(Error::Conflict(format!(
        "rollout {namespace}/{name} kept changing while the {} was sent; nothing was sent, try again",
        signal.verb()
    )))
}

async fn send_if_unchanged(
    writer: &Writer<'_>,
    namespace: &str,
    name: &str,
    signal: Signal,
    by: &str,
    decided_on: Option<DecidedOn<'_>>,
) -> Result<()> {
    let api: Api<Rollout> = Api::namespaced(writer.cluster().client.clone(), namespace);
    let rollout = api
        .get(name)
        .await
        .map_err(Error::kube(format!("Rollout {namespace}/{name}")))?;
    let status = rollout.status.clone().unwrap_or_default();
    let refused = |why: String| Error::Usage(format!("rollout {namespace}/{name}: {why}; nothing was sent"));
    signal::awaited(signal, &status).map_err(refused)?;
    let uid = rollout.metadata.uid.as_deref().unwrap_or_default();
    let release = signal::Release::running(uid, &status).ok_or_else(|| refused("no release is running".to_string()))?;
    if let Some(decided) = decided_on {
        let step = status.canary_status.as_ref().map(|c| c.current_step_index);
        if decided.canary_commit != status.canary_commit || decided.step.is_some_and(|s| Some(s) != step) {
            let why = format!(
                "it was decided on release {} at step {}, and the Rollout is now at release {} step {}",
                crate::short_commit(decided.canary_commit),
                decided.step.map_or_else(|| "any".to_string(), |s| s.to_string()),
                release.describe(),
                step.unwrap_or_default()
            );
            // The same release at another step: the decision is looked at
            // again with the Rollout as it is now (it may be for that step).
            if decided.canary_commit == status.canary_commit {
                return Err(Error::Conflict(format!(
                    "rollout {namespace}/{name}: {why}; nothing was sent"
                )));
            }
            return Err(refused(why));
        }
    }
    let patch = json!({"metadata": {
        "resourceVersion": rollout.metadata.resource_version,
        "annotations": {annotation_of(signal): signal::token(&release, by)},
    }});
    merge_into_rollout(writer, namespace, name, &patch)
        .await
        .map_err(Error::kube(format!("signalling Rollout {namespace}/{name}")))
}

/// Records the last pull-request comment whose command was handled, so that
/// no comment is acted on twice.
pub async fn record_last_comment(writer: &Writer<'_>, namespace: &str, name: &str, comment: u64) -> Result<()> {
    annotate(writer, namespace, name, LAST_COMMENT_ANNOTATION, &comment.to_string())
        .await
        .map_err(Error::kube(format!(
            "recording the last handled comment on Rollout {namespace}/{name}"
        )))
}

/// An annotation of the agent's own bookkeeping: its watch event wakes nothing.
async fn annotate(writer: &Writer<'_>, namespace: &str, name: &str, key: &str, value: &str) -> Result<(), kube::Error> {
    let resolved = writer
        .cluster()
        .served(super::api::API_VERSION, super::api::KIND)
        .await?;
    let patch = json!({"metadata": {"annotations": {key: value}}});
    writer
        .as_agent()
        .merge(&resolved, Some(namespace), name, &patch)
        .await?;
    Ok(())
}

/// A merge patch of a Rollout through the one write path (its deadline),
/// as the agent. Its watch event wakes the agent's sync at once, as a
/// signal sent from the command line does: not recorded as its own write.
async fn merge_into_rollout(
    writer: &Writer<'_>,
    namespace: &str,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    let resolved = writer
        .cluster()
        .served(super::api::API_VERSION, super::api::KIND)
        .await?;
    writer
        .as_agent()
        .merge_as_news(&resolved, Some(namespace), name, patch)
        .await?;
    Ok(())
}

/// "stable Revision fn-00001, canary Revision fn-00002" (pod-template or
/// controller-revision hashes for a Deployment or StatefulSet).
pub fn revisions_line(spec: &super::api::RolloutSpec, status: &super::api::RolloutStatus) -> Option<String> {
    if status.stable_revision.is_empty() && status.canary_revision.is_empty() {
        return None;
    }
    let word = if super::knative::is_knative_service(&spec.workload_ref.api_version, &spec.workload_ref.kind) {
        "Revision"
    } else {
        "revision"
    };
    let mut parts = Vec::new();
    if !status.stable_revision.is_empty() {
        parts.push(format!("stable {word} {}", status.stable_revision));
    }
    if !status.canary_revision.is_empty() {
        parts.push(format!("canary {word} {}", status.canary_revision));
    }
    Some(parts.join(", "))
}

pub async fn list(cluster: &Cluster, namespace: Option<&str>, name: Option<&str>) -> Result<Vec<Rollout>> {
    let api: Api<Rollout> = match namespace {
        Some(ns) => Api::namespaced(cluster.client.clone(), ns),
        None => Api::all(cluster.client.clone()),
    };
    let mut rollouts = api
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing Rollouts"))?
        .items;
    if let Some(name) = name {
        rollouts.retain(|r| r.metadata.name.as_deref() == Some(name));
    }
    rollouts.sort_by(|a, b| (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name)));
    Ok(rollouts)
}

/// What a person reads in `gitcanary status`: phase, step, traffic, pods,
/// commits, how long in the step and what it waits for.
pub fn render(rollouts: &[Rollout], pods: &super::model::BatchPods, now: Timestamp) -> String {
    let mut out = String::new();
    if rollouts.is_empty() {
        out.push_str("no rollouts\n");
    }
    for rollout in rollouts {
        let namespace = rollout.metadata.namespace.clone().unwrap_or_default();
        let name = rollout.metadata.name.clone().unwrap_or_default();
        let status = rollout.status.clone().unwrap_or_default();
        let canary = status.canary_status.clone().unwrap_or_default();
        let steps = &rollout.spec.strategy.canary.steps;
        out.push_str(&format!("{namespace}/{name}: {:?}\n", status.phase));
        let releasing = matches!(status.phase, Phase::Progressing | Phase::Paused | Phase::Promoting);
        if releasing {
            let style = rollout.spec.strategy.style.label();
            out.push_str(&format!(
                "  release {}{style}: step {}/{} {}, traffic {}, canary pods ready {}\n",
                status.rollout_id,
                canary.current_step_index,
                steps.len(),
                canary.current_step_state.name(),
                if canary.traffic.is_empty() {
                    "0%"
                } else {
                    &canary.traffic
                },
                canary.canary_ready_replicas
            ));
            for (i, step) in steps.iter().enumerate() {
                let index = i as u32 + 1;
                out.push_str(&step_line(index, step, index == canary.current_step_index));
            }
            release_lines(&mut out, &status, pods.get(&(namespace.clone(), name.clone())));
        }
        if !status.stable_commit.is_empty() {
            out.push_str(&format!(
                "  stable commit {}",
                crate::short_commit(&status.stable_commit)
            ));
            if !status.canary_commit.is_empty() {
                out.push_str(&format!(
                    ", canary commit {}",
                    crate::short_commit(&status.canary_commit)
                ));
            }
            out.push('\n');
        }
        if let Some(line) = revisions_line(&rollout.spec, &status) {
            out.push_str(&format!("  {line}\n"));
        }
        if !status.resumed_from_git.is_empty() {
            out.push_str(&format!(
                "  resumed from Git ({}): the cluster had no status for this Rollout\n",
                status.resumed_from_git
            ));
        }
        if let Ok(started) = canary.state_started_at.parse::<Timestamp>()
            && releasing
        {
            let seconds = now.duration_since(started).as_secs().max(0);
            out.push_str(&format!("  in this state for {seconds}s\n"));
        }
        if !status.ignored_signal.is_empty() {
            out.push_str(&format!("  {}\n", status.ignored_signal));
        }
        if status.phase == Phase::Paused && canary.current_step_state == StepState::StepPaused {
            out.push_str(&format!(
                "  waiting for promote: approve the promotion pull request or run `gitcanary promote {name} -n {namespace}`\n"
            ));
        } else if !canary.message.is_empty() {
            out.push_str(&format!("  {}\n", canary.message));
        }
    }
    out
}

/// A running release's batches' pods and its analysis runs and hooks.
fn release_lines(out: &mut String, status: &super::api::RolloutStatus, pods: Option<&Vec<super::model::BatchPod>>) {
    let mut batches: std::collections::BTreeMap<&str, Vec<String>> = std::collections::BTreeMap::new();
    for pod in pods.into_iter().flatten() {
        let restarts = if pod.restarts > 0 {
            format!(", {} restart(s)", pod.restarts)
        } else {
            String::new()
        };
        let ready = if pod.ready { "ready" } else { "not ready" };
        batches
            .entry(&pod.batch)
            .or_default()
            .push(format!("{} {ready}{restarts}", pod.name));
    }
    for (batch, pods) in batches {
        out.push_str(&format!("  batch {batch}: {}\n", pods.join(", ")));
    }
    for run in status
        .analysis_runs
        .iter()
        .filter(|r| r.rollout_id == status.rollout_id)
    {
        let last = if run.message.is_empty() {
            String::new()
        } else {
            format!("; last: {}", super::api::bounded_line(&run.message, 120))
        };
        out.push_str(&format!(
            "  {} ({}): {} successful, {} failed, {} inconclusive{last}\n",
            run.name, run.template, run.successful, run.failed, run.inconclusive
        ));
    }
}

/// Whether the release `rollout_id` ended badly: its write-back is a
/// revert or a hold, or it is failed. A revert is soon synced back to
/// stable and Healthy, so the phase alone would miss it.
pub fn release_failed(status: &super::api::RolloutStatus, rollout_id: &str) -> bool {
    use super::api::WritebackAction;
    let pending = status
        .pending_writeback
        .as_ref()
        .filter(|p| p.rollout_id == rollout_id)
        .map(|p| p.action);
    let written = status
        .written_back
        .as_ref()
        .filter(|w| w.rollout_id == rollout_id)
        .map(|w| w.action);
    match pending.or(written) {
        Some(action) => action != WritebackAction::Promote,
        None => status.phase == Phase::Failed,
    }
}

/// The view without its clock line, which changes every second: what a
/// piped watch compares to decide whether to print again.
pub fn without_clock(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("  in this state for "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// One step of `gitcanary status`, marked `>` when it is the current one.
fn step_line(index: u32, step: &CanaryStep, current: bool) -> String {
    let marker = if current { ">" } else { " " };
    let traffic = step.traffic.as_deref().and_then(|t| parse_percent(t).ok());
    let pause = match &step.pause {
        None => String::new(),
        Some(p) => match &p.duration {
            Some(d) => format!(
                ", pause {}",
                d.to_std().map(|d| format!("{}s", d.as_secs())).unwrap_or_default()
            ),
            None => ", pause until promoted".to_string(),
        },
    };
    let matches = if step.matches.is_empty() {
        String::new()
    } else {
        format!(", and requests with {}", describe_matches(&step.matches))
    };
    format!(
        "  {marker} step {index}: traffic {}{matches}, replicas {}{pause}\n",
        traffic.map_or("-".to_string(), |t| format!("{t}%")),
        match &step.replicas {
            Some(IntOrPercent::Int(n)) => n.to_string(),
            Some(IntOrPercent::Percent(p)) => p.clone(),
            None => "as traffic".to_string(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_reverted_and_back_on_stable_still_counts_as_failed() {
        use crate::rollout::api::{PendingWriteback, RolloutStatus, WritebackAction, WrittenBack};
        let written = |action| WrittenBack {
            action,
            rollout_id: "r2".into(),
            commit: "c".into(),
            note: String::new(),
        };
        let mut status = RolloutStatus {
            phase: Phase::Healthy,
            written_back: Some(written(WritebackAction::Revert)),
            ..RolloutStatus::default()
        };
        assert!(release_failed(&status, "r2"), "reverted, then synced back to Healthy");
        assert!(!release_failed(&status, "r3"), "another release's revert");
        status.written_back = Some(written(WritebackAction::Promote));
        assert!(!release_failed(&status, "r2"));
        status.pending_writeback = Some(PendingWriteback {
            action: WritebackAction::Hold,
            rollout_id: "r2".into(),
            ..PendingWriteback::default()
        });
        assert!(release_failed(&status, "r2"), "a held failure, not yet in Git");
        status.pending_writeback = None;
        status.written_back = None;
        status.phase = Phase::Failed;
        assert!(release_failed(&status, "r2"));
    }

    #[test]
    fn a_step_line_says_which_requests_its_matches_send() {
        let step: CanaryStep = serde_json::from_value(json!({
            "traffic": "0%", "replicas": "100%", "pause": {},
            "matches": [{"headers": [{"name": "x-preview", "value": "yes"}]}],
        }))
        .unwrap();
        assert_eq!(
            step_line(1, &step, true),
            "  > step 1: traffic 0%, and requests with header x-preview = yes, replicas 100%, pause until promoted\n"
        );
    }
}
