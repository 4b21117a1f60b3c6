//! Writing a release's outcome back to Git: a status file on promote, a
//! revert commit on failure. Commits are idempotent (found again by their
//! trailers), and a push that races another is rebuilt on the new head and
//! retried with backoff, never forced.

use std::time::Duration;

use git2::{Commit, Oid, Repository, Signature};

use serde::Serialize;

use crate::rollout::api::{PendingWriteback, RolloutStatus, StepRecord, WritebackAction};
use crate::rollout::model::RolloutWork;
use crate::rollout::record::{FORMAT_VERSION, Outcome as RecordOutcome, StatusRecord};
pub use crate::rollout::record::{gate_id, message_text};
use crate::source::{GitSource, redact_url};
use crate::{Error, Result};

pub use crate::identity::{
    Author, GATE_TRAILER, HOLDS_TRAILER, PROMOTES_TRAILER, REVERTS_TRAILER, ROLLOUT_TRAILER, carries_trailers,
    signature_problem,
};

/// Pushes tried before giving up until the next sync.
pub(crate) const MAX_ATTEMPTS: u32 = 8;
/// Commits searched for an earlier identical write-back.
const TRAILER_SEARCH_DEPTH: usize = 200;

/// What happened to a write-back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A new commit was pushed.
    Committed {
        commit: String,
        attempts: u32,
        /// What a reader of the release should know (a revert that also reset later commits).
        note: String,
    },
    /// An earlier run already pushed it (found by its trailers).
    AlreadyInGit { commit: String },
    /// Git already holds the result; nothing to commit.
    NothingToChange,
}

/// One Rollout's pending write-back, as the sync found it.
#[derive(Debug, Clone)]
pub struct Request {
    pub namespace: String,
    pub name: String,
    /// The app (top-level directory of the source path; `root` for files directly in it).
    pub app: String,
    pub pending: PendingWriteback,
    pub status: RolloutStatus,
    /// Container images of the released template.
    pub images: Vec<String>,
}

impl Request {
    /// The promote or revert a rollout still has to write to Git, if any.
    pub fn of(work: &RolloutWork) -> Option<Request> {
        let pending = work.plan.status.pending_writeback.clone()?;
        Some(Request {
            namespace: work.namespace.clone(),
            name: work.name.clone(),
            app: work.app.clone(),
            pending,
            status: work.plan.status.clone(),
            images: work.images.clone(),
        })
    }
}

pub struct Writer<'a> {
    pub git: &'a GitSource,
    pub author: Author,
    /// Where status files go; default the tracked branch.
    pub status_branch: Option<String>,
}

pub(crate) type FileChanges = Vec<(String, Option<Vec<u8>>)>;

