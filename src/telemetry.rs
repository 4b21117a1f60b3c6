//! Prometheus metrics, kept in atomics and rendered in the text format at
//! `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::sync::SyncReport;

const BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A histogram with fixed buckets (seconds).
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(duration.as_micros() as u64, Ordering::Relaxed);
    }

    /// Records the time until the returned guard is dropped.
    pub fn start_timer(&self) -> Timer<'_> {
        Timer {
            histogram: self,
            started: Instant::now(),
        }
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Observes its histogram when dropped, so no path forgets to.
pub struct Timer<'a> {
    histogram: &'a Histogram,
    started: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed());
    }
}

#[derive(Default)]
pub struct Metrics {
    pub sync_duration: Histogram,
    pub fetch_duration: Histogram,
    pub fetch_errors: AtomicU64,
    /// Polls that found the branch's head where the agent was at rest.
    pub polls_at_rest: AtomicU64,
    /// Watch events of gitcanary's own writes, recognised and slept through.
    pub own_write_events: AtomicU64,
    /// Kustomize and Helm runs (cache hits are none), as the source counts them.
    pub renders: AtomicU64,
    pub syncs_ok: AtomicU64,
    pub syncs_failed: AtomicU64,
    pub objects_applied: AtomicU64,
    pub apps_recalled: AtomicU64,
    pub syncs_recalled: AtomicU64,
    pub apps_planned: AtomicU64,
    pub objects_unchanged: AtomicU64,
    pub objects_pruned: AtomicU64,
    pub objects_drifted: AtomicU64,
    pub rollout_transitions: AtomicU64,
    pub writeback_commits: AtomicU64,
    pub writeback_failures: AtomicU64,
    /// 1 while the last fetch of the source succeeded.
    pub source_up: AtomicU64,
    pub github_errors: AtomicU64,
    pub github_rate_limited: AtomicU64,
    /// GitHub `304 Not Modified` answers (not counted against its rate limit).
    pub github_not_modified: AtomicU64,
    /// Requests left in GitHub's rate-limit window, as its last answer said.
    pub github_rate_limit_remaining: AtomicU64,
    /// Release events sent to the configured receivers.
    pub notifications: LabelledCounter,
    /// GitHub requests by endpoint shape and status (`304`, `error`, `refused`).
    pub github_calls: LabelledCounter,
    /// Webhook deliveries by event and outcome.
    pub webhook_deliveries: LabelledCounter,
    /// With `--shards`: for each shard, whether this replica holds it and
    /// how many of the revision's apps it holds of it.
    pub shards: Mutex<BTreeMap<u32, (bool, usize)>>,
    /// Kustomize and Helm runs in progress, as the source's renderers count them.
    pub renders_running: std::sync::OnceLock<std::sync::Arc<AtomicU64>>,
    /// Requests to the API server, when the cluster client counts them.
    pub kube_requests: std::sync::OnceLock<crate::cluster::RequestCounts>,
    /// namespace -> rollout -> phase, as last seen; by namespace so that a
    /// sync that moved nothing looks each one up without a copy of its name.
    phases: Mutex<BTreeMap<String, BTreeMap<String, crate::rollout::api::Phase>>>,
}

fn counter(out: &mut String, name: &str, help: &str, value: &AtomicU64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
        value.load(Ordering::Relaxed)
    );
}

