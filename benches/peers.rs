//! gitcanary against the tools users would pick instead, each on a fresh
//! control plane of its own, on the same manifests, in one run. Sync:
//! gitcanary, Flux (source- and kustomize-controller) with a Kustomization
//! per app and with one over the tree, and kubectl. Canary: gitcanary, Argo
//! Rollouts and Flagger. Every tool runs as its install runs it (leader
//! election on, its default intervals), and every moment is taken from a
//! watch this process opened before the action, the same for every tool.
//! The peers are built from their Go modules by benches/peers/build.sh
//! (cached). Prints markdown tables.
//!
//!   cargo bench --bench peers
//!   GITCANARY_PEERS_SIZES=1000,5000     # objects (default)
//!   GITCANARY_PEERS_STEADY_SECONDS=600  # the window with no change (default 10 minutes)
//!   GITCANARY_PEERS_CHANGES=5           # one-change rounds per tool
//!   GITCANARY_PEERS_PER_APP_UP_TO=1000  # sizes Flux runs with a Kustomization per app
//!   GITCANARY_PEERS_WORKLOADS=100       # governed workloads for the canary tools' memory
//!   GITCANARY_PEERS_ONLY=sync           # or canary
//!   GITCANARY_PEERS_TOOLS=gitcanary,argo-rollouts,flagger   # the canary tools to run (default all)
//!
//! Not a test: it asserts nothing and is not run by CI.

#[path = "peers/canary.rs"]
mod canary;
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use canary::{Tool, bench_canary};
use common::*;

/// A peer's process, run out of cluster against a control plane; killed when dropped.
struct Process {
    child: Child,
}

