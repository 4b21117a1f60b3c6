//! GitHub reporting: the release comment and commit status on every change,
//! the promotion pull request at an indefinite pause, and `/gitcanary`
//! commands. GitHub being down or rate limited delays the comment, never
//! the release.

use std::sync::Arc;

use tracing::{debug, info, warn};

use crate::Result;
use crate::cluster::{Cluster, Writer as ClusterWriter};
use crate::github::{self, GitHub, gate};
use crate::model::Fence;
use crate::rollout::api::Phase;
use crate::rollout::cli::{DecidedOn, Signal, record_last_comment, send_signal_token};
use crate::rollout::model::RolloutSummary;
use crate::rollout::record::Records;
use crate::source::Source;
use crate::sync::SyncReport;
use crate::writeback::{Author, Writer};

/// What GitHub reporting needs of the agent.
pub struct GitHubReporter<'a> {
    pub github: &'a GitHub,
    pub cluster: &'a Cluster,
    pub source: &'a Arc<Source>,
    /// Author of the gate commits.
    pub author: &'a Author,
    /// Wave pull requests still to open.
    pub waves: &'a super::wave::WaveRetries,
    /// With shards: whether this replica still holds an app's shard.
    pub fence: Option<&'a Fence>,
}

impl GitHubReporter<'_> {
    /// Reports each rollout to GitHub: the release comment and the commit
    /// status when its status changed; while a release waits at a gate, its
    /// promotion pull request and the commands. GitHub being down or rate
    /// limited delays the comment, never the release. Returns whether a
    /// decision was handed to a rollout.
    pub async fn report(&self, report: &SyncReport) -> bool {
        let mut signalled = false;
        let records = self.source.records();
        // A promote in Git opens the next environment's wave pull request.
        let promotes = super::wave::promotes(report);
        for app in report.apps.iter() {
            // A replica that loses the app's shard meanwhile hands nothing
            // more to its Rollouts, and says nothing more of them on GitHub.
            let writer = self.cluster.writer(None).fenced(self.fence, &app.app);
            for rollout in &app.rollouts {
                if writer.fence_lost() {
                    info!(app = %app.app, "GitHub: the app's shard was lost; the rest of its report is left to the replica that holds it");
                    break;
                }
                signalled |= self.report_rollout(&writer, rollout, &records).await;
            }
        }
        let holds = |app: &str| self.fence.is_none_or(|fence| (fence.0)(app));
        super::wave::follow_all(self.github, (self.source, self.author), promotes, self.waves, holds).await;
        signalled
    }

    /// One rollout's comment, commit status, gate and commands; whether a
    /// decision was handed to it.
    async fn report_rollout(&self, writer: &ClusterWriter<'_>, rollout: &RolloutSummary, records: &Records) -> bool {
        let github = self.github;
        let mut signalled = false;
        let status = &rollout.status;
        let commit = if status.canary_commit.is_empty() {
            &status.stable_commit
        } else {
            &status.canary_commit
        };
        if commit.is_empty() || !github::is_reportable(status) {
            return false;
        }
        let fields = (&rollout.namespace, &rollout.name, &status.rollout_id);
        let (pulls, mut authors): (Vec<u64>, Vec<String>) = match github.carried_by(commit).await {
            Ok(carried) => carried.into_iter().unzip(),
            Err(error) => {
                warn!(%error, namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, "GitHub: cannot find the pull request");
                return false;
            }
        };
        // Everyone who wrote or committed a commit of the release, with or
        // without a pull request: none of them may pass its gate. Unknown,
        // the gate and commands wait; the comment and status do not.
        let mut authors_known = true;
        if matches!(status.phase, Phase::Paused | Phase::Progressing) && !status.canary_commit.is_empty() {
            match release_authors(github, status, &self.author.email).await {
                Ok(people) => {
                    debug!(?people, "the release's authors and committers");
                    authors.extend(people)
                }
                Err(error) => {
                    warn!(%error, namespace = %fields.0, rollout = %fields.1, "GitHub: the release's commit authors are unknown; its gate and commands wait");
                    authors_known = false;
                }
            }
        }
        // Asked again before each write to GitHub: a reply may take long.
        if writer.fence_lost() {
            return false;
        }
        let mut command_pulls = pulls.clone();
        let waiting = gate::waiting_step(&rollout.spec, status).filter(|_| authors_known);
        let mut gate_pull = None;
        let mut gate_branch = None;
        let mut gate_unknown = false;
        if let (Some(step), Some(base)) = (waiting, self.source.git().map(|g| g.branch().to_string())) {
            let request = gate::GateRequest {
                rollout,
                step,
                base: &base,
                carried_by: &pulls,
                authors: &authors,
                records,
            };
            gate_branch = Some(request.branch());
            match gate::drive(github, &request, async |branch| self.push_gate(&request, branch).await).await {
                Ok(gate::Driven { pull, verdict, skipped }) => {
                    command_pulls.push(pull.number);
                    gate_pull = Some(pull.number);
                    gate_branch = Some(pull.head_ref.clone());
                    warn_skipped(github, &pulls, &pull, &skipped).await;
                    signalled |= pass_verdict(writer, rollout, verdict, step).await;
                }
                Err(error) => {
                    warn!(%error, namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, "GitHub: the promotion pull request waits; the CLI still works");
                    // Commands wait for a look that finds the gate, unless it cannot be opened at all.
                    gate_unknown = error.is_transient();
                }
            }
        }
        if writer.fence_lost() {
            return signalled;
        }
        if rollout.changed {
            let marker = github::marker(&rollout.namespace, &rollout.name, &status.rollout_id);
            let body = github::render_comment(&rollout.namespace, &rollout.name, &rollout.spec, status, gate_pull);
            for pull in &pulls {
                if let Err(error) = github.upsert_comment(*pull, &marker, &body).await {
                    warn!(%error, pull, "GitHub: the release comment waits for the next change");
                }
            }
            let (state, description) = github::commit_status(status);
            let context = records.status_context(&rollout.namespace, &rollout.name);
            if let Err(error) = github.set_status(commit, &context, state, &description).await {
                warn!(%error, "GitHub: the commit status waits for the next change");
            }
            if let Some(git) = self.source.git().filter(|_| authors_known && !writer.fence_lost())
                && let Err(error) =
                    gate::close_others(github, (git.branch(), records), rollout, gate_branch.as_deref()).await
            {
                warn!(%error, "GitHub: stale promotion pull requests stay open until the next change");
            }
        }
        // Commands on the gate are read with the others or not at all: none
        // elsewhere is noted as handled past those on a gate not found.
        if authors_known && !gate_unknown && matches!(status.phase, Phase::Paused | Phase::Progressing) {
            signalled |= handle_commands(github, writer, rollout, &command_pulls, &authors).await;
        }
        signalled
    }

    /// Pushes the gate branch; returns the commit pushed (or pushed before).
    async fn push_gate(&self, request: &gate::GateRequest<'_>, branch: String) -> Result<String> {
        let source = self.source.clone();
        let author = self.author.clone();
        let file = request.file(&jiff::Timestamp::now().to_string());
        let outcome = crate::blocking("pushing the gate branch", move || {
            let git = source
                .git()
                .ok_or_else(|| crate::Error::Usage("gates need a Git source".into()))?;
            let writer = Writer {
                git,
                author,
                status_branch: None,
            };
            writer.open_gate(&branch, &file)
        })
        .await??;
        debug!(?outcome, "gate branch pushed");
        match outcome {
            crate::writeback::Outcome::Committed { commit, .. }
            | crate::writeback::Outcome::AlreadyInGit { commit } => Ok(commit),
            crate::writeback::Outcome::NothingToChange => Err(crate::Error::Usage(format!(
                "the gate branch {} already holds this gate file in a commit gitcanary did not make: delete the branch",
                request.branch()
            ))),
        }
    }
}

