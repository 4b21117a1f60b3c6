//! GitHub's quota with many gates open: N Rollouts (20 by default) paused
//! at their promotion pull requests, nobody acting, for a window (10
//! minutes by default). Two agents run side by side on the same control
//! plane, each with a GitHub fake of its own: one receives GitHub's
//! webhook events, the other only polls. Prints the requests GitHub would
//! count (every one but a 304) and the free 304s over the window, by
//! endpoint; then, for the agent with events, how long a `/gitcanary
//! promote` comment takes to move its Rollout on.
//!
//!   cargo bench --bench github_gates
//!   GITCANARY_BENCH_ROLLOUTS=5 GITCANARY_BENCH_WINDOW=60 cargo bench --bench github_gates
//!
//! Not a test: it asserts nothing and is not run by CI.

mod common;
#[allow(dead_code)]
#[path = "../tests/support/github.rs"]
mod github;
#[path = "../tests/support/serve.rs"]
mod serve;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use github::GitHubFake;
use serve::serve_on_own_thread;

/// A request's endpoint: numbers, commits, ranges and branches as placeholders.
fn endpoint(method: &str, path: &str) -> String {
    let shape: Vec<String> = path
        .split('/')
        .map(|part| {
            if !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()) {
                "{n}".to_string()
            } else if part.len() >= 40 && part.chars().all(|c| c.is_ascii_hexdigit() || c == '.') {
                "{sha}".to_string()
            } else {
                part.to_string()
            }
        })
        .collect();
    let path = shape.join("/").replace("/repos/acme/apps", "");
    let path = path.split("/git/ref/heads/").next().map_or(path.clone(), |head| {
        if path.contains("/git/ref/heads/") {
            format!("{head}/git/ref/heads/{{branch}}")
        } else {
            head.to_string()
        }
    });
    format!("{method} {path}")
}

/// (counted, free) requests by endpoint since `from` (an index into the fake's log).
fn by_endpoint(fake: &GitHubFake, from: (usize, usize)) -> BTreeMap<String, (usize, usize)> {
    let data = fake.data.lock().expect("lock");
    let mut table: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (method, path) in &data.requests[from.0..] {
        table.entry(endpoint(method, path)).or_default().0 += 1;
    }
    for (method, path) in &data.free[from.1..] {
        let entry = table.entry(endpoint(method, path)).or_default();
        entry.0 -= 1;
        entry.1 += 1;
    }
    table
}

fn marks(fake: &GitHubFake) -> (usize, usize) {
    let data = fake.data.lock().expect("lock");
    (data.requests.len(), data.free.len())
}