impl Process {
    fn start(program: &Path, args: &[String], kubeconfig: &str, log: &Path) -> Process {
        let child = Command::new(program)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUNTIME_NAMESPACE", "flux-system")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log"))
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", program.display()));
        Process { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The sum of every sample of `name` in a Prometheus text page.
fn metric_sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn http_get(port: u16, path: &str) -> String {
    Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{port}{path}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl ControlPlane {
    fn apiserver_pid(&self) -> u32 {
        std::fs::read_to_string(self.dir.path().join("cluster/pids/kube-apiserver.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Bytes of every response the API server has sent.
    fn response_bytes(&self) -> f64 {
        metric_sum(
            &self.kubectl(&["get", "--raw", "/metrics"]),
            "apiserver_response_sizes_sum",
        )
    }

    fn apply_yaml(&self, yaml: &str) {
        let file = self.dir.path().join(format!("apply-{}.yaml", free_port()));
        std::fs::write(&file, yaml).expect("write");
        self.kubectl(&["apply", "--server-side", "-f", &file.display().to_string()]);
    }
}

/// The bare repositories under a directory, over HTTP (git-http.py).
struct GitHttp {
    child: Child,
    port: u16,
}

impl GitHttp {
    fn start(root: &Path) -> GitHttp {
        let port = free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/git-http.py");
        let child = Command::new("python3")
            .arg(script)
            .arg(root)
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the Git server starts");
        wait_until("the Git server", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        GitHttp { child, port }
    }

    fn url(&self, repo: &Repo) -> String {
        let name = repo.bare.file_name().expect("a name").to_string_lossy();
        format!("http://127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for GitHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where benches/peers/build.sh put the peers.
struct Peers {
    root: PathBuf,
}

impl Peers {
    /// Builds (or finds built) the peers named: `flux`, `argo-rollouts`, `flagger`.
    fn build(names: &[&str]) -> Peers {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/build.sh");
        let mut root = String::new();
        for name in names {
            let out = Command::new("bash")
                .arg(&script)
                .arg(name)
                .stderr(Stdio::inherit())
                .output()
                .expect("build.sh runs");
            assert!(out.status.success(), "benches/peers/build.sh {name} failed");
            root = String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .to_string();
        }
        Peers {
            root: PathBuf::from(root),
        }
    }

    /// The directory of `name` (`name-<version>`).
    fn dir(&self, name: &str) -> PathBuf {
        self.find(name).unwrap_or_else(|| panic!("{name} is not built"))
    }

    fn find(&self, name: &str) -> Option<PathBuf> {
        std::fs::read_dir(&self.root)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.is_dir()
                    && p.file_name()
                        .and_then(|f| f.to_str())
                        .and_then(|f| f.strip_prefix(name))
                        .is_some_and(|v| v.starts_with("-v"))
            })
    }

    fn version(&self, name: &str) -> String {
        let Some(dir) = self.find(name) else {
            return "not run".to_string();
        };
        let file = dir.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        file.trim_start_matches(name).trim_start_matches('-').to_string()
    }
}

/// Flux's source- and kustomize-controller, out of cluster, with their CRDs,
/// run as `flux install` runs them (leader election on).
struct Flux {
    source: Process,
    kustomize: Process,
    metrics: [u16; 2],
}

const FLUX_NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: flux-system}\n";

/// How the Kustomizations cover the tree.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// One per app directory (and one for the namespaces, which each app's depends on).
    PerApp,
    /// One over the whole tree, as `flux bootstrap` points one at a cluster directory.
    Tree,
}

impl Flux {
    fn start(cluster: &ControlPlane, peers: &Peers, work: &Path, layout: Layout) -> Flux {
        for name in ["source-controller", "kustomize-controller"] {
            let crds = peers.dir(name).join("crds");
            cluster.kubectl(&["apply", "--server-side", "-f", &crds.display().to_string()]);
        }
        cluster.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"]);
        cluster.apply_yaml(FLUX_NAMESPACE);
        let storage = work.join(format!("flux-storage-{layout:?}"));
        std::fs::create_dir_all(&storage).expect("mkdir");
        let storage_addr = format!("127.0.0.1:{}", free_port());
        let metrics = [free_port(), free_port()];
        let source = Process::start(
            &peers.dir("source-controller").join("bin/source-controller"),
            &[
                format!("--storage-path={}", storage.display()),
                format!("--storage-addr={storage_addr}"),
                format!("--storage-adv-addr={storage_addr}"),
                format!("--metrics-addr=127.0.0.1:{}", metrics[0]),
                format!("--health-addr=127.0.0.1:{}", free_port()),
                "--enable-leader-election".to_string(),
            ],
            &cluster.kubeconfig,
            &work.join(format!("source-controller-{layout:?}.log")),
        );
        let kustomize = Process::start(
            &peers.dir("kustomize-controller").join("bin/kustomize-controller"),
            &[
                format!("--metrics-addr=127.0.0.1:{}", metrics[1]),
                format!("--health-addr=127.0.0.1:{}", free_port()),
                "--enable-leader-election".to_string(),
            ],
            &cluster.kubeconfig,
            &work.join(format!("kustomize-controller-{layout:?}.log")),
        );
        let flux = Flux {
            source,
            kustomize,
            metrics,
        };
        wait_until("Flux's metrics", Duration::from_secs(120), || {
            flux.metrics.iter().all(|&port| !http_get(port, "/metrics").is_empty())
        });
        flux
    }

    /// API requests both controllers have sent (client-go's counter).
    fn requests(&self) -> f64 {
        self.metrics
            .iter()
            .map(|&port| metric_sum(&http_get(port, "/metrics"), "rest_client_requests_total"))
            .sum()
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.source.pid()) + cpu_seconds(self.kustomize.pid())
    }

    fn peak_rss_mib(&self) -> f64 {
        peak_rss_mib(self.source.pid()) + peak_rss_mib(self.kustomize.pid())
    }

    /// One GitRepository, and Kustomizations over the tree as `layout` says,
    /// at the intervals `flux bootstrap` writes (1m and 10m), pruning.
    fn follow(cluster: &ControlPlane, url: &str, layout: Layout, tree: &Path) {
        let kustomization = |name: &str, path: &str, depends: &str| {
            format!(
                "apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {{name: {name}, namespace: flux-system}}\nspec:\n  interval: 10m0s\n  sourceRef: {{kind: GitRepository, name: bench}}\n  path: {path}\n  prune: true\n{depends}"
            )
        };
        let mut documents = vec![format!(
            "apiVersion: source.toolkit.fluxcd.io/v1\nkind: GitRepository\nmetadata: {{name: bench, namespace: flux-system}}\nspec:\n  interval: 1m0s\n  url: {url}\n  ref: {{branch: main}}\n"
        )];
        match layout {
            Layout::Tree => documents.push(kustomization("bench", "./", "")),
            Layout::PerApp => {
                documents.push(kustomization("namespaces", "./00-namespaces", ""));
                let mut apps: Vec<String> = std::fs::read_dir(tree)
                    .expect("the tree")
                    .filter_map(Result::ok)
                    .filter_map(|e| e.file_name().to_str().map(str::to_string))
                    .filter(|name| name.starts_with("app-"))
                    .collect();
                apps.sort();
                for app in apps {
                    documents.push(kustomization(
                        &app,
                        &format!("./{app}"),
                        "  dependsOn: [{name: namespaces}]\n",
                    ));
                }
            }
        }
        cluster.apply_yaml(&documents.join("---\n"));
    }
}

/// What a Flux Receiver does on a push: ask the GitRepository to reconcile
/// now. Sent from this process (no kubectl start-up in Flux's figure).
struct ReconcileRequest {
    runtime: tokio::runtime::Runtime,
    api: kube::Api<kube::api::DynamicObject>,
}

impl ReconcileRequest {
    fn of(cluster: &ControlPlane) -> ReconcileRequest {
        use kube::api::{ApiResource, GroupVersionKind};
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let api = runtime.block_on(async {
            let client = client_of(&cluster.kubeconfig).await;
            let gvk = GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "GitRepository");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "gitrepositories");
            kube::Api::namespaced_with(client, "flux-system", &resource)
        });
        ReconcileRequest { runtime, api }
    }

    /// Sends it (on a thread of its own: the caller may be inside a runtime).
    fn send(&self) {
        let at = format!("{:?}", std::time::SystemTime::now());
        let patch = serde_json::json!({
            "metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": at}}
        });
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.runtime.block_on(self.api.patch(
                        "bench",
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    ))
                })
                .join()
                .expect("the request's thread")
                .expect("the GitRepository annotated");
        });
    }
}

