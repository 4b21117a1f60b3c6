//! Promotion pull requests: the gate of an indefinite pause. A writer's
//! approving review passes it (the agent merges it, so the decision is a
//! commit), so does a human merge; closing it unmerged aborts the release.
//! The branch name is fixed by the release and step, so a restarted agent
//! finds its pull request again instead of opening a second one.

use tracing::{info, warn};

use super::judge::{self, Evidence, GATE_COMMIT_MARKER, Gate, Judgement, Why, judge};
use super::{GitHub, PullRequest, escape_inline};
use crate::rollout::api::{Phase, RolloutSpec, RolloutStatus, StepState};
use crate::rollout::model::RolloutSummary;
use crate::rollout::record::Records;
use crate::writeback::GateFile;
use crate::{Error, Result};

/// Prefix of every promotion branch.
pub const BRANCH_PREFIX: &str = "gitcanary/promote/";

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
    /// This agent's cluster: the gate's branch and file carry it.
    pub records: &'a Records,
}

/// The hidden line that names the release and step a gate is for: a pull
/// request of another release (the same rollout ID reused) is not this gate.
fn release_marker(canary_commit: &str, step: u32) -> String {
    format!("<!-- gitcanary:gate-release {canary_commit} {step} -->")
}

/// Whether a pull request is gitcanary's gate for this release and step:
/// opened by gitcanary's own account, naming the release's full canary commit.
pub fn is_gate_of_release(pull: &PullRequest, own: &str, canary_commit: &str, step: u32) -> bool {
    !canary_commit.is_empty() && pull.author == own && pull.body.contains(&release_marker(canary_commit, step))
}

/// Gate branches tried in turn: the release's own name first, then numbered
/// ones for when a branch of that name exists that gitcanary did not push for
/// this release.
pub fn branch_candidates(first: &str) -> impl Iterator<Item = String> + '_ {
    std::iter::once(first.to_string()).chain((2..=MAX_BRANCH_TRIES).map(move |n| format!("{first}-v{n}")))
}

/// How many gate branch names are tried before the gate waits.
const MAX_BRANCH_TRIES: u32 = 5;

impl GateRequest<'_> {
    pub fn branch(&self) -> String {
        self.records.gate_branch(
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
        self.records.gate_path(&self.rollout.namespace, &self.rollout.name)
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
             merging it yourself does the same. **Closing it unmerged aborts the release** and reverts it in Git. \
             Nobody who wrote or committed the release's changes may pass it.\n\n{}\n{GATE_COMMIT_MARKER}{commit} -->\n{}",
            rollout.status.rollout_id,
            rollout.namespace,
            rollout.name,
            self.step,
            super::render_comment(&rollout.namespace, &rollout.name, &rollout.spec, &rollout.status, None),
            release_marker(&rollout.status.canary_commit, self.step)
        )
    }
}

/// What driving the gate found: its pull request, what it says, and the
/// branch names skipped because someone else's branch held them.
pub struct Driven {
    pub pull: PullRequest,
    pub verdict: Verdict,
    pub skipped: Vec<String>,
}

