//! The command line as a user runs it: validate, diff, sync, and the agent
//! with its webhook, drift healing and secret handling.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gitcanary::source::webhook::sign;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use support::git_server::GitServer;

fn gitcanary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gitcanary"));
    command.env_remove("GITCANARY_GIT_TOKEN").env("NO_COLOR", "1");
    command
}

fn cluster_args(ns: &str, kubeconfig: &Path) -> Vec<String> {
    vec![
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--instance".into(),
        format!("cli-{ns}"),
        "--state-namespace".into(),
        ns.into(),
        "--cache-dir".into(),
        std::env::temp_dir()
            .join(format!("gitcanary-cli-{ns}"))
            .display()
            .to_string(),
    ]
}

fn output(command: &mut Command) -> (i32, String, String) {
    let Output { status, stdout, stderr } = command.output().expect("gitcanary runs");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn configmap(ns: &str, name: &str, color: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  color: {color}\n")
}

/// Kills the agent when the test ends, however it ends.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain directory holding one app, `web`, with a blue ConfigMap `settings`.
fn web_dir(ns: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("web")).expect("mkdir");
    std::fs::write(dir.path().join("web/settings.yaml"), configmap(ns, "settings", "blue")).expect("write");
    dir
}

/// How many syncs the agent at `addr` has run.
fn sync_count(addr: &str) -> u64 {
    let (_, metrics) = support::http(addr, "GET", "/metrics", &[], b"").expect("metrics answer");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("gitcanary_sync_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the sync count")
}

/// A plain counter of the agent's `/metrics`.
fn counter(addr: &str, name: &str) -> u64 {
    let (_, metrics) = support::http(addr, "GET", "/metrics", &[], b"").expect("metrics answer");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in the metrics"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[test]
fn validate_prints_file_and_line_and_exits_by_outcome() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("web")).expect("mkdir");
    std::fs::write(dir.path().join("web/ok.yaml"), configmap("demo", "ok", "blue")).expect("write");
    let (code, stdout, _) = output(gitcanary().arg("validate").arg(dir.path()));
    assert_eq!((code, stdout.as_str()), (0, ""));

    std::fs::write(
        dir.path().join("web/bad.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  namespace: demo\n",
    )
    .expect("write");
    let (code, stdout, _) = output(gitcanary().arg("validate").arg(dir.path()));
    assert_eq!(code, 1);
    assert_eq!(stdout.trim(), "web/bad.yaml:1: missing metadata.name");

    let (code, _, stderr) = output(gitcanary().arg("validate").arg(dir.path().join("missing")));
    assert_eq!(code, 2);
    assert!(stderr.contains("is not a directory"), "{stderr}");
}

#[test]
fn an_empty_webhook_secret_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let (code, _, stderr) = output(
        gitcanary()
            .args(["run", "--repo"])
            .arg(dir.path())
            .args(["--listen", "127.0.0.1:0", "--no-leader-election"])
            .env("GITCANARY_WEBHOOK_SECRET", ""),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("the webhook secret in GITCANARY_WEBHOOK_SECRET is empty"),
        "{stderr}"
    );
}

#[test]
fn validate_knows_the_schemas_and_fails_where_sync_would() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("web")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("api")).expect("mkdir");
    std::fs::write(
        dir.path().join("web/rollout.yaml"),
        "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {name: web, namespace: demo}\nspec:\n  workloadRef: {kind: Deployment, name: web}\n  strategy:\n    canary:\n      stepz: []\n      steps:\n      - {replicas: 1, pause: {duration: true}}\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("api/deployment.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api, namespace: demo}\nspec:\n  replicas: three\n  selector: {matchLabels: {app: api}}\n  template: {}\n",
    )
    .expect("write");
    let (code, stdout, _) = output(gitcanary().arg("validate").arg(dir.path()));
    assert_eq!(code, 1, "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("api/deployment.yaml:1: Deployment api: spec.replicas: invalid type: string \"three\""),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("web/rollout.yaml:1: Rollout spec.strategy.canary.stepz: unknown field (known: "),
        "{stdout}"
    );
    assert_eq!(
        lines[2],
        "web/rollout.yaml:1: Rollout spec.strategy.canary.steps[0].pause.duration: must be a number or a string, not a boolean"
    );
}

