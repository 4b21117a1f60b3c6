//! The sync loop: wait for a trigger (timer, file change, webhook, drift),
//! fetch, sync, repeat. Triggers that arrive while a sync runs are merged
//! into the next one.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, PartialObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::cluster::Cluster;
use crate::github::{self, GitHub, gate};
use crate::rollout::api::Phase;
use crate::rollout::cli::{Signal, record_last_comment, send_signal_token};
use crate::rollout::engine::RolloutSummary;
use crate::source::Source;
use crate::sync::{SyncOptions, SyncReport, sync_owned};
use crate::telemetry::Metrics;
use crate::writeback::{Author, Outcome, Writer};
use crate::{MANAGED_BY_LABEL, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Start,
    Poll,
    FileChange,
    Webhook,
    /// A watched object changed: its uid and new resourceVersion (none when deleted).
    Drift(Option<(String, String)>),
    /// A rollout asked to be looked at again (a pause or grace period ends).
    Timer,
}

impl Trigger {
    fn reason(&self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Poll => "poll",
            Trigger::FileChange => "file change",
            Trigger::Webhook => "webhook",
            Trigger::Drift(_) => "drift",
            Trigger::Timer => "timer",
        }
    }
}

pub struct Agent {
    pub cluster: Arc<Cluster>,
    pub source: Arc<Source>,
    pub options: SyncOptions,
    pub poll_interval: Duration,
    pub ready: Arc<AtomicBool>,
    pub writeback: WritebackConfig,
    /// Pull-request comments, commit statuses, gates and commands; off without a token.
    pub github: Option<Arc<GitHub>>,
    pub metrics: Arc<Metrics>,
}

/// How often open pauses look for `/gitcanary` commands when GitHub is on.
const COMMAND_POLL: Duration = Duration::from_secs(3);

impl Agent {
    /// Reports each rollout to GitHub: the release comment and the commit
    /// status when its status changed; while a release waits at a gate, its
    /// promotion pull request and the commands. GitHub being down or rate
    /// limited delays the comment, never the release. Returns whether a
    /// decision was handed to a rollout.
    async fn report_to_github(&self, github: &GitHub, report: &SyncReport) -> bool {
        let cluster = &*self.cluster;
        let mut signalled = false;
        for rollout in report.apps.iter().flat_map(|a| a.rollouts.iter()) {
            let status = &rollout.status;
            let commit = if status.canary_commit.is_empty() {
                &status.stable_commit
            } else {
                &status.canary_commit
            };
            if commit.is_empty() || !github::is_reportable(status) {
                continue;
            }
            let fields = (&rollout.namespace, &rollout.name, &status.rollout_id);
            let pulls = match github.pulls_for_commit(commit).await {
                Ok(pulls) => pulls,
                Err(error) => {
                    warn!(%error, namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, "GitHub: cannot find the pull request");
                    continue;
                }
            };
            let mut command_pulls = pulls.clone();
            let waiting = gate::waiting_step(&rollout.spec, status);
            let mut gate_pull = None;
            let mut gate_branch = None;
            if let (Some(step), Some(base)) = (waiting, self.source.git().map(|g| g.branch().to_string())) {
                let request = gate::GateRequest {
                    rollout,
                    step,
                    base: &base,
                    carried_by: &pulls,
                };
                gate_branch = Some(request.branch());
                match gate::drive(github, &request, async |branch| self.push_gate(&request, branch).await).await {
                    Ok((pull, verdict)) => {
                        command_pulls.push(pull.number);
                        gate_pull = Some(pull.number);
                        signalled |= pass_verdict(cluster, rollout, verdict).await;
                    }
                    Err(error) => {
                        warn!(%error, namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, "GitHub: the promotion pull request waits; commands and the CLI still work")
                    }
                }
            }
            if rollout.changed {
                let marker = github::marker(&rollout.namespace, &rollout.name, &status.rollout_id);
                let body = github::render_comment(&rollout.namespace, &rollout.name, &rollout.spec, status, gate_pull);
                for pull in &pulls {
                    if let Err(error) = github.upsert_comment(*pull, &marker, &body).await {
                        warn!(%error, pull, "GitHub: the release comment waits for the next change");
                    }
                }
                let (state, description) = github::commit_status(status);
                let context = format!("gitcanary/{}/{}", rollout.namespace, rollout.name);
                if let Err(error) = github.set_status(commit, &context, state, &description).await {
                    warn!(%error, "GitHub: the commit status waits for the next change");
                }
                if let Some(git) = self.source.git()
                    && let Err(error) = gate::close_others(github, git.branch(), rollout, gate_branch.as_deref()).await
                {
                    warn!(%error, "GitHub: stale promotion pull requests stay open until the next change");
                }
            }
            if matches!(status.phase, Phase::Paused | Phase::Progressing) {
                signalled |= handle_commands(github, cluster, rollout, &command_pulls).await;
            }
        }
        signalled
    }

