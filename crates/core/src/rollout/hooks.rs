//! Release hooks, the pure part: the points a release calls out at, the
//! run that records each call, which calls are due, what each is sent, and
//! checks for `gitcanary validate`. The planner asks for a call by opening
//! its run; observe makes the calls due (`super::web::call_hook`).

use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::analysis::{Bindings, VARIABLES};
use super::api::{AnalysisRun, Hook, Hooks, Phase, RolloutSpec, RolloutStatus};

/// What a run's name starts with when it records a hook's calls.
const RUN_PREFIX: &str = "hook-";
/// The wait before a hook that did not answer is called again.
pub const RETRY: Duration = Duration::from_secs(10);
/// Calls without an answer tolerated; one more pauses the release.
pub const UNANSWERED_LIMIT: u32 = 2;

/// Where in a release a hook is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    PreRelease,
    Step(u32),
    PrePromote,
    PostRelease,
}

impl Point {
    /// The field that names the hook, and the `hook` of the body it is sent.
    pub fn name(self) -> &'static str {
        match self {
            Point::PreRelease => "preRelease",
            Point::Step(_) => "step",
            Point::PrePromote => "prePromote",
            Point::PostRelease => "postRelease",
        }
    }

    /// The run recording this point's calls in the status.
    pub fn run(self) -> String {
        match self {
            Point::Step(step) => format!("{RUN_PREFIX}step-{step}"),
            other => format!("{RUN_PREFIX}{}", other.name()),
        }
    }

    /// The point a run records, when it records a hook's calls.
    pub fn of_run(run: &str) -> Option<Point> {
        let rest = run.strip_prefix(RUN_PREFIX)?;
        Some(match rest {
            "preRelease" => Point::PreRelease,
            "prePromote" => Point::PrePromote,
            "postRelease" => Point::PostRelease,
            step => Point::Step(step.strip_prefix("step-")?.parse().ok()?),
        })
    }

    /// The hook a Rollout names for this point.
    pub fn hook(self, hooks: &Hooks) -> Option<&Hook> {
        match self {
            Point::PreRelease => hooks.pre_release.as_ref(),
            Point::Step(_) => hooks.step.as_ref(),
            Point::PrePromote => hooks.pre_promote.as_ref(),
            Point::PostRelease => hooks.post_release.as_ref(),
        }
    }
}

/// Whether a hook's run lets the release go on: answered 2xx, or passed
/// over by a promote after it stopped answering.
pub fn passed(run: &AnalysisRun) -> bool {
    run.successful > 0 || !run.skipped_by.is_empty()
}

/// Whether a hook's run still waits for an answer.
pub fn waiting(run: &AnalysisRun) -> bool {
    !passed(run) && run.failed == 0
}

/// The hook calls due now: the runs the planner opened for this release
/// that wait for an answer, first called at once, then every [`RETRY`].
pub fn due<'a>(spec: &'a RolloutSpec, status: &RolloutStatus, now: Timestamp) -> Vec<(Point, &'a Hook)> {
    let releasing = matches!(status.phase, Phase::Progressing | Phase::Paused | Phase::Promoting);
    if !releasing || status.canary_template_hash.is_empty() {
        return Vec::new();
    }
    status
        .analysis_runs
        .iter()
        .filter(|run| run.rollout_id == status.rollout_id && waiting(run))
        .filter_map(|run| {
            let point = Point::of_run(&run.name).filter(|p| *p != Point::PostRelease)?;
            let hook = point.hook(&spec.hooks)?;
            let last = run.last_measured_at.parse::<Timestamp>().ok();
            let due =
                last.is_none_or(|last| Duration::try_from(now.duration_since(last)).unwrap_or(Duration::ZERO) >= RETRY);
            due.then_some((point, hook))
        })
        .collect()
}

/// The JSON a hook is sent: which point of which release, the names the
/// query variables stand for, and (after it) the outcome.
pub fn body(point: Point, rollout: &str, commit: &str, bindings: &Bindings, outcome: Option<(&str, &str)>) -> Value {
    let mut body = json!({
        "hook": point.name(),
        "rollout": {"namespace": bindings.namespace, "name": rollout},
        "rolloutID": bindings.rollout_id,
        "commit": commit,
        "canaryService": bindings.canary_service,
        "stableService": bindings.stable_service,
        "canaryRevision": bindings.canary_revision,
        "stableRevision": bindings.stable_revision,
    });
    if let Point::Step(step) = point {
        body["step"] = json!(step);
    }
    if let Some((outcome, cause)) = outcome {
        body["outcome"] = json!(outcome);
        body["cause"] = json!(cause);
    }
    body
}