impl Metrics {
    /// Counts what one sync did.
    pub fn record_sync(&self, report: &SyncReport) {
        self.syncs_ok.fetch_add(1, Ordering::Relaxed);
        self.syncs_recalled
            .fetch_add(u64::from(report.recalled), Ordering::Relaxed);
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        for app in report.apps.iter() {
            self.objects_applied
                .fetch_add(app.applied.len() as u64, Ordering::Relaxed);
            self.objects_unchanged
                .fetch_add(app.unchanged as u64, Ordering::Relaxed);
            self.objects_pruned
                .fetch_add(app.pruned.len() as u64, Ordering::Relaxed);
            self.objects_drifted
                .fetch_add(app.drifted.len() as u64, Ordering::Relaxed);
            if app.recalled {
                self.apps_recalled.fetch_add(1, Ordering::Relaxed);
            } else {
                self.apps_planned.fetch_add(1, Ordering::Relaxed);
            }
            for rollout in &app.rollouts {
                let phase = rollout.status.phase;
                let seen = phases
                    .get(&rollout.namespace)
                    .and_then(|names| names.get(&rollout.name));
                if seen != Some(&phase) {
                    self.rollout_transitions.fetch_add(1, Ordering::Relaxed);
                    let names = phases.entry(rollout.namespace.clone()).or_default();
                    names.insert(rollout.name.clone(), phase);
                }
            }
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.sync_duration.render(
            "gitcanary_sync_duration_seconds",
            "Time of one sync (reading the source is timed apart, as git_fetch_duration_seconds).",
            &mut out,
        );
        self.fetch_duration.render(
            "gitcanary_git_fetch_duration_seconds",
            "Time of one fetch of the source.",
            &mut out,
        );
        let _ = writeln!(
            out,
            "# HELP gitcanary_syncs_total Syncs by result.\n# TYPE gitcanary_syncs_total counter\ngitcanary_syncs_total{{result=\"ok\"}} {}\ngitcanary_syncs_total{{result=\"error\"}} {}",
            self.syncs_ok.load(Ordering::Relaxed),
            self.syncs_failed.load(Ordering::Relaxed)
        );
        for (name, help, value) in self.counters() {
            counter(&mut out, name, help, value);
        }
        let _ = writeln!(
            out,
            "# HELP process_cpu_seconds_total CPU time the agent spent, user and system, to the microsecond.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}",
            cpu_seconds()
        );
        let _ = writeln!(
            out,
            "# HELP gitcanary_source_up Whether the last fetch of the Git source succeeded.\n# TYPE gitcanary_source_up gauge\ngitcanary_source_up {}",
            self.source_up.load(Ordering::Relaxed)
        );
        for (name, help, value) in self.github_counters() {
            counter(&mut out, name, help, value);
        }
        let _ = writeln!(
            out,
            "# HELP gitcanary_github_rate_limit_remaining Requests left in GitHub's rate-limit window, as its last answer said.\n# TYPE gitcanary_github_rate_limit_remaining gauge\ngitcanary_github_rate_limit_remaining {}",
            self.github_rate_limit_remaining.load(Ordering::Relaxed)
        );
        self.notifications.render(
            &mut out,
            "gitcanary_notifications_total",
            "Release events sent to receivers, by outcome (delivered; failed after every retry; dropped, the receiver's queue full).",
            ("receiver", "outcome"),
        );
        self.github_calls.render(
            &mut out,
            "gitcanary_github_requests_total",
            "GitHub API requests by endpoint and status: an HTTP status (a 304 is free of the rate limit), error (no answer), refused (not sent: kept quiet for a rate limit or the reserve).",
            ("endpoint", "status"),
        );
        self.webhook_deliveries.render(
            &mut out,
            "gitcanary_webhook_deliveries_total",
            "Webhook deliveries by event and outcome: acted (a sync or a look at the gates), ignored, duplicate (a delivery id seen before), malformed, refused (no valid signature; event unverified).",
            ("event", "outcome"),
        );
        self.render_shards(&mut out);
        self.render_cluster(&mut out);
        out
    }

    /// What a replica holds of each shard, as of its last sync.
    pub fn record_shards(&self, shards: &crate::shards::Shards, apps: &[&String]) {
        let held = shards.held();
        let mut table = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        table.clear();
        for shard in 0..shards.count {
            let holds = held.contains(&shard);
            let count = if holds {
                apps.iter()
                    .filter(|app| crate::shards::shard_of(app, shards.count) == shard)
                    .count()
            } else {
                0
            };
            table.insert(shard, (holds, count));
        }
    }

    fn render_shards(&self, out: &mut String) {
        let table = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        if table.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "# HELP gitcanary_shard_held Whether this replica holds the shard (1) or not (0).\n# TYPE gitcanary_shard_held gauge"
        );
        for (shard, (held, _)) in table.iter() {
            let _ = writeln!(out, "gitcanary_shard_held{{shard=\"{shard}\"}} {}", u8::from(*held));
        }
        let _ = writeln!(
            out,
            "# HELP gitcanary_shard_apps Apps of the shard this replica syncs (0 for a shard it does not hold).\n# TYPE gitcanary_shard_apps gauge"
        );
        for (shard, (_, apps)) in table.iter() {
            let _ = writeln!(out, "gitcanary_shard_apps{{shard=\"{shard}\"}} {apps}");
        }
    }

    /// The plain counters, in the order they are rendered: name, help, value.
    fn counters(&self) -> [(&'static str, &'static str, &AtomicU64); 14] {
        [
            (
                "gitcanary_git_fetch_errors_total",
                "Fetches of the source that failed.",
                &self.fetch_errors,
            ),
            (
                "gitcanary_git_polls_at_rest_total",
                "Polls that found the branch's head where the agent was at rest (its last whole sync answered from memory): nothing fetched, nothing synced.",
                &self.polls_at_rest,
            ),
            (
                "gitcanary_own_write_events_total",
                "Watch events of gitcanary's own writes, which wake no sync.",
                &self.own_write_events,
            ),
            (
                "gitcanary_renders_total",
                "Runs of kustomize or helm; an app whose files did not change is not rendered again.",
                &self.renders,
            ),
            (
                "gitcanary_objects_applied_total",
                "Objects written by server-side apply.",
                &self.objects_applied,
            ),
            (
                "gitcanary_objects_unchanged_total",
                "Objects found in place and not written.",
                &self.objects_unchanged,
            ),
            (
                "gitcanary_syncs_recalled_total",
                "Whole syncs answered from the last one: it recalled every app, and no watch cache, revision or discovery moved since.",
                &self.syncs_recalled,
            ),
            (
                "gitcanary_apps_recalled_total",
                "App syncs answered without observing or planning: nothing the app holds changed since a sync found it in order.",
                &self.apps_recalled,
            ),
            (
                "gitcanary_apps_planned_total",
                "App syncs that observed the cluster and planned (the others were recalled).",
                &self.apps_planned,
            ),
            (
                "gitcanary_objects_pruned_total",
                "Objects deleted because they left Git.",
                &self.objects_pruned,
            ),
            (
                "gitcanary_objects_drifted_total",
                "Objects changed by someone else and put back.",
                &self.objects_drifted,
            ),
            (
                "gitcanary_rollout_phase_changes_total",
                "Rollout phase changes seen.",
                &self.rollout_transitions,
            ),
            (
                "gitcanary_writeback_commits_total",
                "Promote and revert commits pushed.",
                &self.writeback_commits,
            ),
            (
                "gitcanary_writeback_failures_total",
                "Write-backs that failed and wait for the next sync.",
                &self.writeback_failures,
            ),
        ]
    }

