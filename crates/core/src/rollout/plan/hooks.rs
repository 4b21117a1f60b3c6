//! The planner's hook decisions: asking for a hook's call (by opening its
//! run), holding the release until it answers, and what its answer does.

use super::*;
use crate::rollout::hooks::{self, Point};

impl Planner<'_> {
    /// Whether the release waits at `point` for its hook: the first time,
    /// the hook's run is opened (observe then calls it); until it answers
    /// 2xx (or a promote passes over a hook that stopped answering), the
    /// release holds there. A Rollout without the hook never waits.
    pub fn hook_waits(&mut self, point: Point, index: u32) -> bool {
        let Some(hook) = point.hook(&self.spec.hooks) else {
            return false;
        };
        let (run_name, rollout_id) = (point.run(), self.status.rollout_id.clone());
        let run = self
            .status
            .analysis_runs
            .iter()
            .find(|r| r.name == run_name && r.rollout_id == rollout_id)
            .cloned();
        let message = match run {
            Some(run) if hooks::passed(&run) => return false,
            // Its failure is judged before the steps are walked.
            Some(run) if run.failed > 0 => return true,
            Some(run) => {
                let since = elapsed(&run.last_measured_at, self.observed.now);
                self.requeue_in(hooks::RETRY.saturating_sub(since), RequeueReason::Analysis);
                format!(
                    "{}: waiting for the {} hook {} ({} call(s) unanswered: {})",
                    at(point, index),
                    point.name(),
                    hook.name,
                    run.inconclusive,
                    run.message
                )
            }
            None => {
                self.status.analysis_runs.push(AnalysisRun {
                    name: run_name,
                    template: hook.name.clone(),
                    rollout_id,
                    ..AnalysisRun::default()
                });
                self.requeue_in(Duration::ZERO, RequeueReason::Analysis);
                format!("{}: calling the {} hook {}", at(point, index), point.name(), hook.name)
            }
        };
        // Answered again after a pause: under way once more.
        if self.status.phase == Phase::Paused {
            self.status.phase = match point {
                Point::PrePromote => Phase::Promoting,
                _ => Phase::Progressing,
            };
        }
        self.canary().message = message;
        true
    }

    /// What the hooks' answers do: one that answered with an error fails
    /// the release; one that stopped answering pauses it, until it answers
    /// or a promote passes over it.
    pub fn judge_hooks(&mut self) -> Option<Intent> {
        let rollout_id = self.status.rollout_id.clone();
        let runs: Vec<(usize, Point)> = self
            .status
            .analysis_runs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.rollout_id == rollout_id)
            .filter_map(|(i, r)| Some((i, Point::of_run(&r.name)?)))
            // A hook taken out of Git no longer holds the release.
            .filter(|(_, point)| point.hook(&self.spec.hooks).is_some())
            .collect();
        for (i, point) in runs {
            let run = self.status.analysis_runs[i].clone();
            if run.failed > 0 {
                return Some(self.fail(format!(
                    "the {} hook {} failed: {}",
                    point.name(),
                    run.template,
                    run.message
                )));
            }
            if hooks::passed(&run) || run.inconclusive <= hooks::UNANSWERED_LIMIT {
                continue;
            }
            let template = format!("hook {}", point.name());
            if let Some(value) = self.signal_for_this_release(Signal::Promote) {
                let by = signal::parse(&value).by;
                self.note(Transition::AnalysisSkipped {
                    template,
                    by: by.clone(),
                });
                // At a step that waits for a promote, the same promote passes its gate.
                if !self.waits_for_promote(point) {
                    self.status.last_promote_signal = value;
                }
                self.status.analysis_runs[i].skipped_by = by;
                continue;
            }
            if self.status.phase != Phase::Paused {
                self.note(Transition::AnalysisInconclusive { template });
            }
            self.status.phase = Phase::Paused;
            let index = self.status.canary_status.as_ref().map_or(1, |c| c.current_step_index);
            self.canary().message = format!(
                "{}: the {} hook {} did not answer {} time(s): {}; paused: promote to go on without it, or abort",
                at(point, index),
                point.name(),
                run.template,
                run.inconclusive,
                run.message
            );
            self.requeue_in(hooks::RETRY, RequeueReason::Analysis);
            // Before the first step's traffic, none; after the last, all of the last step's.
            let traffic = match point {
                Point::PreRelease => None,
                _ => traffic_at(self.spec, index),
            };
            let wanted = self.observed.canary_ready;
            return Some(self.release_intent(StableTemplate::Live, wanted, traffic));
        }
        None
    }
}

impl Planner<'_> {
    fn waits_for_promote(&self, point: Point) -> bool {
        let Point::Step(index) = point else {
            return false;
        };
        let pause = self.step_at(index).pause;
        pause.is_some_and(|p| p.duration.is_none())
    }
}

/// Where the release waits, as its message begins.
fn at(point: Point, index: u32) -> String {
    match point {
        Point::PrePromote => "promoting".into(),
        _ => format!("step {index}"),
    }
}
