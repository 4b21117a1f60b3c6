//! When the agent looks at a rollout again without being woken by a change.

use std::time::Duration;

use jiff::Timestamp;

/// Why the agent looks at a rollout again without being woken by a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequeueReason {
    /// A step's deadline (pods ready, traffic read back) runs out.
    Deadline,
    /// A timed pause ends.
    Pause,
    /// The grace period after a traffic change ends.
    Grace,
    /// An analysis run's next measurement is due.
    Analysis,
    /// A pause waits for a promote: look for `/gitcanary` commands on GitHub.
    Command,
}

impl RequeueReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            RequeueReason::Deadline => "deadline",
            RequeueReason::Pause => "pause",
            RequeueReason::Grace => "grace",
            RequeueReason::Analysis => "analysis",
            RequeueReason::Command => "command",
        }
    }
}

/// The next look at a rollout: after how long, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requeue {
    pub after: Duration,
    pub reason: RequeueReason,
    /// The moment `after` counts to, from the plan's `now`: a timer aimed at
    /// `after` from the sync's start fires early by the sync's reads.
    pub at: Option<Timestamp>,
}

impl Requeue {
    /// The sooner of two.
    pub fn sooner(a: Option<Requeue>, b: Option<Requeue>) -> Option<Requeue> {
        match (a, b) {
            (Some(a), Some(b)) => Some(match (a.at, b.at) {
                (Some(at_a), Some(at_b)) if at_b < at_a => b,
                (Some(_), Some(_)) => a,
                _ if b.after < a.after => b,
                _ => a,
            }),
            (a, b) => a.or(b),
        }
    }
}
