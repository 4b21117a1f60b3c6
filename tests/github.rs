//! The release told on the pull request that carried it, through octocrab
//! against a GitHub fake: one comment edited in place, a commit status,
//! `/gitcanary` commands that count only from writers, promotion pull
//! requests that merge into the real Git repository, and rate limits.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use kube::api::Api;
use support::agent::{Scenario, github_agent, github_agent_with};
use support::eventually;
use support::github::{FakePull, GitHubFake};

const WAIT: Duration = Duration::from_secs(90);

fn write_app(scenario: &Scenario, image: &str) {
    write_app_with_steps(scenario, image, "      - {replicas: 1, pause: {}}\n");
}

fn write_app_with_steps(scenario: &Scenario, image: &str, steps: &str) {
    let spec = format!("  strategy:\n    canary:\n      steps:\n{steps}");
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, &spec);
}

async fn phase(scenario: &Scenario) -> Option<Phase> {
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    rollouts.get_opt("echo").await.ok().flatten()?.status.map(|s| s.phase)
}

async fn current_step(scenario: &Scenario) -> u32 {
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    rollouts
        .get_opt("echo")
        .await
        .ok()
        .flatten()
        .and_then(|r| r.status?.canary_status)
        .map_or(0, |c| c.current_step_index)
}

async fn wait_for_phase(scenario: &Scenario, wanted: Phase) {
    eventually(&format!("phase {wanted:?}"), WAIT, || async {
        (phase(scenario).await == Some(wanted)).then_some(())
    })
    .await;
}

async fn wait_for_failure(scenario: &Scenario) {
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    eventually("the release failed", WAIT, || async {
        let status = rollouts.get_opt("echo").await.ok().flatten()?.status?;
        support::agent::failed_or_reverted(&status).then_some(())
    })
    .await;
}

/// The promotion pull request of a step, once the agent opened it.
async fn promotion_pull(fake: &GitHubFake, step: u32) -> FakePull {
    eventually(&format!("the promotion pull request of step {step}"), WAIT, || async {
        fake.pulls()
            .into_iter()
            .find(|p| p.head.starts_with("gitcanary/promote/") && p.head.ends_with(&format!("-{step}")))
    })
    .await
}

#[tokio::test]
async fn the_pull_request_follows_the_release_and_only_writers_can_promote() {
    let scenario = Scenario::new("gh-release").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    fake.grant("mallory", "read");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let phase = || async { rollouts.get_opt("echo").await.ok().flatten()?.status.map(|s| s.phase) };
    eventually("healthy on 1.0", WAIT, || async {
        (phase().await == Some(Phase::Healthy)).then_some(())
    })
    .await;

    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    eventually("paused", WAIT, || async {
        (phase().await == Some(Phase::Paused)).then_some(())
    })
    .await;
    let release_comment = |fake: &GitHubFake| {
        fake.comments_on(7)
            .into_iter()
            .filter(|(_, _, body)| body.contains("<!-- gitcanary:release"))
            .collect::<Vec<_>>()
    };
    let comment = eventually("the release comment waits for promote", WAIT, || async {
        let comments = release_comment(&fake);
        comments
            .iter()
            .find(|(_, _, b)| b.contains("Waiting for promote"))
            .cloned()
    })
    .await;
    assert!(comment.2.contains("```mermaid"), "{}", comment.2);
    assert!(
        fake.statuses_for(&commit)
            .iter()
            .any(|(state, context, _)| state == "pending" && context == &format!("gitcanary/{}/echo", scenario.ns))
    );

    // A reader's command changes nothing and is answered.
    fake.comment(7, "mallory", "/gitcanary promote");
    eventually("mallory is told", WAIT, || async {
        fake.comments_on(7)
            .iter()
            .any(|(_, _, b)| b.starts_with("@mallory") && b.contains("needs write"))
            .then_some(())
    })
    .await;
    comments_read(&fake, 7, 2).await;
    assert_eq!(phase().await, Some(Phase::Paused));
    // A command in a quote is not a command, even from a writer.
    fake.comment(7, "alice", "> /gitcanary promote\nmallory asked for this");
    comments_read(&fake, 7, 2).await;
    assert_eq!(phase().await, Some(Phase::Paused));

    fake.comment(7, "alice", "Looks good.\n/gitcanary promote");
    eventually("promoted", WAIT, || async {
        (phase().await == Some(Phase::Healthy)).then_some(())
    })
    .await;
    eventually("success status and a promoted comment", WAIT, || async {
        let success = fake
            .statuses_for(&commit)
            .iter()
            .any(|(state, _, _)| state == "success");
        let promoted = release_comment(&fake).iter().any(|(_, _, b)| b.contains("**Healthy**"));
        (success && promoted).then_some(())
    })
    .await;
    assert_eq!(
        release_comment(&fake).len(),
        1,
        "one comment per release, edited in place"
    );
    assert_eq!(
        fake.count("POST", "/issues/7/comments"),
        2,
        "one release comment and one reply to mallory"
    );
    assert!(fake.count("PATCH", "/issues/comments/") >= 1);
}

