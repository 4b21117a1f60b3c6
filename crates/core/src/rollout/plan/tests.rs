use super::*;
use crate::rollout::analysis;
use crate::rollout::api::{
    CanaryStep, CanaryStrategy, IntOrPercent, Pause, Strategy, Style, TrafficRouting, WorkloadRef, WritebackAction,
};

/// A step with nothing set: `step().traffic("10%").replicas(1).pause_for(60)`.
fn step() -> CanaryStep {
    CanaryStep {
        traffic: None,
        replicas: None,
        pause: None,
        analysis: None,
        matches: Vec::new(),
        request_header_modifier: None,
        mirror: None,
    }
}

trait StepBuilder {
    fn traffic(self, percent: &str) -> Self;
    fn replicas(self, count: i32) -> Self;
    fn replicas_percent(self, percent: &str) -> Self;
    /// A timed pause.
    fn pause_for(self, seconds: u64) -> Self;
    /// An indefinite pause: waits for a promote.
    fn pause_until_promoted(self) -> Self;
}

impl StepBuilder for CanaryStep {
    fn traffic(mut self, percent: &str) -> Self {
        self.traffic = Some(percent.to_string());
        self
    }
    fn replicas(mut self, count: i32) -> Self {
        self.replicas = Some(IntOrPercent::Int(count));
        self
    }
    fn replicas_percent(mut self, percent: &str) -> Self {
        self.replicas = Some(IntOrPercent::Percent(percent.to_string()));
        self
    }
    fn pause_for(mut self, seconds: u64) -> Self {
        self.pause = Some(Pause {
            duration: Some(super::super::api::Duration::Seconds(seconds)),
        });
        self
    }
    fn pause_until_promoted(mut self) -> Self {
        self.pause = Some(Pause { duration: None });
        self
    }
}

/// Three steps: 10% for 60 s, 50% until promoted, 100%.
fn spec() -> RolloutSpec {
    RolloutSpec {
        workload_ref: WorkloadRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "echo".into(),
        },
        rollout_id: None,
        analysis_templates: vec![],
        hooks: Default::default(),
        notify: Vec::new(),
        strategy: Strategy {
            canary: CanaryStrategy {
                steps: vec![
                    step().traffic("10%").replicas(1).pause_for(60),
                    step().traffic("50%").replicas_percent("50%").pause_until_promoted(),
                    step().traffic("100%").replicas_percent("100%"),
                ],
                traffic_routings: vec![TrafficRouting {
                    service: "echo".into(),
                    ..TrafficRouting::default()
                }],
                ..CanaryStrategy::default()
            },
            ..Strategy::default()
        },
    }
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("a valid time")
}

fn observed(git: &str, now: i64) -> Observed {
    Observed {
        commit: format!("{git}-commit-0123456789"),
        git_template_hash: git.into(),
        workload_exists: true,
        workload_stable_hash: Some("v1".into()),
        git_matches_live: git == "v1",
        replicas: 4,
        stable_revision: "stable-pods".into(),
        canary_revision: "canary-pods".into(),
        now: at(now),
        routes: Some(Vec::new()),
        ..Observed::default()
    }
}

/// Runs the planner as the engine would: status carried from one call to the next.
struct Run {
    spec: RolloutSpec,
    status: RolloutStatus,
}

impl Run {
    fn new() -> Run {
        Run::with(spec())
    }
    fn with(spec: RolloutSpec) -> Run {
        Run {
            spec,
            status: RolloutStatus::default(),
        }
    }
    fn step(&mut self, observed: &Observed) -> Plan {
        let plan = plan(&self.spec, &self.status, observed);
        self.status = plan.status.clone();
        plan
    }
    /// A signal's token for the release running now, as the CLI sends it.
    fn token(&self, by: &str) -> String {
        let release = signal::Release::running("", &self.status).expect("a release is running");
        signal::token(&release, by)
    }
    fn state(&self) -> (Phase, u32, StepState) {
        let canary = self.status.canary_status.clone().unwrap_or_default();
        (self.status.phase, canary.current_step_index, canary.current_step_state)
    }
}

#[test]
fn an_unchanged_template_is_healthy_and_adopted_without_a_release() {
    let mut run = Run::new();
    let mut seen = without_canary(observed("v1", 0));
    seen.workload_stable_hash = None; // a running Deployment gets a Rollout
    let plan = run.step(&seen);
    assert_eq!(run.status.phase, Phase::Healthy);
    assert_eq!(plan.intent, Intent::steady(StableTemplate::Git));
    assert_eq!(run.status.stable_template_hash, "v1");
}

#[test]
fn a_workload_created_with_its_rollout_starts_no_release() {
    let mut run = Run::new();
    let mut seen = observed("v1", 0);
    seen.workload_exists = false;
    seen.workload_stable_hash = None;
    seen.git_matches_live = false;
    assert_eq!(run.step(&seen).intent.canary_replicas, None);
    assert_eq!(run.status.phase, Phase::Healthy);
}

/// A rebuilt cluster: no workload, no status, and Git's status file says v2 was promoted.
/// The intent while a removed canary's pods still run: nothing of the
/// canary, and the stable Service kept on the stable pods.
fn removing_canary(stable_template: StableTemplate) -> Intent {
    Intent {
        pin_stable_service: true,
        ..Intent::steady(stable_template)
    }
}

/// What is observed once no canary pod runs.
fn without_canary(mut seen: Observed) -> Observed {
    seen.canary_revision.clear();
    seen
}

fn rebuilt(git: &str) -> Observed {
    let mut seen = without_canary(observed(git, 0));
    seen.stable_revision.clear();
    seen.workload_exists = false;
    seen.workload_stable_hash = None;
    seen.git_matches_live = false;
    seen.resumed = Some(Resumed {
        from: ".gitcanary/status/ns/echo.yaml at 0123abc".into(),
        stable_commit: "v2-commit".into(),
        stable_template_hash: "v2".into(),
        ..Resumed::default()
    });
    seen
}

#[test]
fn a_rebuilt_cluster_runs_the_promoted_template_and_releases_the_newer_one() {
    let mut run = Run::new();
    let plan = run.step(&rebuilt("v3"));
    assert_eq!(run.status.stable_template_hash, "v2");
    assert_eq!(run.status.stable_commit, "v2-commit");
    assert_eq!(run.status.resumed_from_git, ".gitcanary/status/ns/echo.yaml at 0123abc");
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepUpgrade));
    assert_eq!(
        plan.intent.stable_template,
        StableTemplate::Live,
        "stable runs the recorded template"
    );
    assert_eq!(plan.intent.canary_replicas, Some(1));

    // Git still on the promoted version: nothing to release.
    let mut run = Run::new();
    assert_eq!(run.step(&rebuilt("v2")).intent.canary_replicas, None);
    assert_eq!(run.status.phase, Phase::Healthy);
}

