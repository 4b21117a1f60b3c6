//! The agent's own wake-ups: when each app asked to be looked at again,
//! and why. A sync answers for the apps it synced, so its answer replaces
//! theirs: a wake-up a later sync no longer asks for never fires, and two
//! syncs never leave two timers for one pause.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::rollout::api::Phase;
use crate::rollout::plan::{Requeue, RequeueReason};
use crate::sync::{AppResult, SyncReport};

/// The soonest an app whose sync met problems is looked at again.
const FLOOR_AFTER_PROBLEMS: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
pub(super) struct Requeues {
    due: BTreeMap<(String, RequeueReason), Instant>,
    /// Per app paused with GitHub on: the wait before its next look for
    /// commands, and where its releases stood at the last look.
    command_waits: BTreeMap<String, (Duration, String)>,
}

/// Looks for commands and approvals while a release waits at a pause: at
/// `min` after a change, doubling while nothing moves, up to `max`, so a
/// gate left open for a day costs GitHub a few requests a minute at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandPoll {
    pub min: Duration,
    pub max: Duration,
}

impl CommandPoll {
    pub fn new(min: Duration, max: Duration) -> CommandPoll {
        CommandPoll { min, max: max.max(min) }
    }

    /// The wait after a look that found the releases at `now`, when the
    /// look before found them at `before` after `waited`.
    pub fn next(&self, before: Option<(Duration, &str)>, now: &str) -> Duration {
        match before {
            Some((waited, seen)) if seen == now => (waited * 2).clamp(self.min, self.max),
            _ => self.min,
        }
    }
}

/// When a requeue falls due on the agent's timer: at the moment the plan
/// aimed at, by the wall clock it read (`clock` is now on both clocks), or
/// `after` from when the sync was planned. A moment already past is due now.
/// Never later than `after` from now: a wall clock stepped back does not
/// hold a timer back.
fn due_at(requeue: &Requeue, planned_at: Instant, clock: (Instant, jiff::Timestamp)) -> Instant {
    match requeue.at {
        Some(at) => {
            let ahead = Duration::try_from(clock.1.duration_until(at)).unwrap_or(Duration::ZERO);
            clock.0 + ahead.min(requeue.after)
        }
        None => planned_at + requeue.after,
    }
}

impl Requeues {
    /// What the sync of `report`, planned at `planned_at`, asks for: each
    /// app's rollout timers, and with `command_poll` (GitHub on) a look for
    /// commands at every app with a rollout paused for a promote. It
    /// replaces what earlier syncs asked for the apps it synced (every app,
    /// unless the sync was scoped).
    pub(super) fn replace(&mut self, report: &SyncReport, planned_at: Instant, command_poll: Option<CommandPoll>) {
        let clock = (Instant::now(), jiff::Timestamp::now());
        self.replace_at(report, planned_at, command_poll, clock);
    }

