//! The agent's own poll of the source, from a thread of its own. At rest
//! it asks the branch's head itself and wakes the loop only when there is
//! something to do: the same head at rest would be fetched, loaded and
//! synced only to give the last sync's answer again.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::debug;

use super::{Agent, Trigger, Triggers};
use crate::cluster::Cluster;
use crate::source::{HeadReader, Revision, Source};
use crate::telemetry::Metrics;

/// Where the agent is at rest, if it is: GitHub is off and its last sync
/// was a whole one answered from memory (nothing it reads moved), of a
/// revision with no problems to read again. Any other sync, and a load that
/// failed, take it away.
#[derive(Default)]
pub struct AtRest(std::sync::Mutex<Option<Rest>>);

/// The branch head at rest, and the watch caches as that sync read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rest {
    pub(super) head: String,
    pub(super) caches: CachesSeen,
}

/// The watch caches' change count and the discovery generation: every
/// event, list, break and own write moves the first, those that wake no
/// sync (an app status ConfigMap edited, a watch broken) included.
pub(super) type CachesSeen = (u64, u64);

impl AtRest {
    pub(super) fn set(&self, rest: Option<Rest>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = rest;
    }

    fn get(&self) -> Option<Rest> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Where a sync leaves the agent at rest, if anywhere: a whole sync
/// answered from memory, of a revision with no problems (a poll reads those
/// again), with GitHub off (its reports, a wave pull request not yet opened
/// say, are tried again by the next sync). `caches`: as read before it.
pub(super) fn rests_on(
    github_on: bool,
    whole: bool,
    recalled: bool,
    revision: &Revision,
    caches: CachesSeen,
) -> Option<Rest> {
    let at_rest = !github_on && whole && recalled && revision.manifests.problems().next().is_none();
    at_rest.then(|| Rest {
        head: revision.commit.clone(),
        caches,
    })
}

/// Whether a poll must wake the loop: unless the agent is at rest, no
/// watch cache moved since, and the branch's head, read now, is still
/// there. A head that cannot be read wakes it too, and the loader's fetch
/// says why.
fn must_wake(
    rest: Option<Rest>,
    caches_now: impl FnOnce() -> CachesSeen,
    read_head: impl FnOnce() -> crate::Result<String>,
) -> bool {
    match rest {
        Some(rest) if caches_now() == rest.caches => match read_head() {
            Ok(head) => head != rest.head,
            Err(error) => {
                debug!(%error, "the poll cannot read the branch's head; the loader fetches");
                true
            }
        },
        _ => true,
    }
}

/// The caches' change count and the discovery generation, now.
pub(super) fn caches_seen(cluster: &Cluster) -> CachesSeen {
    (cluster.watch_cache.changes(), cluster.discovery_generation())
}

impl Agent {
    /// Asks for a poll every `poll_interval`, from a thread of its own:
    /// tokio's timer wheel wakes a worker once per level a long deadline
    /// moves down through (up to three times for 60 s), a thread's sleep
    /// wakes once. It ends at the first tick after the agent stopped.
    /// Without it no new commit is seen unless a webhook tells, so failing
    /// to start it stops the agent.
    pub fn spawn_poller(&self, triggers: Triggers) -> std::io::Result<()> {
        let poller = Poller {
            source: self.source.clone(),
            cluster: self.cluster.clone(),
            at_rest: self.at_rest.clone(),
            metrics: self.metrics.clone(),
        };
        let interval = self.poll_interval;
        std::thread::Builder::new()
            .name("gitcanary-poll".into())
            .spawn(move || poller.poll(&triggers, interval))
            .map(drop)
    }
}

struct Poller {
    source: Arc<Source>,
    cluster: Arc<Cluster>,
    at_rest: Arc<AtRest>,
    metrics: Arc<Metrics>,
}

impl Poller {
    fn poll(&self, triggers: &Triggers, interval: Duration) {
        let mut reader = HeadReader::default();
        loop {
            std::thread::sleep(interval);
            if triggers.is_closed() {
                return;
            }
            let wake = match self.source.git() {
                Some(git) => must_wake(
                    self.at_rest.get(),
                    || caches_seen(&self.cluster),
                    || git.remote_head(&mut reader),
                ),
                // A plain directory has no head to read: each poll loads it.
                None => true,
            };
            if wake {
                let _ = triggers.try_send(Trigger::Poll);
            } else {
                self.metrics.polls_at_rest.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Rest, must_wake, rests_on};
    use crate::Error;
    use crate::source::Revision;

    #[test]
    fn only_a_whole_sync_from_memory_of_a_clean_revision_with_github_off_is_at_rest() {
        let clean = Revision::new("a1".into(), Default::default());
        let rest = Rest {
            head: "a1".into(),
            caches: (7, 2),
        };
        assert_eq!(rests_on(false, true, true, &clean, (7, 2)), Some(rest));
        assert_eq!(
            rests_on(true, true, true, &clean, (7, 2)),
            None,
            "GitHub's retries ride on syncs"
        );
        assert_eq!(
            rests_on(false, false, true, &clean, (7, 2)),
            None,
            "a scoped sync looked at some apps only"
        );
        assert_eq!(
            rests_on(false, true, false, &clean, (7, 2)),
            None,
            "a sync that planned may plan again"
        );
        let mut manifests = crate::manifest::ManifestSet::default();
        manifests.apps.insert(
            "web".into(),
            crate::manifest::App {
                name: "web".into(),
                problems: vec![crate::manifest::Problem {
                    file: "web/Chart.yaml".into(),
                    line: 1,
                    message: "helm is not installed".into(),
                }],
                ..Default::default()
            },
        );
        let with_problems = Revision::new("a1".into(), manifests);
        assert_eq!(
            rests_on(false, true, true, &with_problems, (7, 2)),
            None,
            "problems are read again"
        );
    }

    #[test]
    fn a_poll_wakes_the_loop_unless_the_head_and_the_caches_are_where_they_rested() {
        let rest = || {
            Some(Rest {
                head: "a1".into(),
                caches: (7, 2),
            })
        };
        let head = |id: &'static str| move || Ok(id.to_string());
        let caches = |seen: (u64, u64)| move || seen;
        assert!(
            !must_wake(rest(), caches((7, 2)), head("a1")),
            "at rest, nothing moved: nothing to do"
        );
        assert!(must_wake(rest(), caches((7, 2)), head("b2")), "a new commit is loaded");
        assert!(
            must_wake(rest(), caches((8, 2)), head("a1")),
            "a cache moved (a status ConfigMap edited, a watch broken): the sync looks"
        );
        assert!(must_wake(rest(), caches((7, 3)), head("a1")), "discovery moved");
        assert!(
            must_wake(None, caches((7, 2)), head("a1")),
            "not at rest: the poll's whole sync is needed"
        );
        let unreadable = || Err(Error::Usage("the remote is gone".into()));
        assert!(
            must_wake(rest(), caches((7, 2)), unreadable),
            "the loader's fetch reports why"
        );
        let mut asked = false;
        must_wake(None, caches((7, 2)), || {
            asked = true;
            Ok("a1".to_string())
        });
        assert!(!asked, "the head is read only at rest");
    }
}