/// The agent's API requests so far, from its own counter.
fn agent_requests(agent: &Agent) -> f64 {
    metric_sum(
        &agent.get("/metrics").unwrap_or_default(),
        "gitcanary_kube_requests_total",
    )
}

/// Requests the control plane's API server has served, whoever sent them.
fn served_requests(cluster: &ControlPlane) -> f64 {
    metric_sum(
        &cluster.kubectl(&["get", "--raw", "/metrics"]),
        "apiserver_request_total",
    )
}

/// Flips `data.color` of one ConfigMap of the tree; returns the color now
/// asked for (the caller commits and pushes).
fn change_one(repo: &Repo, round: usize) -> String {
    let file = repo.work.join("app-00007/app.yaml");
    let text = std::fs::read_to_string(&file).expect("app");
    let (before, after) = if round.is_multiple_of(2) {
        ("blue", "green")
    } else {
        ("green", "blue")
    };
    std::fs::write(
        &file,
        text.replace(&format!("color: {before}"), &format!("color: {after}")),
    )
    .expect("write");
    after.to_string()
}

/// The columns of the sync table, in order.
const SYNC_TOOLS: [&str; 4] = [
    "gitcanary",
    "Flux, a Kustomization per app",
    "Flux, one Kustomization over the tree",
    "kubectl apply --server-side -R",
];

