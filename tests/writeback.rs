//! The outcome of a release written back to Git: a status file on promote,
//! a revert commit on failure, idempotent and safe against racing pushes.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use support::agent::{AgentProcess, Scenario};
use support::{eventually, run};

const WAIT: Duration = Duration::from_secs(90);

fn app(scenario: &Scenario, image: &str, never_ready: bool) {
    let ns = &scenario.ns;
    let extra = if never_ready {
        ", gitcanary.test/never-ready: \"true\""
    } else {
        ""
    };
    scenario.repo.write(
        "echo/deployment.yaml",
        &format!("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: echo}}\n  template:\n    metadata:\n      labels: {{app: echo{extra}}}\n    spec:\n      containers:\n      - name: echo\n        image: registry.test/echo:{image}\n"),
    );
    scenario.repo.write(
        "echo/rollout.yaml",
        &format!("apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: echo}}\n  strategy:\n    canary:\n      steps:\n      - {{replicas: 1, pause: {{duration: 1}}}}\n      progressDeadline: 3s\n"),
    );
}

async fn status(scenario: &Scenario) -> Option<gitcanary::rollout::api::RolloutStatus> {
    Api::<Rollout>::namespaced(scenario.client.clone(), &scenario.ns)
        .get_opt("echo")
        .await
        .ok()
        .flatten()?
        .status
}

async fn image(scenario: &Scenario) -> Option<String> {
    Api::<Deployment>::namespaced(scenario.client.clone(), &scenario.ns)
        .get_opt("echo")
        .await
        .ok()
        .flatten()?
        .spec?
        .template
        .spec?
        .containers[0]
        .image
        .clone()
}

