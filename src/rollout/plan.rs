//! The rollout planner: a pure function from (spec, previous status, what
//! was observed, the clock, signals) to the next status and the intent the
//! engine turns into objects. Every decision of a release is made here.

use std::time::Duration;

use jiff::Timestamp;

use super::analysis::{self, Measurement, Outcome};
use super::api::{
    AnalysisRun, CanaryStatus, CanaryStep, IntOrPercent, OnFailure, PendingWriteback, Phase, RolloutSpec,
    RolloutStatus, Signal, StepRecord, StepState, SupersededRelease, WritebackAction,
};
use super::signal;

/// Default wait after a route change (Kruise Rollout's default).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);
/// Default time canary pods have to become ready.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);

/// What the engine saw in Git and in the cluster for one reconcile.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The commit being synced.
    pub commit: String,
    /// Hash of the workload's pod template as Git has it now.
    pub git_template_hash: String,
    /// Whether the workload exists in the cluster.
    pub workload_exists: bool,
    /// The stable template hash recorded on the live workload, if any.
    pub workload_stable_hash: Option<String>,
    /// Git's template already equals the live one (a workload being adopted).
    pub git_matches_live: bool,
    /// Replicas of the workload as Git has them.
    pub replicas: i32,
    /// Ready canary pods of the current canary template.
    pub canary_ready: i32,
    /// The stable workload runs the canary template on every replica, all available.
    pub stable_rolled_out: bool,
    /// Why a release cannot start: the canary Service would not select the
    /// canary pods, or a canary object's name is taken by someone else's object.
    pub start_problem: Option<String>,
    /// The value of the promote annotation, if set.
    pub promote_signal: Option<String>,
    /// The value of the abort annotation, if set.
    pub abort_signal: Option<String>,
    /// The Rollout's UID: part of the identity a signal must name.
    pub rollout_uid: String,
    /// Analysis measurements the engine took for this reconcile.
    pub measurements: Vec<Measurement>,
    /// The revision (pod-template-hash or controller-revision-hash) the stable pods run.
    pub stable_revision: String,
    /// The revision of the current canary pods; empty until their controller made them.
    pub canary_revision: String,
    /// The Rollout's status file in Git, read because the Rollout had no status.
    pub resumed: Option<Resumed>,
    /// Set for a workload that routes its own traffic (a Knative Service):
    /// what its status reads back.
    pub self_routed: Option<SelfRouted>,
    pub now: Timestamp,
}

/// What a workload that routes its own traffic reports. Its revisions in
/// `Observed` are the one stable and the one canary Revision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SelfRouted {
    /// Percent of requests Git gives the latest Revision: what a release splits.
    pub share: u32,
    /// Percent the workload's status gives the canary Revision by name, once
    /// it has seen its latest spec.
    pub canary_percent: Option<u32>,
}

/// What a Rollout with no status takes from its status file in Git.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resumed {
    /// `.gitcanary/status/<namespace>/<name>.yaml at <commit>`.
    pub from: String,
    pub stable_commit: String,
    pub stable_template_hash: String,
    /// A held failure: its commit, its template's hash and its cause.
    pub failed_commit: String,
    pub failed_template_hash: String,
    pub cause: String,
}

/// Which pod template the stable workload gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StableTemplate {
    /// The one it runs now (a release is in flight, or failed).
    Live,
    /// Git's.
    Git,
}

/// What the cluster should look like after this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub stable_template: StableTemplate,
    /// Canary pods wanted; `None` removes the canary workload and Service.
    pub canary_replicas: Option<i32>,
    /// Percent of requests to the canary; `None` restores the routes Git holds.
    pub traffic: Option<u32>,
    /// Pin the stable Service to the stable revision (while traffic is split).
    pub pin_stable_service: bool,
    /// The canary Service selects the canary pods and routes may name it:
    /// canary pods run a known revision and the Rollout keeps a canary Service.
    pub route_canary: bool,
    pub rollout_id: String,
    /// 1-based step whose pods are being created (batch label), 0 when none.
    pub step: u32,
}

impl Intent {
    fn steady(stable_template: StableTemplate) -> Intent {
        Intent {
            stable_template,
            canary_replicas: None,
            traffic: None,
            pin_stable_service: false,
            route_canary: false,
            rollout_id: String::new(),
            step: 0,
        }
    }
}

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
}

