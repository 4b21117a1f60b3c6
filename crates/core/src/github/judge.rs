//! The gate's rule, pure: what a promotion pull request, as GitHub
//! describes it, says about its release. `gate` reads the evidence and acts
//! on the judgement (merges, explains, reopens); nothing here does I/O, so
//! every rule has a test that fails when the rule is removed.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::rollout::record::{GATE_TRAILER, gate_id};

/// Whose approving reviews pass a promotion pull request, besides writers.
#[derive(Debug, Clone, Default)]
pub struct GatePolicy {
    /// The author of the change being released may approve its own gate
    /// (GitHub does not let a pull request's author approve it).
    pub allow_self_approval: bool,
    /// Bot accounts whose approvals count (`name[bot]`); no other bot's do.
    pub bots: Vec<String>,
}

/// An approving review, as the latest verdict of its reviewer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub user: String,
    /// The head commit the approval was given on.
    pub commit: String,
    pub bot: bool,
}

/// The fields of a pull request gitcanary reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    pub number: u64,
    pub open: bool,
    pub merged: bool,
    pub head_ref: String,
    pub head_sha: String,
    /// `owner/name` of the repository the head branch is in.
    pub head_repo: String,
    pub base_ref: String,
    pub author: String,
    pub body: String,
    /// Who merged it, when it is merged.
    pub merged_by: Option<String>,
}

/// One entry of a pull request's file list; a rename names its old path too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullFile {
    pub filename: String,
    pub previous_filename: Option<String>,
}

/// The hidden line of a promotion pull request's body that names the commit
/// gitcanary pushed: nothing else is merged.
pub const GATE_COMMIT_MARKER: &str = "<!-- gitcanary:gate-commit ";

/// The commit gitcanary pushed, as the body's hidden line names it.
pub fn gate_commit(body: &str) -> Option<&str> {
    let start = body.find(GATE_COMMIT_MARKER)? + GATE_COMMIT_MARKER.len();
    let rest = &body[start..];
    Some(rest[..rest.find(" -->")?].trim())
}

/// Whether the head is the commit gitcanary pushed (full sha, never empty).
pub fn is_pushed_head(head_sha: &str, pushed: Option<&str>) -> bool {
    pushed.is_some_and(|pushed| !pushed.is_empty() && pushed == head_sha)
}

/// Whether a gate commit's message names this release and step in its
/// `Gitcanary-Gate` trailer. A pull request's body can be edited by any
/// writer; the commit gitcanary pushed cannot.
pub fn commit_names_release(message: &str, rollout_id: &str, step: u32, canary_commit: &str) -> bool {
    let wanted = format!("{GATE_TRAILER}: {}", gate_id(rollout_id, step, canary_commit));
    !canary_commit.is_empty() && message.lines().any(|line| line.trim() == wanted)
}

/// Every path a pull request touches besides the gate file, a rename's old
/// path included: a rename into the gate file is not "only the gate file".
pub fn files_besides_gate(files: &[PullFile], gate_path: &str) -> Vec<String> {
    let mut others = Vec::new();
    for file in files {
        for path in std::iter::once(&file.filename).chain(file.previous_filename.iter()) {
            if path != gate_path && !others.contains(path) {
                others.push(path.clone());
            }
        }
    }
    others
}

/// Whether a bot account counts at all: listed by `--github-bot` only.
pub fn is_bot(login: &str) -> bool {
    login.ends_with("[bot]")
}

/// Whether `user` may decide a release whose commits `authors` made or
/// committed (writer access checked apart): never one of its authors (unless
/// self-approval is allowed), a bot only when listed, and a bot never for its
/// own commits even then. gitcanary's own account decides nothing this way.
pub fn may_decide(user: &str, bot: bool, own: &str, authors: &[String], policy: &GatePolicy) -> bool {
    if user.is_empty() || user == own {
        return false;
    }
    let authored = authors.iter().any(|a| a.eq_ignore_ascii_case(user));
    if (bot || is_bot(user)) && (!policy.bots.iter().any(|b| b == user) || authored) {
        return false;
    }
    policy.allow_self_approval || !authored
}

/// Whether a merge passes the gate: gitcanary merged it (after an approval
/// it checked), or someone who may decide did.
pub fn merge_counts(merged_by: Option<&str>, own: &str, authors: &[String], policy: &GatePolicy) -> bool {
    match merged_by {
        Some(by) if by == own => true,
        Some(by) => may_decide(by, false, own, authors, policy),
        None => false,
    }
}

/// What the gate is for: one release, one step, one file.
pub struct Gate<'a> {
    /// The account gitcanary acts as.
    pub own: &'a str,
    pub rollout_id: &'a str,
    pub step: u32,
    pub canary_commit: &'a str,
    /// The file the gate's commit writes, and the only one it may change.
    pub gate_path: &'a str,
    /// Who wrote or committed the release: they may not pass it.
    pub authors: &'a [String],
    pub policy: &'a GatePolicy,
}

/// What GitHub says about the gate's pull request, read before judging it.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    pub pull: Option<PullRequest>,
    /// The message of the head commit (merged or open pull requests).
    pub head_message: String,
    /// The files it changes (merged or open).
    pub files: Vec<PullFile>,
    /// Who merged it (a list does not say; the pull request itself does).
    pub merged_by: Option<String>,
    /// Who closed it (closed unmerged).
    pub closed_by: Option<String>,
    /// The latest approving review of each reviewer (open).
    pub approvals: Vec<Approval>,
    /// Of the accounts `asks_permission` named, those with write access.
    pub writers: BTreeSet<String>,
}

