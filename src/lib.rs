//! gitcanary: a GitOps agent that syncs a Git repository into a Kubernetes
//! cluster. The binary's subcommands are thin wrappers over this library, so
//! tests call exactly what the CLI calls.

pub mod agent;
pub mod cli;
pub mod cluster;
pub mod dashboard;
pub mod github;
pub mod identity;
pub mod lease;
pub mod manifest;
pub use gitcanary_core::model;
pub mod notify;
pub use gitcanary_core::plan;
pub mod render;
pub mod report;
pub mod rollout;
pub mod server;
pub mod shards;
pub mod source;
pub mod sync;
pub mod telemetry;
pub mod wave;
pub mod writeback;

pub use gitcanary_core::{
    API_GROUP, APPLIED_HASH_ANNOTATION, DEFAULT_INSTANCE, FIELD_MANAGER, MANAGED_BY_LABEL, SOURCE_ANNOTATION,
    short_commit,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),

    /// What was asked could not be done because the object moved on
    /// meanwhile; asking again with a fresh view decides.
    #[error("{0}")]
    Conflict(String),

    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid manifests:\n{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<manifest::Problem>),

    #[error("git: {context}: {source}")]
    Git {
        context: String,
        #[source]
        source: git2::Error,
    },

    #[error("kubernetes: {context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("kubeconfig: {0}")]
    Kubeconfig(String),

    /// gitcanary could not write one of its own files (status, gate) as YAML.
    #[error("writing the {what} as YAML: {message}")]
    Serialize { what: String, message: String },

    /// A push that kept losing races; it is tried again on the next sync.
    #[error("{target}: the push was rejected {attempts} times; it is retried on the next sync")]
    PushRejected { target: String, attempts: u32 },

    /// A CRD applied by the sync did not become established in time.
    #[error("CustomResourceDefinition {name}: not established within {seconds} s")]
    NotEstablished { name: String, seconds: u64 },

    /// The API server will not serve a CRD the sync applied (its names
    /// conflict with another's): waiting would not help.
    #[error("CustomResourceDefinition {name}: names not accepted: {message}")]
    NamesNotAccepted { name: String, message: String },

    /// A task that reads untrusted input (Git objects, manifests) panicked;
    /// the sync that ran it fails, the agent goes on.
    #[error("{task} stopped unexpectedly: {message}")]
    Panicked { task: &'static str, message: String },

    /// A revision whose manifests together pass the cap: nothing of it is read.
    #[error(
        "{revision}: its manifests are more than {limit} bytes together ({path}, of app {}, passes the cap); nothing of it is applied",
        crate::manifest::parse::app_of_path(path)
    )]
    RevisionTooLarge { revision: String, path: String, limit: u64 },

    /// A GitHub API call failed; `status` is the HTTP status when there was an answer.
    #[error("GitHub: {context}: {message}")]
    GitHub {
        context: String,
        status: Option<u16>,
        message: String,
    },
}

impl Error {
    /// A short, stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Usage(_) => "usage",
            Error::Conflict(_) => "conflict",
            Error::Read { .. } => "read",
            Error::Invalid(_) => "invalid_manifest",
            Error::Git { .. } => "git",
            Error::Kube { .. } => "kubernetes",
            Error::Kubeconfig(_) => "kubeconfig",
            Error::RevisionTooLarge { .. } => "revision_too_large",
            Error::Serialize { .. } => "serialize",
            Error::PushRejected { .. } => "push_rejected",
            Error::NotEstablished { .. } | Error::NamesNotAccepted { .. } => "crd_not_established",
            Error::GitHub { .. } => "github",
            Error::Panicked { .. } => "panicked",
        }
    }

    /// Whether asking again later may succeed: no answer, a server error, a
    /// rate limit or a conflict. A refusal (a 4xx that says no) is final.
    pub fn is_transient(&self) -> bool {
        let transient = |status: Option<u16>| status.is_none_or(|s| s >= 500 || s == 429 || s == 409);
        match self {
            Error::GitHub { status, message, .. } => {
                transient(*status) || (*status == Some(403) && message.contains("rate limit"))
            }
            Error::Kube { source, .. } => match source.as_ref() {
                kube::Error::Api(status) => transient(Some(status.code)),
                _ => true,
            },
            Error::Conflict(_) => true,
            _ => false,
        }
    }

    pub(crate) fn git(context: impl Into<String>) -> impl FnOnce(git2::Error) -> Error {
        let context = context.into();
        move |source| Error::Git { context, source }
    }

    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube {
            context,
            source: Box::new(source),
        }
    }
}

/// Runs blocking work (git2, parsing) off the async threads. A panic in it
/// becomes an [`Error::Panicked`] for this one task, never a process exit.
pub async fn blocking<T: Send + 'static>(task: &'static str, work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|error| {
        let message = match error.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string()),
            Err(error) => error.to_string(),
        };
        Error::Panicked { task, message }
    })
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_error_that_asking_again_may_mend_is_transient() {
        let github = |status: Option<u16>, message: &str| Error::GitHub {
            context: "a collaborator's permission".into(),
            status,
            message: message.into(),
        };
        assert!(github(None, "no answer").is_transient());
        assert!(github(Some(502), "Server Error").is_transient());
        assert!(github(Some(429), "slow down").is_transient());
        assert!(github(Some(403), "API rate limit exceeded").is_transient());
        assert!(!github(Some(403), "Resource not accessible by integration").is_transient());
        assert!(!github(Some(404), "Not Found").is_transient());
        assert!(!Error::Usage("bad flag".into()).is_transient());
        assert!(Error::Conflict("the Rollout moved on".into()).is_transient());
    }

    #[tokio::test]
    async fn a_panic_in_blocking_work_is_an_error_of_that_task() {
        let outcome: Result<()> = blocking("parsing", || panic!("a bad blob")).await;
        match outcome {
            Err(Error::Panicked { task, message }) => {
                assert_eq!(task, "parsing");
                assert_eq!(message, "a bad blob");
            }
            other => panic!("expected a Panicked error, got {other:?}"),
        }
        assert_eq!(blocking("adding", || 2 + 2).await.ok(), Some(4));
    }

    #[test]
    fn short_commits_have_seven_characters() {
        assert_eq!(short_commit("0123456789abcdef"), "0123456");
        assert_eq!(short_commit("local"), "local");
    }
}