    async fn push_gate(&self, request: &gate::GateRequest<'_>, branch: String) -> Result<()> {
        let source = self.source.clone();
        let author = self.writeback.author.clone();
        let file = request.file(&jiff::Timestamp::now().to_string());
        let outcome = crate::blocking("pushing the gate branch", move || {
            let git = source
                .git()
                .ok_or_else(|| crate::Error::Usage("gates need a Git source".into()))?;
            let writer = Writer {
                git,
                author,
                status_branch: None,
            };
            writer.open_gate(&branch, &file)
        })
        .await??;
        debug!(?outcome, "gate branch pushed");
        Ok(())
    }
}

/// Hands a promotion pull request's decision to its rollout (once: the token
/// names the decision).
async fn pass_verdict(cluster: &Cluster, rollout: &RolloutSummary, verdict: gate::Verdict) -> bool {
    let (signal, token, by) = match verdict {
        gate::Verdict::Waiting => return false,
        gate::Verdict::Promote { token, by } => (Signal::Promote, token, by),
        gate::Verdict::Abort { token } => (
            Signal::Abort,
            token,
            "promotion pull request closed unmerged".to_string(),
        ),
    };
    if signal == Signal::Promote && rollout.status.last_promote_signal == token
        || signal == Signal::Abort && rollout.status.last_abort_signal == token
    {
        return false;
    }
    match send_signal_token(cluster, &rollout.namespace, &rollout.name, signal, &token).await {
        Ok(()) => {
            info!(namespace = %rollout.namespace, rollout = %rollout.name, rollout_id = %rollout.status.rollout_id, %by, ?signal, "gate decided on GitHub");
            true
        }
        Err(error) => {
            warn!(%error, "the gate's decision could not be passed on; tried again next time");
            false
        }
    }
}

async fn handle_commands(github: &GitHub, cluster: &Cluster, rollout: &RolloutSummary, pulls: &[u64]) -> bool {
    let mut last = rollout.last_command_comment;
    let mut signalled = false;
    for pull in pulls {
        let commands = match github.commands(*pull, rollout.last_command_comment).await {
            Ok(commands) => commands,
            Err(error) => {
                warn!(%error, pull, "GitHub: cannot read commands");
                continue;
            }
        };
        for comment in commands {
            last = last.max(comment.id);
            let allowed = match github.can_write(&comment.user).await {
                Ok(allowed) => allowed,
                Err(error) => {
                    warn!(%error, user = %comment.user, "GitHub: cannot check permission; the command is ignored");
                    false
                }
            };
            let verb = comment.command.verb();
            if !allowed {
                info!(user = %comment.user, verb, "GitHub: command from a user without write access ignored");
                let reply = format!(
                    "@{} `/gitcanary {verb}` needs write, maintain or admin permission on this repository; nothing was changed.",
                    comment.user
                );
                let _ = github.reply(*pull, &reply).await;
                continue;
            }
            let signal = comment.command;
            let token = format!("comment {} by @{}", comment.id, comment.user);
            match send_signal_token(cluster, &rollout.namespace, &rollout.name, signal, &token).await {
                Ok(()) => {
                    info!(user = %comment.user, verb, namespace = %rollout.namespace, rollout = %rollout.name, "GitHub: command accepted");
                    signalled = true;
                }
                Err(error) => warn!(%error, "GitHub: the command could not be passed on"),
            }
        }
    }
    if last > rollout.last_command_comment
        && let Err(error) = record_last_comment(cluster, &rollout.namespace, &rollout.name, last).await
    {
        warn!(%error, "cannot record the last handled comment");
    }
    signalled
}

/// How promotes and reverts are written to Git.
#[derive(Debug, Clone, Default)]
pub struct WritebackConfig {
    pub author: Author,
    /// Branch for status files; default the tracked branch.
    pub status_branch: Option<String>,
}