#[test]
fn a_held_failure_in_git_is_not_released_again_on_a_rebuilt_cluster() {
    let mut seen = rebuilt("v3");
    if let Some(resumed) = seen.resumed.as_mut() {
        resumed.failed_commit = "v3-commit".into();
        resumed.failed_template_hash = "v3".into();
        resumed.cause = "canary pods not ready within 3s".into();
    }
    let mut run = Run::new();
    let plan = run.step(&seen);
    assert_eq!(plan.intent, Intent::steady(StableTemplate::Live));
    assert_eq!(run.status.phase, Phase::Failed);
    let message = run.status.canary_status.clone().unwrap_or_default().message;
    assert!(
        message.contains("not released again") && message.contains("not ready within 3s"),
        "{message}"
    );
    // Later syncs keep holding, and a fix in Git (v4) is released.
    seen.resumed = None;
    assert_eq!(run.step(&seen).intent.canary_replicas, None);
    assert_eq!(run.step(&observed("v4", 10)).intent.canary_replicas, Some(1));
}

#[test]
fn a_new_template_walks_every_step_and_promotes() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));

    // Step 1: canary pods first, no traffic yet.
    let plan = run.step(&observed("v2", 10));
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepUpgrade));
    assert_eq!(plan.intent.stable_template, StableTemplate::Live);
    assert_eq!(plan.intent.canary_replicas, Some(1));
    assert_eq!(plan.intent.traffic, None);
    assert_eq!(run.status.rollout_id, "v2-comm");
    assert_eq!(run.status.canary_commit, "v2-commit-0123456789");

    // Pods ready: 10% of traffic, then the grace period.
    let mut seen = observed("v2", 20);
    seen.canary_ready = 1;
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    assert_eq!(plan.intent.traffic, Some(10));
    assert!(plan.intent.pin_stable_service);
    assert_eq!(plan.requeue.map(|r| r.after), Some(DEFAULT_GRACE));

    // Grace over: the 60 s pause.
    seen.now = at(23);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepPaused));
    assert_eq!(plan.requeue.map(|r| r.after), Some(Duration::from_secs(60)));
    assert_eq!(plan.intent.traffic, Some(10));

    // Pause over: step 2 scales the canary to 50% of 4 while traffic stays at 10%.
    seen.now = at(83);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 2, StepState::StepUpgrade));
    assert_eq!(plan.intent.canary_replicas, Some(2));
    assert_eq!(plan.intent.traffic, Some(10));
    assert_eq!(plan.batch_step, Some(2));

    // Ready at 2, routed at 50%, then paused until promoted.
    seen.canary_ready = 2;
    seen.now = at(90);
    run.step(&seen);
    seen.now = at(94);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Paused, 2, StepState::StepPaused));
    assert_eq!(plan.intent.traffic, Some(50));
    assert_eq!(
        plan.requeue.map(|r| r.after),
        None,
        "an indefinite pause waits for a signal, not a timer"
    );
    assert!(
        run.status
            .canary_status
            .as_ref()
            .unwrap()
            .message
            .contains("waiting for promote")
    );

    seen.promote_signal = Some(run.token("2026-11-30T10:00:00Z"));
    seen.now = at(200);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 3, StepState::StepUpgrade));
    assert_eq!(plan.intent.canary_replicas, Some(4));

    // Step 3 (100%) has no pause: straight to promoting once routed.
    seen.canary_ready = 4;
    seen.now = at(210);
    run.step(&seen);
    seen.now = at(214);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Promoting, 3, StepState::Completed));
    assert_eq!(plan.intent.stable_template, StableTemplate::Git);
    assert_eq!(
        plan.intent.traffic,
        Some(100),
        "traffic stays on the canary while stable rolls out"
    );
    assert!(
        !plan.intent.pin_stable_service,
        "stable pods change revision while promoting"
    );
    assert!(!plan.promoted);

    seen.stable_rolled_out = true;
    seen.now = at(230);
    let plan = run.step(&seen);
    assert!(plan.promoted);
    assert_eq!(run.status.phase, Phase::Healthy);
    assert_eq!(plan.intent, removing_canary(StableTemplate::Git));
    assert_eq!(run.status.stable_template_hash, "v2");
    assert_eq!(run.status.stable_commit, "v2-commit-0123456789");
    assert!(run.status.canary_template_hash.is_empty());
    let pending = run.status.pending_writeback.clone().expect("a promote to write to Git");
    assert_eq!(pending.action, WritebackAction::Promote);
    assert_eq!(pending.canary_commit, "v2-commit-0123456789");
    assert_eq!(pending.stable_commit, "v1-commit-0123456789");
    let history: Vec<(u32, &str)> = run
        .status
        .step_history
        .iter()
        .map(|r| (r.step, r.passed_by.as_str()))
        .collect();
    assert_eq!(
        history,
        vec![(1, "pause of 60s"), (2, "promoted by 2026-11-30T10:00:00Z"), (3, "")]
    );
    assert!(run.status.step_history.iter().all(|r| !r.finished_at.is_empty()));
}

#[test]
fn one_promote_signal_passes_one_pause_only() {
    let mut spec = spec();
    spec.strategy.canary.steps = vec![
        step().replicas(1).pause_until_promoted(),
        step().replicas(2).pause_until_promoted(),
    ];
    let mut run = Run::with(spec);
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 2;
    run.step(&seen);
    assert_eq!(run.state(), (Phase::Paused, 1, StepState::StepPaused));
    seen.promote_signal = Some(run.token("token-1"));
    run.step(&seen);
    assert_eq!(
        run.state(),
        (Phase::Paused, 2, StepState::StepPaused),
        "token-1 passed step 1 only"
    );
    seen.now = at(50);
    run.step(&seen);
    assert_eq!(
        run.state(),
        (Phase::Paused, 2, StepState::StepPaused),
        "the same token is not used twice"
    );
    seen.promote_signal = Some(run.token("token-2"));
    run.step(&seen);
    assert_eq!(run.status.phase, Phase::Promoting);
}

#[test]
fn a_promote_sent_while_healthy_is_spent_and_the_next_release_stops_at_its_pause() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v1", 1);
    seen.promote_signal = Some("by hand".into());
    let plan = run.step(&seen);
    assert_eq!(plan.ignored_signals, vec![(Signal::Promote, "by hand".to_string())]);
    assert!(
        matches!(&plan.transitions[..], [Transition::SignalIgnored { .. }]),
        "{:?}",
        plan.transitions
    );
    assert!(
        run.status.ignored_signal.contains("ignored"),
        "{}",
        run.status.ignored_signal
    );
    // The annotation is still there (not cleared yet) when v2 arrives.
    let mut seen = observed("v2", 2);
    seen.promote_signal = Some("by hand".into());
    seen.canary_ready = 2;
    for now in (2..400).step_by(5) {
        seen.now = at(now);
        run.step(&seen);
    }
    assert_eq!(
        run.state(),
        (Phase::Paused, 2, StepState::StepPaused),
        "the old promote passed no gate"
    );
}

#[test]
fn a_promote_for_another_release_is_ignored_with_both_releases_named() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 2;
    for now in (1..400).step_by(5) {
        seen.now = at(now);
        run.step(&seen);
    }
    assert_eq!(run.state(), (Phase::Paused, 2, StepState::StepPaused));
    let old = signal::Release {
        uid: String::new(),
        canary_commit: "1a2b3c4-old-commit".into(),
        rollout_id: "1a2b3c4".into(),
    };
    seen.promote_signal = Some(signal::token(&old, "the CLI"));
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Paused, 2, StepState::StepPaused));
    assert_eq!(
        run.status.ignored_signal,
        "promote for release 1a2b3c4 ignored: the running release is v2-comm"
    );
    assert_eq!(plan.ignored_signals.len(), 1);
    // Another Rollout with the same name (deleted and re-created) is another release.
    let mut other = signal::Release::running("", &run.status).unwrap();
    other.uid = "another-uid".into();
    seen.promote_signal = Some(signal::token(&other, "the CLI"));
    run.step(&seen);
    assert_eq!(run.state(), (Phase::Paused, 2, StepState::StepPaused));
}

