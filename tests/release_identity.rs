//! A signal and a canary object count only for the release they belong to:
//! a promote sent while nothing waits is spent, not kept for the next
//! release's pause, and an object of Git that bears the canary's name is
//! never taken for the canary.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use support::agent::{Scenario, write_echo_app};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);
const PAUSED: &str = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {}}\n";

async fn status(scenario: &Scenario) -> Option<gitcanary::rollout::api::RolloutStatus> {
    Api::<Rollout>::namespaced(scenario.client.clone(), &scenario.ns)
        .get_opt("echo")
        .await
        .ok()??
        .status
}

#[tokio::test]
async fn a_promote_sent_while_healthy_does_not_pass_the_next_releases_pause() {
    let scenario = Scenario::new("stale-promote").await;
    let ns = scenario.ns.clone();
    write_echo_app(&scenario.repo, &ns, "1.0", PAUSED);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = scenario.start_agent();
    eventually("healthy on 1.0", WAIT, || async {
        (status(&scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;

    // The CLI refuses a promote nothing waits for.
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &ns]);
    assert_ne!(code, 0, "refused");
    assert!(stderr.contains("nothing waits for a promote"), "{stderr}");
    assert!(stderr.contains("nothing was sent"), "{stderr}");

    // Written by hand, it is spent and cleared by the agent, and said so.
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &ns);
    let by_hand = serde_json::json!({"metadata": {"annotations": {"gitcanary.io/promote": "by hand, early"}}});
    rollouts
        .patch("echo", &PatchParams::default(), &Patch::Merge(&by_hand))
        .await
        .expect("annotated");
    let ignored = eventually("the early promote is spent and cleared", WAIT, || async {
        let rollout = rollouts.get_opt("echo").await.ok()??;
        let cleared = !rollout
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("gitcanary.io/promote");
        let status = rollout.status?;
        (cleared && !status.ignored_signal.is_empty()).then_some(status.ignored_signal)
    })
    .await;
    assert!(ignored.contains("ignored"), "{ignored}");
    let (_, shown, _) = scenario.run_cli(&["status", "echo", "-n", &ns]);
    assert!(shown.contains(&ignored), "{shown}");

    // The next release stops at its pause and waits for a promote of its own.
    write_echo_app(&scenario.repo, &ns, "2.0", PAUSED);
    scenario.repo.commit_and_push("echo 2.0");
    eventually("2.0 waits at its pause", WAIT, || async {
        (status(&scenario).await?.phase == Phase::Paused).then_some(())
    })
    .await;
    agent.resyncs(2).await;
    assert_eq!(status(&scenario).await.map(|s| s.phase), Some(Phase::Paused));
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("promoted by its own promote", WAIT, || async {
        (status(&scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;
}

#[tokio::test]
async fn another_apps_deployment_with_the_canary_name_is_never_deleted() {
    let scenario = Scenario::new("canary-name").await;
    let ns = scenario.ns.clone();
    write_echo_app(&scenario.repo, &ns, "1.0", PAUSED);
    scenario.repo.write(
        "other/deployment.yaml",
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: echo-canary\n  namespace: {ns}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: other}}\n  template:\n    metadata:\n      labels: {{app: other}}\n    spec:\n      containers:\n      - name: other\n        image: registry.test/other:1\n"
        ),
    );
    scenario.repo.commit_and_push("echo 1.0, and another app's echo-canary");
    let deployments: Api<Deployment> = Api::namespaced(scenario.client.clone(), &ns);
    let uid = |d: Option<Deployment>| d.and_then(|d| d.metadata.uid);
    for _ in 0..4 {
        let (code, stdout, stderr) = scenario.sync_once(&[]);
        assert!(code == 0 || code == 1, "{stdout}{stderr}");
    }
    let first = uid(deployments.get_opt("echo-canary").await.expect("readable")).expect("other's Deployment");

    // A release of echo needs that name: it does not start, and says whose it is.
    write_echo_app(&scenario.repo, &ns, "2.0", PAUSED);
    scenario.repo.commit_and_push("echo 2.0");
    for _ in 0..4 {
        scenario.sync_once(&[]);
    }
    let message = eventually("the release is refused", WAIT, || async {
        let status = status(&scenario).await?;
        let message = status.canary_status?.message;
        message.contains("echo-canary").then_some(message)
    })
    .await;
    assert!(
        message.contains("it is an object of Git (other/deployment.yaml"),
        "{message}"
    );
    assert!(
        message.contains(&format!("the canary of Rollout {ns}/echo")),
        "{message}"
    );
    let after = deployments
        .get_opt("echo-canary")
        .await
        .expect("readable")
        .expect("still there");
    assert_eq!(after.metadata.uid, Some(first), "never deleted nor re-created");
    assert_eq!(
        after
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.containers[0].image.clone()),
        Some(Some("registry.test/other:1".to_string())),
        "never written over"
    );
}
