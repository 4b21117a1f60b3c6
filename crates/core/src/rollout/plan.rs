//! The rollout planner: a pure function from (spec, previous status, what
//! was observed, the clock, signals) to the next status and the intent the
//! engine turns into objects. Every decision of a release is made here.

use std::time::Duration;

use jiff::Timestamp;

use super::analysis::{self, Measurement, Outcome};
use super::api::{
    AnalysisRun, CanaryStatus, CanaryStep, IntOrPercent, OnFailure, PendingWriteback, Phase, RolloutSpec,
    RolloutStatus, Signal, StepRecord, StepState, SupersededRelease, WritebackAction, WrittenBack,
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
    /// Replicas of the workload as this sync writes them: Git's, or the
    /// autoscaler's count where one decides them.
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
    /// The release's HTTPRoutes, read while a step's traffic is being
    /// routed; `None` when this pass did not read them.
    pub routes: Option<Vec<RouteSeen>>,
    /// What the agent wrote to Git for this Rollout's pending write-back
    /// since the status was written: recorded in the status by this plan.
    pub written_back: Option<WrittenBack>,
    /// Every live stable Service of the release's routings selects the
    /// stable revision alone; read only while a canary Deployment may be
    /// about to make its first pods.
    pub stable_services_pinned: bool,
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
    /// The canary Revision is Ready with no pod (scaled to zero): its share
    /// is not in force until one runs.
    pub canary_scaled_to_zero: bool,
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
    /// Requests sent to the canary whatever the percent (with `traffic` only),
    /// the headers changed on them, and the share of the stable's requests
    /// copied to the canary.
    pub matches: Vec<super::api::RequestMatch>,
    pub header_modifier: Option<super::api::HeaderModifier>,
    pub mirror: Option<u32>,
    /// The canary's objects stay this pass (none is deleted): a route may
    /// still send it requests.
    pub hold_canary: bool,
    /// Pin the stable Service to the stable revision: while a canary
    /// Deployment's pods exist or are about to, at a step that routes
    /// requests (always, for blue-green), and while they are removed.
    pub pin_stable_service: bool,
    /// The canary Deployment waits (is neither made nor deleted) until the
    /// live stable Service is pinned: its pods would match the Service's
    /// own selector and take a share of its requests.
    pub await_pin: bool,
    /// The canary Service selects the canary pods and routes may name it:
    /// canary pods run a known revision and the Rollout keeps a canary Service.
    pub route_canary: bool,
    pub rollout_id: String,
}

impl Intent {
    /// What a step's routes carry, while one is in force.
    pub fn step_route(&self) -> Option<StepRoute> {
        Some(StepRoute {
            percent: self.traffic?,
            matches: self.matches.clone(),
            header_modifier: self.header_modifier.clone(),
            mirror: self.mirror,
        })
    }