impl Requeue {
    /// The sooner of two.
    pub fn sooner(a: Option<Requeue>, b: Option<Requeue>) -> Option<Requeue> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.after < a.after { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub status: RolloutStatus,
    pub intent: Intent,
    /// Reconcile again after this long (a pause, a grace period, a deadline).
    pub requeue: Option<Requeue>,
    /// What happened to the release in this reconcile, in order.
    pub transitions: Vec<Transition>,
    /// Set when the release failed in this reconcile: the cause.
    pub failed: Option<String>,
    /// Set when the release was promoted in this reconcile.
    pub promoted: bool,
    /// Signals not for the running release or given while nothing waited:
    /// the annotation values the engine clears.
    pub ignored_signals: Vec<(Signal, String)>,
}

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

/// The release's rollout ID: the spec's, or the short commit when it is
/// absent or empty (`rolloutID: ""` must not leave a release nameless, which
/// would switch off its gates and GitHub reporting).
pub fn release_id(spec_rollout_id: Option<&str>, commit: &str) -> String {
    match spec_rollout_id.map(str::trim) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => crate::short_commit(commit).to_string(),
    }
}

/// A Revision's name, or what stands for one not made yet.
fn or_not_made(revision: &str) -> &str {
    if revision.is_empty() {
        "(not made yet)"
    } else {
        revision
    }
}

/// Parses a percentage such as "10%" (or "10").
pub fn parse_percent(text: &str) -> Result<u32, String> {
    let digits = text.trim().trim_end_matches('%').trim();
    digits
        .parse::<u32>()
        .map_err(|_| format!("{text:?} is not a percentage such as \"10%\""))
}

/// Canary pods for a step: its `replicas` (a count or a percentage of the
/// workload's, rounded up), or else its traffic share of the replicas
/// (rounded up, at least one when any traffic goes to the canary).
pub fn step_replicas(step: &super::api::CanaryStep, replicas: i32) -> i32 {
    let replicas = replicas.max(0);
    let percent_of = |p: u32| ((i64::from(replicas) * i64::from(p.min(100)) + 99) / 100) as i32;
    match &step.replicas {
        Some(IntOrPercent::Int(n)) => (*n).clamp(0, replicas),
        Some(IntOrPercent::Percent(p)) => percent_of(parse_percent(p).unwrap_or(0)),
        None => {
            let traffic = step.traffic.as_deref().and_then(|t| parse_percent(t).ok()).unwrap_or(0);
            if replicas == 0 { 0 } else { percent_of(traffic).max(1) }
        }
    }
}

fn step_traffic(spec: &RolloutSpec, index: u32) -> Option<u32> {
    let step = spec.strategy.canary.steps.get(index.checked_sub(1)? as usize)?;
    step.traffic.as_deref().and_then(|t| parse_percent(t).ok())
}

/// Traffic in force at a step: the last step at or before it that sets one.
fn traffic_at(spec: &RolloutSpec, index: u32) -> Option<u32> {
    (1..=index).rev().find_map(|i| step_traffic(spec, i))
}

fn elapsed(since: &str, now: Timestamp) -> Duration {
    since
        .parse::<Timestamp>()
        .ok()
        .and_then(|start| Duration::try_from(now.duration_since(start)).ok())
        .unwrap_or(Duration::ZERO)
}

/// Where the release stands in one pass of `advance`.
struct Here {
    /// The current step, from 1.
    index: u32,
    /// Canary pods the step wants.
    wanted: i32,
    /// How long the step has been in its state.
    in_state: Duration,
}

/// What a step state decided: go on to the next state, or hold with this intent.
enum Flow {
    Next,
    Hold(Intent),
}

struct Planner<'a> {
    spec: &'a RolloutSpec,
    observed: &'a Observed,
    status: RolloutStatus,
    transitions: Vec<Transition>,
    requeue: Option<Requeue>,
    failed: Option<String>,
    promoted: bool,
    ignored_signals: Vec<(Signal, String)>,
}

/// The next status and intent for one rollout.
pub fn plan(spec: &RolloutSpec, previous: &RolloutStatus, observed: &Observed) -> Plan {
    let mut planner = Planner {
        spec,
        observed,
        status: previous.clone(),
        transitions: Vec::new(),
        requeue: None,
        failed: None,
        promoted: false,
        ignored_signals: Vec::new(),
    };
    let mut intent = planner.run();
    planner.discard_unused_signals();
    planner.requeue_for_analysis();
    let mut status = planner.status;
    route(spec, observed, &mut intent);
    // A self-routed workload's stable Revision is what observe found (it keeps
    // the pinned one during a release), except just promoted: the canary's.
    let observed_stable = observed.self_routed.is_some() && !planner.promoted;
    status.stable_revision = if observed_stable || status.stable_revision.is_empty() || status.phase != Phase::Healthy {
        observed.stable_revision.clone()
    } else {
        status.stable_revision
    };
    status.canary_revision = if intent.canary_replicas.is_some() {
        observed.canary_revision.clone()
    } else {
        String::new()
    };
    if status != *previous
        && let Some(canary) = status.canary_status.as_mut()
    {
        canary.last_update_time = observed.now.to_string();
    }
    Plan {
        status,
        intent,
        requeue: planner.requeue,
        transitions: planner.transitions,
        failed: planner.failed,
        promoted: planner.promoted,
        ignored_signals: planner.ignored_signals,
    }
}

