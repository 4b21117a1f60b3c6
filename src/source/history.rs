//! The engine's view of Git's history: status files at the synced head, and
//! a workload as an earlier commit held it (a rebuilt cluster's stable).

use std::path::Path;

use git2::Oid;

use super::GitSource;
use crate::identity::{Author, HOLDS_TRAILER, PROMOTES_TRAILER, ROLLOUT_TRAILER, carries_trailers, signature_problem};
use crate::manifest::{MAX_FILE_BYTES, ObjectKey};
use crate::rollout::record::{History, Outcome, StatusRecord};

/// First-parent commits searched for a status file's last change and its
/// stable commit: past that, the record is not trusted.
const RECORD_HISTORY: usize = 5_000;

/// A commit of gitcanary's for this rollout that the head holds and the
/// record's commit does not: a merge whose first parent is an old record
/// and whose other parent holds a newer one replays the old record.
fn newer_record(
    repo: &git2::Repository,
    head: &git2::Commit<'_>,
    record_commit: &git2::Commit<'_>,
    rollout: &str,
    writer: &Author,
) -> Option<String> {
    let mut walk = repo.revwalk().ok()?;
    walk.push(head.id()).ok()?;
    walk.hide(record_commit.id()).ok()?;
    let trailer = [(ROLLOUT_TRAILER, rollout.to_string())];
    walk.take(RECORD_HISTORY)
        .flatten()
        .filter_map(|oid| repo.find_commit(oid).ok())
        .find(|commit| {
            // A record: a promote or a hold (a revert or a gate writes none).
            let message = commit.message().unwrap_or_default();
            let records = message.lines().any(|line| {
                let line = line.trim();
                line.starts_with(&format!("{PROMOTES_TRAILER}: ")) || line.starts_with(&format!("{HOLDS_TRAILER}: "))
            });
            records && carries_trailers(commit, &trailer, writer)
        })
        .map(|commit| commit.id().to_string())
}

/// Why a status file may not be read back, or `None` when it may: the
/// commit that last changed it (on the branch's first-parent history) must
/// be gitcanary's own, carrying the trailers of the outcome it records, and
/// its stable commit must be on that history. Anyone can commit a file; only
/// gitcanary's write-back says which commit passed a release. `rollout` is
/// the `Gitcanary-Rollout` trailer this agent writes for it (with its
/// cluster's name), so one cluster's record never stands for another's.
pub fn trust_problem(
    repo: &git2::Repository,
    head: &git2::Commit<'_>,
    path: &str,
    blob: Oid,
    (record, rollout): (&StatusRecord, &str),
    writer: &Author,
) -> Option<String> {
    let first_parents: Vec<git2::Commit<'_>> = std::iter::successors(Some(head.clone()), |c| c.parent(0).ok())
        .take(RECORD_HISTORY)
        .collect();
    let blob_at = |commit: &git2::Commit<'_>| {
        commit
            .tree()
            .ok()
            .and_then(|tree| tree.get_path(Path::new(path)).ok())
            .map(|entry| entry.id())
    };
    // The oldest commit of the newest run holding this very content.
    let Some(changed_by) = first_parents
        .iter()
        .take_while(|commit| blob_at(commit) == Some(blob))
        .last()
    else {
        return Some("the synced commit does not hold it".to_string());
    };
    let introduced = changed_by
        .parent(0)
        .ok()
        .is_none_or(|parent| blob_at(&parent) != Some(blob));
    if !introduced {
        return Some(format!(
            "its last change is more than {RECORD_HISTORY} commits back, or beyond the fetched history"
        ));
    }
    let rollout_trailer = (ROLLOUT_TRAILER, rollout.to_string());
    let outcome = match record.outcome {
        Outcome::Promoted => (PROMOTES_TRAILER, record.stable_commit.clone()),
        Outcome::Failed => (HOLDS_TRAILER, record.failed_commit.clone()),
    };
    let short = crate::short_commit;
    if !carries_trailers(changed_by, &[rollout_trailer, outcome.clone()], writer) {
        return Some(format!(
            "commit {} that last changed it is not gitcanary's write-back ({} <{}>, with a {}: {} trailer)",
            short(&changed_by.id().to_string()),
            writer.name,
            writer.email,
            outcome.0,
            short(&outcome.1)
        ));
    }
    if let Some(newer) = newer_record(repo, head, changed_by, rollout, writer) {
        return Some(format!(
            "a newer record of gitcanary's ({}) is in the branch's history but not on its first parent: an older record was put back by a merge",
            short(&newer)
        ));
    }
    if let Some(why) = signature_problem(repo, changed_by, writer) {
        return Some(format!(
            "commit {} that last changed it is not signed as gitcanary's: {why}",
            short(&changed_by.id().to_string())
        ));
    }
    let stable = Oid::from_str(&record.stable_commit).ok();
    if !first_parents.iter().any(|commit| Some(commit.id()) == stable) {
        return Some(format!(
            "its stableCommit {} is not on the tracked branch's first-parent history",
            short(&record.stable_commit)
        ));
    }
    None
}

