//! Three replicas with `--shards 6` share thirty apps: each shard is held
//! by one replica, two each; a replica killed loses its shards to the
//! others within the lease duration and a change to one of its apps is
//! applied by another; a replica stopped while its Leases expire writes
//! nothing for their apps when it wakes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use support::agent::{AgentProcess, Scenario};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);
const APPS: usize = 30;
const SHARDS: u32 = 6;

fn write_apps(scenario: &Scenario, version: &str, only: Option<&str>) {
    for i in 0..APPS {
        let app = format!("app-{i:02}");
        if only.is_some_and(|only| only != app) {
            continue;
        }
        let ns = &scenario.ns;
        scenario.repo.write(
            &format!("{app}/cm.yaml"),
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {app}, namespace: {ns}}}\ndata: {{version: \"{version}\"}}\n"
            ),
        );
    }
}

fn replica(scenario: &Scenario, identity: &str) -> AgentProcess {
    replica_with(scenario, identity, SHARDS, &[], &[])
}

/// A replica of the scenario's agent with a cache of its own, `shards`
/// shards and a 4 s lease, with more arguments and environment.
fn replica_with(scenario: &Scenario, identity: &str, shards: u32, more: &[&str], env: &[(&str, &str)]) -> AgentProcess {
    let cache = scenario.cache.path().join(identity);
    std::fs::create_dir_all(&cache).expect("a cache of its own");
    let shards = shards.to_string();
    let mut args = vec![
        "--leader-identity",
        identity,
        "--lease-duration",
        "4",
        "--shards",
        &shards,
    ];
    args.extend_from_slice(more);
    AgentProcess::start_with(&scenario.repo, &scenario.ns, &cache, &args, env)
}

/// The shards each replica says it holds (from its `/metrics`).
async fn held(replica: &AgentProcess) -> BTreeSet<u32> {
    let names: Vec<String> = (0..SHARDS)
        .map(|k| format!("gitcanary_shard_held{{shard=\"{k}\"}}"))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let values = replica.counters(&names).await;
    (0..SHARDS).filter(|k| values[*k as usize] == 1).collect()
}

async fn apps(replica: &AgentProcess) -> u64 {
    let mut total = 0;
    for k in 0..SHARDS {
        total += replica.counter(&format!("gitcanary_shard_apps{{shard=\"{k}\"}}")).await;
    }
    total
}

async fn version(scenario: &Scenario, app: &str) -> Option<String> {
    let maps: Api<ConfigMap> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    maps.get_opt(app).await.ok().flatten()?.data?.get("version").cloned()
}

/// Waits until `replicas` hold every shard between them, each its fair share.
async fn balanced(replicas: &[&AgentProcess]) -> Vec<BTreeSet<u32>> {
    let fair = (SHARDS as usize).div_ceil(replicas.len());
    eventually("the shards shared out", WAIT, || async {
        let mut each = Vec::new();
        for replica in replicas {
            each.push(held(replica).await);
        }
        let all: BTreeSet<u32> = each.iter().flatten().copied().collect();
        let disjoint = each.iter().map(BTreeSet::len).sum::<usize>() == all.len();
        let fair_shares = each.iter().all(|h| h.len() <= fair);
        (disjoint && fair_shares && all.len() == SHARDS as usize).then_some(each)
    })
    .await
}