#[test]
fn validate_checks_analysis_templates() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("web")).expect("mkdir");
    std::fs::write(
        dir.path().join("web/app.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: demo}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: web:1}]}\n---\napiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {name: web, namespace: demo}\nspec:\n  workloadRef: {kind: Deployment, name: web}\n  analysisTemplates:\n  - name: errors\n    metrics:\n    - {name: ratio, query: 'sum(rate(errors{pod=\"{{podName}}\"}[1m])', successCondition: '<= lots'}\n  strategy:\n    canary:\n      analysis: {templateRef: latency}\n      steps:\n      - {replicas: 1, analysis: {templateRef: errors}}\n",
    )
    .expect("write");
    let (code, stdout, _) = output(gitcanary().arg("validate").arg(dir.path()));
    assert_eq!(code, 1, "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.iter().all(|l| l.starts_with("web/app.yaml:10: ")), "{stdout}");
    for expected in [
        "unknown variable {{podName}}",
        "\'(\' is not closed",
        "condition \"<= lots\"",
        "analysis template \"latency\" is not in spec.analysisTemplates",
    ] {
        assert!(stdout.contains(expected), "{expected} missing from:\n{stdout}");
    }
}

#[test]
fn validate_refuses_a_duration_that_overflows_instead_of_panicking() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("web")).expect("mkdir");
    std::fs::write(
        dir.path().join("web/app.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: demo}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: web:1}]}\n---\napiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {name: web, namespace: demo}\nspec:\n  workloadRef: {kind: Deployment, name: web}\n  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {duration: \"18446744073709551615s1s\"}}\n",
    )
    .expect("write");
    let (code, stdout, stderr) = output(gitcanary().arg("validate").arg(dir.path()));
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        "web/app.yaml:10: step 1: pause invalid duration \"18446744073709551615s1s\": too long"
    );
}

/// A chart as podinfo's: it requires a recent Kubernetes and branches on
/// the API versions served.
fn chart_requiring_a_recent_kubernetes(dir: &Path) {
    std::fs::create_dir_all(dir.join("podinfo/templates")).expect("mkdir");
    std::fs::write(
        dir.join("podinfo/Chart.yaml"),
        "apiVersion: v2\nname: podinfo\nversion: 6.9.0\nkubeVersion: \">=1.23.0-0\"\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("podinfo/templates/pdb.yaml"),
        "{{- if not (.Capabilities.APIVersions.Has \"policy/v1\") }}{{ fail \"no policy/v1\" }}{{ end }}\n\
         {{- if not (.Capabilities.APIVersions.Has \"gitcanary.io/v1alpha1/Rollout\") }}{{ fail \"no Rollout kind\" }}{{ end }}\n\
         apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: {{ .Release.Name }}\n  annotations:\n    example.test/kube: \"{{ .Capabilities.KubeVersion.Version }}\"\n\
         {{- if .Capabilities.APIVersions.Has \"example.com/v1/Widget\" }}{{ fail \"this cluster serves Widget\" }}{{ end }}\n\
         spec:\n  minAvailable: 1\n  selector:\n    matchLabels: {app: podinfo}\n",
    )
    .expect("write");
}