/// Hands a decision made on GitHub to the rollout, bound to the release
/// (and, for a promote, the pause) it was made on.
async fn hand_over(
    writer: &ClusterWriter<'_>,
    rollout: &RolloutSummary,
    signal: Signal,
    token: &str,
    step: Option<u32>,
) -> crate::Result<()> {
    let decided_on = DecidedOn {
        canary_commit: &rollout.status.canary_commit,
        step: step.filter(|_| signal == Signal::Promote),
    };
    send_signal_token(
        writer,
        &rollout.namespace,
        &rollout.name,
        signal,
        token,
        Some(decided_on),
    )
    .await
}

/// Hands a promotion pull request's decision to its rollout (once: the token
/// names the decision).
async fn pass_verdict(writer: &ClusterWriter<'_>, rollout: &RolloutSummary, verdict: gate::Verdict, step: u32) -> bool {
    let (signal, token, by) = match verdict {
        gate::Verdict::Waiting => return false,
        gate::Verdict::Promote { token, by } => (Signal::Promote, token, by),
        gate::Verdict::Abort { token } => (
            Signal::Abort,
            token,
            "promotion pull request closed unmerged".to_string(),
        ),
    };
    if already_given(&rollout.status, &token) {
        return false;
    }
    match hand_over(writer, rollout, signal, &token, Some(step)).await {
        Ok(()) => {
            info!(namespace = %rollout.namespace, rollout = %rollout.name, rollout_id = %rollout.status.rollout_id, %by, ?signal, "gate decided on GitHub");
            true
        }
        Err(error) => {
            warn!(%error, "the gate's decision could not be passed on; tried again next time");
            false
        }
    }
}

