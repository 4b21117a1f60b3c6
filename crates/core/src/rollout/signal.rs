//! Promote and abort tokens: which release a signal is for, and whether
//! anything waits for it. Pure, so the CLI, the GitHub path and the planner
//! apply one rule.
//!
//! A token is `release=<rollout uid>/<canary commit>/<rollout id>; by=<who>`.
//! A token naming another release (the one before, a re-created Rollout's,
//! a hand-written one naming none) is never acted on: a promote given while
//! nothing waited must not pass the next release's gate.

use super::api::{Phase, RolloutStatus, Signal, StepState};

/// The one identity of a release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Release {
    /// The Rollout's UID: a Rollout deleted and re-created is another one.
    pub uid: String,
    /// The canary commit, full sha.
    pub canary_commit: String,
    pub rollout_id: String,
}

impl Release {
    /// The release a Rollout runs now, if any.
    pub fn running(uid: &str, status: &RolloutStatus) -> Option<Release> {
        let releasing = matches!(status.phase, Phase::Progressing | Phase::Paused | Phase::Promoting);
        (releasing && !status.canary_commit.is_empty()).then(|| Release {
            uid: uid.to_string(),
            canary_commit: status.canary_commit.clone(),
            rollout_id: status.rollout_id.clone(),
        })
    }

    /// What a person reads: the rollout id, and the commit when it differs.
    pub fn describe(&self) -> String {
        let short = crate::short_commit(&self.canary_commit);
        if self.rollout_id.is_empty() || self.rollout_id == short {
            short.to_string()
        } else {
            format!("{} ({short})", self.rollout_id)
        }
    }
}

const RELEASE_PREFIX: &str = "release=";
const BY_SEPARATOR: &str = "; by=";

/// The annotation value for a signal to `release`, given by `by`.
pub fn token(release: &Release, by: &str) -> String {
    // One line: the token is shown in Events, status and step history.
    let by: String = by.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    format!(
        "{RELEASE_PREFIX}{}/{}/{}{BY_SEPARATOR}{by}",
        release.uid, release.canary_commit, release.rollout_id
    )
}

/// A token read back: the release it names (none when it names none) and who gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub release: Option<Release>,
    pub by: String,
}

pub fn parse(value: &str) -> Token {
    let named = value.strip_prefix(RELEASE_PREFIX).and_then(|rest| {
        let (release, by) = rest.split_once(BY_SEPARATOR)?;
        let mut parts = release.splitn(3, '/');
        let (uid, commit, id) = (parts.next()?, parts.next()?, parts.next()?);
        Some((
            Release {
                uid: uid.to_string(),
                canary_commit: commit.to_string(),
                rollout_id: id.to_string(),
            },
            by.to_string(),
        ))
    });
    match named {
        Some((release, by)) => Token {
            release: Some(release),
            by,
        },
        None => Token {
            release: None,
            by: value.to_string(),
        },
    }
}

/// A signal's token (its annotation on the Rollout) that the status has not
/// acted on yet: the agent wakes for it, the planner reads it.
pub fn unspent<'a>(token: Option<&'a String>, acted_on: &str) -> Option<&'a String> {
    token.filter(|token| token.as_str() != acted_on)
}

/// Whether the Rollout waits for this signal now: a promote only at an
/// indefinite pause or an analysis paused as inconclusive, an abort only
/// while a release runs. `Err` is the reason a person reads.
pub fn awaited(signal: Signal, status: &RolloutStatus) -> Result<(), String> {
    let releasing = matches!(status.phase, Phase::Progressing | Phase::Paused | Phase::Promoting);
    let step_state = status.canary_status.as_ref().map(|c| c.current_step_state);
    match signal {
        Signal::Promote if status.phase == Phase::Paused => Ok(()),
        Signal::Promote if step_state == Some(StepState::StepPaused) => {
            Err("nothing waits for a promote: the release is in a timed pause, which ends by itself".into())
        }
        Signal::Promote if releasing => Err(format!(
            "nothing waits for a promote: the release is at {:?}, not at a pause that asks for one",
            step_state.unwrap_or_default()
        )),
        Signal::Abort if releasing => Ok(()),
        _ => Err(format!(
            "nothing waits for {}: no release is running (the Rollout is {:?})",
            match signal {
                Signal::Promote => "a promote",
                Signal::Abort => "an abort",
            },
            status.phase
        )),
    }
}