/// The status file of a Rollout at `head` under `records` (an agent's own,
/// or another cluster's), read within the size limit and trusted only as
/// gitcanary's write-back (`trust_problem`); `None` when there is none.
pub(crate) fn read_record(
    repo: &git2::Repository,
    head: &git2::Commit<'_>,
    (records, namespace, name): (&crate::rollout::record::Records, &str, &str),
    writer: &Author,
) -> Result<Option<StatusRecord>, String> {
    let path = records.status_path(namespace, name);
    let tree = head
        .tree()
        .map_err(|e| format!("reading commit {}: {}", head.id(), e.message()))?;
    let Ok(entry) = tree.get_path(Path::new(&path)) else {
        return Ok(None);
    };
    let (size, _) = repo
        .odb()
        .and_then(|odb| odb.read_header(entry.id()))
        .map_err(|e| format!("{path}: {}", e.message()))?;
    if size as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{path} is {size} bytes, larger than the {MAX_FILE_BYTES}-byte limit"
        ));
    }
    let blob = repo
        .find_blob(entry.id())
        .map_err(|e| format!("{path} is not a file: {}", e.message()))?;
    let text = std::str::from_utf8(blob.content()).map_err(|_| format!("{path} is not UTF-8"))?;
    let record = StatusRecord::parse(text, namespace, name).map_err(|e| format!("{path} cannot be read: {e}"))?;
    let rollout = records.rollout_key(namespace, name);
    trust_problem(repo, head, &path, entry.id(), (&record, &rollout), writer).map_or(Ok(Some(record)), |problem| {
        Err(format!("{path} is not trusted: {problem}"))
    })
}

pub struct GitHistory {
    pub(super) git: GitSource,
    /// The commit synced: where status files are read.
    pub(super) head: String,
}

impl std::fmt::Debug for GitHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHistory").field("head", &self.head).finish()
    }
}

impl History for GitHistory {
    fn record_path(&self, namespace: &str, name: &str) -> String {
        self.git.records.status_path(namespace, name)
    }

    fn record(&self, namespace: &str, name: &str) -> Result<Option<StatusRecord>, String> {
        let repo = self.git.open_mirror().map_err(|e| e.to_string())?;
        let head = Oid::from_str(&self.head)
            .and_then(|oid| repo.find_commit(oid))
            .map_err(|e| format!("reading commit {}: {}", self.head, e.message()))?;
        read_record(
            &repo,
            &head,
            (&self.git.records, namespace, name),
            &self.git.record_writer,
        )
    }