/// Whether the decision named `by` (a review's or a comment's token) was
/// already given to this release: read again (by the replica that took the
/// shard, say), it must not pass a later pause.
fn already_given(status: &crate::rollout::api::RolloutStatus, by: &str) -> bool {
    // The annotation holds the token inside the release's identity.
    let given = |last: &str| !last.is_empty() && crate::rollout::signal::parse(last).by == by;
    let passed = format!("promoted by {by}");
    given(&status.last_promote_signal)
        || given(&status.last_abort_signal)
        || status.step_history.iter().any(|step| step.passed_by == passed)
}

/// The GitHub logins of whoever wrote or committed the release's commits
/// (from its stable commit, exclusive, to its canary commit).
async fn release_authors(
    github: &GitHub,
    status: &crate::rollout::api::RolloutStatus,
    own_email: &str,
) -> Result<Vec<String>> {
    if status.stable_commit.is_empty() || status.stable_commit == status.canary_commit {
        return github.commit_people(None, &status.canary_commit, own_email).await;
    }
    github
        .commit_people(Some(&status.stable_commit), &status.canary_commit, own_email)
        .await
}

/// Says on the change's pull requests that a gate branch name was taken by
/// a branch gitcanary did not push, and which name the gate uses instead.
async fn warn_skipped(github: &GitHub, pulls: &[u64], gate: &github::PullRequest, skipped: &[String]) {
    if skipped.is_empty() {
        return;
    }
    let marker = format!("<!-- gitcanary:gate-branch-taken {} -->", gate.head_ref);
    let body = format!(
        "> [!WARNING]\n> The gate branch {} already existed and was not pushed by gitcanary for this release; \
         it is not used. The gate is #{} from `{}`.",
        skipped
            .iter()
            .map(|b| format!("`{}`", github::escape_inline(b)))
            .collect::<Vec<_>>()
            .join(", "),
        gate.number,
        github::escape_inline(&gate.head_ref)
    );
    for pull in pulls {
        if let Err(error) = github.upsert_comment(*pull, &marker, &body).await {
            warn!(%error, pull, "GitHub: cannot warn about a taken gate branch");
        }
    }
}

/// The `/gitcanary` commands on the release's pull requests, in the order
/// they were written (comment ids grow), each with its pull request: none
/// when the comments of one cannot be read for now, since noting a later
/// command as handled would pass over an earlier one there.
async fn read_commands(
    github: &GitHub,
    pulls: &[u64],
    handled: u64,
    began: Option<jiff::Timestamp>,
) -> Option<Vec<(u64, crate::github::CommandComment)>> {
    let mut commands = Vec::new();
    for pull in pulls {
        match github.commands(*pull, handled, began).await {
            Ok(found) => commands.extend(found.into_iter().map(|comment| (*pull, comment))),
            Err(error) if error.is_transient() => {
                warn!(%error, pull, "GitHub: cannot read commands; they are read at the next look");
                return None;
            }
            // Refused for good (the pull request is gone): nothing to wait for.
            Err(error) => warn!(%error, pull, "GitHub: cannot read commands of this pull request"),
        }
    }
    commands.sort_by_key(|(_, comment)| comment.id);
    commands.dedup_by_key(|(_, comment)| comment.id);
    Some(commands)
}