async fn healthy_on(scenario: &Scenario, tag: &str) {
    eventually("healthy", WAIT, || async {
        let ok = status(scenario).await?.phase == Phase::Healthy
            && image(scenario).await.as_deref() == Some(&format!("registry.test/echo:{tag}") as &str);
        ok.then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_promoted_release_writes_its_status_file_to_git_and_starts_nothing() {
    let scenario = Scenario::new("wb-promote").await;
    app(&scenario, "1.0", false);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = scenario.start_agent();
    healthy_on(&scenario, "1.0").await;
    app(&scenario, "2.0", false);
    let released = scenario.repo.commit_and_push("echo 2.0");
    healthy_on(&scenario, "2.0").await;

    let key = format!("{}/echo", scenario.ns);
    let (commit, message) = scenario
        .wait_for_commit("the promote commit", |m| m.starts_with(&format!("promote({key})")))
        .await;
    assert!(message.contains(&format!("Gitcanary-Rollout: {key}")), "{message}");
    assert!(
        message.contains(&format!("Gitcanary-Promotes: {released}")),
        "{message}"
    );
    let author = scenario.git(&["log", "-1", "--format=%an <%ae>", &commit]);
    assert_eq!(author.trim(), "gitcanary <gitcanary@localhost>");
    let file = scenario.git(&["show", &format!("main:.gitcanary/status/{}/echo.yaml", scenario.ns)]);
    assert!(file.contains("outcome: promoted"), "{file}");
    assert!(file.contains(&format!("stableCommit: {released}")), "{file}");
    assert!(file.contains("registry.test/echo:2.0"), "{file}");
    assert!(file.contains("passedBy: pause of 1s"), "{file}");

    // The status commit is not a release, and the pending entry is cleared.
    eventually("write-back marked done", WAIT, || async {
        status(&scenario).await?.pending_writeback.is_none().then_some(())
    })
    .await;
    agent.resyncs(2).await;
    let status = status(&scenario).await.expect("status");
    assert_eq!(status.phase, Phase::Healthy);
    assert_eq!(status.stable_commit, released);
    let promotes = scenario
        .history()
        .iter()
        .filter(|(_, m)| m.starts_with("promote("))
        .count();
    assert_eq!(promotes, 1);
}

#[tokio::test]
async fn a_failed_release_is_reverted_in_git_even_when_pushes_race_the_agent() {
    let scenario = Scenario::new("wb-revert").await;
    app(&scenario, "1.0", false);
    let stable = scenario.repo.commit_and_push("echo 1.0");
    // Over HTTP, as a real remote: receive-pack updates the branch only if it
    // still is what the pusher saw. (libgit2's file:// transport checks, then
    // writes, so a push racing it there can be lost; see README, Limits.)
    let url = scenario.repo.http_url();
    let _agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--repo", &url],
        &[],
    );
    healthy_on(&scenario, "1.0").await;
    let stable_manifest = scenario.git(&["show", "main:echo/deployment.yaml"]);

    app(&scenario, "2.0-broken", true);
    let broken = scenario.repo.commit_and_push("echo 2.0 (broken)");

    // Four people push 20 unrelated commits from their own clones while the
    // agent writes back; like the agent, each rebases onto whatever won the
    // race and tries again, and never forces.
    let pushers: Vec<_> = (0..4)
        .map(|person| {
            let url = url.clone();
            std::thread::spawn(move || {
                let clone = tempfile::tempdir().expect("a clone");
                run(clone.path(), "git", &["clone", "-q", &url, "."]);
                run(
                    clone.path(),
                    "git",
                    &["config", "user.email", &format!("p{person}@example.test")],
                );
                run(
                    clone.path(),
                    "git",
                    &["config", "user.name", &format!("Person {person}")],
                );
                let mut mine = Vec::new();
                for i in 0..5 {
                    let note = format!("note {person}-{i}");
                    std::fs::write(clone.path().join(format!("notes-{person}-{i}.txt")), &note).expect("write");
                    run(clone.path(), "git", &["add", "-A"]);
                    run(clone.path(), "git", &["commit", "-qm", &note]);
                    let pushed = (0..40).any(|_| {
                        run(clone.path(), "git", &["pull", "-q", "--rebase", "origin", "main"]);
                        std::process::Command::new("git")
                            .args(["push", "-q", "origin", "HEAD:main"])
                            .current_dir(clone.path())
                            .output()
                            .is_ok_and(|o| o.status.success())
                    });
                    assert!(pushed, "{note} never got through");
                    mine.push(note);
                    std::thread::sleep(Duration::from_millis(700));
                }
                mine
            })
        })
        .collect();
    let theirs: Vec<String> = pushers.into_iter().flat_map(|p| p.join().expect("a pusher")).collect();
    assert_eq!(theirs.len(), 20);

    let key = format!("{}/echo", scenario.ns);
    let (revert, message) = scenario
        .wait_for_commit("the revert commit", |m| m.starts_with(&format!("revert({key})")))
        .await;
    assert!(
        message.starts_with(&format!("revert({key}): canary pods not ready within 3s")),
        "{message}"
    );
    // The release is of the commit that changed the app, whatever landed on top.
    let reverted = message
        .lines()
        .find_map(|l| l.strip_prefix("Gitcanary-Reverts: "))
        .expect("a Gitcanary-Reverts trailer")
        .to_string();
    assert_eq!(reverted, broken);
    assert!(message.contains(&format!("Gitcanary-Rollout: {key}")), "{message}");
    assert_eq!(
        scenario.git(&["show", &format!("{revert}:echo/deployment.yaml")]),
        stable_manifest
    );

    // Every commit survives: nothing was forced.
    let messages: Vec<String> = scenario.history().into_iter().map(|(_, m)| m).collect();
    for note in &theirs {
        assert!(messages.iter().any(|m| m == note), "{note} was lost");
    }
    assert!(messages.iter().any(|m| m == "echo 2.0 (broken)"));
    run(scenario.repo.path(), "git", &["fetch", "-q", "origin"]);
    let ancestry = std::process::Command::new("git")
        .args(["merge-base", "--is-ancestor", &stable, "origin/main"])
        .current_dir(scenario.repo.path())
        .status()
        .expect("git runs");
    assert!(ancestry.success());

    // Git asks for the stable version again: healthy, and nothing more to roll back.
    healthy_on(&scenario, "1.0").await;
    let reverts = scenario
        .history()
        .iter()
        .filter(|(_, m)| m.starts_with("revert("))
        .count();
    assert_eq!(reverts, 1);
    let (code, stdout, stderr) = scenario.diff();
    assert_eq!(code, 0, "{stdout}{stderr}");
}

#[tokio::test]
async fn an_agent_restarted_before_it_recorded_its_commit_does_not_commit_again() {
    let scenario = Scenario::new("wb-restart").await;
    app(&scenario, "1.0", false);
    scenario.repo.commit_and_push("echo 1.0");
    let mut agent = scenario.start_agent();
    healthy_on(&scenario, "1.0").await;
    app(&scenario, "2.0-broken", true);
    scenario.repo.commit_and_push("echo 2.0 (broken)");
    let key = format!("{}/echo", scenario.ns);
    scenario
        .wait_for_commit("the revert commit", |m| m.starts_with(&format!("revert({key})")))
        .await;
    eventually("write-back marked done", WAIT, || async {
        status(&scenario).await?.pending_writeback.is_none().then_some(())
    })
    .await;
    agent.kill();

    // As if the agent died between its push and its status update.
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let mut status = rollouts.get("echo").await.expect("rollout").status.expect("status");
    status.pending_writeback = Some(gitcanary::rollout::api::PendingWriteback {
        action: gitcanary::rollout::api::WritebackAction::Revert,
        rollout_id: "again".into(),
        stable_commit: String::new(),
        canary_commit: scenario
            .history()
            .iter()
            .find(|(_, m)| m == "echo 2.0 (broken)")
            .expect("broken commit")
            .0
            .clone(),
        cause: "replayed".into(),
        at: String::new(),
    });
    let body = serde_json::json!({"apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout", "status": status});
    rollouts
        .patch_status("echo", &PatchParams::apply("gitcanary").force(), &Patch::Apply(&body))
        .await
        .expect("status replaced");

    let _agent = scenario.start_agent();
    eventually("the replayed write-back is marked done", WAIT, || async {
        let status = rollouts.get("echo").await.ok()?.status?;
        status.pending_writeback.is_none().then_some(())
    })
    .await;
    let reverts = scenario
        .history()
        .iter()
        .filter(|(_, m)| m.starts_with("revert("))
        .count();
    assert_eq!(reverts, 1, "found by its trailers, not committed twice");
}

/// Moves `main` the first time anyone pushes, as if another push won the
/// race between gitcanary's fetch and its push.
fn race_the_first_push(bare: &std::path::Path) {
    let hook = bare.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        r#"#!/bin/sh
[ -f "$GIT_DIR/raced" ] && exit 0
touch "$GIT_DIR/raced"
unset GIT_QUARANTINE_PATH GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES
parent=$(git rev-parse refs/heads/main)
new=$(echo "won the race" | GIT_AUTHOR_NAME=Carol GIT_AUTHOR_EMAIL=carol@example.test GIT_COMMITTER_NAME=Carol GIT_COMMITTER_EMAIL=carol@example.test git commit-tree "$parent^{tree}" -p "$parent")
git update-ref refs/heads/main "$new" "$parent"
exit 0
"#,
    )
    .expect("hook written");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("hook executable");
}

#[tokio::test]
async fn a_push_that_loses_the_race_is_rebuilt_on_the_new_head_and_never_forced() {
    use gitcanary::rollout::api::{PendingWriteback, RolloutStatus, WritebackAction};
    use gitcanary::source::{Credentials, GitSource};
    use gitcanary::writeback::{Author, Outcome, Request, Writer};

    // Over HTTP, so the server runs its hooks as a real Git host does.
    let server = support::git_server::GitServer::start(None).await;
    let repo = server.create_repo("apps");
    repo.write("echo/app.yaml", "image: 1.0\n");
    let stable = repo.commit_and_push("1.0");
    repo.write("echo/app.yaml", "image: 2.0\n");
    let canary = repo.commit_and_push("2.0");
    race_the_first_push(&repo.bare);
    let bare = repo.bare.to_str().expect("utf-8").to_string();

    let cache = tempfile::tempdir().expect("cache");
    let git = GitSource::new(repo.http_url(), "main", "", Credentials::default(), cache.path());
    let request = Request {
        namespace: "demo".into(),
        name: "echo".into(),
        app: "echo".into(),
        pending: PendingWriteback {
            action: WritebackAction::Revert,
            rollout_id: "r1".into(),
            stable_commit: stable.clone(),
            canary_commit: canary.clone(),
            cause: "aborted".into(),
            at: String::new(),
        },
        status: RolloutStatus::default(),
        images: Vec::new(),
    };
    let (outcome, again) = tokio::task::spawn_blocking(move || {
        let writer = Writer {
            git: &git,
            author: Author::default(),
            status_branch: None,
        };
        (writer.write(&request), writer.write(&request))
    })
    .await
    .expect("no panic");
    let Outcome::Committed { commit, attempts, .. } = outcome.expect("written") else {
        panic!("expected a commit")
    };
    assert_eq!(attempts, 2, "the first push lost the race");
    let log = run(repo.path(), "git", &["--git-dir", &bare, "log", "--format=%s", "main"]);
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        vec!["revert(demo/echo): aborted", "won the race", "2.0", "1.0"]
    );
    let content = run(
        repo.path(),
        "git",
        &["--git-dir", &bare, "show", &format!("{commit}:echo/app.yaml")],
    );
    assert_eq!(content, "image: 1.0\n");
    // Run again: found by its trailers, not committed twice.
    assert_eq!(again.expect("idempotent"), Outcome::AlreadyInGit { commit });
}
