//! The steady state from watch caches: a resync when nothing changed reads
//! memory, and a watch broken by an API server outage lists once and misses
//! nothing.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use support::agent::{AgentProcess, Scenario};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);
const LISTS: &str = "gitcanary_kube_reads_total{kind=\"list\"}";
const APPLIED: &str = "gitcanary_objects_applied_total";
const RECALLED: &str = "gitcanary_apps_recalled_total";
const WATCHES: &str = "gitcanary_kube_reads_total{kind=\"watch\"}";

fn config_map(ns: &str, name: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  color: blue\n")
}

async fn color(client: &kube::Client, ns: &str, name: &str) -> Option<String> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??
        .data?
        .remove("color")
}

/// Waits until the agent's syncs stop listing: its watches have listed and
/// answer for the kinds.
async fn settled(agent: &AgentProcess) {
    eventually("the watches answer", WAIT, || async {
        let before = agent.counter(LISTS).await;
        agent.resyncs(2).await;
        (agent.counter(LISTS).await == before).then_some(())
    })
    .await;
}

#[tokio::test]
async fn resyncs_with_nothing_changed_list_nothing_and_write_nothing() {
    let scenario = Scenario::new("cache-steady").await;
    for i in 0..20 {
        scenario.repo.write(
            &format!("app/cm-{i}.yaml"),
            &config_map(&scenario.ns, &format!("cm-{i}")),
        );
    }
    scenario.repo.write("other/cm.yaml", &config_map(&scenario.ns, "other"));
    scenario
        .repo
        .commit_and_push("twenty ConfigMaps, and one in another app");
    let agent = scenario.start_agent();
    eventually("synced", WAIT, || async {
        color(&scenario.client, &scenario.ns, "cm-19").await
    })
    .await;
    settled(&agent).await;
    let (lists, applied) = (agent.counter(LISTS).await, agent.counter(APPLIED).await);
    let (syncs, recalled) = (agent.syncs().await, agent.counter(RECALLED).await);
    // Resyncs asked for (at rest, the agent's own polls sync nothing).
    for _ in 0..3 {
        agent.resync().await;
    }
    assert_eq!(agent.counter(LISTS).await, lists, "no list while nothing changes");
    assert_eq!(agent.counter(APPLIED).await, applied, "no write while nothing changes");
    // Both apps' answers come from the last sync: nothing they hold changed.
    eventually("every app of every resync recalled", WAIT, || async {
        let more_syncs = agent.syncs().await - syncs;
        (more_syncs >= 3 && agent.counter(RECALLED).await - recalled == 2 * more_syncs).then_some(())
    })
    .await;
    let recalled = agent.counter(RECALLED).await;
    // With nothing moved in any cache since a sync that recalled both apps,
    // a resync is that sync's answer as a whole.
    assert!(
        agent.counter("gitcanary_syncs_recalled_total").await > 0,
        "no resync was answered as a whole"
    );

    // Drift is still seen, through the same watches, and put back.
    let drift = serde_json::json!({"data": {"color": "red"}});
    Api::<ConfigMap>::namespaced(scenario.client.clone(), &scenario.ns)
        .patch("cm-3", &PatchParams::default(), &Patch::Merge(&drift))
        .await
        .expect("drift");
    eventually("drift healed", WAIT, || async {
        (color(&scenario.client, &scenario.ns, "cm-3").await? == "blue").then_some(())
    })
    .await;
    assert_eq!(
        agent.counter(LISTS).await,
        lists,
        "healing from the cache lists nothing"
    );
    assert_eq!(
        agent.counter(APPLIED).await,
        applied + 1,
        "only the drifted object was written"
    );
    // The drift's own sync looked at cm-3's app only; the resyncs after it
    // answer from memory again.
    agent.resync().await;
    agent.resync().await;
    assert!(
        agent.counter(RECALLED).await > recalled,
        "resyncs after the healing answer from memory again"
    );
}

/// Apps a (ConfigMap a1) and b (b1), synced by an agent that never polls
/// (every sync after the first is woken by a watch, or a webhook signed
/// with `s3cret`), once both kinds' watches (the apps' ConfigMaps, the
/// status ConfigMaps) have listed.
async fn two_apps_without_a_poll(prefix: &str) -> (Scenario, AgentProcess) {
    let scenario = Scenario::new(prefix).await;
    scenario.repo.write("a/cm.yaml", &config_map(&scenario.ns, "a1"));
    scenario.repo.write("b/cm.yaml", &config_map(&scenario.ns, "b1"));
    scenario.repo.commit_and_push("two apps");
    let agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--poll-interval", "3600"],
        &[("GITCANARY_WEBHOOK_SECRET", "s3cret")],
    );
    eventually("synced", WAIT, || async {
        color(&scenario.client, &scenario.ns, "b1").await
    })
    .await;
    eventually("the watches run", WAIT, || async {
        (agent.counter(WATCHES).await >= 2).then_some(())
    })
    .await;
    (scenario, agent)
}

