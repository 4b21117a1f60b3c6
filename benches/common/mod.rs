//! What the benchmarks share: control planes of the test environment, the
//! agent and its metrics, repositories, waiting for a quiet machine.

#![allow(dead_code)] // each benchmark uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const GITCANARY: &str = env!("CARGO_BIN_EXE_gitcanary");
pub const WEBHOOK_SECRET: &str = "bench-webhook-secret";

pub fn run(dir: &Path, program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn timed(dir: &Path, program: &str, args: &[&str]) -> (Duration, String) {
    let started = Instant::now();
    let out = run(dir, program, args);
    (started.elapsed(), out)
}

pub struct ControlPlane {
    pub dir: tempfile::TempDir,
    pub kubeconfig: String,
    pub kubectl: PathBuf,
}

impl ControlPlane {
    pub fn start() -> ControlPlane {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let dir = tempfile::tempdir().expect("a dir");
        let out = Command::new("bash")
            .arg(root.join("tests/testenv/up.sh"))
            .arg(dir.path().join("cluster"))
            .env("GITCANARY_TESTENV_PARENT", std::process::id().to_string())
            .stderr(Stdio::inherit())
            .output()
            .expect("up.sh runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let kubeconfig = stdout
            .lines()
            .find_map(|l| l.strip_prefix("KUBECONFIG="))
            .expect("up.sh prints KUBECONFIG=")
            .to_string();
        let kubectl = dir.path().join("cluster/kubectl");
        ControlPlane {
            dir,
            kubeconfig,
            kubectl,
        }
    }

    /// Installs the Rollout CRD, as an operator does before the agent runs.
    pub fn install_rollout_crd(&self) {
        let crd = self.dir.path().join("crd.yaml");
        std::fs::write(&crd, run(self.dir.path(), GITCANARY, &["crd"])).expect("crd");
        self.kubectl(&["apply", "--server-side", "-f", &crd.display().to_string()]);
        self.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"]);
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["--kubeconfig", &self.kubeconfig];
        all.extend_from_slice(args);
        run(self.dir.path(), &self.kubectl.display().to_string(), &all)
    }
}

/// A client of the control plane whose kubeconfig is at `kubeconfig`.
pub async fn client_of(kubeconfig: &str) -> kube::Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

impl ControlPlane {
    /// Runs `act` with a watch of the ConfigMap already open, and returns
    /// when `act` began and when the watch saw `data.color` become `wanted`
    /// (a watch, not polling: kubectl's own start-up would be measured too).
    pub fn time_until_color(&self, ns: &str, name: &str, wanted: &str, act: impl FnOnce()) -> (Instant, Instant) {
        use futures::StreamExt;
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, WatchEvent, WatchParams};
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async {
            let client = client_of(&self.kubeconfig).await;
            let api = Api::<ConfigMap>::namespaced(client, ns);
            let color = |object: &ConfigMap| object.data.as_ref().and_then(|d| d.get("color")).cloned();
            let current = api.get(name).await.expect("the ConfigMap");
            let version = current.metadata.resource_version.clone().unwrap_or_default();
            let params = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(60);
            let mut events = api.watch(&params, &version).await.expect("a watch").boxed();
            let started = Instant::now();
            act();
            while started.elapsed() < Duration::from_secs(300) {
                match events.next().await {
                    Some(Ok(WatchEvent::Modified(object))) if color(&object).as_deref() == Some(wanted) => {
                        return (started, Instant::now());
                    }
                    Some(_) => {}
                    // The watch timed out: look again, then watch from there.
                    None => {
                        let now = api.get(name).await.expect("the ConfigMap");
                        if color(&now).as_deref() == Some(wanted) {
                            return (started, Instant::now());
                        }
                        let version = now.metadata.resource_version.unwrap_or_default();
                        events = api.watch(&params, &version).await.expect("a watch").boxed();
                    }
                }
            }
            panic!("{ns}/{name} did not get color {wanted} in 300 s");
        })
    }
}

/// Every change of one kind, in one namespace or in all, as a watch from
/// this process delivers it, with the moment it arrived: the one observer
/// the benchmarks time the agent and its peers by, so that no CLI's start-up
/// or polling interval is counted as theirs. A deletion is recorded as
/// `{"deleted": object}`.
pub struct Observer {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(Instant, serde_json::Value)>>>,
    /// Ends the watch (and its connection) when the observer is dropped.
    stop: tokio::task::AbortHandle,
}

impl ControlPlane {
    /// Starts watching `kind` (`group/version` or `version`, `plural`) in
    /// `namespace`; returns once the watch's first list is done.
    pub fn observe(&self, api_version: &str, kind: &str, plural: &str, namespace: &str) -> Observer {
        self.observe_in(api_version, kind, plural, Some(namespace))
    }