/// Whether a promote was written before the step the release is at began
/// (in GitHub's whole seconds): read late (after an outage, or by another
/// replica), it must not pass a pause its writer never saw.
fn written_before_this_step(status: &crate::rollout::api::RolloutStatus, written: Option<jiff::Timestamp>) -> bool {
    let Some(step) = status.canary_status.as_ref().map(|c| c.current_step_index) else {
        return false;
    };
    let began = status
        .step_history
        .iter()
        .rev()
        .find(|record| record.step == step)
        .and_then(|record| record.started_at.parse::<jiff::Timestamp>().ok());
    matches!((written, began), (Some(written), Some(began)) if written.as_second() < began.as_second())
}

/// What became of one command.
enum Handled {
    /// Acted on, refused or passed over: noted as handled.
    Done { signalled: bool },
    /// GitHub or the cluster failed to answer for it, in a way that asking
    /// again may mend (`Error::is_transient`): it and every later command
    /// are read again at the next look (none is given twice).
    Undone,
    /// The app's shard was lost: nothing more is noted.
    ShardLost,
}

/// Reads and acts on the release's `/gitcanary` commands, oldest first,
/// and notes how far they were handled; whether a decision was handed over.
async fn handle_commands(
    github: &GitHub,
    writer: &ClusterWriter<'_>,
    rollout: &RolloutSummary,
    pulls: &[u64],
    authors: &[String],
) -> bool {
    let key = format!("{}/{}", rollout.namespace, rollout.name);
    let handled = github.handled_since(&key, rollout.last_command_comment);
    // A command written before this release began is not for it.
    let began = rollout
        .status
        .step_history
        .first()
        .and_then(|step| step.started_at.parse::<jiff::Timestamp>().ok());
    let Some(commands) = read_commands(github, pulls, handled, began).await else {
        return false;
    };
    let mut last = handled;
    let mut signalled = false;
    for (pull, comment) in commands {
        // The shard lost: nothing is noted as handled, and the holder reads
        // these commands again (a refusal may be replied twice; one already
        // given is not given again), so none is lost to the shard changing hands.
        if writer.fence_lost() {
            return signalled;
        }
        match handle_command(github, writer, rollout, pull, &comment, authors).await {
            Handled::Done { signalled: handed } => {
                signalled |= handed;
                last = last.max(comment.id);
            }
            Handled::Undone => break,
            Handled::ShardLost => return signalled,
        }
    }
    github.note_handled(&key, last);
    if last > rollout.last_command_comment
        && let Err(error) = record_last_comment(writer, &rollout.namespace, &rollout.name, last).await
    {
        warn!(%error, "cannot record the last handled comment");
    }
    signalled
}

/// Tells the command's writer why it changed nothing; the command is handled.
async fn refuse(github: &GitHub, pull: u64, user: &str, why: &str) -> Handled {
    let _ = github
        .reply(pull, &format!("@{user} {why}; nothing was changed."))
        .await;
    Handled::Done { signalled: false }
}

