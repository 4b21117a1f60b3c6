//! The engine's view of Git's history: status files at the synced head, and
//! a workload as an earlier commit held it (a rebuilt cluster's stable).

use std::path::Path;

use git2::Oid;

use super::GitSource;
use crate::manifest::{MAX_FILE_BYTES, ObjectKey};
use crate::rollout::record::{History, StatusRecord, record_path};

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
    fn record(&self, namespace: &str, name: &str) -> Result<Option<StatusRecord>, String> {
        let path = record_path(namespace, name);
        let repo = self.git.open_mirror().map_err(|e| e.to_string())?;
        let head = Oid::from_str(&self.head)
            .and_then(|oid| repo.find_commit(oid))
            .and_then(|commit| commit.tree())
            .map_err(|e| format!("reading commit {}: {}", self.head, e.message()))?;
        let Ok(entry) = head.get_path(Path::new(&path)) else {
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
        StatusRecord::parse(text, namespace, name)
            .map(Some)
            .map_err(|e| format!("{path} cannot be read: {e}"))
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
