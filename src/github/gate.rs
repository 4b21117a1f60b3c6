//! Promotion pull requests: the gate of an indefinite pause. A writer's
//! approving review passes it (the agent merges it, so the decision is a
//! commit), so does a human merge; closing it unmerged aborts the release.
//! The branch name is fixed by the release and step, so a restarted agent
//! finds its pull request again instead of opening a second one.

use tracing::{info, warn};

use super::{GitHub, PullRequest, escape_inline};
use crate::rollout::api::{Phase, RolloutSpec, RolloutStatus, StepState};
use crate::rollout::engine::RolloutSummary;
use crate::writeback::{GateFile, gate_branch, gate_path};
use crate::{Error, Result};

/// Prefix of every promotion branch of one rollout.
pub fn branch_prefix(namespace: &str, name: &str) -> String {
    format!("gitcanary/promote/{namespace}/{name}/")
}

/// The step whose indefinite pause the rollout waits at, if any.
pub fn waiting_step(spec: &RolloutSpec, status: &RolloutStatus) -> Option<u32> {
    if status.phase != Phase::Paused {
        return None;
    }
    let canary = status.canary_status.as_ref()?;
    if canary.current_step_state != StepState::StepPaused {
        return None;
    }
    let step = spec
        .strategy
        .canary
        .steps
        .get(canary.current_step_index.checked_sub(1)? as usize)?;
    step.pause
        .as_ref()
        .is_some_and(|p| p.duration.is_none())
        .then_some(canary.current_step_index)
}

/// What the promotion pull request says about the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Waiting,
    /// Pass the gate; the token names the decision, so it counts once.
    Promote {
        token: String,
        by: String,
    },
    Abort {
        token: String,
    },
}

/// Everything about one release the gate needs.
pub struct GateRequest<'a> {
    pub rollout: &'a RolloutSummary,
    pub step: u32,
    /// The branch the pull request merges into (the tracked branch).
    pub base: &'a str,
    /// Pull requests that carried the release, for the link in the body.
    pub carried_by: &'a [u64],
    /// Their authors: they may not pass their own change's gate.
    pub authors: &'a [String],
}

/// The hidden line of a promotion pull request's body that names the commit
/// gitcanary pushed: nothing else is merged.
const GATE_COMMIT_MARKER: &str = "<!-- gitcanary:gate-commit ";

fn gate_commit(body: &str) -> Option<&str> {
    let start = body.find(GATE_COMMIT_MARKER)? + GATE_COMMIT_MARKER.len();
    let rest = &body[start..];
    Some(rest[..rest.find(" -->")?].trim())
}

