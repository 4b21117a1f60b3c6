//! Environments in waves: two clusters (the shared control plane as
//! staging, one of the test's own as production), each synced by its own
//! agent (`--cluster-name`, `--path`) from one repository. A release
//! promoted in staging opens the pull request that carries its images into
//! production's manifests; merging it runs production's own release, whose
//! gate the staging release's author may not pass. A release that fails in
//! staging reverts staging only and opens nothing.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::Api;
use support::agent::{AgentProcess, Scenario};
use support::eventually;
use support::git_server::GitRepo;
use support::github::{FakePull, GitHubFake};

const WAIT: Duration = Duration::from_secs(120);

const WAVES: &str = "environments:\n- name: staging\n  path: staging\n  cluster: staging\n- name: production\n  path: production\n  cluster: production\ncarry:\n  helmValues:\n  - {repository: image.repository, tag: image.tag}\n";

const STEPS: &str = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {duration: 1}}\n      progressDeadline: 10s\n";

/// Production's echo waits for an approval: its promotion pull request.
const GATED: &str = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {}}\n";

/// A plain-YAML app `echo` of `env`, its container at `image`; `labels` are
/// its pod template's.
fn write_echo(repo: &GitRepo, env: &str, ns: &str, image: &str, labels: &str) {
    repo.write(
        &format!("{env}/echo/deployment.yaml"),
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: echo}}\n  template:\n    metadata:\n      labels: {{{labels}}}\n    spec:\n      containers:\n      - name: echo\n        image: registry.test/echo:{image} # the {env} release\n"
        ),
    );
    repo.write(
        &format!("{env}/echo/rollout.yaml"),
        &format!(
            "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: echo}}\n{}",
            if env == "production" { GATED } else { STEPS }
        ),
    );
}

/// A Kustomize app `shop` of `env`: a base and the environment's overlay,
/// whose `images:` entry names `tag`.
fn write_shop(repo: &GitRepo, env: &str, ns: &str, tag: &str) {
    repo.write(
        &format!("{env}/shop/gitcanary.yaml"),
        &format!("kustomize:\n  path: overlays/{env}\n"),
    );
    repo.write(
        &format!("{env}/shop/base/kustomization.yaml"),
        "resources: [deployment.yaml, rollout.yaml]\n",
    );
    repo.write(
        &format!("{env}/shop/base/deployment.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: shop\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: shop}\n  template:\n    metadata:\n      labels: {app: shop}\n    spec:\n      containers:\n      - name: shop\n        image: registry.test/shop:0\n",
    );
    repo.write(
        &format!("{env}/shop/base/rollout.yaml"),
        &format!(
            "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: shop\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: shop}}\n{STEPS}"
        ),
    );
    repo.write(
        &format!("{env}/shop/overlays/{env}/kustomization.yaml"),
        &format!(
            "namespace: {ns}\nresources: [../../base]\nimages:\n- name: registry.test/shop\n  newTag: \"{tag}\" # {env}\n"
        ),
    );
}

/// A Helm chart `cart` of `env`, whose values name its image by
/// repository and tag.
fn write_cart(repo: &GitRepo, env: &str, ns: &str, tag: &str) {
    repo.write(
        &format!("{env}/cart/Chart.yaml"),
        "apiVersion: v2\nname: cart\nversion: 0.1.0\n",
    );
    repo.write(
        &format!("{env}/cart/values.yaml"),
        &format!("replicas: 1\nimage:\n  repository: registry.test/cart\n  tag: \"{tag}\" # the {env} release\n"),
    );
    repo.write(
        &format!("{env}/cart/templates/app.yaml"),
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: cart\n  namespace: {ns}\nspec:\n  replicas: {{{{ .Values.replicas }}}}\n  selector:\n    matchLabels: {{app: cart}}\n  template:\n    metadata:\n      labels: {{app: cart}}\n    spec:\n      containers:\n      - name: cart\n        image: \"{{{{ .Values.image.repository }}}}:{{{{ .Values.image.tag }}}}\"\n---\napiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: cart\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: cart}}\n{STEPS}"
        ),
    );
}

