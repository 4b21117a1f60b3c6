//! The faults a user asks about before trusting gitcanary: bad input of
//! every kind, hostile or broken webhooks, a Git remote that goes away, an
//! agent killed at every state of a release, an API server that stops.

mod support;

use std::path::Path;
use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout, RolloutStatus};
use gitcanary::source::webhook::sign;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use support::agent::{AgentProcess, Scenario, gitcanary};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);

fn configmap(ns: &str, name: &str, color: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  color: {color}\n")
}

/// Every file of `tests/corpus/` (and a document over the size limit, made
/// here): (name, content, expected line, expected text).
fn corpus(ns: &str) -> Vec<(String, String, u32, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut cases: Vec<(String, String, u32, String)> = std::fs::read_dir(&dir)
        .expect("tests/corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .expect("readable")
                .replace("NAMESPACE", ns);
            let expect = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# expect: "))
                .expect("an expect line");
            let (line, what) = expect.split_once(": ").expect("line: text");
            let name = path.file_stem().expect("a name").to_string_lossy().to_string();
            (
                name,
                text.clone(),
                line.parse().expect("a line number"),
                what.to_string(),
            )
        })
        .collect();
    let mut huge = format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: huge, namespace: {ns}}}\ndata:\n");
    for i in 0..90_000 {
        huge.push_str(&format!("  key{i:06}: \"{}\"\n", "x".repeat(40)));
    }
    cases.push(("huge-document".into(), huge, 1, "larger than".into()));
    cases.sort();
    assert!(cases.len() >= 11, "the corpus is all there");
    cases
}

#[tokio::test]
async fn every_bad_input_is_refused_with_its_file_and_line_and_nothing_of_its_app_is_applied() {
    let client = support::client().await;
    let ns = support::namespace(&client, "corpus").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for (i, (name, content, line, text)) in corpus(&ns).into_iter().enumerate() {
        let dir = tempfile::tempdir().expect("dir");
        for app in ["bad", "good"] {
            std::fs::create_dir_all(dir.path().join(app)).expect("mkdir");
        }
        std::fs::write(dir.path().join("bad/case.yaml"), &content).expect("write");
        std::fs::write(
            dir.path().join("bad/ok.yaml"),
            configmap(&ns, &format!("bad-ok-{i}"), "blue"),
        )
        .expect("write");
        std::fs::write(
            dir.path().join("good/ok.yaml"),
            configmap(&ns, &format!("good-{i}"), "blue"),
        )
        .expect("write");
        let output = sync_once(dir.path(), &format!("corpus-{ns}"), &ns);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(1), "{name}: {stdout}");
        let wanted = format!("bad/case.yaml:{line}: ");
        assert!(
            stdout.lines().any(|l| l.starts_with(&wanted) && l.contains(&text)),
            "{name}: no `{wanted}…{text}…` in:\n{stdout}"
        );
        assert!(
            configmaps.get_opt(&format!("bad-ok-{i}")).await.expect("get").is_none(),
            "{name}: nothing of the bad app is applied"
        );
        assert!(
            configmaps.get_opt(&format!("good-{i}")).await.expect("get").is_some(),
            "{name}: the other app still syncs"
        );
    }
}

/// The color the ConfigMap `settings` has in the cluster now.
async fn settings_color(scenario: &Scenario) -> Option<String> {
    let configmaps: Api<ConfigMap> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    support::color_of(&configmaps, "settings").await
}

/// `gitcanary sync --once` of a directory as the instance `instance`,
/// keeping its status in the namespace `ns`.
/// A plain counter or gauge of the agent's `/metrics`.
fn metric_of(addr: &str, name: &str) -> Option<u64> {
    let (_, text) = support::http(addr, "GET", "/metrics", &[], b"")?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<u64>().ok())
}

fn sync_once(dir: &Path, instance: &str, ns: &str) -> std::process::Output {
    gitcanary()
        .args(["sync", "--once", "--repo", &dir.display().to_string()])
        .args(["--kubeconfig", &support::kubeconfig().display().to_string()])
        .args(["--instance", instance, "--state-namespace", ns])
        .output()
        .expect("gitcanary runs")
}

