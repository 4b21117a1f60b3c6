//! What happened to a release in one reconcile, as Events, logs and
//! metrics read it.

/// What happened to a release in one reconcile. Events, logs and metrics
/// read the kind; the text (`Display`) is what a person reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Back on (or adopted at) the stable template Git holds.
    Healthy,
    /// The release cannot start (the canary Service would select nothing…).
    Refused {
        problem: String,
    },
    Started {
        rollout_id: String,
        commit: String,
    },
    /// A newer commit replaced the release.
    Superseded {
        rollout_id: String,
        reason: String,
    },
    Failed {
        rollout_id: String,
        cause: String,
    },
    CanaryReady {
        step: u32,
        pods: i32,
    },
    TrafficInForce {
        step: u32,
        percent: u32,
    },
    StepDone {
        step: u32,
    },
    LastStepDone,
    /// A promote went on past an inconclusive analysis.
    AnalysisSkipped {
        template: String,
        by: String,
    },
    AnalysisInconclusive {
        template: String,
    },
    /// An indefinite pause was passed by a promote.
    GatePassed {
        step: u32,
    },
    Promoted {
        rollout_id: String,
    },
    /// A promote or abort that is not for the running release, or came
    /// while nothing waited for it.
    SignalIgnored {
        reason: String,
    },
}

/// How an Event reports a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

impl Transition {
    /// The Event's type and reason.
    pub fn event(&self) -> (Severity, &'static str) {
        match self {
            Transition::Failed { .. } | Transition::Refused { .. } => (Severity::Warning, "ReleaseFailed"),
            Transition::AnalysisInconclusive { .. } => (Severity::Warning, "AnalysisInconclusive"),
            Transition::SignalIgnored { .. } => (Severity::Warning, "SignalIgnored"),
            Transition::Promoted { .. } => (Severity::Normal, "Promoted"),
            Transition::GatePassed { .. } | Transition::AnalysisSkipped { .. } => (Severity::Normal, "GatePassed"),
            Transition::Started { .. } => (Severity::Normal, "ReleaseStarted"),
            Transition::Superseded { .. } => (Severity::Normal, "ReleaseSuperseded"),
            Transition::Healthy
            | Transition::CanaryReady { .. }
            | Transition::TrafficInForce { .. }
            | Transition::StepDone { .. }
            | Transition::LastStepDone => (Severity::Normal, "StepChanged"),
        }
    }
}

impl std::fmt::Display for Transition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transition::Healthy => write!(f, "Healthy: Git holds the stable template"),
            Transition::Refused { problem } => write!(f, "release refused: {problem}"),
            Transition::Started { rollout_id, commit } => {
                write!(
                    f,
                    "release {rollout_id} started for commit {}",
                    crate::short_commit(commit)
                )
            }
            Transition::Superseded { rollout_id, reason } => write!(f, "release {rollout_id} superseded: {reason}"),
            Transition::Failed { rollout_id, cause } => write!(f, "release {rollout_id} failed: {cause}"),
            Transition::CanaryReady { step, pods } => write!(f, "step {step}: {pods} canary pod(s) ready"),
            Transition::TrafficInForce { step, percent } => write!(f, "step {step}: traffic {percent}% in force"),
            Transition::StepDone { step } => write!(f, "step {step} done"),
            Transition::LastStepDone => write!(f, "last step done: promoting"),
            Transition::AnalysisSkipped { template, by } => {
                write!(f, "analysis {template}: going on without it, promoted by {by}")
            }
            Transition::AnalysisInconclusive { template } => write!(f, "analysis {template} inconclusive: paused"),
            Transition::GatePassed { step } => write!(f, "step {step}: promoted"),
            Transition::Promoted { rollout_id } => write!(f, "release {rollout_id} promoted"),
            Transition::SignalIgnored { reason } => write!(f, "{reason}"),
        }
    }
}