async fn rollout_phase(client: &Client, ns: &str, name: &str) -> Option<(Phase, String)> {
    let status = Api::<Rollout>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??
        .status?;
    Some((status.phase, status.stable_commit))
}

async fn image_of(client: &Client, ns: &str, name: &str) -> Option<String> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??;
    deployment.spec?.template.spec?.containers.first()?.image.clone()
}

/// Waits until the Rollout `name` is Healthy with `commit` stable.
async fn healthy_at(client: &Client, ns: &str, name: &str, commit: &str, place: &str) {
    eventually(&format!("{place}: {name} promoted at {commit}"), WAIT, || async {
        let (phase, stable) = rollout_phase(client, ns, name).await?;
        (phase == Phase::Healthy && stable == commit).then_some(())
    })
    .await;
}

/// The wave pull request of `rollout`'s release into production.
async fn wave_pull(fake: &GitHubFake, ns: &str, rollout: &str) -> FakePull {
    let prefix = format!("gitcanary/wave/production/staging/{ns}/{rollout}/");
    eventually(&format!("the wave pull request of {rollout}"), WAIT, || async {
        fake.pulls().into_iter().find(|p| p.head.starts_with(&prefix) && p.open)
    })
    .await
}

/// Commits and pushes what is written as `name <email>`.
fn commit_as(repo: &GitRepo, name: &str, email: &str, message: &str) -> String {
    let path = repo.path();
    support::run(path, "git", &["config", "user.name", name]);
    support::run(path, "git", &["config", "user.email", email]);
    let commit = repo.commit_and_push(message);
    support::run(path, "git", &["config", "user.name", "Test Author"]);
    support::run(path, "git", &["config", "user.email", "author@example.test"]);
    commit
}

/// The open promotion pull request of production's echo, other than `not`.
async fn production_gate(fake: &GitHubFake, ns: &str, not: Option<u64>) -> FakePull {
    let prefix = format!("gitcanary/promote/production/{ns}/echo/");
    eventually("production's promotion pull request", WAIT, || async {
        fake.pulls()
            .into_iter()
            .find(|p| p.head.starts_with(&prefix) && p.open && Some(p.number) != not)
    })
    .await
}

/// Production's echo Healthy with a stable commit other than `before`.
async fn promoted_after(client: &Client, ns: &str, before: &str) -> String {
    eventually("production's echo promoted", WAIT, || async {
        let (phase, stable) = rollout_phase(client, ns, "echo").await?;
        (phase == Phase::Healthy && stable != before).then_some(stable)
    })
    .await
}

/// The production cluster: a control plane of its own, the namespace, and
/// its agent on `production/`.
struct Production {
    client: Client,
    _agent: AgentProcess,
    _cache: tempfile::TempDir,
    _plane: support::DedicatedControlPlane,
}

impl Production {
    async fn start(scenario: &Scenario, github: &str) -> Production {
        let plane = support::DedicatedControlPlane::start();
        let client = plane.with_namespace(&scenario.ns).await;
        let cache = tempfile::tempdir().expect("cache");
        let kubeconfig = plane.kubeconfig.display().to_string();
        let agent = AgentProcess::start_with(
            &scenario.repo,
            &scenario.ns,
            cache.path(),
            &[
                "--kubeconfig",
                &kubeconfig,
                "--path",
                "production",
                "--cluster-name",
                "production",
                "--github-url",
                github,
                "--github-repo",
                "acme/apps",
                // Its gate is looked at often: the test waits on it.
                "--github-poll",
                "1",
                "--github-poll-max",
                "2",
            ],
            &[("GITCANARY_GITHUB_TOKEN", "ghp_test_token")],
        );
        Production {
            client,
            _agent: agent,
            _cache: cache,
            _plane: plane,
        }
    }
}

