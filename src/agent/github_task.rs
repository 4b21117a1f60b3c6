//! GitHub reporting in a task of its own, so that a slow or hanging GitHub
//! delays the comment, never the release.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::{Trigger, held_only};
use crate::cluster::Cluster;
use crate::github::GitHub;
use crate::report::GitHubReporter;
use crate::rollout::model::RolloutSummary;
use crate::source::Source;
use crate::sync::{AppReport, SyncReport};

/// GitHub reporting in a task of its own, so that a slow or hanging GitHub
/// delays the comment, never the release. It reports the latest sync, with
/// every rollout that changed since the last report it finished.
pub(super) struct GitHubTask {
    /// The report to give GitHub, and whether waiting gates and commands
    /// are to be looked at (else only what changed is reported).
    pending: Arc<std::sync::Mutex<Option<(SyncReport, bool)>>>,
    wake: Arc<tokio::sync::Notify>,
    task: JoinHandle<()>,
}

impl GitHubTask {
    pub(super) fn spawn(
        github: Arc<GitHub>,
        cluster: Arc<Cluster>,
        source: Arc<Source>,
        author: crate::writeback::Author,
        triggers: crate::agent::Triggers,
        shards: Option<Arc<crate::shards::Shards>>,
    ) -> GitHubTask {
        let fence = shards.as_ref().map(crate::shards::Shards::fence);
        let pending: Arc<std::sync::Mutex<Option<(SyncReport, bool)>>> = Arc::default();
        let wake = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn({
            let (pending, wake) = (pending.clone(), wake.clone());
            let waves = crate::report::wave::WaveRetries::default();
            // Each app's term of this replica's hold when its Rollouts were last reported.
            let mut reported = HashMap::new();
            async move {
                loop {
                    wake.notified().await;
                    let Some((report, look)) = pending.lock().unwrap_or_else(|e| e.into_inner()).take() else {
                        continue;
                    };
                    // Reports merged while GitHub was slow may hold apps of a shard lost since.
                    let mut report = held_only(report, shards.as_deref());
                    if let Some(shards) = shards.as_deref() {
                        waves.retain_apps(|app| shards.holds_app(app));
                    }
                    let term = |app: &str| shards.as_deref().map_or(Some(0), |shards| shards.term_of_app(app));
                    let terms = catch_up(&mut report, &reported, term, jiff::Timestamp::now());
                    let holds_unchanged = |app: &AppReport| app.rollouts.iter().any(|r| !r.changed);
                    if !look && report.apps.iter().any(holds_unchanged) {
                        // A sync for anything else (a Git poll, a drift) reports
                        // what moved; a release waiting at a gate is looked at on
                        // its own schedule: the command poll, GitHub's events.
                        for app in Arc::make_mut(&mut report.apps) {
                            app.rollouts.retain(|r| r.changed);
                        }
                    }
                    let reporter = GitHubReporter {
                        github: &github,
                        cluster: &cluster,
                        source: &source,
                        author: &author,
                        waves: &waves,
                        fence: fence.as_ref(),
                    };
                    let signalled = reporter.report(&report).await;
                    reported.extend(terms);
                    if signalled {
                        // A decision was handed to a rollout: act on it now.
                        let _ = triggers.try_send(Trigger::Decided);
                    }
                }
            }
        });
        GitHubTask { pending, wake, task }
    }

    /// Queues the report; one not yet reported is replaced, keeping what
    /// changed in it and the apps the newer one did not sync.
    pub(super) fn submit(&self, report: SyncReport, look: bool) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let merged = match pending.take() {
            Some((older, looked)) => (merged_reports(older, report), looked || look),
            None => (report, look),
        };
        *pending = Some(merged);
        self.wake.notify_one();
    }
}

/// `newer` over `older`: a rollout changed in either changed; when `newer`
/// is scoped, an app only `older` holds (the newer sync did not look at it)
/// is kept as it was. A full sync's report holds every app there still is.
fn merged_reports(older: SyncReport, mut newer: SyncReport) -> SyncReport {
    let changed: BTreeSet<(String, String)> = older
        .apps
        .iter()
        .flat_map(|a| a.rollouts.iter())
        .filter(|r| r.changed)
        .map(|r| (r.namespace.clone(), r.name.clone()))
        .collect();
    let apps = Arc::make_mut(&mut newer.apps);
    for rollout in apps.iter_mut().flat_map(|a| a.rollouts.iter_mut()) {
        rollout.changed |= changed.contains(&(rollout.namespace.clone(), rollout.name.clone()));
    }
    if newer.scoped {
        for app in older.apps.iter() {
            if !apps.iter().any(|a| a.app == app.app) {
                apps.push(app.clone());
            }
        }
        newer.scoped = older.scoped;
    }
    newer
}

