//! Git as the state of record: a Rollout with no status (a rebuilt cluster,
//! a re-created Rollout) reads its status file back from Git.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout, StepState};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, DeleteParams};
use support::agent::{AgentProcess, Scenario, write_echo_app};
use support::{eventually, signing_key};

const WAIT: Duration = Duration::from_secs(90);
const PAUSED: &str = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {}}\n";

async fn image(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??
        .spec?
        .template
        .spec?
        .containers[0]
        .image
        .clone()
}

async fn rollout(client: &Client, ns: &str, name: &str) -> Option<Rollout> {
    Api::<Rollout>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()?
}

/// The stable Deployment runs `stable`, a canary of `canary` waits at step 1,
/// and the Rollout says it resumed from Git.
async fn resumed_release(client: &Client, ns: &str, stable: &str, canary: &str) -> Rollout {
    eventually(&format!("stable {stable}, canary {canary} paused"), WAIT, || async {
        let stable_ok = image(client, ns, "echo").await? == format!("registry.test/echo:{stable}");
        let canary_ok = image(client, ns, "echo-canary").await? == format!("registry.test/echo:{canary}");
        let rollout = rollout(client, ns, "echo").await?;
        let status = rollout.status.clone()?;
        let paused =
            status.phase == Phase::Paused && status.canary_status.as_ref()?.current_step_state == StepState::StepPaused;
        (stable_ok && canary_ok && paused && !status.resumed_from_git.is_empty()).then_some(rollout)
    })
    .await
}

/// A control plane built anew, with the scenario's namespace and a fresh
/// agent on the same repository.
struct Rebuilt {
    client: Client,
    agent: AgentProcess,
    _cache: tempfile::TempDir,
    _plane: support::DedicatedControlPlane,
}

impl Rebuilt {
    async fn start(scenario: &Scenario) -> Rebuilt {
        let plane = support::DedicatedControlPlane::start();
        let client = plane.with_namespace(&scenario.ns).await;
        let cache = tempfile::tempdir().expect("cache");
        let kubeconfig = plane.kubeconfig.display().to_string();
        let agent = AgentProcess::start_with(
            &scenario.repo,
            &scenario.ns,
            cache.path(),
            &["--kubeconfig", &kubeconfig],
            &[],
        );
        Rebuilt {
            client,
            agent,
            _cache: cache,
            _plane: plane,
        }
    }
}

fn promote(scenario: &Scenario) {
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
}

/// 1.0 Healthy, then 2.0 released, promoted and recorded in Git by the
/// agent (stopped afterwards). Returns the commit of 2.0.
async fn promoted_2_0(scenario: &Scenario) -> String {
    promoted_2_0_with(scenario, &[]).await
}

/// [`promoted_2_0`], the agent started with `args`.
async fn promoted_2_0_with(scenario: &Scenario, args: &[&str]) -> String {
    let ns = &scenario.ns;
    write_echo_app(&scenario.repo, ns, "1.0", PAUSED);
    scenario.repo.commit_and_push("echo 1.0");
    let mut agent = AgentProcess::start_with(&scenario.repo, ns, scenario.cache.path(), args, &[]);
    eventually("healthy on 1.0", WAIT, || async {
        (rollout(&scenario.client, ns, "echo").await?.status?.phase == Phase::Healthy).then_some(())
    })
    .await;
    write_echo_app(&scenario.repo, ns, "2.0", PAUSED);
    let released = scenario.repo.commit_and_push("echo 2.0");
    eventually("2.0 paused at step 1", WAIT, || async {
        (rollout(&scenario.client, ns, "echo").await?.status?.phase == Phase::Paused).then_some(())
    })
    .await;
    promote(scenario);
    eventually("2.0 promoted and recorded in Git", WAIT, || async {
        let record = scenario.try_git(&["show", &format!("main:.gitcanary/status/{ns}/echo.yaml")])?;
        record.contains(&format!("stableCommit: {released}")).then_some(())
    })
    .await;
    assert!(agent.terminate(), "the agent stops");
    released
}