/// Finds the gate's pull request, or opens it (`push_branch` pushes the gate
/// branch first). A branch name already taken by anything but gitcanary's
/// gate for this release (an earlier release's gate, someone's push) is
/// never reused: the next name is tried.
pub async fn drive<F>(github: &GitHub, request: &GateRequest<'_>, push_branch: F) -> Result<Driven>
where
    F: AsyncFnOnce(String) -> Result<String>,
{
    let own = github.login().await?.to_string();
    let canary = &request.rollout.status.canary_commit;
    let first = request.branch();
    let mut skipped = Vec::new();
    let mut free = None;
    for branch in branch_candidates(&first) {
        // Only a pull request (of this repository's branch) into the tracked branch is the gate.
        let found = github
            .pull_for_branch(&branch)
            .await?
            .filter(|p| p.base_ref == request.base);
        match found {
            Some(pull) if is_gate_of_release(&pull, &own, canary, request.step) => {
                let verdict = verdict(github, &pull, request, &own).await?;
                return Ok(Driven { pull, verdict, skipped });
            }
            Some(_) => skipped.push(branch),
            None if github.branch_exists(&branch).await? => skipped.push(branch),
            None => {
                free = Some(branch);
                break;
            }
        }
    }
    let Some(branch) = free else {
        return Err(Error::GitHub {
            context: "choosing the gate branch".into(),
            status: None,
            message: format!(
                "every gate branch name from {first} on is taken by a branch gitcanary did not push for this release"
            ),
        });
    };
    if !skipped.is_empty() {
        warn!(skipped = ?skipped, %branch, "gate branch names taken by someone else's branch; using another");
    }
    let commit = push_branch(branch.clone()).await?;
    let pull = match github
        .create_pull(&branch, request.base, &request.title(), &request.body(&commit))
        .await
    {
        Ok(pull) => {
            info!(pull = pull.number, %branch, "promotion pull request opened");
            pull
        }
        // Another agent (or an earlier life of this one) opened it meanwhile.
        Err(Error::GitHub { status: Some(422), .. }) => github
            .pull_for_branch(&branch)
            .await?
            .filter(|p| is_gate_of_release(p, &own, canary, request.step))
            .ok_or_else(|| Error::GitHub {
                context: "opening the promotion pull request".into(),
                status: Some(422),
                message: format!("refused, and no gate pull request of this release from {branch} exists"),
            })?,
        Err(error) => return Err(error),
    };
    let verdict = verdict(github, &pull, request, &own).await?;
    Ok(Driven { pull, verdict, skipped })
}

/// The same whether the agent merged the approved pull request or a human
/// merged it, so the decision counts once.
fn gate_token(number: u64) -> String {
    format!("promotion pull request #{number}")
}

/// Reads what the gate's rule needs about `pull` from GitHub: for a merged
/// or open one its head commit's message and files, who merged it or its
/// approvals; for a closed one who closed it; then the write access of
/// whoever could decide.
async fn evidence(github: &GitHub, pull: &PullRequest, gate: &Gate<'_>) -> Result<Evidence> {
    let number = pull.number;
    let mut evidence = Evidence {
        pull: Some(pull.clone()),
        ..Evidence::default()
    };
    if pull.merged || pull.open {
        if !pull.head_sha.is_empty() {
            evidence.head_message = github.commit_message(&pull.head_sha).await?;
        }
        evidence.files = github.pull_files(number).await?;
    }
    if pull.merged {
        evidence.merged_by = github.pull(number).await?.merged_by;
    } else if pull.open {
        evidence.approvals = github.approvals(number).await?;
    } else {
        evidence.closed_by = github.closed_by(number).await?;
    }
    for user in judge::asks_permission(&evidence, gate) {
        match github.can_write(&user).await {
            Ok(true) => {
                evidence.writers.insert(user);
            }
            Ok(false) => {}
            // One approver GitHub cannot answer for (a deleted account) is
            // not a writer; the others still count. A merger's or closer's
            // is needed to act at all.
            Err(error) if pull.open => {
                warn!(%error, %user, "GitHub: write access unknown; the approval does not count")
            }
            Err(error) => return Err(error),
        }
    }
    Ok(evidence)
}

/// Judges the gate's pull request and does what the judgement asks.
async fn verdict(github: &GitHub, pull: &PullRequest, request: &GateRequest<'_>, own: &str) -> Result<Verdict> {
    let number = pull.number;
    let status = &request.rollout.status;
    let gate_path = request.gate_path();
    let gate = Gate {
        own,
        rollout_id: &status.rollout_id,
        step: request.step,
        canary_commit: &status.canary_commit,
        gate_path: &gate_path,
        authors: request.authors,
        policy: &github.gate_policy,
    };
    let promote = |by: String| Verdict::Promote {
        token: gate_token(number),
        by,
    };
    match judge(&evidence(github, pull, &gate).await?, &gate) {
        Judgement::Passed { .. } => Ok(promote(format!("promotion pull request #{number} merged"))),
        Judgement::Merge { approver } => {
            let title = format!("{} (approved by {approver})", request.title());
            match github.merge(number, &pull.head_sha, &title).await {
                Ok(()) => Ok(promote(format!("@{approver} approved #{number}"))),
                // Branch protection wants more (reviews, checks): the team's
                // rules decide, so the gate stays closed and says why.
                Err(Error::GitHub {
                    status: Some(status @ (403 | 405 | 409)),
                    message,
                    ..
                }) => {
                    let body = format!(
                        "@{approver} approved, but GitHub refused the merge ({status}: {}). \
                         The gate stays closed until the branch's rules are met and it merges; \
                         a writer can also comment `/gitcanary promote`.",
                        escape_inline(&message)
                    );
                    explain(github, number, "merge-refused", &body).await;
                    Ok(Verdict::Waiting)
                }
                Err(error) => Err(error),
            }
        }
        Judgement::Abort => Ok(Verdict::Abort {
            token: format!("{} closed unmerged", gate_token(number)),
        }),
        Judgement::Reopen { closer } => {
            let who = closer.map_or_else(|| "someone".to_string(), |c| format!("@{c}"));
            let body = format!(
                "{who} closed this promotion pull request, but only a writer's close aborts the release: gitcanary reopens it."
            );
            github.reply(number, &body).await?;
            github.reopen_pull(number).await?;
            Ok(Verdict::Waiting)
        }
        Judgement::Wait(why) => {
            if let Some((reason, body)) = explanation(&why) {
                explain(github, number, reason, &body).await;
            } else if why == Why::NotThisRelease {
                info!(
                    pull = number,
                    "a pull request whose commit is not this release's gate: ignored"
                );
            }
            Ok(Verdict::Waiting)
        }
    }
}

/// What the gate says on its pull request about why it stays closed, and
/// the reason's key (said once per reason); none when there is nothing a
/// person can do about it there.
fn explanation(why: &Why) -> Option<(&'static str, String)> {
    match why {
        Why::Undecided | Why::NotThisRelease => None,
        Why::Head { head, pushed } => Some((
            "head",
            format!(
                "The head of this pull request is {}, not the commit gitcanary pushed ({}): the gate stays closed. \
                 Only the gate file may be merged through it; a writer can comment `/gitcanary promote` instead.",
                crate::short_commit(head),
                pushed
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .map_or("none recorded", crate::short_commit)
            ),
        )),
        Why::Files(others) => Some((
            "files",
            format!(
                "This pull request changes more than the gate file ({}): the gate stays closed.",
                escape_inline(&others.join(", "))
            ),
        )),
        Why::MergeIgnored { merged_by } => Some((
            "merge-ignored",
            format!(
                "This merge does not pass the gate: only the commit gitcanary pushed, changing the gate file only, \
                 merged by gitcanary or by a writer who wrote or committed none of the release (merged by @{}). \
                 The release still waits; a writer who is not its author can comment `/gitcanary promote` on the change.",
                escape_inline(merged_by.as_deref().unwrap_or("someone"))
            ),
        )),
    }
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
pub async fn close_others(
    github: &GitHub,
    (base, records): (&str, &Records),
    rollout: &RolloutSummary,
    keep: Option<&str>,
) -> Result<()> {
    for pull in github.open_pulls(base).await? {
        // A fork's branch of the same name is not gitcanary's to close.
        let ours = records.is_gate_branch_of(&pull.head_ref, &rollout.namespace, &rollout.name)
            && github.is_this_repository(&pull.head_repo);
        if !ours || Some(pull.head_ref.as_str()) == keep {
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

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &str = "gitcanary[bot]";

    fn pull(author: &str, body: &str) -> PullRequest {
        PullRequest {
            number: 3,
            open: false,
            merged: true,
            head_ref: "gitcanary/promote/ns/web/r1-1".into(),
            head_sha: "a".repeat(40),
            head_repo: "acme/apps".into(),
            base_ref: "main".into(),
            author: author.into(),
            body: body.into(),
            merged_by: None,
        }
    }

    #[test]
    fn a_gate_of_another_release_with_the_same_branch_is_not_this_gate() {
        let new = "b".repeat(40);
        let old_body = release_marker(&"c".repeat(40), 1);
        assert!(
            !is_gate_of_release(&pull(OWN, &old_body), OWN, &new, 1),
            "an earlier release's gate"
        );
        let body = release_marker(&new, 1);
        assert!(is_gate_of_release(&pull(OWN, &body), OWN, &new, 1));
        assert!(!is_gate_of_release(&pull(OWN, &body), OWN, &new, 2), "another step");
        assert!(
            !is_gate_of_release(&pull("mallory", &body), OWN, &new, 1),
            "not opened by gitcanary"
        );
        assert!(
            !is_gate_of_release(&pull(OWN, &release_marker("", 1)), OWN, "", 1),
            "no canary commit"
        );
    }

    #[test]
    fn taken_branch_names_give_way_to_numbered_ones() {
        let names: Vec<String> = branch_candidates("gitcanary/promote/ns/web/r1-1").collect();
        assert_eq!(names[0], "gitcanary/promote/ns/web/r1-1");
        assert_eq!(names[1], "gitcanary/promote/ns/web/r1-1-v2");
        assert_eq!(names.len(), MAX_BRANCH_TRIES as usize);
    }
}