/// What one control plane did in the window with no change.
#[derive(Debug, Default, Clone, Copy)]
struct Steady {
    /// As the tool counts its own (none for kubectl's idle plane).
    tool_requests: f64,
    /// As the API server counts every request it served (controller-manager,
    /// scheduler and kwok included: the idle plane is their baseline).
    served: f64,
    tool_cpu: f64,
    apiserver_cpu: f64,
    bytes: f64,
}

struct SyncFigures {
    /// Per column of [`SYNC_TOOLS`]; `None` for a column not run at this size.
    first: [Option<Duration>; 4],
    /// Every round, sorted, of gitcanary and both Flux layouts.
    changes: [Vec<Duration>; 3],
    steady: [Option<Steady>; 4],
    rss: [Option<f64>; 3],
}

/// A tool's first sync of the tree, from `act` to the last object's arrival
/// at a watch opened before it.
fn first_sync(name: &str, cluster: &ControlPlane, prefix: &str, n: usize, act: impl FnOnce()) -> Duration {
    let tree = TreeObserver::start(cluster, prefix);
    wait_quiet();
    let started = Instant::now();
    act();
    let done = tree.all_applied(started, n, Duration::from_secs(3600));
    eprintln!("bench:   {name} first sync {:?}", done - started);
    done - started
}

/// One tool that follows Git: its control plane, its copy of the tree, and
/// how a push reaches it.
struct Follower {
    cluster: ControlPlane,
    repo: Repo,
    flux: Option<(Flux, ReconcileRequest)>,
}

/// Flux with a Kustomization per app on `n` objects: every commit reconciles
/// every Kustomization of the GitRepository, so above this size one run
/// would take hours (see docs/benchmarks.md).
fn per_app_up_to() -> usize {
    std::env::var("GITCANARY_PEERS_PER_APP_UP_TO")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
}