/// Whether the canary can take traffic now: a Service can select its pods
/// only once they run a known revision, and only a Rollout that keeps a
/// canary Service routes to one. Until then Git's routes stay in force.
fn route(spec: &RolloutSpec, observed: &Observed, intent: &mut Intent) {
    let keeps_service = !spec.strategy.canary.canary_service.as_ref().is_some_and(|c| c.disabled);
    intent.route_canary = intent.canary_replicas.is_some() && !observed.canary_revision.is_empty() && keeps_service;
    if !intent.route_canary {
        intent.traffic = None;
    }
    intent.pin_stable_service &= intent.route_canary && !observed.stable_revision.is_empty();
}

impl Planner<'_> {
    fn in_release(&self) -> bool {
        matches!(self.status.phase, Phase::Progressing | Phase::Paused | Phase::Promoting)
            && !self.status.canary_template_hash.is_empty()
    }

    fn note(&mut self, transition: Transition) {
        self.transitions.push(transition);
    }

    fn requeue_in(&mut self, after: Duration, reason: RequeueReason) {
        let after = after.max(Duration::from_millis(100));
        self.requeue = Requeue::sooner(self.requeue, Some(Requeue { after, reason }));
    }

    fn canary(&mut self) -> &mut CanaryStatus {
        self.status.canary_status.get_or_insert_with(CanaryStatus::default)
    }

    fn enter(&mut self, index: u32, state: StepState) {
        let now = self.observed.now.to_string();
        if self.status.step_history.last().map(|r| r.step) != Some(index) {
            if let Some(last) = self.status.step_history.last_mut() {
                last.finished_at = now.clone();
            }
            self.status.step_history.push(StepRecord {
                step: index,
                started_at: now.clone(),
                ..StepRecord::default()
            });
        }
        let canary = self.canary();
        canary.current_step_index = index;
        canary.current_step_state = state;
        canary.state_started_at = now;
    }

    fn run(&mut self) -> Intent {
        let observed = self.observed;
        if self.status.stable_template_hash.is_empty()
            && let Some(resumed) = &observed.resumed
        {
            // Git is the state of record: what it says was promoted is stable,
            // whatever the cluster runs or lacks.
            self.status.stable_template_hash = resumed.stable_template_hash.clone();
            self.status.stable_commit = resumed.stable_commit.clone();
            self.status.resumed_from_git = resumed.from.clone();
            if !resumed.failed_template_hash.is_empty() && resumed.failed_template_hash == observed.git_template_hash {
                self.status.phase = Phase::Failed;
                self.status.failed_template_hash = resumed.failed_template_hash.clone();
                self.canary().message = format!(
                    "the release of {} failed ({}) and is held, as {} records; {} runs as stable, and the failed template is not released again while Git asks for it",
                    crate::short_commit(&resumed.failed_commit),
                    resumed.cause,
                    resumed.from,
                    crate::short_commit(&resumed.stable_commit)
                );
                return Intent::steady(StableTemplate::Live);
            }
        }
        if self.status.stable_template_hash.is_empty() {
            // First sight of this rollout: adopt what runs, never restart it.
            self.status.stable_template_hash = match &observed.workload_stable_hash {
                Some(hash) => hash.clone(),
                None if !observed.workload_exists || observed.git_matches_live => observed.git_template_hash.clone(),
                None => String::new(),
            };
            if self.status.stable_template_hash == observed.git_template_hash {
                self.status.stable_commit = observed.commit.clone();
            }
        }
        if self.in_release() {
            if let Some(intent) = self.follow_git() {
                return intent;
            }
            if let Some(intent) = self.abort_if_asked() {
                return intent;
            }
            return self.advance();
        }
        self.idle()
    }

    /// No release in flight: stay, or start one for a new template.
    fn idle(&mut self) -> Intent {
        let observed = self.observed;
        let git = &observed.git_template_hash;
        if *git == self.status.stable_template_hash {
            if self.status.phase != Phase::Healthy {
                self.note(Transition::Healthy);
            }
            self.status.phase = Phase::Healthy;
            self.status.failed_template_hash.clear();
            self.status.canary_template_hash.clear();
            self.status.stable_commit = if self.status.stable_commit.is_empty() {
                observed.commit.clone()
            } else {
                self.status.stable_commit.clone()
            };
            if let Some(canary) = self.status.canary_status.as_mut() {
                canary.traffic = "0%".into();
            }
            return Intent::steady(StableTemplate::Git);
        }
        if *git == self.status.failed_template_hash {
            // The failed version is still in Git: hold the stable one.
            return Intent::steady(StableTemplate::Live);
        }
        if let Some(problem) = &observed.start_problem {
            if self.status.phase != Phase::Failed || self.canary().message != *problem {
                self.note(Transition::Refused {
                    problem: problem.clone(),
                });
            }
            self.status.phase = Phase::Failed;
            self.canary().message = problem.clone();
            return Intent::steady(StableTemplate::Live);
        }
        self.start_release()
    }

    fn start_release(&mut self) -> Intent {
        let observed = self.observed;
        self.status.phase = Phase::Progressing;
        self.status.canary_template_hash = observed.git_template_hash.clone();
        self.status.canary_commit = observed.commit.clone();
        self.status.canary_revision.clear();
        self.status.rollout_id = release_id(self.spec.rollout_id.as_deref(), &observed.commit);
        self.status.failed_template_hash.clear();
        self.status.canary_status = Some(CanaryStatus {
            traffic: "0%".into(),
            ..CanaryStatus::default()
        });
        self.status.step_history.clear();
        self.status.analysis_runs.clear();
        self.note(Transition::Started {
            rollout_id: self.status.rollout_id.clone(),
            commit: observed.commit.clone(),
        });
        self.enter(1, StepState::StepUpgrade);
        self.advance()
    }

    /// A new commit during a release: back to stable, or restart with the newest.
    fn follow_git(&mut self) -> Option<Intent> {
        let observed = self.observed;
        let git = &observed.git_template_hash;
        if *git == self.status.canary_template_hash {
            return None;
        }
        let reason = if *git == self.status.stable_template_hash {
            "Git went back to the stable template"
        } else {
            "a newer template arrived"
        };
        self.status.superseded.push(SupersededRelease {
            commit: self.status.canary_commit.clone(),
            rollout_id: self.status.rollout_id.clone(),
            reason: reason.to_string(),
            at: observed.now.to_string(),
        });
        // Keep the record short: the last ten releases.
        let excess = self.status.superseded.len().saturating_sub(10);
        self.status.superseded.drain(..excess);
        self.note(Transition::Superseded {
            rollout_id: self.status.rollout_id.clone(),
            reason: reason.to_string(),
        });
        self.status.canary_template_hash.clear();
        self.status.canary_commit.clear();
        self.status.phase = Phase::Healthy;
        if *git == self.status.stable_template_hash {
            self.status.canary_status = Some(CanaryStatus {
                message: format!("fast rollback: {reason}"),
                traffic: "0%".into(),
                state_started_at: observed.now.to_string(),
                ..CanaryStatus::default()
            });
            return Some(Intent::steady(StableTemplate::Git));
        }
        Some(self.start_release())
    }

    fn abort_if_asked(&mut self) -> Option<Intent> {
        let value = self.signal_for_this_release(Signal::Abort)?;
        let cause = format!("aborted by {}", signal::parse(&value).by);
        self.status.last_abort_signal = value;
        Some(self.fail(cause))
    }

    /// The signal's annotation value when it is new and names the running
    /// release; the rest is left to `discard_unused_signals`.
    /// The signal's annotation value when it is one not acted on yet.
    fn new_signal(&self, kind: Signal) -> Option<&String> {
        let (value, last) = match kind {
            Signal::Promote => (&self.observed.promote_signal, &self.status.last_promote_signal),
            Signal::Abort => (&self.observed.abort_signal, &self.status.last_abort_signal),
        };
        value.as_ref().filter(|v| *v != last)
    }

    fn signal_for_this_release(&self, kind: Signal) -> Option<String> {
        let value = self.new_signal(kind)?;
        let running = signal::Release::running(&self.observed.rollout_uid, &self.status);
        signal::mismatch(kind, value, running.as_ref())
            .is_none()
            .then(|| value.clone())
    }

    /// A signal this reconcile did not act on is spent, never kept for a
    /// later pause: a promote sent while Healthy must not pass the next
    /// release's gate.
    fn discard_unused_signals(&mut self) {
        for kind in [Signal::Promote, Signal::Abort] {
            let Some(value) = self.new_signal(kind).cloned() else {
                continue;
            };
            let running = signal::Release::running(&self.observed.rollout_uid, &self.status);
            let reason = signal::mismatch(kind, &value, running.as_ref()).unwrap_or_else(|| {
                let why = signal::awaited(kind, &self.status)
                    .err()
                    .unwrap_or_else(|| "nothing waited for it".to_string());
                format!(
                    "{} for release {} ignored: {why}",
                    kind.verb(),
                    running.map_or_else(String::new, |r| r.describe())
                )
            });
            match kind {
                Signal::Promote => self.status.last_promote_signal = value.clone(),
                Signal::Abort => self.status.last_abort_signal = value.clone(),
            }
            self.status.ignored_signal = reason.clone();
            self.note(Transition::SignalIgnored { reason });
            self.ignored_signals.push((kind, value));
        }
    }

    fn fail(&mut self, cause: String) -> Intent {
        let on_failure = self.spec.strategy.canary.on_failure.unwrap_or_default();
        self.note(Transition::Failed {
            rollout_id: self.status.rollout_id.clone(),
            cause: cause.clone(),
        });
        self.status.phase = Phase::Failed;
        self.status.failed_template_hash = self.status.canary_template_hash.clone();
        self.status.canary_template_hash.clear();
        let message = match on_failure {
            OnFailure::Revert => format!("{cause}; traffic is back on stable and the canary is removed"),
            OnFailure::Hold => format!("{cause}; traffic is back on stable; holding for a fix in Git"),
        };
        let canary = self.canary();
        canary.message = message;
        canary.traffic = "0%".into();
        if !self.status.canary_commit.is_empty() {
            self.status.pending_writeback = Some(PendingWriteback {
                action: match on_failure {
                    OnFailure::Revert => WritebackAction::Revert,
                    OnFailure::Hold => WritebackAction::Hold,
                },
                rollout_id: self.status.rollout_id.clone(),
                stable_commit: self.status.stable_commit.clone(),
                canary_commit: self.status.canary_commit.clone(),
                cause: cause.clone(),
                at: self.observed.now.to_string(),
            });
        }
        self.failed = Some(cause);
        Intent::steady(StableTemplate::Live)
    }

    fn steps(&self) -> u32 {
        self.spec.strategy.canary.steps.len() as u32
    }

    fn release_intent(&self, stable_template: StableTemplate, canary_replicas: i32, traffic: Option<u32>) -> Intent {
        let step = self.status.canary_status.as_ref().map_or(0, |c| c.current_step_index);
        Intent {
            stable_template,
            canary_replicas: Some(canary_replicas),
            traffic,
            pin_stable_service: traffic.is_some() && stable_template == StableTemplate::Live,
            route_canary: false,
            rollout_id: self.status.rollout_id.clone(),
            step,
        }
    }

    /// Walks the step states as far as what was observed allows.
    fn advance(&mut self) -> Intent {
        self.record_measurements();
        if let Some(intent) = self.judge_analysis() {
            return intent;
        }
        // Bounded: each pass moves one state forward or returns.
        for _ in 0..(self.steps() as usize * 5 + 5) {
            let canary = self.canary().clone();
            let index = canary.current_step_index.clamp(1, self.steps().max(1));
            let step = self.step_at(index);
            let here = Here {
                index,
                wanted: step_replicas(&step, self.observed.replicas),
                in_state: elapsed(&canary.state_started_at, self.observed.now),
            };
            self.canary().canary_ready_replicas = self.observed.canary_ready;
            if self.status.phase == Phase::Promoting {
                return self.promote(index);
            }
            let flow = match canary.current_step_state {
                StepState::StepUpgrade => self.upgrade(&here),
                StepState::StepTrafficRouting => self.route_traffic(&here),
                StepState::StepAnalysis | StepState::StepPaused => self.pause(&here, &step),
                StepState::StepReady => {
                    self.finish_step(index);
                    Flow::Next
                }
                StepState::Completed => {
                    self.status.phase = Phase::Promoting;
                    Flow::Next
                }
            };
            if let Flow::Hold(intent) = flow {
                return intent;
            }
        }
        // Unreachable in practice; hold the current state.
        let traffic = traffic_at(self.spec, self.canary().current_step_index);
        self.release_intent(StableTemplate::Live, self.observed.canary_ready, traffic)
    }

    /// Step `index` (from 1) of the spec.
    fn step_at(&self, index: u32) -> CanaryStep {
        let steps = &self.spec.strategy.canary.steps;
        index
            .checked_sub(1)
            .and_then(|i| steps.get(i as usize))
            .cloned()
            .unwrap_or_default()
    }

    fn grace(&self) -> Duration {
        self.spec
            .strategy
            .canary
            .grace_period_seconds
            .map_or(DEFAULT_GRACE, |s| Duration::from_secs(u64::from(s)))
    }

    fn progress_deadline(&self) -> Duration {
        self.spec
            .strategy
            .canary
            .progress_deadline
            .as_ref()
            .and_then(|d| d.to_std().ok())
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE)
    }

    /// StepUpgrade: the step's canary pods, before its traffic rises.
    fn upgrade(&mut self, here: &Here) -> Flow {
        let (index, wanted) = (here.index, here.wanted);
        let traffic = traffic_at(self.spec, index - 1);
        self.canary().traffic = format!("{}%", traffic.unwrap_or(0));
        if self.observed.canary_ready >= wanted {
            let routes = !self.spec.strategy.canary.traffic_routings.is_empty() || self.observed.self_routed.is_some();
            let routed = step_traffic(self.spec, index).is_some() && routes;
            let next = if routed {
                StepState::StepTrafficRouting
            } else {
                StepState::StepPaused
            };
            self.note(Transition::CanaryReady {
                step: index,
                pods: wanted,
            });
            self.enter(index, next);
            return Flow::Next;
        }
        let deadline = self.progress_deadline();
        let self_routed = self.observed.self_routed.is_some();
        if here.in_state >= deadline {
            let cause = if self_routed {
                format!(
                    "the canary Revision {} was not Ready within {}s at step {index}",
                    or_not_made(&self.observed.canary_revision),
                    deadline.as_secs()
                )
            } else {
                format!(
                    "canary pods not ready within {}s: {}/{} ready at step {index}",
                    deadline.as_secs(),
                    self.observed.canary_ready,
                    wanted
                )
            };
            return Flow::Hold(self.fail(cause));
        }
        self.status.phase = Phase::Progressing;
        self.canary().message = if self_routed {
            format!(
                "step {index}: waiting for the canary Revision {} to be Ready",
                or_not_made(&self.observed.canary_revision)
            )
        } else {
            format!("step {index}: waiting for {wanted} canary pod(s) to be ready")
        };
        self.requeue_in(deadline - here.in_state, RequeueReason::Deadline);
        Flow::Hold(self.release_intent(StableTemplate::Live, wanted, traffic))
    }

    /// StepTrafficRouting: the step's share, held for the grace period (a
    /// self-routed workload: until its status reads the share back, then
    /// for a grace period only when one is set).
    fn route_traffic(&mut self, here: &Here) -> Flow {
        let index = here.index;
        let traffic = step_traffic(self.spec, index);
        self.canary().traffic = format!("{}%", traffic.unwrap_or(0));
        if let Some(routed) = self.observed.self_routed {
            let asked = super::knative::canary_percent(routed.share, traffic.unwrap_or(0));
            if routed.canary_percent != Some(asked) {
                let deadline = self.progress_deadline();
                if here.in_state >= deadline {
                    let cause = format!(
                        "the Knative Service did not route {asked}% to the canary Revision {} within {}s at step {index} (its status reads {})",
                        self.observed.canary_revision,
                        deadline.as_secs(),
                        routed
                            .canary_percent
                            .map_or("nothing yet".to_string(), |p| format!("{p}%"))
                    );
                    return Flow::Hold(self.fail(cause));
                }
                self.status.phase = Phase::Progressing;
                self.canary().message = format!(
                    "step {index}: routing {asked}% of requests to the canary Revision {}; waiting for the Service's status to read it back",
                    self.observed.canary_revision
                );
                self.requeue_in(deadline - here.in_state, RequeueReason::Deadline);
                return Flow::Hold(self.release_intent(StableTemplate::Live, here.wanted, traffic));
            }
        }
        let grace = match self.observed.self_routed {
            Some(_) if self.spec.strategy.canary.grace_period_seconds.is_none() => Duration::ZERO,
            _ => self.grace(),
        };
        if here.in_state >= grace {
            self.note(Transition::TrafficInForce {
                step: index,
                percent: traffic.unwrap_or(0),
            });
            self.enter(index, StepState::StepPaused);
            return Flow::Next;
        }
        self.status.phase = Phase::Progressing;
        self.canary().message = format!(
            "step {index}: routing {}% of traffic to the canary",
            traffic.unwrap_or(0)
        );
        self.requeue_in(grace - here.in_state, RequeueReason::Grace);
        Flow::Hold(self.release_intent(StableTemplate::Live, here.wanted, traffic))
    }

    /// StepAnalysis and StepPaused: the step's analysis, then its pause
    /// (a duration, or a promote signal).
    fn pause(&mut self, here: &Here, step: &CanaryStep) -> Flow {
        let (index, wanted) = (here.index, here.wanted);
        let traffic = traffic_at(self.spec, index);
        if let Some(waiting) = self.step_analysis_waits(index, step.pause.is_none()) {
            if waiting {
                return Flow::Hold(self.release_intent(StableTemplate::Live, wanted, traffic));
            }
            if step.pause.is_none() {
                self.enter(index, StepState::StepReady);
                return Flow::Next;
            }
        }
        let done = match step.pause.as_ref() {
            None => true,
            Some(pause) => match pause.duration.as_ref().and_then(|d| d.to_std().ok()) {
                Some(duration) if here.in_state >= duration => {
                    self.passed_by(format!("pause of {}s", duration.as_secs()));
                    true
                }
                Some(duration) => {
                    self.status.phase = Phase::Progressing;
                    self.canary().message = format!("step {index}: paused for {}s", duration.as_secs());
                    self.requeue_in(duration - here.in_state, RequeueReason::Pause);
                    false
                }
                None => self.promote_signal_received(index),
            },
        };
        if !done {
            return Flow::Hold(self.release_intent(StableTemplate::Live, wanted, traffic));
        }
        self.enter(index, StepState::StepReady);
        Flow::Next
    }

    /// StepReady: on to the next step, or to promotion after the last.
    fn finish_step(&mut self, index: u32) {
        if index < self.steps() {
            self.note(Transition::StepDone { step: index });
            self.enter(index + 1, StepState::StepUpgrade);
        } else {
            self.note(Transition::LastStepDone);
            self.status.phase = Phase::Promoting;
            self.enter(index, StepState::Completed);
        }
    }

    /// Folds the engine's measurements into the runs of this release.
    fn record_measurements(&mut self) {
        let now = self.observed.now.to_string();
        let rollout_id = self.status.rollout_id.clone();
        for measurement in &self.observed.measurements {
            let runs = &mut self.status.analysis_runs;
            let run = match runs
                .iter()
                .position(|r| r.name == measurement.run && r.rollout_id == rollout_id)
            {
                Some(i) => &mut runs[i],
                None => {
                    runs.retain(|r| r.name != measurement.run);
                    runs.push(AnalysisRun {
                        name: measurement.run.clone(),
                        template: measurement.template.clone(),
                        rollout_id: rollout_id.clone(),
                        ..AnalysisRun::default()
                    });
                    runs.last_mut().expect("just pushed")
                }
            };
            match measurement.outcome {
                Outcome::Successful => run.successful += 1,
                Outcome::Failed => run.failed += 1,
                Outcome::Inconclusive => run.inconclusive += 1,
            }
            run.last_measured_at = now.clone();
            run.message = measurement.message.clone();
        }
    }

    /// Fails the release on too many failed measurements; pauses it on too
    /// many inconclusive ones (a promote goes on without them); asks to be
    /// woken for the next measurement.
    fn judge_analysis(&mut self) -> Option<Intent> {
        for (run_name, template_name) in analysis::active_runs(self.spec, &self.status) {
            let Some(template) = analysis::template(self.spec, &template_name) else {
                continue;
            };
            let rollout_id = self.status.rollout_id.clone();
            let Some(run) = self
                .status
                .analysis_runs
                .iter()
                .find(|r| r.name == run_name && r.rollout_id == rollout_id)
                .cloned()
            else {
                continue;
            };
            if run.failed > template.failure_limit.unwrap_or(0) {
                return Some(self.fail(format!(
                    "analysis {template_name} failed {} time(s) ({run_name}): {}",
                    run.failed, run.message
                )));
            }
            if run.inconclusive > template.inconclusive_limit.unwrap_or(0) {
                let index = self.status.canary_status.as_ref().map_or(1, |c| c.current_step_index);
                match self.signal_for_this_release(Signal::Promote) {
                    Some(value) => {
                        self.note(Transition::AnalysisSkipped {
                            template: template_name.clone(),
                            by: signal::parse(&value).by,
                        });
                        self.status.last_promote_signal = value;
                        if let Some(run) = self.status.analysis_runs.iter_mut().find(|r| r.name == run_name) {
                            run.inconclusive = 0;
                        }
                    }
                    None => {
                        if self.status.phase != Phase::Paused {
                            self.note(Transition::AnalysisInconclusive {
                                template: template_name.clone(),
                            });
                        }
                        self.status.phase = Phase::Paused;
                        self.canary().message = format!(
                            "analysis {template_name} inconclusive {} time(s) ({run_name}): {}; paused: promote to go on without it, or abort",
                            run.inconclusive, run.message
                        );
                        let traffic = traffic_at(self.spec, index);
                        let wanted = self.observed.canary_ready;
                        return Some(self.release_intent(StableTemplate::Live, wanted, traffic));
                    }
                }
            }
        }
        None
    }

    /// Wakes the agent for the next measurement of every run active in the
    /// state this reconcile ends in (at once for a run not measured yet).
    fn requeue_for_analysis(&mut self) {
        for (run_name, template_name) in analysis::active_runs(self.spec, &self.status) {
            let Some(template) = analysis::template(self.spec, &template_name) else {
                continue;
            };
            let last = self
                .status
                .analysis_runs
                .iter()
                .find(|r| r.name == run_name && r.rollout_id == self.status.rollout_id)
                .map(|r| r.last_measured_at.clone());
            let wait = match last {
                Some(last) => analysis::interval(template).saturating_sub(elapsed(&last, self.observed.now)),
                None => Duration::ZERO,
            };
            self.requeue_in(wait, RequeueReason::Analysis);
        }
    }

    /// For a step with analysis: `Some(true)` while it must wait for
    /// measurements, `Some(false)` once they suffice (`count` successes
    /// without a pause; one success with one), `None` without analysis.
    fn step_analysis_waits(&mut self, index: u32, no_pause: bool) -> Option<bool> {
        let step = self.spec.strategy.canary.steps.get(index as usize - 1)?;
        let template_name = step.analysis.as_ref()?.template_ref.clone();
        let template = analysis::template(self.spec, &template_name)?;
        let needed = if no_pause {
            template.count.unwrap_or(analysis::DEFAULT_COUNT).max(1)
        } else {
            1
        };
        let run_name = analysis::step_run(index);
        let successful = self
            .status
            .analysis_runs
            .iter()
            .find(|r| r.name == run_name && r.rollout_id == self.status.rollout_id)
            .map_or(0, |r| r.successful);
        if successful >= needed {
            if no_pause {
                self.passed_by(format!(
                    "analysis {template_name}: {successful} successful measurement(s)"
                ));
            }
            return Some(false);
        }
        if no_pause || self.pause_over(index) {
            self.status.phase = Phase::Progressing;
            self.canary().message =
                format!("step {index}: analysis {template_name}: {successful}/{needed} successful measurement(s)");
            return Some(true);
        }
        Some(false)
    }

    /// Whether the step's timed pause has run out.
    fn pause_over(&self, index: u32) -> bool {
        let step = &self.spec.strategy.canary.steps[index as usize - 1];
        let Some(duration) = step
            .pause
            .as_ref()
            .and_then(|p| p.duration.as_ref())
            .and_then(|d| d.to_std().ok())
        else {
            return false;
        };
        let started = self
            .status
            .canary_status
            .as_ref()
            .map_or("", |c| c.state_started_at.as_str());
        elapsed(started, self.observed.now) >= duration
    }

    fn passed_by(&mut self, by: String) {
        if let Some(last) = self.status.step_history.last_mut() {
            last.passed_by = by;
        }
    }

    fn promote_signal_received(&mut self, index: u32) -> bool {
        match self.signal_for_this_release(Signal::Promote) {
            Some(value) => {
                self.passed_by(format!("promoted by {}", signal::parse(&value).by));
                self.status.last_promote_signal = value;
                self.note(Transition::GatePassed { step: index });
                true
            }
            None => {
                self.status.phase = Phase::Paused;
                self.canary().message = format!("step {index}: waiting for promote");
                false
            }
        }
    }

    /// The stable workload takes the canary template; once it is rolled
    /// out, traffic returns to it and the canary is removed.
    fn promote(&mut self, index: u32) -> Intent {
        let observed = self.observed;
        let last = self.step_at(index);
        let wanted = step_replicas(&last, observed.replicas);
        if !observed.stable_rolled_out {
            self.canary().message = if observed.self_routed.is_some() {
                format!(
                    "promoting: moving all traffic to the canary Revision {}",
                    observed.canary_revision
                )
            } else {
                "promoting: the stable workload is rolling out the new template".into()
            };
            let traffic = traffic_at(self.spec, index);
            return self.release_intent(StableTemplate::Git, wanted, traffic);
        }
        self.note(Transition::Promoted {
            rollout_id: self.status.rollout_id.clone(),
        });
        self.promoted = true;
        if let Some(last) = self.status.step_history.last_mut() {
            last.finished_at = observed.now.to_string();
        }
        self.status.pending_writeback = Some(PendingWriteback {
            action: WritebackAction::Promote,
            rollout_id: self.status.rollout_id.clone(),
            stable_commit: self.status.stable_commit.clone(),
            canary_commit: self.status.canary_commit.clone(),
            cause: String::new(),
            at: observed.now.to_string(),
        });
        self.status.phase = Phase::Healthy;
        self.status.stable_template_hash = self.status.canary_template_hash.clone();
        self.status.canary_template_hash.clear();
        self.status.stable_commit = std::mem::take(&mut self.status.canary_commit);
        self.status.stable_revision = self.status.canary_revision.clone();
        let canary = self.canary();
        canary.current_step_state = StepState::Completed;
        canary.canary_ready_replicas = 0;
        canary.traffic = "0%".into();
        canary.message = "promoted".into();
        canary.state_started_at = observed.now.to_string();
        Intent::steady(StableTemplate::Git)
    }
}

#[cfg(test)]
mod tests;