#[tokio::test]
async fn promotion_pull_requests_are_the_gates_and_merge_into_git() {
    let scenario = Scenario::new("gh-gate").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    fake.grant("mallory", "read");
    let steps = "      - {replicas: 1, pause: {}}\n      - {replicas: 2, pause: {}}\n";
    write_app_with_steps(&scenario, "1.0", steps);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;

    write_app_with_steps(&scenario, "2.0", steps);
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;
    let gate = promotion_pull(&fake, 1).await;
    let namespace = &scenario.ns;
    assert!(
        gate.head.starts_with(&format!("gitcanary/promote/{namespace}/echo/")),
        "{}",
        gate.head
    );
    assert!(gate.body.contains("#7"), "the gate links the change: {}", gate.body);
    let gate_file = format!(".gitcanary/gates/{namespace}/echo.yaml");
    let on_branch = scenario.git(&["show", &format!("{}:{gate_file}", gate.head)]);
    assert!(on_branch.contains("step: 1"), "{on_branch}");
    assert!(
        on_branch.contains(&commit),
        "the gate names the canary commit: {on_branch}"
    );
    eventually("the release comment names the gate", WAIT, || async {
        fake.comments_on(7)
            .iter()
            .any(|(_, _, b)| b.contains(&format!("promotion pull request #{}", gate.number)))
            .then_some(())
    })
    .await;

    // A reader's approval and a reader's command change nothing, even with a
    // writer's approval on another pull request.
    let unrelated = fake.open_pull_as("bob", "acme", "docs-typo", "main", "Fix a typo");
    fake.review(unrelated, "alice", "APPROVED");
    fake.review(gate.number, "mallory", "APPROVED");
    fake.comment(gate.number, "mallory", "/gitcanary promote");
    eventually("mallory is told", WAIT, || async {
        fake.comments_on(gate.number)
            .iter()
            .any(|(_, _, b)| b.starts_with("@mallory"))
            .then_some(())
    })
    .await;
    reviews_read(&fake, gate.number, 2).await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    assert_eq!(current_step(&scenario).await, 1);
    assert!(fake.pulls().iter().all(|p| p.open), "nothing merged yet");

    // A writer's approval passes the gate: the agent merges it into Git.
    fake.review(gate.number, "alice", "APPROVED");
    eventually("step 2", WAIT, || async {
        (current_step(&scenario).await == 2).then_some(())
    })
    .await;
    let merged = fake
        .pulls()
        .into_iter()
        .find(|p| p.number == gate.number)
        .expect("gate 1");
    assert_eq!(merged.merged_by.as_deref(), Some("gitcanary[bot]"));
    let merge_commit = merged.merge_commit.expect("a merge commit");
    assert!(
        scenario.history().iter().any(|(sha, _)| *sha == merge_commit),
        "the gate decision is a commit on main"
    );
    assert!(
        scenario
            .git(&["show", &format!("main:{gate_file}")])
            .contains("step: 1")
    );

    // The second gate is passed by a human merge.
    wait_for_phase(&scenario, Phase::Paused).await;
    let second = promotion_pull(&fake, 2).await;
    fake.merge_as(second.number, "alice");
    wait_for_phase(&scenario, Phase::Healthy).await;
    let status_file = format!("main:.gitcanary/status/{namespace}/echo.yaml");
    let promoted = eventually("the promote commit", WAIT, || async {
        let status = scenario.try_git(&["show", &status_file])?;
        status.contains(&commit).then_some(status)
    })
    .await;
    assert!(promoted.contains("promoted"), "{promoted}");
    assert!(
        promoted.contains(&format!("promoted by promotion pull request #{}", gate.number)),
        "what passed each gate is recorded: {promoted}"
    );
    eventually("success status", WAIT, || async {
        fake.statuses_for(&commit)
            .iter()
            .any(|(state, _, _)| state == "success")
            .then_some(())
    })
    .await;
    let gates: Vec<FakePull> = fake
        .pulls()
        .into_iter()
        .filter(|p| p.head.starts_with("gitcanary/promote/"))
        .collect();
    assert_eq!(gates.len(), 2, "one promotion pull request per gate: {gates:?}");
    assert!(gates.iter().all(|p| p.merged_by.is_some()));
    // The gate commits started no release.
    agent.resyncs(2).await;
    assert_eq!(phase(&scenario).await, Some(Phase::Healthy));
}

/// Waits until the agent has read the comments of pull request `pull` `times` more times.
async fn comments_read(fake: &GitHubFake, pull: u64, times: usize) {
    let path = format!("/issues/{pull}/comments");
    let before = fake.count("GET", &path);
    eventually("the agent reads the comments again", WAIT, || async {
        (fake.count("GET", &path) >= before + times).then_some(())
    })
    .await;
}