#[test]
fn a_promote_during_a_timed_pause_is_spent_not_kept_for_the_next_pause() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    for now in [1, 5, 10] {
        seen.now = at(now);
        run.step(&seen);
    }
    assert_eq!(
        run.state(),
        (Phase::Progressing, 1, StepState::StepPaused),
        "in the 60s pause"
    );
    seen.promote_signal = Some(run.token("too early"));
    let plan = run.step(&seen);
    assert_eq!(plan.ignored_signals.len(), 1);
    assert!(
        run.status.ignored_signal.contains("timed pause"),
        "{}",
        run.status.ignored_signal
    );
    seen.canary_ready = 2;
    for now in [80, 90, 94, 100, 200] {
        seen.now = at(now);
        run.step(&seen);
    }
    assert_eq!(run.state(), (Phase::Paused, 2, StepState::StepPaused));
}

#[test]
fn an_abort_when_no_release_runs_is_spent_and_aborts_nothing_later() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v1", 1);
    seen.abort_signal = Some("by hand".into());
    let plan = run.step(&seen);
    assert_eq!(plan.ignored_signals, vec![(Signal::Abort, "by hand".to_string())]);
    seen = observed("v2", 2);
    seen.abort_signal = Some("by hand".into());
    let plan = run.step(&seen);
    assert_eq!(plan.failed, None);
    assert_eq!(run.status.phase, Phase::Progressing);
}

#[test]
fn canary_pods_not_ready_by_the_deadline_fail_the_release_and_it_is_not_retried() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    run.step(&observed("v2", 0));
    let plan = run.step(&observed("v2", 599));
    assert_eq!(plan.failed, None);
    assert_eq!(plan.requeue.map(|r| r.after), Some(Duration::from_secs(1)));
    // Counted from the moment the plan read, not from when its sync began.
    assert_eq!(plan.requeue.and_then(|r| r.at), Some(at(600)));
    let plan = run.step(&observed("v2", 600));
    assert_eq!(run.status.phase, Phase::Failed);
    let cause = plan.failed.expect("failed");
    let pending = run.status.pending_writeback.clone().expect("a revert to write to Git");
    assert_eq!(
        (pending.action, pending.cause.as_str()),
        (WritebackAction::Revert, cause.as_str())
    );
    assert!(cause.contains("not ready within 600s: 0/1 ready at step 1"), "{cause}");
    assert_eq!(plan.intent, removing_canary(StableTemplate::Live));
    // Git still asks for v2: it stays failed and keeps stable.
    let plan = run.step(&without_canary(observed("v2", 700)));
    assert_eq!(run.status.phase, Phase::Failed);
    assert_eq!(plan.intent, Intent::steady(StableTemplate::Live));
    assert!(plan.failed.is_none() && plan.transitions.is_empty());
    // A human commit back to v1 makes it healthy.
    run.step(&observed("v1", 800));
    assert_eq!(run.status.phase, Phase::Healthy);
}

#[test]
fn abort_sends_traffic_back_and_removes_the_canary() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    seen.abort_signal = Some(run.token("abort-1"));
    let plan = run.step(&seen);
    assert_eq!(plan.failed.as_deref(), Some("aborted by abort-1"));
    assert_eq!(plan.intent.canary_replicas, None);
    assert_eq!(plan.intent.traffic, None);
    assert_eq!(run.status.canary_status.as_ref().unwrap().traffic, "0%");
}

#[test]
fn a_commit_back_to_stable_mid_release_is_a_fast_rollback() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    let plan = run.step(&observed("v1", 5));
    assert_eq!(run.status.phase, Phase::Healthy);
    assert_eq!(plan.intent, removing_canary(StableTemplate::Git));
    assert_eq!(run.status.superseded.len(), 1);
    assert_eq!(run.status.superseded[0].commit, "v2-commit-0123456789");
}

#[test]
fn a_third_template_restarts_from_step_one() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    seen.now = at(10);
    run.step(&seen);
    assert_eq!(run.state().1, 1);
    let mut third = observed("v3", 20);
    third.canary_ready = 0;
    let plan = run.step(&third);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepUpgrade));
    assert_eq!(run.status.canary_template_hash, "v3");
    assert_eq!(run.status.superseded[0].reason, "a newer template arrived");
    assert_eq!(plan.intent.traffic, None, "traffic waits for the new canary pods");
}

#[test]
fn a_selector_conflict_refuses_the_release_until_fixed() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.start_problem = Some("label version=base is overridden".into());
    let plan = run.step(&seen);
    assert_eq!(run.status.phase, Phase::Failed);
    assert_eq!(plan.intent.canary_replicas, None);
    assert!(
        run.status.failed_template_hash.is_empty(),
        "the template itself did not fail"
    );
    seen.start_problem = None;
    run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepUpgrade));
}

#[test]
fn a_newer_template_mid_release_is_refused_as_a_first_one_would_be() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    assert_eq!(run.state().0, Phase::Progressing);
    let mut third = observed("v3", 20);
    third.start_problem = Some("label version=base is overridden".into());
    let plan = run.step(&third);
    assert_eq!(run.status.superseded[0].reason, "a newer template arrived");
    assert_eq!(run.status.phase, Phase::Failed, "v3 must meet the checks v2 met");
    assert_eq!(run.status.refused_commit, "v3-commit-0123456789");
    assert_eq!(
        plan.intent,
        removing_canary(StableTemplate::Live),
        "back to stable, no v3 canary"
    );
    assert!(run.status.canary_template_hash.is_empty());
    let canary = run.status.canary_status.as_ref().expect("canary status");
    assert_eq!(
        (canary.traffic.as_str(), canary.current_step_index),
        ("0%", 0),
        "nothing of v2's step is shown as in force"
    );
    assert_eq!(canary.message, "label version=base is overridden");
}

#[test]
fn replicas_round_up_and_follow_traffic_when_unset() {
    assert_eq!(
        step_replicas(&step().traffic("10%"), 1),
        1,
        "one replica at 10% is one canary pod"
    );
    assert_eq!(
        step_replicas(&step().traffic("10%"), 0),
        0,
        "a workload of zero replicas has no canary pods"
    );
    assert_eq!(step_replicas(&step().replicas_percent("50%"), 3), 2);
    assert_eq!(step_replicas(&step().replicas_percent("34%"), 3), 2);
    assert_eq!(step_replicas(&step().replicas(9), 3), 3, "never more than the workload");
    assert_eq!(step_replicas(&step().traffic("0%"), 5), 1);
    assert_eq!(step_replicas(&step(), 5), 1);
}

