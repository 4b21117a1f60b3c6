//! Canary releases: the `Rollout` API, the pure planner, and the engine
//! that feeds the planner from the cluster and applies its intent.

pub mod analysis;
pub mod api;
pub mod cli;
pub mod convert;
pub(crate) mod desired;
pub mod engine;
pub mod hooks;
pub mod jobs;
pub mod knative;
pub mod model;
pub(crate) mod observe;
pub mod overlay;
pub mod plan;
pub mod prometheus;
pub mod record;
pub mod signal;
pub mod validate;
pub mod web;
pub mod web_paths;