impl Writer<'_> {
    pub fn write(&self, request: &Request) -> Result<Outcome> {
        match request.pending.action {
            WritebackAction::Promote => self.promote(request),
            WritebackAction::Revert => self.revert(request),
            WritebackAction::Hold => self.hold(request),
        }
    }

    fn promote(&self, request: &Request) -> Result<Outcome> {
        let pending = &request.pending;
        let key = self.git.records().rollout_key(&request.namespace, &request.name);
        let record = StatusRecord {
            stable_commit: pending.canary_commit.clone(),
            previous_stable_commit: pending.stable_commit.clone(),
            promoted_at: pending.at.clone(),
            ..record_of(request, RecordOutcome::Promoted)
        };
        let message = format!(
            "promote({key}): {}\n\nAll steps passed; {} is now stable.\n\n{ROLLOUT_TRAILER}: {key}\n{PROMOTES_TRAILER}: {}\n",
            release_name(&pending.rollout_id, &pending.canary_commit),
            crate::short_commit(&pending.canary_commit),
            pending.canary_commit
        );
        let trailers = [
            (ROLLOUT_TRAILER, key.clone()),
            (PROMOTES_TRAILER, pending.canary_commit.clone()),
        ];
        self.commit_record(request, &record, message, &trailers)
    }

    /// A failure held in place (`onFailure: hold`): the status file says so,
    /// so a rebuilt cluster does not release the failed template again.
    fn hold(&self, request: &Request) -> Result<Outcome> {
        let pending = &request.pending;
        let key = self.git.records().rollout_key(&request.namespace, &request.name);
        let record = StatusRecord {
            stable_commit: pending.stable_commit.clone(),
            failed_commit: pending.canary_commit.clone(),
            failed_at: pending.at.clone(),
            cause: pending.cause.clone(),
            ..record_of(request, RecordOutcome::Failed)
        };
        let message = format!(
            "hold({key}): {}\n\nThe {} failed: {}.\nTraffic is back on stable ({}); the failed template is held, not reverted, and is not\nreleased again while Git asks for it.\n\n{ROLLOUT_TRAILER}: {key}\n{HOLDS_TRAILER}: {}\n",
            message_text(&pending.cause),
            release_name(&pending.rollout_id, &pending.canary_commit),
            message_text(&pending.cause),
            crate::short_commit(&pending.stable_commit),
            pending.canary_commit
        );
        let trailers = [
            (ROLLOUT_TRAILER, key.clone()),
            (HOLDS_TRAILER, pending.canary_commit.clone()),
        ];
        self.commit_record(request, &record, message, &trailers)
    }

    fn commit_record(
        &self,
        request: &Request,
        record: &StatusRecord,
        message: String,
        trailers: &[(&str, String)],
    ) -> Result<Outcome> {
        let content = record.to_yaml().map_err(|message| Error::Serialize {
            what: format!("status of {}", record.rollout),
            message,
        })?;
        let path = self.git.records().status_path(&request.namespace, &request.name);
        let branch = self
            .status_branch
            .clone()
            .unwrap_or_else(|| self.git.branch().to_string());
        self.commit_with_retry(&branch, trailers, |_, _| {
            Ok((
                message.clone(),
                vec![(path.clone(), Some(content.clone().into_bytes()))],
            ))
        })
    }

    fn revert(&self, request: &Request) -> Result<Outcome> {
        let pending = &request.pending;
        let key = self.git.records().rollout_key(&request.namespace, &request.name);
        let trailers = [
            (ROLLOUT_TRAILER, key.clone()),
            (REVERTS_TRAILER, pending.canary_commit.clone()),
        ];
        let branch = self.git.branch().to_string();
        self.commit_with_retry(&branch, &trailers, |repo, head| {
            let stable = self.commit_present(repo, &pending.stable_commit)?;
            let canary = self.commit_present(repo, &pending.canary_commit)?;
            let (dir, top_level_only) = app_dir(self.git.path(), &request.app);
            let (files, later) = revert_changes(repo, &stable, &canary, head, &dir, top_level_only)?;
            let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
            let mut message = format!(
                "revert({key}): {}\n\nThe {} failed: {}.\nTraffic is back on stable and the canary is removed; this commit\nrestores {} to their content at {}.\n",
                message_text(&pending.cause),
                release_name(&pending.rollout_id, &pending.canary_commit),
                message_text(&pending.cause),
                message_text(&names.join(", ")),
                crate::short_commit(&pending.stable_commit)
            );
            if !later.is_empty() {
                message.push_str(&format!(
                    "\n{LATER_NOTE_PREFIX} {}{LATER_NOTE_SUFFIX}\n",
                    message_text(&later.join(", "))
                ));
            }
            message.push_str(&format!("\n{ROLLOUT_TRAILER}: {key}\n{REVERTS_TRAILER}: {}\n", pending.canary_commit));
            Ok((message, files))
        })
    }

    /// A commit the mirror may lack after a shallow fetch is fetched by id.
    fn commit_present<'r>(&self, repo: &'r Repository, sha: &str) -> Result<Commit<'r>> {
        self.git.find_commit(repo, sha)
    }

    /// Builds the commit on the branch head and pushes it; when the push
    /// loses a race, fetches and builds it again on the new head.
    pub(crate) fn commit_with_retry<F>(&self, branch: &str, trailers: &[(&str, String)], changes: F) -> Result<Outcome>
    where
        F: Fn(&Repository, &Commit<'_>) -> Result<(String, FileChanges)>,
    {
        let repo = self.git.open_mirror()?;
        let tracking = format!("refs/remotes/origin/{branch}");
        let base_tracking = format!("refs/remotes/origin/{}", self.git.branch());
        for attempt in 1..=MAX_ATTEMPTS {
            let refspec = format!("+refs/heads/{branch}:{tracking}");
            let base_refspec = format!("+refs/heads/{0}:{base_tracking}", self.git.branch());
            // A status branch that does not exist yet starts at the tracked branch.
            if self.git.fetch_refs(&repo, &[&refspec]).is_err() || repo.find_reference(&tracking).is_err() {
                self.git.fetch_refs(&repo, &[&base_refspec])?;
            }
            let head = repo
                .find_reference(&tracking)
                .or_else(|_| repo.find_reference(&base_tracking))
                .and_then(|r| r.peel_to_commit())
                .map_err(Error::git(format!("branch {branch} not found")))?;
            if let Some(existing) = find_by_trailers(&repo, &head, trailers, &self.author) {
                return Ok(Outcome::AlreadyInGit { commit: existing });
            }
            let (message, files) = changes(&repo, &head)?;
            let tree = updated_tree(&repo, &head, &files)?;
            if tree == head.tree_id() {
                return Ok(Outcome::NothingToChange);
            }
            let tree = repo.find_tree(tree).map_err(Error::git("reading the new tree"))?;
            let signature =
                Signature::now(&self.author.name, &self.author.email).map_err(Error::git("the commit author"))?;
            let commit = self.create_commit(&repo, &signature, &message, &tree, &head)?;
            match self.push(&repo, commit, branch) {
                Ok(()) => {
                    let _ = repo.reference(&tracking, commit, true, "gitcanary write-back");
                    return Ok(Outcome::Committed {
                        commit: commit.to_string(),
                        attempts: attempt,
                        note: note_of(&message),
                    });
                }
                Err(rejection) => {
                    tracing::info!(attempt, branch, reason = %rejection, "push rejected; fetching and retrying");
                    std::thread::sleep(backoff(attempt));
                }
            }
        }
        Err(Error::PushRejected {
            target: format!("branch {branch} of {}", redact_url(self.git.url())),
            attempts: MAX_ATTEMPTS,
        })
    }

    /// The commit, signed when a key is given.
    pub(crate) fn create_commit(
        &self,
        repo: &Repository,
        signature: &Signature<'_>,
        message: &str,
        tree: &git2::Tree<'_>,
        parent: &Commit<'_>,
    ) -> Result<Oid> {
        let Some(signer) = &self.author.signer else {
            return repo
                .commit(None, signature, signature, message, tree, &[parent])
                .map_err(Error::git("creating the commit"));
        };
        let content = repo
            .commit_create_buffer(signature, signature, message, tree, &[parent])
            .map_err(Error::git("creating the commit"))?;
        let content = content.as_str().ok_or_else(|| Error::Git {
            context: "creating the commit".into(),
            source: git2::Error::from_str("the commit is not UTF-8"),
        })?;
        let armored = signer.sign(content.as_bytes()).map_err(|message| Error::Git {
            context: "signing the commit".into(),
            source: git2::Error::from_str(&message),
        })?;
        repo.commit_signed(content, &armored, None)
            .map_err(Error::git("creating the signed commit"))
    }

    pub(crate) fn push(&self, repo: &Repository, commit: Oid, branch: &str) -> std::result::Result<(), String> {
        let outgoing = "refs/gitcanary/outgoing";
        repo.reference(outgoing, commit, true, "gitcanary write-back")
            .map_err(|e| e.message().to_string())?;
        let mut remote = repo
            .remote_anonymous(self.git.url())
            .map_err(|e| e.message().to_string())?;
        let rejected = std::cell::RefCell::new(None::<String>);
        let mut callbacks = self.git.callbacks();
        callbacks.push_update_reference(|_, status| {
            if let Some(status) = status {
                *rejected.borrow_mut() = Some(status.to_string());
            }
            Ok(())
        });
        let mut options = git2::PushOptions::new();
        options.remote_callbacks(callbacks);
        // No leading '+': never a forced push.
        let refspec = format!("{outgoing}:refs/heads/{branch}");
        let result = remote.push(&[&refspec], Some(&mut options));
        drop(options);
        if let Some(status) = rejected.into_inner() {
            return Err(status);
        }
        result.map_err(|e| e.message().to_string())
    }
}

