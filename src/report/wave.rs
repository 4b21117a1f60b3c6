//! The wave's pull request: when a release promotes in one environment,
//! the pull request that carries its images into the next, with what the
//! release proved here. One per release and environment (found again by its
//! branch), a commit status on its head, and an older release's wave pull
//! request closed as superseded. A failed release opens none.

use std::sync::Arc;

use tracing::{debug, info, warn};

use crate::github::{GitHub, escape_inline};
use crate::rollout::api::{Phase, RolloutStatus, WritebackAction};
use crate::rollout::model::RolloutSummary;
use crate::source::Source;
use crate::wave::push::{NoWave, WaveCommit, WaveRequest};
use crate::wave::wave_branch_prefix;
use crate::writeback::{Author, Writer};
use crate::{Error, Result};

/// The promote a wave follows: a Healthy release whose promote is in Git.
pub fn wave_request(app: &str, rollout: &RolloutSummary) -> Option<WaveRequest> {
    let status = &rollout.status;
    let written = status.written_back.as_ref()?;
    let promoted = status.phase == Phase::Healthy
        && written.action == WritebackAction::Promote
        && written.rollout_id == status.rollout_id
        && !written.commit.is_empty()
        && !status.stable_commit.is_empty();
    promoted.then(|| WaveRequest {
        namespace: rollout.namespace.clone(),
        name: rollout.name.clone(),
        app: app.to_string(),
        rollout_id: status.rollout_id.clone(),
        canary_commit: status.stable_commit.clone(),
        promote_commit: written.commit.clone(),
    })
}

/// Waves whose pull request could not be opened yet (GitHub or Git down,
/// a push refused): tried again with each later report, until done or
/// replaced by a newer promote of the same Rollout.
#[derive(Default)]
pub struct WaveRetries(std::sync::Mutex<std::collections::BTreeMap<(String, String), Waiting>>);

/// A wave still to open: the promote, and the tries so far.
type Waiting = (WaveRequest, RolloutStatus, u32);

/// Tries of one wave before it is given up (logged): a failure that lasts
/// (every branch name taken, settings that do not parse) is not retried forever.
const MAX_WAVE_TRIES: u32 = 10;

impl WaveRetries {
    fn keep(&self, (request, status, tries): Waiting) {
        if tries >= MAX_WAVE_TRIES {
            warn!(namespace = %request.namespace, rollout = %request.name, tries, "GitHub: the wave pull request is given up");
            return;
        }
        let key = (request.namespace.clone(), request.name.clone());
        let mut waiting = self.0.lock().unwrap_or_else(|e| e.into_inner());
        waiting.insert(key, (request, status, tries));
    }

    fn take(&self) -> Vec<Waiting> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
            .into_values()
            .collect()
    }

    /// Keeps only the waves of apps `holds` says this replica still syncs
    /// (a shard lost meanwhile: its new holder follows the promote).
    pub fn retain_apps(&self, holds: impl Fn(&str) -> bool) {
        let mut waiting = self.0.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(|_, (request, _, _)| holds(&request.app));
    }
}

/// Follows each promote of a report, and each one still waiting, with its
/// wave; one that fails waits for the next report. A wave of an app that
/// `holds` says this replica no longer syncs is left to the app's holder.
pub async fn follow_all(
    github: &GitHub,
    (source, author): (&Arc<Source>, &Author),
    promotes: Vec<(WaveRequest, RolloutStatus)>,
    retries: &WaveRetries,
    holds: impl Fn(&str) -> bool,
) {
    let mut all = retries.take();
    for (request, status) in promotes {
        // A newer promote of the same Rollout replaces one still waiting.
        all.retain(|(waiting, _, _)| (&waiting.namespace, &waiting.name) != (&request.namespace, &request.name));
        all.push((request, status, 0));
    }
    for (request, status, tries) in all {
        if !holds(&request.app) {
            continue;
        }
        if let Err(error) = follow(github, (source, author), &request, &status).await {
            warn!(%error, namespace = %request.namespace, rollout = %request.name, "GitHub: the wave pull request is tried again after the next sync");
            retries.keep((request, status, tries + 1));
        }
    }
}

