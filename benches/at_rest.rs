//! Rollouts at rest: N Rollouts (100 by default) paused at an indefinite
//! step, nothing changing, GitHub off. Prints what the agent spends per
//! minute meanwhile (API requests besides its watches, CPU) while a push of
//! the same head comes every 5 s, then while nothing comes at all (its own
//! poll every 60 s, the default, which finds the head at rest), then how
//! long one drift of a canary takes to be put back and how many apps that
//! re-plans.
//!
//!   cargo bench --bench at_rest
//!   GITCANARY_BENCH_ROLLOUTS=1 cargo bench --bench at_rest   # what the agent costs with one
//!
//! Not a test: it asserts nothing and is not run by CI.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// kube's watch timeout: each of the agent's watches ends and starts again
/// about once in a window this long (a cycle is 290 s and the restart).
const QUIET: Duration = Duration::from_secs(290);

fn main() {
    let count: usize = std::env::var("GITCANARY_BENCH_ROLLOUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    eprintln!("bench: starting the control plane");
    let cluster = ControlPlane::start();
    cluster.install_rollout_crd();
    let work = cluster.dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let repo = Repo::create(&work, "at-rest");
    let write_all = |tag: &str| {
        for index in 0..count {
            let dir = repo.work.join(format!("app-{index:03}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("app.yaml"), paused_rollout_app("rest", index, tag)).expect("write");
        }
    };
    write_all("1");
    let first = repo.commit_and_push("1");
    // The default poll: the quiet minutes below see what it costs.
    let agent = Agent::start_with(
        &cluster,
        &repo.url(),
        "bench-rest",
        &work.join("cache"),
        &std::env::temp_dir().join("gitcanary-bench-at-rest.log"),
        &["--poll-interval", "60"],
        &[],
    );
    agent.push(&first);
    let phases = || {
        cluster.kubectl(&[
            "get",
            "rollouts",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.status.phase} {end}",
        ])
    };
    let all_in = |phase: &str| {
        let out = phases();
        out.split_whitespace().filter(|p| *p == phase).count() == count
    };
    wait_until("every Rollout healthy", Duration::from_secs(600), || all_in("Healthy"));
    write_all("2");
    let second = repo.commit_and_push("2");
    agent.push(&second);
    wait_until("every Rollout paused", Duration::from_secs(600), || all_in("Paused"));
    wait_quiet();

    let metric = |name: &str| agent.metric(name);
    let requests = || {
        metric("gitcanary_kube_requests_total{kind=\"read\"}")
            + metric("gitcanary_kube_requests_total{kind=\"write\"}")
            + metric("gitcanary_kube_requests_total{kind=\"dry_run\"}")
            - metric("gitcanary_kube_reads_total{kind=\"watch\"}")
            - metric("gitcanary_kube_lease_requests_total")
    };
    // The agent's own getrusage, to the microsecond (/proc counts 10 ms ticks).
    let cpu = || metric("process_cpu_seconds_total");
    // Between two readings lies one whole scrape of /metrics (the end of the
    // first's, the start of the second's): the benchmark's own reading,
    // taken out of each figure below. The least of a few back-to-back pairs
    // (a failed reading, 0, leaves its pair out).
    let scrape_cost = || {
        let least = (0..5)
            .filter_map(|_| {
                let (first, second) = (cpu(), cpu());
                (first > 0.0 && second > 0.0).then_some(second - first)
            })
            .fold(f64::INFINITY, f64::min);
        if least.is_finite() { least } else { 0.0 }
    };
    let syncs = || metric("gitcanary_sync_duration_seconds_count");
    // The sync that paused them moved their statuses: one more resync plans
    // them again and finds them at rest.
    let warm = syncs();
    agent.push(&second);
    wait_until("a resync", Duration::from_secs(120), || syncs() > warm);
    wait_quiet();
    // A resync every 5 s (webhook pushes of the same head), as a poll would.
    let planned_before = metric("gitcanary_apps_planned_total");
    let recalled_before = metric("gitcanary_apps_recalled_total");
    let fetch_seconds = || metric("gitcanary_git_fetch_duration_seconds_sum");
    let sync_seconds = || metric("gitcanary_sync_duration_seconds_sum");
    let (fetch_before, sync_before) = (fetch_seconds(), sync_seconds());
    let scrape_cpu = scrape_cost();
    let (requests_before, syncs_before) = (requests(), syncs());
    let cpu_before = cpu();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        agent.push(&second);
        std::thread::sleep(Duration::from_secs(5));
    }
    let cpu_resyncing = cpu() - cpu_before - scrape_cpu;
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let (requests_at_rest, cpu_at_rest, resyncs) = (
        (requests() - requests_before) / minutes,
        cpu_resyncing / minutes,
        syncs() - syncs_before,
    );
    let per_resync = |seconds: f64| format!("{:.2} ms", seconds * 1000.0 / resyncs.max(1.0));
    let (fetch_each, sync_each) = (
        per_resync(fetch_seconds() - fetch_before),
        per_resync(sync_seconds() - sync_before),
    );
    let (planned_at_rest, recalled_at_rest) = (
        metric("gitcanary_apps_planned_total") - planned_before,
        metric("gitcanary_apps_recalled_total") - recalled_before,
    );

    // Nothing at all for one watch timeout (290 s), so that every watch
    // restarts about once inside: the agent's own polls (every 60 s) only.
    wait_quiet();
    let watches = || metric("gitcanary_kube_reads_total{kind=\"watch\"}");
    // A poll that finds the head where the agent is at rest neither fetches nor syncs.
    let polls_at_rest = || metric("gitcanary_git_polls_at_rest_total");
    let (requests_before, syncs_before, watches_before) = (requests(), syncs(), watches());
    let polls_at_rest_before = polls_at_rest();
    let cpu_before = cpu();
    // Read between the scrapes, so as to count almost none of theirs.
    let threads_before = woken(agent.child.id());
    let faults_before = page_faults(agent.child.id());
    let started = Instant::now();
    std::thread::sleep(QUIET);
    let wake_ups = wake_ups_between(&threads_before, &woken(agent.child.id()));
    let faults = page_faults(agent.child.id()).zip(faults_before);
    let cpu_quiet_total = cpu() - cpu_before - scrape_cpu;
    let minutes_quiet = started.elapsed().as_secs_f64() / 60.0;
    let (requests_quiet, syncs_quiet) = ((requests() - requests_before) / minutes_quiet, syncs() - syncs_before);
    let polls_quiet_at_rest = polls_at_rest() - polls_at_rest_before;
    let cpu_quiet = cpu_quiet_total / minutes_quiet;
    let watches_quiet = (watches() - watches_before) / minutes_quiet;
    let woken_quiet = wake_ups as f64 / minutes_quiet;

    // One drift: a canary scaled by hand is put back, re-planning its app only.
    let planned_before = metric("gitcanary_apps_planned_total");
    let drift_started = Instant::now();
    // The eighth app's canary (the last one's, with fewer than eight).
    let drifted = format!("rest-{:03}", count.clamp(1, 8) - 1);
    cluster.kubectl(&["scale", "deployment", "echo-canary", "-n", &drifted, "--replicas=3"]);
    let healed = wait_until("the canary put back", Duration::from_secs(60), || {
        cluster.kubectl(&[
            "get",
            "deployment",
            "echo-canary",
            "-n",
            &drifted,
            "-o",
            "jsonpath={.spec.replicas}",
        ]) == "1"
    });
    std::thread::sleep(Duration::from_secs(1));
    let planned = metric("gitcanary_apps_planned_total") - planned_before;
    let one_wake_up = wake_up_cost();

    println!("| {count} Rollouts paused at an indefinite step, GitHub off | measured |");
    println!("| --- | --- |");
    println!(
        "| API requests per minute besides watches and the Lease ({resyncs} resyncs in {:.0} s) | {requests_at_rest:.1} |",
        minutes * 60.0
    );
    println!("| agent CPU per minute | {:.1} ms |", cpu_at_rest * 1000.0);
    println!("| … a resync's fetch and sync, wall time | {fetch_each}, {sync_each} |");
    println!("| … app syncs planned / answered from memory | {planned_at_rest} / {recalled_at_rest} |");
    println!(
        "| nothing pushed, the default 60 s poll ({polls_quiet_at_rest} polls found the head at rest, {syncs_quiet} syncs in {:.0} s): API requests per minute | {requests_quiet:.1} |",
        minutes_quiet * 60.0
    );
    println!("| … agent CPU per minute | {:.2} ms |", cpu_quiet * 1000.0);
    println!(
        "| … one scrape of /metrics (the benchmark's reading, taken out of both CPU figures) | {:.2} ms |",
        scrape_cpu * 1000.0
    );
    println!("| … watches started again per minute | {watches_quiet:.1} |");
    println!("| … the agent's threads woken per minute | {woken_quiet:.1} |");
    println!(
        "| … page faults in the quiet minutes, minor / major (the kernel's work, billed to the agent) | {} |",
        faults.map_or(
            "not read".to_string(),
            |((minor, major), (minor_before, major_before))| format!(
                "{} / {}",
                minor - minor_before,
                major - major_before
            )
        )
    );
    println!(
        "| a canary scaled by hand → put back | {} |",
        millis(healed - drift_started)
    );
    println!("| … app syncs planned after it | {planned} |");
    println!(
        "| one wake-up of a sleeping thread on this machine (1 s `std::thread::sleep`, the thread's own CPU) | {} |",
        one_wake_up.map_or("not read".to_string(), |seconds| format!("{:.0} µs", seconds * 1e6))
    );
}

/// How many times each thread of process `pid` has gone to sleep and been
/// woken so far (its voluntary context switches), by thread id.
fn woken(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Default::default();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let count = status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))?
                .trim()
                .parse()
                .ok()?;
            Some((task.file_name().to_string_lossy().into_owned(), count))
        })
        .collect()
}