#[tokio::test]
async fn replicas_share_the_apps_by_shard_and_take_over_a_dead_ones() {
    let scenario = Scenario::new("shards").await;
    write_apps(&scenario, "1", None);
    scenario.repo.commit_and_push("thirty apps");
    // Every request each replica sends, in its log.
    let trace = [("GITCANARY_LOG", "gitcanary=debug,gitcanary::cluster::requests=trace")];
    let a = replica_with(&scenario, "replica-a", SHARDS, &[], &trace);
    let mut b = replica_with(&scenario, "replica-b", SHARDS, &[], &trace);
    let c = replica_with(&scenario, "replica-c", SHARDS, &[], &trace);
    let shares = balanced(&[&a, &b, &c]).await;
    for i in 0..APPS {
        let app = format!("app-{i:02}");
        eventually(&format!("{app} applied"), WAIT, || async {
            (version(&scenario, &app).await.as_deref() == Some("1")).then_some(())
        })
        .await;
    }
    // Each replica syncs exactly the apps of its shards: thirty in all.
    eventually("thirty apps counted once", WAIT, || async {
        (apps(&a).await + apps(&b).await + apps(&c).await == APPS as u64).then_some(())
    })
    .await;
    // `gitcanary status` names each replica's shards and how many apps it syncs.
    let instance = format!("e2e-{}", scenario.ns);
    let (code, status, stderr) =
        scenario.run_cli(&["status", "--state-namespace", &scenario.ns, "--instance", &instance]);
    assert_eq!(code, 0, "{stderr}");
    for (replica, held) in [
        ("replica-a", &shares[0]),
        ("replica-b", &shares[1]),
        ("replica-c", &shares[2]),
    ] {
        let shards: Vec<String> = held.iter().map(u32::to_string).collect();
        let line = status
            .lines()
            .find(|l| l.trim_start().starts_with(replica))
            .unwrap_or_default();
        assert!(
            line.contains(&format!("shards {}", shards.join(","))),
            "{replica}: {status}"
        );
    }
    let counted: usize = status
        .lines()
        .filter_map(|l| l.split("apps ").nth(1)?.trim().parse::<usize>().ok())
        .sum();
    assert_eq!(counted, APPS, "{status}");
    // Each app's object written once, by one replica: the field manager is
    // the agent's, the same for every replica (a shard that moves must not
    // meet its own fields under another manager), so the replicas' own
    // request logs tell the writers apart.
    let maps = format!("/api/v1/namespaces/{}/configmaps/", scenario.ns);
    let app_names: BTreeSet<String> = (0..APPS).map(|i| format!("app-{i:02}")).collect();
    let mut writers = BTreeMap::<String, BTreeSet<&str>>::new();
    for (replica, name) in [(&a, "replica-a"), (&b, "replica-b"), (&c, "replica-c")] {
        for (method, path) in replica.requests_since(0) {
            // The apps' own ConfigMaps, not the agent's status ConfigMaps beside them.
            let app = path
                .strip_prefix(&maps)
                .filter(|app| method == "PATCH" && app_names.contains(*app));
            if let Some(app) = app {
                writers.entry(app.to_string()).or_default().insert(name);
            }
        }
    }
    assert_eq!(writers.len(), APPS, "every app written: {writers:#?}");
    let twice: Vec<_> = writers.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "written by more than one replica: {twice:#?}");

    // b dies; an app of its shards changes: a or c applies it.
    let of_b = (0..APPS)
        .map(|i| format!("app-{i:02}"))
        .find(|app| shares[1].contains(&gitcanary::shards::shard_of(app, SHARDS)))
        .expect("b holds an app");
    b.kill();
    write_apps(&scenario, "2", Some(&of_b));
    scenario.repo.commit_and_push("one of b's apps changes");
    eventually(&format!("{of_b} applied by another replica"), WAIT, || async {
        (version(&scenario, &of_b).await.as_deref() == Some("2")).then_some(())
    })
    .await;
    balanced(&[&a, &c]).await;
}

#[tokio::test]
async fn a_replica_stopped_past_its_leases_writes_nothing_for_their_apps_when_it_wakes() {
    let scenario = Scenario::new("shards-stop").await;
    write_apps(&scenario, "1", None);
    scenario.repo.commit_and_push("thirty apps");
    let a = replica(&scenario, "replica-a");
    let c = replica(&scenario, "replica-c");
    let shares = balanced(&[&a, &c]).await;
    let of_a = (0..APPS)
        .map(|i| format!("app-{i:02}"))
        .find(|app| shares[0].contains(&gitcanary::shards::shard_of(app, SHARDS)))
        .expect("a holds an app");
    eventually("applied", WAIT, || async {
        (version(&scenario, &of_a).await.as_deref() == Some("1")).then_some(())
    })
    .await;

    // a stops; c takes every shard once a's Leases expire, and applies a change.
    a.signal("STOP");
    eventually("c holds every shard", WAIT, || async {
        (held(&c).await.len() == SHARDS as usize).then_some(())
    })
    .await;
    write_apps(&scenario, "2", Some(&of_a));
    scenario.repo.commit_and_push("one of a's apps changes");
    eventually("c applies it", WAIT, || async {
        (version(&scenario, &of_a).await.as_deref() == Some("2")).then_some(())
    })
    .await;
    // a's revision is the old one: had it written for the app on waking,
    // the app would be back at 1.
    a.signal("CONT");
    eventually("a wakes and knows its shards are out of date", WAIT, || async {
        a.log_text().contains("was not renewed in time").then_some(())
    })
    .await;
    // The shards are shared out again, and the app keeps Git's newest version.
    balanced(&[&a, &c]).await;
    a.resyncs(1).await;
    c.resyncs(1).await;
    assert_eq!(version(&scenario, &of_a).await.as_deref(), Some("2"));
    let log = a.log_text();
    let woke = log.find("was not renewed in time").expect("the wake");
    let stale_write = log[woke..]
        .lines()
        .find(|line| line.contains(&format!("app{{app={of_a} ")) && line.contains("applied=1"));
    assert_eq!(
        stale_write, None,
        "a wrote nothing for the app once awake: its Git is 2 already"
    );
}