/// A Service only the API server refuses (a port out of range: validation
/// cannot know), in `namespace`.
fn refused_service(namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: refused, namespace: {namespace}}}\nspec:\n  ports: [{{port: 99999}}]\n"
    )
}

/// `sync --once` of a new app the API server refuses: exit 1; its output.
fn sync_refused(dir: &Path, ns: &str) -> String {
    let output = sync_once(dir, &format!("take-back-{ns}"), ns);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    stdout
}

fn webhook_agent(scenario: &Scenario) -> AgentProcess {
    AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--poll-interval", "300"],
        &[("GITCANARY_WEBHOOK_SECRET", "s3cret")],
    )
}

#[tokio::test]
async fn broken_forged_replayed_and_oversized_webhooks_are_refused_and_the_agent_keeps_running() {
    let scenario = Scenario::new("webhooks").await;
    scenario
        .repo
        .write("web/settings.yaml", &configmap(&scenario.ns, "settings", "blue"));
    scenario.repo.commit_and_push("blue");
    let mut agent = webhook_agent(&scenario);
    let addr = agent.address().await;
    let color = || settings_color(&scenario);
    eventually("first sync", WAIT, || async {
        (color().await? == "blue").then_some(())
    })
    .await;

    scenario
        .repo
        .write("web/settings.yaml", &configmap(&scenario.ns, "settings", "green"));
    let commit = scenario.repo.commit_and_push("green");
    let push = format!("{{\"ref\":\"refs/heads/main\",\"after\":\"{commit}\"}}");
    let post = |body: &[u8], signature: Option<String>, delivery: &str| {
        let mut headers = vec![
            ("X-GitHub-Event", "push".to_string()),
            ("X-GitHub-Delivery", delivery.to_string()),
        ];
        if let Some(signature) = signature {
            headers.push(("X-Hub-Signature-256", signature));
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        support::http(&addr, "POST", "/webhook", &headers, body).map(|(status, _)| status)
    };
    assert_eq!(post(push.as_bytes(), None, "d-1"), Some(401), "unsigned");
    assert_eq!(
        post(push.as_bytes(), Some(sign(b"wrong", push.as_bytes())), "d-2"),
        Some(401),
        "forged"
    );
    let junk = b"{\"ref\": refs/heads/main";
    assert_eq!(
        post(junk, Some(sign(b"s3cret", junk)), "d-3"),
        Some(400),
        "malformed JSON"
    );
    let oversized = vec![b' '; 6 * 1024 * 1024];
    assert_eq!(
        post(&oversized, Some(sign(b"s3cret", &oversized)), "d-4"),
        Some(413),
        "over the 5 MiB limit"
    );
    // Whether a refused request wakes a sync is for the server's unit test,
    // which reads its trigger queue; a fixed wait here would prove less.

    assert_eq!(
        post(push.as_bytes(), Some(sign(b"s3cret", push.as_bytes())), "d-5"),
        Some(202)
    );
    eventually("the signed push syncs", WAIT, || async {
        (color().await? == "green").then_some(())
    })
    .await;
    assert_eq!(
        post(push.as_bytes(), Some(sign(b"s3cret", push.as_bytes())), "d-5"),
        Some(200),
        "a replayed delivery is acknowledged and ignored"
    );
    assert!(agent.is_running());
    assert_eq!(
        support::http(&addr, "GET", "/healthz", &[], b"").map(|r| r.0),
        Some(200)
    );
    assert!(agent.log_text().contains("a delivery seen before"));
}

#[tokio::test]
async fn a_git_remote_that_never_answers_fails_the_fetch_in_time_and_probes_still_answer() {
    let scenario = Scenario::new("git-hang").await;
    let hole = support::BlackHole::start();
    let url = format!("http://{}/apps.git", hole.addr);
    let agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--repo", &url, "--poll-interval", "5"],
        &[],
    );
    let addr = agent.address().await;
    // While the fetch hangs, the agent answers its probes.
    let (status, _) = support::http(&addr, "GET", "/healthz", &[], b"").expect("an answer");
    assert_eq!(status, 200);
    let metric = |name: &'static str| {
        let addr = addr.clone();
        async move { metric_of(&addr, name) }
    };
    eventually("the stalled fetch fails", WAIT, || async {
        (metric("gitcanary_git_fetch_errors_total").await? >= 1).then_some(())
    })
    .await;
    assert_eq!(metric("gitcanary_source_up").await, Some(0), "the metrics say why");
    let log = agent.log_text();
    assert!(log.contains("sync failed; the cluster keeps what it had"), "{log}");
    assert!(!log.contains("secret"), "{log}");
}