#[test]
fn zero_replicas_and_steps_without_traffic_still_progress() {
    let mut spec = spec();
    spec.strategy.canary.steps = vec![step(), step()];
    let mut run = Run::with(spec);
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.replicas = 0;
    let plan = run.step(&seen);
    assert_eq!(run.status.phase, Phase::Promoting, "{:?}", plan.transitions);
    assert_eq!(plan.intent.traffic, None, "no step routes traffic");
}

#[test]
fn planning_twice_from_the_same_status_gives_the_same_answer() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    let first = plan(&run.spec, &run.status, &seen);
    let second = plan(&run.spec, &run.status, &seen);
    assert_eq!(first.status, second.status);
    assert_eq!(first.intent, second.intent);
}

/// One analysed step (traffic 10%, no pause) then 100%; the template wants
/// two successes, tolerates no failure and one inconclusive measurement.
fn analysed_spec(background: bool) -> RolloutSpec {
    let mut spec = spec();
    let template = serde_json::from_value(serde_json::json!({
        "name": "errors", "interval": 10, "count": 2, "failureLimit": 0, "inconclusiveLimit": 1,
        "metrics": [{"name": "error-ratio", "query": "max(errors{service=\"{{canaryService}}\"})", "successCondition": "< 0.01"}]
    }))
    .expect("template");
    spec.analysis_templates = vec![template];
    let mut first = step().traffic("10%").replicas(1);
    if background {
        first = first.pause_for(60);
    }
    if !background {
        first.analysis = Some(crate::rollout::api::StepAnalysis {
            template_ref: "errors".into(),
        });
    }
    spec.strategy.canary.steps = vec![first, step().traffic("100%")];
    if background {
        spec.strategy.canary.analysis = Some(crate::rollout::api::StepAnalysis {
            template_ref: "errors".into(),
        });
    }
    spec
}

/// The release `observed("v2", _)` starts.
fn v2_release() -> String {
    let commit = observed("v2", 0).commit;
    format!("{}@{commit}", release_id(None, &commit))
}

fn measured(run: &str, outcome: Outcome) -> Measurement {
    Measurement {
        release: v2_release(),
        run: run.into(),
        template: "errors".into(),
        outcome,
        message: format!("error-ratio {outcome:?}: 0.5 against `< 0.01`"),
    }
}

/// A release of v2 brought to step 1 with its traffic in force.
fn release_at_analysis(spec: RolloutSpec) -> (Run, Observed) {
    let mut run = Run::with(spec);
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    seen.now = at(5);
    run.step(&seen);
    (run, seen)
}

#[test]
fn the_planner_wakes_exactly_when_observe_finds_the_next_measurement_due() {
    let (mut run, mut seen) = release_at_analysis(analysed_spec(false));
    seen.measurements = vec![measured("step-1", Outcome::Successful)];
    run.step(&seen);
    seen.measurements.clear();
    seen.now = at(8);
    let wait = run
        .step(&seen)
        .requeue
        .map(|r| r.after)
        .expect("woken for the next measurement");
    assert_eq!(wait, Duration::from_secs(7), "measured at 5 s, every 10 s");
    assert!(analysis::due_runs(&run.spec, &run.status, seen.now).is_empty());
    assert!(
        analysis::due_runs(&run.spec, &run.status, at(14)).is_empty(),
        "not a second early"
    );
    assert_eq!(
        analysis::due_runs(&run.spec, &run.status, at(8 + 7)).len(),
        1,
        "due when woken"
    );
}

#[test]
fn an_analysed_step_passes_after_count_successful_measurements() {
    let (mut run, mut seen) = release_at_analysis(analysed_spec(false));
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepPaused));
    let due = analysis::due_runs(&run.spec, &run.status, seen.now);
    assert_eq!(due.len(), 1, "the step's run is due at once");
    assert_eq!(due[0].0, "step-1");
    seen.measurements = vec![measured("step-1", Outcome::Successful)];
    let plan = run.step(&seen);
    assert_eq!(
        run.state(),
        (Phase::Progressing, 1, StepState::StepPaused),
        "one of two"
    );
    assert_eq!(
        plan.requeue.map(|r| r.after),
        Some(Duration::from_secs(10)),
        "woken for the next measurement"
    );
    seen.now = at(8);
    seen.measurements.clear();
    assert!(
        analysis::due_runs(&run.spec, &run.status, seen.now).is_empty(),
        "not due before the interval"
    );
    seen.now = at(15);
    seen.measurements = vec![measured("step-1", Outcome::Successful)];
    run.step(&seen);
    assert_eq!(run.state().1, 2, "two successes pass the step");
    assert!(
        run.status.step_history[0].passed_by.contains("2 successful"),
        "{:?}",
        run.status.step_history
    );
}

#[test]
fn a_failed_measurement_fails_the_release_with_the_metric() {
    let (mut run, mut seen) = release_at_analysis(analysed_spec(false));
    seen.measurements = vec![measured("step-1", Outcome::Failed)];
    let plan = run.step(&seen);
    assert_eq!(run.status.phase, Phase::Failed);
    let cause = plan.failed.expect("failed");
    assert!(cause.contains("analysis errors failed 1 time(s) (step-1)"), "{cause}");
    assert!(cause.contains("0.5 against `< 0.01`"), "{cause}");
    assert_eq!(
        run.status.pending_writeback.as_ref().map(|p| p.action),
        Some(WritebackAction::Revert)
    );
}

#[test]
fn inconclusive_measurements_pause_the_release_until_a_promote() {
    let (mut run, mut seen) = release_at_analysis(analysed_spec(false));
    seen.measurements = vec![measured("step-1", Outcome::Inconclusive)];
    run.step(&seen);
    assert_eq!(run.status.phase, Phase::Progressing, "one inconclusive is tolerated");
    seen.now = at(16);
    run.step(&seen);
    assert_eq!(run.status.phase, Phase::Paused, "the second pauses");
    let message = run.status.canary_status.clone().unwrap_or_default().message;
    assert!(message.contains("inconclusive 2 time(s)"), "{message}");
    // Never a promote on missing data: more successes do not un-pause it.
    seen.now = at(27);
    seen.measurements = vec![measured("step-1", Outcome::Successful)];
    run.step(&seen);
    seen.now = at(38);
    run.step(&seen);
    assert_eq!(run.status.phase, Phase::Paused);
    seen.measurements.clear();
    seen.promote_signal = Some(run.token("the CLI"));
    seen.now = at(39);
    run.step(&seen);
    assert_eq!(run.state().1, 2, "a promote goes on without the missing data");
}

#[test]
fn background_analysis_runs_through_timed_pauses_and_fails_the_release() {
    let (mut run, mut seen) = release_at_analysis(analysed_spec(true));
    let due = analysis::due_runs(&run.spec, &run.status, seen.now);
    assert_eq!(due.first().map(|d| d.0.as_str()), Some("background"));
    seen.measurements = vec![measured("background", Outcome::Successful)];
    run.step(&seen);
    assert_eq!(run.status.phase, Phase::Progressing);
    seen.now = at(20);
    seen.measurements = vec![measured("background", Outcome::Failed)];
    let plan = run.step(&seen);
    assert_eq!(run.status.phase, Phase::Failed);
    assert!(plan.failed.expect("failed").contains("(background)"));
}

