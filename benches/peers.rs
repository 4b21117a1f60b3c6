//! gitcanary against the tools users would pick instead, each on a fresh
//! control plane of its own, on the same manifests, in one run. Sync:
//! gitcanary, Flux (source- and kustomize-controller) and kubectl. Canary:
//! gitcanary, Argo Rollouts and Flagger. The peers are built from their Go
//! modules by benches/peers/build.sh (cached). Prints markdown tables.
//!
//!   cargo bench --bench peers
//!   GITCANARY_PEERS_SIZES=1000,5000     # objects (default)
//!   GITCANARY_PEERS_STEADY_SECONDS=600  # the window with no change (default 10 minutes)
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

/// Flux's source- and kustomize-controller, out of cluster, with their CRDs.
struct Flux {
    source: Process,
    kustomize: Process,
    metrics: [u16; 2],
}

const FLUX_NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: flux-system}\n";

impl Flux {
    fn start(cluster: &ControlPlane, peers: &Peers, work: &Path) -> Flux {
        for name in ["source-controller", "kustomize-controller"] {
            let crds = peers.dir(name).join("crds");
            cluster.kubectl(&["apply", "--server-side", "-f", &crds.display().to_string()]);
        }
        cluster.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"]);
        cluster.apply_yaml(FLUX_NAMESPACE);
        let storage = work.join("flux-storage");
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
            ],
            &cluster.kubeconfig,
            &work.join("source-controller.log"),
        );
        let kustomize = Process::start(
            &peers.dir("kustomize-controller").join("bin/kustomize-controller"),
            &[
                format!("--metrics-addr=127.0.0.1:{}", metrics[1]),
                format!("--health-addr=127.0.0.1:{}", free_port()),
            ],
            &cluster.kubeconfig,
            &work.join("kustomize-controller.log"),
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

    /// One GitRepository and one Kustomization over the whole tree, at the
    /// intervals `flux bootstrap` writes (1m and 10m), pruning.
    fn follow(cluster: &ControlPlane, url: &str) {
        cluster.apply_yaml(&format!(
            "apiVersion: source.toolkit.fluxcd.io/v1\nkind: GitRepository\nmetadata: {{name: bench, namespace: flux-system}}\nspec:\n  interval: 1m0s\n  url: {url}\n  ref: {{branch: main}}\n---\napiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {{name: bench, namespace: flux-system}}\nspec:\n  interval: 10m0s\n  sourceRef: {{kind: GitRepository, name: bench}}\n  path: ./\n  prune: true\n"
        ));
    }

    fn applied_revision(cluster: &ControlPlane) -> String {
        cluster.kubectl(&[
            "get",
            "kustomization",
            "bench",
            "-n",
            "flux-system",
            "-o",
            "jsonpath={.status.lastAppliedRevision}",
        ])
    }

    /// What a Flux Receiver does on a push: ask the GitRepository to reconcile now.
    fn request_reconcile(cluster: &ControlPlane) {
        let at = format!("{:?}", std::time::SystemTime::now());
        cluster.kubectl(&[
            "annotate",
            "--overwrite",
            "gitrepository",
            "bench",
            "-n",
            "flux-system",
            &format!("reconcile.fluxcd.io/requestedAt={at}"),
        ]);
    }
}

/// The agent's API requests so far, from its own counter.
fn agent_requests(agent: &Agent) -> f64 {
    metric_sum(
        &agent.get("/metrics").unwrap_or_default(),
        "gitcanary_kube_requests_total",
    )
}