    fn steady(stable_template: StableTemplate) -> Intent {
        Intent {
            stable_template,
            canary_replicas: None,
            traffic: None,
            matches: Vec::new(),
            header_modifier: None,
            mirror: None,
            hold_canary: false,
            pin_stable_service: false,
            await_pin: false,
            route_canary: false,
            rollout_id: String::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub status: RolloutStatus,
    /// The status differs from the one observed: it is written.
    pub changed: bool,
    /// The step whose canary pods are labelled with their batch, if any.
    pub batch_step: Option<u32>,
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

/// The workload's stable and canary revisions (ReplicaSet hashes,
/// ControllerRevisions or Knative Revisions), as observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revisions {
    pub stable: String,
    pub canary: String,
}

/// The canary's percent of all requests when it takes `traffic` percent of
/// the release's `share`; rounded, so that Knative's whole percents add up.
pub fn canary_percent(share: u32, traffic: u32) -> u32 {
    (share * traffic.min(100) + 50) / 100
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
    routes::route(spec, observed, &mut intent);
    // The canary's objects go once no route sends to it and the gateway took that route.
    intent.hold_canary =
        intent.canary_replicas.is_none() && observed.routes.as_deref().and_then(routes::still_to_canary).is_some();
    if intent.hold_canary {
        planner.requeue_in(routes::RECHECK, RequeueReason::Grace);
    }
    if intent.await_pin {
        // A pin that never reads back (refused by a policy, say) is looked
        // for once a second, not five times, until the progress deadline.
        let waited = previous
            .canary_status
            .as_ref()
            .is_some_and(|c| c.message == routes::AWAITING_PIN);
        planner.canary().message = routes::AWAITING_PIN.to_string();
        if waited {
            planner.requeue_in(routes::RECHECK, RequeueReason::Grace);
        } else {
            // Once only (the next pass has waited), so it cannot spin.
            planner.requeue_unfloored(routes::PIN_RECHECK, RequeueReason::Grace);
        }
    }
    let mut status = planner.status;
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
    // Decided once: whether the status moved (then lastUpdateTime moves and
    // the status is written), and the step whose canary pods get the batch
    // label (pods of the last batch may become ready as it is promoted).
    let changed = status != *previous;
    if changed && let Some(canary) = status.canary_status.as_mut() {
        canary.last_update_time = observed.now.to_string();
    }
    let step = status.canary_status.as_ref().map_or(0, |c| c.current_step_index);
    let batch_step = ((intent.canary_replicas.is_some() || planner.promoted) && step > 0).then_some(step);
    Plan {
        status,
        changed,
        batch_step,
        intent,
        requeue: planner.requeue,
        transitions: planner.transitions,
        failed: planner.failed,
        promoted: planner.promoted,
        ignored_signals: planner.ignored_signals,
    }
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
        self.requeue_unfloored(after.max(Duration::from_millis(100)), reason);
    }

    /// [`Planner::requeue_in`] without its floor of 100 ms, which keeps a
    /// plan that asks again every pass from spinning: for a look that is
    /// asked for once.
    fn requeue_unfloored(&mut self, after: Duration, reason: RequeueReason) {
        let at = jiff::SignedDuration::try_from(after)
            .ok()
            .and_then(|after| self.observed.now.checked_add(after).ok());
        self.requeue = Requeue::sooner(self.requeue, Some(Requeue { after, reason, at }));
    }

    fn canary(&mut self) -> &mut CanaryStatus {
        self.status.canary_status.get_or_insert_with(CanaryStatus::default)
    }

    /// The pending write-back the agent wrote to Git is done: the status
    /// names its commit. Only the same release's same action counts.
    fn record_written_back(&mut self) {
        let (Some(pending), Some(written)) = (&self.status.pending_writeback, &self.observed.written_back) else {
            return;
        };
        if written.is_done_of(pending) {
            self.status.pending_writeback = None;
            self.status.written_back = Some(written.clone());
        }
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
        self.record_written_back();
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
            self.status.refused_commit.clear();
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
            self.status.refused_commit = observed.commit.clone();
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
        self.status.refused_commit.clear();
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
        // Nothing of the superseded release's step stays in force.
        self.status.canary_status = Some(CanaryStatus {
            traffic: "0%".into(),
            state_started_at: observed.now.to_string(),
            ..CanaryStatus::default()
        });
        if *git == self.status.stable_template_hash {
            self.canary().message = format!("fast rollback: {reason}");
            return Some(Intent::steady(StableTemplate::Git));
        }
        // The newer template starts as a first one would: refused on the same checks.
        Some(self.idle())
    }

    fn abort_if_asked(&mut self) -> Option<Intent> {
        let value = self.signal_for_this_release(Signal::Abort)?;
        let cause = format!("aborted by {}", signal::parse(&value).by);
        self.status.last_abort_signal = value;
        Some(self.fail(cause))
    }

    /// The signal's annotation value when it is one not acted on yet.
    fn new_signal(&self, kind: Signal) -> Option<&String> {
        let (value, last) = match kind {
            Signal::Promote => (&self.observed.promote_signal, &self.status.last_promote_signal),
            Signal::Abort => (&self.observed.abort_signal, &self.status.last_abort_signal),
        };
        signal::unspent(value.as_ref(), last)
    }

    /// The signal's annotation value when it is new and names the running
    /// release; the rest is left to `discard_unused_signals`.
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
}

mod hooks;
mod measure;
mod requeue;
mod routes;
mod steps;
mod transition;

pub use routes::{
    GatewaySeen, MIRROR_FEATURE, PERCENT_MIRROR_FEATURE, RouteSeen, StepRoute, is_service_ref, mirror_problem,
    seen as route_seen, supported_features,
};
use routes::{step_traffic, traffic_at};

pub use requeue::{Requeue, RequeueReason};
pub use transition::{Severity, Transition};

#[cfg(test)]
mod tests;
