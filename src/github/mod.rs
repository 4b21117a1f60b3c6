//! GitHub: one comment per release on the pull request that carried the
//! change (edited in place, found again by a hidden marker), a commit status
//! per rollout, and `/gitcanary promote|abort` commands from writers. All
//! through octocrab, with a configurable base URL (Enterprise, tests).

use octocrab::Octocrab;
use serde_json::{Value, json};

use crate::rollout::api::{Phase, RolloutSpec, RolloutStatus, StepState};
use crate::rollout::plan::parse_percent;
use crate::{Error, Result};

pub struct GitHub {
    client: Octocrab,
    owner: String,
    repo: String,
}

/// A command found in a comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Promote,
    Abort,
}

/// One comment that holds a command.
#[derive(Debug, Clone)]
pub struct CommandComment {
    pub id: u64,
    pub user: String,
    pub command: Command,
}

fn github_error(context: &str) -> impl FnOnce(octocrab::Error) -> Error + '_ {
    move |e| Error::Object {
        object: format!("GitHub: {context}"),
        message: match &e {
            octocrab::Error::GitHub { source, .. } => source.message.clone(),
            other => other.to_string(),
        },
    }
}

impl GitHub {
    /// `repository` is `owner/name`; `base_url` is `https://api.github.com` or an Enterprise or test URL.
    pub fn new(base_url: &str, token: &str, repository: &str) -> Result<GitHub> {
        let (owner, repo) = repository
            .split_once('/')
            .ok_or_else(|| Error::Usage(format!("--github-repo {repository:?} is not owner/name")))?;
        let client = Octocrab::builder()
            .base_uri(base_url)
            .map_err(github_error("base URL"))?
            .personal_token(token.to_string())
            .build()
            .map_err(github_error("client"))?;
        Ok(GitHub {
            client,
            owner: owner.to_string(),
            repo: repo.to_string(),
        })
    }

    fn path(&self, rest: &str) -> String {
        format!("/repos/{}/{}/{rest}", self.owner, self.repo)
    }

    /// Pull requests that carried a commit.
    pub async fn pulls_for_commit(&self, sha: &str) -> Result<Vec<u64>> {
        let pulls: Vec<Value> = self
            .client
            .get(self.path(&format!("commits/{sha}/pulls")), None::<&()>)
            .await
            .map_err(github_error("pull requests of a commit"))?;
        Ok(pulls.iter().filter_map(|p| p["number"].as_u64()).collect())
    }

    async fn comments(&self, pull: u64) -> Result<Vec<Value>> {
        self.client
            .get(self.path(&format!("issues/{pull}/comments?per_page=100")), None::<&()>)
            .await
            .map_err(github_error("comments"))
    }

    /// Creates the comment holding `marker`, or edits it in place.
    pub async fn upsert_comment(&self, pull: u64, marker: &str, body: &str) -> Result<u64> {
        let existing = self
            .comments(pull)
            .await?
            .into_iter()
            .find(|c| c["body"].as_str().is_some_and(|b| b.contains(marker)));
        let full = format!("{marker}\n{body}");
        let comment: Value = match existing {
            Some(comment) if comment["body"].as_str() == Some(full.as_str()) => comment,
            Some(comment) => {
                let id = comment["id"].as_u64().unwrap_or_default();
                self.client
                    .patch(
                        self.path(&format!("issues/comments/{id}")),
                        Some(&json!({"body": full})),
                    )
                    .await
                    .map_err(github_error("editing the release comment"))?
            }
            None => self
                .client
                .post(
                    self.path(&format!("issues/{pull}/comments")),
                    Some(&json!({"body": full})),
                )
                .await
                .map_err(github_error("creating the release comment"))?,
        };
        Ok(comment["id"].as_u64().unwrap_or_default())
    }

    pub async fn set_status(&self, sha: &str, context: &str, state: &str, description: &str) -> Result<()> {
        let description: String = description.chars().take(140).collect();
        let _: Value = self
            .client
            .post(
                self.path(&format!("statuses/{sha}")),
                Some(&json!({"state": state, "context": context, "description": description})),
            )
            .await
            .map_err(github_error("setting the commit status"))?;
        Ok(())
    }

    /// Commands in comments newer than `after`, oldest first.
    pub async fn commands(&self, pull: u64, after: u64) -> Result<Vec<CommandComment>> {
        let mut found: Vec<CommandComment> = self
            .comments(pull)
            .await?
            .iter()
            .filter_map(|c| {
                let id = c["id"].as_u64()?;
                let command = parse_command(c["body"].as_str()?)?;
                (id > after).then(|| CommandComment {
                    id,
                    user: c["user"]["login"].as_str().unwrap_or_default().to_string(),
                    command,
                })
            })
            .collect();
        found.sort_by_key(|c| c.id);
        Ok(found)
    }

    /// Whether the user may act on releases: write, maintain or admin.
    pub async fn can_write(&self, user: &str) -> Result<bool> {
        let answer: Value = self
            .client
            .get(self.path(&format!("collaborators/{user}/permission")), None::<&()>)
            .await
            .map_err(github_error("a collaborator's permission"))?;
        let permission = answer["role_name"]
            .as_str()
            .or(answer["permission"].as_str())
            .unwrap_or_default();
        Ok(matches!(permission, "write" | "maintain" | "admin"))
    }

    pub async fn reply(&self, pull: u64, body: &str) -> Result<()> {
        let _: Value = self
            .client
            .post(
                self.path(&format!("issues/{pull}/comments")),
                Some(&json!({"body": body})),
            )
            .await
            .map_err(github_error("replying"))?;
        Ok(())
    }
}

