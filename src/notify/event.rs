//! What a release tells the team: the events a Rollout's status implies,
//! each with a key that names it once, and the bodies Slack, Microsoft
//! Teams and a generic webhook take. Pure.

use serde_json::{Value, json};

use crate::rollout::api::{Phase, RolloutSpec, RolloutStatus, WritebackAction, bounded_line};

/// Facts told beside an event's line: (title, value).
pub type Facts = Vec<(&'static str, String)>;

/// One thing that happened to a release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Names the event once: a release's step passes once, however many
    /// syncs see it passed.
    pub key: String,
    pub kind: Kind,
    pub namespace: String,
    pub rollout: String,
    pub rollout_id: String,
    /// The commit being released.
    pub commit: String,
    /// One line, as the pull-request comment would say it.
    pub text: String,
    /// Facts beside the line: (title, value).
    pub facts: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Started,
    StepPassed,
    Waiting,
    Promoted,
    Failed,
    Aborted,
    /// A release refused before it started (its canary could not be made).
    Refused,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Started => "started",
            Kind::StepPassed => "step-passed",
            Kind::Waiting => "waiting",
            Kind::Promoted => "promoted",
            Kind::Failed => "failed",
            Kind::Aborted => "aborted",
            Kind::Refused => "refused",
        }
    }
}

/// Characters of Git's or a server's text carried into a message at most.
const SHOWN: usize = 300;

/// Every event the status of a release implies so far, in the order they
/// happened. An outcome is told once its Git write-back is done (or none
/// is pending), so that the revert commit is in it.
pub fn implied(namespace: &str, name: &str, spec: &RolloutSpec, status: &RolloutStatus) -> Vec<Event> {
    let id = status.rollout_id.as_str();
    let refused = refusal(namespace, name, spec, status);
    if id.is_empty() {
        return refused.into_iter().collect();
    }
    // Promote moves the release's commit to stable.
    let commit = if status.canary_commit.is_empty() {
        status.stable_commit.clone()
    } else {
        status.canary_commit.clone()
    };
    // A Rollout may keep one rolloutID across releases: its start tells them apart.
    let started = status.step_history.first().map_or("", |r| r.started_at.as_str());
    let event = |kind: Kind, key: String, text: String, facts: Vec<(&'static str, String)>| Event {
        key: format!("{}{key}", release_key(namespace, name, id, started)),
        kind,
        namespace: namespace.to_string(),
        rollout: name.to_string(),
        rollout_id: id.to_string(),
        commit: commit.clone(),
        text,
        facts,
    };
    let release = format!("{namespace}/{name} release {id}");
    let mut events = vec![event(
        Kind::Started,
        "started".into(),
        format!("{release} started"),
        vec![
            ("commit", short(&commit)),
            ("steps", spec.strategy.canary.steps.len().to_string()),
        ],
    )];
    for record in status.step_history.iter().filter(|r| !r.finished_at.is_empty()) {
        let by = if record.passed_by.is_empty() {
            "its conditions".to_string()
        } else {
            bounded_line(&record.passed_by, SHOWN)
        };
        events.push(event(
            Kind::StepPassed,
            format!("step-{}", record.step),
            format!("{release}: step {} passed", record.step),
            vec![("passed by", by)],
        ));
    }
    let canary = status.canary_status.clone().unwrap_or_default();
    let step = canary.current_step_index;
    let waits_for_promote = spec
        .strategy
        .canary
        .steps
        .get(step.saturating_sub(1) as usize)
        .and_then(|s| s.pause.as_ref())
        .is_some_and(|p| p.duration.is_none());
    if status.phase == Phase::Paused && waits_for_promote {
        events.push(event(
            Kind::Waiting,
            format!("waiting-{step}"),
            format!("{release} waits at step {step} for a promote (`/gitcanary promote`, an approval of its promotion pull request, or `gitcanary promote`)"),
            vec![("traffic", canary.traffic.clone())],
        ));
    }
    if let Some((kind, text, facts)) = outcome(status, &release, &canary.message) {
        events.push(event(kind, "outcome".into(), text, facts));
    }
    events.extend(refused);
    events
}

