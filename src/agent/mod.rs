//! The agent's loop: wait for a trigger (timer, drift, signal, a newly
//! loaded revision), reconcile (`sync`), report (`report`), repeat.
//! Triggers for other apps than those of a sync in flight start a sync
//! beside it (`flight`); the others are merged into one after it.
//! Reading the source (fetch, parse, render) runs beside it (`loader`).

mod drift;
mod flight;
mod github_task;
mod loader;
mod poll;
mod queue;
mod requeue;
mod scope;

use drift::DriftWatch;
use flight::{Flight, Flights};
use github_task::GitHubTask;
use loader::Loaded;
pub use poll::AtRest;
use queue::next_burst_until;
pub use queue::{TriggerQueue, Triggers, trigger_channel};
use requeue::Requeues;
pub use scope::Seen;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::{debug, error, info};

use crate::cluster::Cluster;
use crate::github::GitHub;
use crate::report::{WritebackConfig, write_back};
use crate::source::Source;
use crate::sync::{AppResult, SyncMemo, SyncOptions, SyncReport, sync_validated};
use crate::telemetry::Metrics;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Start,
    Poll,
    FileChange,
    Webhook,
    /// A watched object changed (none: it was deleted, or a watch listed again).
    Drift(Option<Seen>),
    /// A Rollout carries a promote or abort signal not acted on yet: as
    /// `Drift`, but acted on at once, since a person is waiting on it.
    Signal(Option<Seen>),
    /// These apps asked to be looked at again, for these reasons (a pause
    /// or grace period ends).
    Due(Vec<(String, crate::rollout::plan::RequeueReason)>),
    /// A GitHub gate or command was handed to a rollout: act on it.
    Decided,
    /// A signed comment, review or pull-request event: the releases' gates
    /// and commands are looked at now, with the revision already loaded.
    GitHubEvent,
    /// A write-back pushed a commit: the source has news.
    Pushed,
    /// Write-backs were done without a new commit (Git already held them):
    /// these apps record them in their Rollouts' statuses.
    WrittenBack(BTreeSet<String>),
    /// The loader has read the source's head: sync it.
    Loaded,
    /// This replica's shards changed: sync every app it holds now.
    Shards,
    /// The queue was full and refused triggers: sync every app, and read
    /// the head or look at GitHub if one of them asked for it.
    Overflowed(queue::Refused),
}

impl Trigger {
    fn reason(&self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Poll => "poll",
            Trigger::FileChange => "file change",
            Trigger::Webhook => "webhook",
            Trigger::Drift(_) => "drift",
            Trigger::Signal(_) => "signal",
            Trigger::Due(_) => "timer",
            Trigger::Decided => "github decision",
            Trigger::GitHubEvent => "github event",
            Trigger::Pushed => "pushed",
            Trigger::WrittenBack(_) => "written back",
            Trigger::Loaded => "loaded",
            Trigger::Shards => "shards",
            Trigger::Overflowed(_) => "queue overflowed",
        }
    }

    /// Whether the trigger says the source may have changed: the loader
    /// reads it, and a sync follows once it is loaded. The others sync the
    /// revision already loaded, at once.
    fn reads_source(&self) -> bool {
        match self {
            Trigger::Start | Trigger::Poll | Trigger::FileChange | Trigger::Webhook | Trigger::Pushed => true,
            Trigger::Overflowed(refused) => refused.reads_source,
            _ => false,
        }
    }

    /// Whether the loop syncs the revision already loaded for it, at once:
    /// a refused trigger may have been a drift, so every app is, even while
    /// the head is read for one that was a push.
    fn syncs_the_loaded_revision(&self) -> bool {
        !self.reads_source() || matches!(self, Trigger::Overflowed(_))
    }

    /// Whether the sync it starts looks at GitHub for gates' approvals and
    /// commands (any sync reports the releases that moved).
    fn looks_at_github(&self) -> bool {
        match self {
            Trigger::Decided | Trigger::GitHubEvent => true,
            Trigger::Overflowed(refused) => refused.looks_at_github,
            Trigger::Due(due) => due
                .iter()
                .any(|(_, reason)| *reason == crate::rollout::plan::RequeueReason::Command),
            _ => false,
        }
    }

    /// Whether the sync may wait for the burst it belongs to end.
    fn may_wait(&self) -> bool {
        matches!(self, Trigger::Drift(_) | Trigger::FileChange)
    }
}

