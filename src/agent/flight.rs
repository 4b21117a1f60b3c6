//! Syncs in flight at once. While one runs, a burst of triggers for other
//! apps of the same revision starts a sync of its own beside it, so that a
//! slow app (a CRD slow to be established, a metrics server that does not
//! answer) delays only itself. What could change what a running sync reads
//! or decides waits for it to land: a sync of every app, a newly loaded
//! revision, a trigger for an app in flight (its own writes' echoes among
//! them, which are told apart only once the sync that made them landed).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tokio::task::{Id, JoinSet};

use super::Trigger;
use super::queue::Refused;
use super::scope::{self, Owners};
use crate::rollout::plan::RequeueReason;

/// How many triggers may wait for the syncs in flight before they are
/// taken together as one sync of every app.
const MAX_WAITING: usize = 256;

/// How long a trigger that must run alone lets other syncs start beside
/// the ones it waits for.
const MAX_ALONE_WAIT: Duration = Duration::from_secs(5);

/// A timer trigger for several apps as one trigger per app: each app's
/// timer starts its own sync, so that two apps whose timers came due
/// together (planned by one sync) are not tied to each other again.
fn each_app_its_timer(trigger: Trigger) -> Vec<Trigger> {
    match trigger {
        Trigger::Due(due) if due.len() > 1 => {
            let mut apps: BTreeMap<String, Vec<(String, RequeueReason)>> = BTreeMap::new();
            for (app, reason) in due {
                apps.entry(app.clone()).or_default().push((app, reason));
            }
            apps.into_values().map(Trigger::Due).collect()
        }
        other => vec![other],
    }
}

/// `news` as groups that share no app, each to be synced on its own; `None`
/// when one of them concerns every app.
pub(super) fn independent(news: &[&Trigger], owners: &Owners) -> Option<Vec<Vec<Trigger>>> {
    let mut groups: Vec<(BTreeSet<String>, Vec<Trigger>)> = Vec::new();
    for trigger in news.iter().flat_map(|trigger| each_app_its_timer((*trigger).clone())) {
        let mut apps = scope::apps_of_with(&[&trigger], owners, None)?;
        let mut triggers = vec![trigger];
        let (joined, apart): (Vec<_>, Vec<_>) = groups.into_iter().partition(|(theirs, _)| !theirs.is_disjoint(&apps));
        for (theirs, mut their_triggers) in joined {
            apps.extend(theirs);
            their_triggers.append(&mut triggers);
            triggers = their_triggers;
        }
        groups = apart;
        groups.push((apps, triggers));
    }
    Some(groups.into_iter().map(|(_, triggers)| triggers).collect())
}

/// A sync the loop started, as far as another start depends on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Flight {
    /// The apps it syncs; `None`: every app.
    pub apps: Option<BTreeSet<String>>,
    /// The loaded revision it syncs, by its address: every load is a new
    /// one, even of the same commit (a directory's, or one loaded again).
    pub revision: usize,
    /// It syncs a newly loaded revision: what the loop settles after it
    /// (the apps' prints) is what the next load is compared with.
    pub loads: bool,
}

impl Flight {
    /// Whether nothing may run beside it.
    fn alone(&self) -> bool {
        self.apps.is_none() || self.loads
    }

    /// Whether it may start while `flying` run: neither it nor any of them
    /// needs to be alone, all are of one revision, and no app is in two.
    pub(super) fn may_start_beside<'a>(&self, mut flying: impl Iterator<Item = &'a Flight>) -> bool {
        flying.all(|other| {
            !self.alone()
                && !other.alone()
                && other.revision == self.revision
                && matches!((&self.apps, &other.apps), (Some(mine), Some(theirs)) if mine.is_disjoint(theirs))
        })
    }
}

/// The syncs in flight, each a task answering `T`, with the context `C`
/// the loop started it with; and the triggers that wait for them.
pub(super) struct Flights<T, C> {
    tasks: JoinSet<T>,
    flying: Vec<(Id, Flight, C)>,
    /// Each with when it first came to wait.
    waiting: Vec<(Trigger, Instant)>,
}

impl<T: 'static, C> Default for Flights<T, C> {
    fn default() -> Self {
        Flights {
            tasks: JoinSet::new(),
            flying: Vec::new(),
            waiting: Vec::new(),
        }
    }
}

