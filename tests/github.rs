//! The release told on the pull request that carried it, through octocrab
//! against a GitHub fake: one comment edited in place, a commit status, and
//! `/gitcanary` commands that count only from writers.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use kube::api::Api;
use support::agent::{AgentProcess, Scenario};
use support::eventually;
use support::github::GitHubFake;

const WAIT: Duration = Duration::from_secs(90);

fn write_app(scenario: &Scenario, image: &str) {
    let ns = &scenario.ns;
    scenario.repo.write(
        "echo/deployment.yaml",
        &format!("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: echo}}\n  template:\n    metadata:\n      labels: {{app: echo}}\n    spec:\n      containers:\n      - name: echo\n        image: registry.test/echo:{image}\n"),
    );
    scenario.repo.write(
        "echo/rollout.yaml",
        &format!("apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: echo}}\n  strategy:\n    canary:\n      steps:\n      - {{replicas: 1, pause: {{}}}}\n"),
    );
}

fn start_agent(scenario: &Scenario, fake: &GitHubFake) -> AgentProcess {
    AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--github-url", &fake.url, "--github-repo", "acme/apps"],
        &[("GITCANARY_GITHUB_TOKEN", "ghp_test_token")],
    )
}

#[tokio::test]
async fn the_pull_request_follows_the_release_and_only_writers_can_promote() {
    let scenario = Scenario::new("gh-release").await;
    let fake = GitHubFake::start().await;
    fake.grant("alice", "write");
    fake.grant("mallory", "read");
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = start_agent(&scenario, &fake);
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
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(phase().await, Some(Phase::Paused));
    // A command in a quote is not a command, even from a writer.
    fake.comment(7, "alice", "> /gitcanary promote\nmallory asked for this");
    tokio::time::sleep(Duration::from_secs(4)).await;
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