/// Why a signal is not for the running release, or `None` when it is.
pub fn mismatch(signal: Signal, value: &str, running: Option<&Release>) -> Option<String> {
    let verb = signal.verb();
    let token = parse(value);
    let Some(running) = running else {
        let named = token.release.map_or_else(|| "no release".to_string(), |r| r.describe());
        let named = crate::rollout::api::bounded_line(&named, 80);
        return Some(format!("{verb} for release {named} ignored: no release is running"));
    };
    match token.release {
        Some(release) if release == *running => None,
        Some(release) => Some(format!(
            "{verb} for release {} ignored: the running release is {}",
            crate::rollout::api::bounded_line(&release.describe(), 80),
            running.describe()
        )),
        None => Some(format!(
            "{verb} {:?} ignored: it names no release (the running release is {}); use `gitcanary {verb}`",
            crate::rollout::api::bounded_line(value, 80),
            running.describe()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::api::CanaryStatus;

    fn release(commit: &str) -> Release {
        Release {
            uid: "uid-1".into(),
            canary_commit: commit.into(),
            rollout_id: crate::short_commit(commit).into(),
        }
    }

    fn status(phase: Phase, state: StepState) -> RolloutStatus {
        RolloutStatus {
            phase,
            canary_commit: "4d5e6f0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".into(),
            rollout_id: "4d5e6f0".into(),
            canary_status: Some(CanaryStatus {
                current_step_state: state,
                ..CanaryStatus::default()
            }),
            ..RolloutStatus::default()
        }
    }

    #[test]
    fn a_token_names_its_release_and_reads_back() {
        let running = release("1a2b3c4ddddddddddddddddddddddddddddddddd");
        let value = token(&running, "the CLI at now\n/gitcanary promote");
        assert!(!value.contains('\n'), "{value}");
        let read = parse(&value);
        assert_eq!(read.release.as_ref(), Some(&running));
        assert_eq!(read.by, "the CLI at now /gitcanary promote");
        assert_eq!(mismatch(Signal::Promote, &value, Some(&running)), None);
    }

    #[test]
    fn a_token_for_another_release_or_none_is_ignored() {
        let old = release("1a2b3c4ddddddddddddddddddddddddddddddddd");
        let running = release("4d5e6f0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        assert_eq!(
            mismatch(Signal::Promote, &token(&old, "x"), Some(&running)).as_deref(),
            Some("promote for release 1a2b3c4 ignored: the running release is 4d5e6f0")
        );
        // Same commit and id, but a re-created Rollout.
        let recreated = Release {
            uid: "uid-2".into(),
            ..running.clone()
        };
        assert!(mismatch(Signal::Abort, &token(&recreated, "x"), Some(&running)).is_some());
        assert!(mismatch(Signal::Promote, "by hand", Some(&running)).is_some());
        assert!(mismatch(Signal::Promote, &token(&running, "x"), None).is_some());
    }

    #[test]
    fn a_promote_is_awaited_only_at_a_pause_that_asks_for_one() {
        assert!(awaited(Signal::Promote, &status(Phase::Paused, StepState::StepPaused)).is_ok());
        // A timed pause: the phase stays Progressing.
        let timed = awaited(Signal::Promote, &status(Phase::Progressing, StepState::StepPaused));
        assert!(timed.unwrap_err().contains("timed pause"));
        assert!(awaited(Signal::Promote, &status(Phase::Progressing, StepState::StepUpgrade)).is_err());
        assert!(awaited(Signal::Promote, &status(Phase::Healthy, StepState::Completed)).is_err());
    }

    #[test]
    fn an_abort_is_awaited_only_while_a_release_runs() {
        assert!(awaited(Signal::Abort, &status(Phase::Progressing, StepState::StepUpgrade)).is_ok());
        assert!(awaited(Signal::Abort, &status(Phase::Paused, StepState::StepPaused)).is_ok());
        let healthy = awaited(Signal::Abort, &status(Phase::Healthy, StepState::Completed));
        assert!(healthy.unwrap_err().contains("no release is running"));
        assert!(awaited(Signal::Abort, &status(Phase::Failed, StepState::StepUpgrade)).is_err());
    }

    #[test]
    fn an_ignored_signal_is_said_in_one_short_line() {
        let running = release("4d5e6f0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        let huge = format!("x\n{}", "y".repeat(100_000));
        let said = mismatch(Signal::Promote, &huge, Some(&running)).expect("ignored");
        assert!(said.len() < 300 && !said.contains('\n'), "{} bytes", said.len());
        let forged = format!("release=u/{}/id; by=me", "z".repeat(100_000));
        let said = mismatch(Signal::Promote, &forged, Some(&running)).expect("ignored");
        assert!(said.len() < 300, "{} bytes", said.len());
    }
}
