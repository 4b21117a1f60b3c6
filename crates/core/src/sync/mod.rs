//! The pure stage of a sync: an app's plan from what was observed, and the
//! offline check that composes the same planner.

pub mod offline;
pub mod planner;