/// The fence is asked before each write, not only before each app: once
/// the shard is lost, none of the app's writes is sent (an apply, a merge,
/// a status, a delete, as the tenant or as the agent), not even when the
/// shard is taken again during the same sync, and the cluster keeps what
/// was written while it was held.
#[tokio::test]
async fn a_writer_sends_nothing_for_an_app_once_its_shard_is_lost() {
    use gitcanary::cluster::{Cluster, Mode};
    use gitcanary::manifest::ObjectKey;
    use gitcanary::model::{Deletion, Fence, SyncOptions};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let client = support::client().await;
    let ns = support::namespace(&client, "fence").await;
    let cluster = Cluster::from_client(client.clone()).await.expect("a cluster");
    let held = Arc::new(AtomicBool::new(true));
    let fence = Fence(Arc::new({
        let held = held.clone();
        move |app: &str| app == "app-07" && held.load(Ordering::SeqCst)
    }));
    let options = SyncOptions {
        fence: Some(fence),
        ..SyncOptions::default()
    };
    let writer = cluster.writer_for("app-07", &options);
    let resolved = cluster.served("v1", "ConfigMap").await.expect("ConfigMaps are served");
    let configmap = |name: &str, version: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns}, "data": {"version": version}})
    };
    let written = writer
        .apply(&resolved, &configmap("kept", "1"), true, Mode::Apply)
        .await
        .expect("written while the shard is held");

    held.store(false, Ordering::SeqCst);
    let refusal = writer
        .apply(&resolved, &configmap("stale", "1"), true, Mode::Apply)
        .await
        .expect_err("an apply once the shard is lost");
    assert!(
        refusal.to_string().contains("no longer holds the shard of app app-07"),
        "{refusal}"
    );
    let patch = serde_json::json!({"data": {"version": "stale"}});
    let merged = writer.as_agent().merge(&resolved, Some(&ns), "kept", &patch).await;
    assert!(merged.is_err(), "a merge as the agent is fenced too");
    let deletion = Deletion {
        api_version: "v1".into(),
        key: ObjectKey {
            group: String::new(),
            kind: "ConfigMap".into(),
            namespace: Some(ns.clone()),
            name: "kept".into(),
        },
        uid: written.metadata.uid.clone().expect("a uid"),
        resource_version: None,
        foreground: false,
    };
    assert!(
        writer.delete(&deletion, Mode::Apply).await.is_err(),
        "a delete is fenced too"
    );
    // Half a sync is never resumed: the shard held again, this sync's writer stays refused.
    held.store(true, Ordering::SeqCst);
    assert!(writer.fence_lost());
    let agent = writer.as_agent();
    assert!(
        agent.merge_as_news(&resolved, Some(&ns), "kept", &patch).await.is_err(),
        "the agent's copy is refused as well"
    );
    assert!(
        writer
            .apply(&resolved, &configmap("kept", "stale"), true, Mode::Apply)
            .await
            .is_err(),
        "refused for the rest of the sync"
    );
    // A new sync's writer may write again.
    let next = cluster.writer_for("app-07", &options);
    assert!(!next.fence_lost());
    next.apply(&resolved, &configmap("next", "1"), true, Mode::Apply)
        .await
        .expect("written by the next sync");
    // A dry run writes nothing, and `gitcanary diff` is no replica's.
    writer
        .apply(&resolved, &configmap("stale", "1"), true, Mode::DryRun)
        .await
        .expect("a dry run is not fenced");

    let configmaps: Api<ConfigMap> = Api::namespaced(client, &ns);
    assert!(configmaps.get_opt("stale").await.expect("read").is_none());
    let kept = configmaps.get("kept").await.expect("what was written while held stays");
    assert_eq!(
        kept.data.unwrap_or_default().get("version").map(String::as_str),
        Some("1")
    );
}