#[test]
fn validate_renders_charts_for_the_supported_kubernetes_not_helms_old_default() {
    let dir = tempfile::tempdir().expect("dir");
    chart_requiring_a_recent_kubernetes(dir.path());
    let (code, stdout, stderr) = output(gitcanary().arg("validate").arg(dir.path()));
    assert_eq!(
        code, 0,
        "offline, the chart renders for the supported version: {stdout}{stderr}"
    );

    // An older cluster asked for by name is what the chart refuses.
    let (code, stdout, stderr) = output(
        gitcanary()
            .args(["validate", "--kube-version", "v1.20.0"])
            .arg(dir.path()),
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("kubeVersion") && stdout.contains("v1.20.0"), "{stdout}");

    // Extra API versions reach the chart; a bad one is a usage error, not a helm flag.
    let (code, stdout, stderr) = output(
        gitcanary()
            .args(["validate", "--api-versions", "example.com/v1/Widget,apps/v1"])
            .arg(dir.path()),
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("this cluster serves Widget"), "{stdout}");
    let (code, _, stderr) = output(
        gitcanary()
            .args(["validate", "--api-versions", "--post-renderer=/bin/sh"])
            .arg(dir.path()),
    );
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn crd_prints_what_deploy_ships() {
    let (code, stdout, _) = output(gitcanary().arg("crd"));
    assert_eq!(code, 0);
    let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/crd.yaml"))
        .expect("deploy/base/crd.yaml");
    assert_eq!(stdout, shipped);
    assert!(stdout.contains("kind: CustomResourceDefinition") && stdout.contains("name: rollouts.gitcanary.io"));
}

#[tokio::test]
async fn diff_shows_the_change_and_exits_one_until_synced() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cli-diff").await;
    let server = GitServer::start(None).await;
    let repo = server.create_repo("apps");
    repo.write("web/settings.yaml", &configmap(&ns, "settings", "blue"));
    repo.commit_and_push("blue");
    let args = cluster_args(&ns, support::kubeconfig());
    let repo_arg = ["--repo".to_string(), repo.file_url()];

    let (code, stdout, stderr) = output(gitcanary().arg("diff").args(&repo_arg).args(&args));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stdout.starts_with(&format!("create ConfigMap {ns}/settings (web/settings.yaml:1)")),
        "{stdout}"
    );
    assert!(stdout.contains("+  color: blue"), "{stdout}");
    assert!(
        !stdout.contains("managedFields") && !stdout.contains("resourceVersion"),
        "{stdout}"
    );

    let (code, stdout, stderr) = output(gitcanary().args(["sync", "--once"]).args(&repo_arg).args(&args));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(": 1 applied, 0 unchanged, 0 pruned"), "{stdout}");
    let (code, stdout, _) = output(gitcanary().arg("diff").args(&repo_arg).args(&args));
    assert_eq!((code, stdout.as_str()), (0, ""));
    // A resync with nothing to do writes nothing, counted at the client.
    let (code, stdout, stderr) = output(gitcanary().args(["sync", "--once"]).args(&repo_arg).args(&args));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(": 0 applied, 1 unchanged, 0 pruned"), "{stdout}");
    assert!(stdout.contains(" 0 writes, 0 dry runs"), "{stdout}");

    repo.write("web/settings.yaml", &configmap(&ns, "settings", "green"));
    repo.commit_and_push("green");
    let (code, stdout, _) = output(gitcanary().arg("diff").args(&repo_arg).args(&args));
    assert_eq!(code, 1);
    assert!(
        stdout.contains("-  color: blue") && stdout.contains("+  color: green"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with(&format!("update ConfigMap {ns}/settings")),
        "{stdout}"
    );
}