#[test]
fn traffic_waits_until_the_canary_pods_have_a_revision_a_service_can_select() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    run.step(&observed("v2", 10));
    let mut seen = observed("v2", 20);
    seen.canary_ready = 1;
    seen.canary_revision = String::new(); // the ReplicaSet is not seen yet
    seen.stable_services_pinned = true;
    let plan = run.step(&seen);
    assert_eq!(plan.intent.traffic, None);
    // Pinned already: the canary's pods, once ready, match the stable Service.
    assert!(!plan.intent.route_canary && plan.intent.pin_stable_service);

    seen.canary_revision = "canary-pods".into();
    let plan = run.step(&seen);
    assert_eq!(plan.intent.traffic, Some(10));
    assert!(plan.intent.route_canary && plan.intent.pin_stable_service);
    assert_eq!(run.status.canary_revision, "canary-pods");
    assert_eq!(run.status.stable_revision, "stable-pods");
}

/// A canary Deployment's pods match the stable Service's own selector:
/// the release pins it first, and makes the canary only once the pin is
/// live, so that not one request reaches the canary through it.
#[test]
fn a_canary_deployment_is_made_only_once_the_live_stable_service_is_pinned() {
    for style in [Style::Canary, Style::BlueGreen] {
        let mut spec = spec();
        spec.strategy.style = style;
        let mut run = Run::with(spec);
        run.step(&observed("v1", 0));
        let mut seen = observed("v2", 10);
        seen.canary_revision = String::new();
        let plan = run.step(&seen);
        assert!(plan.intent.canary_replicas.is_some(), "{style:?}");
        assert!(plan.intent.pin_stable_service && plan.intent.await_pin, "{style:?}");
        assert_eq!(
            plan.requeue.map(|r| r.after),
            Some(Duration::ZERO),
            "{style:?}: the pass that wrote the pin is followed at once by one that reads it back"
        );
        let message = &run.status.canary_status.as_ref().expect("a step").message;
        assert!(message.contains("stable Service"), "{style:?}: {message}");
        // A pin that does not read back is looked for once a second.
        seen.now = at(11);
        let plan = run.step(&seen);
        assert!(plan.intent.await_pin, "{style:?}");
        assert_eq!(plan.requeue.map(|r| r.after), Some(Duration::from_secs(1)), "{style:?}");

        seen.stable_services_pinned = true;
        let plan = run.step(&seen);
        assert!(plan.intent.pin_stable_service && !plan.intent.await_pin, "{style:?}");
        // Its first pods exist: the pin is not read again, nor waited for.
        seen.stable_services_pinned = false;
        seen.canary_revision = "canary-pods".into();
        assert!(!run.step(&seen).intent.await_pin, "{style:?}");
    }
    // No stable revision yet (a rebuilt cluster makes the stable workload
    // now): nothing to pin to, and the canary waits for one.
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 10);
    seen.canary_revision = String::new();
    seen.stable_revision = String::new();
    seen.stable_services_pinned = true;
    let plan = run.step(&seen);
    assert!(!plan.intent.pin_stable_service && plan.intent.await_pin);
    // Nothing to wait for without a Service to pin.
    let mut unrouted = spec();
    unrouted.strategy.canary.traffic_routings.clear();
    let mut run = Run::with(unrouted);
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 10);
    seen.canary_revision = String::new();
    assert!(!run.step(&seen).intent.await_pin);
}

#[test]
fn a_rollout_without_a_canary_service_never_routes_to_one() {
    let mut spec = spec();
    spec.strategy.canary.canary_service = Some(crate::rollout::api::CanaryService {
        disabled: true,
        ..Default::default()
    });
    let mut run = Run::with(spec);
    run.step(&observed("v1", 0));
    run.step(&observed("v2", 10));
    let mut seen = observed("v2", 20);
    seen.canary_ready = 1;
    let plan = run.step(&seen);
    assert_eq!(plan.intent.canary_replicas, Some(1));
    assert_eq!(plan.intent.traffic, None);
    assert!(!plan.intent.route_canary);
}

#[test]
fn the_canary_revision_is_recorded_only_while_a_canary_runs() {
    let mut run = Run::new();
    let plan = run.step(&observed("v1", 0));
    assert_eq!(plan.intent.canary_replicas, None);
    assert_eq!(run.status.canary_revision, "");
    assert_eq!(run.status.stable_revision, "stable-pods");
    run.step(&observed("v2", 10));
    assert_eq!(run.status.canary_revision, "canary-pods");
}

#[test]
fn transitions_are_typed_so_a_reason_that_mentions_failure_is_no_failure() {
    let superseded = Transition::Superseded {
        rollout_id: "abc".into(),
        reason: "the commit that failed before is back".into(),
    };
    assert_eq!(superseded.event(), (Severity::Normal, "ReleaseSuperseded"));
    let failed = Transition::Failed {
        rollout_id: "abc".into(),
        cause: "canary pods not ready".into(),
    };
    assert_eq!(failed.event(), (Severity::Warning, "ReleaseFailed"));
    assert_eq!(failed.to_string(), "release abc failed: canary pods not ready");
}

#[test]
fn a_release_start_is_one_typed_transition() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let plan = run.step(&observed("v2", 10));
    assert_eq!(
        plan.transitions,
        vec![Transition::Started {
            rollout_id: "v2-comm".into(),
            commit: "v2-commit-0123456789".into(),
        }]
    );
}

/// A Knative Service: steps of traffic only, no routes of the Rollout's own.
fn function_spec() -> RolloutSpec {
    let mut spec = spec();
    spec.workload_ref = WorkloadRef {
        api_version: "serving.knative.dev/v1".into(),
        kind: "Service".into(),
        name: "fn".into(),
    };
    spec.strategy.canary.traffic_routings.clear();
    spec.strategy.canary.steps = vec![step().traffic("20%").pause_for(1), step().traffic("100%")];
    spec
}

/// What a Knative Service reports: its canary Revision Ready or not, and the
/// canary's percent read back from `status.traffic`.
fn function_observed(git: &str, now: i64, ready: bool, read_back: Option<u32>) -> Observed {
    Observed {
        replicas: 1,
        canary_ready: i32::from(ready),
        stable_revision: "fn-00001".into(),
        canary_revision: if ready { "fn-00002".into() } else { String::new() },
        stable_rolled_out: read_back == Some(100),
        self_routed: Some(SelfRouted {
            share: 100,
            canary_percent: read_back,
            canary_scaled_to_zero: false,
        }),
        ..observed(git, now)
    }
}

#[test]
fn a_function_step_is_in_force_only_once_its_share_is_read_back() {
    let mut run = Run::with(function_spec());
    run.step(&function_observed("v1", 0, true, None));
    // The template changed: Knative has not made the canary Revision yet.
    let plan = run.step(&function_observed("v2", 1, false, None));
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepUpgrade));
    assert_eq!(plan.intent.canary_replicas, Some(1));
    assert_eq!(plan.intent.traffic, None, "no share before the canary Revision exists");
    assert!(
        run.status
            .canary_status
            .as_ref()
            .unwrap()
            .message
            .contains("canary Revision (not made yet)")
    );
    // Ready: the step's share is asked for, and held until Knative reads it back.
    let plan = run.step(&function_observed("v2", 2, true, Some(0)));
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    assert_eq!(plan.intent.traffic, Some(20));
    assert_eq!(run.status.canary_revision, "fn-00002");
    assert_eq!(run.status.stable_revision, "fn-00001");
    // Read back: in force at once (no grace period is set), then the timed pause.
    let plan = run.step(&function_observed("v2", 2, true, Some(20)));
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepPaused));
    assert!(
        plan.transitions
            .contains(&Transition::TrafficInForce { step: 1, percent: 20 })
    );
}