/// A release refused before it started: told once per commit and reason.
/// Its key is under the last release's, which the status still names.
fn refusal(namespace: &str, name: &str, spec: &RolloutSpec, status: &RolloutStatus) -> Option<Event> {
    if status.refused_commit.is_empty() || status.phase != Phase::Failed {
        return None;
    }
    let commit = &status.refused_commit;
    let message = status.canary_status.as_ref().map_or("", |c| c.message.as_str());
    let cause = bounded_line(message, SHOWN);
    let started = status.step_history.first().map_or("", |r| r.started_at.as_str());
    let reason = hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(cause.as_bytes())[..6]);
    Some(Event {
        key: format!(
            "{}refused-{commit}-{reason}",
            release_key(namespace, name, &status.rollout_id, started)
        ),
        kind: Kind::Refused,
        namespace: namespace.to_string(),
        rollout: name.to_string(),
        // The id the release would have had.
        rollout_id: crate::rollout::plan::release_id(spec.rollout_id.as_deref(), commit),
        commit: commit.clone(),
        text: format!(
            "{namespace}/{name}: the release of {} was refused; nothing changed",
            short(commit)
        ),
        facts: vec![("commit", short(commit)), ("cause", cause)],
    })
}

/// How a release ended, once it did and Git holds it: the write-back of
/// the release done (an earlier release of the same id told its own).
fn outcome(status: &RolloutStatus, release: &str, message: &str) -> Option<(Kind, String, Facts)> {
    let id = status.rollout_id.as_str();
    let in_flight = matches!(
        status.phase,
        Phase::Progressing | Phase::Paused | Phase::Promoting | Phase::Reverting
    );
    let pending = in_flight || status.pending_writeback.as_ref().is_some_and(|p| p.rollout_id == id);
    let written = status
        .written_back
        .as_ref()
        .filter(|w| w.rollout_id == id && !pending)?;
    let written_commit = short(&written.commit);
    if written.action == WritebackAction::Promote {
        let mut facts = vec![("commit", short(&status.stable_commit))];
        if !written_commit.is_empty() {
            facts.push(("status commit", written_commit));
        }
        return Some((Kind::Promoted, format!("{release} promoted"), facts));
    }
    let cause = bounded_line(message, SHOWN);
    let kind = if cause.starts_with("aborted by") {
        Kind::Aborted
    } else {
        Kind::Failed
    };
    let verb = if kind == Kind::Aborted { "aborted" } else { "failed" };
    let mut facts = vec![("cause", cause)];
    let text = match written.action {
        WritebackAction::Revert => {
            facts.push(("revert commit", written_commit));
            format!("{release} {verb}: traffic back on stable, canary removed, reverted in Git")
        }
        _ => format!("{release} {verb}: traffic back on stable, canary removed, held (Git still asks for it)"),
    };
    Some((kind, text, facts))
}

/// What every key of one release starts with.
pub fn release_key(namespace: &str, name: &str, id: &str, started: &str) -> String {
    format!("{namespace}/{name}/{id}@{started}/")
}

fn short(commit: &str) -> String {
    commit.chars().take(12).collect()
}

/// A Slack incoming webhook's message: the line as text (shown in
/// notifications) and as a section block, the facts as a context block.
pub fn slack(event: &Event) -> Value {
    let facts: Vec<Value> = event
        .facts
        .iter()
        .map(|(title, value)| json!({"type": "mrkdwn", "text": format!("*{title}:* {}", slack_escape(value)), "verbatim": true}))
        .collect();
    let mut blocks = vec![
        json!({"type": "section", "text": {"type": "mrkdwn", "text": slack_escape(&event.text), "verbatim": true}}),
    ];
    if !facts.is_empty() {
        blocks.push(json!({"type": "context", "elements": facts}));
    }
    json!({"text": event.text, "blocks": blocks})
}

/// Slack's three control characters in mrkdwn (and `verbatim`, so that
/// Git's text makes no link or channel of itself).
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A Microsoft Teams incoming webhook's message: an Adaptive Card with the
/// line and the facts as a FactSet.
pub fn teams(event: &Event) -> Value {
    let facts: Vec<Value> = event
        .facts
        .iter()
        .map(|(title, value)| json!({"title": title, "value": teams_escape(value)}))
        .collect();
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": [
                    {"type": "TextBlock", "text": teams_escape(&event.text), "wrap": true, "weight": "Bolder"},
                    {"type": "FactSet", "facts": facts}
                ]
            }
        }]
    })
}

