//! Report: what a reconcile tells the world after it applied. GitHub
//! (comments, commit statuses, gates, commands) and the Git write-back of
//! promotes and reverts. The app status ConfigMap is written by `sync`, a
//! Rollout's status and Events by `rollout::report`, both within the app's
//! sync.

pub mod github;
pub mod wave;
pub mod writeback;

pub use github::GitHubReporter;
pub use writeback::{WritebackConfig, write_back};