    /// [`Requeues::replace`], with now on both clocks given (`due_at`).
    fn replace_at(
        &mut self,
        report: &SyncReport,
        planned_at: Instant,
        command_poll: Option<CommandPoll>,
        clock: (Instant, jiff::Timestamp),
    ) {
        // A look for commands not yet due stays when it is: syncs for other
        // reasons (a Git poll, a drift) neither postpone it nor bring it on.
        let pending_looks: BTreeMap<String, Instant> = self
            .due
            .iter()
            .filter(|((_, reason), _)| *reason == RequeueReason::Command)
            .map(|((app, _), at)| (app.clone(), *at))
            .collect();
        if !report.scoped {
            self.due.clear();
        } else {
            self.due
                .retain(|(app, _), _| !report.apps.iter().any(|a| a.app == *app));
        }
        for app in report.apps.iter() {
            if let Some(requeue) = app.requeue {
                let mut at = due_at(&requeue, planned_at, clock);
                // A plan that asks to look again at once assumes its pass was
                // written (a Rollout's status says it waited): one that was
                // not would ask again, each pass.
                if app.result == AppResult::Failed || !app.problems.is_empty() {
                    at = at.max(clock.0 + FLOOR_AFTER_PROBLEMS);
                }
                self.due.insert((app.app.clone(), requeue.reason), at);
            }
            // A release waiting at a pause, or moving through a step (an
            // abort may come by comment at any time), is looked at.
            let waiting = app
                .rollouts
                .iter()
                .any(|r| matches!(r.status.phase, Phase::Paused | Phase::Progressing));
            let (Some(poll), true) = (command_poll, waiting) else {
                self.command_waits.remove(&app.app);
                continue;
            };
            // Where its releases stand: a step, a release or a phase that
            // moved starts the waits from the shortest again.
            let standing: Vec<String> = app
                .rollouts
                .iter()
                .map(|r| {
                    let step = r.status.canary_status.as_ref().map_or(0, |c| c.current_step_index);
                    format!("{}:{}:{:?}:{step}", r.name, r.status.rollout_id, r.status.phase)
                })
                .collect();
            let standing = standing.join(",");
            let before = self.command_waits.get(&app.app).map(|(d, s)| (*d, s.as_str()));
            let pending = pending_looks.get(&app.app).copied();
            let at = match (before, pending) {
                (Some((_, seen)), Some(at)) if seen == standing => at,
                _ => {
                    let wait = poll.next(before, &standing);
                    self.command_waits.insert(app.app.clone(), (wait, standing));
                    // A move never puts off a look already due sooner.
                    pending.map_or(planned_at + wait, |at| at.min(planned_at + wait))
                }
            };
            self.due.insert((app.app.clone(), RequeueReason::Command), at);
        }
    }

    /// Asks again, at `at`, for wake-ups whose sync failed (unless a sync
    /// since asked for the same app and reason).
    pub(super) fn retry(&mut self, due: impl IntoIterator<Item = (String, RequeueReason)>, at: Instant) {
        for key in due {
            self.due.entry(key).or_insert(at);
        }
    }

