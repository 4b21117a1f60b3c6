//! The agent binary run against a pushed repository, as a user runs it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use super::git_server::{GitRepo, GitServer};

pub fn gitcanary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gitcanary"));
    command.env_remove("GITCANARY_GIT_TOKEN").env("NO_COLOR", "1");
    command
}

/// Installs the Rollout CRD on the shared control plane (once per test
/// binary) and waits until it is served.
pub async fn install_rollout_crd(client: &Client) {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED.get_or_init(|| install_rollout_crd_on(client)).await;
}

/// Installs the Rollout CRD on the cluster of `client` (a dedicated control
/// plane too) and waits until it is established.
pub async fn install_rollout_crd_on(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = gitcanary::rollout::api::Rollout::crd();
    api.patch(
        "rollouts.gitcanary.io",
        &PatchParams::apply("gitcanary-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("the Rollout CRD installs");
    super::eventually("the Rollout CRD is established", Duration::from_secs(30), || async {
        let crd = api.get("rollouts.gitcanary.io").await.ok()?;
        let established = crd
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await;
}

/// A running agent; killed when dropped.
pub struct AgentProcess {
    child: Child,
    pub log: std::path::PathBuf,
    /// What its push webhooks are signed with (see `resync`).
    webhook_secret: String,
}

/// The webhook secret of an agent started without one of its own.
const WEBHOOK_SECRET: &str = "agent-test-webhook-secret";

impl AgentProcess {
    pub fn start(repo: &GitRepo, namespace: &str, cache: &Path) -> AgentProcess {
        AgentProcess::start_with(repo, namespace, cache, &[], &[])
    }

    pub fn start_with(
        repo: &GitRepo,
        namespace: &str,
        cache: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> AgentProcess {
        let log = cache.join("agent.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("agent log file");
        let instance = format!("e2e-{namespace}");
        let kubeconfig = super::kubeconfig().display().to_string();
        let cache_dir = cache.display().to_string();
        // One identity per scenario: a restarted agent takes its Lease back at once.
        let repo_url = repo.file_url();
        let defaults = [
            ("--repo", repo_url.as_str()),
            ("--poll-interval", "2"),
            ("--instance", instance.as_str()),
            ("--state-namespace", namespace),
            ("--kubeconfig", kubeconfig.as_str()),
            ("--cache-dir", cache_dir.as_str()),
            ("--leader-identity", instance.as_str()),
        ];
        let child = gitcanary()
            .args(["run", "--listen", "127.0.0.1:0"])
            .args(
                defaults
                    .iter()
                    .filter(|(flag, _)| !args.contains(flag))
                    .flat_map(|(flag, value)| [*flag, *value]),
            )
            .args(args)
            .env("GITCANARY_LOG", "gitcanary=debug")
            .env("GITCANARY_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("the agent starts");
        let webhook_secret = env
            .iter()
            .rev()
            .find(|(name, _)| *name == "GITCANARY_WEBHOOK_SECRET")
            .map_or(WEBHOOK_SECRET, |(_, secret)| *secret)
            .to_string();
        AgentProcess {
            child,
            log,
            webhook_secret,
        }
    }

    /// SIGKILL: no chance to clean up, as when a node dies.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits (at most 40 s) for a clean exit; returns whether it exited 0.
    pub fn terminate(&mut self) -> bool {
        super::run(Path::new("/"), "kill", &["-TERM", &self.child.id().to_string()]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        false
    }

    /// The address it listens on (from its log), once it does.
    pub async fn address(&self) -> String {
        super::eventually("the agent listens", std::time::Duration::from_secs(30), || async {
            let log = self.log_text();
            let after = log
                .split("agent listening bound=")
                .last()
                .filter(|_| log.contains("agent listening"))?;
            Some(after.split_whitespace().next()?.to_string())
        })
        .await
    }

    /// Syncs finished so far (any result), from its `/metrics`.
    /// A counter of the agent's /metrics (0 before it answers).
    pub async fn counter(&self, name: &str) -> u64 {
        let addr = self.address().await;
        let Some((_, text)) = super::http(&addr, "GET", "/metrics", &[], b"") else {
            return 0;
        };
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Several counters read from one scrape, so that they agree.
    pub async fn counters(&self, names: &[&str]) -> Vec<u64> {
        let addr = self.address().await;
        let text = super::http(&addr, "GET", "/metrics", &[], b"").map_or(String::new(), |(_, text)| text);
        names
            .iter()
            .map(|name| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                    .unwrap_or(0)
            })
            .collect()
    }

    pub async fn syncs(&self) -> u64 {
        let addr = self.address().await;
        let Some((_, text)) = super::http(&addr, "GET", "/metrics", &[], b"") else {
            return 0;
        };
        text.lines()
            .filter(|l| l.starts_with("gitcanary_syncs_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<u64>().ok())
            .sum()
    }

    /// `count` resyncs, one after the other (see `resync`): the evidence
    /// that the agent looked, before a test says that nothing changed.
    pub async fn resyncs(&self, count: u64) {
        for _ in 0..count {
            self.resync().await;
        }
    }

    /// A resync, asked for as a push webhook of the branch asks (the head
    /// read, every app synced, even at rest); waits until a sync after it
    /// is finished.
    pub async fn resync(&self) {
        let before = self.syncs().await;
        let push = br#"{"ref":"refs/heads/main"}"#;
        let signature = gitcanary::source::webhook::sign(self.webhook_secret.as_bytes(), push);
        let headers = [("X-GitHub-Event", "push"), ("X-Hub-Signature-256", signature.as_str())];
        let answer = super::http(&self.address().await, "POST", "/webhook", &headers, push);
        assert_eq!(answer.map(|(status, _)| status), Some(202), "the push webhook is taken");
        super::eventually("a resync", std::time::Duration::from_secs(90), || async {
            (self.syncs().await > before).then_some(())
        })
        .await;
    }

    /// Sends `signal` (`STOP`, `CONT`) to the agent.
    pub fn signal(&self, signal: &str) {
        super::run(
            Path::new("/"),
            "kill",
            &[&format!("-{signal}"), &self.child.id().to_string()],
        );
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Someone annotates the Rollout `namespace/name`: waits until the
    /// agent has planned `app` again (its "app synced" line). The log's
    /// length before the annotation, for [`AgentProcess::requests_since`].
    pub async fn annotate_rollout_and_wait_for_its_app(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
        app: &str,
    ) -> usize {
        let before = self.log_text().len();
        Api::<gitcanary::rollout::api::Rollout>::namespaced(client.clone(), namespace)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"example.test/seen": "yes"}}})),
            )
            .await
            .expect("annotate the Rollout");
        // A sync that read the Rollout after the annotation, then finished
        // the app: not one already under way, whose reads came before.
        let (read, synced) = (format!("/rollouts/{name}"), format!("app{{app={app} "));
        let reads_the_rollout = |line: &str| {
            let uri = line
                .split_once("uri=")
                .and_then(|(_, rest)| rest.split_whitespace().next());
            line.contains("method=GET") && uri.is_some_and(|uri| uri.split('?').next().unwrap_or(uri).ends_with(&read))
        };
        super::eventually("the app planned again", Duration::from_secs(90), || async {
            let log = self.log_text();
            let mut lines = log.get(before..)?.lines();
            lines.find(|l| reads_the_rollout(l))?;
            lines
                .any(|l| l.contains(&synced) && l.contains("app synced"))
                .then_some(())
        })
        .await;
        before
    }

    /// (method, path) of each request the agent logged (with
    /// `gitcanary::cluster::requests=trace`) after the log's first `from`
    /// bytes, watches and dry runs left out: a watch is not a read of a
    /// sync's, and a dry run writes nothing.
    pub fn requests_since(&self, from: usize) -> Vec<(String, String)> {
        let log = self.log_text();
        log.get(from..)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let method = line.split_once("method=")?.1.split_whitespace().next()?;
                let uri = line.split_once("uri=")?.1.split_whitespace().next()?;
                let path = uri
                    .split_once("://")
                    .map_or(uri, |(_, rest)| &rest[rest.find('/').unwrap_or(0)..]);
                let watch_or_dry_run = path.contains("watch=true") || path.contains("dryRun=");
                (!watch_or_dry_run).then(|| (method.to_string(), path.split('?').next().unwrap_or(path).to_string()))
            })
            .collect()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A namespace, a repository and a cache directory for one end-to-end test.
pub struct Scenario {
    pub client: Client,
    pub ns: String,
    pub _server: GitServer,
    pub repo: GitRepo,
    pub cache: tempfile::TempDir,
}

impl Scenario {
    pub async fn new(prefix: &str) -> Scenario {
        let client = super::client().await;
        install_rollout_crd(&client).await;
        let ns = super::namespace(&client, prefix).await;
        let server = GitServer::start(None).await;
        let repo = server.create_repo("apps");
        Scenario {
            client,
            ns,
            _server: server,
            repo,
            cache: tempfile::tempdir().expect("cache dir"),
        }
    }

    /// git on the bare repository (what the remote holds).
    pub fn git(&self, args: &[&str]) -> String {
        let bare = format!("--git-dir={}", self.repo.bare.display());
        let mut all = vec![bare.as_str()];
        all.extend_from_slice(args);
        super::run(self.repo.path(), "git", &all)
    }

    /// git on the bare repository, None when it fails (a file not there yet).
    pub fn try_git(&self, args: &[&str]) -> Option<String> {
        let output = std::process::Command::new("git")
            .arg(format!("--git-dir={}", self.repo.bare.display()))
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// (commit, full message) of `main` on the remote, newest first.
    pub fn history(&self) -> Vec<(String, String)> {
        self.git(&["log", "--format=%H%n%B%x00", "main"])
            .split('\0')
            .filter(|c| !c.trim().is_empty())
            .map(|c| {
                let c = c.trim_start();
                let (sha, message) = c.split_once('\n').unwrap_or((c, ""));
                (sha.to_string(), message.trim().to_string())
            })
            .collect()
    }

    /// The newest commit on main whose message `matches`, once there is one
    /// (waits up to 90 s): its sha and message.
    pub async fn wait_for_commit(&self, what: &str, matches: impl Fn(&str) -> bool) -> (String, String) {
        super::eventually(what, std::time::Duration::from_secs(90), || async {
            self.history().into_iter().find(|(_, m)| matches(m))
        })
        .await
    }

    pub fn start_agent(&self) -> AgentProcess {
        AgentProcess::start(&self.repo, &self.ns, self.cache.path())
    }

    /// `gitcanary diff` as this scenario's agent sees the repository.
    pub fn diff(&self) -> (i32, String, String) {
        self.run_cli(&[
            "diff",
            "--repo",
            &self.repo.file_url(),
            "--instance",
            &format!("e2e-{}", self.ns),
            "--state-namespace",
            &self.ns,
            "--cache-dir",
            &self.cache.path().join("diff").display().to_string(),
        ])
    }

    /// `gitcanary sync --once` as this scenario's agent would sync, with `extra` flags.
    pub fn sync_once(&self, extra: &[&str]) -> (i32, String, String) {
        let instance = format!("e2e-{}", self.ns);
        let cache = self.cache.path().display().to_string();
        let url = self.repo.file_url();
        let mut args = vec!["sync", "--once", "--repo", &url, "--instance", &instance];
        args.extend(["--state-namespace", &self.ns, "--cache-dir", &cache]);
        args.extend_from_slice(extra);
        self.run_cli(&args)
    }

    pub fn run_cli(&self, args: &[&str]) -> (i32, String, String) {
        let output = gitcanary()
            .args(args)
            .args(["--kubeconfig", &super::kubeconfig().display().to_string()])
            .output()
            .expect("gitcanary runs");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

/// Whether the release failed: `Failed`, or already back on stable through
/// its revert commit (which the agent syncs at once, so `Failed` may last
/// less than a poll).
pub fn failed_or_reverted(status: &gitcanary::rollout::api::RolloutStatus) -> bool {
    use gitcanary::rollout::api::{Phase, WritebackAction};
    status.phase == Phase::Failed
        || status
            .written_back
            .as_ref()
            .is_some_and(|w| w.action == WritebackAction::Revert && w.rollout_id == status.rollout_id)
}

/// The echo app of the end-to-end tests: a Deployment of two replicas, its
/// Service, an HTTPRoute to it, and a Rollout whose spec after `workloadRef`
/// is `rollout_spec` (YAML indented by two spaces).
pub fn write_echo_app(repo: &super::git_server::GitRepo, ns: &str, image: &str, rollout_spec: &str) {
    let files = [
        (
            "echo/deployment.yaml",
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: echo}}\n  template:\n    metadata:\n      labels: {{app: echo}}\n    spec:\n      containers:\n      - name: echo\n        image: registry.test/echo:{image}\n"
            ),
        ),
        (
            "echo/service.yaml",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  selector: {{app: echo}}\n  ports:\n  - port: 80\n    targetPort: 8080\n"
            ),
        ),
        (
            "echo/route.yaml",
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  parentRefs: [{{name: public}}]\n  rules:\n  - backendRefs:\n    - {{name: echo, port: 80}}\n"
            ),
        ),
        (
            "echo/rollout.yaml",
            format!(
                "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: echo}}\n{rollout_spec}"
            ),
        ),
    ];
    for (path, content) in files {
        repo.write(path, &content);
    }
}

/// The agent reporting to the GitHub API at `url` (the fake's, or a server
/// that never answers), with `args`.
pub fn github_agent_with(scenario: &Scenario, url: &str, args: &[&str]) -> AgentProcess {
    let mut all = vec!["--github-url", url, "--github-repo", "acme/apps"];
    all.extend_from_slice(args);
    AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &all,
        &[("GITCANARY_GITHUB_TOKEN", "ghp_test_token")],
    )
}

/// As [`github_agent_with`], looking at gates and commands every 1 to 3 s:
/// no webhook event is delivered here.
pub fn github_agent(scenario: &Scenario, url: &str) -> AgentProcess {
    github_agent_with(scenario, url, &["--github-poll", "1", "--github-poll-max", "3"])
}