/// A decision made on GitHub (a promote, an abort, the last comment read)
/// reaches a Rollout only through the writer fenced to its app: a replica
/// that lost the app's shard while GitHub answered hands nothing over.
#[tokio::test]
async fn a_decision_is_not_handed_to_a_rollout_whose_shard_was_lost() {
    use gitcanary::cluster::Cluster;
    use gitcanary::model::{Fence, SyncOptions};
    use gitcanary::rollout::api::{LAST_COMMENT_ANNOTATION, PROMOTE_ANNOTATION, Rollout};
    use gitcanary::rollout::cli::{DecidedOn, Signal, record_last_comment, send_signal_token};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let client = support::client().await;
    support::agent::install_rollout_crd(&client).await;
    let ns = support::namespace(&client, "fence-gate").await;
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), &ns);
    let rollout: Rollout = serde_json::from_value(serde_json::json!({
        "apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout", "metadata": {"name": "echo"},
        "spec": {"workloadRef": {"kind": "Deployment", "name": "echo"}, "strategy": {"canary": {"steps": [{"pause": {}}]}}}
    }))
    .expect("a Rollout");
    rollouts.create(&Default::default(), &rollout).await.expect("created");
    let paused = serde_json::json!({"status": {"phase": "Paused", "canaryCommit": "c0ffee0123456789", "rolloutID": "c0ffee0",
        "canaryStatus": {"canaryReadyReplicas": 1, "currentStepIndex": 1, "currentStepState": "StepPaused", "message": "waiting for a promote"}}});
    rollouts
        .patch_status("echo", &Default::default(), &kube::api::Patch::Merge(&paused))
        .await
        .expect("paused at its gate");

    let cluster = Cluster::from_client(client.clone()).await.expect("a cluster");
    let held = Arc::new(AtomicBool::new(true));
    let options = SyncOptions {
        fence: Some(Fence(Arc::new({
            let held = held.clone();
            move |app: &str| app == "echo-app" && held.load(Ordering::SeqCst)
        }))),
        ..SyncOptions::default()
    };
    let decided = DecidedOn {
        canary_commit: "c0ffee0123456789",
        step: Some(1),
    };
    let annotation = |key: &'static str| {
        let rollouts = rollouts.clone();
        async move {
            let rollout = rollouts.get("echo").await.expect("read");
            rollout.metadata.annotations.unwrap_or_default().get(key).cloned()
        }
    };

    let writer = cluster.writer(None).fenced(options.fence.as_ref(), "echo-app");
    held.store(false, Ordering::SeqCst);
    let refused = send_signal_token(&writer, &ns, "echo", Signal::Promote, "review 1 by @bob", Some(decided)).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("no longer holds the shard of app echo-app")),
        "{refused:?}"
    );
    assert!(record_last_comment(&writer, &ns, "echo", 42).await.is_err());
    assert_eq!(
        annotation(PROMOTE_ANNOTATION).await,
        None,
        "no promote from a replica without the shard"
    );
    assert_eq!(annotation(LAST_COMMENT_ANNOTATION).await, None);

    // The replica that holds the shard hands the same decision over.
    held.store(true, Ordering::SeqCst);
    let holder = cluster.writer(None).fenced(options.fence.as_ref(), "echo-app");
    send_signal_token(&holder, &ns, "echo", Signal::Promote, "review 1 by @bob", Some(decided))
        .await
        .expect("handed over while the shard is held");
    record_last_comment(&holder, &ns, "echo", 42).await.expect("recorded");
    let promote = annotation(PROMOTE_ANNOTATION).await.expect("the promote");
    assert!(promote.contains("review 1 by @bob"), "{promote}");
    assert_eq!(annotation(LAST_COMMENT_ANNOTATION).await.as_deref(), Some("42"));
}

/// What a GitHub reporter of the tests is made of: a client of the fake,
/// the cluster, a plain-directory source, an author, no waves waiting.
struct ReporterParts {
    github: gitcanary::github::GitHub,
    cluster: gitcanary::cluster::Cluster,
    source: std::sync::Arc<gitcanary::source::Source>,
    author: gitcanary::identity::Author,
    waves: gitcanary::report::wave::WaveRetries,
    _dir: tempfile::TempDir,
}

impl ReporterParts {
    async fn new(fake: &support::github::GitHubFake, client: kube::Client) -> ReporterParts {
        let github = gitcanary::github::GitHub::new(
            &fake.url,
            gitcanary::github::Credentials::Token("ghp_test_token".into()),
            "acme/apps",
            std::sync::Arc::new(gitcanary::telemetry::Metrics::default()),
        )
        .expect("client");
        let dir = tempfile::tempdir().expect("a directory");
        ReporterParts {
            github,
            cluster: gitcanary::cluster::Cluster::from_client(client)
                .await
                .expect("a cluster"),
            source: std::sync::Arc::new(gitcanary::source::Source::Dir {
                root: dir.path().to_path_buf(),
                renderers: std::sync::Arc::default(),
            }),
            author: gitcanary::identity::Author::parse("gitcanary <gitcanary@example.com>").expect("an author"),
            waves: gitcanary::report::wave::WaveRetries::default(),
            _dir: dir,
        }
    }