    fn github_counters(&self) -> [(&'static str, &'static str, &AtomicU64); 3] {
        [
            (
                "gitcanary_github_errors_total",
                "GitHub API requests that failed (no answer or an error status).",
                &self.github_errors,
            ),
            (
                "gitcanary_github_rate_limited_total",
                "GitHub answers that asked the agent to back off (403/429 rate limits).",
                &self.github_rate_limited,
            ),
            (
                "gitcanary_github_not_modified_total",
                "GitHub answers 304 Not Modified to a conditional request (free of its rate limit); counted among the requests too.",
                &self.github_not_modified,
            ),
        ]
    }

    /// The API server requests and each rollout's phase.
    fn render_cluster(&self, out: &mut String) {
        if let Some(running) = self.renders_running.get() {
            let _ = writeln!(
                out,
                "# HELP gitcanary_renders_running Runs of kustomize or helm of the load in progress (running or waiting for a slot).\n# TYPE gitcanary_renders_running gauge\ngitcanary_renders_running {}",
                running.load(Ordering::Relaxed)
            );
        }
        if let Some(requests) = self.kube_requests.get() {
            let _ = writeln!(
                out,
                "# HELP gitcanary_kube_requests_total Requests sent to the API server.\n# TYPE gitcanary_kube_requests_total counter\ngitcanary_kube_requests_total{{kind=\"read\"}} {}\ngitcanary_kube_requests_total{{kind=\"write\"}} {}\ngitcanary_kube_requests_total{{kind=\"dry_run\"}} {}\n# HELP gitcanary_kube_reads_total Of the reads: lists and watches started.\n# TYPE gitcanary_kube_reads_total counter\ngitcanary_kube_reads_total{{kind=\"list\"}} {}\ngitcanary_kube_reads_total{{kind=\"watch\"}} {}\n# HELP gitcanary_kube_lease_requests_total Of all requests: reads and renewals of the leader Lease.\n# TYPE gitcanary_kube_lease_requests_total counter\ngitcanary_kube_lease_requests_total {}",
                requests.reads(),
                requests.writes(),
                requests.dry_runs(),
                requests.lists(),
                requests.watches(),
                requests.leases()
            );
        }
        let _ = writeln!(
            out,
            "# HELP gitcanary_rollout_phase The phase of each rollout (1 for its current phase).\n# TYPE gitcanary_rollout_phase gauge"
        );
        let phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        let each = phases
            .iter()
            .flat_map(|(namespace, names)| names.iter().map(move |name| (namespace, name)));
        for (namespace, (name, phase)) in each {
            let _ = writeln!(
                out,
                "gitcanary_rollout_phase{{namespace=\"{namespace}\",rollout=\"{name}\",phase=\"{phase:?}\"}} 1"
            );
        }
    }
}

/// A counter by two labels whose values are bounded by their makers
/// (receiver names, endpoint shapes, statuses).
#[derive(Default)]
pub struct LabelledCounter {
    counts: Mutex<BTreeMap<(String, String), u64>>,
}

impl LabelledCounter {
    pub fn add(&self, first: &str, second: &str) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry((first.to_string(), second.to_string())).or_default() += 1;
    }

    /// Prometheus text: `name{labels.0="…",labels.1="…"} n` per pair seen.
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: (&str, &str)) {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((first, second), n) in counts.iter() {
            let (first, second) = (escape_label(first), escape_label(second));
            let _ = writeln!(out, "{name}{{{}=\"{first}\",{}=\"{second}\"}} {n}", labels.0, labels.1);
        }
    }
}

/// A label value as Prometheus' text format writes one.
fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The process's CPU time so far, exited threads included (getrusage's
/// microseconds: /proc's ticks are 10 ms, too coarse for an agent at rest).
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage only writes the struct it is given, which lives
    // until it returns.
    let done = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if done != 0 {
        return 0.0;
    }
    // SAFETY: written in full by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_records_when_dropped() {
        let metrics = Metrics::default();
        {
            let _timer = metrics.sync_duration.start_timer();
        }
        let text = metrics.render();
        assert!(text.contains("gitcanary_sync_duration_seconds_count 1"), "{text}");
        assert!(
            text.contains("gitcanary_sync_duration_seconds_bucket{le=\"+Inf\"} 1"),
            "{text}"
        );
        assert!(text.contains("# TYPE gitcanary_objects_applied_total counter"));
    }
}
