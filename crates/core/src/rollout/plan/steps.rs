//! The planner's walk through a release's steps: upgrade, route traffic,
//! pause, promote.

use super::*;
use crate::rollout::hooks::Point;

impl Planner<'_> {
    pub fn steps(&self) -> u32 {
        self.spec.strategy.canary.steps.len() as u32
    }

    pub fn release_intent(
        &self,
        stable_template: StableTemplate,
        canary_replicas: i32,
        route: Option<StepRoute>,
    ) -> Intent {
        let traffic = route.as_ref().map(|r| r.percent);
        let (header_modifier, mirror) = route
            .as_ref()
            .map(|r| (r.header_modifier.clone(), r.mirror))
            .unwrap_or_default();
        // The new version takes no request through the stable Service
        // (blue-green's, as big as the old one; a canary's while a step's
        // route, this one's or an earlier one's, sends it requests): pinned
        // before its first pod. Until a step routes, the canary's pods
        // share the stable Service, as Kruise's steps without traffic do.
        let blue_green = self.spec.strategy.style == crate::rollout::api::Style::BlueGreen;
        let index = self
            .status
            .canary_status
            .as_ref()
            .map_or(1, |c| c.current_step_index.max(1));
        let routed = traffic.is_some() || super::routes::traffic_at(self.spec, index).is_some();
        Intent {
            stable_template,
            canary_replicas: Some(canary_replicas),
            traffic,
            matches: route.map(|r| r.matches).unwrap_or_default(),
            header_modifier,
            mirror,
            hold_canary: false,
            pin_stable_service: (routed || blue_green) && stable_template == StableTemplate::Live,
            await_pin: false,
            route_canary: false,
            rollout_id: self.status.rollout_id.clone(),
        }
    }

    /// Walks the step states as far as what was observed allows.
    pub fn advance(&mut self) -> Intent {
        self.record_measurements();
        if let Some(intent) = self.judge_analysis().or_else(|| self.judge_hooks()) {
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
    pub fn step_at(&self, index: u32) -> CanaryStep {
        let steps = &self.spec.strategy.canary.steps;
        index
            .checked_sub(1)
            .and_then(|i| steps.get(i as usize))
            .cloned()
            .unwrap_or_default()
    }

    pub fn grace(&self) -> Duration {
        self.spec
            .strategy
            .canary
            .grace_period_seconds
            .map_or(DEFAULT_GRACE, |s| Duration::from_secs(u64::from(s)))
    }

    pub fn progress_deadline(&self) -> Duration {
        self.spec
            .strategy
            .canary
            .progress_deadline
            .as_ref()
            .and_then(|d| d.to_std().ok())
            .unwrap_or(DEFAULT_PROGRESS_DEADLINE)
    }

    /// StepUpgrade: the step's canary pods, before its traffic rises.
    pub fn upgrade(&mut self, here: &Here) -> Flow {
        let (index, wanted) = (here.index, here.wanted);
        let traffic = traffic_at(self.spec, index - 1);
        self.canary().traffic = StepRoute::describe(traffic.as_ref());
        let threshold = self.spec.strategy.canary.failure_threshold.as_ref();
        if batch_ready(self.observed.canary_ready, wanted, threshold) {
            if index == 1 && self.hook_waits(Point::PreRelease, index) {
                return Flow::Hold(self.release_intent(StableTemplate::Live, wanted, traffic));
            }
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
            match tolerated_unready(wanted, threshold) {
                0 => format!("step {index}: waiting for {wanted} canary pod(s) to be ready"),
                spared => format!(
                    "step {index}: waiting for {} of {wanted} canary pod(s) to be ready (failureThreshold {spared})",
                    (wanted - spared).max(1)
                ),
            }
        };
        self.requeue_in(deadline - here.in_state, RequeueReason::Deadline);
        Flow::Hold(self.release_intent(StableTemplate::Live, wanted, traffic))
    }

    /// StepTrafficRouting: the step's share, held for the grace period (a
    /// self-routed workload: until its status reads the share back, then
    /// for a grace period only when one is set).
    pub fn route_traffic(&mut self, here: &Here) -> Flow {
        let index = here.index;
        let traffic = step_traffic(self.spec, index);
        let percent = traffic.as_ref().map_or(0, |r| r.percent);
        self.canary().traffic = StepRoute::describe(traffic.as_ref());
        if let Some(routed) = self.observed.self_routed {
            let asked = canary_percent(routed.share, percent);
            if routed.canary_percent != Some(asked) || routed.canary_scaled_to_zero {
                let deadline = self.progress_deadline();
                if here.in_state >= deadline {
                    let reads = match routed.canary_percent {
                        Some(p) if p == asked => "it, with the Revision scaled to zero".to_string(),
                        Some(p) => format!("{p}%"),
                        None => "nothing yet".to_string(),
                    };
                    let cause = format!(
                        "the Knative Service did not route {asked}% to the canary Revision {} within {}s at step {index} (its status reads {reads})",
                        self.observed.canary_revision,
                        deadline.as_secs(),
                    );
                    return Flow::Hold(self.fail(cause));
                }
                self.status.phase = Phase::Progressing;
                let waiting = if routed.canary_percent == Some(asked) {
                    "waiting for a pod of it (Knative scaled it to zero)"
                } else {
                    "waiting for the Service's status to read it back"
                };
                self.canary().message = format!(
                    "step {index}: routing {asked}% of requests to the canary Revision {}; {waiting}",
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
        let through_gateway = self.spec.strategy.canary.gateway_routes().next().is_some();
        let lag = through_gateway
            .then(|| routes::lag(self.observed.routes.as_deref(), percent))
            .flatten();
        if here.in_state >= grace && lag.is_none() {
            self.note(Transition::TrafficInForce { step: index, percent });
            self.enter(index, StepState::StepPaused);
            return Flow::Next;
        }
        if let Some(lag) = lag.filter(|_| here.in_state >= grace) {
            let deadline = self.progress_deadline();
            if here.in_state >= deadline {
                let cause = format!(
                    "step {index}'s route not in force within {}s: {lag}",
                    deadline.as_secs()
                );
                return Flow::Hold(self.fail(cause));
            }
            self.status.phase = Phase::Progressing;
            self.canary().message = format!("step {index}: waiting for the gateway: {lag}");
            // The gateway's status write wakes a sync too; this bounds the wait.
            self.requeue_in(routes::RECHECK.min(deadline - here.in_state), RequeueReason::Grace);
            return Flow::Hold(self.release_intent(StableTemplate::Live, here.wanted, traffic));
        }
        self.status.phase = Phase::Progressing;
        self.canary().message = format!(
            "step {index}: routing {} of traffic to the canary",
            StepRoute::describe(traffic.as_ref())
        );
        self.requeue_in(grace - here.in_state, RequeueReason::Grace);
        Flow::Hold(self.release_intent(StableTemplate::Live, here.wanted, traffic))
    }

    /// StepAnalysis and StepPaused: the step's analysis, then its pause
    /// (a duration, or a promote signal).
    pub fn pause(&mut self, here: &Here, step: &CanaryStep) -> Flow {
        let (index, wanted) = (here.index, here.wanted);
        let traffic = traffic_at(self.spec, index);
        if self.hook_waits(Point::Step(index), index) {
            return Flow::Hold(self.release_intent(StableTemplate::Live, wanted, traffic));
        }
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
    pub fn finish_step(&mut self, index: u32) {
        if index < self.steps() {
            self.note(Transition::StepDone { step: index });
            self.enter(index + 1, StepState::StepUpgrade);
        } else {
            self.note(Transition::LastStepDone);
            self.status.phase = Phase::Promoting;
            self.enter(index, StepState::Completed);
        }
    }

    /// Whether the step's timed pause has run out.
    pub fn pause_over(&self, index: u32) -> bool {
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

    pub fn passed_by(&mut self, by: String) {
        if let Some(last) = self.status.step_history.last_mut() {
            last.passed_by = by;
        }
    }

    pub fn promote_signal_received(&mut self, index: u32) -> bool {
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
    pub fn promote(&mut self, index: u32) -> Intent {
        let observed = self.observed;
        let last = self.step_at(index);
        let wanted = step_replicas(&last, observed.replicas);
        if self.hook_waits(Point::PrePromote, index) {
            let traffic = traffic_at(self.spec, index);
            return self.release_intent(StableTemplate::Live, wanted, traffic);
        }
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

/// A Revision's name, or what stands for one not made yet.
fn or_not_made(revision: &str) -> &str {
    if revision.is_empty() {
        "(not made yet)"
    } else {
        revision
    }
}

/// Kruise's `failureThreshold`: how many of a step's `wanted` canary pods
/// may stay unready (a count, or a share of them rounded up).
pub fn tolerated_unready(wanted: i32, threshold: Option<&IntOrPercent>) -> i32 {
    let tolerated = match threshold {
        None => 0,
        Some(IntOrPercent::Int(n)) => *n,
        Some(IntOrPercent::Percent(p)) => {
            let percent = i64::from(parse_percent(p).unwrap_or(0).min(100));
            ((i64::from(wanted.max(0)) * percent + 99) / 100) as i32
        }
    };
    tolerated.clamp(0, wanted.max(0))
}

/// A step's canary pods are ready: all of them, but for those the failure
/// threshold spares, and always at least one.
pub fn batch_ready(ready: i32, wanted: i32, threshold: Option<&IntOrPercent>) -> bool {
    wanted <= 0 || (ready >= 1 && ready + tolerated_unready(wanted, threshold) >= wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_threshold_spares_that_many_unready_canary_pods_but_never_all() {
        let fifth = IntOrPercent::Percent("20%".into());
        assert!(!batch_ready(4, 5, None));
        assert!(batch_ready(4, 5, Some(&fifth)));
        assert!(!batch_ready(3, 5, Some(&fifth)));
        // A share is rounded up, as Kruise does: 20% of 6 spares 2.
        assert!(batch_ready(4, 6, Some(&fifth)));
        assert!(batch_ready(1, 3, Some(&IntOrPercent::Int(5))));
        assert!(!batch_ready(0, 1, Some(&IntOrPercent::Int(5))), "at least one ready");
        assert!(batch_ready(0, 0, None));
    }
}
