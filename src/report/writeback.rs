//! Git write-back orchestration: each pending promote and revert of a sync
//! is committed (by `writeback`), then handed to the next sync, which marks
//! it done in its Rollout's status.

use std::sync::Arc;

use tracing::{info, warn};

use crate::rollout::api::WrittenBack;
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

/// What a write-back did: the commits pushed, and each Rollout's write-back
/// done, for its next plan to record in its status.
#[derive(Debug, Default)]
pub struct WrittenToGit {
    pub pushed: usize,
    pub done: Vec<(String, String, WrittenBack)>,
    /// The apps of the Rollouts in `done`.
    pub apps: std::collections::BTreeSet<String>,
}

/// Writes every pending promote and revert of the report to Git. Each one
/// done is handed to the next sync (`SyncMemo::record_written`), whose plan
/// records it in the Rollout's status: the status has one writer. A failed
/// write-back stays pending and is tried again after the next sync.
pub async fn write_back(source: &Arc<Source>, config: &WritebackConfig, report: &SyncReport) -> WrittenToGit {
    let mut written = WrittenToGit::default();
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
                written.pushed += 1;
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, %commit, attempts, action = ?request.pending.action, "written to Git");
                (commit, note)
            }
            Ok(Outcome::AlreadyInGit { commit }) => {
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, %commit, "already in Git: not committed again");
                (commit, String::new())
            }
            Ok(Outcome::NothingToChange) => {
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, "Git already holds it: nothing to commit");
                (String::new(), String::new())
            }
            Err(error) => {
                warn!(namespace = %fields.0, rollout = %fields.1, %error, "write-back to Git failed; retried after the next sync");
                continue;
            }
        };
        let done = WrittenBack {
            action: request.pending.action,
            rollout_id: request.pending.rollout_id.clone(),
            commit,
            note,
        };
        written
            .done
            .push((request.namespace.clone(), request.name.clone(), done));
        written.apps.insert(request.app.clone());
    }
    written
}