#[tokio::test]
async fn a_rebuilt_cluster_and_a_recreated_rollout_run_the_promoted_version_and_release_the_newer_one() {
    let scenario = Scenario::new("record-rebuild").await;
    let ns = scenario.ns.clone();
    let released = promoted_2_0(&scenario).await;

    // 3.0 is pushed while nothing runs, and the Rollout loses its status.
    write_echo_app(&scenario.repo, &ns, "3.0", PAUSED);
    scenario.repo.commit_and_push("echo 3.0");
    Api::<Rollout>::namespaced(scenario.client.clone(), &ns)
        .delete("echo", &DeleteParams::default())
        .await
        .expect("Rollout deleted");
    let _agent = scenario.start_agent();
    let recreated = resumed_release(&scenario.client, &ns, "2.0", "3.0").await;
    let status = recreated.status.expect("status");
    assert_eq!(status.stable_commit, released);
    assert_eq!(status.resumed_from_git, format!(".gitcanary/status/{ns}/echo.yaml"));
    let (_, shown, _) = scenario.run_cli(&["status", "echo", "-n", &ns]);
    assert!(shown.contains("resumed from Git"), "{shown}");

    // A cluster built anew from the same repository: 2.0 is stable, 3.0 is released.
    let rebuilt = Rebuilt::start(&scenario).await;
    let client = rebuilt.client.clone();
    let rebuilt = resumed_release(&client, &ns, "2.0", "3.0").await;
    assert_eq!(rebuilt.status.expect("status").stable_commit, released);
}

#[tokio::test]
async fn a_held_failure_recorded_in_git_is_not_released_again_on_a_rebuilt_cluster() {
    let scenario = Scenario::new("record-hold").await;
    let ns = scenario.ns.clone();
    let hold = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {duration: 1}}\n      progressDeadline: 3s\n      onFailure: hold\n";
    write_echo_app(&scenario.repo, &ns, "2.0", hold);
    scenario.repo.commit_and_push("echo 2.0");
    let mut agent = scenario.start_agent();
    eventually("healthy on 2.0", WAIT, || async {
        (rollout(&scenario.client, &ns, "echo").await?.status?.phase == Phase::Healthy).then_some(())
    })
    .await;
    write_echo_app(&scenario.repo, &ns, "3.0", hold);
    let deployment = scenario.repo.path().join("echo/deployment.yaml");
    let text = std::fs::read_to_string(&deployment).expect("read").replace(
        "labels: {app: echo}\n    spec",
        "labels: {app: echo, gitcanary.test/never-ready: \"true\"}\n    spec",
    );
    std::fs::write(&deployment, text).expect("write");
    let failed = scenario.repo.commit_and_push("echo 3.0, never ready");
    let record = eventually("the held failure recorded in Git", WAIT, || async {
        let record = scenario.try_git(&["show", &format!("main:.gitcanary/status/{ns}/echo.yaml")])?;
        (record.contains("outcome: failed") && record.contains(&format!("failedCommit: {failed}"))).then_some(record)
    })
    .await;
    assert!(record.contains("not ready within 3s"), "{record}");
    assert!(
        !scenario.history().iter().any(|(_, m)| m.contains("Gitcanary-Reverts")),
        "hold does not revert"
    );
    assert!(agent.terminate());

    let rebuilt = Rebuilt::start(&scenario).await;
    let (client, fresh_agent) = (rebuilt.client.clone(), &rebuilt.agent);
    let status = eventually("the rebuilt cluster holds 2.0", WAIT, || async {
        let status = rollout(&client, &ns, "echo").await?.status?;
        let stable = image(&client, &ns, "echo").await? == "registry.test/echo:2.0";
        (status.phase == Phase::Failed && stable).then_some(status)
    })
    .await;
    let message = status.canary_status.expect("canary status").message;
    assert!(
        message.contains("not released again while Git asks for it"),
        "{message}"
    );
    fresh_agent.resyncs(2).await;
    assert!(
        image(&client, &ns, "echo-canary").await.is_none(),
        "3.0 is not released"
    );
    assert_eq!(
        image(&client, &ns, "echo").await.as_deref(),
        Some("registry.test/echo:2.0")
    );
}