fn bench_sync(peers: &Peers, n: usize, steady: Duration, rounds: usize) -> SyncFigures {
    let per_app = n <= per_app_up_to();
    eprintln!(
        "bench: {n} objects: {} (Flux per app: {per_app})",
        SYNC_TOOLS.join(", ")
    );
    let kubectl_cluster = ControlPlane::start();
    let work = kubectl_cluster.dir.path().join("peers");
    std::fs::create_dir_all(&work).expect("mkdir");
    // The same tree once per tool that follows Git, so that each sees only the
    // pushes meant for it (each polls every minute).
    let prefix = format!("t{n}");
    let follower = |name: &str, layout: Option<Layout>| {
        let repo = Repo::create(&work, &format!("{name}{n}"));
        generate(&repo.work, &prefix, n);
        repo.commit_and_push("synthetic");
        let cluster = ControlPlane::start();
        let flux = layout.map(|layout| {
            let flux = Flux::start(&cluster, peers, &work, layout);
            let request = ReconcileRequest::of(&cluster);
            (flux, request)
        });
        Follower { cluster, repo, flux }
    };
    let followers: [Option<Follower>; 3] = [
        Some(follower("tree", None)),
        per_app.then(|| follower("flux-apps", Some(Layout::PerApp))),
        Some(follower("flux-tree", Some(Layout::Tree))),
    ];
    let git = GitHttp::start(&work);

    // First sync: each tool from nothing, on a quiet machine.
    let ours = followers[0].as_ref().expect("gitcanary's");
    let mut agent = None;
    let mut first = [None; 4];
    first[0] = Some(first_sync(SYNC_TOOLS[0], &ours.cluster, &prefix, n, || {
        agent = Some(Agent::start_as_installed(
            &ours.cluster,
            &git.url(&ours.repo),
            "bench-peers",
            &work.join("gitcanary-cache"),
            &work.join("gitcanary.log"),
        ));
    }));
    let agent = agent.expect("the agent started");
    for (column, layout) in [(1, Layout::PerApp), (2, Layout::Tree)] {
        if let Some(flux) = &followers[column] {
            first[column] = Some(first_sync(SYNC_TOOLS[column], &flux.cluster, &prefix, n, || {
                Flux::follow(&flux.cluster, &git.url(&flux.repo), layout, &flux.repo.work)
            }));
        }
    }
    first[3] = Some(first_sync(SYNC_TOOLS[3], &kubectl_cluster, &prefix, n, || {
        kubectl_cluster.kubectl(&[
            "apply",
            "--server-side",
            "--field-manager=bench",
            "-R",
            "-f",
            &ours.repo.work.display().to_string(),
        ]);
    }));

    // One changed object, pushed: gitcanary through its webhook, Flux
    // through a reconcile request on the GitRepository (a Receiver's work).
    // From the push: the figure includes a local `git push` for every tool.
    let ns = format!("{prefix}-7");
    let mut changes: [Vec<Duration>; 3] = Default::default();
    for round in 0..rounds {
        for (tool, follower) in followers.iter().enumerate() {
            let Some(follower) = follower else { continue };
            let color = change_one(&follower.repo, round);
            wait_quiet();
            let (started, done) = follower.cluster.time_until_color(&ns, "app-00007", &color, || {
                let commit = follower.repo.commit_and_push("one change");
                match &follower.flux {
                    None => agent.push(&commit),
                    Some((_, request)) => request.send(),
                }
            });
            changes[tool].push(done - started);
        }
        eprintln!("bench:   change {round}: gitcanary, Flux per app, Flux tree: {changes:?}");
    }
    for rounds in &mut changes {
        rounds.sort();
    }

    // The steady state at each tool's default intervals, nothing changing; the
    // kubectl control plane idles beside them as the baseline.
    wait_quiet();
    eprintln!("bench:   {} s with no change", steady.as_secs());
    let look = || -> [Option<Steady>; 4] {
        let mut looks = [None; 4];
        for (i, follower) in followers.iter().enumerate() {
            let Some(follower) = follower else { continue };
            let (tool_requests, tool_cpu) = match &follower.flux {
                None => (agent_requests(&agent), cpu_seconds(agent.child.id())),
                Some((flux, _)) => (flux.requests(), flux.cpu_seconds()),
            };
            looks[i] = Some(Steady {
                tool_requests,
                tool_cpu,
                ..Steady::of(&follower.cluster)
            });
        }
        looks[3] = Some(Steady::of(&kubectl_cluster));
        looks
    };
    let before = look();
    std::thread::sleep(steady);
    let after = look();
    let mut steady_figures = [None; 4];
    for (i, figures) in steady_figures.iter_mut().enumerate() {
        if let (Some(before), Some(after)) = (before[i], after[i]) {
            *figures = Some(after.since(&before));
        }
    }
    eprintln!("bench:   steady: {steady_figures:?}");
    let mut rss = [Some(agent.peak_rss_mib()), None, None];
    for column in [1, 2] {
        if let Some((flux, _)) = followers[column].as_ref().and_then(|f| f.flux.as_ref()) {
            rss[column] = Some(flux.peak_rss_mib());
        }
    }
    SyncFigures {
        first,
        changes,
        steady: steady_figures,
        rss,
    }
}

impl Steady {
    /// What the control plane's API server has counted so far.
    fn of(cluster: &ControlPlane) -> Steady {
        Steady {
            served: served_requests(cluster),
            apiserver_cpu: cpu_seconds(cluster.apiserver_pid()),
            bytes: cluster.response_bytes(),
            ..Steady::default()
        }
    }

    fn since(&self, before: &Steady) -> Steady {
        Steady {
            tool_requests: self.tool_requests - before.tool_requests,
            served: self.served - before.served,
            tool_cpu: self.tool_cpu - before.tool_cpu,
            apiserver_cpu: self.apiserver_cpu - before.apiserver_cpu,
            bytes: self.bytes - before.bytes,
        }
    }
}