impl Drop for GitHubTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The first report of an app in a term of this replica's hold on it (the
/// first after the agent starts, or after it takes the app's shard) tells
/// GitHub its Rollouts that may have moved unreported, changed or not: the
/// replica before it may have been cut off between a transition and its
/// comment, and the transition is not seen again. A Rollout at rest
/// (Healthy or Failed) for longer than `SETTLED` is left out: its comment
/// was made long ago, and a restart must not spend GitHub's quota on every
/// Rollout there is. Returns the term of each app reported.
fn catch_up(
    report: &mut SyncReport,
    reported: &HashMap<String, u64>,
    term: impl Fn(&str) -> Option<u64>,
    now: jiff::Timestamp,
) -> Vec<(String, u64)> {
    let mut terms = Vec::new();
    let mut new_terms = Vec::new();
    for (index, app) in report.apps.iter().enumerate() {
        let Some(current) = term(&app.app) else { continue };
        if reported.get(&app.app) != Some(&current) {
            new_terms.push(index);
        }
        terms.push((app.app.clone(), current));
    }
    let unsaid = |r: &RolloutSummary| !r.changed && !settled(&r.status, now);
    // The report is shared with the memo: copied only when something changes.
    if new_terms
        .iter()
        .any(|&index| report.apps[index].rollouts.iter().any(unsaid))
    {
        let apps = Arc::make_mut(&mut report.apps);
        for index in new_terms {
            for rollout in apps[index].rollouts.iter_mut().filter(|r| !settled(&r.status, now)) {
                rollout.changed = true;
            }
        }
    }
    terms
}

/// How long a Rollout stays at rest before a new term no longer reports it.
const SETTLED: std::time::Duration = std::time::Duration::from_secs(3600);

fn settled(status: &crate::rollout::api::RolloutStatus, now: jiff::Timestamp) -> bool {
    use crate::rollout::api::Phase;
    let at_rest = matches!(status.phase, Phase::Healthy | Phase::Failed);
    // The newest time the status names: its last update, a step's start or end.
    let times = status.canary_status.iter().map(|c| c.last_update_time.as_str());
    let steps = status
        .step_history
        .iter()
        .flat_map(|s| [s.started_at.as_str(), s.finished_at.as_str()]);
    let moved = times
        .chain(steps)
        .filter_map(|t| t.parse::<jiff::Timestamp>().ok())
        .max();
    at_rest && moved.is_none_or(|moved| now.duration_since(moved).unsigned_abs() > SETTLED)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{catch_up, merged_reports};
    use crate::agent::requeue::tests::{app, report};

    #[test]
    fn a_pending_report_keeps_what_a_scoped_one_did_not_look_at_but_not_what_left_git() {
        let names = |report: &crate::sync::SyncReport| {
            let mut names: Vec<String> = report.apps.iter().map(|a| a.app.clone()).collect();
            names.sort();
            names
        };
        let mut older = report(vec![app("web", None, false), app("shop", None, true)]);
        std::sync::Arc::make_mut(&mut older.apps)[1].rollouts[0].changed = true;
        let mut scoped = report(vec![app("web", None, false)]);
        scoped.scoped = true;
        let merged = merged_reports(older.clone(), scoped);
        assert_eq!(names(&merged), vec!["shop", "web"]);
        assert!(
            merged.apps.iter().any(|a| a.app == "shop" && a.rollouts[0].changed),
            "still to report"
        );
        assert!(!merged.scoped);

        let full = report(vec![app("web", None, false)]);
        assert_eq!(names(&merged_reports(older, full)), vec!["web"], "shop left Git");
    }

    #[test]
    fn an_app_first_reported_in_a_new_term_tells_github_every_rollout_that_may_have_moved() {
        let changed = |report: &crate::sync::SyncReport, name: &str| {
            report.apps.iter().find(|a| a.app == name).expect("the app").rollouts[0].changed
        };
        let now: jiff::Timestamp = "2026-12-05T12:00:00Z".parse().expect("a time");
        let reported = HashMap::from([("web".to_string(), 3), ("shop".to_string(), 1)]);
        // Paused (under way): web, shop, cart; done 90 minutes ago: old; 30 minutes ago: fresh.
        let mut synced = report(vec![
            app("web", None, true),
            app("shop", None, true),
            app("cart", None, true),
            app("old", None, false),
            app("fresh", None, false),
        ]);
        for (app, at) in [("old", "2026-12-05T10:30:00Z"), ("fresh", "2026-12-05T11:30:00Z")] {
            let apps = std::sync::Arc::make_mut(&mut synced.apps);
            let app = apps.iter_mut().find(|a| a.app == app).expect("the app");
            app.rollouts[0].status.step_history = vec![crate::rollout::api::StepRecord {
                step: 1,
                started_at: "2026-12-05T10:00:00Z".into(),
                finished_at: at.into(),
                ..Default::default()
            }];
        }
        // web: held since its last report; shop: taken again since; the others: never reported.
        let terms = catch_up(
            &mut synced,
            &reported,
            |app| match app {
                "web" => Some(3),
                "shop" => Some(2),
                _ => Some(1),
            },
            now,
        );
        assert!(!changed(&synced, "web"), "reported in this term already");
        assert!(changed(&synced, "shop"), "another replica may have held it in between");
        assert!(changed(&synced, "cart"), "never reported by this replica");
        assert!(
            !changed(&synced, "old"),
            "at rest for 90 minutes: its comment was made long ago"
        );
        assert!(
            changed(&synced, "fresh"),
            "at rest for 30 minutes: its last comment may be missing"
        );
        assert_eq!(terms.len(), 5);
        assert!(terms.contains(&("shop".to_string(), 2)));

        let mut lost = report(vec![app("web", None, true)]);
        assert!(
            catch_up(&mut lost, &reported, |_| None, now).is_empty(),
            "a shard not held records nothing"
        );

        // Nothing to tell: the report the memo shares is not copied.
        let mut same_term = report(vec![app("web", None, true)]);
        let shared = same_term.apps.clone();
        catch_up(&mut same_term, &reported, |_| Some(3), now);
        assert!(std::sync::Arc::ptr_eq(&shared, &same_term.apps));
    }
}