fn agent_syncs(agent: &Agent) -> f64 {
    metric_sum(
        &agent.get("/metrics").unwrap_or_default(),
        "gitcanary_sync_duration_seconds_count",
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

struct SyncFigures {
    first: [Duration; 3],
    change: [Duration; 2],
    /// Per tool (gitcanary, Flux, none): requests, tool CPU s, API server CPU s, response bytes.
    steady: [(f64, f64, f64, f64); 3],
    rss: [f64; 2],
}

fn bench_sync(peers: &Peers, n: usize, steady: Duration) -> SyncFigures {
    eprintln!("bench: {n} objects: three control planes (gitcanary, Flux, kubectl)");
    let ours = ControlPlane::start();
    let flux_cluster = ControlPlane::start();
    let kubectl_cluster = ControlPlane::start();
    let work = ours.dir.path().join("peers");
    std::fs::create_dir_all(&work).expect("mkdir");
    // The same tree twice, so that each tool sees only the pushes meant for it
    // (Flux polls every minute, and would take the other's commit on its own).
    let repo = Repo::create(&work, &format!("tree{n}"));
    generate(&repo.work, &format!("t{n}"), n);
    repo.commit_and_push("synthetic");
    let flux_repo = Repo::create(&work, &format!("flux{n}"));
    generate(&flux_repo.work, &format!("t{n}"), n);
    let head = flux_repo.commit_and_push("synthetic");
    let git = GitHttp::start(&work);
    let flux = Flux::start(&flux_cluster, peers, &work);

    // First sync: each tool from nothing, on a quiet machine.
    wait_quiet();
    let started = Instant::now();
    let agent = Agent::start(
        &ours,
        &git.url(&repo),
        "bench-peers",
        &work.join("gitcanary-cache"),
        &work.join("gitcanary.log"),
    );
    wait_until("gitcanary's first sync", Duration::from_secs(1800), || {
        agent_syncs(&agent) >= 1.0
    });
    let gitcanary_first = started.elapsed();
    eprintln!("bench:   gitcanary first sync {gitcanary_first:?}");
    wait_quiet();
    let started = Instant::now();
    Flux::follow(&flux_cluster, &git.url(&flux_repo));
    wait_until("Flux's first sync", Duration::from_secs(1800), || {
        Flux::applied_revision(&flux_cluster).contains(&head)
    });
    let flux_first = started.elapsed();
    eprintln!("bench:   Flux first sync {flux_first:?}");
    wait_quiet();
    let started = Instant::now();
    kubectl_cluster.kubectl(&[
        "apply",
        "--server-side",
        "--field-manager=bench",
        "-R",
        "-f",
        &repo.work.display().to_string(),
    ]);
    let kubectl_first = started.elapsed();
    eprintln!("bench:   kubectl first apply {kubectl_first:?}");

    // One changed object, pushed: gitcanary through its webhook, Flux
    // through a reconcile request on the GitRepository (a Receiver's work).
    let mut gitcanary_changes = Vec::new();
    let mut flux_changes = Vec::new();
    let ns = format!("t{n}-7");
    // From the push: the figure includes a local `git push` for both.
    for round in 0..5 {
        let color = change_one(&repo, round);
        wait_quiet();
        let (started, done) = ours.time_until_color(&ns, "app-00007", &color, || {
            agent.push(&repo.commit_and_push("one change"));
        });
        gitcanary_changes.push(done - started);
        change_one(&flux_repo, round);
        wait_quiet();
        let (started, done) = flux_cluster.time_until_color(&ns, "app-00007", &color, || {
            flux_repo.commit_and_push("one change");
            Flux::request_reconcile(&flux_cluster);
        });
        flux_changes.push(done - started);
        eprintln!(
            "bench:   change {round}: gitcanary {:?}, Flux {:?}",
            gitcanary_changes[round], flux_changes[round]
        );
    }
    gitcanary_changes.sort();
    flux_changes.sort();

    // The steady state at each tool's default interval, nothing changing; the
    // kubectl control plane idles beside them as the baseline.
    wait_quiet();
    eprintln!("bench:   {} s with no change", steady.as_secs());
    let clusters = [&ours, &flux_cluster, &kubectl_cluster];
    let before_requests = [agent_requests(&agent), flux.requests(), 0.0];
    let before_cpu = [cpu_seconds(agent.child.id()), flux.cpu_seconds(), 0.0];
    let before_server: Vec<(f64, f64)> = clusters
        .iter()
        .map(|c| (cpu_seconds(c.apiserver_pid()), c.response_bytes()))
        .collect();
    std::thread::sleep(steady);
    let after_requests = [agent_requests(&agent), flux.requests(), 0.0];
    let after_cpu = [cpu_seconds(agent.child.id()), flux.cpu_seconds(), 0.0];
    let mut steady_figures = [(0.0, 0.0, 0.0, 0.0); 3];
    for (i, cluster) in clusters.iter().enumerate() {
        steady_figures[i] = (
            after_requests[i] - before_requests[i],
            after_cpu[i] - before_cpu[i],
            cpu_seconds(cluster.apiserver_pid()) - before_server[i].0,
            cluster.response_bytes() - before_server[i].1,
        );
    }
    eprintln!("bench:   steady: {steady_figures:?}");
    let rss = [
        agent.peak_rss_mib(),
        peak_rss_mib(flux.source.pid()) + peak_rss_mib(flux.kustomize.pid()),
    ];
    SyncFigures {
        first: [gitcanary_first, flux_first, kubectl_first],
        change: [percentile(&gitcanary_changes, 0.5), percentile(&flux_changes, 0.5)],
        steady: steady_figures,
        rss,
    }
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
        let f = bench_sync(&peers, n, steady);
        let ratio = |theirs: Duration, ours: Duration| theirs.as_secs_f64() / ours.as_secs_f64().max(1e-9);
        rows.push(format!(
            "| first sync, {n} objects | {} | {} ({:.2}×) | {} ({:.2}×) |",
            seconds(f.first[0]),
            seconds(f.first[1]),
            ratio(f.first[1], f.first[0]),
            seconds(f.first[2]),
            ratio(f.first[2], f.first[0]),
        ));
        rows.push(format!(
            "| one changed object in {n} → applied (p50 of 5) | {} | {} ({:.1}×) | — |",
            millis(f.change[0]),
            millis(f.change[1]),
            ratio(f.change[1], f.change[0]),
        ));
        let minutes = steady.as_secs_f64() / 60.0;
        let [ours, flux, idle] = f.steady;
        rows.push(format!(
            "| {minutes:.0} min with no change, {n} objects: API requests | {:.0} | {:.0} | — |",
            ours.0, flux.0
        ));
        rows.push(format!(
            "| … CPU-seconds of the tool | {:.2} | {:.2} | — |",
            ours.1, flux.1
        ));
        rows.push(format!(
            "| … CPU-seconds of kube-apiserver (an idle control plane: {:.2}) | {:.2} | {:.2} | — |",
            idle.2, ours.2, flux.2
        ));
        rows.push(format!(
            "| … bytes the API server sent (an idle control plane: {:.1} MiB) | {:.1} MiB | {:.1} MiB | — |",
            idle.3 / 1048576.0,
            ours.3 / 1048576.0,
            flux.3 / 1048576.0
        ));
        rows.push(format!(
            "| peak RSS, {n} objects | {:.0} MiB | {:.0} MiB (both controllers) | — |",
            f.rss[0], f.rss[1]
        ));
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
        println!("| sync | gitcanary | Flux | kubectl apply --server-side -R |\n| --- | --- | --- | --- |");
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
                "change → first canary pod (p50 of {RELEASES}; gitcanary: git push + webhook; the others: kubectl apply, as Argo CD or Flux would)"
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