/// The sync table's rows for one size: raw figures, each tool's own.
fn sync_rows(n: usize, steady: Duration, f: &SyncFigures) -> Vec<String> {
    let row = |what: String, cells: Vec<String>| format!("| {what} | {} |", cells.join(" | "));
    let dash = || "—".to_string();
    let not_run = || format!("not run (above {} objects)", per_app_up_to());
    let changes = |i: usize| {
        let rounds = &f.changes[i];
        match (rounds.first(), rounds.last()) {
            (Some(min), Some(max)) => format!(
                "{} ({}–{})",
                millis(percentile(rounds, 0.5)),
                millis(*min),
                millis(*max)
            ),
            _ => not_run(),
        }
    };
    let minutes = steady.as_secs_f64() / 60.0;
    let rounds = f.changes[0].len();
    let steady_row = |what: String, value: &dyn Fn(&Steady) -> String, idle: bool| {
        let mut cells: Vec<String> = f.steady[..3]
            .iter()
            .map(|s| s.as_ref().map_or_else(not_run, value))
            .collect();
        cells.push(match (&f.steady[3], idle) {
            (Some(s), true) => format!("{} (idle plane)", value(s)),
            _ => dash(),
        });
        row(what, cells)
    };
    let rss = |i: usize, whose: &str| f.rss[i].map_or_else(not_run, |r| format!("{r:.0} MiB{whose}"));
    vec![
        row(
            format!("first sync, {n} objects (to the last object's arrival at a watch)"),
            f.first.iter().map(|d| d.map_or_else(not_run, seconds)).collect(),
        ),
        row(
            format!("one changed object in {n} → applied (p50 of {rounds}, min–max)"),
            vec![changes(0), changes(1), changes(2), dash()],
        ),
        steady_row(
            format!("{minutes:.0} min with no change, {n} objects: API requests the tool counted"),
            &|s| format!("{:.0}", s.tool_requests),
            false,
        ),
        steady_row(
            "… requests the API server served (all clients)".to_string(),
            &|s| format!("{:.0}", s.served),
            true,
        ),
        steady_row(
            "… CPU-seconds of the tool".to_string(),
            &|s| format!("{:.2}", s.tool_cpu),
            false,
        ),
        steady_row(
            "… CPU-seconds of kube-apiserver".to_string(),
            &|s| format!("{:.2}", s.apiserver_cpu),
            true,
        ),
        steady_row(
            "… bytes the API server sent".to_string(),
            &|s| format!("{:.1} MiB", s.bytes / 1048576.0),
            true,
        ),
        row(
            format!("peak RSS, {n} objects"),
            vec![
                rss(0, ""),
                rss(1, " (both controllers)"),
                rss(2, " (both controllers)"),
                dash(),
            ],
        ),
    ]
}

