//! The planner's analysis decisions: folding measurements into runs,
//! judging them, and when the next measurement is due.

use super::*;

impl Planner<'_> {
    /// Folds the engine's measurements into the runs of this release.
    pub fn record_measurements(&mut self) {
        let now = self.observed.now.to_string();
        let rollout_id = self.status.rollout_id.clone();
        let release = analysis::release(&self.status);
        for measurement in self.observed.measurements.iter().filter(|m| m.release == release) {
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
    pub fn judge_analysis(&mut self) -> Option<Intent> {
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
    pub fn requeue_for_analysis(&mut self) {
        for (run_name, template_name) in analysis::active_runs(self.spec, &self.status) {
            let Some(template) = analysis::template(self.spec, &template_name) else {
                continue;
            };
            let wait = match analysis::until_due(&self.status, &run_name, template, self.observed.now) {
                Some(wait) => wait,
                // A Job's conditions are read every interval while it runs.
                None if crate::rollout::jobs::job_of(template).is_some() => analysis::interval(template),
                None => Duration::ZERO,
            };
            self.requeue_in(wait, RequeueReason::Analysis);
        }
    }

    /// For a step with analysis: `Some(true)` while it must wait for
    /// measurements, `Some(false)` once they suffice (`count` successes
    /// without a pause; one success with one), `None` without analysis.
    pub fn step_analysis_waits(&mut self, index: u32, no_pause: bool) -> Option<bool> {
        let step = self.spec.strategy.canary.steps.get(index as usize - 1)?;
        let template_name = step.analysis.as_ref()?.template_ref.clone();
        let template = analysis::template(self.spec, &template_name)?;
        // A Job passes once; a query is asked `count` times.
        let needed = if no_pause && crate::rollout::jobs::job_of(template).is_none() {
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
}