/// A command is a line that is exactly `/gitcanary promote` or
/// `/gitcanary abort`, outside quotes and code blocks.
pub fn parse_command(body: &str) -> Option<Command> {
    let mut in_code = false;
    for line in body.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code || trimmed.starts_with('>') || line.starts_with("    ") || line.starts_with('\t') {
            continue;
        }
        match trimmed {
            "/gitcanary promote" => return Some(Command::Promote),
            "/gitcanary abort" => return Some(Command::Abort),
            _ => {}
        }
    }
    None
}

/// The hidden marker that finds a release's comment again.
pub fn marker(namespace: &str, name: &str, rollout_id: &str) -> String {
    format!("<!-- gitcanary:release {namespace}/{name} {rollout_id} -->")
}

/// The commit status for a rollout's phase: (state, description).
pub fn commit_status(status: &RolloutStatus) -> (&'static str, String) {
    let message = status
        .canary_status
        .as_ref()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    match status.phase {
        Phase::Healthy => ("success", "promoted".to_string()),
        Phase::Failed => ("failure", message),
        _ => ("pending", message),
    }
}

/// The release comment: phase, what it waits for, a table of steps and a
/// mermaid chart of traffic over the steps.
pub fn render_comment(namespace: &str, name: &str, spec: &RolloutSpec, status: &RolloutStatus) -> String {
    let canary = status.canary_status.clone().unwrap_or_default();
    let mut out = format!(
        "### gitcanary: release `{}` of `{namespace}/{name}`\n\n**{:?}**",
        status.rollout_id, status.phase
    );
    if !canary.message.is_empty() {
        out.push_str(&format!(": {}", canary.message));
    }
    out.push_str("\n\n");
    if status.phase == Phase::Paused && canary.current_step_state == StepState::StepPaused {
        out.push_str(&format!(
            "Waiting for promote: comment `/gitcanary promote` (writers only) or run `gitcanary promote {name} -n {namespace}`; `/gitcanary abort` reverts.\n\n"
        ));
    }
    out.push_str("| step | traffic | replicas | state | started | finished |\n|---|---|---|---|---|---|\n");
    let mut weights = Vec::new();
    for (i, step) in spec.strategy.canary.steps.iter().enumerate() {
        let n = i as u32 + 1;
        let record = status.step_history.iter().find(|r| r.step == n);
        let state = if n == canary.current_step_index && status.phase != Phase::Healthy {
            format!("{:?}", canary.current_step_state)
        } else if record.is_some_and(|r| !r.finished_at.is_empty()) {
            "done".to_string()
        } else {
            String::new()
        };
        let traffic = step.traffic.as_deref().and_then(|t| parse_percent(t).ok());
        weights.push(traffic.unwrap_or(0));
        let replicas = match &step.replicas {
            Some(crate::rollout::api::IntOrPercent::Int(r)) => r.to_string(),
            Some(crate::rollout::api::IntOrPercent::Percent(p)) => p.clone(),
            None => "-".to_string(),
        };
        out.push_str(&format!(
            "| {n} | {} | {replicas} | {state} | {} | {} |\n",
            traffic.map_or("-".to_string(), |t| format!("{t}%")),
            record.map_or("", |r| r.started_at.as_str()),
            record.map_or("", |r| r.finished_at.as_str()),
        ));
    }
    let labels: Vec<String> = (1..=weights.len()).map(|n| format!("\"{n}\"")).collect();
    out.push_str(&format!(
        "\n```mermaid\nxychart-beta\n  title \"Traffic to the canary (%)\"\n  x-axis \"step\" [{}]\n  y-axis \"traffic\" 0 --> 100\n  bar [{}]\n```\n",
        labels.join(", "),
        weights.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_parsed_strictly() {
        assert_eq!(parse_command("/gitcanary promote"), Some(Command::Promote));
        assert_eq!(parse_command("looks good\n\n/gitcanary abort\n"), Some(Command::Abort));
        assert_eq!(parse_command("> /gitcanary promote"), None, "a quote is not a command");
        assert_eq!(parse_command("```\n/gitcanary promote\n```"), None, "nor a code block");
        assert_eq!(parse_command("    /gitcanary promote"), None, "nor an indented block");
        assert_eq!(parse_command("please /gitcanary promote"), None);
        assert_eq!(parse_command("/gitcanary promote now"), None);
    }

    #[test]
    fn the_comment_shows_steps_and_traffic() {
        let spec: RolloutSpec = serde_json::from_value(json!({
            "workloadRef": {"kind": "Deployment", "name": "echo"},
            "strategy": {"canary": {"steps": [{"traffic": "20%", "replicas": 1}, {"traffic": "100%"}]}}
        }))
        .expect("spec");
        let status: RolloutStatus = serde_json::from_value(json!({
            "phase": "Paused", "rolloutID": "abc1234",
            "canaryStatus": {"currentStepIndex": 1, "currentStepState": "StepPaused", "canaryReadyReplicas": 1, "message": "step 1: waiting for promote"},
            "stepHistory": [{"step": 1, "startedAt": "2026-11-30T10:00:00Z"}]
        }))
        .expect("status");
        let comment = render_comment("demo", "echo", &spec, &status);
        assert!(comment.contains("release `abc1234` of `demo/echo`"), "{comment}");
        assert!(
            comment.contains("| 1 | 20% | 1 | StepPaused | 2026-11-30T10:00:00Z |  |"),
            "{comment}"
        );
        assert!(comment.contains("/gitcanary promote"), "{comment}");
        assert!(comment.contains("bar [20, 100]"), "{comment}");
        assert_eq!(commit_status(&status).0, "pending");
    }
}