/// Writes every pending promote and revert of the report to Git, then marks
/// each done in its Rollout's status, and in the report (so the pull request
/// hears of the commit). Returns how many commits were pushed. A failed
/// write-back stays pending and is tried again after the next sync.
pub async fn write_back(
    cluster: &Cluster,
    source: &Arc<Source>,
    config: &WritebackConfig,
    report: &mut SyncReport,
) -> usize {
    let mut pushed = 0;
    let requests: Vec<_> = report.writebacks().cloned().collect();
    for request in requests {
        if source.git().is_none() {
            warn!(namespace = %request.namespace, rollout = %request.name, "the source is not a Git repository: nothing to write back");
            continue;
        }
        let (source, config, job) = (source.clone(), config.clone(), request.clone());
        let outcome = crate::blocking("writing back to Git", move || {
            let git = source.git().expect("checked above");
            let writer = Writer {
                git,
                author: config.author.clone(),
                status_branch: config.status_branch.clone(),
            };
            writer.write(&job)
        })
        .await
        .and_then(|outcome| outcome);
        let fields = (&request.namespace, &request.name, &request.pending.rollout_id);
        let (commit, note) = match outcome {
            Ok(Outcome::Committed { commit, attempts, note }) => {
                pushed += 1;
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, %commit, attempts, action = ?request.pending.action, "written to Git");
                (Some(commit), note)
            }
            Ok(Outcome::AlreadyInGit { commit }) => {
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, %commit, "already in Git: not committed again");
                (Some(commit), String::new())
            }
            Ok(Outcome::NothingToChange) => {
                info!(namespace = %fields.0, rollout = %fields.1, rollout_id = %fields.2, "Git already holds it: nothing to commit");
                (None, String::new())
            }
            Err(error) => {
                warn!(namespace = %fields.0, rollout = %fields.1, %error, "write-back to Git failed; retried after the next sync");
                continue;
            }
        };
        match request.clear(cluster, commit.as_deref(), &note).await {
            Ok(status) => {
                let summary = report
                    .apps
                    .iter_mut()
                    .flat_map(|a| a.rollouts.iter_mut())
                    .find(|r| r.namespace == request.namespace && r.name == request.name);
                if let Some(summary) = summary {
                    summary.status = status;
                    summary.changed = true;
                }
            }
            Err(error) => {
                warn!(%error, "written to Git, but the Rollout status could not be updated; the commit is found again next time")
            }
        }
    }
    pushed
}

/// Capacity of the trigger queue; more pending triggers add nothing.
const TRIGGER_QUEUE: usize = 64;
/// Quiet time that coalesces bursts of triggers into one sync.
const DEBOUNCE: Duration = Duration::from_millis(100);

pub fn trigger_channel() -> (mpsc::Sender<Trigger>, mpsc::Receiver<Trigger>) {
    mpsc::channel(TRIGGER_QUEUE)
}

impl Agent {
    /// Fetches and syncs once.
    pub async fn sync_once(&self) -> Result<SyncReport> {
        let source = self.source.clone();
        let timer = self.metrics.fetch_duration.start_timer();
        let fetched = crate::blocking("fetching", move || source.fetch())
            .await
            .and_then(|fetched| fetched);
        drop(timer);
        if fetched.is_err() {
            self.metrics.fetch_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics
            .source_up
            .store(u64::from(fetched.is_ok()), Ordering::Relaxed);
        sync_owned(&self.cluster, fetched?, &self.options).await
    }

    /// Runs until the trigger channel closes or `stop` turns true; a sync in
    /// progress (and its write-back) is finished first.
    pub async fn run(
        &self,
        triggers: mpsc::Sender<Trigger>,
        mut queue: mpsc::Receiver<Trigger>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let _poller = spawn_poller(triggers.clone(), self.poll_interval);
        let _file_watcher = self
            .source
            .local_dir()
            .and_then(|dir| watch_files(dir, triggers.clone()));
        let mut drift = DriftWatch::default();
        let _ = triggers.try_send(Trigger::Start);
        loop {
            let first = tokio::select! {
                _ = stop.wait_for(|stop| *stop) => break,
                first = queue.recv() => match first {
                    Some(first) => first,
                    None => break,
                },
            };
            // Bursts (drift events, file saves) are merged over a quiet period;
            // a due timer or a webhook is acted on at once.
            let quiet = if matches!(first, Trigger::Drift(_) | Trigger::FileChange) {
                DEBOUNCE
            } else {
                Duration::ZERO
            };
            let mut burst = vec![first];
            while let Ok(Some(next)) = tokio::time::timeout(quiet, queue.recv()).await {
                burst.push(next);
            }
            // The watch events of the last sync's own applies are no news (they
            // are read after that sync, when all its writes are recorded).
            let own_echo = |trigger: &Trigger| match trigger {
                Trigger::Drift(Some((uid, version))) => self.cluster.own_writes.wrote(uid, version),
                _ => false,
            };
            if burst.iter().all(own_echo) {
                continue;
            }
            let reasons: BTreeSet<&str> = burst.iter().map(Trigger::reason).collect();
            debug!(?reasons, "sync triggered");
            let sync_started = tokio::time::Instant::now();
            let timer = self.metrics.sync_duration.start_timer();
            let outcome = self.sync_once().await;
            drop(timer);
            match outcome {
                Ok(mut report) => {
                    self.ready.store(true, Ordering::Relaxed);
                    self.metrics.record_sync(&report);
                    let pushed = write_back(&self.cluster, &self.source, &self.writeback, &mut report).await;
                    self.metrics
                        .writeback_commits
                        .fetch_add(pushed as u64, Ordering::Relaxed);
                    let pending = report.writebacks().count().saturating_sub(pushed);
                    self.metrics
                        .writeback_failures
                        .fetch_add(pending as u64, Ordering::Relaxed);
                    if pushed > 0 {
                        // Sync the commit just pushed.
                        let _ = triggers.try_send(Trigger::Timer);
                    }
                    if let Some(github) = &self.github {
                        self.report_to_github(github, &report).await;
                        let waiting = report
                            .apps
                            .iter()
                            .flat_map(|a| a.rollouts.iter())
                            .any(|r| r.status.phase == Phase::Paused);
                        if waiting {
                            let triggers = triggers.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(COMMAND_POLL).await;
                                let _ = triggers.try_send(Trigger::Timer);
                            });
                        }
                    }
                    drift
                        .follow(&self.cluster, &report.kinds, &self.options, &triggers)
                        .await;
                    if let Some(after) = report.requeue_after() {
                        let triggers = triggers.clone();
                        // Measured from when the rollouts were planned, not from now.
                        tokio::spawn(async move {
                            tokio::time::sleep_until(sync_started + after).await;
                            let _ = triggers.try_send(Trigger::Timer);
                        });
                    }
                    if !report.is_clean() {
                        info!(commit = %report.commit, "sync finished with problems; the affected apps keep what they had");
                    }
                }
                Err(error) => {
                    self.metrics.syncs_failed.fetch_add(1, Ordering::Relaxed);
                    error!(%error, kind = error.metric_label(), "sync failed; the cluster keeps what it had");
                }
            }
        }
    }
}