/// The promotes of a report's changed Rollouts, each with its status.
pub fn promotes(report: &crate::sync::SyncReport) -> Vec<(WaveRequest, RolloutStatus)> {
    let rollouts = report
        .apps
        .iter()
        .flat_map(|a| a.rollouts.iter().map(move |r| (&a.app, r)));
    rollouts
        .filter(|(_, r)| r.changed)
        .filter_map(|(app, r)| Some((wave_request(app, r)?, r.status.clone())))
        .collect()
}

/// Pushes the wave branch and opens its pull request, once.
pub async fn follow(
    github: &GitHub,
    (source, author): (&Arc<Source>, &Author),
    request: &WaveRequest,
    status: &RolloutStatus,
) -> Result<()> {
    let Some(git) = source.git() else {
        return Ok(());
    };
    let base = git.branch().to_string();
    let (job, on, by) = (request.clone(), source.clone(), author.clone());
    let plan = crate::blocking("reading the wave", move || writer(&on, by).plan_wave(&job)).await??;
    let plan = match plan {
        Ok(plan) => plan,
        Err(NoWave::NotInAWave) => {
            debug!(rollout = %request.name, "no environment follows this one");
            return Ok(());
        }
        Err(why) => {
            info!(namespace = %request.namespace, rollout = %request.name, ?why, "no wave pull request: no such app there");
            return Ok(());
        }
    };
    // Who made the release may not pass the next environment's gates either.
    let previous = Some(plan.previous_stable.as_str()).filter(|p| !p.is_empty());
    let authors = github
        .commit_people(previous, &request.canary_commit, &author.email)
        .await?;
    let (job, on, by, carried) = (request.clone(), source.clone(), author.clone(), plan.clone());
    let pushed = crate::blocking("pushing the wave branch", move || {
        writer(&on, by).push_wave(&job, &carried, &authors)
    })
    .await??;
    let key = git.records().rollout_key(&request.namespace, &request.name);
    let own = github.login().await?.to_string();
    let prefix = wave_branch_prefix(&plan.to.name, &key);
    let wave = match pushed {
        Ok(wave) => wave,
        Err(why) => {
            info!(namespace = %request.namespace, rollout = %request.name, ?why, "no wave pull request: nothing to carry");
            let note = format!(
                "release `{}` promoted since, and **{}** already asks for its images where its Rollout releases them",
                escape_inline(&request.rollout_id),
                plan.to.name
            );
            return supersede(github, (&base, &own), &prefix, (None, &note)).await;
        }
    };
    let marker = wave_marker(&wave.to.name, &key, &request.canary_commit);
    let repository = github.repository();
    let found = github
        .pull_for_branch(&wave.branch)
        .await?
        .filter(|p| is_wave_pull(p, (&own, &repository, &base), &marker));
    let pull = match found {
        Some(pull) => pull,
        None => open(github, (&wave, &base, &own), (request, &marker), status).await?,
    };
    let context = format!("gitcanary/wave/{}", wave.to.name);
    if pull.open && pull.head_sha != wave.commit {
        // Someone pushed onto the wave: its head is not what the release
        // proved. Said on that head, and the pull request is closed; the
        // next try pushes the wave to another branch name.
        let description = format!(
            "the head is not gitcanary's wave commit {}",
            crate::short_commit(&wave.commit)
        );
        warn!(pull = pull.number, head = %pull.head_sha, "a wave pull request's head is not gitcanary's commit; closed");
        github
            .set_status(&pull.head_sha, &context, "failure", &description)
            .await?;
        let why = format!(
            "gitcanary closes this wave pull request: commits were pushed onto it after gitcanary's {}, so it is not what {} proved. The wave is opened again from another branch.",
            crate::short_commit(&wave.commit),
            wave.from.name
        );
        github.reply(pull.number, &why).await?;
        github.close_pull(pull.number).await?;
        return Err(Error::GitHub {
            context: "the wave pull request".into(),
            status: None,
            message: format!("{} holds commits gitcanary did not push", wave.branch),
        });
    }
    let description = format!("release {} promoted in {}", request.rollout_id, wave.from.name);
    github
        .set_status(&wave.commit, &context, "success", &description)
        .await?;
    let note = format!("a newer release promoted since, carried by #{}", pull.number);
    supersede(github, (&base, &own), &prefix, (Some(pull.number), &note)).await
}