    fn reporter<'a>(&'a self, fence: &'a gitcanary::model::Fence) -> gitcanary::report::github::GitHubReporter<'a> {
        gitcanary::report::github::GitHubReporter {
            github: &self.github,
            cluster: &self.cluster,
            source: &self.source,
            author: &self.author,
            waves: &self.waves,
            fence: Some(fence),
        }
    }
}

/// A sync's report of app `echo-app` holding one Rollout `echo`.
fn report_of_echo(
    namespace: &str,
    spec: serde_json::Value,
    status: serde_json::Value,
    changed: bool,
) -> gitcanary::sync::SyncReport {
    use gitcanary::sync::{AppReport, AppResult, SyncReport};
    SyncReport {
        commit: status["canaryCommit"].as_str().unwrap_or_default().to_string(),
        apps: vec![AppReport {
            rollouts: vec![gitcanary::rollout::model::RolloutSummary {
                namespace: namespace.to_string(),
                name: "echo".into(),
                spec: serde_json::from_value(spec).expect("a spec"),
                status: serde_json::from_value(status).expect("a status"),
                changed,
                last_command_comment: 0,
            }],
            ..AppReport::new("echo-app", AppResult::Synced)
        }]
        .into(),
        kinds: Default::default(),
        released: Default::default(),
        scoped: false,
        recalled: false,
    }
}

/// The GitHub report of an app whose shard this replica lost sends nothing
/// for it: no pull request looked up, no comment, no commit status; the
/// replica that holds the shard reports it.
#[tokio::test]
async fn a_replica_reports_nothing_to_github_for_an_app_whose_shard_it_lost() {
    use gitcanary::model::Fence;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    const COMMIT: &str = "c0ffee0123456789";
    let fake = support::github::GitHubFake::start().await;
    fake.carry(COMMIT, 5);
    let parts = ReporterParts::new(&fake, support::client().await).await;
    let held = Arc::new(AtomicBool::new(false));
    let fence = Fence(Arc::new({
        let held = held.clone();
        move |app: &str| app == "echo-app" && held.load(Ordering::SeqCst)
    }));
    let reporter = parts.reporter(&fence);
    let status = serde_json::json!({"phase": "Progressing", "canaryCommit": COMMIT,
        "rolloutID": "c0ffee0", "canaryStatus": {"canaryReadyReplicas": 0, "currentStepIndex": 1,
        "currentStepState": "StepUpgrade", "message": "making canary pods"}});
    let spec = serde_json::json!({"workloadRef": {"kind": "Deployment", "name": "echo"},
        "strategy": {"canary": {"steps": [{"pause": {}}]}}});
    let report = report_of_echo("demo", spec, status, true);
    let release_comments = || {
        fake.comments_on(5)
            .into_iter()
            .filter(|(_, _, body)| body.contains("<!-- gitcanary:release"))
            .count()
    };

    assert!(!reporter.report(&report).await);
    assert_eq!(
        fake.count("GET", &format!("/commits/{COMMIT}/pulls")),
        0,
        "nothing asked of GitHub"
    );
    assert_eq!(release_comments(), 0, "no comment from a replica without the shard");

    held.store(true, Ordering::SeqCst);
    reporter.report(&report).await;
    assert_eq!(release_comments(), 1, "the holder comments");
}

/// Rollout `echo` paused for a promote on a release carried by pull
/// request 5, where writer alice commented `/gitcanary promote`: the fake,
/// the Rollout's spec and status, and the command's comment id.
struct PausedForAPromote {
    fake: support::github::GitHubFake,
    spec: serde_json::Value,
    status: serde_json::Value,
    rollouts: Api<gitcanary::rollout::api::Rollout>,
    command: u64,
}

