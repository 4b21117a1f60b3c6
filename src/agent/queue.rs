//! The queue of triggers the reconcile loop answers. A full queue drops
//! nothing silently: what a trigger it cannot take asked for (a sync of its
//! app, a load of the head, a look at GitHub) is marked, and the next burst
//! does it, for every app.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::Trigger;
use super::requeue::Requeues;

/// What the triggers a full queue refused asked for besides a sync of
/// every app, merged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refused {
    pub reads_source: bool,
    pub looks_at_github: bool,
}

/// The mark's bits: something was refused; what it asked for.
const ANY: u8 = 1;
const READS_SOURCE: u8 = 2;
const LOOKS_AT_GITHUB: u8 = 4;

impl Refused {
    fn bits_of(trigger: &Trigger) -> u8 {
        let github = matches!(trigger, Trigger::Decided | Trigger::GitHubEvent) || trigger.looks_at_github();
        ANY | if trigger.reads_source() { READS_SOURCE } else { 0 } | if github { LOOKS_AT_GITHUB } else { 0 }
    }

    fn of_bits(bits: u8) -> Option<Refused> {
        (bits & ANY != 0).then_some(Refused {
            reads_source: bits & READS_SOURCE != 0,
            looks_at_github: bits & LOOKS_AT_GITHUB != 0,
        })
    }
}

/// Where triggers are sent from (watches, the webhook server, the poller,
/// GitHub, shards).
#[derive(Clone)]
pub struct Triggers {
    sender: mpsc::Sender<Trigger>,
    refused: Arc<AtomicU8>,
}