fn writer(source: &Arc<Source>, author: Author) -> Writer<'_> {
    Writer {
        git: source.git().expect("checked: a Git source"),
        author,
        status_branch: None,
    }
}

/// Opens the wave's pull request; one an earlier life of the agent opened
/// meanwhile is taken as it is.
async fn open(
    github: &GitHub,
    (wave, base, own): (&WaveCommit, &str, &str),
    (request, marker): (&WaveRequest, &str),
    status: &RolloutStatus,
) -> Result<crate::github::PullRequest> {
    let title = format!(
        "Promote {}/{} to {}: release {}",
        request.namespace, request.name, wave.to.name, request.rollout_id
    );
    let body = wave_body(wave, request, status, marker);
    match github.create_pull(&wave.branch, base, &title, &body).await {
        Ok(pull) => {
            info!(pull = pull.number, branch = %wave.branch, to = %wave.to.name, "wave pull request opened");
            Ok(pull)
        }
        Err(Error::GitHub { status: Some(422), .. }) => {
            let repository = github.repository();
            github
                .pull_for_branch(&wave.branch)
                .await?
                .filter(|p| is_wave_pull(p, (own, &repository, base), marker))
                .ok_or_else(|| Error::GitHub {
                    context: "opening the wave pull request".into(),
                    status: Some(422),
                    message: format!(
                        "refused, and no wave pull request of this release from {} exists",
                        wave.branch
                    ),
                })
        }
        Err(error) => Err(error),
    }
}

/// Whether a pull request is this release's wave: opened by gitcanary from
/// this repository into the tracked branch, naming the release.
fn is_wave_pull(pull: &crate::github::PullRequest, (own, repository, base): (&str, &str, &str), marker: &str) -> bool {
    pull.author == own
        && pull.head_repo.eq_ignore_ascii_case(repository)
        && pull.base_ref == base
        && pull.body.contains(marker)
}

/// Closes this Rollout's other wave pull requests into the same
/// environment (all but `keep`), saying why.
async fn supersede(
    github: &GitHub,
    (base, own): (&str, &str),
    prefix: &str,
    (keep, why): (Option<u64>, &str),
) -> Result<()> {
    for pull in github.open_pulls(base).await? {
        if Some(pull.number) == keep
            || pull.author != own
            || !crate::rollout::record::right_under(&pull.head_ref, prefix)
        {
            continue;
        }
        github
            .reply(pull.number, &format!("gitcanary closes this wave pull request: {why}."))
            .await?;
        github.close_pull(pull.number).await?;
        info!(pull = pull.number, "older wave pull request closed");
    }
    Ok(())
}

/// The hidden line naming the environment and release a wave pull request is for.
fn wave_marker(to: &str, rollout_key: &str, canary_commit: &str) -> String {
    format!("<!-- gitcanary:wave {to} {rollout_key} {canary_commit} -->")
}