fn main() {
    let sizes: Vec<usize> = std::env::var("GITCANARY_PEERS_SIZES")
        .unwrap_or_else(|_| "1000,5000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let steady = Duration::from_secs(
        std::env::var("GITCANARY_PEERS_STEADY_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600),
    );
    let rounds: usize = std::env::var("GITCANARY_PEERS_CHANGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let only = std::env::var("GITCANARY_PEERS_ONLY").unwrap_or_default();
    let workloads: usize = std::env::var("GITCANARY_PEERS_WORKLOADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let tools: Vec<Tool> = match std::env::var("GITCANARY_PEERS_TOOLS") {
        Ok(list) => [Tool::Gitcanary, Tool::ArgoRollouts, Tool::Flagger]
            .into_iter()
            .filter(|tool| list.split(',').any(|t| t.trim() == tool.key()))
            .collect(),
        Err(_) => vec![Tool::Gitcanary, Tool::ArgoRollouts, Tool::Flagger],
    };
    let mut needed = Vec::new();
    if only != "canary" {
        needed.push("flux");
    }
    if only != "sync" {
        needed.extend(tools.iter().filter_map(|tool| tool.peer()));
    }
    let peers = Peers::build(&needed);
    let mut rows = Vec::new();
    let sizes = if only == "canary" { Vec::new() } else { sizes };
    for &n in &sizes {
        let f = bench_sync(&peers, n, steady, rounds);
        rows.extend(sync_rows(n, steady, &f));
        eprintln!("bench: so far\n{}", rows.join("\n"));
    }
    let canary_rows = if only == "sync" {
        Vec::new()
    } else {
        canary_table(&peers, workloads, &tools)
    };
    if !rows.is_empty() {
        println!(
            "Flux: source-controller {}, kustomize-controller {}\n",
            peers.version("source-controller"),
            peers.version("kustomize-controller")
        );
        println!("| sync | {} |\n| --- | --- | --- | --- | --- |", SYNC_TOOLS.join(" | "));
        println!("{}\n", rows.join("\n"));
    }
    if !canary_rows.is_empty() {
        println!(
            "Argo Rollouts {}, Flagger {}\n",
            peers.version("argo-rollouts"),
            peers.version("flagger")
        );
        println!(
            "| canary (nginx Ingress, 20/50/100) | gitcanary | Argo Rollouts | Flagger |\n| --- | --- | --- | --- |"
        );
        println!("{}", canary_rows.join("\n"));
    }
}

fn canary_table(peers: &Peers, workloads: usize, tools: &[Tool]) -> Vec<String> {
    use canary::{ABORTS, RELEASES, STEP_WAIT};
    let figures: Vec<Option<canary::CanaryFigures>> = [Tool::Gitcanary, Tool::ArgoRollouts, Tool::Flagger]
        .into_iter()
        .map(|tool| tools.contains(&tool).then(|| bench_canary(tool, peers, workloads)))
        .collect();
    let row = |what: &str, value: &dyn Fn(&canary::CanaryFigures) -> Duration| {
        let ours = figures[0].as_ref().map(|f| value(f).as_secs_f64().max(1e-9));
        let cells: Vec<String> = figures
            .iter()
            .enumerate()
            .map(|(i, f)| match (f, ours) {
                (None, _) => "not run".to_string(),
                (Some(f), Some(ours)) if i > 0 => {
                    let v = value(f);
                    format!("{} ({:.1}×)", millis(v), v.as_secs_f64() / ours)
                }
                (Some(f), _) => millis(value(f)),
            })
            .collect();
        format!("| {what} | {} |", cells.join(" | "))
    };
    let wait = STEP_WAIT.as_secs();
    // What each tool was asked to wait between the two weights.
    let asked = [5.0, STEP_WAIT.as_secs_f64(), 10.0_f64.max(STEP_WAIT.as_secs_f64())];
    let beyond: Vec<String> = figures
        .iter()
        .zip(asked)
        .map(|(f, asked)| match f {
            Some(f) => format!("{:+.0} ms", (f.step_gap.as_secs_f64() - asked) * 1000.0),
            None => "not run".to_string(),
        })
        .collect();
    let rss: Vec<String> = figures
        .iter()
        .map(|f| {
            f.as_ref()
                .map_or("not run".to_string(), |f| format!("{:.0} MiB", f.rss))
        })
        .collect();
    vec![
        row(
            &format!(
                "change → first canary pod (p50 of {RELEASES}; gitcanary: git push + webhook; the others: the new template applied from the benchmark process, as Argo CD or Flux would)"
            ),
            &|f| f.to_canary,
        ),
        row(
            &format!(
                "20% applied → 50% applied (p50 of {RELEASES}; the wait asked for: gitcanary grace 3 s (its default) + pause {wait} s, Argo Rollouts pause {wait} s, Flagger interval {wait} s, which Flagger raises to its 10 s minimum)"
            ),
            &|f| f.step_gap,
        ),
        format!("| … beyond the wait asked for | {} |", beyond.join(" | ")),
        row(&format!("abort → every request on stable (p50 of {ABORTS})"), &|f| {
            f.abort
        }),
        format!("| peak RSS with {workloads} governed workloads | {} |", rss.join(" | ")),
    ]
}
