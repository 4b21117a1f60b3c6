//! Git write-back orchestration: each pending promote and revert of a sync
//! is committed (by `writeback`), then marked done in its Rollout's status.

use std::sync::Arc;

use tracing::{info, warn};

use crate::cluster::Cluster;
use crate::source::Source;
use crate::sync::SyncReport;
use crate::writeback::{Author, Outcome, Writer};

/// How promotes and reverts are written to Git.
#[derive(Debug, Clone, Default)]
pub struct WritebackConfig {
    pub author: Author,
    /// Branch for status files; default the tracked branch.
    pub status_branch: Option<String>,
}

/// Writes every pending promote and revert of the report to Git, then marks
/// each done in its Rollout's status, and in the report (so the pull request
/// hears of the commit). Returns how many commits were pushed. A failed
/// write-back stays pending and is tried again after the next sync.
pub async fn write_back(
    cluster: &Cluster,
    source: &Arc<Source>,
    config: &WritebackConfig,
    report: &mut SyncReport,
) -> usize {
    let mut pushed = 0;
    let requests: Vec<_> = report.writebacks().cloned().collect();
    for request in requests {
        if source.git().is_none() {
            warn!(namespace = %request.namespace, rollout = %request.name, "the source is not a Git repository: nothing to write back");
            continue;
        }
        let (source, config, job) = (source.clone(), config.clone(), request.clone());
        let outcome = crate::blocking("writing back to Git", move || {
            let git = source.git().expect("checked above");
            let writer = Writer {
                git,
                author: config.author.clone(),
                status_branch: config.status_branch.clone(),
            };
            writer.write(&job)
        })
        .await
        .and_then(|outcome| outcome);
        let fields = (&request.namespace, &request.name, &request.pending.rollout_id);
        let (commit, note) = match outcome {
            Ok(Outcome::Committed { commit, attempts, note }) => {
                pushed += 1;
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, %commit, attempts, action = ?request.pending.action, "written to Git");
                (Some(commit), note)
            }
            Ok(Outcome::AlreadyInGit { commit }) => {
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, %commit, "already in Git: not committed again");
                (Some(commit), String::new())
            }
            Ok(Outcome::NothingToChange) => {
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, "Git already holds it: nothing to commit");
                (None, String::new())
            }
            Err(error) => {
                warn!(namespace = %fields.0, rollout = %fields.1, %error, "write-back to Git failed; retried after the next sync");
                continue;
            }
        };
        match request.clear(cluster, commit.as_deref(), &note).await {
            Ok(status) => {
                let summary = report
                    .apps
                    .iter_mut()
                    .flat_map(|a| a.rollouts.iter_mut())
                    .find(|r| r.namespace == request.namespace && r.name == request.name);
                if let Some(summary) = summary {
                    summary.status = status;
                    summary.changed = true;
                }
            }
            Err(error) => {
                warn!(%error, "written to Git, but the Rollout status could not be updated; the commit is found again next time")
            }
        }
    }
    pushed
}