#[tokio::test]
async fn the_agent_syncs_on_a_signed_webhook_refuses_a_bad_one_and_heals_drift() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cli-hook").await;
    let server = GitServer::start(None).await;
    let repo = server.create_repo("apps");
    repo.write("web/settings.yaml", &configmap(&ns, "settings", "blue"));
    repo.commit_and_push("blue");
    let addr = format!("127.0.0.1:{}", free_port());
    let _agent = Agent(
        gitcanary()
            .args([
                "run",
                "--listen",
                &addr,
                "--poll-interval",
                "3600",
                "--repo",
                &repo.file_url(),
            ])
            .args(cluster_args(&ns, support::kubeconfig()))
            .env("GITCANARY_WEBHOOK_SECRET", "hook-secret")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts"),
    );
    support::eventually("the agent is ready", Duration::from_secs(30), || async {
        matches!(support::http(&addr, "GET", "/readyz", &[], b""), Some((200, _))).then_some(())
    })
    .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let color = || support::color_of(&configmaps, "settings");
    assert_eq!(color().await.as_deref(), Some("blue"));

    repo.write("web/settings.yaml", &configmap(&ns, "settings", "green"));
    let commit = repo.commit_and_push("green");
    let body = format!(r#"{{"ref":"refs/heads/main","after":"{commit}"}}"#);
    let forged = sign(b"not-the-secret", body.as_bytes());
    let refused = support::http(
        &addr,
        "POST",
        "/webhook",
        &[("X-GitHub-Event", "push"), ("X-Hub-Signature-256", &forged)],
        body.as_bytes(),
    );
    assert_eq!(refused.map(|r| r.0), Some(401));
    let unsigned = support::http(
        &addr,
        "POST",
        "/webhook",
        &[("X-GitHub-Event", "push")],
        body.as_bytes(),
    );
    assert_eq!(unsigned.map(|r| r.0), Some(401));
    // Whether a refused webhook wakes a sync is for the server's unit test,
    // which reads its trigger queue; a fixed wait here would prove less.

    let other_branch = r#"{"ref":"refs/heads/feature"}"#;
    let ignored = support::http(
        &addr,
        "POST",
        "/webhook",
        &[
            ("X-GitHub-Event", "push"),
            ("X-Hub-Signature-256", &sign(b"hook-secret", other_branch.as_bytes())),
        ],
        other_branch.as_bytes(),
    );
    assert_eq!(ignored.map(|r| r.0), Some(200));

    let before_webhook = sync_count(&addr);
    let signed = sign(b"hook-secret", body.as_bytes());
    let accepted = support::http(
        &addr,
        "POST",
        "/webhook",
        &[("X-GitHub-Event", "push"), ("X-Hub-Signature-256", &signed)],
        body.as_bytes(),
    );
    assert_eq!(accepted.map(|r| r.0), Some(202));
    support::eventually("green applied", Duration::from_secs(15), || async {
        (color().await.as_deref() == Some("green")).then_some(())
    })
    .await;

    // Someone edits a managed field: the agent's watch puts it back, in one
    // sync (the watch event of its own repair does not wake it again).
    support::eventually("the webhook's sync is counted", Duration::from_secs(15), || async {
        (sync_count(&addr) > before_webhook).then_some(())
    })
    .await;
    let syncs_before_edit = sync_count(&addr);
    let fetches_before_edit = counter(&addr, "gitcanary_git_fetch_duration_seconds_count");
    let echoes_before_edit = counter(&addr, "gitcanary_own_write_events_total");
    let edit = serde_json::json!({"data": {"color": "hacked"}});
    configmaps
        .patch("settings", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edited");
    support::eventually("drift healed", Duration::from_secs(15), || async {
        (color().await.as_deref() == Some("green")).then_some(())
    })
    .await;
    // The agent saw the watch event of its own repair, and slept through it.
    support::eventually("the repair's own watch event", Duration::from_secs(15), || async {
        (counter(&addr, "gitcanary_own_write_events_total") > echoes_before_edit).then_some(())
    })
    .await;
    assert_eq!(
        sync_count(&addr),
        syncs_before_edit + 1,
        "one sync for the edit, none for the agent's own repair"
    );
    assert_eq!(
        counter(&addr, "gitcanary_git_fetch_duration_seconds_count"),
        fetches_before_edit,
        "a drift is put back from the revision already loaded: Git is not read again"
    );

    // What happened is counted at /metrics.
    let (status, metrics) = support::http(&addr, "GET", "/metrics", &[], b"").expect("metrics answer");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("# TYPE gitcanary_sync_duration_seconds histogram"),
        "{metrics}"
    );
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(value("gitcanary_objects_applied_total") >= 2, "{metrics}");
    assert!(value("gitcanary_objects_drifted_total") >= 1, "{metrics}");
    assert!(value("gitcanary_sync_duration_seconds_count") >= 3, "{metrics}");
    // Read at start and on the webhook; the drift's sync read nothing.
    assert!(value("gitcanary_git_fetch_duration_seconds_count") >= 2, "{metrics}");
    assert_eq!(value("gitcanary_git_fetch_errors_total"), 0, "{metrics}");
    // Writes: at least the two objects, their status, the drift repair.
    assert!(value("gitcanary_kube_requests_total{kind=\"write\"}") >= 3, "{metrics}");
    assert!(value("gitcanary_kube_requests_total{kind=\"read\"}") >= 3, "{metrics}");
}