/// The wave pull request's body: what it carries, and what the release proved.
pub fn wave_body(wave: &WaveCommit, request: &WaveRequest, status: &RolloutStatus, marker: &str) -> String {
    let code = |text: &str| format!("`{}`", escape_inline(text).replace('`', "'"));
    // Text from elsewhere: one line, and no markup (a marker of gitcanary's included).
    let text = |text: &str| escape_inline(text).replace('<', "&lt;");
    let mut body = format!(
        "gitcanary carries release {} of {} from **{}** into **{}**: {}.\n\n",
        code(&request.rollout_id),
        code(&format!("{}/{}", request.namespace, request.name)),
        wave.from.name,
        wave.to.name,
        wave.images.iter().map(|i| code(i)).collect::<Vec<_>>().join(", "),
    );
    body.push_str(&format!(
        "### Proven in {}\n\n| Step | Started | Finished | Passed by |\n|---|---|---|---|\n",
        wave.from.name
    ));
    for step in &status.step_history {
        body.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            step.step,
            text(&step.started_at),
            text(&step.finished_at),
            text(&step.passed_by)
        ));
    }
    if !status.analysis_runs.is_empty() {
        body.push_str("\nAnalysis:\n");
        for run in &status.analysis_runs {
            body.push_str(&format!(
                "- {} {}: {} successful, {} failed, {} inconclusive; last: {}\n",
                code(&run.name),
                code(&run.template),
                run.successful,
                run.failed,
                run.inconclusive,
                text(&run.message)
            ));
        }
    }
    let approvers: Vec<String> = status
        .step_history
        .iter()
        .filter_map(|s| s.passed_by.strip_prefix("promoted by "))
        .map(text)
        .collect();
    if !approvers.is_empty() {
        body.push_str(&format!("\nApproved by: {}\n", approvers.join(", ")));
    }
    body.push_str(&format!(
        "\nRelease commit {}; promoted by gitcanary's commit {}.\n\nThis changes {}. Merging it starts {}'s own release, with its own steps and gates.\n\n{marker}\n",
        code(&request.canary_commit),
        code(&request.promote_commit),
        wave.files.iter().map(|f| code(f)).collect::<Vec<_>>().join(", "),
        wave.to.name,
    ));
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::api::{AnalysisRun, StepRecord, WrittenBack};
    use crate::wave::Environment;

    fn promoted() -> RolloutSummary {
        RolloutSummary {
            namespace: "shop".into(),
            name: "web".into(),
            spec: Default::default(),
            status: RolloutStatus {
                phase: Phase::Healthy,
                rollout_id: "abc1234".into(),
                stable_commit: "c".repeat(40),
                written_back: Some(WrittenBack {
                    action: WritebackAction::Promote,
                    rollout_id: "abc1234".into(),
                    commit: "p".repeat(40),
                    note: String::new(),
                }),
                ..Default::default()
            },
            changed: true,
            last_command_comment: 0,
        }
    }

    #[test]
    fn only_a_promote_in_git_sends_a_release_on() {
        let request = wave_request("web", &promoted()).expect("promoted");
        assert_eq!(
            (request.canary_commit.as_str(), request.promote_commit.as_str()),
            (&*"c".repeat(40), &*"p".repeat(40))
        );
        let mut reverted = promoted();
        reverted.status.written_back.as_mut().expect("set").action = WritebackAction::Revert;
        assert!(
            wave_request("web", &reverted).is_none(),
            "a failed release opens nothing"
        );
        let mut earlier = promoted();
        earlier.status.rollout_id = "def5678".into();
        earlier.status.phase = Phase::Progressing;
        assert!(wave_request("web", &earlier).is_none(), "a newer release under way");
        let mut unwritten = promoted();
        unwritten.status.written_back = None;
        assert!(
            wave_request("web", &unwritten).is_none(),
            "the promote is not in Git yet"
        );
    }

    #[test]
    fn the_wave_body_tells_what_the_release_proved() {
        let rollout = promoted();
        let mut status = rollout.status.clone();
        status.step_history = vec![StepRecord {
            step: 1,
            started_at: "2026-12-04T10:00:00Z".into(),
            finished_at: "2026-12-04T10:05:00Z".into(),
            passed_by: "promoted by carol".into(),
        }];
        status.analysis_runs = vec![AnalysisRun {
            name: "step-1".into(),
            template: "success-rate".into(),
            successful: 3,
            message: "success-rate 0.99 against >= 0.95 | <b>".into(),
            ..Default::default()
        }];
        let env = |name: &str| Environment {
            name: name.into(),
            path: format!("envs/{name}"),
            cluster: None,
        };
        let wave = WaveCommit {
            from: env("staging"),
            to: env("production"),
            branch: "gitcanary/wave/production/shop/web/abc1234".into(),
            commit: "w".repeat(40),
            images: vec!["registry.test/web:1.1.0".into()],
            files: vec!["envs/production/web/kustomization.yaml".into()],
        };
        let request = wave_request("web", &rollout).expect("promoted");
        let body = wave_body(&wave, &request, &status, "<!-- m -->");
        for part in [
            "from **staging** into **production**: `registry.test/web:1.1.0`",
            "| 1 | 2026-12-04T10:00:00Z | 2026-12-04T10:05:00Z | promoted by carol |",
            "`step-1` `success-rate`: 3 successful, 0 failed, 0 inconclusive; last: success-rate 0.99",
            "Approved by: carol",
            &format!("promoted by gitcanary's commit `{}`", "p".repeat(40)),
            "`envs/production/web/kustomization.yaml`",
            "<!-- m -->",
        ] {
            assert!(body.contains(part), "{part:?} missing from\n{body}");
        }
        assert!(!body.contains("<b>"), "text from Prometheus is escaped:\n{body}");
    }
}