/// What the gate does about its pull request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Merged as the gate asks: pass it.
    Passed { merged_by: Option<String> },
    /// Approved by someone who may decide: gitcanary merges it (the team's
    /// branch rules may still refuse) and then passes the gate.
    Merge { approver: String },
    /// A writer closed it unmerged: abort the release.
    Abort,
    /// Someone who is not a writer closed it: reopen it, saying why.
    Reopen { closer: Option<String> },
    /// Keep waiting, saying why on the pull request when there is a reason
    /// a person can act on.
    Wait(Why),
}

/// Why the gate still waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Nothing decided yet (no approval that counts).
    Undecided,
    /// Its head commit is not this release's gate commit: another release's
    /// pull request, silently ignored.
    NotThisRelease,
    /// The head is not the commit gitcanary pushed.
    Head { head: String, pushed: Option<String> },
    /// It changes more than the gate file.
    Files(Vec<String>),
    /// A merge that does not count, and who made it.
    MergeIgnored { merged_by: Option<String> },
}

/// The accounts whose write access the judgement needs: the merger, the
/// closer, or approvers who may otherwise decide, on the head commit.
pub fn asks_permission(evidence: &Evidence, gate: &Gate) -> Vec<String> {
    let Some(pull) = &evidence.pull else {
        return Vec::new();
    };
    if pull.merged {
        return evidence
            .merged_by
            .iter()
            .filter(|by| *by != gate.own)
            .cloned()
            .collect();
    }
    if !pull.open {
        return evidence.closed_by.iter().cloned().collect();
    }
    evidence
        .approvals
        .iter()
        .filter(|a| counts_but_for_access(a, &pull.head_sha, gate))
        .map(|a| a.user.clone())
        .collect()
}

/// An approval counts for the commit it was given on, and only from someone
/// who may decide (and has write access, checked apart).
fn counts_but_for_access(approval: &Approval, head_sha: &str, gate: &Gate) -> bool {
    approval.commit == head_sha && may_decide(&approval.user, approval.bot, gate.own, gate.authors, gate.policy)
}

/// The gate's rule: only exactly the commit gitcanary pushed for this
/// release and step, changing the gate file only, passes, when merged by
/// gitcanary or by a writer who is none of the release's authors, or
/// approved on that commit by such a writer. A writer's close aborts.
pub fn judge(evidence: &Evidence, gate: &Gate) -> Judgement {
    let Some(pull) = &evidence.pull else {
        return Judgement::Wait(Why::Undecided);
    };
    let pushed = gate_commit(&pull.body);
    let of_release = !pull.head_sha.is_empty()
        && commit_names_release(&evidence.head_message, gate.rollout_id, gate.step, gate.canary_commit);
    let is_writer = |user: &str| evidence.writers.contains(user);
    if pull.merged {
        if !of_release {
            return Judgement::Wait(Why::NotThisRelease);
        }
        let merger = evidence.merged_by.as_deref();
        let writer = merger.is_none_or(|by| by == gate.own || is_writer(by));
        if is_pushed_head(&pull.head_sha, pushed)
            && files_besides_gate(&evidence.files, gate.gate_path).is_empty()
            && writer
            && merge_counts(merger, gate.own, gate.authors, gate.policy)
        {
            return Judgement::Passed {
                merged_by: evidence.merged_by.clone(),
            };
        }
        return Judgement::Wait(Why::MergeIgnored {
            merged_by: evidence.merged_by.clone(),
        });
    }
    if !pull.open {
        return match &evidence.closed_by {
            Some(closer) if is_writer(closer) => Judgement::Abort,
            closer => Judgement::Reopen { closer: closer.clone() },
        };
    }
    if !is_pushed_head(&pull.head_sha, pushed) {
        return Judgement::Wait(Why::Head {
            head: pull.head_sha.clone(),
            pushed: pushed.map(str::to_string),
        });
    }
    let others = files_besides_gate(&evidence.files, gate.gate_path);
    if !others.is_empty() {
        return Judgement::Wait(Why::Files(others));
    }
    if !of_release {
        return Judgement::Wait(Why::NotThisRelease);
    }
    evidence
        .approvals
        .iter()
        .find(|a| counts_but_for_access(a, &pull.head_sha, gate) && is_writer(&a.user))
        .map_or(Judgement::Wait(Why::Undecided), |a| Judgement::Merge {
            approver: a.user.clone(),
        })
}

impl PullRequest {
    /// A pull request as GitHub's REST API answers it; `None` without a number.
    pub fn from_json(value: &Value) -> Option<PullRequest> {
        Some(PullRequest {
            number: value["number"].as_u64()?,
            open: value["state"].as_str() == Some("open"),
            merged: value["merged_at"].as_str().is_some() || value["merged"].as_bool() == Some(true),
            head_ref: value["head"]["ref"].as_str().unwrap_or_default().to_string(),
            head_sha: value["head"]["sha"].as_str().unwrap_or_default().to_string(),
            head_repo: value["head"]["repo"]["full_name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            base_ref: value["base"]["ref"].as_str().unwrap_or_default().to_string(),
            author: value["user"]["login"].as_str().unwrap_or_default().to_string(),
            body: value["body"].as_str().unwrap_or_default().to_string(),
            merged_by: value["merged_by"]["login"].as_str().map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests;