const LATER_NOTE_PREFIX: &str = "Later commits changed";
const LATER_NOTE_SUFFIX: &str = " too; they are reset to the stable version as well.";

/// The line of a commit message a pull request should repeat, if any.
fn note_of(message: &str) -> String {
    message
        .lines()
        .find(|l| l.starts_with(LATER_NOTE_PREFIX))
        .unwrap_or_default()
        .to_string()
}

/// What a promotion pull request commits to its branch.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GateFile {
    pub rollout: String,
    #[serde(rename = "rolloutID")]
    pub rollout_id: String,
    pub step: u32,
    pub stable_commit: String,
    pub canary_commit: String,
    pub canary_ready_replicas: i32,
    pub opened_at: String,
    pub steps: Vec<StepRecord>,
}

impl Writer<'_> {
    /// Pushes the gate branch with the gate file (`Records::gate_path`),
    /// started from the tracked branch; a branch that already holds it is left as is.
    pub fn open_gate(&self, branch: &str, gate: &GateFile) -> Result<Outcome> {
        let (namespace, name) = gate.rollout.split_once('/').unwrap_or(("", &gate.rollout));
        let records = self.git.records();
        let (path, key) = (records.gate_path(namespace, name), records.rollout_key(namespace, name));
        let content = serde_saphyr::to_string(gate).map_err(|e| Error::Serialize {
            what: format!("gate of {}", gate.rollout),
            message: e.to_string(),
        })?;
        // The canary commit makes the gate one release's: a rollout ID
        // reused by a later release finds no earlier gate commit as its own.
        let gate_id = gate_id(&gate.rollout_id, gate.step, &gate.canary_commit);
        let message = format!(
            "gate({}): promote release {} past step {}\n\nMerging this passes the gate; closing it unmerged aborts the release.\n\n{ROLLOUT_TRAILER}: {}\n{GATE_TRAILER}: {gate_id}\n",
            gate.rollout,
            message_text(&gate.rollout_id),
            gate.step,
            key
        );
        let trailers = [(ROLLOUT_TRAILER, key.clone()), (GATE_TRAILER, gate_id)];
        self.commit_with_retry(branch, &trailers, |_, _| {
            Ok((
                message.clone(),
                vec![(path.clone(), Some(content.clone().into_bytes()))],
            ))
        })
    }
}