#[tokio::test]
async fn a_git_remote_that_goes_away_leaves_the_cluster_as_it_was_and_sync_resumes() {
    let scenario = Scenario::new("git-gone").await;
    scenario
        .repo
        .write("web/settings.yaml", &configmap(&scenario.ns, "settings", "blue"));
    scenario.repo.commit_and_push("blue");
    // Over HTTP, as a real remote.
    let agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--repo", &scenario.repo.http_url(), "--poll-interval", "1"],
        &[],
    );
    let addr = agent.address().await;
    let color = || settings_color(&scenario);
    eventually("first sync", WAIT, || async {
        (color().await? == "blue").then_some(())
    })
    .await;
    let metric = |name: &'static str| {
        let addr = addr.clone();
        async move { metric_of(&addr, name) }
    };
    assert_eq!(metric("gitcanary_source_up").await, Some(1));
    // At rest, a poll reads the branch's head and neither fetches nor syncs.
    let at_rest = || metric("gitcanary_git_polls_at_rest_total");
    eventually("a poll at rest", WAIT, || async {
        (at_rest().await? >= 1).then_some(())
    })
    .await;
    let syncs = || metric("gitcanary_sync_duration_seconds_count");
    let fetches = || metric("gitcanary_git_fetch_duration_seconds_count");
    let (syncs_at_rest, fetches_at_rest, polls) = (syncs().await, fetches().await, at_rest().await.unwrap_or(0));
    eventually("three more polls at rest", WAIT, || async {
        (at_rest().await? >= polls + 3).then_some(())
    })
    .await;
    assert_eq!(syncs().await, syncs_at_rest, "a poll at rest syncs nothing");
    assert_eq!(fetches().await, fetches_at_rest, "a poll at rest fetches nothing");

    let hidden = scenario.repo.bare.with_extension("gone");
    std::fs::rename(&scenario.repo.bare, &hidden).expect("the remote goes away");
    eventually("fetch errors are counted", WAIT, || async {
        (metric("gitcanary_git_fetch_errors_total").await? >= 2).then_some(())
    })
    .await;
    assert_eq!(metric("gitcanary_source_up").await, Some(0), "the metrics say why");
    assert!(agent.log_text().contains("sync failed; the cluster keeps what it had"));
    assert_eq!(color().await.as_deref(), Some("blue"), "the cluster keeps what it had");

    std::fs::rename(&hidden, &scenario.repo.bare).expect("the remote is back");
    scenario
        .repo
        .write("web/settings.yaml", &configmap(&scenario.ns, "settings", "green"));
    scenario.repo.commit_and_push("green");
    eventually("sync resumes", WAIT, || async {
        (color().await? == "green").then_some(())
    })
    .await;
    assert_eq!(metric("gitcanary_source_up").await, Some(1));
}

async fn rollout_status(scenario: &Scenario) -> Option<RolloutStatus> {
    Api::<Rollout>::namespaced(scenario.client.clone(), &scenario.ns)
        .get_opt("echo")
        .await
        .ok()
        .flatten()?
        .status
}

fn release_app(scenario: &Scenario, image: &str) {
    write_release(&scenario.repo, &scenario.ns, image, 2);
}