#[test]
fn a_function_whose_share_is_never_read_back_fails_at_the_deadline() {
    let mut spec = function_spec();
    spec.strategy.canary.progress_deadline = Some(super::super::api::Duration::Seconds(30));
    let mut run = Run::with(spec);
    run.step(&function_observed("v1", 0, true, None));
    run.step(&function_observed("v2", 1, true, Some(0)));
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    let plan = run.step(&function_observed("v2", 40, true, Some(0)));
    assert_eq!(run.status.phase, Phase::Failed);
    let cause = plan.failed.expect("failed");
    assert!(
        cause.contains("did not route 20% to the canary Revision fn-00002"),
        "{cause}"
    );
    assert_eq!(plan.intent, Intent::steady(StableTemplate::Live));
    assert_eq!(
        run.status.pending_writeback.map(|w| w.action),
        Some(WritebackAction::Revert)
    );
}

#[test]
fn a_promoted_function_keeps_the_canary_revision_as_stable() {
    let mut run = Run::with(function_spec());
    run.step(&function_observed("v1", 0, true, None));
    run.step(&function_observed("v2", 1, true, Some(0)));
    run.step(&function_observed("v2", 2, true, Some(20)));
    // After the pause, step 2 asks for everything; read back, it promotes.
    let plan = run.step(&function_observed("v2", 4, true, Some(20)));
    assert_eq!(plan.intent.traffic, Some(100));
    let plan = run.step(&function_observed("v2", 5, true, Some(100)));
    assert!(plan.promoted);
    assert_eq!(run.status.phase, Phase::Healthy);
    assert_eq!(run.status.stable_revision, "fn-00002");
    assert_eq!(run.status.canary_revision, "");
}

#[test]
fn an_empty_or_absent_rollout_id_is_the_short_commit() {
    let commit = "0123456789abcdef0123456789abcdef01234567";
    assert_eq!(release_id(None, commit), "0123456");
    assert_eq!(release_id(Some(""), commit), "0123456");
    assert_eq!(release_id(Some("  "), commit), "0123456");
    assert_eq!(release_id(Some("v2.4"), commit), "v2.4");
    let mut spec = spec();
    spec.rollout_id = Some(String::new());
    let mut run = Run::with(spec);
    run.step(&observed("v1", 0));
    run.step(&observed("v2", 1));
    assert_eq!(run.status.rollout_id, "v2-comm");
}

#[test]
fn a_write_back_is_recorded_by_the_plan_only_for_the_same_release_and_action() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    run.status.pending_writeback = Some(PendingWriteback {
        action: WritebackAction::Promote,
        rollout_id: "r2".into(),
        stable_commit: "v1-commit-0123456789".into(),
        canary_commit: "v2-commit-0123456789".into(),
        at: at(0).to_string(),
        ..PendingWriteback::default()
    });
    let written = |action, rollout_id: &str| WrittenBack {
        action,
        rollout_id: rollout_id.into(),
        commit: "c0ffee".into(),
        note: String::new(),
    };
    let mut seen = observed("v1", 10);
    for other in [
        written(WritebackAction::Promote, "r1"),
        written(WritebackAction::Revert, "r2"),
    ] {
        seen.written_back = Some(other.clone());
        let plan = run.step(&seen);
        assert!(
            plan.status.pending_writeback.is_some(),
            "{other:?} is not this write-back"
        );
        assert_eq!(plan.status.written_back, None);
    }
    seen.written_back = Some(written(WritebackAction::Promote, "r2"));
    let plan = run.step(&seen);
    assert_eq!(plan.status.pending_writeback, None);
    assert_eq!(plan.status.written_back, Some(written(WritebackAction::Promote, "r2")));
}

#[test]
fn the_stable_service_keeps_to_the_stable_pods_until_the_aborted_canarys_pods_are_gone() {
    let mut run = Run::new();
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    seen.abort_signal = Some(run.token("test"));
    seen.now = at(5);
    let plan = run.step(&seen);
    assert!(
        plan.failed.is_some() || run.status.phase == Phase::Failed,
        "{:?}",
        run.status.phase
    );
    // The canary's pods match the stable Service's own selector too.
    assert_eq!(plan.intent, removing_canary(StableTemplate::Live));
    let plan = run.step(&without_canary(observed("v2", 6)));
    assert_eq!(plan.intent, Intent::steady(StableTemplate::Live));
}

#[test]
fn a_statefulsets_stable_service_is_not_pinned_at_rest() {
    let mut spec = spec();
    spec.workload_ref.kind = "StatefulSet".into();
    let mut run = Run::with(spec);
    // A StatefulSet at rest reads its update revision as the canary's.
    let plan = run.step(&observed("v1", 0));
    assert_eq!(run.status.phase, Phase::Healthy);
    assert_eq!(plan.intent, Intent::steady(StableTemplate::Git));
}

/// v1 stable, v2 pushed, and the step-1 canary pod of v2 ready at 20 s: what observe sees then.
fn canary_ready_at_20(run: &mut Run) -> Observed {
    run.step(&observed("v1", 0));
    run.step(&observed("v2", 10));
    let mut seen = observed("v2", 20);
    seen.canary_ready = 1;
    seen
}

#[test]
fn an_ab_step_sends_matching_requests_only_and_a_later_step_routes_its_own() {
    let header = crate::rollout::api::RequestMatch {
        headers: vec![crate::rollout::api::NamedMatch {
            kind: None,
            name: "x-canary".into(),
            value: "yes".into(),
        }],
        ..Default::default()
    };
    let mut spec = spec();
    let mut ab = step().replicas(1).pause_for(60);
    ab.matches = vec![header.clone()];
    spec.strategy.canary.steps = vec![ab, step().traffic("30%").pause_until_promoted(), step().traffic("100%")];
    let mut run = Run::with(spec);
    let mut seen = canary_ready_at_20(&mut run);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    assert_eq!(plan.intent.traffic, Some(0), "no share besides the matching requests");
    assert_eq!(plan.intent.matches, vec![header.clone()]);
    assert_eq!(
        run.status.canary_status.as_ref().unwrap().traffic,
        "0% + matching requests"
    );
    // Step 2 gives a share of its own, and no matches.
    seen.now = at(90);
    run.step(&seen);
    seen.canary_ready = 2;
    seen.now = at(200);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 2, StepState::StepTrafficRouting));
    assert_eq!(plan.intent.traffic, Some(30));
    assert!(plan.intent.matches.is_empty());
}

