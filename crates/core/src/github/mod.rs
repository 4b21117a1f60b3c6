//! GitHub, the pure half: the gate's rule.

pub mod judge;