#[tokio::test]
async fn git_credentials_never_appear_in_logs_or_errors() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cli-creds").await;
    let server = GitServer::start(Some("x-access-token:tok-0123456789")).await;
    let repo = server.create_repo("apps");
    repo.write("web/settings.yaml", &configmap(&ns, "settings", "blue"));
    support::run(
        repo.path(),
        "git",
        &[
            "remote",
            "add",
            "http",
            &repo.http_url_with("x-access-token:tok-0123456789"),
        ],
    );
    repo.commit_and_push_to("http", "blue");
    let args = cluster_args(&ns, support::kubeconfig());

    let (code, stdout, stderr) = output(
        gitcanary()
            .args(["sync", "--once", "--repo", &repo.http_url()])
            .args(&args)
            .env("GITCANARY_GIT_TOKEN", "tok-0123456789")
            .env("GITCANARY_LOG", "debug"),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("tok-0123456789") && !stderr.contains("tok-0123456789"));

    let (code, stdout, stderr) = output(
        gitcanary()
            .args(["sync", "--once", "--repo", &repo.http_url()])
            .args(&args)
            .env("GITCANARY_GIT_TOKEN", "tok-wrong-987654")
            .env("GITCANARY_LOG", "debug"),
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("fetching main"), "{stderr}");
    assert!(!stdout.contains("tok-wrong-987654") && !stderr.contains("tok-wrong-987654"));
}

#[tokio::test]
async fn a_plain_directory_is_followed_through_file_events() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cli-dir").await;
    let dir = web_dir(&ns);
    // Polling is an hour away: only a file event can bring the change in time.
    let _agent = Agent(
        gitcanary()
            .args([
                "sync",
                "--poll-interval",
                "3600",
                "--repo",
                &dir.path().display().to_string(),
            ])
            .args(cluster_args(&ns, support::kubeconfig()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts"),
    );
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let color = || support::color_of(&configmaps, "settings");
    support::eventually("first sync", Duration::from_secs(30), || async {
        (color().await.as_deref() == Some("blue")).then_some(())
    })
    .await;
    std::fs::write(
        dir.path().join("web/settings.yaml"),
        configmap(&ns, "settings", "green"),
    )
    .expect("write");
    support::eventually("the edit applied", Duration::from_secs(10), || async {
        (color().await.as_deref() == Some("green")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn sigterm_stops_the_agent_cleanly() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cli-term").await;
    let dir = web_dir(&ns);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut agent = gitcanary()
        .args(["run", "--listen", &addr, "--repo", &dir.path().display().to_string()])
        .args(cluster_args(&ns, support::kubeconfig()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent starts");
    support::eventually("the agent is ready", Duration::from_secs(30), || async {
        matches!(support::http(&addr, "GET", "/readyz", &[], b""), Some((200, _))).then_some(())
    })
    .await;
    let pid = agent.id().to_string();
    support::run(dir.path(), "kill", &["-TERM", &pid]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = agent.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not stop within 10 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    agent
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut log)
        .expect("log");
    assert!(log.contains("SIGTERM; finishing the sync in progress"), "{log}");
}

#[tokio::test]
async fn kubeconfig_is_found_as_kubectl_finds_it_even_across_several_files() {
    let client = support::client().await;
    support::agent::install_rollout_crd(&client).await;
    let ns = support::namespace(&client, "cli-kubeconfig").await;
    let empty = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(empty.path(), "apiVersion: v1\nkind: Config\n").expect("write");
    let joined = format!("{}:{}", empty.path().display(), support::kubeconfig().display());
    let (code, stdout, stderr) = output(gitcanary().args(["status", "-n", &ns]).env("KUBECONFIG", joined));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "no rollouts\n");
}

#[tokio::test]
async fn two_instances_sharing_a_state_namespace_keep_their_own_app_status() {
    let client = support::client().await;
    let ns = support::namespace(&client, "cli-instances").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for (instance, object) in [("one", "first"), ("two", "second")] {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("web")).expect("mkdir");
        std::fs::write(dir.path().join("web/settings.yaml"), configmap(&ns, object, "blue")).expect("write");
        let (code, stdout, stderr) = output(
            gitcanary()
                .args(["sync", "--once", "--repo", &dir.path().display().to_string()])
                .args(["--kubeconfig", &support::kubeconfig().display().to_string()])
                .args(["--instance", &format!("{instance}-{ns}"), "--state-namespace", &ns]),
        );
        assert_eq!(code, 0, "{stdout}{stderr}");
    }
    for (instance, object) in [("one", "first"), ("two", "second")] {
        let status = configmaps
            .get(&format!("{instance}-{ns}-app-web"))
            .await
            .expect("each instance has its own status of app web");
        let inventory = status.data.unwrap_or_default().remove("inventory").unwrap_or_default();
        assert!(inventory.contains(object), "{instance}: {inventory}");
    }
}