#[tokio::test]
async fn a_drift_replans_only_the_app_that_holds_the_object() {
    let (scenario, agent) = two_apps_without_a_poll("cache-scope").await;
    let configmaps = Api::<ConfigMap>::namespaced(scenario.client.clone(), &scenario.ns);
    let drift_a1 = async |color_now: &str| {
        let syncs = agent.syncs().await;
        let drift = serde_json::json!({"data": {"color": color_now}});
        configmaps
            .patch("a1", &PatchParams::default(), &Patch::Merge(&drift))
            .await
            .expect("drift");
        eventually("drift healed and its sync counted", WAIT, || async {
            let healed = color(&scenario.client, &scenario.ns, "a1").await? == "blue";
            (healed && agent.syncs().await > syncs).then_some(())
        })
        .await;
    };
    // Were b looked at, its answer would be remembered now and recalled next time.
    drift_a1("red").await;
    let (recalled, applied) = (agent.counter(RECALLED).await, agent.counter(APPLIED).await);
    drift_a1("green").await;
    assert_eq!(agent.counter(APPLIED).await, applied + 1, "a1 written back");
    assert_eq!(
        agent.counter(RECALLED).await,
        recalled,
        "app b was not looked at, not even to be recalled from memory"
    );
}

#[tokio::test]
async fn a_push_replans_only_the_app_it_changed() {
    let (scenario, agent) = two_apps_without_a_poll("cache-push").await;
    let planned = "gitcanary_apps_planned_total";
    let (recalled, planned_before) = (agent.counter(RECALLED).await, agent.counter(planned).await);
    scenario.repo.write(
        "a/cm.yaml",
        &config_map(&scenario.ns, "a1").replace("color: blue", "color: green"),
    );
    let commit = scenario.repo.commit_and_push("a1 green");
    let push = format!("{{\"ref\":\"refs/heads/main\",\"after\":\"{commit}\"}}");
    let signature = gitcanary::source::webhook::sign(b"s3cret", push.as_bytes());
    let headers = [("X-GitHub-Event", "push"), ("X-Hub-Signature-256", signature.as_str())];
    let answer = support::http(&agent.address().await, "POST", "/webhook", &headers, push.as_bytes());
    assert_eq!(answer.map(|(status, _)| status), Some(202), "accepted");
    eventually("a1 applied", WAIT, || async {
        (color(&scenario.client, &scenario.ns, "a1").await? == "green").then_some(())
    })
    .await;
    // Counted once the sync is over.
    eventually("the push's sync counted", WAIT, || async {
        (agent.counter(planned).await > planned_before).then_some(())
    })
    .await;
    assert_eq!(
        agent.counter(planned).await,
        planned_before + 1,
        "app a planned, and only a"
    );
    assert_eq!(
        agent.counter(RECALLED).await,
        recalled,
        "app b, unchanged in Git, was not looked at, not even to be recalled from memory"
    );
}

#[tokio::test]
async fn after_an_api_server_outage_the_watches_list_once_miss_no_drift_and_write_nothing_twice() {
    let plane = support::DedicatedControlPlane::start();
    let client = plane.client().await;
    support::agent::install_rollout_crd_on(&client).await;
    let ns = support::namespace(&client, "cache-outage").await;
    let server = support::git_server::GitServer::start(None).await;
    let repo = server.create_repo("apps");
    for i in 0..5 {
        repo.write(&format!("app/cm-{i}.yaml"), &config_map(&ns, &format!("cm-{i}")));
    }
    repo.commit_and_push("five ConfigMaps");
    let cache = tempfile::tempdir().expect("cache");
    let kubeconfig = plane.kubeconfig.display().to_string();
    // A long lease: the outage must not cost the agent its leadership.
    let agent = AgentProcess::start_with(
        &repo,
        &ns,
        cache.path(),
        &["--kubeconfig", &kubeconfig, "--lease-duration", "120"],
        &[],
    );
    eventually("synced", WAIT, || async { color(&client, &ns, "cm-4").await }).await;
    settled(&agent).await;
    let (lists, applied) = (agent.counter(LISTS).await, agent.counter(APPLIED).await);

    plane.component("stop", "kube-apiserver");
    plane.component("start", "kube-apiserver");
    // Drift made as soon as the server answers, while the watches are still
    // finding their way back.
    let drift = serde_json::json!({"data": {"color": "red"}});
    eventually("the API server is back", WAIT, || async {
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .patch("cm-1", &PatchParams::default(), &Patch::Merge(&drift))
            .await
            .ok()
    })
    .await;
    eventually("drift made during the gap healed", WAIT, || async {
        (color(&client, &ns, "cm-1").await? == "blue").then_some(())
    })
    .await;
    settled(&agent).await;
    assert!(agent.counter(LISTS).await > lists, "the broken watches listed again");
    assert_eq!(
        agent.counter(APPLIED).await,
        applied + 1,
        "only the drifted object was written"
    );
}