/// Deployment, Service, HTTPRoute and a three-step Rollout whose first two
/// steps pause for `pause` seconds.
fn write_release(repo: &support::git_server::GitRepo, ns: &str, image: &str, pause: u32) {
    let spec = format!(
        "  strategy:\n    canary:\n      steps:\n      - {{traffic: 20%, replicas: 1, pause: {{duration: {pause}}}}}\n      - {{traffic: 60%, replicas: 1, pause: {{duration: {pause}}}}}\n      - {{traffic: 100%}}\n      trafficRoutings:\n      - service: echo\n        gateway: {{httpRouteName: echo}}\n      gracePeriodSeconds: 2\n"
    );
    support::agent::write_echo_app(repo, ns, image, &spec);
}

/// Where a release is, in the order it gets there.
fn progress(status: &RolloutStatus, steps: u32) -> (u32, u32) {
    use gitcanary::rollout::api::StepState;
    let canary = status.canary_status.clone().unwrap_or_default();
    let rank = match canary.current_step_state {
        StepState::StepUpgrade => 0,
        StepState::StepTrafficRouting => 1,
        StepState::StepAnalysis | StepState::StepPaused => 2,
        StepState::StepReady => 3,
        StepState::Completed => 4,
    };
    match status.phase {
        Phase::Promoting => (steps + 1, 0),
        Phase::Healthy => (steps + 2, 0),
        _ => (canary.current_step_index, rank),
    }
}