impl Triggers {
    /// Queues `trigger` without waiting; whether it was. When the queue is
    /// full it is not queued, and what it asked for is marked for the
    /// loop's next burst.
    pub fn try_send(&self, trigger: Trigger) -> bool {
        match self.sender.try_send(trigger) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(trigger)) => {
                self.refused.fetch_or(Refused::bits_of(&trigger), Ordering::SeqCst);
                // Room made meanwhile: the loop may be waiting on an empty
                // queue and would not see the mark until the next trigger.
                let _ = self.sender.try_send(Trigger::Overflowed(Refused::default()));
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Queues `trigger`, waiting for room.
    pub async fn send(&self, trigger: Trigger) -> Result<(), mpsc::error::SendError<Trigger>> {
        self.sender.send(trigger).await
    }

    /// Whether the loop is gone.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// What the reconcile loop reads triggers from.
pub struct TriggerQueue {
    queue: mpsc::Receiver<Trigger>,
    refused: Arc<AtomicU8>,
}

impl TriggerQueue {
    pub async fn recv(&mut self) -> Option<Trigger> {
        self.queue.recv().await
    }

    pub fn try_recv(&mut self) -> Result<Trigger, mpsc::error::TryRecvError> {
        self.queue.try_recv()
    }

    fn any_refused(&self) -> bool {
        self.refused.load(Ordering::SeqCst) != 0
    }
}

/// Capacity of the trigger queue; a trigger past it is marked, not kept.
const TRIGGER_QUEUE: usize = 64;
/// Quiet time that coalesces bursts of triggers into one sync.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The triggers one sync answers. Bursts (drift events, file saves) are
/// merged over a quiet period; a due timer, a webhook or a signal is acted
/// on at once, even when it arrives or falls due during a burst's quiet
/// period (a pause that ends while a canary's pods report in is not held
/// back for them). A trigger the full queue refused is acted on at once too:
/// it may have been a signal.
#[cfg(test)]
pub(super) async fn next_burst(first: Trigger, queue: &mut TriggerQueue, requeues: &mut Requeues) -> Vec<Trigger> {
    next_burst_until(first, queue, requeues, std::future::pending::<()>())
        .await
        .0
}

/// [`next_burst`], whose quiet period `landing` cuts short: a sync that
/// lands meanwhile is answered at once (its write-back, its timers), with
/// the burst gathered so far.
pub(super) async fn next_burst_until<L>(
    first: Trigger,
    queue: &mut TriggerQueue,
    requeues: &mut Requeues,
    landing: impl std::future::Future<Output = L>,
) -> (Vec<Trigger>, Option<L>) {
    tokio::pin!(landing);
    let mut landed = None;
    let mut burst = vec![first];
    while !queue.any_refused() && burst.iter().all(Trigger::may_wait) {
        tokio::select! {
            // A timer due at the same moment as the quiet period's end is not left to chance.
            biased;
            due = requeues.next_due() => burst.push(Trigger::Due(due)),
            answer = &mut landing => {
                landed = Some(answer);
                break;
            }
            next = tokio::time::timeout(DEBOUNCE, queue.queue.recv()) => match next {
                Ok(Some(next)) => burst.push(next),
                _ => break,
            },
        }
    }
    while let Ok(next) = queue.queue.try_recv() {
        burst.push(next);
    }
    // After the queue is emptied: a trigger refused before it is seen here.
    if let Some(refused) = Refused::of_bits(queue.refused.swap(0, Ordering::SeqCst)) {
        burst.push(Trigger::Overflowed(refused));
    }
    (burst, landed)
}

pub fn trigger_channel() -> (Triggers, TriggerQueue) {
    let (sender, queue) = mpsc::channel(TRIGGER_QUEUE);
    let refused = Arc::new(AtomicU8::new(0));
    let triggers = Triggers {
        sender,
        refused: refused.clone(),
    };
    (triggers, TriggerQueue { queue, refused })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::plan::RequeueReason;
    use std::time::Duration;

    /// The burst that follows a full queue of drift and one refused `trigger`.
    async fn burst_after_refusing(trigger: Trigger) -> Vec<Trigger> {
        let (triggers, mut queue) = trigger_channel();
        for _ in 0..TRIGGER_QUEUE {
            assert!(triggers.try_send(Trigger::Drift(None)), "room");
        }
        assert!(!triggers.try_send(trigger), "the queue is full");
        let first = queue.recv().await.expect("queued");
        next_burst(first, &mut queue, &mut Requeues::default()).await
    }

    #[tokio::test]
    async fn what_a_full_queue_refuses_is_done_by_the_next_burst_for_every_app() {
        let refusals = [
            (Trigger::Webhook, true, false),
            (Trigger::Pushed, true, false),
            (Trigger::GitHubEvent, false, true),
            (Trigger::Decided, false, true),
            (Trigger::Shards, false, false),
            (Trigger::Drift(None), false, false),
        ];
        for (trigger, reads_source, looks_at_github) in refusals {
            let what = format!("{trigger:?}");
            let burst = burst_after_refusing(trigger).await;
            assert_eq!(burst.len(), TRIGGER_QUEUE + 1, "{what}: every drift, and the mark");
            let mark = burst.last().expect("a trigger");
            let expected = Refused {
                reads_source,
                looks_at_github,
            };
            assert!(
                matches!(mark, Trigger::Overflowed(refused) if *refused == expected),
                "{what}: {mark:?}"
            );
            assert_eq!(mark.reads_source(), reads_source, "{what}");
            assert_eq!(mark.looks_at_github(), looks_at_github, "{what}");
            assert!(mark.syncs_the_loaded_revision(), "{what}");
            let owners = super::super::scope::Owners::default();
            assert_eq!(
                super::super::scope::apps_of(&[mark], &owners),
                None,
                "{what}: every app"
            );
        }
    }

    #[tokio::test]
    async fn a_signal_the_full_queue_refused_ends_a_burst_of_drift_at_once() {
        let (triggers, mut queue) = trigger_channel();
        for _ in 0..TRIGGER_QUEUE {
            assert!(triggers.try_send(Trigger::Drift(None)), "room");
        }
        assert!(!triggers.try_send(Trigger::Signal(None)), "the queue is full");
        // More drift every 30 ms for 1.2 s, each within the quiet period.
        let storm = triggers.clone();
        let sender = tokio::spawn(async move {
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = storm.send(Trigger::Drift(None)).await;
            }
        });
        let first = queue.recv().await.expect("queued");
        let burst = next_burst(first, &mut queue, &mut Requeues::default()).await;
        sender.abort();
        assert!(burst.iter().any(|t| matches!(t, Trigger::Overflowed(_))));
        let drifts = burst.iter().filter(|t| matches!(t, Trigger::Drift(_))).count();
        assert!(
            drifts < TRIGGER_QUEUE + 20,
            "the sync waited for the drift to end: {drifts} drift triggers"
        );
    }

    #[tokio::test]
    async fn a_signal_ends_a_burst_of_drift_at_once() {
        let (triggers, mut queue) = trigger_channel();
        // Drift every 30 ms for 1.2 s (each within the quiet period of the
        // one before), a promote or abort token after the third.
        let sender = tokio::spawn(async move {
            for i in 0..40 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = triggers.send(Trigger::Drift(None)).await;
                if i == 2 {
                    let _ = triggers.send(Trigger::Signal(None)).await;
                }
            }
        });
        let burst = next_burst(Trigger::Drift(None), &mut queue, &mut Requeues::default()).await;
        sender.abort();
        assert!(burst.iter().any(|t| matches!(t, Trigger::Signal(_))));
        let drifts = burst.iter().filter(|t| matches!(t, Trigger::Drift(_))).count();
        assert!(
            drifts < 20,
            "the sync waited for the drift to end: {drifts} drift triggers"
        );
    }