/// Teams renders Markdown in a card's text: Git's text makes no link or
/// emphasis of itself.
fn teams_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\`*_[]()<>#~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A generic webhook's body: every field of the event.
pub fn webhook(event: &Event) -> Value {
    let facts: serde_json::Map<String, Value> = event
        .facts
        .iter()
        .map(|(title, value)| (title.to_string(), json!(value)))
        .collect();
    json!({
        "event": event.kind.as_str(),
        "id": event.key,
        "rollout": {"namespace": event.namespace, "name": event.rollout},
        "rolloutID": event.rollout_id,
        "commit": event.commit,
        "text": event.text,
        "facts": facts,
    })
}

pub use crate::rollout::web::signature;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::api::{CanaryStatus, PendingWriteback, StepRecord, WrittenBack};

    fn spec(pauses: &[Option<u64>]) -> RolloutSpec {
        let mut spec = RolloutSpec::default();
        spec.strategy.canary.steps = pauses
            .iter()
            .map(|d| crate::rollout::api::CanaryStep {
                pause: Some(crate::rollout::api::Pause {
                    duration: d.map(crate::rollout::api::Duration::Seconds),
                }),
                ..Default::default()
            })
            .collect();
        spec
    }

    fn kinds(events: &[Event]) -> Vec<&'static str> {
        events.iter().map(|e| e.kind.as_str()).collect()
    }

    #[test]
    fn a_refused_release_is_told_once_per_commit_and_reason() {
        let spec = spec(&[None]);
        let mut status = RolloutStatus {
            rollout_id: "r1".into(),
            phase: Phase::Failed,
            refused_commit: "abc1234def5678".into(),
            canary_status: Some(CanaryStatus {
                message: "the canary Service echo-canary would select no canary pod".into(),
                ..CanaryStatus::default()
            }),
            ..RolloutStatus::default()
        };
        let events = implied("shop", "web", &spec, &status);
        let refused: Vec<&Event> = events.iter().filter(|e| e.kind == Kind::Refused).collect();
        assert_eq!(refused.len(), 1, "{events:?}");
        assert_eq!(refused[0].rollout_id, "abc1234", "the id the release would have had");
        assert!(
            refused[0].key.starts_with("shop/web/r1@/refused-abc1234def5678-"),
            "{}",
            refused[0].key
        );
        assert_eq!(
            refused[0].facts[1].1,
            "the canary Service echo-canary would select no canary pod"
        );
        let again = implied("shop", "web", &spec, &status);
        assert_eq!(again, events, "the same refusal, the same key");
        status.canary_status.as_mut().unwrap().message = "another reason".into();
        let other = implied("shop", "web", &spec, &status);
        assert_ne!(
            other.last().map(|e| &e.key),
            Some(&refused[0].key),
            "another reason is told"
        );
        status.refused_commit.clear();
        assert!(
            implied("shop", "web", &spec, &status)
                .iter()
                .all(|e| e.kind != Kind::Refused)
        );
    }

    #[test]
    fn a_release_tells_its_start_steps_wait_and_outcome_once_git_holds_it() {
        let spec = spec(&[Some(60), None]);
        let mut status = RolloutStatus::default();
        assert!(
            implied("shop", "web", &spec, &status).is_empty(),
            "no release, nothing to tell"
        );
        status.rollout_id = "abc1234".into();
        status.canary_commit = "abc1234def5678".into();
        status.phase = Phase::Progressing;
        let started = implied("shop", "web", &spec, &status);
        assert_eq!(kinds(&started), ["started"]);
        assert_eq!(started[0].key, "shop/web/abc1234@/started");
        assert_eq!(started[0].facts[0], ("commit", "abc1234def56".to_string()));
        status.step_history = vec![StepRecord {
            step: 1,
            started_at: "t0".into(),
            finished_at: "t1".into(),
            passed_by: "timer".into(),
        }];
        status.phase = Phase::Paused;
        status.canary_status = Some(CanaryStatus {
            current_step_index: 2,
            traffic: "20%".into(),
            ..CanaryStatus::default()
        });
        assert_eq!(
            kinds(&implied("shop", "web", &spec, &status)),
            ["started", "step-passed", "waiting"]
        );
        // Promoted: told only once the write-back is done.
        status.phase = Phase::Healthy;
        status.stable_commit = "abc1234def5678".into();
        status.pending_writeback = Some(PendingWriteback {
            action: WritebackAction::Promote,
            rollout_id: "abc1234".into(),
            ..PendingWriteback::default()
        });
        assert_eq!(
            kinds(&implied("shop", "web", &spec, &status)),
            ["started", "step-passed"]
        );
        status.pending_writeback = None;
        status.written_back = Some(WrittenBack {
            action: WritebackAction::Promote,
            rollout_id: "abc1234".into(),
            commit: "feed0000beef1111".into(),
            note: String::new(),
        });
        let done = implied("shop", "web", &spec, &status);
        assert_eq!(kinds(&done), ["started", "step-passed", "promoted"]);
        assert_eq!(done[2].facts[1], ("status commit", "feed0000beef".to_string()));
        // An earlier release's write-back tells nothing of this one.
        status.rollout_id = "fff0000".into();
        assert_eq!(
            kinds(&implied("shop", "web", &spec, &status)),
            ["started", "step-passed"]
        );
        // Nor of the next release under the same rolloutID: its own start
        // names its keys, and it has no outcome while it runs.
        status.rollout_id = "abc1234".into();
        status.phase = Phase::Progressing;
        status.step_history[0].started_at = "t9".into();
        status.step_history[0].finished_at.clear();
        let again = implied("shop", "web", &spec, &status);
        assert_eq!(kinds(&again), ["started"]);
        assert_ne!(again[0].key, started[0].key);
    }

    #[test]
    fn a_failure_or_an_abort_is_told_with_its_cause_and_revert_commit() {
        let spec = spec(&[None]);
        let mut status = RolloutStatus {
            rollout_id: "r2".into(),
            phase: Phase::Healthy,
            canary_status: Some(CanaryStatus {
                message: "canary pods not ready within 5s\nsecond line".into(),
                ..CanaryStatus::default()
            }),
            written_back: Some(WrittenBack {
                action: WritebackAction::Revert,
                rollout_id: "r2".into(),
                commit: "0123456789abcdef".into(),
                note: String::new(),
            }),
            ..RolloutStatus::default()
        };
        let failed = implied("shop", "web", &spec, &status).pop().unwrap();
        assert_eq!(failed.kind, Kind::Failed);
        assert_eq!(failed.key, "shop/web/r2@/outcome");
        assert_eq!(
            failed.facts,
            [
                ("cause", "canary pods not ready within 5s second line".to_string()),
                ("revert commit", "0123456789ab".to_string())
            ]
        );
        status.canary_status.as_mut().unwrap().message = "aborted by alice".into();
        assert_eq!(
            implied("shop", "web", &spec, &status).pop().unwrap().kind,
            Kind::Aborted
        );
    }

    #[test]
    fn the_bodies_are_slacks_teams_and_a_signed_webhooks() {
        let event = Event {
            key: "shop/web/r2/outcome".into(),
            kind: Kind::Failed,
            namespace: "shop".into(),
            rollout: "web".into(),
            rollout_id: "r2".into(),
            commit: "abc".into(),
            text: "shop/web release r2 failed".into(),
            facts: vec![("cause", "<@here> & more".into())],
        };
        let slack = slack(&event);
        assert_eq!(slack["text"], "shop/web release r2 failed");
        assert_eq!(
            slack["blocks"][1]["elements"][0]["text"], "*cause:* &lt;@here&gt; &amp; more",
            "Git's text cannot mention a channel"
        );
        let teams = teams(&event);
        let card = &teams["attachments"][0];
        assert_eq!(card["contentType"], "application/vnd.microsoft.card.adaptive");
        assert_eq!(
            card["content"]["body"][1]["facts"][0],
            json!({"title": "cause", "value": "\\<@here\\> & more"})
        );
        assert_eq!(teams_escape("[approve](https://x)"), "\\[approve\\]\\(https://x\\)");
        assert_eq!(slack["blocks"][0]["text"]["verbatim"], true, "no bare URL made a link");
        let hook = webhook(&event);
        assert_eq!(hook["event"], "failed");
        assert_eq!(hook["facts"]["cause"], "<@here> & more");
        // The HMAC-SHA256 test vector of RFC 4231, case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