#[tokio::test]
async fn an_agent_killed_at_every_state_of_a_release_ends_the_same_with_one_comment_and_one_commit() {
    use support::github::GitHubFake;
    let scenario = Scenario::new("kill-every-state").await;
    let fake = GitHubFake::start_for(&scenario.repo.bare).await;
    let start = || support::agent::github_agent(&scenario, &fake.url);
    release_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let mut agent = start();
    eventually("healthy on 1.0", WAIT, || async {
        (rollout_status(&scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;

    release_app(&scenario, "2.0");
    let released = scenario.repo.commit_and_push("echo 2.0");
    fake.carry(&released, 11);
    // Every state of a three-step release, then promoting.
    let targets: Vec<(u32, u32)> = (1..=3)
        .flat_map(|step| [(step, 0), (step, 1), (step, 2)])
        .chain([(4, 0)])
        .collect();
    let mut killed_at = Vec::new();
    for target in targets {
        let reached = eventually(&format!("state {target:?}"), WAIT, || async {
            let status = rollout_status(&scenario).await?;
            let ours = status.canary_commit == released || status.stable_commit == released;
            let at = progress(&status, 3);
            (ours && at >= target).then_some(at)
        })
        .await;
        if reached.0 > 4 {
            break;
        }
        agent.kill();
        killed_at.push(reached);
        agent = start();
    }
    assert!(killed_at.len() >= 6, "killed at {killed_at:?}");
    let done = eventually("promoted", WAIT, || async {
        let status = rollout_status(&scenario).await?;
        (status.phase == Phase::Healthy && status.stable_commit == released && status.pending_writeback.is_none())
            .then_some(status)
    })
    .await;
    let steps: Vec<u32> = done.step_history.iter().map(|r| r.step).collect();
    assert_eq!(steps, vec![1, 2, 3], "each step once, in order");
    let promotes = scenario
        .history()
        .iter()
        .filter(|(_, m)| m.contains(&format!("Gitcanary-Promotes: {released}")))
        .count();
    assert_eq!(promotes, 1, "one promote commit");
    eventually("the comment says promoted", WAIT, || async {
        fake.comments_on(11)
            .iter()
            .any(|(_, _, b)| b.contains("**Healthy**"))
            .then_some(())
    })
    .await;
    let comments = fake
        .comments_on(11)
        .into_iter()
        .filter(|(_, _, b)| b.contains("<!-- gitcanary:release"))
        .count();
    assert_eq!(comments, 1, "one release comment across {} agents", killed_at.len() + 1);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(scenario.client.clone(), &scenario.ns);
    eventually("the canary is gone", WAIT, || async {
        deployments.get_opt("echo-canary").await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_api_server_stopped_for_30_seconds_mid_release_only_delays_it() {
    let plane = support::DedicatedControlPlane::start();
    let client = plane.client().await;
    support::agent::install_rollout_crd_on(&client).await;
    let ns = support::namespace(&client, "apiserver-down").await;
    let server = support::git_server::GitServer::start(None).await;
    let repo = server.create_repo("apps");
    let cache = tempfile::tempdir().expect("cache");
    let kubeconfig = plane.kubeconfig.display().to_string();
    let start = || AgentProcess::start_with(&repo, &ns, cache.path(), &["--kubeconfig", &kubeconfig], &[]);
    write_release(&repo, &ns, "1.0", 4);
    repo.commit_and_push("echo 1.0");
    let mut agent = start();
    let rollouts: Api<Rollout> = Api::namespaced(client.clone(), &ns);
    let status = || async { rollouts.get_opt("echo").await.ok().flatten()?.status };
    // A fresh control plane takes a while to run its first pods.
    let healthy = tokio::time::timeout(Duration::from_secs(150), async {
        while status().await.is_none_or(|s| s.phase != Phase::Healthy) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        healthy.is_ok(),
        "not healthy on 1.0: {:?}\n{}",
        status().await,
        agent.log_text()
    );

    write_release(&repo, &ns, "2.0", 4);
    let released = repo.commit_and_push("echo 2.0");
    eventually("the release at step 1", WAIT, || async {
        let status = status().await?;
        (status.canary_commit == released && status.canary_status?.current_step_index == 1).then_some(())
    })
    .await;
    plane.component("stop", "kube-apiserver");
    tokio::time::sleep(Duration::from_secs(30)).await;
    plane.component("start", "kube-apiserver");
    eventually("the API server is back", WAIT, || async {
        rollouts.get_opt("echo").await.ok().flatten().map(|_| ())
    })
    .await;
    // In a real cluster kube-controller-manager and kube-scheduler lose their
    // leader lease in such an outage and are restarted. Here they run without
    // leader election and may keep informers stuck before the outage ("read
    // version ... is not as new as written version"), so they are restarted
    // as a cluster would: what is tested is gitcanary's recovery, not theirs.
    for component in ["kube-controller-manager", "kube-scheduler"] {
        plane.component("stop", component);
        plane.component("start", component);
    }
    // Unable to renew its Lease, the agent stopped acting and exited (so that
    // two agents never act at once); the Deployment's restart is played here.
    let restarted = !agent.is_running();
    if restarted {
        assert!(agent.log_text().contains("leadership lost"), "{}", agent.log_text());
        agent = start();
    }
    let promoted = || async {
        let status = status().await?;
        (status.phase == Phase::Healthy && status.stable_commit == released && status.pending_writeback.is_none())
            .then_some(status)
    };
    let waited = tokio::time::timeout(Duration::from_secs(150), async {
        loop {
            if let Some(done) = promoted().await {
                return done;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let done = waited.unwrap_or_else(|_| {
        panic!(
            "not promoted after the outage (agent restarted: {restarted})\n{}\n{}",
            agent.log_text(),
            plane.diagnosis()
        )
    });
    let steps: Vec<u32> = done.step_history.iter().map(|r| r.step).collect();
    assert_eq!(steps, vec![1, 2, 3], "each step once, in order");
    let history = support::run(
        repo.path(),
        "git",
        &[
            "--git-dir",
            &repo.bare.display().to_string(),
            "log",
            "--format=%B",
            "main",
        ],
    );
    assert_eq!(
        history.matches(&format!("Gitcanary-Promotes: {released}")).count(),
        1,
        "one promote commit"
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), &ns);
    eventually("the canary is gone", WAIT, || async {
        deployments.get_opt("echo-canary").await.ok()?.is_none().then_some(())
    })
    .await;
    drop(agent);
}

#[tokio::test]
async fn a_refused_new_app_writes_nothing_not_even_into_someone_elses_object() {
    let client = support::client().await;
    let ns = support::namespace(&client, "take-back").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let theirs: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shared", "namespace": ns}, "data": {"owner": "someone else"}
    }))
    .expect("a configmap");
    let before = configmaps
        .create(&kube::api::PostParams::default(), &theirs)
        .await
        .expect("created by someone else");
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("app")).expect("mkdir");
    // Shares an object someone else made, creates one, and has one only the
    // API server refuses.
    std::fs::write(dir.path().join("app/shared.yaml"), configmap(&ns, "shared", "blue")).expect("write");
    std::fs::write(dir.path().join("app/mine.yaml"), configmap(&ns, "mine", "blue")).expect("write");
    std::fs::write(dir.path().join("app/refused.yaml"), refused_service(&ns)).expect("write");
    let stdout = sync_refused(dir.path(), &ns);
    assert!(
        stdout.contains("app/refused.yaml:1: Service ") && stdout.contains("must be between 1 and 65535"),
        "{stdout}"
    );
    assert!(
        stdout.contains("app/shared.yaml:1: ConfigMap ")
            && stdout.contains("already exists and this instance does not manage it"),
        "{stdout}"
    );
    assert!(
        configmaps.get_opt("mine").await.expect("get").is_none(),
        "nothing is created"
    );
    let shared = configmaps
        .get_opt("shared")
        .await
        .expect("get")
        .expect("someone else's object stays");
    assert_eq!(
        shared.metadata.resource_version, before.metadata.resource_version,
        "someone else's object is never written"
    );
}

#[tokio::test]
async fn a_new_app_refused_past_its_dry_run_takes_back_only_what_it_created() {
    let client = support::client().await;
    let ns = support::namespace(&client, "take-back-late").await;
    let fresh = format!("{ns}-fresh");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("app")).expect("mkdir");
    // The refused Service lies in a namespace the app itself creates: it
    // cannot be dry-run before that namespace exists, so the API server
    // refuses it only when it is written, after the others.
    std::fs::write(
        dir.path().join("app/namespace.yaml"),
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {fresh}}}\n"),
    )
    .expect("write");
    std::fs::write(dir.path().join("app/mine.yaml"), configmap(&ns, "mine", "blue")).expect("write");
    std::fs::write(dir.path().join("app/refused.yaml"), refused_service(&fresh)).expect("write");
    let stdout = sync_refused(dir.path(), &ns);
    assert!(
        stdout.contains("app/refused.yaml:1: applying Service ") && stdout.contains("must be between 1 and 65535"),
        "{stdout}"
    );
    assert!(
        configmaps.get_opt("mine").await.expect("get").is_none(),
        "what it created is taken back"
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = namespaces.get_opt(&fresh).await.expect("get");
    assert!(
        namespace.is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "the namespace it created is taken back"
    );
}

#[tokio::test]
async fn a_crd_installed_by_hand_after_the_agent_started_is_picked_up() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let scenario = Scenario::new("late-crd").await;
    let suffix = scenario.ns.replace('-', "");
    let group = format!("{suffix}.example.com");
    scenario.repo.write(
        "gadgets/widget.yaml",
        &format!(
            "apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: one\n  namespace: {}\nspec:\n  size: 3\n",
            scenario.ns
        ),
    );
    scenario.repo.commit_and_push("a widget");
    let agent = scenario.start_agent();
    eventually("the unknown kind is reported", WAIT, || async {
        agent.log_text().contains("unknown kind Widget").then_some(())
    })
    .await;
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .expect("a CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(scenario.client.clone());
    crds.create(&kube::api::PostParams::default(), &crd)
        .await
        .expect("installed by hand");
    let resource = kube::discovery::ApiResource {
        group: group.clone(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: Api<kube::api::DynamicObject> = Api::namespaced_with(scenario.client.clone(), &scenario.ns, &resource);
    eventually("the widget is applied", WAIT, || async {
        widgets.get_opt("one").await.ok().flatten().map(|_| ())
    })
    .await;
    let _ = crds.delete(&format!("widgets.{group}"), &Default::default()).await;
}