    /// As [`ControlPlane::observe`], in every namespace (or of a cluster-scoped kind).
    pub fn observe_all(&self, api_version: &str, kind: &str, plural: &str) -> Observer {
        self.observe_in(api_version, kind, plural, None)
    }

    fn observe_in(&self, api_version: &str, kind: &str, plural: &str, namespace: Option<&str>) -> Observer {
        use futures::StreamExt;
        use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
        use kube::runtime::watcher;
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel();
        let (kubeconfig, namespace) = (self.kubeconfig.clone(), namespace.map(str::to_string));
        let seen_by_watch = seen.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let watching = runtime.spawn(async move {
                let client = client_of(&kubeconfig).await;
                let api: Api<DynamicObject> = match &namespace {
                    Some(namespace) => Api::namespaced_with(client, namespace, &resource),
                    None => Api::all_with(client, &resource),
                };
                let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
                while let Some(event) = events.next().await {
                    let value = match event {
                        Ok(watcher::Event::InitDone) => {
                            let _ = ready_tx.send(());
                            continue;
                        }
                        Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                            serde_json::to_value(object).unwrap_or_default()
                        }
                        Ok(watcher::Event::Delete(object)) => {
                            serde_json::json!({ "deleted": serde_json::to_value(object).unwrap_or_default() })
                        }
                        _ => continue,
                    };
                    // The moment before the lock: a scan holding it must not delay it.
                    let at = Instant::now();
                    seen_by_watch.lock().expect("observed").push((at, value));
                }
            });
            let _ = stop_tx.send(watching.abort_handle());
            let _ = runtime.block_on(watching);
        });
        let stop = stop_rx.recv().expect("the watch starts");
        ready_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the watch lists within a minute");
        Observer { seen, stop }
    }
}