#[tokio::test]
async fn a_corrupt_status_file_is_a_problem_of_the_app_and_nothing_is_released() {
    let scenario = Scenario::new("record-corrupt").await;
    let ns = scenario.ns.clone();
    write_echo_app(&scenario.repo, &ns, "3.0", PAUSED);
    scenario.repo.write(
        &format!(".gitcanary/status/{ns}/echo.yaml"),
        "rollout: somebody-else/echo\noutcome: promoted\nrolloutID: x\nstableCommit: main\n",
    );
    scenario
        .repo
        .commit_and_push("echo 3.0 and a status file from elsewhere");
    let (code, stdout, stderr) = scenario.sync_once(&[]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("echo/rollout.yaml:1:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains(&format!(".gitcanary/status/{ns}/echo.yaml cannot be read")),
        "{line}"
    );
    assert!(line.contains("somebody-else/echo"), "{line}");
    assert!(
        image(&scenario.client, &ns, "echo").await.is_none(),
        "nothing of the app is applied"
    );
}

#[tokio::test]
async fn a_hand_edited_status_file_naming_an_unmerged_commit_is_not_trusted() {
    let scenario = Scenario::new("record-forged").await;
    let ns = scenario.ns.clone();
    let released = promoted_2_0(&scenario).await;
    let file = format!(".gitcanary/status/{ns}/echo.yaml");

    // An insider commits web:evil on a scratch branch, then points the
    // status file on main at that commit by hand.
    let repo = scenario.repo.path();
    support::run(repo, "git", &["pull", "-q", "--rebase", "origin", "main"]);
    support::run(repo, "git", &["checkout", "-q", "-b", "scratch"]);
    write_echo_app(&scenario.repo, &ns, "evil", PAUSED);
    support::run(repo, "git", &["commit", "-qam", "scratch"]);
    let evil = support::run(repo, "git", &["rev-parse", "HEAD"]).trim().to_string();
    support::run(repo, "git", &["push", "-q", "origin", "scratch"]);
    support::run(repo, "git", &["checkout", "-q", "main"]);
    let record = std::fs::read_to_string(repo.join(&file)).expect("status file");
    scenario.repo.write(
        &file,
        &record.replace(&format!("stableCommit: {released}"), &format!("stableCommit: {evil}")),
    );
    scenario.repo.commit_and_push("status: fix stable commit");
    for delete in [
        Api::<Rollout>::namespaced(scenario.client.clone(), &ns)
            .delete("echo", &DeleteParams::default())
            .await
            .map(|_| ()),
        Api::<Deployment>::namespaced(scenario.client.clone(), &ns)
            .delete("echo", &DeleteParams::default())
            .await
            .map(|_| ()),
    ] {
        delete.expect("deleted");
    }

    let (code, stdout, stderr) = scenario.sync_once(&[]);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("echo/rollout.yaml:1:"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains(&format!("{file} is not trusted")), "{line}");
    assert!(line.contains("is not gitcanary's write-back"), "{line}");
    assert_ne!(
        image(&scenario.client, &ns, "echo").await.as_deref(),
        Some("registry.test/echo:evil"),
        "the forged stable commit is never run"
    );
}

#[tokio::test]
async fn signed_status_commits_verify_with_git_and_only_an_allowed_key_is_trusted() {
    let scenario = Scenario::new("record-signed").await;
    let ns = scenario.ns.clone();
    let keys = tempfile::tempdir().expect("keys");
    let (key, allowed) = signing_key(keys.path(), "agent");
    let (_, elsewhere) = signing_key(keys.path(), "another");
    promoted_2_0_with(
        &scenario,
        &["--sign-status-key", &key, "--verify-status-signers", &allowed],
    )
    .await;

    // Git itself accepts the signature of the status commit.
    let file = format!(".gitcanary/status/{ns}/echo.yaml");
    let status_commit = scenario.git(&["log", "-1", "--format=%H", "main", "--", &file]);
    let verified = std::process::Command::new("git")
        .arg(format!("--git-dir={}", scenario.repo.bare.display()))
        .args([
            "-c",
            "gpg.format=ssh",
            "-c",
            &format!("gpg.ssh.allowedSignersFile={allowed}"),
        ])
        .args(["verify-commit", status_commit.trim()])
        .output()
        .expect("git runs");
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );

    // A Rollout with no status resumes from the signed record...
    Api::<Rollout>::namespaced(scenario.client.clone(), &ns)
        .delete("echo", &DeleteParams::default())
        .await
        .expect("Rollout deleted");
    let (code, stdout, stderr) =
        scenario.sync_once(&["--sign-status-key", &key, "--verify-status-signers", &elsewhere]);
    // ...but not when the key that signed it is not the one allowed.
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("{file} is not trusted: commit")) && stdout.contains("is not signed as gitcanary's"),
        "{stdout}"
    );
    let (code, _, stderr) = scenario.sync_once(&["--verify-status-signers", &allowed]);
    assert_eq!(code, 2, "verifying without signing is refused: {stderr}");
    let (code, stdout, stderr) = scenario.sync_once(&["--sign-status-key", &key, "--verify-status-signers", &allowed]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let status = rollout(&scenario.client, &ns, "echo")
        .await
        .and_then(|r| r.status)
        .expect("status");
    assert_eq!(status.resumed_from_git, file);
}