    /// Waits for the soonest wake-up (forever when none), then takes every
    /// one due by then.
    pub(super) async fn next_due(&mut self) -> Vec<(String, RequeueReason)> {
        match self.due.values().min() {
            Some(&at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
        self.take_due(Instant::now())
    }

    fn take_due(&mut self, now: Instant) -> Vec<(String, RequeueReason)> {
        let due: Vec<_> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &due {
            self.due.remove(key);
        }
        due
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::rollout::api::RolloutStatus;
    use crate::sync::{AppReport, AppResult};

    /// An app's report with one rollout, `name`, paused or not.
    pub(in crate::agent) fn app(name: &str, requeue: Option<Requeue>, paused: bool) -> AppReport {
        let mut status = RolloutStatus::default();
        if paused {
            status.phase = Phase::Paused;
        }
        AppReport {
            requeue,
            rollouts: vec![crate::rollout::model::RolloutSummary {
                namespace: "ns".into(),
                name: name.into(),
                spec: Default::default(),
                status,
                changed: false,
                last_command_comment: 0,
            }],
            ..AppReport::new(name, AppResult::Synced)
        }
    }

    pub(in crate::agent) fn report(apps: Vec<AppReport>) -> SyncReport {
        SyncReport {
            commit: "c".into(),
            apps: apps.into(),
            kinds: Default::default(),
            released: Default::default(),
            scoped: false,
            recalled: false,
        }
    }

    const fn after(seconds: u64, reason: RequeueReason) -> Option<Requeue> {
        Some(Requeue {
            after: Duration::from_secs(seconds),
            reason,
            at: None,
        })
    }

    #[test]
    fn a_requeue_aims_at_the_moment_the_plan_read_not_at_the_syncs_start() {
        // The sync began 30 ms before its plan read the clock; the pause ends 1 s after that read.
        let read = jiff::Timestamp::from_second(1_000_000).expect("a time");
        let started = Instant::now();
        let clock = (started + Duration::from_millis(30), read);
        let pause = Requeue {
            after: Duration::from_secs(1),
            reason: RequeueReason::Pause,
            at: Some(read + jiff::SignedDuration::from_secs(1)),
        };
        assert_eq!(due_at(&pause, started, clock), clock.0 + Duration::from_secs(1));
        let past = Requeue {
            at: Some(read - jiff::SignedDuration::from_secs(5)),
            ..pause
        };
        assert_eq!(due_at(&past, started, clock), clock.0, "a moment past is due now");
        let relative = Requeue { at: None, ..pause };
        assert_eq!(due_at(&relative, started, clock), started + Duration::from_secs(1));
        let stepped_back = (clock.0, read - jiff::SignedDuration::from_secs(3600));
        assert_eq!(
            due_at(&pause, started, stepped_back),
            clock.0 + Duration::from_secs(1),
            "a clock stepped back holds no timer back"
        );
        // Through a sync's answer: the sync ended 50 ms after its plan read the clock.
        let mut requeues = Requeues::default();
        let ended = (
            clock.0 + Duration::from_millis(50),
            read + jiff::SignedDuration::from_millis(50),
        );
        requeues.replace_at(&report(vec![app("web", Some(pause), false)]), started, None, ended);
        assert_eq!(
            requeues.due.get(&("web".to_string(), RequeueReason::Pause)),
            Some(&(clock.0 + Duration::from_secs(1)))
        );
    }

    #[test]
    fn a_look_at_once_is_held_back_when_the_apps_sync_met_a_problem() {
        let now = (Instant::now(), jiff::Timestamp::from_second(1_000_000).expect("a time"));
        let at_once = Requeue {
            after: Duration::ZERO,
            reason: RequeueReason::Grace,
            at: Some(now.1),
        };
        let mut requeues = Requeues::default();
        let mut failed = app("web", Some(at_once), false);
        failed.result = AppResult::Failed;
        requeues.replace_at(
            &report(vec![app("api", Some(at_once), false), failed]),
            now.0,
            None,
            now,
        );
        let due = |app: &str| requeues.due[&(app.to_string(), RequeueReason::Grace)];
        assert_eq!(due("api"), now.0, "a clean pass: at once");
        assert_eq!(
            due("web"),
            now.0 + FLOOR_AFTER_PROBLEMS,
            "a pass whose writes failed would ask again and again"
        );
    }

    /// After a full sync at `start` in which web's pause has 10 s to run.
    fn web_paused_for_10_s(start: Instant) -> Requeues {
        let mut requeues = Requeues::default();
        let web = report(vec![app("web", after(10, RequeueReason::Pause), false)]);
        requeues.replace(&web, start, None);
        requeues
    }

    #[test]
    fn a_later_sync_replaces_every_wake_up_an_earlier_one_asked_for() {
        let start = Instant::now();
        let mut requeues = web_paused_for_10_s(start);
        requeues.replace(
            &report(vec![app("web", after(30, RequeueReason::Grace), false)]),
            start,
            None,
        );
        assert_eq!(
            requeues.take_due(start + Duration::from_secs(20)),
            vec![],
            "the pause was superseded"
        );
        assert_eq!(
            requeues.take_due(start + Duration::from_secs(30)),
            vec![("web".to_string(), RequeueReason::Grace)]
        );
        assert_eq!(requeues.take_due(start + Duration::from_secs(60)), vec![], "taken once");
        requeues.replace(&report(vec![app("web", None, false)]), start, None);
        assert!(requeues.due.is_empty(), "nothing asked for, nothing kept");
    }

    #[test]
    fn a_sync_of_some_apps_keeps_the_wake_ups_of_the_others() {
        let start = Instant::now();
        let mut requeues = Requeues::default();
        let both = report(vec![
            app("web", after(10, RequeueReason::Pause), false),
            app("shop", after(20, RequeueReason::Deadline), false),
        ]);
        requeues.replace(&both, start, None);
        let mut shop = report(vec![app("shop", None, false)]);
        shop.scoped = true;
        requeues.replace(&shop, start, None);
        assert_eq!(
            requeues.take_due(start + Duration::from_secs(60)),
            vec![("web".to_string(), RequeueReason::Pause)],
            "web was not synced: its pause still ends; shop's deadline was answered"
        );
    }

    #[test]
    fn a_wake_up_whose_sync_failed_comes_again() {
        let start = Instant::now();
        let mut requeues = web_paused_for_10_s(start);
        let due = requeues.take_due(start + Duration::from_secs(10));
        requeues.retry(due, start + Duration::from_secs(15));
        assert_eq!(
            requeues.take_due(start + Duration::from_secs(15)),
            vec![("web".to_string(), RequeueReason::Pause)]
        );
    }

    #[test]
    fn only_a_release_under_way_looks_for_commands_and_only_with_github() {
        let start = Instant::now();
        let mut requeues = Requeues::default();
        let apps = || {
            report(vec![
                app("waiting", None, true),
                app("timed", after(5, RequeueReason::Pause), false),
            ])
        };
        requeues.replace(&apps(), start, None);
        assert_eq!(
            requeues.take_due(start + Duration::from_secs(5)),
            vec![("timed".to_string(), RequeueReason::Pause)]
        );
        let poll = CommandPoll::new(Duration::from_secs(3), Duration::from_secs(10));
        requeues.replace(&apps(), start, Some(poll));
        assert_eq!(
            requeues.take_due(start + Duration::from_secs(3)),
            vec![("waiting".to_string(), RequeueReason::Command)]
        );
    }

    #[test]
    fn a_release_that_stays_where_it_was_is_looked_at_less_and_less_often_and_a_move_starts_again() {
        let poll = CommandPoll::new(Duration::from_secs(15), Duration::from_secs(120));
        let mut requeues = Requeues::default();
        let mut waits = Vec::new();
        let start = Instant::now();
        let mut look = |step: u32| {
            let at_step = || {
                let mut waiting = app("web", None, true);
                waiting.rollouts[0].status.canary_status = Some(crate::rollout::api::CanaryStatus {
                    current_step_index: step,
                    ..Default::default()
                });
                report(vec![waiting])
            };
            // The sync the last look started, then one for something else.
            requeues.replace(&at_step(), start, Some(poll));
            let due = requeues.due[&("web".to_string(), RequeueReason::Command)];
            requeues.replace(&at_step(), start + Duration::from_secs(1), Some(poll));
            assert_eq!(
                requeues.due[&("web".to_string(), RequeueReason::Command)],
                due,
                "another sync neither postpones nor brings on the look"
            );
            waits.push((due - start).as_secs());
            assert_eq!(
                requeues.take_due(due),
                vec![("web".to_string(), RequeueReason::Command)]
            );
        };
        for step in [1, 1, 1, 1, 1, 1, 2, 2] {
            look(step);
        }
        assert_eq!(waits, [15, 30, 60, 120, 120, 120, 15, 30]);
        // Moves every few seconds (pushes to a sibling Rollout) never put
        // off a look already due.
        let mut requeues = Requeues::default();
        let start = Instant::now();
        for (second, step) in [(0, 1), (5, 2), (10, 3), (14, 4)] {
            let mut moving = app("web", None, true);
            moving.rollouts[0].status.canary_status = Some(crate::rollout::api::CanaryStatus {
                current_step_index: step,
                ..Default::default()
            });
            requeues.replace(&report(vec![moving]), start + Duration::from_secs(second), Some(poll));
        }
        assert_eq!(
            requeues.due[&("web".to_string(), RequeueReason::Command)],
            start + Duration::from_secs(15)
        );
        // Nothing paused: no look, and the next pause starts from the shortest.
        requeues.replace(&report(vec![app("web", None, false)]), Instant::now(), Some(poll));
        assert!(requeues.command_waits.is_empty() && requeues.due.is_empty());
    }
}