fn spawn_poller(triggers: mpsc::Sender<Trigger>, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            if triggers.is_closed() {
                return;
            }
            let _ = triggers.try_send(Trigger::Poll);
        }
    })
}

fn watch_files(dir: &std::path::Path, triggers: mpsc::Sender<Trigger>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = triggers.try_send(Trigger::FileChange);
        }
    })
    .map_err(|error| error!(%error, "cannot watch the source directory; polling only"))
    .ok()?;
    watcher
        .watch(dir, notify::RecursiveMode::Recursive)
        .map_err(|error| error!(%error, "cannot watch the source directory; polling only"))
        .ok()?;
    Some(watcher)
}

/// Watches on the kinds gitcanary manages, so a change made by someone else
/// (`kubectl edit`, a deletion) is put back within seconds.
#[derive(Default)]
struct DriftWatch {
    watches: HashMap<(String, String), JoinHandle<()>>,
}

impl DriftWatch {
    async fn follow(
        &mut self,
        cluster: &Arc<Cluster>,
        kinds: &BTreeSet<(String, String)>,
        options: &SyncOptions,
        triggers: &mpsc::Sender<Trigger>,
    ) {
        for (api_version, kind) in kinds {
            let id = (api_version.clone(), kind.clone());
            if self.watches.get(&id).is_some_and(|w| !w.is_finished()) {
                continue;
            }
            let Some(resolved) = cluster.resolve(api_version, kind).await else {
                continue;
            };
            // Metadata only: any change bumps resourceVersion, and whole
            // objects would cost memory and parsing for nothing.
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(cluster.client.clone(), &resolved.resource);
            let config = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={}", options.instance));
            let triggers = triggers.clone();
            let cluster = cluster.clone();
            let handle = tokio::spawn(async move {
                let mut events = std::pin::pin!(watcher(api, config).default_backoff());
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::Apply(object)) => {
                            let version = object.metadata.uid.zip(object.metadata.resource_version);
                            let _ = triggers.try_send(Trigger::Drift(version));
                        }
                        Ok(watcher::Event::Delete(object)) => {
                            cluster.own_writes.forget(object.metadata.uid.as_deref());
                            let _ = triggers.try_send(Trigger::Drift(None));
                        }
                        Ok(_) => {}
                        Err(error) => debug!(%error, "drift watch interrupted; it resumes"),
                    }
                }
            });
            self.watches.insert(id, handle);
        }
    }
}

impl Drop for DriftWatch {
    fn drop(&mut self) {
        for handle in self.watches.values() {
            handle.abort();
        }
    }
}