impl PausedForAPromote {
    async fn new(scenario: &Scenario) -> PausedForAPromote {
        use gitcanary::rollout::api::Rollout;
        scenario.repo.write("echo/notes.txt", "1\n");
        let stable = scenario.repo.commit_and_push("echo 1");
        scenario.repo.write("echo/notes.txt", "2\n");
        let canary = scenario.repo.commit_and_push("echo 2");
        let fake = support::github::GitHubFake::start_for(&scenario.repo.bare).await;
        fake.carry(&canary, 5);
        fake.grant("alice", "write");
        let command = fake.comment(5, "alice", "/gitcanary promote");
        let spec = serde_json::json!({"workloadRef": {"kind": "Deployment", "name": "echo"},
            "strategy": {"canary": {"steps": [{"replicas": 1, "pause": {}}]}}});
        let status = serde_json::json!({"phase": "Paused", "stableCommit": stable, "canaryCommit": canary,
            "rolloutID": &canary[..7], "stepHistory": [{"step": 1, "startedAt": "2026-01-01T00:00:00Z"}],
            "canaryStatus": {"canaryReadyReplicas": 1, "currentStepIndex": 1, "currentStepState": "StepPaused",
                "message": "waiting for a promote"}});
        let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
        let rollout: Rollout = serde_json::from_value(serde_json::json!({
            "apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout", "metadata": {"name": "echo"}, "spec": spec}))
        .expect("a Rollout");
        rollouts.create(&Default::default(), &rollout).await.expect("created");
        rollouts
            .patch_status(
                "echo",
                &Default::default(),
                &kube::api::Patch::Merge(&serde_json::json!({ "status": status })),
            )
            .await
            .expect("paused for a promote");
        PausedForAPromote {
            fake,
            spec,
            status,
            rollouts,
            command,
        }
    }

    fn report(&self, namespace: &str) -> gitcanary::sync::SyncReport {
        report_of_echo(namespace, self.spec.clone(), self.status.clone(), false)
    }

    async fn annotation(&self, key: &str) -> Option<String> {
        let rollout = self.rollouts.get("echo").await.expect("read");
        rollout.metadata.annotations.unwrap_or_default().get(key).cloned()
    }
}

/// A `/gitcanary promote` read just as the replica loses the app's shard is
/// neither handed over nor counted as handled: once the shard is held
/// again, the same command is handed over.
#[tokio::test]
async fn a_command_read_as_the_shard_is_lost_is_handed_over_once_it_is_held_again() {
    use gitcanary::model::Fence;
    use gitcanary::rollout::api::{LAST_COMMENT_ANNOTATION, PROMOTE_ANNOTATION};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let scenario = Scenario::new("fence-command").await;
    let paused = PausedForAPromote::new(&scenario).await;
    let fake = &paused.fake;
    // The shard is lost as soon as the pull request's comments have been read.
    let lose_after = Arc::new(AtomicUsize::new(0));
    let fence = Fence(Arc::new({
        let (fake, lose_after) = (fake.clone(), lose_after.clone());
        move |app: &str| {
            let after = lose_after.load(Ordering::SeqCst);
            app == "echo-app" && (after == 0 || fake.count("GET", "/issues/5/comments") < after)
        }
    }));
    let parts = ReporterParts::new(fake, scenario.client.clone()).await;
    let reporter = parts.reporter(&fence);
    let report = paused.report(&scenario.ns);

    lose_after.store(fake.count("GET", "/issues/5/comments") + 1, Ordering::SeqCst);
    assert!(!reporter.report(&report).await, "nothing handed over");
    assert!(
        fake.count("GET", "/issues/5/comments") >= lose_after.load(Ordering::SeqCst),
        "the command was read"
    );
    assert_eq!(paused.annotation(PROMOTE_ANNOTATION).await, None);
    assert_eq!(
        paused.annotation(LAST_COMMENT_ANNOTATION).await,
        None,
        "not recorded as handled"
    );

    lose_after.store(0, Ordering::SeqCst);
    assert!(reporter.report(&report).await, "handed over by the holder");
    let promote = paused.annotation(PROMOTE_ANNOTATION).await.expect("the promote");
    assert!(
        promote.contains(&format!("comment {} by @alice", paused.command)),
        "{promote}"
    );
}