/// The status file of the request's release, with what both outcomes record.
fn record_of(request: &Request, outcome: RecordOutcome) -> StatusRecord {
    StatusRecord {
        format_version: FORMAT_VERSION,
        rollout: format!("{}/{}", request.namespace, request.name),
        outcome,
        rollout_id: request.pending.rollout_id.clone(),
        stable_commit: String::new(),
        previous_stable_commit: String::new(),
        stable_revision: request.status.stable_revision.clone(),
        images: request.images.clone(),
        promoted_at: String::new(),
        failed_commit: String::new(),
        failed_at: String::new(),
        cause: String::new(),
        steps: request.status.step_history.clone(),
    }
}

/// The app's directory in the repository, and whether only its top-level
/// files belong to it (the root app shares its directory with the others).
fn app_dir(source_path: &str, app: &str) -> (String, bool) {
    let base = source_path.trim_matches('/');
    if app == crate::manifest::ROOT_APP {
        return (base.to_string(), true);
    }
    if base.is_empty() {
        (app.to_string(), false)
    } else {
        (format!("{base}/{app}"), false)
    }
}

/// `release abc1234`, naming the commit too when the release has an ID of its own.
fn release_name(rollout_id: &str, commit: &str) -> String {
    let rollout_id = message_text(rollout_id);
    if rollout_id == crate::short_commit(commit) {
        format!("release {rollout_id}")
    } else {
        format!("release {rollout_id} of {}", crate::short_commit(commit))
    }
}

/// Exponential backoff with jitter: 100 ms, 200 ms, … capped at 5 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = 100u64.saturating_mul(1 << attempt.min(6)).min(5_000);
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()) % (base / 2 + 1))
        .unwrap_or(0);
    Duration::from_millis(base / 2 + jitter)
}

/// An earlier commit of gitcanary's own carrying all these trailers, if any.
fn find_by_trailers(
    repo: &Repository,
    head: &Commit<'_>,
    trailers: &[(&str, String)],
    author: &Author,
) -> Option<String> {
    let mut walk = repo.revwalk().ok()?;
    walk.push(head.id()).ok()?;
    for oid in walk.take(TRAILER_SEARCH_DEPTH).flatten() {
        let Ok(commit) = repo.find_commit(oid) else { continue };
        if carries_trailers(&commit, trailers, author) && signature_problem(repo, &commit, author).is_none() {
            return Some(oid.to_string());
        }
    }
    None
}

/// The head tree with the given files written (Some) or removed (None).
pub(crate) fn updated_tree(repo: &Repository, head: &Commit<'_>, files: &FileChanges) -> Result<Oid> {
    let base = head.tree().map_err(Error::git("reading the head tree"))?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, content) in files {
        match content {
            Some(bytes) => {
                let blob = repo.blob(bytes).map_err(Error::git(format!("writing {path}")))?;
                update.upsert(path.as_str(), blob, git2::FileMode::Blob);
            }
            None => {
                if base.get_path(std::path::Path::new(path)).is_ok() {
                    update.remove(path.as_str());
                }
            }
        }
    }
    update
        .create_updated(repo, &base)
        .map_err(Error::git("building the new tree"))
}

