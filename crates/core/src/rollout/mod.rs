//! Canary releases, the pure half: the `Rollout` API, the planner, desired
//! state and overlays, analysis decisions, Knative, validation.

pub mod analysis;
pub mod api;
pub mod desired;
pub mod hooks;
pub mod jobs;
pub mod knative;
pub mod model;
pub mod overlay;
pub mod plan;
pub mod record;
pub mod signal;
pub mod validate;
pub mod web_paths;
