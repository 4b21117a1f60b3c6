//! `gitcanary sync` and `gitcanary run`: one sync, or the agent with its
//! server, leadership and shutdown.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::{LeaderArgs, SourceArgs, SyncArgs, connect, open_source, options};
use crate::Error;
use crate::agent::{Agent, trigger_channel};
use crate::cluster::ensure_namespace;
use crate::identity::signing::{Signer, Verifier};
use crate::lease::{Leadership, LeaseConfig};
use crate::report::{WritebackConfig, write_back};
use crate::server::{ServerState, metrics_router, router, serve};
use crate::sync::{SyncMemo, sync_validated, validate_revision};
use crate::writeback::Author;

fn writeback_config(args: &SyncArgs) -> Result<WritebackConfig, Error> {
    let mut author = Author::parse(&args.git_author).map_err(Error::Usage)?;
    let readable = |flag: &str, path: &std::path::Path| {
        if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(Error::Usage(format!("{flag} {}: no such file", path.display())))
        }
    };
    if let Some(key) = &args.sign_status_key {
        author.signer = Some(Signer {
            key: readable("--sign-status-key", key)?,
        });
    }
    if args.verify_status_signers.is_some() && args.sign_status_key.is_none() {
        return Err(Error::Usage(
            "--verify-status-signers needs --sign-status-key: the agent's own status commits would be unsigned and not trusted".into(),
        ));
    }
    if let Some(allowed) = &args.verify_status_signers {
        author.verifier = Some(Verifier {
            allowed_signers: readable("--verify-status-signers", allowed)?,
        });
    }
    Ok(WritebackConfig {
        author,
        status_branch: args.status_branch.clone(),
    })
}

/// The repository as the agent reads and writes it: whose status files it
/// trusts, and where its own records are.
fn agent_source(args: &SyncArgs, writeback: &WritebackConfig) -> Result<crate::source::Source, Error> {
    Ok(open_source(&args.source)?.with_record_writer(writeback.author.clone()))
}