    // Paused time: the clock moves only when every task waits, so "at once" is exact.
    #[tokio::test(start_paused = true)]
    async fn a_timer_that_falls_due_ends_a_burst_of_drift_at_once() {
        let (_triggers, mut queue) = trigger_channel();
        let start = tokio::time::Instant::now();
        for (due_in, what) in [(10, "before"), (100, "as")] {
            let mut requeues = Requeues::default();
            let pause_ends = tokio::time::Instant::now() + Duration::from_millis(due_in);
            requeues.retry([("echo".to_string(), RequeueReason::Pause)], pause_ends);
            let burst = next_burst(Trigger::Drift(None), &mut queue, &mut requeues).await;
            assert!(
                burst.iter().any(|t| matches!(t, Trigger::Due(due) if due.len() == 1)),
                "a pause that ends {what} the quiet period does: {} triggers",
                burst.len()
            );
            assert_eq!(tokio::time::Instant::now(), pause_ends, "taken when it fell due");
        }
        assert!(start.elapsed() < Duration::from_millis(200));
    }

    // Paused time, as above.
    #[tokio::test(start_paused = true)]
    async fn a_sync_that_lands_ends_a_burst_of_drift_at_once_and_comes_with_it() {
        let (triggers, mut queue) = trigger_channel();
        // Drift every 30 ms for 1.2 s; a sync in flight lands after 50 ms.
        let sender = tokio::spawn(async move {
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = triggers.send(Trigger::Drift(None)).await;
            }
        });
        let start = tokio::time::Instant::now();
        let landing = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            "web's sync"
        };
        let (burst, landed) =
            next_burst_until(Trigger::Drift(None), &mut queue, &mut Requeues::default(), landing).await;
        sender.abort();
        assert_eq!(landed, Some("web's sync"));
        assert_eq!(start.elapsed(), Duration::from_millis(50), "answered when it landed");
        assert_eq!(burst.len(), 2, "the drift so far: {burst:?}");
    }

    #[tokio::test]
    async fn drift_alone_is_merged_until_it_is_quiet() {
        let (triggers, mut queue) = trigger_channel();
        for _ in 0..5 {
            triggers.send(Trigger::Drift(None)).await.expect("queued");
        }
        let burst = next_burst(Trigger::Drift(None), &mut queue, &mut Requeues::default()).await;
        assert_eq!(burst.len(), 6);
    }
}
