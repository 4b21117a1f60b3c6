//! Where manifests come from: a Git branch (fetched with git2) or, for
//! development, a plain local directory.

mod git;
pub(crate) mod history;
pub mod webhook;

pub use git::{AppFiles, Credentials, GitSource, HeadReader, redact_url};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::Result;
use crate::manifest::ManifestSet;
use crate::render::Renderers;

/// One revision of the source: its id and its manifests.
#[derive(Debug, Clone)]
pub struct Revision {
    /// The commit id, or `local` for a directory that is not a Git repository.
    pub commit: String,
    pub manifests: ManifestSet,
    /// App -> the newest commit that changed its files, where history says
    /// (apps missing here: `commit`).
    pub app_commits: std::collections::BTreeMap<String, String>,
    /// Status files and earlier commits, for Rollouts with no status (none
    /// for a plain directory).
    pub history: Option<Arc<dyn crate::rollout::record::History>>,
    /// Set when the revision is validated, different for each validation
    /// (0: not validated): what a sync may remember per revision is kept
    /// under it. Private: nothing else may claim a validation.
    validated: u64,
}

impl Revision {
    /// `manifests` at `commit`, without history or app commits, not validated.
    pub fn new(commit: String, manifests: ManifestSet) -> Revision {
        Revision {
            commit,
            manifests,
            app_commits: Default::default(),
            history: None,
            validated: 0,
        }
    }

    /// The commit that last changed the app: what a release of it is for.
    pub fn commit_for(&self, app: &str) -> &str {
        self.app_commits.get(app).map_or(&self.commit, String::as_str)
    }

    /// Which validation the revision passed (0: none).
    pub fn validated(&self) -> u64 {
        self.validated
    }

    /// Marks the revision validated: a new id, never given before.
    pub(crate) fn mark_validated(&mut self) {
        static VALIDATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        self.validated = VALIDATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    }
}

pub enum Source {
    Git(GitSource),
    Dir { root: PathBuf, renderers: Arc<Renderers> },
}

impl Source {
    /// `repo` is a URL (`https://`, `ssh://`, `file://`, `user@host:path`), a
    /// path to a Git repository, or a path to a plain directory of manifests.
    pub fn open(repo: &str, branch: &str, path: &str, credentials: Credentials, cache: &Path) -> Result<Source> {
        let local = Path::new(repo);
        let is_url = repo.contains("://") || (repo.contains('@') && repo.contains(':'));
        if !is_url && local.is_dir() && !looks_like_git(local) {
            return Ok(Source::Dir {
                root: local.join(path.trim_start_matches('/')),
                renderers: Arc::default(),
            });
        }
        let url = if is_url {
            repo.to_string()
        } else {
            let absolute = local.canonicalize().map_err(|source| crate::Error::Read {
                path: repo.to_string(),
                source,
            })?;
            format!("file://{}", absolute.display())
        };
        Ok(Source::Git(GitSource::new(url, branch, path, credentials, cache)))
    }

    /// Fetches the newest revision and loads its manifests.
    pub fn fetch(&self) -> Result<Revision> {
        match self {
            Source::Git(git) => git.fetch(),
            Source::Dir { root, renderers } => Ok(Revision::new(
                "local".to_string(),
                crate::render::load_dir(root, renderers)?,
            )),
        }
    }

    /// Renders Kustomize and Helm apps with these renderers (default: found on PATH).
    pub fn with_renderers(mut self, with: Arc<Renderers>) -> Source {
        match &mut self {
            Source::Git(git) => git.renderers = with,
            Source::Dir { renderers, .. } => *renderers = with,
        }
        self
    }

    /// The identity whose commits alone may write status files read back.
    pub fn with_record_writer(mut self, writer: crate::identity::Author) -> Source {
        if let Source::Git(git) = &mut self {
            git.record_writer = Arc::new(writer);
        }
        self
    }

    /// The cluster this agent's records are of (`--cluster-name`).
    pub fn with_records(mut self, records: crate::rollout::record::Records) -> Source {
        if let Source::Git(git) = &mut self {
            git.records = Arc::new(records);
        }
        self
    }

    /// Where this agent's status files, gates and trailers are.
    pub fn records(&self) -> crate::rollout::record::Records {
        match self {
            Source::Git(git) => git.records().clone(),
            Source::Dir { .. } => Default::default(),
        }
    }

    pub fn renderers(&self) -> &Renderers {
        match self {
            Source::Git(git) => &git.renderers,
            Source::Dir { renderers, .. } => renderers,
        }
    }

    /// The Git source, when it is one (write-back needs it).
    pub fn git(&self) -> Option<&GitSource> {
        match self {
            Source::Git(git) => Some(git),
            Source::Dir { .. } => None,
        }
    }

    /// The local directory to watch for file events, when the source is one.
    pub fn local_dir(&self) -> Option<&Path> {
        match self {
            Source::Dir { root, .. } => Some(root),
            Source::Git(_) => None,
        }
    }

    /// What to call the source in logs and status (credentials removed).
    pub fn describe(&self) -> String {
        match self {
            Source::Git(git) => format!("{} ({})", redact_url(git.url()), git.branch()),
            Source::Dir { root, .. } => root.display().to_string(),
        }
    }
}

fn looks_like_git(dir: &Path) -> bool {
    dir.join(".git").exists() || (dir.join("HEAD").is_file() && dir.join("objects").is_dir())
}

#[cfg(test)]
mod tests {
    use super::Revision;

    #[test]
    fn each_validation_has_an_id_of_its_own() {
        let mut revision = Revision {
            commit: "c".into(),
            manifests: Default::default(),
            app_commits: Default::default(),
            history: None,
            validated: 0,
        };
        assert_eq!(revision.validated(), 0, "not validated");
        revision.mark_validated();
        let first = revision.validated();
        let mut copy = revision.clone();
        copy.mark_validated();
        assert!(
            first != 0 && copy.validated() != first,
            "a copy validated again is another revision"
        );
        assert_eq!(revision.validated(), first);
    }
}