pub struct Agent {
    pub cluster: Arc<Cluster>,
    pub source: Arc<Source>,
    pub options: SyncOptions,
    pub poll_interval: Duration,
    /// Every watch asks for bookmarks from the start (`--watch-bookmarks`).
    pub watch_bookmarks: bool,
    /// How often a release paused with GitHub on is looked at again.
    pub command_poll: CommandPoll,
    pub ready: Arc<AtomicBool>,
    pub writeback: WritebackConfig,
    /// Pull-request comments, commit statuses, gates and commands; off without a token.
    pub github: Option<Arc<GitHub>>,
    /// Release events to the team's chat and webhooks; off without receivers.
    pub notifier: Option<Arc<crate::notify::Notifier>>,
    pub metrics: Arc<Metrics>,
    /// The revision last loaded, validated: what syncs use until the loader
    /// replaces it, kept while its commit is the branch's head, and what the
    /// next load takes unchanged apps from.
    pub(crate) loaded: std::sync::Mutex<Option<Loaded>>,
    /// Apps earlier syncs found in order, answered again while nothing they
    /// hold changes (the watch caches tell).
    pub(crate) memo: Arc<SyncMemo>,
    /// With `--shards`: the shards this replica holds; it syncs only their apps.
    pub shards: Option<Arc<crate::shards::Shards>>,
    /// Where the agent is at rest (GitHub off): its poll then reads the
    /// branch's head itself and wakes the loop only if it or a watch cache
    /// moved.
    pub at_rest: Arc<AtRest>,
}

/// When a timer whose sync failed is tried again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// What the loop holds between syncs.
struct LoopState {
    requeues: Requeues,
    /// The revision whose every app was last synced without a failure
    /// (its commit and apps' prints): a newer one syncs what it changed.
    settled: Option<(String, scope::AppPrints)>,
    drift: DriftWatch,
    flights: Flights<crate::Result<SyncReport>, Departure>,
    github: Option<GitHubTask>,
    triggers: Triggers,
}

/// A loaded revision's identity while it is held: each load is a new one.
fn loaded_id(revision: &Arc<crate::source::Revision>) -> usize {
    Arc::as_ptr(revision) as usize
}

/// What the loop keeps of a sync it started, to read its answer with.
struct Departure {
    revision: Arc<crate::source::Revision>,
    whole: bool,
    changed: Option<BTreeSet<String>>,
    looks_at_github: bool,
    due: Vec<(String, crate::rollout::plan::RequeueReason)>,
    started: tokio::time::Instant,
    caches: poll::CachesSeen,
}

pub use requeue::CommandPoll;

impl Agent {
    /// Runs until the trigger channel closes or `stop` turns true; the syncs
    /// in flight (and their write-backs) are finished first.
    pub async fn run(&self, triggers: Triggers, mut queue: TriggerQueue, mut stop: tokio::sync::watch::Receiver<bool>) {
        let _file_watcher = self
            .source
            .local_dir()
            .and_then(|dir| watch_files(dir, triggers.clone()));
        let github = self.github.clone().map(|github| {
            GitHubTask::spawn(
                github,
                self.cluster.clone(),
                self.source.clone(),
                self.writeback.author.clone(),
                triggers.clone(),
                self.shards.clone(),
            )
        });
        let _ = triggers.try_send(Trigger::Start);
        let load_wanted = tokio::sync::Notify::new();
        let mut state = LoopState {
            requeues: Requeues::default(),
            settled: None,
            drift: DriftWatch::new(self.watch_bookmarks),
            flights: Flights::default(),
            github,
            triggers: triggers.clone(),
        };
        let reconcile = async {
            loop {
                let first = tokio::select! {
                    _ = stop.wait_for(|stop| *stop) => break,
                    (answer, departure) = state.flights.next_landing() => {
                        self.land_and_board(answer, departure, Vec::new(), &mut state).await;
                        continue;
                    }
                    first = queue.recv() => match first {
                        Some(first) => first,
                        None => break,
                    },
                    due = state.requeues.next_due() => {
                        let reasons: Vec<String> = due.iter().map(|(app, reason)| format!("{app}: {}", reason.as_str())).collect();
                        debug!(?reasons, "requeue due");
                        Trigger::Due(due)
                    }
                };
                let landing = state.flights.next_landing();
                let (burst, landed) = next_burst_until(first, &mut queue, &mut state.requeues, landing).await;
                if burst.iter().any(Trigger::reads_source) {
                    load_wanted.notify_one();
                }
                match landed {
                    Some((answer, departure)) => self.land_and_board(answer, departure, burst, &mut state).await,
                    None => self.take_off(burst, &mut state),
                }
            }
            while !state.flights.is_empty() {
                let (answer, departure) = state.flights.next_landing().await;
                self.land(answer, departure, &mut state).await;
            }
        };
        // A long render of a new commit delays only that commit's sync.
        let agent = async {
            tokio::select! {
                () = reconcile => {}
                () = self.follow_source(&load_wanted, &triggers) => {}
            }
        };
        // The syncs run as tasks of this thread, beside the loop.
        tokio::task::LocalSet::new().run_until(agent).await;
    }