/// A writer's `/gitcanary promote` read while GitHub fails to say who may
/// write (a 502, as its front end answers now and then) is not dropped as
/// handled: the next look reads it again and hands it over. Before, it was
/// ignored for good.
#[tokio::test]
async fn a_command_github_failed_to_answer_for_is_handed_over_at_the_next_look() {
    use gitcanary::model::Fence;
    use gitcanary::rollout::api::{LAST_COMMENT_ANNOTATION, PROMOTE_ANNOTATION};
    use std::sync::Arc;

    let scenario = Scenario::new("command-retried").await;
    let paused = PausedForAPromote::new(&scenario).await;
    let fake = &paused.fake;
    let fence = Fence(Arc::new(|app: &str| app == "echo-app"));
    let parts = ReporterParts::new(fake, scenario.client.clone()).await;
    let reporter = parts.reporter(&fence);
    let report = paused.report(&scenario.ns);

    // Every permission asked in this look fails (the gate's look asks too).
    fake.fail_next("/collaborators/alice/permission", usize::MAX);
    assert!(!reporter.report(&report).await, "nothing handed over");
    assert!(
        fake.count("GET", "/collaborators/alice/permission") >= 1,
        "the permission was asked"
    );
    assert_eq!(paused.annotation(PROMOTE_ANNOTATION).await, None);
    assert_eq!(
        paused.annotation(LAST_COMMENT_ANNOTATION).await,
        None,
        "not noted as handled"
    );

    fake.fail_next("/collaborators/alice/permission", 0);
    assert!(reporter.report(&report).await, "handed over at the next look");
    let promote = paused.annotation(PROMOTE_ANNOTATION).await.expect("the promote");
    assert!(
        promote.contains(&format!("comment {} by @alice", paused.command)),
        "{promote}"
    );
    assert_eq!(
        paused.annotation(LAST_COMMENT_ANNOTATION).await,
        Some(paused.command.to_string()),
        "noted as handled once handed over"
    );
}

/// Replicas started with another `--shards`, and an agent without it that
/// came later, act for no app while the first configuration holds the
/// shards: no app is ever mapped to two holders.
#[tokio::test]
async fn a_replica_of_another_shard_count_and_a_later_unsharded_leader_act_for_nothing() {
    let scenario = Scenario::new("shard-counts").await;
    write_apps(&scenario, "1", None);
    scenario.repo.commit_and_push("thirty apps");
    let a = replica(&scenario, "replica-a");
    eventually("a holds every shard", WAIT, || async {
        (held(&a).await.len() == SHARDS as usize).then_some(())
    })
    .await;
    let b = replica_with(&scenario, "replica-b", 4, &[], &[]);
    eventually("b says why it holds nothing", WAIT, || async {
        let log = b.log_text();
        (log.contains("replica-a holds e2e-") && log.contains("with --shards 6, this replica has --shards 4"))
            .then_some(())
    })
    .await;
    let cache = scenario.cache.path().join("replica-c");
    std::fs::create_dir_all(&cache).expect("a cache of its own");
    let c = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        &cache,
        &["--leader-identity", "replica-c", "--lease-duration", "4"],
        &[],
    );
    eventually("c waits for the sharded replicas", WAIT, || async {
        c.log_text()
            .contains("this agent leads only once they expire")
            .then_some(())
    })
    .await;
    // A change of every app: a alone applies it, its share untouched by b.
    write_apps(&scenario, "2", None);
    scenario.repo.commit_and_push("every app changes");
    for i in 0..APPS {
        let app = format!("app-{i:02}");
        eventually(&format!("{app} applied"), WAIT, || async {
            (version(&scenario, &app).await.as_deref() == Some("2")).then_some(())
        })
        .await;
    }
    assert_eq!(held(&a).await.len(), SHARDS as usize);
    assert_eq!((held(&b).await, apps(&b).await), (BTreeSet::new(), 0));
    assert_eq!(c.counter("gitcanary_apps_planned_total").await, 0, "c never led");
    assert!(!c.log_text().contains("leading: this agent acts"));
}

