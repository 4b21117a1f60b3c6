//! The text gitcanary writes on GitHub and reads back: the release
//! comment, the commit status, and `/gitcanary` commands.

use crate::rollout::api::{Phase, RolloutSpec, RolloutStatus, Signal, StepState};
use crate::rollout::plan::parse_percent;

/// Text from elsewhere (a message, a metric name, an error) made safe to
/// put inside a line of gitcanary's comments: one line, no table breaks.
pub fn escape_inline(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect::<String>()
        .replace('|', "\\|")
}

/// Every comment gitcanary writes: no line of it can read as a command, so
/// text it quotes from elsewhere cannot pass a gate in its name.
pub fn defang(body: &str) -> String {
    body.lines()
        .map(|line| {
            let indent = line.len() - line.trim_start().len();
            if line.trim_start().starts_with('/') {
                format!("{}\\{}", &line[..indent], &line[indent..])
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A command is a line that is exactly `/gitcanary promote` or
/// `/gitcanary abort`, outside quotes and code blocks.
pub fn parse_command(body: &str) -> Option<Signal> {
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
            "/gitcanary promote" => return Some(Signal::Promote),
            "/gitcanary abort" => return Some(Signal::Abort),
            _ => {}
        }
    }
    None
}

/// The hidden marker that finds a release's comment again.
pub fn marker(namespace: &str, name: &str, rollout_id: &str) -> String {
    format!("<!-- gitcanary:release {namespace}/{name} {rollout_id} -->")
}

/// Whether the status tells of a release. Healthy does only when it is that
/// release's promotion: after a revert or a fast rollback the rollout is
/// Healthy on the old stable version, which is no news for the release's
/// pull request (its comment keeps the failure).
pub fn is_reportable(status: &RolloutStatus) -> bool {
    use crate::rollout::api::WritebackAction;
    if status.rollout_id.is_empty() {
        return false;
    }
    if status.phase != Phase::Healthy {
        return true;
    }
    let promoted_pending = status
        .pending_writeback
        .as_ref()
        .is_some_and(|p| p.action == WritebackAction::Promote && p.rollout_id == status.rollout_id);
    let promoted_written = status
        .written_back
        .as_ref()
        .is_some_and(|w| w.action == WritebackAction::Promote && w.rollout_id == status.rollout_id);
    promoted_pending || promoted_written
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
pub fn render_comment(
    namespace: &str,
    name: &str,
    spec: &RolloutSpec,
    status: &RolloutStatus,
    gate_pull: Option<u64>,
) -> String {
    let canary = status.canary_status.clone().unwrap_or_default();
    let style = spec.strategy.style.label();
    let mut out = format!(
        "### gitcanary: release `{}` of `{namespace}/{name}`{style}\n\n**{:?}**",
        status.rollout_id, status.phase
    );
    if !canary.message.is_empty() {
        out.push_str(&format!(": {}", canary.message));
    }
    out.push_str("\n\n");
    if let Some(line) = crate::rollout::cli::revisions_line(spec, status) {
        let line = escape_inline(&line);
        out.push_str(&format!("{}{}.\n\n", line[..1].to_ascii_uppercase(), &line[1..]));
    }
    if status.phase == Phase::Paused && canary.current_step_state == StepState::StepPaused {
        let gate = gate_pull.map_or(String::new(), |n| {
            format!("approve the promotion pull request #{n} (closing it aborts), or ")
        });
        out.push_str(&format!(
            "Waiting for promote: {gate}comment `/gitcanary promote` (writers only) or run `gitcanary promote {name} -n {namespace}`; `/gitcanary abort` reverts.\n\n"
        ));
    }
    written_back(&mut out, status);
    analysis_table(&mut out, status);
    steps_table(&mut out, spec, status, &canary);
    out
}

/// What the release's Git write-back did, with its warning.
fn written_back(out: &mut String, status: &RolloutStatus) {
    if let Some(written) = status
        .written_back
        .as_ref()
        .filter(|w| w.rollout_id == status.rollout_id)
    {
        let what = match written.action {
            crate::rollout::api::WritebackAction::Promote => "Promote recorded in Git",
            crate::rollout::api::WritebackAction::Revert => "Reverted in Git",
            crate::rollout::api::WritebackAction::Hold => "Held failure recorded in Git",
        };
        if written.commit.is_empty() {
            out.push_str(&format!("{what}: Git already held it.\n\n"));
        } else {
            out.push_str(&format!("{what} by commit {}.\n\n", written.commit));
        }
        if !written.note.is_empty() {
            out.push_str(&format!("> [!WARNING]\n> {}\n\n", written.note));
        }
    }
}

/// The release's analysis runs, one row each.
fn analysis_table(out: &mut String, status: &RolloutStatus) {
    let runs: Vec<_> = status
        .analysis_runs
        .iter()
        .filter(|r| r.rollout_id == status.rollout_id)
        .collect();
    if !runs.is_empty() {
        out.push_str("| analysis | template | successful | failed | inconclusive | last measurement |\n|---|---|---|---|---|---|\n");
        for run in runs {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                run.name,
                run.template,
                run.successful,
                run.failed,
                run.inconclusive,
                run.message.replace('|', "\\|")
            ));
        }
        out.push('\n');
    }
}

/// The steps, one row each, and a chart of traffic over them.
fn steps_table(
    out: &mut String,
    spec: &RolloutSpec,
    status: &RolloutStatus,
    canary: &crate::rollout::api::CanaryStatus,
) {
    out.push_str("| step | traffic | replicas | state | started | finished |\n|---|---|---|---|---|---|\n");
    let mut weights = Vec::new();
    for (i, step) in spec.strategy.canary.steps.iter().enumerate() {
        let n = i as u32 + 1;
        let record = status.step_history.iter().find(|r| r.step == n);
        let state = if n == canary.current_step_index && status.phase != Phase::Healthy {
            canary.current_step_state.name().to_string()
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
        let mut traffic = traffic.map_or("-".to_string(), |t| format!("{t}%"));
        if !step.matches.is_empty() {
            let matches = crate::rollout::api::describe_matches(&step.matches);
            traffic.push_str(&format!(" + requests with {}", escape_inline(&matches)));
        }
        out.push_str(&format!(
            "| {n} | {traffic} | {replicas} | {state} | {} | {} |\n",
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
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn no_line_of_gitcanarys_comments_reads_as_a_command() {
        let hostile = "error ratio\n/gitcanary promote\n  /gitcanary abort";
        let body = format!("| metric | {} |\n{hostile}", escape_inline(hostile));
        let posted = defang(&body);
        assert_eq!(parse_command(&posted), None, "{posted}");
        assert!(
            posted.starts_with("| metric | error ratio /gitcanary promote   /gitcanary abort |"),
            "{posted}"
        );
        assert_eq!(escape_inline("a|b"), "a\\|b");
        assert_eq!(
            parse_command("/gitcanary promote"),
            Some(Signal::Promote),
            "people's commands still parse"
        );
    }

    #[test]
    fn commands_are_parsed_strictly() {
        assert_eq!(parse_command("/gitcanary promote"), Some(Signal::Promote));
        assert_eq!(parse_command("looks good\n\n/gitcanary abort\n"), Some(Signal::Abort));
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
        let comment = render_comment("demo", "echo", &spec, &status, Some(12));
        assert!(comment.contains("release `abc1234` of `demo/echo`"), "{comment}");
        assert!(
            comment.contains("| 1 | 20% | 1 | StepPaused | 2026-11-30T10:00:00Z |  |"),
            "{comment}"
        );
        assert!(comment.contains("/gitcanary promote"), "{comment}");
        assert!(comment.contains("promotion pull request #12"), "{comment}");
        assert!(comment.contains("bar [20, 100]"), "{comment}");
        assert_eq!(commit_status(&status).0, "pending");
    }

    #[test]
    fn a_function_comment_names_its_revisions() {
        let spec: RolloutSpec = serde_json::from_value(json!({
            "workloadRef": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "fn"},
            "strategy": {"canary": {"steps": [{"traffic": "20%"}]}}
        }))
        .expect("spec");
        let status: RolloutStatus = serde_json::from_value(json!({
            "phase": "Progressing", "rolloutID": "abc1234",
            "stableRevision": "fn-00001", "canaryRevision": "fn-00002",
        }))
        .expect("status");
        let comment = render_comment("demo", "fn", &spec, &status, None);
        assert!(
            comment.contains("Stable Revision fn-00001, canary Revision fn-00002."),
            "{comment}"
        );
    }

    #[test]
    fn healthy_is_news_only_when_the_release_was_promoted() {
        let status = |extra: Value| -> RolloutStatus {
            let mut base = json!({"phase": "Healthy", "rolloutID": "abc1234"});
            base.as_object_mut()
                .expect("object")
                .extend(extra.as_object().expect("object").clone());
            serde_json::from_value(base).expect("status")
        };
        let written =
            |action: &str| json!({"writtenBack": {"action": action, "rolloutID": "abc1234", "commit": "f00"}});
        assert!(is_reportable(&status(written("Promote"))));
        assert!(
            !is_reportable(&status(written("Revert"))),
            "back on stable after a revert"
        );
        assert!(!is_reportable(&status(json!({}))), "a fast rollback");
        assert!(is_reportable(&status(json!({"phase": "Failed"}))));
    }
}
