//! gitcanary against kubectl on the local control plane, same manifests,
//! one run: first sync, no-op resync (with the write requests each sends),
//! one changed object pushed by webhook, release latencies over 20
//! releases, and the agent's peak memory. Prints a markdown table.
//!
//!   cargo bench --bench sync                   # sizes 100, 1000, 5000, 20000
//!   GITCANARY_BENCH_SIZES=100 cargo bench --bench sync
//!   GITCANARY_BENCH_RELEASES=20                # releases measured
//!   GITCANARY_BENCH_RENDERED=0                 # skip the rendered repository
//!   GITCANARY_BENCH_AGENT_ONLY=1               # only the agent (no kubectl, no sync --once)
//!   GITCANARY_BENCH_SHARD_REPLICAS=3           # and the largest size over 3 replicas, 6 shards
//!
//! Not a test: it asserts nothing and is not run by CI.

mod common;
#[path = "sync/rendered.rs"]
mod rendered;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

const ROLLOUT_APP: &str = "apiVersion: v1
kind: Namespace
metadata: {name: bench-release}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo, namespace: bench-release}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers: [{name: echo, image: registry.test/echo:TAG}]
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: bench-release}
spec:
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo, namespace: bench-release}
spec:
  parentRefs: [{name: public}]
  rules:
  - backendRefs: [{name: echo, port: 80}]
---
apiVersion: gitcanary.io/v1alpha1
kind: Rollout
metadata: {name: echo, namespace: bench-release}
spec:
  workloadRef: {kind: Deployment, name: echo}
  strategy:
    canary:
      steps:
      - {traffic: 20%, replicas: 1, pause: {duration: 1}}
      - {traffic: 60%, replicas: 1, pause: {duration: 1}}
      trafficRoutings:
      - service: echo
        gateway: {httpRouteName: echo}
      gracePeriodSeconds: 0
";