impl Observer {
    /// When the watch first delivered, at `since` or after, an object for
    /// which `check` holds, with that object.
    pub fn first_after(
        &self,
        what: &str,
        since: Instant,
        timeout: Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> (Instant, serde_json::Value) {
        self.try_first_after(since, timeout, check)
            .unwrap_or_else(|| panic!("timed out waiting for {what}"))
    }

    /// As [`Observer::first_after`], `None` at the timeout.
    pub fn try_first_after(
        &self,
        since: Instant,
        timeout: Duration,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<(Instant, serde_json::Value)> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self
                .seen
                .lock()
                .expect("observed")
                .iter()
                .find(|(at, object)| *at >= since && check(object))
                .cloned();
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            // The moment is the event's own; how often it is looked for is no part of it.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// When the watch had delivered, at `since` or after, `count` distinct
    /// objects (namespace and name) for which `check` holds: the arrival of
    /// the last of them. Deletions are not counted.
    pub fn when_seen(
        &self,
        what: &str,
        since: Instant,
        timeout: Duration,
        count: usize,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            let mut firsts = std::collections::HashMap::new();
            for (at, object) in self.seen.lock().expect("observed").iter() {
                if *at >= since && object.get("deleted").is_none() && check(object) {
                    let key = (
                        object["metadata"]["namespace"].as_str().unwrap_or_default().to_string(),
                        object["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                    );
                    firsts.entry(key).or_insert(*at);
                }
            }
            if firsts.len() >= count {
                return firsts.into_values().max().unwrap_or(since);
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {} of {count}",
                firsts.len()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last object seen named `name`, as its last event had it.
    pub fn last(&self, name: &str) -> Option<serde_json::Value> {
        let seen = self.seen.lock().expect("observed");
        seen.iter()
            .rev()
            .find(|(_, object)| object["metadata"]["name"] == name)
            .map(|(_, object)| object.clone())
    }

    /// Forgets what was seen before `before` (a long run keeps little).
    pub fn forget_before(&self, before: Instant) {
        self.seen.lock().expect("observed").retain(|(at, _)| *at >= before);
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.abort();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let _ = Command::new("bash")
            .arg(root.join("tests/testenv/down.sh"))
            .arg(self.dir.path().join("cluster"))
            .output();
    }
}

/// A synthetic repository of `objects` objects: apps of a Deployment (no
/// replicas: kwok has nothing to run), a Service, a ConfigMap and an
/// HTTPRoute, spread over ten namespaces that an app of their own creates.
pub fn generate(root: &Path, prefix: &str, objects: usize) {
    let namespaces = 10;
    let apps = (objects - namespaces) / 4;
    let ns_dir = root.join("00-namespaces");
    std::fs::create_dir_all(&ns_dir).expect("mkdir");
    let ns_yaml: Vec<String> = (0..namespaces)
        .map(|i| format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {prefix}-{i}\n"))
        .collect();
    std::fs::write(ns_dir.join("namespaces.yaml"), ns_yaml.join("---\n")).expect("write");
    for app in 0..apps {
        let ns = format!("{prefix}-{}", app % namespaces);
        let name = format!("app-{app:05}");
        let dir = root.join(&name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let yaml = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: 0\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: web\n        image: registry.test/{name}:1.0\n        ports: [{{containerPort: 8080}}]\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  selector: {{app: {name}}}\n  ports:\n  - port: 80\n    targetPort: 8080\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  color: blue\n  size: \"{app}\"\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  parentRefs: [{{name: public}}]\n  hostnames: [{name}.example]\n  rules:\n  - backendRefs:\n    - {{name: {name}, port: 80}}\n"
        );
        std::fs::write(dir.join("app.yaml"), yaml).expect("write");
    }
}

/// Watches of every kind [`generate`] writes, opened before a tool's first
/// sync: when the last of a tree's objects arrived is that sync's end, seen
/// the same way for every tool.
pub struct TreeObserver {
    prefix: String,
    kinds: Vec<(&'static str, Observer)>,
}

impl TreeObserver {
    pub fn start(cluster: &ControlPlane, prefix: &str) -> TreeObserver {
        let kinds = vec![
            ("Namespace", cluster.observe_all("v1", "Namespace", "namespaces")),
            (
                "Deployment",
                cluster.observe_all("apps/v1", "Deployment", "deployments"),
            ),
            ("Service", cluster.observe_all("v1", "Service", "services")),
            ("ConfigMap", cluster.observe_all("v1", "ConfigMap", "configmaps")),
            (
                "HTTPRoute",
                cluster.observe_all("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
            ),
        ];
        TreeObserver {
            prefix: prefix.to_string(),
            kinds,
        }
    }

    /// When every object of the `objects`-object tree had arrived, from `since`.
    pub fn all_applied(&self, since: Instant, objects: usize, timeout: Duration) -> Instant {
        let namespaces = 10;
        let apps = (objects - namespaces) / 4;
        let prefix = format!("{}-", self.prefix);
        self.kinds
            .iter()
            .map(|(kind, observer)| {
                if *kind == "Namespace" {
                    observer.when_seen(kind, since, timeout, namespaces, |o| {
                        o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(&prefix))
                    })
                } else {
                    observer.when_seen(kind, since, timeout, apps, |o| {
                        o["metadata"]["namespace"]
                            .as_str()
                            .is_some_and(|n| n.starts_with(&prefix))
                            && o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("app-"))
                    })
                }
            })
            .max()
            .unwrap_or(since)
    }
}

pub fn writes_of(summary: &str) -> u64 {
    summary
        .split("API requests: ")
        .nth(1)
        .and_then(|rest| rest.split(", ").nth(1))
        .and_then(|w| w.trim_end_matches(" writes").parse().ok())
        .unwrap_or(u64::MAX)
}

pub fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

pub fn millis(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port()
}

pub struct Agent {
    pub child: Child,
    pub port: u16,
}

impl Agent {
    pub fn start(cluster: &ControlPlane, repo: &str, instance: &str, cache: &Path, log: &Path) -> Agent {
        Agent::start_with(cluster, repo, instance, cache, log, &[], &[])
    }

    /// As a default install runs it: leader election on, the default poll
    /// (60 s); only where to find things is given.
    pub fn start_as_installed(cluster: &ControlPlane, repo: &str, instance: &str, cache: &Path, log: &Path) -> Agent {
        Agent::spawn(cluster, repo, instance, cache, log, &[], &[], true)
    }

    /// As [`Agent::start`], with more arguments and environment.
    pub fn start_with(
        cluster: &ControlPlane,
        repo: &str,
        instance: &str,
        cache: &Path,
        log: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        Agent::spawn(cluster, repo, instance, cache, log, args, env, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        cluster: &ControlPlane,
        repo: &str,
        instance: &str,
        cache: &Path,
        log: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        as_installed: bool,
    ) -> Agent {
        let port = free_port();
        let child = Command::new(GITCANARY)
            .args(["run", "--repo", repo, "--kubeconfig", &cluster.kubeconfig])
            .args(["--instance", instance, "--state-namespace", "gitcanary-bench"])
            .args(["--cache-dir", &cache.display().to_string()])
            .args(
                (!as_installed && !args.contains(&"--poll-interval"))
                    .then_some(["--poll-interval", "300"])
                    .into_iter()
                    .flatten(),
            )
            .args(["--listen", &format!("127.0.0.1:{port}")])
            // Shards are held on Leases; one agent alone needs none.
            .args((!as_installed && !args.contains(&"--shards")).then_some("--no-leader-election"))
            .args(args)
            .envs(env.iter().copied())
            .env("GITCANARY_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log"))
            .spawn()
            .expect("the agent starts");
        let agent = Agent { child, port };
        agent.wait_ready();
        agent
    }

    pub fn get(&self, path: &str) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{}{path}", self.port)])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// One value of the agent's metrics (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        self.get("/metrics")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub fn wait_ready(&self) {
        // A first sync of 50,000 objects takes 500–600 s here, more with a
        // second control plane up beside it (the shard replicas' run).
        let deadline = Instant::now() + Duration::from_secs(1800);
        while self.get("/readyz").is_none() {
            assert!(Instant::now() < deadline, "the agent never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A signed push webhook, as GitHub sends it.
    pub fn push(&self, commit: &str) {
        let body = format!("{{\"ref\":\"refs/heads/main\",\"after\":\"{commit}\"}}");
        let signature = gitcanary::source::webhook::sign(WEBHOOK_SECRET.as_bytes(), body.as_bytes());
        let _ = Command::new("curl")
            .args(["-sf", "-X", "POST", "-H", "X-GitHub-Event: push", "-d", &body])
            .args(["-H", &format!("X-Hub-Signature-256: {signature}")])
            .arg(format!("http://127.0.0.1:{}/webhook", self.port))
            .output();
    }

    pub fn peak_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A working clone whose pushes go to a bare repository the agent follows.
pub struct Repo {
    pub work: PathBuf,
    pub bare: PathBuf,
}

impl Repo {
    pub fn create(dir: &Path, name: &str) -> Repo {
        let bare = dir.join(format!("{name}.git"));
        let work = dir.join(name);
        run(
            dir,
            "git",
            &[
                "init",
                "-q",
                "--bare",
                "--initial-branch=main",
                &bare.display().to_string(),
            ],
        );
        std::fs::create_dir_all(&work).expect("mkdir");
        run(&work, "git", &["init", "-q", "--initial-branch=main"]);
        run(&work, "git", &["remote", "add", "origin", &bare.display().to_string()]);
        Repo { work, bare }
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    pub fn commit_and_push(&self, message: &str) -> String {
        run(&self.work, "git", &["add", "-A"]);
        run(
            &self.work,
            "git",
            &[
                "-c",
                "user.name=bench",
                "-c",
                "user.email=bench@example.test",
                "commit",
                "-qm",
                message,
            ],
        );
        // The agent pushes its own status commits: one may land between the
        // pull and the push, and the push is then made again on top of it.
        for _ in 0..5 {
            let _ = Command::new("git")
                .args(["pull", "-q", "--rebase", "origin", "main"])
                .current_dir(&self.work)
                .output();
            let pushed = Command::new("git")
                .args(["push", "-q", "origin", "HEAD:main"])
                .current_dir(&self.work)
                .output()
                .is_ok_and(|output| output.status.success());
            if pushed {
                return run(&self.work, "git", &["rev-parse", "HEAD"]).trim().to_string();
            }
        }
        panic!("five pushes in a row lost the race with the agent's own")
    }
}

/// Waits until the machine's CPUs are mostly idle (the controllers have
/// caught up with the last run), so that no run pays for the one before.
pub fn wait_quiet() {
    let busy_and_total = || -> (u64, u64) {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let fields: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let total: u64 = fields.iter().sum();
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        (total - idle, total)
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        let (busy0, total0) = busy_and_total();
        std::thread::sleep(Duration::from_secs(1));
        let (busy1, total1) = busy_and_total();
        let share = (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64;
        if share < 0.15 {
            return;
        }
    }
    eprintln!("bench: the machine stayed busy; measuring anyway");
}

pub fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// User and system CPU seconds a process has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// App `index` of a bench of Rollouts paused at an indefinite step: a
/// Namespace `<prefix>-NNN` with a Deployment on image `tag` and its Rollout.
pub fn paused_rollout_app(prefix: &str, index: usize, tag: &str) -> String {
    let ns = format!("{prefix}-{index:03}");
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      containers: [{{name: echo, image: registry.test/echo:{tag}}}]
---
apiVersion: gitcanary.io/v1alpha1
kind: Rollout
metadata: {{name: echo, namespace: {ns}}}
spec:
  workloadRef: {{kind: Deployment, name: echo}}
  strategy:
    canary:
      steps:
      - {{replicas: 1, pause: {{}}}}
"
    )
}