impl GateRequest<'_> {
    pub fn branch(&self) -> String {
        gate_branch(
            &self.rollout.namespace,
            &self.rollout.name,
            &self.rollout.status.rollout_id,
            self.step,
        )
    }

    pub fn file(&self, now: &str) -> GateFile {
        let status = &self.rollout.status;
        GateFile {
            rollout: format!("{}/{}", self.rollout.namespace, self.rollout.name),
            rollout_id: status.rollout_id.clone(),
            step: self.step,
            stable_commit: status.stable_commit.clone(),
            canary_commit: status.canary_commit.clone(),
            canary_ready_replicas: status.canary_status.as_ref().map_or(0, |c| c.canary_ready_replicas),
            opened_at: now.to_string(),
            steps: status.step_history.clone(),
        }
    }

    fn title(&self) -> String {
        format!(
            "Promote {}/{}: release {} past step {}",
            self.rollout.namespace, self.rollout.name, self.rollout.status.rollout_id, self.step
        )
    }

    /// The file the gate's commit writes, and the only one it may change.
    fn gate_path(&self) -> String {
        gate_path(&self.rollout.namespace, &self.rollout.name)
    }

    fn body(&self, commit: &str) -> String {
        let rollout = self.rollout;
        let carried = if self.carried_by.is_empty() {
            format!("commit {}", rollout.status.canary_commit)
        } else {
            self.carried_by
                .iter()
                .map(|n| format!("#{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "Release `{}` of `{}/{}` (carried by {carried}) waits at step {}.\n\n\
             **Approve** this pull request (write access needed) and gitcanary merges it and goes on; \
             merging it yourself does the same. **Closing it unmerged aborts the release** and reverts it in Git.\n\n{}\n{GATE_COMMIT_MARKER}{commit} -->",
            rollout.status.rollout_id,
            rollout.namespace,
            rollout.name,
            self.step,
            super::render_comment(&rollout.namespace, &rollout.name, &rollout.spec, &rollout.status, None)
        )
    }
}

/// Finds the gate's pull request, or opens it (`push_branch` pushes the gate
/// branch first). Returns it with what it says.
pub async fn drive<F>(github: &GitHub, request: &GateRequest<'_>, push_branch: F) -> Result<(PullRequest, Verdict)>
where
    F: AsyncFnOnce(String) -> Result<String>,
{
    let branch = request.branch();
    let repository = github.repository();
    // Only a pull request from this repository into the tracked branch is the gate.
    let found = github
        .pull_for_branch(&branch)
        .await?
        .filter(|p| p.head_repo == repository && p.base_ref == request.base);
    let pull = match found {
        Some(pull) => pull,
        None => {
            let commit = push_branch(branch.clone()).await?;
            match github
                .create_pull(&branch, request.base, &request.title(), &request.body(&commit))
                .await
            {
                Ok(pull) => {
                    info!(pull = pull.number, %branch, "promotion pull request opened");
                    pull
                }
                // Another agent (or an earlier life of this one) opened it meanwhile.
                Err(Error::GitHub { status: Some(422), .. }) => {
                    github.pull_for_branch(&branch).await?.ok_or_else(|| Error::GitHub {
                        context: "opening the promotion pull request".into(),
                        status: Some(422),
                        message: format!("refused, and no pull request from {branch} exists"),
                    })?
                }
                Err(error) => return Err(error),
            }
        }
    };
    let verdict = verdict(github, &pull, request).await?;
    Ok((pull, verdict))
}

/// The same whether the agent merged the approved pull request or a human
/// merged it, so the decision counts once.
fn gate_token(number: u64) -> String {
    format!("promotion pull request #{number}")
}

async fn verdict(github: &GitHub, pull: &PullRequest, request: &GateRequest<'_>) -> Result<Verdict> {
    let number = pull.number;
    if pull.merged {
        return Ok(Verdict::Promote {
            token: gate_token(number),
            by: format!("promotion pull request #{number} merged"),
        });
    }
    if !pull.open {
        return closed(github, number).await;
    }
    // What would be merged is exactly the commit gitcanary pushed, and it
    // changes the gate file only; anything else keeps the gate closed.
    let pushed = gate_commit(&pull.body).unwrap_or_default();
    if pushed.is_empty() || pull.head_sha != pushed {
        explain(
            github,
            number,
            "head",
            &format!(
                "The head of this pull request is {}, not the commit gitcanary pushed ({}): the gate stays closed. \
                 Only the gate file may be merged through it; a writer can comment `/gitcanary promote` instead.",
                crate::short_commit(&pull.head_sha),
                if pushed.is_empty() {
                    "none recorded"
                } else {
                    crate::short_commit(pushed)
                }
            ),
        )
        .await;
        return Ok(Verdict::Waiting);
    }
    let gate_path = request.gate_path();
    let others: Vec<String> = github
        .pull_files(number)
        .await?
        .into_iter()
        .filter(|f| *f != gate_path)
        .collect();
    if !others.is_empty() {
        explain(
            github,
            number,
            "files",
            &format!(
                "This pull request changes more than the gate file ({}): the gate stays closed.",
                escape_inline(&others.join(", "))
            ),
        )
        .await;
        return Ok(Verdict::Waiting);
    }
    let own = github.login().await?.to_string();
    let policy = &github.gate_policy;
    for approval in github.approvals(number).await? {
        let user = &approval.user;
        // An approval counts for the commit it was given on, and only from
        // someone who may decide: a writer, not the change's own author
        // (unless allowed), a bot only when listed, never gitcanary itself.
        if approval.commit != pull.head_sha
            || *user == own
            || (approval.bot && !policy.bots.contains(user))
            || (!policy.allow_self_approval && request.authors.contains(user))
            || !github.can_write(user).await?
        {
            continue;
        }
        let title = format!("{} (approved by {user})", request.title());
        return match github.merge(number, &pull.head_sha, &title).await {
            Ok(()) => Ok(Verdict::Promote {
                token: gate_token(number),
                by: format!("@{user} approved #{number}"),
            }),
            // Branch protection wants more (reviews, checks): the team's rules
            // decide, so the gate stays closed and says why.
            Err(Error::GitHub {
                status: Some(status @ (403 | 405 | 409)),
                message,
                ..
            }) => {
                explain(
                    github,
                    number,
                    "merge-refused",
                    &format!(
                        "@{user} approved, but GitHub refused the merge ({status}: {}). \
                         The gate stays closed until the branch's rules are met and it merges; \
                         a writer can also comment `/gitcanary promote`.",
                        escape_inline(&message)
                    ),
                )
                .await;
                Ok(Verdict::Waiting)
            }
            Err(error) => Err(error),
        };
    }
    Ok(Verdict::Waiting)
}

/// A gate closed unmerged aborts only when a writer closed it; anyone
/// else's close is answered and undone.
async fn closed(github: &GitHub, number: u64) -> Result<Verdict> {
    let closer = github.closed_by(number).await?;
    if let Some(closer) = &closer
        && github.can_write(closer).await?
    {
        return Ok(Verdict::Abort {
            token: format!("{} closed unmerged", gate_token(number)),
        });
    }
    let who = closer
        .as_deref()
        .map_or_else(|| "someone".to_string(), |c| format!("@{c}"));
    github
        .reply(
            number,
            &format!(
                "{who} closed this promotion pull request, but only a writer's close aborts the release: gitcanary reopens it."
            ),
        )
        .await?;
    github.reopen_pull(number).await?;
    Ok(Verdict::Waiting)
}

/// Says on the pull request why the gate stays closed, once per reason.
async fn explain(github: &GitHub, number: u64, reason: &str, body: &str) {
    let marker = format!("<!-- gitcanary:gate-{reason} {number} -->");
    if let Err(error) = github.upsert_comment(number, &marker, body).await {
        warn!(%error, "GitHub: cannot say why the gate stays closed");
    }
}

/// Closes this rollout's open promotion pull requests other than `keep`,
/// saying why: the gate ended another way.
pub async fn close_others(github: &GitHub, base: &str, rollout: &RolloutSummary, keep: Option<&str>) -> Result<()> {
    let prefix = branch_prefix(&rollout.namespace, &rollout.name);
    for pull in github.open_pulls(base).await? {
        if !pull.head_ref.starts_with(&prefix) || Some(pull.head_ref.as_str()) == keep {
            continue;
        }
        let status = &rollout.status;
        let message = status
            .canary_status
            .as_ref()
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let why = match status.phase {
            Phase::Healthy => format!("the release is over: `{}` is stable", status.rollout_id),
            Phase::Failed => format!("release `{}` failed: {message}", status.rollout_id),
            _ => format!(
                "the gate was passed another way, or its release was superseded; `{}` is now {:?}: {message}",
                status.rollout_id, status.phase
            ),
        };
        github
            .reply(
                pull.number,
                &format!("gitcanary closes this promotion pull request: {why}."),
            )
            .await?;
        github.close_pull(pull.number).await?;
        info!(pull = pull.number, "promotion pull request closed");
    }
    Ok(())
}
