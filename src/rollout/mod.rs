//! Canary releases: the `Rollout` API and the pure planner (in the core
//! crate), and the engine that feeds the planner from the cluster and
//! applies its intent.

pub use gitcanary_core::rollout::*;

pub mod cli;
pub mod convert;
pub mod engine;
pub(crate) mod observe;
pub mod prometheus;
mod reads;
pub mod web;