    /// Starts the syncs `burst` asks for, beside those in flight if they
    /// may (see [`flight`]); what must wait for them is kept for their
    /// landing. Triggers for apps apart from each other start syncs apart.
    fn take_off(&self, burst: Vec<Trigger>, state: &mut LoopState) {
        if burst.is_empty() {
            return;
        }
        // Nothing loaded yet: the first load's sync comes.
        let Some((revision, owners)) = self.revision() else {
            return;
        };
        let burst = state
            .flights
            .board(burst, &owners, loaded_id(&revision), std::time::Instant::now());
        let news = self.news_in(&burst);
        if news.is_empty() {
            return;
        }
        let writing_back = self.memo.writing_back();
        let changed = scope::changed_by_load(&news, state.settled.as_ref(), &revision, writing_back);
        if changed.is_none()
            && let Some(groups) = flight::independent(&news, &owners)
        {
            for group in &groups {
                let group: Vec<&Trigger> = group.iter().collect();
                self.launch(&group, None, &revision, &owners, state);
            }
            return;
        }
        self.launch(&news, changed, &revision, &owners, state);
    }

    /// Starts the sync of what `news` concerns.
    fn launch(
        &self,
        news: &[&Trigger],
        changed: Option<BTreeSet<String>>,
        revision: &Arc<crate::source::Revision>,
        owners: &scope::Owners,
        state: &mut LoopState,
    ) {
        let scope = scope::apps_of_with(news, owners, changed.as_ref());
        let whole = scope.is_none();
        let Some(scope) = self.within_shards(scope, revision) else {
            return;
        };
        let reasons: BTreeSet<&str> = news.iter().map(|t| t.reason()).collect();
        debug!(?reasons, apps = ?scope, commit = %revision.commit, "sync triggered");
        let flight = Flight {
            apps: scope.clone(),
            revision: loaded_id(revision),
            loads: changed.is_some(),
        };
        // A pause or deadline that came due is not lost with a failed sync.
        let due = news.iter().filter_map(|t| match t {
            Trigger::Due(due) => Some(due.iter().cloned()),
            _ => None,
        });
        let departure = Departure {
            revision: revision.clone(),
            whole,
            changed,
            looks_at_github: news.iter().any(|t| t.looks_at_github()),
            due: due.flatten().collect(),
            started: tokio::time::Instant::now(),
            // Read before the sync, as its own inputs are: a change meanwhile is not slept through.
            caches: poll::caches_seen(&self.cluster),
        };
        let (cluster, options, memo, metrics, revision) = (
            self.cluster.clone(),
            self.options.clone(),
            self.memo.clone(),
            self.metrics.clone(),
            revision.clone(),
        );
        state.flights.launch(flight, departure, async move {
            let _timer = metrics.sync_duration.start_timer();
            sync_validated(&cluster, &revision, &options, &memo, scope.as_ref()).await
        });
    }

    /// A sync landed: answered first (so that its writes' echoes in `burst`
    /// are told apart), then what waited for it boards with `burst`.
    async fn land_and_board(
        &self,
        answer: Result<crate::Result<SyncReport>, String>,
        departure: Departure,
        mut burst: Vec<Trigger>,
        state: &mut LoopState,
    ) {
        self.land(answer, departure, state).await;
        let mut boarding = state.flights.take_waiting();
        boarding.append(&mut burst);
        self.take_off(boarding, state);
    }