#[test]
fn a_step_waits_past_its_grace_for_the_gateway_to_take_its_route() {
    let through_gateway = || {
        let mut spec = spec();
        spec.strategy.canary.traffic_routings[0].gateway = Some(crate::rollout::api::GatewayRouting {
            http_route_name: "echo".into(),
        });
        Run::with(spec)
    };
    let mut run = through_gateway();
    let mut seen = canary_ready_at_20(&mut run);
    run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    // Grace over, but the gateway has accepted only the route's previous generation.
    seen.now = at(24);
    let behind = RouteSeen {
        name: "echo".into(),
        canary_weight: Some(10),
        splits: true,
        to_canary: true,
        generation: 2,
        accepted_generation: Some(1),
    };
    seen.routes = Some(vec![behind.clone()]);
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    let message = &run.status.canary_status.as_ref().unwrap().message;
    assert!(message.contains("waiting for the gateway"), "{message}");
    assert_eq!(plan.requeue.map(|r| r.after), Some(Duration::from_secs(1)));
    // Routes not read in a pass: wait for one that reads them.
    seen.routes = None;
    run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    // Accepted: the step's pause begins.
    seen.routes = Some(vec![RouteSeen {
        accepted_generation: Some(2),
        ..behind.clone()
    }]);
    seen.now = at(25);
    run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepPaused));
    // Never taken within the deadline: the release fails, saying what it waited for.
    let mut run = through_gateway();
    let mut seen = canary_ready_at_20(&mut run);
    run.step(&seen);
    seen.routes = Some(vec![behind.clone()]);
    seen.now = at(20 + 601);
    let plan = run.step(&seen);
    // The route still sends to the canary: its objects stay, looked at again in a second.
    assert_eq!(plan.intent.canary_replicas, None);
    assert!(plan.intent.hold_canary);
    assert_eq!(plan.requeue.map(|r| r.after), Some(Duration::from_secs(1)));
    seen.routes = Some(vec![RouteSeen {
        to_canary: false,
        canary_weight: None,
        accepted_generation: Some(2),
        ..behind
    }]);
    seen.now = at(20 + 602);
    assert!(!run.step(&seen).intent.hold_canary);
    let status = run.status.canary_status.as_ref().unwrap();
    assert!(
        status
            .message
            .contains("the gateway has accepted generation 1 of HTTPRoute echo, not yet 2"),
        "{}",
        status.message
    );
}

#[test]
fn a_knative_step_read_back_on_a_revision_scaled_to_zero_waits_for_a_pod() {
    let mut run = Run::with(function_spec());
    run.step(&function_observed("v1", 0, true, None));
    run.step(&function_observed("v2", 1, false, None));
    run.step(&function_observed("v2", 2, true, Some(0)));
    let mut seen = function_observed("v2", 2, true, Some(20));
    if let Some(routed) = seen.self_routed.as_mut() {
        routed.canary_scaled_to_zero = true;
    }
    run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    let message = &run.status.canary_status.as_ref().unwrap().message;
    assert!(
        message.contains("waiting for a pod of it (Knative scaled it to zero)"),
        "{message}"
    );
    // A pod runs: the step is in force.
    run.step(&function_observed("v2", 3, true, Some(20)));
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepPaused));
}

#[test]
fn a_blue_green_release_pins_the_stable_service_before_its_first_pod_a_canary_when_it_routes() {
    let first_upgrade = |spec: RolloutSpec| {
        let mut run = Run::with(spec);
        run.step(&observed("v1", 0));
        let mut seen = observed("v2", 10);
        seen.canary_revision = String::new(); // no canary pod yet
        let plan = run.step(&seen);
        assert_eq!(run.state().2, StepState::StepUpgrade);
        (plan.intent.traffic, plan.intent.pin_stable_service)
    };
    let mut blue_green = spec();
    blue_green.strategy.style = Style::BlueGreen;
    // Nothing routed to the new version, and the stable Service on the old pods alone.
    assert_eq!(first_upgrade(blue_green), (None, true));
    // A canary's too, at a step that routes it a share: only the route sends it requests.
    assert_eq!(first_upgrade(spec()), (None, true));
    // A step of replicas alone shares the stable Service among old and new pods.
    let mut replicas_only = spec();
    replicas_only.strategy.canary.steps[0] = step().replicas(1).pause_for(60);
    assert_eq!(first_upgrade(replicas_only), (None, false));

    // A step of replicas alone after a routed one keeps that route, and the pin.
    let mut spec = spec();
    spec.strategy.canary.steps[1] = step().replicas_percent("50%").pause_until_promoted();
    let mut run = Run::with(spec);
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 10);
    seen.canary_ready = 1;
    for now in [10, 20, 23, 83] {
        seen.now = at(now);
        run.step(&seen);
    }
    assert_eq!(run.state(), (Phase::Progressing, 2, StepState::StepUpgrade));
    seen.canary_ready = 2;
    for now in [90, 94] {
        seen.now = at(now);
        let plan = run.step(&seen);
        assert_eq!(plan.intent.traffic, Some(10), "at {now}");
        assert!(
            plan.intent.pin_stable_service,
            "at {now}: the 10% route stands, so does the pin"
        );
    }
    assert_eq!(run.state().1, 2);
}

#[test]
fn a_failure_threshold_lets_a_step_go_on_with_that_many_canary_pods_unready() {
    let at_step_one_with_three_of_four_ready = |threshold: Option<IntOrPercent>| {
        let mut spec = spec();
        spec.strategy.canary.steps[0] = step().traffic("10%").replicas_percent("100%").pause_for(60);
        spec.strategy.canary.failure_threshold = threshold;
        let mut run = Run::with(spec);
        run.step(&observed("v1", 0));
        run.step(&observed("v2", 10));
        let mut seen = observed("v2", 20);
        seen.canary_ready = 3;
        let plan = run.step(&seen);
        (run.state().2, plan.intent.canary_replicas)
    };
    assert_eq!(
        at_step_one_with_three_of_four_ready(None),
        (StepState::StepUpgrade, Some(4))
    );
    assert_eq!(
        at_step_one_with_three_of_four_ready(Some(IntOrPercent::Percent("25%".into()))),
        (StepState::StepTrafficRouting, Some(4))
    );
}

/// Two steps (10% for 60 s, then 100%) with every hook, all named `smoke`.
fn hooked_spec() -> RolloutSpec {
    let mut spec = spec();
    spec.strategy.canary.steps = vec![step().traffic("10%").replicas(1).pause_for(60), step().traffic("100%")];
    let hook = || {
        Some(crate::rollout::api::Hook {
            name: "smoke".into(),
            path: "/check".into(),
        })
    };
    spec.hooks = crate::rollout::api::Hooks {
        pre_release: hook(),
        step: hook(),
        pre_promote: hook(),
        post_release: hook(),
    };
    spec
}

fn answered(run: &str, outcome: Outcome) -> Measurement {
    Measurement {
        release: v2_release(),
        run: run.into(),
        template: "smoke".into(),
        outcome,
        message: format!("hook smoke /check answered {outcome:?}"),
    }
}

/// Steps the planner once with `measurements`, `seconds` later.
fn answer(run: &mut Run, seen: &mut Observed, seconds: i64, measurements: Vec<Measurement>) -> Plan {
    seen.now = at(seconds);
    seen.measurements = measurements;
    let plan = run.step(seen);
    seen.measurements.clear();
    plan
}

