//! The agent's own poll of the source, from a thread of its own. At rest
//! it asks the branch's head itself and wakes the loop only when there is
//! something to do: the same head at rest would be fetched, loaded and
//! synced only to give the last sync's answer again.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Agent, Trigger, Triggers};
use crate::source::{HeadReader, Revision, Source};
use crate::telemetry::Metrics;

/// The branch head the agent is at rest on, if it is: GitHub is off and
/// its last sync was a whole one answered from memory (nothing it reads
/// moved), of a revision with no problems to read again. Any other sync,
/// and a load that failed, take it away.
#[derive(Default)]
pub struct AtRest(std::sync::Mutex<Option<String>>);

impl AtRest {
    pub(super) fn set(&self, head: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = head;
    }

    fn head(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The head a sync leaves the agent at rest on, if any: a whole sync
/// answered from memory, of a revision with no problems (a poll reads those
/// again), with GitHub off (its reports, a wave pull request not yet opened
/// say, are tried again by the next sync).
pub(super) fn rests_on(github_on: bool, whole: bool, recalled: bool, revision: &Revision) -> Option<String> {
    let at_rest = !github_on && whole && recalled && revision.manifests.problems().next().is_none();
    at_rest.then(|| revision.commit.clone())
}

/// Whether a poll must wake the loop: unless the agent is at rest on
/// `head_at_rest` and the branch's head, read now, is still there. A head
/// that cannot be read wakes it too, and the loader's fetch says why.
fn must_wake(head_at_rest: Option<String>, read_head: impl FnOnce() -> crate::Result<String>) -> bool {
    match head_at_rest {
        Some(at_rest) => read_head().map_or(true, |head| head != at_rest),
        None => true,
    }
}

impl Agent {
    /// Asks for a poll every `poll_interval`, from a thread of its own:
    /// tokio's timer wheel wakes a worker once per level a long deadline
    /// moves down through (up to three times for 60 s), a thread's sleep
    /// wakes once. It ends at the first tick after the agent stopped.
    /// Without it no new commit is seen unless a webhook tells, so failing
    /// to start it stops the agent.
    pub fn spawn_poller(&self, triggers: Triggers) -> std::io::Result<()> {
        let (source, at_rest, metrics) = (self.source.clone(), self.at_rest.clone(), self.metrics.clone());
        let interval = self.poll_interval;
        std::thread::Builder::new()
            .name("gitcanary-poll".into())
            .spawn(move || poll(&triggers, interval, &source, &at_rest, &metrics))
            .map(drop)
    }
}

fn poll(triggers: &Triggers, interval: Duration, source: &Source, at_rest: &AtRest, metrics: &Metrics) {
    let mut reader = HeadReader::default();
    loop {
        std::thread::sleep(interval);
        if triggers.is_closed() {
            return;
        }
        let wake = match source.git() {
            Some(git) => must_wake(at_rest.head(), || git.remote_head(&mut reader)),
            // A plain directory has no head to read: each poll loads it.
            None => true,
        };
        if wake {
            let _ = triggers.try_send(Trigger::Poll);
        } else {
            metrics.polls_at_rest.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{must_wake, rests_on};
    use crate::Error;
    use crate::source::Revision;

    #[test]
    fn only_a_whole_sync_from_memory_of_a_clean_revision_with_github_off_is_at_rest() {
        let clean = Revision::new("a1".into(), Default::default());
        assert_eq!(rests_on(false, true, true, &clean).as_deref(), Some("a1"));
        assert_eq!(
            rests_on(true, true, true, &clean),
            None,
            "GitHub's retries ride on syncs"
        );
        assert_eq!(
            rests_on(false, false, true, &clean),
            None,
            "a scoped sync looked at some apps only"
        );
        assert_eq!(
            rests_on(false, true, false, &clean),
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
            rests_on(false, true, true, &with_problems),
            None,
            "problems are read again"
        );
    }

    #[test]
    fn a_poll_wakes_the_loop_unless_the_head_is_still_the_one_at_rest() {
        let head = |id: &'static str| move || Ok(id.to_string());
        assert!(
            !must_wake(Some("a1".into()), head("a1")),
            "at rest, same head: nothing to do"
        );
        assert!(must_wake(Some("a1".into()), head("b2")), "a new commit is loaded");
        assert!(
            must_wake(None, head("a1")),
            "not at rest: the poll's whole sync is needed"
        );
        let unreadable = || Err(Error::Usage("the remote is gone".into()));
        assert!(
            must_wake(Some("a1".into()), unreadable),
            "the loader's fetch reports why"
        );
        let mut asked = false;
        must_wake(None, || {
            asked = true;
            Ok("a1".to_string())
        });
        assert!(!asked, "the head is read only at rest");
    }
}