    fn object_at(
        &self,
        commit: &str,
        app: &str,
        key: &ObjectKey,
        default_namespace: &str,
    ) -> Result<Option<serde_json::Value>, String> {
        let short = crate::short_commit(commit);
        let repo = self.git.open_mirror().map_err(|e| e.to_string())?;
        let found = self.git.find_commit(&repo, commit).map_err(|e| e.to_string())?;
        let set = self.git.read_tree(&repo, &found).map_err(|e| e.to_string())?;
        let Some(app) = set.apps.get(app) else {
            return Ok(None);
        };
        if let Some(problem) = app.problems.first() {
            return Err(format!("the app at {short} cannot be read: {problem}"));
        }
        Ok(app
            .manifests
            .iter()
            .find(|m| {
                let mut seen = m.key();
                if seen.namespace.is_none() {
                    seen.namespace = Some(default_namespace.to_string());
                }
                seen == *key || m.key() == *key
            })
            .map(|m| m.object.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::record::Records;
    use git2::{Repository, Signature};

    fn commit(repo: &Repository, who: &Author, files: &[(&str, &str)], parent: Option<Oid>, message: &str) -> Oid {
        let parent = parent.map(|id| repo.find_commit(id).expect("parent"));
        let base = parent.as_ref().map(|p| p.tree().expect("tree"));
        let mut update = git2::build::TreeUpdateBuilder::new();
        for (path, text) in files {
            update.upsert(*path, repo.blob(text.as_bytes()).expect("blob"), git2::FileMode::Blob);
        }
        let empty = repo
            .find_tree(repo.treebuilder(None).and_then(|b| b.write()).expect("empty"))
            .expect("tree");
        let tree = update
            .create_updated(repo, base.as_ref().unwrap_or(&empty))
            .expect("tree");
        let tree = repo.find_tree(tree).expect("tree");
        let signature = Signature::now(&who.name, &who.email).expect("signature");
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        repo.commit(None, &signature, &signature, message, &tree, &parents)
            .expect("commit")
    }

    fn record(stable: Oid) -> StatusRecord {
        StatusRecord::parse(
            &format!("rollout: ns/web\noutcome: promoted\nrolloutID: r\nstableCommit: {stable}\n"),
            "ns",
            "web",
        )
        .expect("record")
    }

    fn problem(repo: &Repository, head: Oid, record: &StatusRecord) -> Option<String> {
        problem_as(repo, head, record, &Author::default())
    }

    /// Why the status file at `head` is not trusted, with `writer` as gitcanary's identity.
    fn problem_as(repo: &Repository, head: Oid, record: &StatusRecord, writer: &Author) -> Option<String> {
        problem_of(repo, head, (record, "ns/web"), writer)
    }

    /// Why the status file at `head` is not trusted as the record of `rollout` (its trailer).
    fn problem_of(
        repo: &Repository,
        head: Oid,
        (record, rollout): (&StatusRecord, &str),
        writer: &Author,
    ) -> Option<String> {
        let head = repo.find_commit(head).expect("head");
        let path = Records::default().status_path("ns", "web");
        let blob = head
            .tree()
            .expect("tree")
            .get_path(Path::new(&path))
            .expect("file")
            .id();
        trust_problem(repo, &head, &path, blob, (record, rollout), writer)
    }

    #[test]
    fn a_status_file_counts_only_as_gitcanary_wrote_it_for_a_commit_on_the_branch() {
        let dir = tempfile::tempdir().expect("dir");
        let repo = Repository::init(dir.path()).expect("repo");
        let own = Author::default();
        let mallory = Author {
            name: "mallory".into(),
            email: "mallory@example.test".into(),
            ..Author::default()
        };
        let path = Records::default().status_path("ns", "web");
        let released = commit(&repo, &mallory, &[("web/app.yaml", "v2")], None, "v2");
        let text = |stable: Oid| format!("rollout: ns/web\noutcome: promoted\nrolloutID: r\nstableCommit: {stable}\n");
        let trailers = |stable: Oid| format!("promote\n\n{ROLLOUT_TRAILER}: ns/web\n{PROMOTES_TRAILER}: {stable}\n");
        let promoted = commit(
            &repo,
            &own,
            &[(&path, &text(released))],
            Some(released),
            &trailers(released),
        );
        let later = commit(&repo, &mallory, &[("web/other.yaml", "x")], Some(promoted), "later");
        assert_eq!(
            problem(&repo, later, &record(released)),
            None,
            "gitcanary's record, later commits above"
        );
        // Another cluster's agent writes its own trailer: this commit is not its record.
        let why = problem_of(&repo, later, (&record(released), "production/ns/web"), &own).expect("other cluster");
        assert!(why.contains("is not gitcanary's write-back"), "{why}");

        // The same record written by hand (trailers copied) counts for nothing.
        let forged = commit(
            &repo,
            &mallory,
            &[(&path, &text(released))],
            Some(released),
            &trailers(released),
        );
        let why = problem(&repo, forged, &record(released)).expect("forged");
        assert!(why.contains("is not gitcanary's write-back"), "{why}");

        // gitcanary's own commit naming a commit off the branch's first-parent history.
        let scratch = commit(&repo, &mallory, &[("web/app.yaml", "evil")], Some(released), "evil");
        let off = commit(
            &repo,
            &own,
            &[(&path, &text(scratch))],
            Some(promoted),
            &trailers(scratch),
        );
        let why = problem(&repo, off, &record(scratch)).expect("off the branch");
        assert!(
            why.contains("not on the tracked branch's first-parent history"),
            "{why}"
        );

        // An old record put back by a merge whose first parent is that
        // record's commit, the newer record on the other side.
        let newer_text = text(released).replace("rolloutID: r", "rolloutID: r2");
        let newer = commit(&repo, &own, &[(&path, &newer_text)], Some(later), &trailers(released));
        let replay = {
            let old = repo.find_commit(promoted).expect("old record");
            let newer = repo.find_commit(newer).expect("newer record");
            let signature = Signature::now("mallory", "mallory@example.test").expect("signature");
            repo.commit(
                None,
                &signature,
                &signature,
                "merge",
                &old.tree().expect("tree"),
                &[&old, &newer],
            )
            .expect("merge")
        };
        let why = problem(&repo, replay, &record(released)).expect("replayed");
        assert!(
            why.contains("is in the branch's history but not on its first parent"),
            "{why}"
        );
        // A revert of gitcanary's after the record is no newer record.
        let revert = commit(
            &repo,
            &own,
            &[("web/app.yaml", "v1")],
            Some(promoted),
            &format!(
                "revert\n\n{ROLLOUT_TRAILER}: ns/web\nGitcanary-Reverts: {}\n",
                "c".repeat(40)
            ),
        );
        assert_eq!(problem(&repo, revert, &record(released)), None);

        // A promote trailer for another commit than the file names.
        let mismatched = commit(&repo, &own, &[(&path, &text(released))], Some(off), &trailers(scratch));
        assert!(problem(&repo, mismatched, &record(released)).is_some());
    }

    #[test]
    fn with_allowed_signers_only_a_signed_record_counts() {
        let dir = tempfile::tempdir().expect("dir");
        let repo = Repository::init(dir.path().join("repo")).expect("repo");
        let keys = tempfile::tempdir().expect("keys");
        let (signer, verifier) = crate::identity::signing::tests::key_pair(keys.path(), "agent", "gitcanary@localhost");
        let (forger, _) = crate::identity::signing::tests::key_pair(keys.path(), "mallory", "gitcanary@localhost");
        let own = Author {
            verifier: Some(verifier),
            ..Author::default()
        };
        let path = Records::default().status_path("ns", "web");
        let released = commit(&repo, &own, &[("web/app.yaml", "v2")], None, "v2");
        let text = format!("rollout: ns/web\noutcome: promoted\nrolloutID: r\nstableCommit: {released}\n");
        let message = format!("promote\n\n{ROLLOUT_TRAILER}: ns/web\n{PROMOTES_TRAILER}: {released}\n");
        let signed_by = |key: &crate::identity::signing::Signer| {
            let parent = repo.find_commit(released).expect("parent");
            let mut update = git2::build::TreeUpdateBuilder::new();
            update.upsert(
                path.as_str(),
                repo.blob(text.as_bytes()).expect("blob"),
                git2::FileMode::Blob,
            );
            let tree = update
                .create_updated(&repo, &parent.tree().expect("tree"))
                .expect("tree");
            let tree = repo.find_tree(tree).expect("tree");
            let signature = Signature::now(&own.name, &own.email).expect("signature");
            let content = repo
                .commit_create_buffer(&signature, &signature, &message, &tree, &[&parent])
                .expect("buffer");
            let content = content.as_str().expect("text").to_string();
            let armored = key.sign(content.as_bytes()).expect("signed");
            repo.commit_signed(&content, &armored, None).expect("commit")
        };
        let check = |head: Oid| problem_as(&repo, head, &record(released), &own);
        assert_eq!(check(signed_by(&signer)), None, "signed by the agent's key");
        let forged = check(signed_by(&forger)).expect("another key");
        assert!(forged.contains("is not signed as gitcanary's"), "{forged}");
        let unsigned = commit(&repo, &own, &[(&path, &text)], Some(released), &message);
        let unsigned = check(unsigned).expect("unsigned");
        assert!(unsigned.contains("it is not signed"), "{unsigned}");
    }
}