/// A release under way on a replica that dies is finished by the replica
/// that takes its shard: one release comment on the change's pull request
/// and one promotion commit in Git, as when a leader dies.
#[tokio::test]
async fn a_release_on_a_killed_replicas_shard_is_finished_by_another_with_one_comment_and_one_commit() {
    use gitcanary::rollout::api::{Phase, Rollout};
    let scenario = Scenario::new("shards-release").await;
    let fake = support::github::GitHubFake::start_for(&scenario.repo.bare).await;
    let steps = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {duration: 6}}\n      - {replicas: 2, pause: {duration: 2}}\n";
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, "1.0", steps);
    scenario.repo.commit_and_push("echo 1.0");
    let start = |identity: &str| {
        let github = ["--github-url", fake.url.as_str(), "--github-repo", "acme/apps"];
        replica_with(
            &scenario,
            identity,
            2,
            &github,
            &[("GITCANARY_GITHUB_TOKEN", "ghp_test_token")],
        )
    };
    let mut replicas = [start("replica-a"), start("replica-b")];
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let status = || async { rollouts.get_opt("echo").await.ok().flatten()?.status };
    eventually("healthy on 1.0", WAIT, || async {
        (status().await?.phase == Phase::Healthy).then_some(())
    })
    .await;
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, "2.0", steps);
    let released = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&released, 7);
    eventually("the release runs", WAIT, || async {
        let status = status().await?;
        (status.phase == Phase::Progressing && status.canary_status?.current_step_index == 1).then_some(())
    })
    .await;
    let shard = gitcanary::shards::shard_of("echo", 2);
    let mut holder = None;
    for (i, replica) in replicas.iter().enumerate() {
        let held = replica
            .counter(&format!("gitcanary_shard_held{{shard=\"{shard}\"}}"))
            .await;
        if held == 1 {
            holder = Some(i);
        }
    }
    let holder = holder.expect("a replica holds echo's shard");
    replicas[holder].kill();
    let finished = eventually("the other replica promotes 2.0", WAIT, || async {
        let status = status().await?;
        (status.phase == Phase::Healthy && status.stable_commit == released).then_some(status)
    })
    .await;
    assert_eq!(finished.step_history.len(), 2, "{:?}", finished.step_history);
    let id = &released[..7];
    let (_, message) = scenario
        .wait_for_commit("the promotion's status commit", |m| {
            m.starts_with("promote(") && m.contains(id)
        })
        .await;
    let promotions = scenario
        .history()
        .iter()
        .filter(|(_, m)| m.starts_with("promote(") && m.contains(id))
        .count();
    assert_eq!(promotions, 1, "one promotion commit: {message}");
    let comments = eventually("the release comment says Healthy", WAIT, || async {
        let comments: Vec<_> = fake
            .comments_on(7)
            .into_iter()
            .filter(|(_, _, b)| b.contains("<!-- gitcanary:release"))
            .collect();
        comments
            .iter()
            .any(|(_, _, b)| b.contains("**Healthy**"))
            .then_some(comments)
    })
    .await;
    assert_eq!(comments.len(), 1, "one release comment, edited by both replicas");
}

/// A look that cannot read a pull request's comments (a 502) takes no
/// command at all, so that none written there is passed over by noting a
/// later one on another pull request as handled; the next look takes both,
/// oldest first.
#[tokio::test]
async fn a_look_that_cannot_read_the_comments_takes_no_command_and_the_next_does() {
    use gitcanary::model::Fence;
    use gitcanary::rollout::api::{ABORT_ANNOTATION, LAST_COMMENT_ANNOTATION, PROMOTE_ANNOTATION};
    use std::sync::Arc;

    let scenario = Scenario::new("comments-unread").await;
    let paused = PausedForAPromote::new(&scenario).await;
    let fake = &paused.fake;
    // The release is carried by pull request 6 too, where dave aborts after alice's promote on 5.
    fake.carry(paused.status["canaryCommit"].as_str().expect("a commit"), 6);
    fake.grant("dave", "write");
    let abort = fake.comment(6, "dave", "/gitcanary abort");
    let fence = Fence(Arc::new(|app: &str| app == "echo-app"));
    let parts = ReporterParts::new(fake, scenario.client.clone()).await;
    let reporter = parts.reporter(&fence);
    let report = paused.report(&scenario.ns);

    fake.fail_next("/issues/5/comments", usize::MAX);
    assert!(!reporter.report(&report).await, "nothing handed over");
    assert!(
        fake.count("GET", "/issues/5/comments") >= 1,
        "the comments were asked for"
    );
    assert_eq!(paused.annotation(PROMOTE_ANNOTATION).await, None);
    assert_eq!(
        paused.annotation(ABORT_ANNOTATION).await,
        None,
        "6's later command waits too"
    );
    assert_eq!(
        paused.annotation(LAST_COMMENT_ANNOTATION).await,
        None,
        "not noted as handled"
    );

    fake.fail_next("/issues/5/comments", 0);
    assert!(reporter.report(&report).await, "handed over at the next look");
    let promote = paused.annotation(PROMOTE_ANNOTATION).await.expect("the promote");
    assert!(
        promote.contains(&format!("comment {} by @alice", paused.command)),
        "{promote}"
    );
    let aborted = paused.annotation(ABORT_ANNOTATION).await.expect("the abort");
    assert!(aborted.contains(&format!("comment {abort} by @dave")), "{aborted}");
    assert_eq!(
        paused.annotation(LAST_COMMENT_ANNOTATION).await,
        Some(abort.to_string())
    );
}