/// One command: who may give it, and handing it to the rollout.
async fn handle_command(
    github: &GitHub,
    writer: &ClusterWriter<'_>,
    rollout: &RolloutSummary,
    pull: u64,
    comment: &crate::github::CommandComment,
    authors: &[String],
) -> Handled {
    let allowed = match github.can_write(&comment.user).await {
        Ok(allowed) => allowed,
        Err(error) if error.is_transient() => {
            warn!(%error, user = %comment.user, "GitHub: cannot check permission; the command is read again at the next look");
            return Handled::Undone;
        }
        Err(error) => {
            warn!(%error, user = %comment.user, "GitHub: cannot check permission; the command is ignored");
            return Handled::Done { signalled: false };
        }
    };
    let verb = comment.command.verb();
    if !allowed {
        info!(user = %comment.user, verb, "GitHub: command from a user without write access ignored");
        let why = format!("`/gitcanary {verb}` needs write, maintain or admin permission on this repository");
        return refuse(github, pull, &comment.user, &why).await;
    }
    let signal = comment.command;
    // Anyone who may write can stop a release; only someone who wrote
    // none of it may pass it.
    let own = match github.login().await {
        Ok(own) => own,
        Err(error) => {
            warn!(%error, "GitHub: gitcanary's own login is unknown; the command is read again at the next look");
            return Handled::Undone;
        }
    };
    if signal == Signal::Promote
        && (own.is_empty()
            || !crate::github::judge::may_decide(&comment.user, false, own, authors, &github.gate_policy))
    {
        info!(user = %comment.user, "GitHub: promote from the release's own author (or an unlisted bot) ignored");
        let why = "`/gitcanary promote` must come from a writer who wrote or committed none of this release (bots only when listed by `--github-bot`)";
        return refuse(github, pull, &comment.user, why).await;
    }
    let token = format!("comment {} by @{}", comment.id, comment.user);
    if already_given(&rollout.status, &token) {
        return Handled::Done { signalled: false };
    }
    if signal == Signal::Promote && written_before_this_step(&rollout.status, comment.written) {
        info!(user = %comment.user, "GitHub: a promote written before the current step began ignored");
        let why =
            "`/gitcanary promote` was written before the step the release waits at began, and approves no later pause";
        return refuse(github, pull, &comment.user, why).await;
    }
    let step = rollout.status.canary_status.as_ref().map(|c| c.current_step_index);
    match hand_over(writer, rollout, signal, &token, step).await {
        Ok(()) => {
            info!(user = %comment.user, verb, namespace = %rollout.namespace, rollout = %rollout.name, "GitHub: command accepted");
            Handled::Done { signalled: true }
        }
        Err(_) if writer.fence_lost() => Handled::ShardLost,
        Err(error) if error.is_transient() => {
            warn!(%error, "GitHub: the command could not be passed on; it is read again at the next look");
            Handled::Undone
        }
        Err(error) => {
            warn!(%error, "GitHub: the command could not be passed on, and asking again would not help; it is ignored");
            Handled::Done { signalled: false }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::api::{RolloutStatus, StepRecord};

    #[test]
    fn a_promote_written_before_the_current_step_began_approves_nothing() {
        let status: RolloutStatus = serde_json::from_value(serde_json::json!({
            "phase": "Paused",
            "stepHistory": [{"step": 1, "startedAt": "2026-12-05T10:00:00Z"},
                            {"step": 2, "startedAt": "2026-12-05T10:05:00Z"}],
            "canaryStatus": {"canaryReadyReplicas": 1, "currentStepIndex": 2, "currentStepState": "StepPaused"}}))
        .expect("a status");
        let at = |t: &str| Some(t.parse::<jiff::Timestamp>().expect("a time"));
        assert!(
            written_before_this_step(&status, at("2026-12-05T10:01:00Z")),
            "written at step 1"
        );
        assert!(
            !written_before_this_step(&status, at("2026-12-05T10:05:00.400Z")),
            "in the second step 2 began"
        );
        assert!(!written_before_this_step(&status, at("2026-12-05T10:06:00Z")));
        assert!(
            !written_before_this_step(&status, None),
            "GitHub gave no time: as before"
        );
    }

    #[test]
    fn a_decision_given_once_is_not_given_again() {
        let by = "comment 7 by @alice";
        let mut status = RolloutStatus::default();
        assert!(!already_given(&status, by));
        status.last_promote_signal = format!("release=uid/abc/r1; by={by}");
        let token = crate::rollout::signal::parse(&status.last_promote_signal);
        assert_eq!(token.by, by, "the signal's form, as the engine keeps it");
        assert!(already_given(&status, by));
        assert!(!already_given(&status, "comment 8 by @alice"));
        // A later promote replaced the signal; the step it passed remembers who.
        status.last_promote_signal = "release=uid/abc/r1; by=the CLI".into();
        status.step_history.push(StepRecord {
            step: 1,
            passed_by: format!("promoted by {by}"),
            ..StepRecord::default()
        });
        assert!(already_given(&status, by));
    }
}