    /// After a sync: what it settled, its requeues, and its report; or,
    /// when it failed (or its task ended without an answer), its wake-ups again.
    async fn land(
        &self,
        answer: Result<crate::Result<SyncReport>, String>,
        departure: Departure,
        state: &mut LoopState,
    ) {
        let Departure {
            revision,
            whole,
            changed,
            looks_at_github,
            due,
            started,
            caches,
        } = departure;
        let outcome = answer.unwrap_or_else(|message| Err(crate::Error::Panicked { task: "sync", message }));
        state.settled = settle(state.settled.take(), &outcome, &revision, whole, changed);
        let recalled = outcome.as_ref().is_ok_and(|report| report.recalled);
        self.at_rest.set(poll::rests_on(
            state.github.is_some(),
            whole,
            recalled,
            &revision,
            caches,
        ));
        drop(revision);
        match outcome {
            Ok(report) => {
                let command_poll = state.github.is_some().then_some(self.command_poll);
                state.requeues.replace(&report, started, command_poll);
                self.report(report, looks_at_github, state).await
            }
            Err(error) => {
                self.metrics.syncs_failed.fetch_add(1, Ordering::Relaxed);
                error!(%error, kind = error.metric_label(), "sync failed; the cluster keeps what it had");
                state.requeues.retry(due, started + RETRY_AFTER_FAILURE);
            }
        }
    }

    /// What of `burst` the loop acts on at once: not what reads the source
    /// (the loader's sync follows), nor the watch events of the last sync's
    /// own applies (read after that sync, when all its writes are recorded).
    fn news_in<'b>(&self, burst: &'b [Trigger]) -> Vec<&'b Trigger> {
        let wakes = burst.iter().filter(|t| t.syncs_the_loaded_revision());
        let own_echo = |trigger: &&Trigger| match trigger {
            Trigger::Drift(Some(seen)) | Trigger::Signal(Some(seen)) => {
                self.cluster.own_writes.wrote(&seen.uid, &seen.version)
            }
            _ => false,
        };
        let (echoes, news): (Vec<&Trigger>, Vec<&Trigger>) = wakes.partition(own_echo);
        self.metrics
            .own_write_events
            .fetch_add(echoes.len() as u64, Ordering::Relaxed);
        news
    }

    /// With shards, the apps of `scope` (every app, when `None`) whose shard
    /// this replica holds, `None` when it holds none of them; without, `scope`.
    fn within_shards(
        &self,
        scope: Option<BTreeSet<String>>,
        revision: &crate::source::Revision,
    ) -> Option<Option<BTreeSet<String>>> {
        let Some(shards) = &self.shards else { return Some(scope) };
        let apps: Vec<&String> = revision.manifests.apps.keys().collect();
        self.metrics.record_shards(shards, &apps);
        // A whole sync also takes the held apps that left Git, to prune them.
        let recorded = if scope.is_none() {
            self.cluster.recorded_apps()
        } else {
            BTreeSet::new()
        };
        let named = scope.iter().flatten();
        let held: BTreeSet<String> = apps
            .into_iter()
            .chain(&recorded)
            .chain(named.filter(|app| !revision.manifests.apps.contains_key(*app)))
            .filter(|app| scope.as_ref().is_none_or(|scope| scope.contains(*app)))
            .filter(|app| shards.holds_app(app))
            .cloned()
            .collect();
        if held.is_empty() {
            // Nothing of this replica's to sync (yet): it is ready all the same.
            self.ready.store(true, Ordering::Relaxed);
            return None;
        }
        Some(Some(held))
    }

    /// After a sync: metrics, the Git write-back, GitHub and the drift watches.
    async fn report(&self, report: SyncReport, look_at_github: bool, state: &mut LoopState) {
        let LoopState {
            triggers,
            drift,
            github,
            ..
        } = state;
        let github = github.as_ref();
        let report = held_only(report, self.shards.as_deref());
        self.ready.store(true, Ordering::Relaxed);
        self.metrics.record_sync(&report);
        let written = write_back(&self.source, &self.writeback, &report).await;
        self.metrics
            .writeback_commits
            .fetch_add(written.pushed as u64, Ordering::Relaxed);
        let failed = report.writebacks().count().saturating_sub(written.done.len());
        self.metrics
            .writeback_failures
            .fetch_add(failed as u64, Ordering::Relaxed);
        for (namespace, name, done) in written.done {
            self.memo.record_written(&namespace, &name, done);
        }
        if written.pushed > 0 {
            // Load and sync the commit just pushed; its sync records the write-backs.
            let _ = triggers.try_send(Trigger::Pushed);
        } else if !written.apps.is_empty() {
            let _ = triggers.try_send(Trigger::WrittenBack(written.apps));
        }
        if let Some(notifier) = &self.notifier {
            notifier.submit(&report);
        }
        if let Some(github) = github {
            github.submit(report.clone(), look_at_github);
        }
        drift.follow(&self.cluster, &report, &self.options, triggers).await;
        if !report.is_clean() {
            info!(commit = %report.commit, "sync finished with problems; the affected apps keep what they had");
        }
    }
}