/// Process `pid`'s page faults so far, minor and major (`/proc/<pid>/stat`
/// fields 10 and 12): a page the kernel took back while the agent slept (a
/// host that reclaims cold memory pages code out) is faulted in again on
/// its next wake-up, and that work counts as the agent's CPU.
fn page_faults(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: field 3 onwards.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.get(7)?.parse().ok()?, fields.get(9)?.parse().ok()?))
}

/// The wake-ups between two readings of `woken`: a thread that ended
/// meanwhile counts once (its last count went with it), a new one whole.
fn wake_ups_between(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> u64 {
    let ended = before.keys().filter(|thread| !after.contains_key(*thread)).count() as u64;
    let woken: u64 = after
        .iter()
        .map(|(thread, count)| count.saturating_sub(before.get(thread).copied().unwrap_or(0)))
        .sum();
    woken + ended
}

/// The CPU one wake-up of a sleeping thread costs here, doing nothing else:
/// the floor under each of the agent's wake-ups (a virtual machine's is
/// many times a bare machine's).
fn wake_up_cost() -> Option<f64> {
    let thread_cpu = || {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage only writes the struct it is given.
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: zeroed, then filled in by getrusage.
        let usage = unsafe { usage.assume_init() };
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
    };
    const WAKE_UPS: u32 = 20;
    let before = thread_cpu()?;
    for _ in 0..WAKE_UPS {
        std::thread::sleep(Duration::from_secs(1));
    }
    Some((thread_cpu()? - before) / f64::from(WAKE_UPS))
}