#[test]
fn each_hook_holds_its_point_of_the_release_until_it_answers() {
    let mut run = Run::with(hooked_spec());
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    let plan = run.step(&seen);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepUpgrade));
    assert_eq!(
        plan.intent.traffic, None,
        "no request reaches the canary before preRelease answers"
    );
    assert_eq!(
        plan.requeue.map(|r| r.after),
        Some(Duration::from_millis(100)),
        "called at once"
    );
    let due = crate::rollout::hooks::due(&run.spec, &run.status, seen.now);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].0, crate::rollout::hooks::Point::PreRelease);
    let plan = answer(
        &mut run,
        &mut seen,
        2,
        vec![answered("hook-preRelease", Outcome::Successful)],
    );
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    assert_eq!(plan.intent.traffic, Some(10));
    // The step's traffic in force: the step hook is asked before its pause counts.
    answer(&mut run, &mut seen, 6, vec![]);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepPaused));
    let message = run.status.canary_status.clone().unwrap_or_default().message;
    assert!(message.contains("calling the step hook smoke"), "{message}");
    answer(&mut run, &mut seen, 70, vec![]);
    assert_eq!(run.state().1, 1, "the pause is over, the hook has not answered");
    seen.canary_ready = 4;
    answer(
        &mut run,
        &mut seen,
        71,
        vec![answered("hook-step-1", Outcome::Successful)],
    );
    assert_eq!(run.state().1, 2);
    answer(&mut run, &mut seen, 80, vec![]);
    answer(
        &mut run,
        &mut seen,
        85,
        vec![answered("hook-step-2", Outcome::Successful)],
    );
    assert_eq!(run.status.phase, Phase::Promoting);
    let plan = answer(&mut run, &mut seen, 86, vec![]);
    assert_eq!(
        plan.intent.stable_template,
        StableTemplate::Live,
        "the stable workload waits for prePromote"
    );
    let plan = answer(
        &mut run,
        &mut seen,
        87,
        vec![answered("hook-prePromote", Outcome::Successful)],
    );
    assert_eq!(plan.intent.stable_template, StableTemplate::Git);
    let calls: Vec<&str> = run.status.analysis_runs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        calls,
        ["hook-preRelease", "hook-step-1", "hook-step-2", "hook-prePromote"]
    );
}

#[test]
fn a_hook_that_answers_an_error_fails_the_release_with_its_answer() {
    let mut run = Run::with(hooked_spec());
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    let mut refused = answered("hook-preRelease", Outcome::Failed);
    refused.message = "hook smoke /check answered 500 Internal Server Error: checkout returned 502".into();
    let plan = answer(&mut run, &mut seen, 2, vec![refused]);
    assert_eq!(run.status.phase, Phase::Failed);
    let cause = plan.failed.expect("failed");
    assert!(cause.contains("the preRelease hook smoke failed"), "{cause}");
    assert!(cause.contains("checkout returned 502"), "{cause}");
    assert_eq!(
        run.status.pending_writeback.as_ref().map(|p| p.action),
        Some(WritebackAction::Revert)
    );
}

#[test]
fn a_hook_that_stops_answering_pauses_the_release_until_a_promote_passes_over_it() {
    let mut run = Run::with(hooked_spec());
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    for (i, seconds) in [2, 13].into_iter().enumerate() {
        let plan = answer(
            &mut run,
            &mut seen,
            seconds,
            vec![answered("hook-preRelease", Outcome::Inconclusive)],
        );
        assert_eq!(
            run.status.phase,
            Phase::Progressing,
            "call {} unanswered is tolerated",
            i + 1
        );
        assert_eq!(plan.requeue.map(|r| r.after), Some(crate::rollout::hooks::RETRY));
    }
    answer(
        &mut run,
        &mut seen,
        24,
        vec![answered("hook-preRelease", Outcome::Inconclusive)],
    );
    assert_eq!(run.status.phase, Phase::Paused, "the third pauses");
    let message = run.status.canary_status.clone().unwrap_or_default().message;
    assert!(message.contains("did not answer 3 time(s)"), "{message}");
    assert!(message.contains("promote to go on without it"), "{message}");
    seen.promote_signal = Some(run.token("the CLI"));
    answer(&mut run, &mut seen, 36, vec![]);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
    assert_eq!(run.status.analysis_runs[0].skipped_by, "the CLI");
}

#[test]
fn a_hook_taken_out_of_git_no_longer_holds_a_release_it_paused() {
    let mut run = Run::with(hooked_spec());
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    for seconds in [2, 13, 24] {
        answer(
            &mut run,
            &mut seen,
            seconds,
            vec![answered("hook-preRelease", Outcome::Inconclusive)],
        );
    }
    assert_eq!(run.status.phase, Phase::Paused);
    run.spec.hooks.pre_release = None;
    answer(&mut run, &mut seen, 25, vec![]);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepTrafficRouting));
}

#[test]
fn answers_taken_for_a_release_a_newer_commit_replaced_do_not_pass_the_new_one() {
    let mut run = Run::with(hooked_spec());
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    // The sync that called v2's preRelease hook also sees v3.
    let mut newer = observed("v3", 2);
    newer.canary_ready = 1;
    newer.measurements = vec![answered("hook-preRelease", Outcome::Successful)];
    let plan = run.step(&newer);
    assert_eq!(run.status.canary_commit, newer.commit, "v3's release started");
    assert_eq!(
        plan.intent.traffic, None,
        "v3's own preRelease hook is still to be called"
    );
    assert!(
        run.status.analysis_runs.iter().all(|r| r.successful == 0),
        "{:?}",
        run.status.analysis_runs
    );
}

#[test]
fn a_promote_at_a_gate_passes_a_step_hook_that_stopped_answering_and_the_gate() {
    let mut spec = hooked_spec();
    spec.hooks.pre_release = None;
    spec.strategy.canary.steps[0] = step().traffic("10%").replicas(1).pause_until_promoted();
    let mut run = Run::with(spec);
    run.step(&observed("v1", 0));
    let mut seen = observed("v2", 1);
    seen.canary_ready = 1;
    run.step(&seen);
    answer(&mut run, &mut seen, 6, vec![]);
    for seconds in [7, 18, 29] {
        answer(
            &mut run,
            &mut seen,
            seconds,
            vec![answered("hook-step-1", Outcome::Inconclusive)],
        );
    }
    assert_eq!(run.state(), (Phase::Paused, 1, StepState::StepPaused));
    seen.promote_signal = Some(run.token("carol"));
    answer(&mut run, &mut seen, 30, vec![]);
    assert_eq!(run.state().1, 2, "one promote passes the hook and the gate");
    assert_eq!(run.status.step_history[0].passed_by, "promoted by carol");
}

#[test]
fn a_running_check_job_is_looked_at_every_interval_not_at_once() {
    let mut spec = analysed_spec(false);
    spec.analysis_templates[0] = serde_json::from_value(serde_json::json!({
        "name": "errors", "interval": 10,
        "metrics": [{"name": "smoke", "job": {"spec": {"template": {"spec": {"restartPolicy": "Never"}}}}}]
    }))
    .expect("template");
    let (mut run, mut seen) = release_at_analysis(spec);
    assert_eq!(run.state(), (Phase::Progressing, 1, StepState::StepPaused));
    seen.now = at(6);
    let plan = run.step(&seen);
    assert_eq!(plan.requeue.map(|r| r.after), Some(Duration::from_secs(10)));
}