impl<T: 'static, C> Flights<T, C> {
    pub(super) fn is_empty(&self) -> bool {
        self.flying.is_empty()
    }

    /// Of `burst`, arrived `now`, what may start now beside the syncs in
    /// flight; the rest waits for them (and comes back from
    /// [`Flights::take_waiting`]). With nothing in flight, all of it, with
    /// what waited before. Once a trigger that must run alone has waited
    /// [`MAX_ALONE_WAIT`], nothing more starts beside them, so that it waits
    /// no longer than that and the syncs then in flight take; before, the
    /// syncs of other apps go on (during a release such triggers are many:
    /// a deletion concerns every app).
    pub(super) fn board(
        &mut self,
        burst: Vec<Trigger>,
        owners: &Owners,
        revision: usize,
        now: Instant,
    ) -> Vec<Trigger> {
        if self.flying.is_empty() {
            let mut all = self.take_waiting();
            all.extend(burst);
            return all;
        }
        let flight_of = |trigger: &Trigger| Flight {
            apps: scope::apps_of_with(&[trigger], owners, None),
            revision,
            loads: matches!(trigger, Trigger::Loaded),
        };
        // Read once: what this burst adds to the waiting has waited no time.
        let barrier = self
            .waiting
            .iter()
            .any(|(waiting, since)| flight_of(waiting).alone() && now.duration_since(*since) >= MAX_ALONE_WAIT);
        let mut boarding = Vec::new();
        for trigger in burst.into_iter().flat_map(each_app_its_timer) {
            let flying = self.flying.iter().map(|(_, flight, _)| flight);
            if !barrier && flight_of(&trigger).may_start_beside(flying) {
                boarding.push(trigger);
            } else {
                self.waiting.push((trigger, now));
            }
        }
        if self.waiting.len() > MAX_WAITING {
            // A storm of events while a sync runs: one sync of every app after it.
            let looks_at_github = self.waiting.iter().any(|(t, _)| t.looks_at_github());
            let since = self.waiting.iter().map(|(_, since)| *since).min().unwrap_or(now);
            let refused = Refused {
                reads_source: false,
                looks_at_github,
            };
            self.waiting = vec![(Trigger::Overflowed(refused), since)];
        }
        boarding
    }

    /// The triggers that waited, to board again once a sync landed.
    pub(super) fn take_waiting(&mut self) -> Vec<Trigger> {
        std::mem::take(&mut self.waiting).into_iter().map(|(t, _)| t).collect()
    }

    /// Starts `sync` as a task of the loop's own thread (a `LocalSet`).
    pub(super) fn launch(&mut self, flight: Flight, context: C, sync: impl Future<Output = T> + 'static) {
        let handle = self.tasks.spawn_local(sync);
        self.flying.push((handle.id(), flight, context));
    }

    /// The next sync to land, with its context: its answer, or why its
    /// task ended without one (a panic). Pending while none is in flight.
    pub(super) async fn next_landing(&mut self) -> (Result<T, String>, C) {
        loop {
            let Some(landed) = self.tasks.join_next_with_id().await else {
                return std::future::pending().await;
            };
            let (id, answer) = match landed {
                Ok((id, answer)) => (id, Ok(answer)),
                Err(error) => (error.id(), Err(error.to_string())),
            };
            // Every task is recorded as it is spawned.
            if let Some(index) = self.flying.iter().position(|(flying, _, _)| *flying == id) {
                return (answer, self.flying.remove(index).2);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flight(apps: Option<&[&str]>, revision: usize, loads: bool) -> Flight {
        Flight {
            apps: apps.map(|apps| apps.iter().map(|app| app.to_string()).collect()),
            revision,
            loads,
        }
    }

    #[test]
    fn a_sync_of_other_apps_of_the_same_revision_starts_beside_those_in_flight() {
        let web = flight(Some(&["web"]), 1, false);
        let api = flight(Some(&["api"]), 1, false);
        let jobs = flight(Some(&["jobs", "cron"]), 1, false);
        assert!(api.may_start_beside([&web].into_iter()));
        assert!(jobs.may_start_beside([&web, &api].into_iter()));
        assert!(
            flight(None, 1, true).may_start_beside([].into_iter()),
            "nothing in flight: anything starts"
        );
    }

    #[tokio::test]
    async fn a_burst_boards_what_may_start_now_and_the_rest_boards_after_the_landing() {
        use crate::rollout::plan::RequeueReason;
        let due = |app: &str| Trigger::Due(vec![(app.to_string(), RequeueReason::Pause)]);
        let owners = Owners::default();
        let now = Instant::now();
        tokio::task::LocalSet::new()
            .run_until(async {
                let mut flights: Flights<u32, &str> = Flights::default();
                // Nothing in flight: all of it.
                let all = flights.board(vec![due("web"), Trigger::Loaded], &owners, 1, now);
                assert_eq!(all, vec![due("web"), Trigger::Loaded]);
                let (answer, answered) = tokio::sync::oneshot::channel();
                let web = flight(Some(&["web"]), 1, false);
                flights.launch(web, "web's sync", async move { answered.await.unwrap_or(0) });
                let boarded = flights.board(vec![due("web"), due("api"), Trigger::Loaded], &owners, 1, now);
                assert_eq!(boarded, vec![due("api")], "another app starts beside it");
                assert_eq!(
                    flights.board(vec![due("api")], &owners, 2, now),
                    vec![],
                    "another revision waits"
                );
                answer.send(7).expect("the sync waits");
                assert_eq!(flights.next_landing().await, (Ok(7), "web's sync"));
                assert!(flights.is_empty());
                // What waited comes first, with the next burst.
                let after = flights.board(vec![due("jobs")], &owners, 2, now);
                assert_eq!(after, vec![due("web"), Trigger::Loaded, due("api"), due("jobs")]);
                // A sync whose task panics lands too, with why.
                flights.launch(flight(Some(&["web"]), 2, false), "web's next", async {
                    panic!("a bug")
                });
                let (answer, context) = flights.next_landing().await;
                assert!(answer.is_err_and(|why| why.contains("panicked")));
                assert_eq!(context, "web's next");
                assert!(flights.is_empty());
            })
            .await;
    }

    #[tokio::test]
    async fn a_trigger_that_must_run_alone_lets_others_start_beside_the_syncs_in_flight_for_a_while_only() {
        use crate::rollout::plan::RequeueReason;
        let due = |app: &str| Trigger::Due(vec![(app.to_string(), RequeueReason::Pause)]);
        let owners = Owners::default();
        let start = Instant::now();
        let at = |seconds| start + Duration::from_secs(seconds);
        tokio::task::LocalSet::new()
            .run_until(async {
                let mut flights: Flights<u32, ()> = Flights::default();
                flights.launch(flight(Some(&["web"]), 1, false), (), std::future::pending());
                // A deletion (or a relist) concerns every app: it waits for the sync in flight.
                assert_eq!(flights.board(vec![Trigger::Drift(None)], &owners, 1, at(0)), vec![]);
                // Meanwhile other apps' syncs go on beside it,
                assert_eq!(flights.board(vec![due("api")], &owners, 1, at(4)), vec![due("api")]);
                // until it has waited long enough: then nothing more starts, and it is next.
                assert_eq!(flights.board(vec![due("jobs")], &owners, 1, at(5)), vec![]);
                assert_eq!(flights.take_waiting(), vec![Trigger::Drift(None), due("jobs")]);
                // A storm of events while a sync runs: one sync of every app after it.
                let storm = vec![due("web"); MAX_WAITING + 1];
                assert_eq!(flights.board(storm, &owners, 1, at(6)), vec![]);
                let refused = Refused {
                    reads_source: false,
                    looks_at_github: false,
                };
                assert_eq!(flights.take_waiting(), vec![Trigger::Overflowed(refused)]);
            })
            .await;
    }

    #[test]
    fn timers_that_came_due_together_start_apart_and_triggers_that_share_an_app_together() {
        use crate::rollout::plan::RequeueReason::{Analysis, Pause};
        let owners = Owners::default();
        let together = Trigger::Due(vec![
            ("echo".into(), Analysis),
            ("quick".into(), Pause),
            ("echo".into(), Pause),
        ]);
        let written = Trigger::WrittenBack(["quick".to_string(), "jobs".to_string()].into());
        let groups = independent(&[&together, &written], &owners).expect("each names its apps");
        assert_eq!(
            groups,
            vec![
                vec![Trigger::Due(vec![("echo".into(), Analysis), ("echo".into(), Pause)])],
                vec![Trigger::Due(vec![("quick".into(), Pause)]), written.clone()],
            ]
        );
        assert_eq!(
            independent(&[&together, &Trigger::Drift(None)], &owners),
            None,
            "one concerns every app"
        );
    }

    #[test]
    fn what_could_change_a_running_syncs_answer_waits_for_it() {
        let web = flight(Some(&["web"]), 1, false);
        // An app in flight: its own writes' echoes, or a second pass over it.
        assert!(!flight(Some(&["api", "web"]), 1, false).may_start_beside([&web].into_iter()));
        // Every app.
        assert!(!flight(None, 1, false).may_start_beside([&web].into_iter()));
        assert!(!web.may_start_beside([&flight(None, 1, false)].into_iter()));
        // A newly loaded revision, or a sync of one in flight.
        assert!(!flight(Some(&["api"]), 1, true).may_start_beside([&web].into_iter()));
        assert!(!flight(Some(&["api"]), 1, false).may_start_beside([&flight(Some(&["web"]), 1, true)].into_iter()));
        // Another revision.
        assert!(!flight(Some(&["api"]), 2, false).may_start_beside([&web].into_iter()));
    }
}