/// For each file under `dir` that changed between stable and canary: its
/// stable content (None: it did not exist). Also the files among them that
/// later commits (canary..head) changed again.
fn revert_changes(
    repo: &Repository,
    stable: &Commit<'_>,
    canary: &Commit<'_>,
    head: &Commit<'_>,
    dir: &str,
    top_level_only: bool,
) -> Result<(FileChanges, Vec<String>)> {
    let stable_tree = stable.tree().map_err(Error::git("reading the stable tree"))?;
    let canary_tree = canary.tree().map_err(Error::git("reading the canary tree"))?;
    let head_tree = head.tree().map_err(Error::git("reading the head tree"))?;
    let mut options = git2::DiffOptions::new();
    if !dir.is_empty() {
        options.pathspec(format!("{dir}/"));
    }
    let diff = repo
        .diff_tree_to_tree(Some(&stable_tree), Some(&canary_tree), Some(&mut options))
        .map_err(Error::git("comparing the stable and canary commits"))?;
    let mut files = Vec::new();
    for delta in diff.deltas() {
        let Some(path) = delta.new_file().path().or_else(|| delta.old_file().path()) else {
            continue;
        };
        let path = path.to_string_lossy().to_string();
        let rest = path.strip_prefix(dir).unwrap_or(&path).trim_start_matches('/');
        if top_level_only && rest.contains('/') {
            continue;
        }
        let stable_content = match stable_tree.get_path(std::path::Path::new(&path)) {
            Ok(entry) => Some(
                repo.find_blob(entry.id())
                    .map_err(Error::git(format!("reading {path} at the stable commit")))?
                    .content()
                    .to_vec(),
            ),
            Err(_) => None,
        };
        files.push((path, stable_content));
    }
    let mut later = Vec::new();
    for (path, _) in &files {
        let at_canary = canary_tree.get_path(std::path::Path::new(path)).map(|e| e.id()).ok();
        let at_head = head_tree.get_path(std::path::Path::new(path)).map(|e| e.id()).ok();
        if at_canary != at_head {
            later.push(path.clone());
        }
    }
    Ok((files, later))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_bounded() {
        assert!(backoff(1) <= Duration::from_millis(200));
        assert!(backoff(8) <= Duration::from_secs(5));
        assert!(backoff(8) >= Duration::from_millis(1_600));
    }

    fn commit_as(repo: &Repository, name: &str, email: &str, message: &str) -> Oid {
        let signature = Signature::now(name, email).expect("signature");
        let tree = repo
            .treebuilder(None)
            .and_then(|b| b.write())
            .and_then(|id| repo.find_tree(id))
            .expect("tree");
        repo.commit(None, &signature, &signature, message, &tree, &[])
            .expect("commit")
    }

    #[test]
    fn trailers_count_only_on_gitcanarys_own_commits() {
        let dir = tempfile::tempdir().expect("dir");
        let repo = Repository::init(dir.path()).expect("repo");
        let own = Author::default();
        let trailers = [
            (ROLLOUT_TRAILER, "ns/web".to_string()),
            (REVERTS_TRAILER, "c".repeat(40)),
        ];
        let message = format!(
            "revert\n\nGitcanary-Rollout: ns/web\nGitcanary-Reverts: {}\n",
            "c".repeat(40)
        );
        let forged = commit_as(&repo, "mallory", "mallory@example.test", &message);
        let forged = repo.find_commit(forged).expect("commit");
        assert!(!carries_trailers(&forged, &trailers, &own), "a hand-made commit");
        let half = commit_as(&repo, "gitcanary", "mallory@example.test", &message);
        assert!(!carries_trailers(
            &repo.find_commit(half).expect("commit"),
            &trailers,
            &own
        ));
        let real = commit_as(&repo, &own.name, &own.email, &message);
        let real = repo.find_commit(real).expect("commit");
        assert!(carries_trailers(&real, &trailers, &own));
        assert!(find_by_trailers(&repo, &forged, &trailers, &own).is_none());
        assert_eq!(
            find_by_trailers(&repo, &real, &trailers, &own),
            Some(real.id().to_string())
        );
    }

    #[test]
    fn outside_text_cannot_add_a_trailer_to_a_commit_message() {
        let cause = "analysis failed: 0.5\nGitcanary-Reverts: 1234\r\nGitcanary-Holds: x";
        let text = message_text(cause);
        assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
        let message = format!("revert(ns/web): {text}\n\n{ROLLOUT_TRAILER}: ns/web\n");
        assert!(
            !message
                .lines()
                .any(|l| l.starts_with("Gitcanary-Reverts") || l.starts_with("Gitcanary-Holds")),
            "{message}"
        );
        assert!(
            release_name("id\nGitcanary-Promotes: x", &"a".repeat(40))
                .lines()
                .count()
                == 1
        );
    }
}