/// `gitcanary sync --once`: fetch, sync, write back, print a summary.
/// Exits 0 when every app synced, 1 when one has problems.
pub async fn sync_once(args: SyncArgs) -> Result<ExitCode, Error> {
    let writeback = writeback_config(&args)?;
    let source = Arc::new(agent_source(&args, &writeback)?);
    let cluster = connect(&args.source).await?;
    let revision = super::fetch(source.clone(), &cluster).await?;
    let (mut revision, options) = (revision, endpoint_options(&args.source)?);
    validate_revision(&mut revision, &options);
    let memo = SyncMemo::default();
    let mut report = sync_validated(&cluster, &revision, &options, &memo, None).await?;
    let written = write_back(&source, &writeback, &report).await;
    if !written.done.is_empty() {
        // The statuses record what was written to Git: a sync of those apps.
        for (namespace, name, done) in written.done {
            memo.record_written(&namespace, &name, done);
        }
        let recorded = sync_validated(&cluster, &revision, &options, &memo, Some(&written.apps)).await?;
        let apps = Arc::make_mut(&mut report.apps);
        for app in recorded.apps.iter() {
            apps.iter_mut().filter(|a| a.app == app.app).for_each(|a| {
                a.problems.extend(app.problems.iter().cloned());
                a.rollouts = app.rollouts.clone();
            });
        }
    }
    let count = |f: fn(&crate::sync::AppReport) -> usize| report.apps.iter().map(f).sum::<usize>();
    println!(
        "synced {} app(s) at {}: {} applied, {} unchanged, {} pruned; API requests: {} reads, {} writes, {} dry runs; renders: {}",
        report.apps.len(),
        &report.commit[..report.commit.len().min(12)],
        count(|a| a.applied.len()),
        count(|a| a.unchanged),
        count(|a| a.pruned.len()),
        cluster.requests.reads(),
        cluster.requests.writes(),
        cluster.requests.dry_runs(),
        source.renderers().renders()
    );
    for problem in report.problems() {
        println!("{problem}");
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `gitcanary run` (with `listen` and `leader`) and `gitcanary sync`: the
/// agent, until interrupted. Exits 3 when it loses the Lease.
/// Where `gitcanary run` listens.
#[derive(Debug, Clone, Copy)]
pub struct Listen {
    /// The webhook and the probes (and /metrics, unless `metrics` is set).
    pub webhook: SocketAddr,
    pub metrics: Option<SocketAddr>,
    /// The read-only dashboard.
    pub dashboard: Option<SocketAddr>,
}

/// Starts the webhook listener, and the metrics one when it has its own
/// address; returns the webhook's bound address.
async fn serve_listeners(listen: Listen, state: ServerState) -> Result<SocketAddr, Error> {
    let bind_error = |addr: SocketAddr| {
        move |source| Error::Read {
            path: format!("listen address {addr}"),
            source,
        }
    };
    if let Some(addr) = listen.metrics {
        let bound = serve(addr, metrics_router(state.clone()))
            .await
            .map_err(bind_error(addr))?;
        tracing::info!(%bound, "metrics listening");
    }
    serve(listen.webhook, router(state, listen.metrics.is_none()))
        .await
        .map_err(bind_error(listen.webhook))
}

/// The options, with the web checks and hooks read from their files.
fn endpoint_options(args: &SourceArgs) -> Result<crate::model::SyncOptions, Error> {
    let mut options = options(args);
    options.web_checks = super::web_checks(args)?;
    options.hooks = super::hooks(args)?;
    Ok(options)
}

/// The agent's read-only dashboard, as the agent's identity.
async fn serve_dashboard(addr: SocketAddr, args: &SyncArgs, source: &crate::source::Source) -> Result<(), Error> {
    let records = super::records_of(args.source.cluster_name.as_deref());
    // The loader keeps the mirror fetched: the page reads what it synced.
    let environments = source.git().map(|git| {
        Arc::new(crate::wave::standing::StandingReader::new(
            git.clone(),
            records.clone(),
            false,
        ))
    });
    let dashboard = crate::dashboard::Dashboard {
        cluster: super::connect(&args.source).await?,
        namespace: None,
        github_repo: args.github.github_repo.clone(),
        records,
        environments,
        actions: None,
        loopback: addr.ip().is_loopback(),
        streams: Arc::new(tokio::sync::Semaphore::new(crate::dashboard::MAX_STREAMS)),
    };
    let bound = crate::server::serve(addr, crate::dashboard::router(Arc::new(dashboard)))
        .await
        .map_err(|source| Error::Read {
            path: format!("listen address {addr}"),
            source,
        })?;
    tracing::info!(%bound, "dashboard listening");
    Ok(())
}

pub async fn run_agent(args: SyncArgs, listen: Option<Listen>, leader: Option<LeaderArgs>) -> Result<ExitCode, Error> {
    // Configuration first: a bad setting fails before anything connects.
    let secret = match listen {
        Some(_) => webhook_secret()?,
        None => None,
    };
    let writeback = writeback_config(&args)?;
    let source = Arc::new(agent_source(&args, &writeback)?);
    let cluster = Arc::new(connect(&args.source).await?);
    let options = endpoint_options(&args.source)?;
    let ready = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(crate::telemetry::Metrics::default());
    let _ = metrics.kube_requests.set(cluster.requests.clone());
    let _ = metrics.renders_running.set(source.renderers().running());
    let (triggers, queue) = trigger_channel();
    if let Some(listen) = listen {
        let state = ServerState {
            webhook_secret: secret.map(Arc::from),
            branch: args.source.branch.clone(),
            triggers: triggers.clone(),
            ready: ready.clone(),
            metrics: metrics.clone(),
            deliveries: Arc::default(),
            webhook_permits: crate::server::webhook_permits(),
        };
        let bound = serve_listeners(listen, state).await?;
        tracing::info!(%bound, source = %source.describe(), "agent listening");
        if let Some(addr) = listen.dashboard {
            serve_dashboard(addr, &args, &source).await?;
        }
    }
    let agent = Agent {
        cluster,
        source: source.clone(),
        options,
        poll_interval: Duration::from_secs(args.poll_interval.max(1)),
        watch_bookmarks: args.watch_bookmarks,
        command_poll: crate::agent::CommandPoll::new(
            Duration::from_secs(args.github.github_poll.max(1)),
            Duration::from_secs(args.github.github_poll_max.max(args.github.github_poll).max(1)),
        ),
        ready,
        writeback: writeback.clone(),
        github: super::github::github_client(&args.github, metrics.clone())?.map(Arc::new),
        notifier: notifier(&args, metrics.clone())?.map(Arc::new),
        metrics,
        loaded: std::sync::Mutex::default(),
        memo: Default::default(),
        shards: None,
        at_rest: Default::default(),
    };
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let signals = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; finishing the sync in progress"),
                _ = terminate() => tracing::info!("SIGTERM; finishing the sync in progress"),
            }
            let _ = stop.send(true);
        })
    };
    let mut agent = agent;
    let (leadership, shards) = match coordinate(&mut agent, &args.source, leader, &triggers, &mut stopped).await? {
        Some(coordination) => coordination,
        None => return Ok(ExitCode::SUCCESS),
    };
    agent
        .spawn_poller(triggers.clone())
        .map_err(|e| Error::Usage(format!("cannot start the poll's thread: {e}")))?;
    let running = agent.run(triggers, queue, stopped.clone());
    if !run_while_leading(running, leadership.as_ref(), &mut stopped).await {
        // Another agent may act from now on: stop at once, and let the
        // restart rejoin as a follower.
        tracing::error!("leadership lost; exiting so that only one agent acts");
        return Ok(ExitCode::from(3));
    }
    signals.abort();
    if let Some(leadership) = leadership {
        leadership.release().await;
    }
    if let Some(shards) = shards {
        shards.release_all().await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the agent until it ends, or until asked to stop and its last sync
/// has finished (30 s at most), renewing the Lease throughout; `false` as
/// soon as the Lease is lost.
async fn run_while_leading(
    running: impl std::future::Future<Output = ()>,
    leadership: Option<&Leadership>,
    stopped: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    tokio::pin!(running);
    let lost = async {
        match leadership {
            Some(leadership) => leadership.keep().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    tokio::select! {
        _ = &mut running => true,
        _ = stopped.wait_for(|s| *s) => {
            // The Lease is renewed while the last sync finishes: left to
            // expire, it would let a successor act beside that sync.
            tokio::select! {
                finished = tokio::time::timeout(Duration::from_secs(30), &mut running) => {
                    if finished.is_err() {
                        tracing::warn!("the sync in progress did not finish within 30 s; stopping anyway");
                    }
                    true
                }
                _ = &mut lost => false,
            }
        }
        _ = &mut lost => false,
    }
}

/// How replicas of the agent share the work: the leader's Lease (one acts),
/// `--shards` (each acts for its shards' apps), or neither. `None` when
/// asked to stop while waiting for the Lease.
async fn coordinate(
    agent: &mut Agent,
    source: &SourceArgs,
    leader: Option<LeaderArgs>,
    triggers: &crate::agent::Triggers,
    stopped: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<Option<(Option<Leadership>, Option<Arc<crate::shards::Shards>>)>, Error> {
    let Some(leader) = leader else {
        return Ok(Some((None, None)));
    };
    if let Some(count) = leader.shards {
        if leader.no_leader_election {
            return Err(Error::Usage(
                "--shards and --no-leader-election: shards are held on Leases; give one".into(),
            ));
        }
        let shards = share(agent, source, &leader, count, triggers, stopped).await?;
        return Ok(Some((None, Some(shards))));
    }
    if leader.no_leader_election {
        return Ok(Some((None, None)));
    }
    ensure_namespace(&agent.cluster, &source.state_namespace).await?;
    let leadership = Leadership::new(&agent.cluster, lease_config(source, &leader));
    // A leader acts only once no replica with --shards holds a shard: it
    // waits for none before taking the Lease, and looks again after.
    let mut shards = crate::shards::ShardWatch::new(&agent.cluster, &source.instance, leadership.config());
    loop {
        if !shards.wait_for_none(stopped).await || !leadership.acquire(stopped).await {
            return Ok(None);
        }
        if shards.live().await == 0 {
            break;
        }
        leadership.release().await;
    }
    tracing::info!(identity = %leadership.config().identity, "leading: this agent acts");
    Ok(Some((Some(leadership), None)))
}

/// `--shards N`: this replica's shards, kept by a task of their own; the
/// agent syncs only their apps and asks the shards before each app's writes.
async fn share(
    agent: &mut Agent,
    source: &SourceArgs,
    leader: &LeaderArgs,
    count: u32,
    triggers: &crate::agent::Triggers,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<Arc<crate::shards::Shards>, Error> {
    if count == 0 {
        return Err(Error::Usage("--shards must be 1 or more".into()));
    }
    ensure_namespace(&agent.cluster, &source.state_namespace).await?;
    let shards = Arc::new(crate::shards::Shards::new(
        &agent.cluster,
        &source.instance,
        count,
        &lease_config(source, leader),
    ));
    tracing::info!(identity = %shards.identity, shards = count, "sharing the apps among replicas");
    agent.options.fence = Some(shards.fence());
    agent.shards = Some(shards.clone());
    let (keeper, triggers, mut stop) = (shards.clone(), triggers.clone(), stopped.clone());
    shards.kept_by(tokio::spawn(async move {
        let changed = || {
            let _ = triggers.try_send(crate::agent::Trigger::Shards);
        };
        keeper.run(changed, &mut stop).await;
    }));
    Ok(shards)
}

fn lease_config(source: &SourceArgs, leader: &LeaderArgs) -> LeaseConfig {
    let identity = leader
        .leader_identity
        .clone()
        .unwrap_or_else(|| match std::env::var("POD_NAME") {
            Ok(pod) if !pod.is_empty() => pod,
            _ => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "agent".into());
                format!("{host}-{}", std::process::id())
            }
        });
    LeaseConfig {
        namespace: source.state_namespace.clone(),
        name: format!("{}-leader", source.instance),
        identity,
        duration: Duration::from_secs(leader.lease_duration.max(3)),
        annotations: Default::default(),
    }
}

async fn terminate() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut signal) => {
            signal.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

/// The receivers of `--notify`, each webhook's secret from `--notify-secret`,
/// and the `--hook` endpoints `postRelease` hooks tell.
fn notifier(
    args: &SyncArgs,
    metrics: Arc<crate::telemetry::Metrics>,
) -> Result<Option<crate::notify::Notifier>, Error> {
    let hooks = super::hooks(&args.source)?;
    if args.notify.is_empty() && hooks.is_empty() {
        if !args.notify_secret.is_empty() {
            return Err(Error::Usage(
                "--notify-secret names a receiver, and no --notify gives one".into(),
            ));
        }
        return Ok(None);
    }
    let mut secrets = std::collections::BTreeMap::new();
    for pair in &args.notify_secret {
        let (name, path) = pair
            .split_once('=')
            .ok_or_else(|| Error::Usage(format!("--notify-secret {pair:?}: write NAME=FILE")))?;
        secrets.insert(name.to_string(), path.to_string());
    }
    let mut receivers: Vec<crate::notify::Receiver> = Vec::new();
    for spec in &args.notify {
        let receiver = crate::notify::parse_receiver(spec, &secrets).map_err(Error::Usage)?;
        if receivers.iter().any(|r| r.name == receiver.name) {
            return Err(Error::Usage(format!(
                "--notify: two receivers are named {}",
                receiver.name
            )));
        }
        receivers.push(receiver);
    }
    if let Some(name) = secrets.keys().find(|name| !receivers.iter().any(|r| &r.name == *name)) {
        return Err(Error::Usage(format!(
            "--notify-secret {name}: no --notify receiver has that name"
        )));
    }
    let defaults = args.notify_default.clone().map(|names| names.into_iter().collect());
    if let Some(unknown) = defaults
        .iter()
        .flatten()
        .find(|name: &&String| !receivers.iter().any(|r| &r.name == *name))
    {
        return Err(Error::Usage(format!(
            "--notify-default {unknown}: no --notify receiver has that name"
        )));
    }
    tracing::info!(receivers = ?receivers, defaults = ?defaults, "release events go to these receivers");
    let routes = crate::notify::Routes { receivers, defaults };
    Ok(Some(crate::notify::Notifier::start(routes, hooks, metrics)))
}

/// `GITCANARY_WEBHOOK_SECRET` or the file named by `GITCANARY_WEBHOOK_SECRET_FILE`.
/// An empty secret is refused: anyone could sign with it.
fn webhook_secret() -> Result<Option<Vec<u8>>, Error> {
    let (secret, origin) = if let Ok(secret) = std::env::var("GITCANARY_WEBHOOK_SECRET") {
        (secret.into_bytes(), "GITCANARY_WEBHOOK_SECRET".to_string())
    } else {
        match std::env::var("GITCANARY_WEBHOOK_SECRET_FILE") {
            Ok(path) => {
                let text = std::fs::read_to_string(&path).map_err(|source| Error::Read {
                    path: path.clone(),
                    source,
                })?;
                (text.trim_end().as_bytes().to_vec(), format!("the file {path}"))
            }
            Err(_) => return Ok(None),
        }
    };
    if secret.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::Usage(format!(
            "the webhook secret in {origin} is empty: set one (openssl rand -hex 20) or unset it to turn webhooks off"
        )));
    }
    Ok(Some(secret))
}