fn main() {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let count = env("GITCANARY_BENCH_ROLLOUTS", 20) as usize;
    let window = Duration::from_secs(env("GITCANARY_BENCH_WINDOW", 600));
    eprintln!("bench: starting the control plane");
    let cluster = ControlPlane::start();
    cluster.install_rollout_crd();
    let work = cluster.dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");

    struct Side {
        prefix: &'static str,
        repo: Repo,
        fake: GitHubFake,
        agent: Agent,
    }
    let side = |prefix: &'static str, events: bool| {
        let repo = Repo::create(&work, prefix);
        let fake = runtime.block_on(GitHubFake::start_for(&repo.bare));
        fake.grant("alice", "write");
        // The bench's commits are carol's; alice wrote none of them.
        fake.link_email("bench@example.test", "carol");
        for index in 0..count {
            let dir = repo.work.join(format!("app-{index:03}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("app.yaml"), paused_rollout_app(prefix, index, "1")).expect("write");
        }
        let first = repo.commit_and_push("1");
        let args = ["--github-url", fake.url.as_str(), "--github-repo", "acme/apps"];
        let agent = Agent::start_with(
            &cluster,
            &repo.url(),
            &format!("bench-{prefix}"),
            &work.join(format!("cache-{prefix}")),
            &std::env::temp_dir().join(format!("gitcanary-bench-{prefix}.log")),
            &args,
            &[("GITCANARY_GITHUB_TOKEN", "ghp_bench")],
        );
        if events {
            fake.deliver_to(&format!("http://127.0.0.1:{}/webhook", agent.port), WEBHOOK_SECRET);
        }
        agent.push(&first);
        Side {
            prefix,
            repo,
            fake,
            agent,
        }
    };
    let sides = [side("gates-events", true), side("gates-polling", false)];
    let phases = |prefix: &str| {
        let out = cluster.kubectl(&[
            "get",
            "rollouts",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace}={.status.phase} {end}",
        ]);
        out.split_whitespace()
            .filter(|p| p.starts_with(prefix))
            .map(|p| p.rsplit('=').next().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    let all_in = |prefix: &str, phase: &str| phases(prefix).iter().filter(|p| *p == phase).count() == count;
    for side in &sides {
        wait_until("every Rollout healthy", Duration::from_secs(600), || {
            all_in(side.prefix, "Healthy")
        });
    }
    for side in &sides {
        for index in 0..count {
            let file = side.repo.work.join(format!("app-{index:03}/app.yaml"));
            std::fs::write(file, paused_rollout_app(side.prefix, index, "2")).expect("write");
        }
        let second = side.repo.commit_and_push("2");
        side.fake.carry(&second, 7);
        side.agent.push(&second);
    }
    let gates_open = |fake: &GitHubFake| {
        fake.pulls()
            .iter()
            .filter(|p| p.open && p.head.starts_with("gitcanary/promote/"))
            .count()
            == count
    };
    for side in &sides {
        wait_until("every Rollout paused", Duration::from_secs(600), || {
            all_in(side.prefix, "Paused")
        });
        wait_until("every gate open", Duration::from_secs(600), || gates_open(&side.fake));
    }
    wait_quiet();
    eprintln!(
        "bench: {count} gates open on each side; counting for {} s",
        window.as_secs()
    );
    let starts: Vec<(usize, usize)> = sides.iter().map(|side| marks(&side.fake)).collect();
    std::thread::sleep(window);
    let tables: Vec<_> = sides
        .iter()
        .zip(&starts)
        .map(|(side, start)| by_endpoint(&side.fake, *start))
        .collect();

    // A writer's promote on each gate, delivered as an event: the time from
    // the comment to its Rollout leaving the pause.
    let events = &sides[0];
    let mut latencies = Vec::new();
    for index in 0..count {
        let ns = format!("{}-{index:03}", events.prefix);
        let gate = events
            .fake
            .pulls()
            .into_iter()
            .find(|p| p.open && p.head.contains(&format!("/{ns}/")))
            .expect("the gate");
        let phase = || cluster.kubectl(&["get", "rollout", "echo", "-n", &ns, "-o", "jsonpath={.status.phase}"]);
        let started = Instant::now();
        events.fake.comment(gate.number, "alice", "/gitcanary promote");
        let moved = wait_until("the promote acted on", Duration::from_secs(120), || phase() != "Paused");
        latencies.push(moved - started);
    }
    latencies.sort();

    println!(
        "| {count} gates open, nobody acting, {} s | GitHub requests counted | 304s (free) |",
        window.as_secs()
    );
    println!("| --- | --- | --- |");
    for (side, table) in sides.iter().zip(&tables) {
        let (counted, free) = table.values().fold((0, 0), |(c, f), (dc, df)| (c + dc, f + df));
        let mode = if side.prefix.ends_with("events") {
            "with GitHub's events"
        } else {
            "polling only"
        };
        println!("| {mode} | {counted} | {free} |");
    }
    for (side, table) in sides.iter().zip(&tables) {
        println!("\n{} by endpoint (counted / free):\n", side.prefix);
        println!("| endpoint | counted | 304s |");
        println!("| --- | --- | --- |");
        for (endpoint, (counted, free)) in table {
            println!("| `{endpoint}` | {counted} | {free} |");
        }
    }
    println!(
        "\n`/gitcanary promote` by event → Rollout moved on ({count} gates, one at a time): p50 {}, p99 {}, max {}",
        millis(percentile(&latencies, 0.50)),
        millis(percentile(&latencies, 0.99)),
        millis(*latencies.last().expect("latencies"))
    );
}