fn main() {
    let sizes: Vec<usize> = std::env::var("GITCANARY_BENCH_SIZES")
        .unwrap_or_else(|_| "100,1000,5000,20000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let releases: usize = std::env::var("GITCANARY_BENCH_RELEASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // kubectl gets a control plane of its own, so that neither tool's run
    // finds the other's objects there (the cost of allocating a Service's
    // ClusterIP grows with the number of Services).
    eprintln!("bench: starting two control planes");
    let cluster = ControlPlane::start();
    let theirs_cluster = ControlPlane::start();
    let kubectl_version = cluster.kubectl(&["version", "--client", "-o", "json"]);
    let kubectl_version = kubectl_version
        .split("\"gitVersion\": \"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or("?")
        .to_string();
    cluster.install_rollout_crd();
    let work = cluster.dir.path().join("bench");
    std::fs::create_dir_all(&work).expect("mkdir");

    let mut table = vec![
        "| objects | first sync: gitcanary | kubectl apply --server-side -R | ratio | no-op resync: gitcanary (writes) | kubectl again | ratio |".to_string(),
        "| --- | --- | --- | --- | --- | --- | --- |".to_string(),
    ];
    // The agent is measured on 5,000 objects and more (or the largest size).
    let mut agent_repos: Vec<(usize, Repo)> = Vec::new();
    let agent_only = std::env::var("GITCANARY_BENCH_AGENT_ONLY").as_deref() == Ok("1");
    for &n in &sizes {
        eprintln!("bench: {n} objects");
        let repo = Repo::create(&work, &format!("gc{n}"));
        generate(&repo.work, &format!("gc{n}"), n);
        repo.commit_and_push("synthetic");
        if agent_only {
            agent_repos.push((n, repo));
            continue;
        }
        let theirs = work.join(format!("kc{n}"));
        generate(&theirs, &format!("kc{n}"), n);
        let cache = work.join(format!("cache{n}"));
        let instance = format!("bench-{n}");
        let sync = |cache: &Path| {
            timed(
                &work,
                GITCANARY,
                &[
                    "sync",
                    "--once",
                    "--repo",
                    &repo.url(),
                    "--kubeconfig",
                    &cluster.kubeconfig,
                    "--instance",
                    &instance,
                    "--state-namespace",
                    "gitcanary-bench",
                    "--cache-dir",
                    &cache.display().to_string(),
                ],
            )
        };
        let kubectl_apply = || {
            let started = Instant::now();
            theirs_cluster.kubectl(&[
                "apply",
                "--server-side",
                "--field-manager=bench",
                "-R",
                "-f",
                &theirs.display().to_string(),
            ]);
            started.elapsed()
        };
        wait_quiet();
        let (first, summary) = sync(&cache);
        eprintln!("bench:   gitcanary first sync {first:?}: {}", summary.trim());
        wait_quiet();
        let kubectl_first = kubectl_apply();
        eprintln!("bench:   kubectl first apply {kubectl_first:?}");
        // Once the controllers have caught up, health stops changing; the
        // resync after that is the no-op one (a sync that sees a change of
        // health writes the app's status, as it should).
        wait_quiet();
        let (settle, settled) = sync(&cache);
        eprintln!("bench:   gitcanary settle {settle:?}: {}", settled.trim());
        let (noop, summary) = sync(&cache);
        eprintln!("bench:   gitcanary no-op {noop:?}: {}", summary.trim());
        wait_quiet();
        let kubectl_noop = kubectl_apply();
        eprintln!("bench:   kubectl again {kubectl_noop:?}");
        table.push(format!(
            "| {n} | {} | {} | {:.2}× | {} ({} writes) | {} | {:.1}× faster |",
            seconds(first),
            seconds(kubectl_first),
            first.as_secs_f64() / kubectl_first.as_secs_f64(),
            seconds(noop),
            writes_of(&summary),
            seconds(kubectl_noop),
            kubectl_noop.as_secs_f64() / noop.as_secs_f64()
        ));
        if n >= 5000 || Some(&n) == sizes.iter().max() {
            agent_repos.push((n, repo));
        }
    }

    let rendered_rows = if std::env::var("GITCANARY_BENCH_RENDERED").as_deref() == Ok("0") {
        Vec::new()
    } else {
        bench_rendered(&cluster, &work)
    };

    let mut agent_rows = Vec::new();
    for (n, repo) in &agent_repos {
        eprintln!("bench: the agent on {n} objects");
        let starting = Instant::now();
        let agent = Agent::start(
            &cluster,
            &repo.url(),
            &format!("bench-{n}"),
            &work.join(format!("cache{n}")),
            // Outside the control plane's directory, so that it outlives a failed run.
            &std::env::temp_dir().join(format!("gitcanary-bench-agent-{n}.log")),
        );
        agent_rows.push(format!(
            "| agent first sync of {n} objects (start → ready) | {} |",
            seconds(starting.elapsed())
        ));
        // The steady state: a resync when nothing changed, from the agent's
        // own figures (sync time, requests), once its watches have listed.
        let metric = |name: &str| agent.metric(name);
        let head = run(&repo.work, "git", &["rev-parse", "HEAD"]).trim().to_string();
        agent.push(&head);
        wait_quiet();
        let mut noops = Vec::new();
        let (mut reads, mut lists) = (0.0, 0.0);
        for _ in 0..5 {
            let (count, sum) = (
                metric("gitcanary_sync_duration_seconds_count"),
                metric("gitcanary_sync_duration_seconds_sum"),
            );
            let (reads_before, lists_before) = (
                metric("gitcanary_kube_requests_total{kind=\"read\"}"),
                metric("gitcanary_kube_reads_total{kind=\"list\"}"),
            );
            agent.push(&head);
            wait_until("a resync", Duration::from_secs(120), || {
                metric("gitcanary_sync_duration_seconds_count") > count
            });
            noops.push(Duration::from_secs_f64(
                metric("gitcanary_sync_duration_seconds_sum") - sum,
            ));
            reads = metric("gitcanary_kube_requests_total{kind=\"read\"}") - reads_before;
            lists = metric("gitcanary_kube_reads_total{kind=\"list\"}") - lists_before;
        }
        noops.sort();
        agent_rows.push(format!(
            "| agent no-op resync of {n} objects (p50 of 5; API reads, of them lists, in the last) | {} ({reads} reads, {lists} lists) |",
            millis(percentile(&noops, 0.5))
        ));
        let mut changes = Vec::new();
        // Where a change's time goes: the load (fetch, parse, validate) and the syncs.
        let (loads_before, syncs_before) = (
            metric("gitcanary_git_fetch_duration_seconds_sum"),
            metric("gitcanary_sync_duration_seconds_sum"),
        );
        for i in 0..5 {
            let file = repo.work.join("app-00007/app.yaml");
            let text = std::fs::read_to_string(&file).expect("app");
            let before = format!("color: {}", if i % 2 == 0 { "blue" } else { "green" });
            let after = format!("color: {}", if i % 2 == 0 { "green" } else { "blue" });
            std::fs::write(&file, text.replace(&before, &after)).expect("write");
            let commit = repo.commit_and_push("one change");
            let wanted = after.trim_start_matches("color: ").to_string();
            let (started, done) =
                cluster.time_until_color(&format!("gc{n}-7"), "app-00007", &wanted, || agent.push(&commit));
            changes.push(done - started);
        }
        changes.sort();
        agent_rows.push(format!(
            "| one changed object in {n}, webhook → applied (p50 of 5) | {} |",
            millis(percentile(&changes, 0.5))
        ));
        let per_change = |total: f64| Duration::from_secs_f64(total / 5.0);
        eprintln!(
            "bench:   a change's load (fetch, parse, validate) {:?} and syncs {:?}, means of 5",
            per_change(metric("gitcanary_git_fetch_duration_seconds_sum") - loads_before),
            per_change(metric("gitcanary_sync_duration_seconds_sum") - syncs_before)
        );
        agent_rows.push(format!(
            "| agent peak RSS with {n} managed objects | {:.0} MiB |",
            agent.peak_rss_mib()
        ));
        eprintln!("bench: so far\n{}", agent_rows.join("\n"));
    }

    let replicas: usize = std::env::var("GITCANARY_BENCH_SHARD_REPLICAS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if let Some((n, repo)) = agent_repos.last().filter(|_| replicas > 0) {
        agent_rows.extend(bench_shards(&theirs_cluster, &work, *n, repo, replicas));
    }

    eprintln!("bench: {releases} releases");
    let release_repo = Repo::create(&work, "release");
    std::fs::create_dir_all(release_repo.work.join("echo")).expect("mkdir");
    let write_release = |tag: usize| {
        std::fs::write(
            release_repo.work.join("echo/app.yaml"),
            ROLLOUT_APP.replace("TAG", &tag.to_string()),
        )
        .expect("write")
    };
    write_release(1);
    release_repo.commit_and_push("echo 1");
    // Its log is kept (debug: each sync's trigger, timed) to say where a release's time went.
    let agent = Agent::start_with(
        &cluster,
        &release_repo.url(),
        "bench-release",
        &work.join("cache-release"),
        &std::env::temp_dir().join("gitcanary-bench-agent-release.log"),
        &[],
        &[("GITCANARY_LOG", "gitcanary=debug")],
    );
    // One watch per kind, from this process: each moment below is when the
    // API server's event reached it, not when a polling CLI got round to it.
    let watching_from = Instant::now();
    let rollouts = cluster.observe("gitcanary.io/v1alpha1", "Rollout", "rollouts", "bench-release");
    let deployments = cluster.observe("apps/v1", "Deployment", "deployments", "bench-release");
    let routes = cluster.observe(
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
        "httproutes",
        "bench-release",
    );
    let healthy = |object: &serde_json::Value| object["status"]["phase"] == "Healthy";
    let long = Duration::from_secs(120);
    let (mut settled, _) = rollouts.first_after("healthy", watching_from, long, healthy);
    let mut to_canary = Vec::new();
    let mut to_next_step = Vec::new();
    for release in 0..releases {
        let tag = release + 2;
        write_release(tag);
        let commit = release_repo.commit_and_push(&format!("echo {tag}"));
        for observer in [&rollouts, &deployments, &routes] {
            observer.forget_before(settled);
        }
        let started = Instant::now();
        agent.push(&commit);
        let image = format!("registry.test/echo:{tag}");
        let (created, _) = deployments.first_after("the canary Deployment", started, long, |d| {
            d["metadata"]["name"] == "echo-canary"
                && d["spec"]["template"]["spec"]["containers"][0]["image"] == image.as_str()
        });
        to_canary.push(created - started);
        // Step 1's pause ends one second after it began; step 2 routes 60%.
        let paused = rollouts.try_first_after(started, long, |r| {
            let canary = &r["status"]["canaryStatus"];
            canary["currentStepIndex"] == 1 && canary["currentStepState"] == "StepPaused"
        });
        let Some((paused, paused_rollout)) = paused else {
            // What each side last said, to tell a release that stalled from a canary that never became ready.
            let status = |object: Option<serde_json::Value>| object.map(|o| o["status"].clone());
            panic!(
                "timed out waiting for step 1 paused; the Rollout's last status: {}; the canary Deployment's: {}",
                serde_json::to_string_pretty(&status(rollouts.last("echo"))).unwrap_or_default(),
                serde_json::to_string_pretty(&status(deployments.last("echo-canary"))).unwrap_or_default()
            );
        };
        let paused_at = paused_rollout["status"]["canaryStatus"]["stateStartedAt"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (applied, _) = routes.first_after("60% routed", paused, long, |route| {
            route["spec"]["rules"][0]["backendRefs"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["weight"] == 60))
        });
        let applied_at = std::time::SystemTime::now() - applied.elapsed();
        let condition_met: std::time::SystemTime = paused_at
            .parse::<jiff::Timestamp>()
            .map(|t| std::time::SystemTime::from(t) + Duration::from_secs(1))
            .unwrap_or(applied_at);
        to_next_step.push(applied_at.duration_since(condition_met).unwrap_or(Duration::ZERO));
        (settled, _) = rollouts.first_after("promoted", applied, long, healthy);
        eprintln!(
            "bench:   release {tag}: canary after {:?}, next step after {:?}",
            to_canary.last().expect("one"),
            to_next_step.last().expect("one")
        );
    }
    to_canary.sort();
    to_next_step.sort();
    agent_rows.push(format!(
        "| webhook push → canary Deployment created (p50 / p99 of {releases}) | {} / {} |",
        millis(percentile(&to_canary, 0.5)),
        millis(percentile(&to_canary, 0.99))
    ));
    agent_rows.push(format!(
        "| step condition met → next step's traffic applied (p50 / p99 of {releases}) | {} / {} |",
        millis(percentile(&to_next_step, 0.5)),
        millis(percentile(&to_next_step, 0.99))
    ));
    drop(agent);

    println!("kubectl {kubectl_version} (built from the same Kubernetes tree as the control plane)\n");
    println!("{}\n", table.join("\n"));
    if !rendered_rows.is_empty() {
        println!(
            "| repository | first sync (renders) | no-op resync (renders) | one app changed (renders) |\n| --- | --- | --- | --- |\n{}\n",
            rendered_rows.join("\n")
        );
    }
    println!("| agent | measured |\n| --- | --- |\n{}", agent_rows.join("\n"));
}

fn renders_of(summary: &str) -> String {
    summary
        .split("renders: ")
        .nth(1)
        .map(|rest| rest.trim().to_string())
        .unwrap_or_else(|| "?".into())
}

/// `sync --once` on the rendered repository and on the same objects as plain
/// YAML: first sync, no-op resync, one app changed; each a new process, so
/// what the no-op one skips comes from the render cache on disk.
fn bench_rendered(cluster: &ControlPlane, work: &Path) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/renderers.sh");
    let bin = PathBuf::from(
        run(work, &script.display().to_string(), &[])
            .lines()
            .last()
            .unwrap_or_default(),
    );
    let (kustomize, helm) = (
        bin.join("kustomize").display().to_string(),
        bin.join("helm").display().to_string(),
    );
    let mut rows = Vec::new();
    for plain in [false, true] {
        let name = if plain { "plainrd" } else { "rendered" };
        let repo = Repo::create(work, name);
        let objects = if plain {
            rendered::generate_plain(&repo.work, name)
        } else {
            rendered::generate(&repo.work, name)
        };
        repo.commit_and_push("synthetic");
        let cache = work.join(format!("cache-{name}"));
        let sync = || {
            timed(
                work,
                GITCANARY,
                &[
                    "sync",
                    "--once",
                    "--repo",
                    &repo.url(),
                    "--kubeconfig",
                    &cluster.kubeconfig,
                    "--instance",
                    &format!("bench-{name}"),
                    "--state-namespace",
                    "gitcanary-bench",
                    "--cache-dir",
                    &cache.display().to_string(),
                    "--kustomize",
                    &kustomize,
                    "--helm",
                    &helm,
                ],
            )
        };
        eprintln!("bench: {name}: {objects} objects");
        wait_quiet();
        let (first, first_summary) = sync();
        eprintln!("bench:   first sync {first:?}: {}", first_summary.trim());
        wait_quiet();
        let _settle = sync();
        let (noop, noop_summary) = sync();
        eprintln!("bench:   no-op {noop:?}: {}", noop_summary.trim());
        if plain {
            rendered::change_one_plain(&repo.work);
        } else {
            rendered::change_one_value(&repo.work);
        }
        repo.commit_and_push("one app changed");
        wait_quiet();
        let (changed, changed_summary) = sync();
        eprintln!("bench:   one app changed {changed:?}: {}", changed_summary.trim());
        let label = if plain {
            format!("the same {objects} objects as plain YAML")
        } else {
            format!(
                "{} Kustomize apps (base + overlay) and {} Helm apps, {objects} objects",
                rendered::KUSTOMIZE_APPS,
                rendered::HELM_APPS
            )
        };
        rows.push(format!(
            "| {label} | {} ({}) | {} ({}) | {} ({}) |",
            seconds(first),
            renders_of(&first_summary),
            seconds(noop),
            renders_of(&noop_summary),
            seconds(changed),
            renders_of(&changed_summary)
        ));
    }
    rows
}

/// The repository of `n` objects over `replicas` agents sharing `2 × replicas`
/// shards, on a control plane of its own: the time until every app has been
/// synced once (its status recorded), and each replica's peak memory.
fn bench_shards(cluster: &ControlPlane, work: &Path, n: usize, repo: &Repo, replicas: usize) -> Vec<String> {
    eprintln!("bench: {n} objects over {replicas} shard replicas");
    let shards = (replicas * 2).to_string();
    let apps = (n - 10) / 4 + 1;
    let started = Instant::now();
    let agents: Vec<Agent> = (0..replicas)
        .map(|i| {
            let identity = format!("replica-{i}");
            Agent::start_with(
                cluster,
                &repo.url(),
                "bench-shards",
                &work.join(format!("cache-shards-{i}")),
                &std::env::temp_dir().join(format!("gitcanary-bench-shard-{i}.log")),
                &["--shards", &shards, "--leader-identity", &identity],
                &[],
            )
        })
        .collect();
    let synced = || {
        cluster
            .kubectl(&[
                "get",
                "configmaps",
                "-n",
                "gitcanary-bench",
                "-l",
                "gitcanary.io/app-status=bench-shards",
                "-o",
                "name",
            ])
            .lines()
            .count()
    };
    let done = loop {
        if synced() >= apps {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "the replicas never synced every app"
        );
        std::thread::sleep(Duration::from_secs(5));
    };
    let memory: Vec<String> = agents.iter().map(|a| format!("{:.0} MiB", a.peak_rss_mib())).collect();
    vec![
        format!(
            "| {n} objects over {replicas} replicas, {shards} shards: every app synced once (start → last status) | {} |",
            seconds(done)
        ),
        format!("| … each replica's peak RSS | {} |", memory.join(", ")),
    ]
}