/// What the next new commit is compared with after a sync (see
/// `scope::changed_apps`): every app's print when the sync was whole, the
/// last ones brought up to date with the apps a new commit changed, and
/// nothing after a failed sync. An app that met a problem or failed is left
/// out, so that the next commit syncs it again (a kind another app now
/// serves, a write the API server refused).
fn settle(
    settled: Option<(String, scope::AppPrints)>,
    outcome: &crate::Result<SyncReport>,
    revision: &crate::source::Revision,
    whole: bool,
    changed: Option<BTreeSet<String>>,
) -> Option<(String, scope::AppPrints)> {
    let report = outcome.as_ref().ok()?;
    // The last sync's answer again: what it settled stands.
    if report.recalled && whole && settled.as_ref().is_some_and(|(commit, _)| *commit == revision.commit) {
        return settled;
    }
    let (commit, mut prints) = match (whole, changed) {
        (true, _) => (revision.commit.clone(), scope::app_prints(revision)),
        (false, Some(changed)) => (revision.commit.clone(), scope::reprint(settled?.1, revision, &changed)),
        (false, None) => settled?,
    };
    for app in report.apps.iter() {
        if app.result != AppResult::Synced || !app.problems.is_empty() {
            prints.remove(&app.app);
        }
    }
    Some((commit, prints))
}

/// The apps of `report` whose shard this replica still holds (all of them
/// without shards): a shard lost during the sync takes its write-backs,
/// notifications and GitHub reports with it.
fn held_only(mut report: SyncReport, shards: Option<&crate::shards::Shards>) -> SyncReport {
    if let Some(shards) = shards
        && !report.apps.iter().all(|app| shards.holds_app(&app.app))
    {
        std::sync::Arc::make_mut(&mut report.apps).retain(|app| shards.holds_app(&app.app));
    }
    report
}

fn watch_files(dir: &std::path::Path, triggers: Triggers) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = triggers.try_send(Trigger::FileChange);
        }
    })
    .map_err(|error| error!(%error, "cannot watch the source directory; polling only"))
    .ok()?;
    watcher
        .watch(dir, notify::RecursiveMode::Recursive)
        .map_err(|error| error!(%error, "cannot watch the source directory; polling only"))
        .ok()?;
    Some(watcher)
}

#[cfg(test)]
mod tests {
    use super::{AppResult, SyncReport, requeue, scope, settle};

    #[test]
    fn an_app_that_met_a_problem_is_synced_again_by_the_next_commit() {
        let mut manifests = crate::manifest::ManifestSet::default();
        for name in ["web", "api"] {
            manifests.apps.insert(
                name.to_string(),
                crate::manifest::App {
                    name: name.to_string(),
                    ..Default::default()
                },
            );
        }
        let revision = crate::source::Revision::new("c1".into(), manifests);
        let mut invalid = crate::sync::AppReport::new("api", AppResult::Invalid);
        invalid.problems.push(crate::manifest::Problem {
            file: "api/crd-user.yaml".into(),
            line: 1,
            message: "no kind Widget is served".into(),
        });
        let synced = crate::sync::AppReport::new("web", AppResult::Synced);
        let report = requeue::tests::report(vec![synced, invalid]);
        let settled = settle(None, &Ok(report), &revision, true, None).expect("settled");
        assert_eq!(settled.1.keys().collect::<Vec<_>>(), vec!["web"]);
        let next = crate::source::Revision::new("c2".into(), revision.manifests.clone());
        let changed = scope::changed_apps(&settled, &next).expect("a new commit");
        assert!(changed.contains("api"), "{changed:?}");
        let failed: crate::Result<SyncReport> = Err(crate::Error::Usage("the API server went away".into()));
        assert!(settle(Some(settled.clone()), &failed, &revision, true, None).is_none());

        // A sync answered from the last one keeps what that one settled.
        let mut recalled = requeue::tests::report(vec![crate::sync::AppReport::new("web", AppResult::Synced)]);
        recalled.recalled = true;
        let kept = settle(Some(settled.clone()), &Ok(recalled.clone()), &revision, true, None).expect("settled");
        assert_eq!(kept, settled);
        // …of the same commit only.
        let moved = settle(Some(settled), &Ok(recalled), &next, true, None).expect("settled");
        assert_eq!(moved.0, "c2");
    }
}