/// Problems of a Rollout's hooks and receivers, for validation.
pub fn problems(spec: &RolloutSpec) -> Vec<String> {
    let points = [Point::PreRelease, Point::Step(0), Point::PrePromote, Point::PostRelease];
    let mut out = Vec::new();
    for point in points {
        let Some(hook) = point.hook(&spec.hooks) else {
            continue;
        };
        let at = format!("hooks.{}", point.name());
        if !super::analysis::is_server_name(&hook.name) {
            out.push(format!(
                "{at}: name {:?} must be the NAME of one of the agent's --hook NAME=URL (lowercase letters, digits and '-')",
                super::api::bounded_line(&hook.name, 80)
            ));
        }
        if !hook.path.is_empty() {
            out.extend(super::web_paths::path_problem(&hook.path).map(|p| format!("{at}: {p}")));
        }
        if hook.path.matches("{{").count() != hook.path.matches("}}").count() {
            out.push(format!("{at}: a `{{{{` without its `}}}}`"));
        }
        for variable in super::analysis::variables(&hook.path).filter(|v| !VARIABLES.contains(v)) {
            out.push(format!(
                "{at}: unknown variable {{{{{variable}}}}} (known: {})",
                VARIABLES.join(", ")
            ));
        }
    }
    let receiver = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    for name in spec.notify.iter().filter(|n| !receiver(n)) {
        out.push(format!(
            "notify: {:?} is not the NAME of a --notify receiver (letters, digits, - and _)",
            super::api::bounded_line(name, 80)
        ));
    }
    if spec.hooks.step.is_some() && spec.strategy.canary.steps.is_empty() {
        out.push("hooks.step: the release has no steps to call it at".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, rollout_id: &str) -> AnalysisRun {
        AnalysisRun {
            name: name.into(),
            template: "smoke".into(),
            rollout_id: rollout_id.into(),
            ..AnalysisRun::default()
        }
    }

    fn releasing(runs: Vec<AnalysisRun>) -> RolloutStatus {
        RolloutStatus {
            phase: Phase::Progressing,
            rollout_id: "r2".into(),
            canary_template_hash: "h2".into(),
            analysis_runs: runs,
            ..RolloutStatus::default()
        }
    }

    #[test]
    fn a_run_names_its_point_and_back() {
        for point in [Point::PreRelease, Point::Step(3), Point::PrePromote, Point::PostRelease] {
            assert_eq!(Point::of_run(&point.run()), Some(point));
        }
        for other in ["step-1", "background", "hook-step-x", "hook-other"] {
            assert_eq!(Point::of_run(other), None, "{other}");
        }
    }

    #[test]
    fn a_hook_is_called_when_its_run_is_opened_then_again_only_after_the_retry_wait() {
        let mut spec = RolloutSpec::default();
        spec.hooks.pre_release = Some(Hook {
            name: "smoke".into(),
            path: String::new(),
        });
        let now: Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
        let opened = releasing(vec![run("hook-preRelease", "r2")]);
        assert_eq!(due(&spec, &opened, now).len(), 1, "opened: called at once");
        let mut called = opened.clone();
        called.analysis_runs[0].inconclusive = 1;
        called.analysis_runs[0].last_measured_at = "2026-12-04T09:59:55Z".into();
        assert!(due(&spec, &called, now).is_empty(), "not again within the retry wait");
        called.analysis_runs[0].last_measured_at = "2026-12-04T09:59:49Z".into();
        assert_eq!(due(&spec, &called, now).len(), 1, "again after it");
        let mut answered = called.clone();
        answered.analysis_runs[0].successful = 1;
        assert!(due(&spec, &answered, now).is_empty(), "answered: never again");
        let mut refused = called.clone();
        refused.analysis_runs[0].failed = 1;
        assert!(due(&spec, &refused, now).is_empty(), "refused: never again");
        let earlier = releasing(vec![run("hook-preRelease", "r1")]);
        assert!(due(&spec, &earlier, now).is_empty(), "an earlier release's run");
        let mut ended = opened.clone();
        ended.phase = Phase::Failed;
        assert!(due(&spec, &ended, now).is_empty(), "no release, no call");
        let no_hook = RolloutSpec::default();
        assert!(due(&no_hook, &opened, now).is_empty(), "a hook taken out of Git");
    }

    #[test]
    fn hooks_name_the_operators_endpoints_and_paths_under_them() {
        let mut spec = RolloutSpec::default();
        spec.hooks.pre_promote = Some(Hook {
            name: "https://evil.example".into(),
            path: "/../x/{{secret}}".into(),
        });
        spec.hooks.step = Some(Hook {
            name: "smoke".into(),
            path: "/smoke/{{rolloutID}}".into(),
        });
        let problems = problems(&spec).join("\n");
        assert!(
            problems.contains("hooks.prePromote: name \"https://evil.example\""),
            "{problems}"
        );
        assert!(problems.contains("hooks.prePromote: path"), "{problems}");
        assert!(problems.contains("unknown variable {{secret}}"), "{problems}");
        assert!(problems.contains("hooks.step: the release has no steps"), "{problems}");
        assert!(!problems.contains("hooks.step: path"), "{problems}");
    }
}
