//! gitcanary's pure core: what to write, delete and report, decided from
//! what was observed. Nothing here does I/O: the crate depends on no client,
//! runtime or network library, so the compiler keeps the planning stage
//! pure; the agent crate observes, executes and reports around it.

pub mod github;
pub mod manifest;
pub mod model;
pub mod plan;
pub mod rollout;
pub mod sync;
pub mod wave;

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

/// A commit id as logs, messages and default rollout ids show it: its
/// first 7 characters, as `git log --oneline` does.
pub fn short_commit(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}
