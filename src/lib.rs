//! gitcanary: a GitOps agent that syncs a Git repository into a Kubernetes
//! cluster. The binary's subcommands are thin wrappers over this library, so
//! tests call exactly what the CLI calls.

pub mod agent;
pub mod cluster;
pub mod github;
pub mod lease;
pub mod manifest;
pub mod plan;
pub mod rollout;
pub mod server;
pub mod source;
pub mod sync;
pub mod telemetry;
pub mod writeback;

/// The API group of gitcanary's own kinds.
pub const API_GROUP: &str = "gitcanary.io";
/// The instance name when `--instance` is not given.
pub const DEFAULT_INSTANCE: &str = "gitcanary";
/// The field manager for every server-side apply gitcanary sends.
pub const FIELD_MANAGER: &str = "gitcanary";
/// Label on every applied object: which agent instance manages it.
pub const MANAGED_BY_LABEL: &str = "gitcanary.io/managed-by";
/// Annotation on every applied object: the app and file it comes from.
pub const SOURCE_ANNOTATION: &str = "gitcanary.io/source";
/// Annotation holding the hash of the desired content last applied.
pub const APPLIED_HASH_ANNOTATION: &str = "gitcanary.io/applied-hash";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),

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

    #[error("{object}: {message}")]
    Object { object: String, message: String },

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
            Error::Read { .. } => "read",
            Error::Invalid(_) => "invalid_manifest",
            Error::Git { .. } => "git",
            Error::Kube { .. } => "kubernetes",
            Error::Kubeconfig(_) => "kubeconfig",
            Error::Object { .. } => "object",
            Error::GitHub { .. } => "github",
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

/// A commit id as logs, messages and default rollout ids show it: its
/// first 7 characters, as `git log --oneline` does.
pub fn short_commit(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
