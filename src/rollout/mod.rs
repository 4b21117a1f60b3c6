//! Canary releases: the `Rollout` API and the pure planner (in the core
//! crate), what feeds the planner from the cluster (`observe`, `reads`,
//! `prometheus`, `web`), and the report of a Rollout once its app is
//! applied (`report`: status, Events, batch labels). It is written within
//! the app's sync, so it sits here rather than in the top-level `report`,
//! which reports on whole syncs.

pub use gitcanary_core::rollout::*;

pub mod cli;
pub mod convert;
pub(crate) mod observe;
pub mod prometheus;
mod reads;
pub mod report;
pub mod web;