#[tokio::test]
async fn a_release_promoted_in_staging_opens_the_pull_request_that_releases_it_in_production() {
    let scenario = Scenario::new("waves").await;
    let (repo, ns) = (&scenario.repo, scenario.ns.as_str());
    let fake = GitHubFake::start_for(&repo.bare).await;
    for writer in ["dave", "alice", "carol"] {
        fake.grant(writer, "write");
    }
    repo.write("gitcanary.yaml", WAVES);
    for env in ["staging", "production"] {
        write_echo(repo, env, ns, "1.0.0", "app: echo");
        write_shop(repo, env, ns, "1.0.0");
        write_cart(repo, env, ns, "1.0.0");
    }
    let first = repo.commit_and_push("echo and shop 1.0.0 in staging and production");
    let production = Production::start(&scenario, &fake.url).await;
    let _staging = AgentProcess::start_with(
        repo,
        ns,
        scenario.cache.path(),
        &[
            "--path",
            "staging",
            "--cluster-name",
            "staging",
            "--github-url",
            &fake.url,
            "--github-repo",
            "acme/apps",
        ],
        &[("GITCANARY_GITHUB_TOKEN", "ghp_test_token")],
    );
    for name in ["echo", "shop", "cart"] {
        healthy_at(&scenario.client, ns, name, &first, "staging").await;
        healthy_at(&production.client, ns, name, &first, "production").await;
    }

    // 1.1.0 in staging only: staging's canaries run and promote.
    write_echo(repo, "staging", ns, "1.1.0", "app: echo");
    write_shop(repo, "staging", ns, "1.1.0");
    write_cart(repo, "staging", ns, "1.1.0");
    let release = repo.commit_and_push("echo, shop and cart 1.1.0 in staging");
    // Someone's branch already holds the name of echo's wave: it is never
    // built on, and the wave takes the next name.
    let taken = format!("gitcanary/wave/production/staging/{ns}/echo/{}", &release[..7]);
    let squatter = scenario.git(&["rev-parse", &format!("{release}~1")]).trim().to_string();
    support::run(
        repo.path(),
        "git",
        &["push", "-q", "origin", &format!("{squatter}:refs/heads/{taken}")],
    );
    for name in ["echo", "shop", "cart"] {
        healthy_at(&scenario.client, ns, name, &release, "staging").await;
    }

    // One wave pull request each, carrying the images as production writes them.
    let first_echo_wave = wave_pull(&fake, ns, "echo").await;
    assert_eq!(first_echo_wave.head, format!("{taken}-v2"), "the taken name is skipped");
    assert_eq!(
        scenario.git(&["rev-parse", &taken]).trim(),
        squatter,
        "the taken branch is left as it was"
    );
    let echo_wave = &first_echo_wave;
    let shop_wave = wave_pull(&fake, ns, "shop").await;
    let cart_wave = wave_pull(&fake, ns, "cart").await;
    assert_eq!(echo_wave.author, "gitcanary[bot]");
    assert!(
        echo_wave
            .body
            .contains("from **staging** into **production**: `registry.test/echo:1.1.0`"),
        "{}",
        echo_wave.body
    );
    assert!(echo_wave.body.contains("| 1 |"), "the steps passed: {}", echo_wave.body);
    assert!(
        echo_wave.body.contains("pause of 1s") || echo_wave.body.contains("timer"),
        "{}",
        echo_wave.body
    );
    let promote = scenario
        .history()
        .into_iter()
        .find(|(_, m)| m.contains(&format!("Gitcanary-Rollout: staging/{ns}/echo")) && m.starts_with("promote("))
        .expect("staging's promote commit");
    assert!(
        echo_wave.body.contains(&promote.0),
        "names the promote commit: {}",
        echo_wave.body
    );
    let show = |branch: &str, path: &str| scenario.git(&["show", &format!("{branch}:{path}")]);
    // Whoever made the release may not pass production's gates: the wave names them.
    let wave_commit = scenario.git(&["log", "-1", "--format=%B", &echo_wave.head]);
    assert!(wave_commit.contains("Gitcanary-Wave-Authors: carol"), "{wave_commit}");
    assert!(
        show(
            &shop_wave.head,
            "production/shop/overlays/production/kustomization.yaml"
        )
        .contains("- name: registry.test/shop\n  newTag: \"1.1.0\" # production\n"),
        "the overlay's images: entry takes the tag, its comment kept"
    );
    assert!(
        show(&echo_wave.head, "production/echo/deployment.yaml")
            .contains("image: registry.test/echo:1.1.0 # the production release")
    );
    assert!(
        show(&cart_wave.head, "production/cart/values.yaml")
            .contains("  repository: registry.test/cart\n  tag: \"1.1.0\" # the production release\n"),
        "the chart's values key takes the tag, its comment kept"
    );
    assert!(
        show(&echo_wave.head, "staging/echo/deployment.yaml").contains("echo:1.1.0"),
        "staging is as it was"
    );
    let head = scenario.git(&["rev-parse", &echo_wave.head]).trim().to_string();
    assert!(
        fake.statuses_for(&head)
            .iter()
            .any(|(state, context, _)| context == "gitcanary/wave/production" && state == "success"),
        "{:?}",
        fake.statuses_for(&head)
    );
    // Production runs what it ran until the pull request merges.
    assert_eq!(
        image_of(&production.client, ns, "echo").await.as_deref(),
        Some("registry.test/echo:1.0.0")
    );

    // A newer release of echo promoted in staging supersedes its wave.
    write_echo(repo, "staging", ns, "1.1.1", "app: echo");
    let newer = repo.commit_and_push("echo 1.1.1 in staging");
    healthy_at(&scenario.client, ns, "echo", &newer, "staging").await;
    let echo_wave = eventually("the newer wave pull request of echo", WAIT, || async {
        let newer = wave_pull(&fake, ns, "echo").await;
        (newer.number != first_echo_wave.number).then_some(newer)
    })
    .await;
    assert!(
        echo_wave.body.contains("`registry.test/echo:1.1.1`"),
        "{}",
        echo_wave.body
    );
    let closed = eventually("the older wave closed", WAIT, || async {
        fake.pulls()
            .into_iter()
            .find(|p| p.number == first_echo_wave.number && !p.open)
    })
    .await;
    assert!(
        fake.comments_on(closed.number)
            .iter()
            .any(|(_, _, body)| body.contains(&format!("carried by #{}", echo_wave.number))),
        "the closed one names the newer one"
    );
    assert!(shop_wave.open, "shop's wave is another Rollout's: it stays");

    // Reviewed and merged as any pull request: production's own releases run.
    for (name, wave) in [("shop", &shop_wave), ("cart", &cart_wave)] {
        fake.review(wave.number, "dave", "APPROVED");
        let merged = fake.merge_as(wave.number, "dave");
        healthy_at(&production.client, ns, name, &merged, "production").await;
    }
    assert_eq!(
        image_of(&production.client, ns, "cart").await.as_deref(),
        Some("registry.test/cart:1.1.0"),
        "the chart's values carried its tag"
    );
    // Production's own change to echo, by erin, passes production's gate
    // first: production's next release of echo then holds none of carol's
    // commits, and only the wave's trailer says she made it.
    fake.link_email("erin@example.test", "erin");
    write_echo(repo, "production", ns, "1.0.0", "app: echo, tier: web");
    let own = commit_as(repo, "Erin", "erin@example.test", "production echo: a tier label");
    let gate = production_gate(&fake, ns, None).await;
    fake.review(gate.number, "alice", "APPROVED");
    let own_stable = promoted_after(&production.client, ns, &first).await;
    assert!(
        scenario
            .try_git(&["merge-base", "--is-ancestor", &own, &own_stable])
            .is_some()
    );

    fake.review(echo_wave.number, "dave", "APPROVED");
    let merged = fake.merge_as(echo_wave.number, "dave");
    // Whoever made the release in staging may not pass production's gate,
    // though they may write; another writer may.
    let gate = production_gate(&fake, ns, Some(gate.number)).await;
    fake.review(gate.number, "carol", "APPROVED");
    let reviews = format!("/pulls/{}/reviews", gate.number);
    let read = fake.count("GET", &reviews);
    // Read again (or passed: then the assert below says so).
    eventually("production's agent reads the gate's reviews again", WAIT, || async {
        let moved = rollout_phase(&production.client, ns, "echo").await?.0 != Phase::Paused;
        (moved || fake.count("GET", &reviews) >= read + 2).then_some(())
    })
    .await;
    let (phase, _) = rollout_phase(&production.client, ns, "echo").await.expect("a status");
    assert_eq!(
        phase,
        Phase::Paused,
        "the release's own author cannot pass production's gate"
    );
    fake.review(gate.number, "alice", "APPROVED");
    let stable = promoted_after(&production.client, ns, &own_stable).await;
    assert!(
        scenario
            .try_git(&["merge-base", "--is-ancestor", &merged, &stable])
            .is_some(),
        "production's release is the merged wave: {stable}"
    );
    assert_eq!(
        image_of(&production.client, ns, "echo").await.as_deref(),
        Some("registry.test/echo:1.1.1")
    );
    assert_eq!(
        image_of(&production.client, ns, "shop").await.as_deref(),
        Some("registry.test/shop:1.1.0")
    );
    // Each cluster's status files, side by side.
    for env in ["staging", "production"] {
        for name in ["echo", "shop"] {
            let record = show("main", &format!(".gitcanary/status/{env}/{ns}/{name}.yaml"));
            assert!(record.contains("outcome: promoted"), "{env}: {record}");
        }
    }
    assert!(
        scenario
            .try_git(&["show", &format!("main:.gitcanary/status/{ns}/echo.yaml")])
            .is_none(),
        "no record in the layout of a single cluster"
    );
    // `gitcanary status` on staging's cluster tells where each release stands everywhere.
    let url = repo.file_url();
    let echo_line = |more: &[&str]| {
        let mut args = vec!["status", "-n", ns, "--repo", &url, "--cluster-name", "staging"];
        args.extend_from_slice(more);
        let (code, text, stderr) = scenario.run_cli(&args);
        assert_eq!(code, 0, "{stderr}");
        text.lines()
            .find(|l| l.starts_with(&format!("{ns}/echo  ")))
            .unwrap_or_else(|| panic!("no environments line for echo:\n{text}"))
            .to_string()
    };
    let line = echo_line(&[]);
    assert!(
        line.contains("staging*: promoted ")
            && line.contains("(registry.test/echo:1.1.1)")
            && line.contains(" → production: promoted "),
        "{line}"
    );
    assert_eq!(line.matches("(registry.test/echo:1.1.1)").count(), 2, "{line}");
    // Read as agents that verify their records would: the unsigned ones are not trusted.
    let keys = tempfile::tempdir().expect("keys");
    let (_, allowed) = support::signing_key(keys.path(), "verifier");
    let line = echo_line(&["--verify-status-signers", &allowed]);
    assert!(
        line.contains("staging*: record not trusted: ")
            && line.contains(" → production: record not trusted: ")
            && !line.contains("promoted "),
        "{line}"
    );

    // Production is the last environment: no wave follows it.
    assert!(
        !fake
            .pulls()
            .iter()
            .any(|p| p.head.starts_with("gitcanary/wave/production/production/"))
    );

    // A release that fails in staging reverts staging only and opens nothing.
    write_echo(
        repo,
        "staging",
        ns,
        "1.2.0",
        "app: echo, gitcanary.test/never-ready: \"true\"",
    );
    let failing = repo.commit_and_push("echo 1.2.0 in staging");
    let (_, revert) = scenario
        .wait_for_commit("staging's revert", |m| {
            m.contains(&format!("Gitcanary-Reverts: {failing}"))
        })
        .await;
    assert!(
        revert.contains(&format!("Gitcanary-Rollout: staging/{ns}/echo")),
        "{revert}"
    );
    assert!(show("main", "staging/echo/deployment.yaml").contains("echo:1.1.1"));
    assert!(show("main", "production/echo/deployment.yaml").contains("echo:1.1.1"));
    // The reporter has seen the failure (its commit status says so) before
    // the absence of a wave is asserted.
    eventually("the failure reported on its commit", WAIT, || async {
        fake.statuses_for(&failing)
            .iter()
            .any(|(state, context, _)| state == "failure" && context == &format!("gitcanary/staging/{ns}/echo"))
            .then_some(())
    })
    .await;
    let short = &failing[..7];
    assert!(
        !fake.pulls().iter().any(|p| p.head.ends_with(&format!("/{short}"))),
        "no wave of the failed release"
    );
    assert_eq!(
        fake.pulls()
            .iter()
            .filter(|p| p.head.starts_with("gitcanary/wave/"))
            .count(),
        4,
        "{:?}",
        fake.pulls().iter().map(|p| &p.head).collect::<Vec<_>>()
    );
}