/// Waits until the agent has read the gate's reviews `times` more times.
async fn reviews_read(fake: &GitHubFake, gate: u64, times: usize) {
    let path = format!("/pulls/{gate}/reviews");
    let before = fake.count("GET", &path);
    eventually("the agent reads the gate's reviews again", WAIT, || async {
        (fake.count("GET", &path) >= before + times).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_gate_merges_only_the_commit_gitcanary_pushed_approved_by_someone_who_may() {
    let scenario = Scenario::new("gh-gate-rules").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    for writer in ["alice", "carol", "release-bot[bot]"] {
        fake.grant(writer, "write");
    }
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry_by(&commit, 7, "carol");
    wait_for_phase(&scenario, Phase::Paused).await;
    let gate = promotion_pull(&fake, 1).await;

    // The change's own author, and a bot nobody listed, cannot pass the gate.
    fake.review(gate.number, "carol", "APPROVED");
    fake.review(gate.number, "release-bot[bot]", "APPROVED");
    reviews_read(&fake, gate.number, 2).await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    assert!(
        fake.pulls().iter().any(|p| p.number == gate.number && p.open),
        "not merged"
    );

    // A fork's pull request from a branch of the same name is not the gate,
    // even when a writer closes it.
    let fork = fake.open_pull_as("mallory", "mallory", &gate.head, "main", "Promote, from a fork");
    fake.close_as(fork, "alice");
    reviews_read(&fake, gate.number, 2).await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    // Nor is one from a fork in the same organization, which GitHub's
    // `head=acme:branch` lists beside the gate: it neither decides nor
    // hides the gate (no second promotion pull request is opened).
    let sibling = fake.open_pull_from_fork("alice", "acme", "apps-fork", &gate.head, "main");
    fake.close_as(sibling, "alice");
    reviews_read(&fake, gate.number, 2).await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    let gates: Vec<u64> = fake
        .pulls()
        .iter()
        .filter(|p| p.head.starts_with("gitcanary/promote/") && p.head_repo.is_empty() && p.head_owner == "acme")
        .map(|p| p.number)
        .collect();
    assert_eq!(gates, vec![gate.number], "the gate is still #{}", gate.number);

    // Someone pushes to the gate branch; a writer's approval of that head
    // merges nothing, and gitcanary says why.
    let repo = scenario.repo.path();
    support::run(repo, "git", &["fetch", "-q", "origin", &gate.head]);
    support::run(repo, "git", &["checkout", "-q", "-B", "sneak", "FETCH_HEAD"]);
    std::fs::write(
        repo.join("echo/extra.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: extra}\n",
    )
    .expect("write");
    support::run(repo, "git", &["add", "-A"]);
    support::run(repo, "git", &["commit", "-q", "-m", "ride along"]);
    support::run(repo, "git", &["push", "-q", "origin", &format!("HEAD:{}", gate.head)]);
    support::run(repo, "git", &["checkout", "-q", "main"]);
    fake.review(gate.number, "alice", "APPROVED");
    eventually("the gate says why it stays closed", WAIT, || async {
        fake.comments_on(gate.number)
            .iter()
            .any(|(_, _, b)| b.contains("not the commit gitcanary pushed"))
            .then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    assert!(
        fake.pulls().iter().any(|p| p.number == gate.number && p.open),
        "not merged"
    );
    let main = scenario.git(&["ls-tree", "-r", "--name-only", "main"]);
    assert!(!main.contains("echo/extra.yaml"), "nothing rode along: {main}");
}

#[tokio::test]
async fn commands_are_found_however_far_down_and_neither_gitcanarys_own_nor_earlier_ones_count() {
    let scenario = Scenario::new("gh-paged").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    // Even with write access, gitcanary's own account gives no commands.
    fake.grant("gitcanary[bot]", "write");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;
    // A writer's command written before the release began (a minute ago) is not for it.
    let a_minute_ago = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
    let a_minute_ago = jiff::Timestamp::from_second(a_minute_ago.as_second()).expect("a time");
    fake.comment_at(7, "alice", "/gitcanary promote", &a_minute_ago.to_string());
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;
    for i in 0..119 {
        fake.comment(7, "bob", &format!("looks fine ({i})"));
    }
    // gitcanary's own account quoting a command is not a command.
    fake.comment(7, "gitcanary[bot]", "/gitcanary promote");
    let listed = fake.count("GET", "/issues/7/comments");
    eventually("the agent reads the comments again", WAIT, || async {
        (fake.count("GET", "/issues/7/comments") >= listed + 4).then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));

    // A writer's command as the 122nd comment, on the second page.
    fake.comment(7, "alice", "/gitcanary promote");
    eventually("the promote is seen", WAIT, || async {
        (phase(&scenario).await != Some(Phase::Paused)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn closing_the_promotion_pull_request_aborts_and_a_restart_opens_no_second_one() {
    let scenario = Scenario::new("gh-gate-close").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let mut agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;

    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 8);
    let gate = promotion_pull(&fake, 1).await;
    agent.kill();
    let reviews = format!("/pulls/{}/reviews", gate.number);
    let looked = fake.count("GET", &reviews);
    let _agent = github_agent(&scenario, &fake.url);
    eventually("the restarted agent looks at its gate", WAIT, || async {
        (fake.count("GET", &reviews) > looked).then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    assert_eq!(
        fake.pulls().len(),
        1,
        "a restarted agent finds its promotion pull request"
    );

    // A triager may close pull requests, but not abort a release.
    fake.grant("trent", "triage");
    fake.close_as(gate.number, "trent");
    eventually("trent is told and the gate is open again", WAIT, || async {
        let told = fake.comments_on(gate.number).iter().any(|(_, _, b)| {
            b.starts_with("@trent closed this promotion pull request, but only a writer's close aborts")
        });
        let open = fake.pulls().iter().any(|p| p.number == gate.number && p.open);
        (told && open).then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));

    fake.close_as(gate.number, "alice");
    wait_for_failure(&scenario).await;
    let revert = scenario
        .wait_for_commit("the revert commit", |m| {
            m.contains(&format!("Gitcanary-Reverts: {commit}"))
        })
        .await;
    assert!(revert.1.starts_with("revert("), "{}", revert.1);
    let deployment = scenario.git(&["show", "main:echo/deployment.yaml"]);
    assert!(
        deployment.contains("echo:1.0"),
        "Git asks for stable again: {deployment}"
    );
    eventually("failure status", WAIT, || async {
        fake.statuses_for(&commit)
            .iter()
            .any(|(state, _, _)| state == "failure")
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_superseded_release_closes_its_promotion_pull_request() {
    let scenario = Scenario::new("gh-gate-super").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    scenario.repo.commit_and_push("echo 2.0");
    let first = promotion_pull(&fake, 1).await;
    write_app(&scenario, "3.0");
    scenario.repo.commit_and_push("echo 3.0");
    let closed = eventually("the first gate closed", WAIT, || async {
        fake.pulls().into_iter().find(|p| p.number == first.number && !p.open)
    })
    .await;
    assert!(closed.merged_by.is_none());
    assert!(
        fake.comments_on(first.number)
            .iter()
            .any(|(_, _, b)| b.contains("gitcanary closes this promotion pull request")),
        "it says why"
    );
    // The new release has its own gate, and the closed one aborted nothing.
    let second = eventually("the new gate", WAIT, || async {
        fake.pulls().into_iter().find(|p| p.open && p.number != first.number)
    })
    .await;
    assert!(second.head.ends_with("-1"));
    reviews_read(&fake, second.number, 2).await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
}

#[tokio::test]
async fn a_github_that_never_answers_delays_the_comment_never_the_release() {
    let scenario = Scenario::new("gh-hang").await;
    let hole = support::BlackHole::start();
    let url = format!("http://{}", hole.addr);
    write_app_with_steps(&scenario, "1.0", "      - {replicas: 1, pause: {duration: 1}}\n");
    scenario.repo.commit_and_push("echo 1.0");
    let agent = github_agent(&scenario, &url);
    wait_for_phase(&scenario, Phase::Healthy).await;

    // A timed pause runs out and the release promotes while GitHub hangs.
    write_app_with_steps(&scenario, "2.0", "      - {replicas: 1, pause: {duration: 1}}\n");
    let released = scenario.repo.commit_and_push("echo 2.0");
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    eventually("2.0 promoted while GitHub hangs", WAIT, || async {
        let status = rollouts.get_opt("echo").await.ok().flatten()?.status?;
        (status.phase == Phase::Healthy && status.stable_commit == released).then_some(())
    })
    .await;

    // An indefinite pause, and the CLI aborts it.
    write_app(&scenario, "3.0");
    scenario.repo.commit_and_push("echo 3.0");
    wait_for_phase(&scenario, Phase::Paused).await;
    let (code, _, stderr) = scenario.run_cli(&["abort", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    wait_for_failure(&scenario).await;

    // Canary pods that never become ready: the deadline fires all the same.
    // (First the abort's revert commit lands; the next change builds on it.)
    wait_for_phase(&scenario, Phase::Healthy).await;
    support::run(
        scenario.repo.path(),
        "git",
        &["pull", "-q", "--rebase", "origin", "main"],
    );
    write_app_with_steps(
        &scenario,
        "4.0-broken",
        "      - {replicas: 1, pause: {}}\n      progressDeadline: 3s\n      onFailure: hold\n",
    );
    let deployment = scenario.repo.path().join("echo/deployment.yaml");
    let text = std::fs::read_to_string(&deployment).expect("readable").replace(
        "    metadata:\n      labels: {app: echo}",
        "    metadata:\n      labels: {app: echo, gitcanary.test/never-ready: \"true\"}",
    );
    assert!(text.contains("never-ready"), "{text}");
    std::fs::write(&deployment, text).expect("written");
    scenario.repo.commit_and_push("echo 4.0, never ready");
    eventually("the deadline fires while GitHub hangs", WAIT, || async {
        let status = rollouts.get_opt("echo").await.ok().flatten()?.status?;
        let message = status.canary_status?.message;
        (status.phase == Phase::Failed && message.contains("not ready within 3s")).then_some(())
    })
    .await;
    // And each GitHub call gives up in time, so later reports are not stuck behind it.
    eventually("a GitHub call times out", WAIT, || async {
        agent.log_text().contains("no answer within 20 s").then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_rate_limited_github_is_left_alone_until_its_reset() {
    let fake = GitHubFake::start().await;
    fake.carry("abc123", 5);
    let metrics = std::sync::Arc::new(gitcanary::telemetry::Metrics::default());
    let github = gitcanary::github::GitHub::new(
        &fake.url,
        gitcanary::github::Credentials::Token("ghp_test_token".into()),
        "acme/apps",
        metrics.clone(),
    )
    .expect("client");
    fake.rate_limit_next(1);
    let refused = github.carried_by("abc123").await.expect_err("rate limited");
    assert!(refused.to_string().contains("rate limit"), "{refused}");
    assert!(github.backing_off().is_some());
    let sent = fake.count("GET", "/commits/abc123/pulls");
    // Within the window no request reaches GitHub.
    assert!(github.carried_by("abc123").await.is_err());
    assert_eq!(fake.count("GET", "/commits/abc123/pulls"), sent);
    // After the reset (the fake says 3 s), calls go through again.
    let pulls = eventually("the limit resets", Duration::from_secs(10), || async {
        github.carried_by("abc123").await.ok()
    })
    .await;
    assert_eq!(pulls, vec![(5, "carol".to_string())]);
    let text = metrics.render();
    assert!(text.contains("gitcanary_github_rate_limited_total 1"), "{text}");
    assert!(text.contains("gitcanary_github_errors_total 1"), "{text}");
}

#[tokio::test]
async fn the_client_leaves_the_tokens_reserve_to_its_other_users_until_the_reset() {
    let fake = GitHubFake::start().await;
    for (i, sha) in ["a1", "a2", "a3"].into_iter().enumerate() {
        fake.carry(sha, 5 + i as u64);
    }
    fake.set_quota(5000, 12);
    let metrics = std::sync::Arc::new(gitcanary::telemetry::Metrics::default());
    let mut github = gitcanary::github::GitHub::new(
        &fake.url,
        gitcanary::github::Credentials::Token("ghp_test_token".into()),
        "acme/apps",
        metrics.clone(),
    )
    .expect("client");
    github.reserve = 10;
    github.carried_by("a1").await.expect("11 left after this one");
    // A conditional request answered 304 spends nothing, and is not stopped.
    github.carried_by("a1").await.expect("free");
    assert_eq!(fake.quota().unwrap().remaining, 11);
    github
        .carried_by("a2")
        .await
        .expect("10 left after this one: the reserve");
    let sent = fake.counted();
    let refused = github.carried_by("a3").await.expect_err("the reserve is not spent");
    assert!(
        refused
            .to_string()
            .contains("10 GitHub requests left, 10 of them kept for the token's other users"),
        "{refused}"
    );
    assert_eq!(fake.counted(), sent, "no request reached GitHub");
    assert_eq!(fake.quota().unwrap().remaining, 10);
    let reset_in = github
        .backing_off()
        .expect("quiet")
        .saturating_duration_since(std::time::Instant::now());
    assert!(
        reset_in > Duration::from_secs(3500),
        "quiet until GitHub's reset, in an hour: {reset_in:?}"
    );
    let text = metrics.render();
    assert!(text.contains("gitcanary_github_rate_limit_remaining 10"), "{text}");
    let endpoint = "gitcanary_github_requests_total{endpoint=\"GET /repos/{owner}/{repo}/commits/{sha}/pulls\"";
    for (status, count) in [("200", 2), ("304", 1), ("refused", 1)] {
        let line = format!("{endpoint},status=\"{status}\"}} {count}");
        assert!(text.contains(&line), "{line} in {text}");
    }
}

/// The reserve stops GitHub calls, never the release: a release with a
/// timed pause runs to its promote while the agent, down to its reserve,
/// asks GitHub nothing more.
#[tokio::test]
async fn a_release_goes_on_while_the_github_budget_is_down_to_its_reserve() {
    let scenario = Scenario::new("gh-reserve").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    write_app_with_steps(&scenario, "1.0", "      - {replicas: 1, pause: {duration: 1}}\n");
    scenario.repo.commit_and_push("echo 1.0");
    fake.set_quota(5000, 8);
    let _agent = github_agent_with(
        &scenario,
        &fake.url,
        &["--github-poll", "1", "--github-poll-max", "3", "--github-reserve", "5"],
    );
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app_with_steps(&scenario, "2.0", "      - {replicas: 1, pause: {duration: 1}}\n");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 9);
    eventually("2.0 promoted", WAIT, || async {
        let status = Api::<Rollout>::namespaced(scenario.client.clone(), &scenario.ns)
            .get_opt("echo")
            .await
            .ok()??
            .status?;
        (status.phase == Phase::Healthy && status.stable_commit == commit).then_some(())
    })
    .await;
    let quota = fake.quota().unwrap();
    // Requests already in flight when the reserve was reached may land.
    assert!(
        quota.remaining >= 3,
        "the reserve, less what was in flight, is left: {quota:?}"
    );
    assert!(quota.remaining <= 5, "the agent spent down to its reserve: {quota:?}");
}

#[tokio::test]
async fn a_failed_release_is_reported_with_its_revert_and_the_later_commits_it_reset() {
    let scenario = Scenario::new("gh-revert").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    let steps = "      - {replicas: 1, pause: {duration: 1}}\n      progressDeadline: 10s\n";
    // A Secret of the app changes with the release: no value of it may show
    // in a log line, an Event, a comment, a status or a commit message.
    let secret = |value: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: echo-creds\n  namespace: {}\nstringData:\n  password: {value}\n",
            scenario.ns
        )
    };
    write_app_with_steps(&scenario, "1.0", steps);
    scenario.repo.write("echo/secret.yaml", &secret("first-hush-4711"));
    scenario.repo.commit_and_push("echo 1.0");
    let agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;

    write_app_with_steps(&scenario, "2.0", steps);
    scenario.repo.write("echo/secret.yaml", &secret("second-hush-4711"));
    let deployment = scenario.repo.path().join("echo/deployment.yaml");
    let never_ready = std::fs::read_to_string(&deployment).expect("deployment").replace(
        "labels: {app: echo}\n    spec",
        "labels: {app: echo, gitcanary.test/never-ready: \"true\"}\n    spec",
    );
    assert!(never_ready.contains("never-ready"));
    scenario.repo.write("echo/deployment.yaml", &never_ready);
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 9);
    wait_for_phase(&scenario, Phase::Progressing).await;
    // A later commit touches the same file without changing the release.
    scenario.repo.write(
        "echo/deployment.yaml",
        &format!("# owned by the echo team\n{never_ready}"),
    );
    scenario.repo.commit_and_push("a comment in the deployment");
    wait_for_failure(&scenario).await;

    let comment = eventually("the release comment tells of the revert", WAIT, || async {
        fake.comments_on(9)
            .into_iter()
            .map(|(_, _, body)| body)
            .find(|b| b.contains("Reverted in Git by commit"))
    })
    .await;
    assert!(comment.contains("**Failed**"), "{comment}");
    assert!(
        comment.contains("Later commits changed echo/deployment.yaml too"),
        "{comment}"
    );
    let revert = scenario
        .history()
        .into_iter()
        .find(|(_, m)| m.contains(&format!("Gitcanary-Reverts: {commit}")))
        .expect("the revert commit");
    assert!(
        comment.contains(&revert.0),
        "the comment names the revert commit: {comment}"
    );
    assert!(
        scenario
            .git(&["show", "main:echo/deployment.yaml"])
            .contains("echo:1.0")
    );
    assert!(
        fake.statuses_for(&commit)
            .iter()
            .any(|(state, _, description)| state == "failure" && description.contains("not ready")),
        "{:?}",
        fake.statuses_for(&commit)
    );
    assert_eq!(
        fake.comments_on(9)
            .iter()
            .filter(|(_, _, b)| b.contains("<!-- gitcanary:release"))
            .count(),
        1
    );
    // Back on stable is no news for the failed release: its comment and status keep the failure.
    agent.resyncs(2).await;
    let last_status = fake.statuses_for(&commit).last().cloned().expect("a status");
    assert_eq!(last_status.0, "failure", "{last_status:?}");
    assert!(
        fake.comments_on(9)
            .iter()
            .any(|(_, _, b)| b.contains("<!-- gitcanary:release") && b.contains("**Failed**")),
        "{:?}",
        fake.comments_on(9)
    );
    // Git now asks for what runs: nothing to change.
    let (code, out, err) = scenario.diff();
    assert_eq!(code, 0, "{out}{err}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let events = events.list(&Default::default()).await.expect("events");
    let mut said: Vec<String> = events
        .items
        .iter()
        .map(|e| format!("{:?} {:?}", e.note, e.reason))
        .collect();
    said.push(agent.log_text());
    said.extend(fake.comments_on(9).into_iter().map(|(_, _, body)| body));
    said.extend(fake.statuses_for(&commit).into_iter().map(|(_, _, d)| d));
    said.extend(scenario.history().into_iter().map(|(_, message)| message));
    for text in &said {
        assert!(!text.contains("hush-4711"), "a Secret's value was shown: {text}");
    }
    assert!(
        said.iter().any(|t| t.contains("echo/secret.yaml")),
        "the revert named the Secret's file"
    );
}

/// The app with a fixed `rolloutID`, so every release has the same gate branch name.
fn write_app_with_id(scenario: &Scenario, image: &str, rollout_id: &str) {
    let spec = format!(
        "  rolloutID: {rollout_id}\n  strategy:\n    canary:\n      steps:\n      - {{replicas: 1, pause: {{}}}}\n"
    );
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, &spec);
}

#[tokio::test]
async fn the_releases_own_author_cannot_promote_it_by_command_nor_can_an_unlisted_bot() {
    let scenario = Scenario::new("gh-self-promote").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    for writer in ["alice", "carol", "ci[bot]"] {
        fake.grant(writer, "write");
    }
    // Git's commits are carol's; the pull request that carried them is dave's.
    fake.link_email("author@example.test", "carol");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry_by(&commit, 7, "dave");
    wait_for_phase(&scenario, Phase::Paused).await;

    fake.comment(7, "carol", "/gitcanary promote");
    fake.comment(7, "ci[bot]", "/gitcanary promote");
    eventually("both are told no", WAIT, || async {
        let replies = fake.comments_on(7);
        let told = |who: &str| {
            replies.iter().any(|(_, _, b)| {
                b.starts_with(&format!(
                    "@{who} `/gitcanary promote` must come from a writer who wrote"
                ))
            })
        };
        (told("carol") && told("ci[bot]")).then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));

    fake.comment(7, "alice", "/gitcanary promote");
    eventually("a writer who wrote none of it promotes", WAIT, || async {
        (phase(&scenario).await != Some(Phase::Paused)).then_some(())
    })
    .await;
}

/// Release 2 of a fixed rolloutID ends at its gate (merged, or closed
/// unmerged: an abort); release 3, with the same gate branch name, must get
/// a gate of its own and wait at it.
async fn an_earlier_gate_of_the_same_name_decides_nothing(name: &str, merge: bool) {
    let scenario = Scenario::new(name).await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    write_app_with_id(&scenario, "1.0", "steady");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;

    write_app_with_id(&scenario, "2.0", "steady");
    let second = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&second, 7);
    let old = promotion_pull(&fake, 1).await;
    if merge {
        fake.merge_as(old.number, "alice");
        wait_for_phase(&scenario, Phase::Healthy).await;
    } else {
        fake.close_as(old.number, "alice");
        wait_for_failure(&scenario).await;
        scenario
            .wait_for_commit("the revert is in Git", |m| {
                m.contains(&format!("Gitcanary-Reverts: {second}"))
            })
            .await;
    }

    let repo = scenario.repo.path();
    support::run(repo, "git", &["pull", "-q", "--rebase", "origin", "main"]);
    write_app_with_id(&scenario, "3.0", "steady");
    let third = scenario.repo.commit_and_push("echo 3.0");
    fake.carry(&third, 8);
    let new = eventually("release 3's own gate", WAIT, || async {
        fake.pulls()
            .into_iter()
            .find(|p| p.number != old.number && p.head.starts_with("gitcanary/promote/") && p.open)
    })
    .await;
    assert_ne!(new.head, old.head, "a new branch name");
    assert!(new.body.contains(&third), "the gate names its release: {}", new.body);
    reviews_read(&fake, new.number, 2).await;
    assert_eq!(
        phase(&scenario).await,
        Some(Phase::Paused),
        "the earlier release's gate decided nothing for this one"
    );
}

#[tokio::test]
async fn an_earlier_releases_merged_gate_of_the_same_name_does_not_pass_the_next() {
    an_earlier_gate_of_the_same_name_decides_nothing("gh-old-gate-merged", true).await;
}

#[tokio::test]
async fn an_earlier_releases_closed_gate_of_the_same_name_does_not_abort_the_next() {
    an_earlier_gate_of_the_same_name_decides_nothing("gh-old-gate-closed", false).await;
}

#[tokio::test]
async fn a_gate_branch_someone_else_pushed_first_is_not_reused() {
    let scenario = Scenario::new("gh-taken-branch").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    write_app_with_id(&scenario, "1.0", "known");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;

    // Mallory predicts the gate branch and pushes a commit carrying
    // gitcanary's trailers before the release waits at its gate.
    let branch = format!("gitcanary/promote/{}/echo/known-1", scenario.ns);
    let repo = scenario.repo.path();
    support::run(repo, "git", &["checkout", "-q", "-B", "trap"]);
    std::fs::create_dir_all(repo.join(format!(".gitcanary/gates/{}", scenario.ns))).expect("dir");
    std::fs::write(
        repo.join(format!(".gitcanary/gates/{}/echo.yaml", scenario.ns)),
        "step: 1\n",
    )
    .expect("write");
    support::run(repo, "git", &["add", "-A"]);
    let message = format!(
        "gate\n\nGitcanary-Rollout: {}/echo\nGitcanary-Gate: known-1\n",
        scenario.ns
    );
    support::run(repo, "git", &["commit", "-q", "-m", &message]);
    let trap = support::run(repo, "git", &["rev-parse", "HEAD"]);
    support::run(repo, "git", &["push", "-q", "origin", &format!("HEAD:{branch}")]);
    support::run(repo, "git", &["checkout", "-q", "main"]);

    write_app_with_id(&scenario, "2.0", "known");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;
    let gate = eventually("the gate", WAIT, || async {
        fake.pulls()
            .into_iter()
            .find(|p| p.head.starts_with("gitcanary/promote/"))
    })
    .await;
    assert_ne!(gate.head, branch, "the taken branch is not the gate");
    assert_ne!(
        scenario.git(&["rev-parse", &gate.head]),
        trap.trim(),
        "nor is mallory's commit"
    );
    eventually("the change's pull request is warned", WAIT, || async {
        fake.comments_on(7)
            .iter()
            .any(|(_, _, b)| b.contains(&format!("The gate branch `{branch}` already existed")))
            .then_some(())
    })
    .await;
}

/// A gate left open, no webhook delivered: the agent looks at it 15 s after
/// the release paused, then 30 s later, and so on up to every 2 minutes
/// (agent defaults), where it looked every 3 s before (about 16 looks and
/// 470 requests in a window like this one).
#[tokio::test]
async fn a_gate_left_open_is_looked_at_less_and_less_often() {
    let scenario = Scenario::new("gh-budget").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent_with(&scenario, &fake.url, &[]);
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;
    let gate = promotion_pull(&fake, 1).await;
    // The window starts once the report that opened the gate is over: it
    // names the gate on the change and sets the status again.
    eventually("the report that opened the gate ends", WAIT, || async {
        let named = fake
            .comments_on(7)
            .iter()
            .any(|(_, _, b)| b.contains(&format!("promotion pull request #{}", gate.number)));
        (named && fake.count("POST", &format!("/statuses/{commit}")) >= 2).then_some(())
    })
    .await;
    // Each look reads the gate's reviews once.
    let reviews = format!("/pulls/{}/reviews", gate.number);
    let looks_before = fake.count("GET", &reviews);
    let (counted_before, free_before) = (fake.counted(), fake.not_modified());
    // A fixed window, read as a metric: the looks of its first 50 s after
    // the pause (at about 15 s and 45 s).
    tokio::time::sleep(Duration::from_secs(50)).await;
    let looks = fake.count("GET", &reviews) - looks_before;
    let (counted, free) = (fake.counted() - counted_before, fake.not_modified() - free_before);
    let seen = format!("{looks} looks, {counted} counted requests, {free} answered 304");
    assert!((1..=3).contains(&looks), "in 50 s: {seen}");
    // Nothing changed since the pause: each look asks conditionally and is
    // answered 304, which GitHub does not count.
    assert!(counted <= 3, "in 50 s: {seen}");
    assert!(free >= looks * 6, "in 50 s: {seen}");
}

/// Signed in as a GitHub App: the agent finds its installation, mints
/// tokens from the App's key and mints a new one before each expires (no
/// request is refused for an expired one), reports as the App's bot, and
/// never obeys a command the bot itself wrote.
#[tokio::test]
async fn a_github_app_signs_in_with_installation_tokens_renewed_before_they_expire() {
    let scenario = Scenario::new("gh-app").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.install_app(support::github::FakeApp {
        id: 4242,
        slug: "gitcanary-test".into(),
        public_pem: include_bytes!("support/github-app.test-key.pub.pem").to_vec(),
        installation: 77,
        // octocrab renews 30 s before expiry: a token lasts 10 s here.
        token_lifetime: 40,
    });
    fake.grant("alice", "write");
    fake.grant("mallory", "read");
    fake.grant("gitcanary-test[bot]", "write");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let key = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/github-app.test-key.pem");
    let args = [
        "--github-url",
        fake.url.as_str(),
        "--github-repo",
        "acme/apps",
        "--github-app-id",
        "4242",
        "--github-app-key-file",
        key,
        "--github-poll",
        "1",
        "--github-poll-max",
        "3",
    ];
    let _agent =
        support::agent::AgentProcess::start_with(&scenario.repo, &scenario.ns, scenario.cache.path(), &args, &[]);
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;
    let comment = eventually("the release comment, by the App's bot", WAIT, || async {
        fake.comments_on(7)
            .into_iter()
            .find(|(_, _, body)| body.contains("Waiting for promote"))
    })
    .await;
    assert_eq!(comment.1, "gitcanary-test[bot]", "{comment:?}");
    assert!(
        fake.count("GET", "/repos/acme/apps/installation") >= 1,
        "the installation was found"
    );

    assert!(fake.count("GET", "/app") >= 1, "the App's own account was asked");
    // Past a first page of comments (pages after the first are signed too),
    // the bot's own words are never a command, though the bot may write,
    // while a reader's are read and answered.
    for i in 0..110 {
        fake.comment(7, "dave", &format!("chatter {i}"));
    }
    fake.comment(7, "gitcanary-test[bot]", "/gitcanary promote");
    fake.comment(7, "mallory", "/gitcanary promote");
    eventually("mallory is answered, from the second page", WAIT, || async {
        fake.comments_on(7)
            .iter()
            .any(|(_, _, b)| b.starts_with("@mallory"))
            .then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    assert!(
        !fake
            .comments_on(7)
            .iter()
            .any(|(_, _, b)| b.starts_with("@gitcanary-test[bot]")),
        "the bot is not even answered"
    );

    // Looking at the gate every 1 to 3 s outlives several tokens.
    eventually("a third installation token", WAIT, || async {
        (fake.installation_tokens() >= 3).then_some(())
    })
    .await;
    fake.comment(7, "alice", "/gitcanary promote");
    wait_for_phase(&scenario, Phase::Healthy).await;
    eventually("the success status, set by the App", WAIT, || async {
        fake.statuses_for(&commit)
            .iter()
            .any(|(state, _, _)| state == "success")
            .then_some(())
    })
    .await;
    assert_eq!(fake.bad_credentials(), 0, "no request went out with an expired token");
    assert_eq!(fake.count("GET", "/user"), 0, "an installation is not a user");
}

/// Branch protection decides the gate's merge, as on GitHub: a writer's
/// approval is not enough while CODEOWNERS names another owner of the
/// gate file, nor the owner's while a required check is missing; the gate
/// stays closed and says why, and merges once GitHub's rules are met.
#[tokio::test]
async fn branch_protection_holds_the_gate_until_a_code_owner_approves_and_its_checks_pass() {
    let scenario = Scenario::new("gh-protect").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    fake.grant("olivia", "write");
    fake.protect(support::github::Protection {
        required_approvals: 1,
        dismiss_stale_reviews: true,
        require_code_owner_reviews: true,
        required_checks: vec!["ci/gate".into()],
        enforce_admins: true,
    });
    scenario
        .repo
        .write(".github/CODEOWNERS", "* @alice\n/.gitcanary/ @olivia\n");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;
    let gate = promotion_pull(&fake, 1).await;
    let said = |needle: &'static str| {
        let fake = fake.clone();
        async move {
            eventually(&format!("the gate says {needle:?}"), WAIT, || async {
                fake.comments_on(gate.number)
                    .iter()
                    .any(|(_, _, b)| b.contains("GitHub refused the merge") && b.contains(needle))
                    .then_some(())
            })
            .await
        }
    };

    fake.review(gate.number, "alice", "APPROVED");
    said("Waiting on code owner review from olivia").await;
    fake.review(gate.number, "olivia", "APPROVED");
    said("Required status check").await;
    reviews_read(&fake, gate.number, 1).await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    assert!(
        !fake
            .pulls()
            .iter()
            .any(|p| p.number == gate.number && p.merged_by.is_some())
    );

    let head = scenario.git(&["rev-parse", &gate.head]);
    fake.post_status(head.trim(), "ci/gate", "success");
    wait_for_phase(&scenario, Phase::Healthy).await;
    let merged = fake
        .pulls()
        .into_iter()
        .find(|p| p.number == gate.number)
        .expect("the gate");
    assert_eq!(merged.merged_by.as_deref(), Some("gitcanary[bot]"));
}

fn pull_with_reviews(reviews: &[(&str, &str, &str)]) -> FakePull {
    let mut pull = GitHubFake::blank_pull(9, "gitcanary/promote/x", "main");
    pull.reviews = reviews
        .iter()
        .enumerate()
        .map(|(i, (user, state, commit))| (i as u64, user.to_string(), state.to_string(), commit.to_string()))
        .collect();
    pull
}

/// The fake's merge rule is GitHub's; each case fails when its rule goes.
#[test]
fn the_fakes_branch_protection_is_githubs() {
    use support::github::{Data, Protection, merge_refusal};
    let mut data = Data::default();
    for (user, permission) in [
        ("alice", "write"),
        ("bob", "write"),
        ("olivia", "write"),
        ("root", "admin"),
    ] {
        data.permissions.insert(user.into(), permission.into());
    }
    data.permissions.insert("reader".into(), "read".into());
    data.protection = Protection {
        required_approvals: 2,
        dismiss_stale_reviews: true,
        ..Protection::default()
    };
    let refused = |data: &Data, reviews: &[(&str, &str, &str)], merger: &str| {
        merge_refusal(
            data,
            &pull_with_reviews(reviews),
            merger,
            "head",
            &["app/a.yaml".to_string()],
            &[],
        )
    };
    // Two writers on the head commit pass; a reader's approval never counts.
    assert_eq!(
        refused(
            &data,
            &[("alice", "APPROVED", "head"), ("bob", "APPROVED", "head")],
            "alice"
        ),
        None
    );
    assert!(
        refused(
            &data,
            &[("alice", "APPROVED", "head"), ("reader", "APPROVED", "head")],
            "alice"
        )
        .is_some()
    );
    // One person's two approvals are one: the latest review of each counts.
    assert!(
        refused(
            &data,
            &[("alice", "APPROVED", "head"), ("alice", "APPROVED", "head")],
            "alice"
        )
        .is_some()
    );
    // A later "changes requested" undoes an approval; a later comment does not.
    let undone = [
        ("alice", "APPROVED", "head"),
        ("bob", "APPROVED", "head"),
        ("bob", "CHANGES_REQUESTED", "head"),
    ];
    assert!(refused(&data, &undone, "alice").is_some());
    // Where no review is required, an objection does not hold a merge.
    data.protection.required_approvals = 0;
    assert_eq!(refused(&data, &undone, "alice"), None);
    data.protection.required_approvals = 2;
    let commented = [
        ("alice", "APPROVED", "head"),
        ("bob", "APPROVED", "head"),
        ("bob", "COMMENTED", "head"),
    ];
    assert_eq!(refused(&data, &commented, "alice"), None);
    // An approval of an earlier head is dismissed, unless the branch keeps them.
    let stale = [("alice", "APPROVED", "old"), ("bob", "APPROVED", "head")];
    assert!(refused(&data, &stale, "alice").is_some());
    data.protection.dismiss_stale_reviews = false;
    assert_eq!(refused(&data, &stale, "alice"), None);
    // An admin bypasses the rules unless they are enforced on admins.
    assert_eq!(refused(&data, &[], "root"), None);
    data.protection.enforce_admins = true;
    assert!(refused(&data, &[], "root").is_some());

    // Code owners: the last matching line owns a path.
    data.protection = Protection {
        required_approvals: 1,
        require_code_owner_reviews: true,
        ..Protection::default()
    };
    let owners = vec![
        ("*".to_string(), vec!["alice".to_string()]),
        ("/.gitcanary/".to_string(), vec!["olivia".to_string()]),
    ];
    let gate_file = [".gitcanary/gates/ns/echo.yaml".to_string()];
    let by = |reviewer: &str| {
        merge_refusal(
            &data,
            &pull_with_reviews(&[(reviewer, "APPROVED", "head")]),
            "bob",
            "head",
            &gate_file,
            &owners,
        )
    };
    assert_eq!(
        by("alice").as_deref(),
        Some("Waiting on code owner review from olivia.")
    );
    assert_eq!(by("olivia"), None);

    // Required checks: the latest status of each context on the head.
    data.protection = Protection {
        required_checks: vec!["ci".into()],
        ..Protection::default()
    };
    let merge = |data: &Data| merge_refusal(data, &pull_with_reviews(&[]), "bob", "head", &[], &[]);
    assert!(merge(&data).is_some());
    data.statuses
        .push(("head".into(), "success".into(), "ci".into(), String::new()));
    assert_eq!(merge(&data), None);
    data.statuses
        .push(("head".into(), "failure".into(), "ci".into(), String::new()));
    assert!(merge(&data).is_some());
    data.statuses
        .push(("old".into(), "success".into(), "ci".into(), String::new()));
    assert!(merge(&data).is_some(), "a check of another commit is not this one's");
}

#[test]
fn codeowners_patterns_match_as_gitignore_does() {
    use support::github::codeowners_match as owns;
    assert!(owns("*", "a/b/c.yaml"));
    assert!(owns("*.yaml", "a/b/c.yaml"));
    assert!(!owns("*.yaml", "a/b/c.json"));
    assert!(owns("/.gitcanary/", ".gitcanary/gates/x.yaml"));
    assert!(!owns("/.gitcanary/", "apps/.gitcanary/x.yaml"), "anchored at the root");
    assert!(owns("gates/", "deep/gates/x.yaml"), "unanchored: at any depth");
    assert!(owns("apps/web", "apps/web/deploy.yaml"), "a directory's contents");
    assert!(
        !owns("apps/web", "other/apps/web/deploy.yaml"),
        "an inner slash anchors"
    );
    assert!(owns("apps/*/rollout.yaml", "apps/web/rollout.yaml"));
    assert!(
        !owns("apps/*/rollout.yaml", "apps/web/x/rollout.yaml"),
        "* stays in a segment"
    );
    assert!(owns("apps/**/rollout.yaml", "apps/web/x/rollout.yaml"));
    assert!(
        owns("apps/**/rollout.yaml", "apps/rollout.yaml"),
        "** is zero directories too"
    );
    assert!(
        !owns("apps/**/rollout.yaml", "apps/xrollout.yaml"),
        "** is whole directories"
    );
    assert!(owns("docs/*", "docs/guide.md"));
    assert!(
        !owns("docs/*", "docs/build-app/troubleshooting.md"),
        "GitHub: not its subdirectories"
    );
    assert!(owns("docs/", "docs/build-app/troubleshooting.md"));
}

/// GitHub's own events drive the gate: with the poll an hour away, a
/// reader's command is answered and a writer's approval merges the gate,
/// each on the event the fake delivers; the
/// agent's own comments, delivered back to it, start no loop of looks.
#[tokio::test]
async fn githubs_events_pass_the_gate_with_no_poll_and_the_agents_own_comments_start_no_loop() {
    let scenario = Scenario::new("gh-events").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant("alice", "write");
    fake.grant("mallory", "read");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let args = [
        "--github-url",
        fake.url.as_str(),
        "--github-repo",
        "acme/apps",
        "--github-poll",
        "3600",
        "--github-poll-max",
        "3600",
    ];
    let agent = support::agent::AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &args,
        &[
            ("GITCANARY_GITHUB_TOKEN", "ghp_test_token"),
            ("GITCANARY_WEBHOOK_SECRET", "events-secret"),
        ],
    );
    fake.deliver_to(&format!("http://{}/webhook", agent.address().await), "events-secret");
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;
    let gate = promotion_pull(&fake, 1).await;
    let before = fake.counted();

    fake.comment(gate.number, "mallory", "/gitcanary promote");
    eventually("mallory is answered, on the event", WAIT, || async {
        fake.comments_on(gate.number)
            .iter()
            .any(|(_, _, b)| b.starts_with("@mallory"))
            .then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    fake.review(gate.number, "alice", "APPROVED");
    wait_for_phase(&scenario, Phase::Healthy).await;
    let merged = fake
        .pulls()
        .into_iter()
        .find(|p| p.number == gate.number)
        .expect("the gate");
    assert_eq!(merged.merged_by.as_deref(), Some("gitcanary[bot]"));
    assert!(
        fake.delivered() >= 4,
        "comments, a review, a merge and its push were delivered"
    );
    let answers = fake
        .comments_on(gate.number)
        .into_iter()
        .filter(|(_, _, b)| b.starts_with("@mallory"))
        .count();
    assert_eq!(
        answers, 1,
        "each command is answered once, however many events wake a look"
    );
    let spent = fake.counted() - before;
    assert!(
        spent < 150,
        "{spent} GitHub requests from the pause to the promote: the agent's own comments must not wake it again and again"
    );
}

/// A burst past GitHub's secondary limit (a 429 or a 403 with
/// `Retry-After`, the quota not spent) is answered by sending nothing until
/// `Retry-After` has passed, then going on.
#[tokio::test]
async fn a_burst_past_githubs_secondary_limit_waits_as_retry_after_says() {
    for status in [429, 403] {
        let fake = GitHubFake::start().await;
        fake.carry("b1", 5);
        fake.set_quota(5000, 4000);
        fake.secondary_limit(3, Duration::from_secs(2), status, 2);
        let metrics = std::sync::Arc::new(gitcanary::telemetry::Metrics::default());
        let github = gitcanary::github::GitHub::new(
            &fake.url,
            gitcanary::github::Credentials::Token("ghp_test_token".into()),
            "acme/apps",
            metrics.clone(),
        )
        .expect("client");
        for _ in 0..3 {
            github.carried_by("b1").await.expect("within the limit");
        }
        let refused = github.carried_by("b1").await.expect_err("past the limit");
        assert!(refused.to_string().contains("secondary rate limit"), "{refused}");
        let sent = fake.data.lock().unwrap().requests.len();
        let quiet = github.carried_by("b1").await.expect_err("quiet until Retry-After");
        assert!(quiet.to_string().contains("rate limited"), "{quiet}");
        assert_eq!(fake.data.lock().unwrap().requests.len(), sent, "nothing sent meanwhile");
        let started = std::time::Instant::now();
        let pulls = eventually("Retry-After passes", Duration::from_secs(10), || async {
            github.carried_by("b1").await.ok()
        })
        .await;
        assert_eq!(pulls, vec![(5, "carol".to_string())]);
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{status}: waited {:?}",
            started.elapsed()
        );
        let text = metrics.render();
        assert!(
            text.contains("gitcanary_github_rate_limited_total 1"),
            "{status}: {text}"
        );
    }
}

/// A custom repository role counts by the base permission GitHub gives it
/// (`permission`), whatever its name (`role_name`): a release manager role
/// on write may promote, a triage role on read may not.
#[tokio::test]
async fn a_custom_role_counts_by_its_base_permission_not_its_name() {
    let scenario = Scenario::new("gh-roles").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    fake.grant_role("rita", "write", "release-manager");
    fake.grant_role("tom", "read", "triage-plus");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = github_agent(&scenario, &fake.url);
    wait_for_phase(&scenario, Phase::Healthy).await;
    write_app(&scenario, "2.0");
    let commit = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&commit, 7);
    wait_for_phase(&scenario, Phase::Paused).await;

    fake.comment(7, "tom", "/gitcanary promote");
    eventually("tom is told he needs write", WAIT, || async {
        fake.comments_on(7)
            .iter()
            .any(|(_, _, b)| b.starts_with("@tom") && b.contains("needs write"))
            .then_some(())
    })
    .await;
    assert_eq!(phase(&scenario).await, Some(Phase::Paused));
    fake.comment(7, "rita", "/gitcanary promote");
    wait_for_phase(&scenario, Phase::Healthy).await;
    assert!(
        !fake.comments_on(7).iter().any(|(_, _, b)| b.starts_with("@rita")),
        "rita's command was taken, not answered"
    );
}
