use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gitcanary::agent::{Agent, WritebackConfig, trigger_channel, write_back};
use gitcanary::cluster::{Cluster, ensure_namespace, render_diff};
use gitcanary::github::GitHub;
use gitcanary::lease::{Leadership, LeaseConfig};
use gitcanary::rollout::cli::{Signal, send_signal};
use gitcanary::server::{ServerState, serve};
use gitcanary::source::{Credentials, Source};
use gitcanary::sync::{SyncOptions, diff, sync_owned};
use gitcanary::writeback::Author;
use gitcanary::{Error, manifest};

/// GitOps progressive delivery: canary releases driven by Git.
#[derive(Parser)]
#[command(name = "gitcanary", version, about)]
struct Cli {
    /// Log format: text for terminals, json for log collectors.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: follow a branch and keep the cluster in sync with it.
    Run(RunArgs),
    /// Sync once (--once) or keep following the branch.
    Sync(SyncArgs),
    /// Check manifests offline; one line per problem as file:line: message.
    Validate {
        /// Directory of manifests.
        dir: PathBuf,
        /// Namespaces manifests may use (comma-separated); default all.
        #[arg(long, value_delimiter = ',')]
        namespaces: Vec<String>,
    },
    /// Show what the next sync would change; exit 1 when the cluster differs.
    Diff(SourceArgs),
    /// Show rollouts: phase, step, traffic, what each waits for.
    Status {
        name: Option<String>,
        #[arg(short, long)]
        namespace: Option<String>,
        /// Output: text or json.
        #[arg(short, long, default_value = "text")]
        output: String,
        /// Redraw until every release has ended.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Pass the current indefinite pause of a rollout.
    Promote {
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Abort a rollout: traffic back to stable, canary removed.
    Abort {
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Print the Rollout CustomResourceDefinition.
    Crd,
}

#[derive(Args, Clone)]
struct ClusterArgs {
    /// Default: as kubectl finds it (KUBECONFIG, possibly several files; ~/.kube/config; in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    #[arg(long)]
    context: Option<String>,
}

#[derive(Args, Clone)]
struct SourceArgs {
    /// Git URL (https://, ssh://, file://), path to a Git repository, or a plain directory.
    #[arg(long, env = "GITCANARY_REPO")]
    repo: String,
    #[arg(long, env = "GITCANARY_BRANCH", default_value = "main")]
    branch: String,
    /// Sub-directory of the repository that holds the apps.
    #[arg(long, env = "GITCANARY_PATH", default_value = "")]
    path: String,
    /// Delete managed objects that left Git.
    #[arg(long)]
    prune: bool,
    /// Namespaces manifests may use (comma-separated); default all.
    #[arg(long, value_delimiter = ',')]
    namespaces: Vec<String>,
    /// Name of this agent instance (the gitcanary.io/managed-by label value).
    #[arg(long, default_value = "gitcanary")]
    instance: String,
    /// Namespace for the per-app status ConfigMaps.
    #[arg(long, default_value = "gitcanary-system")]
    state_namespace: String,
    /// Default: as kubectl finds it (KUBECONFIG, possibly several files; ~/.kube/config; in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    #[arg(long)]
    context: Option<String>,
    /// Where the Git mirror is kept.
    #[arg(long, env = "GITCANARY_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Prometheus for analysis templates that name none (http://HOST:9090).
    #[arg(long, env = "GITCANARY_PROMETHEUS_URL")]
    prometheus_url: Option<String>,
    /// Colour the diff: auto (when a terminal), always, never.
    #[arg(long, default_value = "auto")]
    color: String,
}

#[derive(Args)]
struct SyncArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Sync once and exit: 0 when every app synced, 1 when one has problems.
    #[arg(long)]
    once: bool,
    /// Seconds between polls of the branch.
    #[arg(long, default_value_t = 60)]
    poll_interval: u64,
    /// Author of gitcanary's own commits (promote status, reverts).
    #[arg(long, default_value = "gitcanary <gitcanary@localhost>")]
    git_author: String,
    /// Branch for promote status files; default the tracked branch.
    #[arg(long)]
    status_branch: Option<String>,
    /// GitHub API URL (GitHub Enterprise: https://HOST/api/v3).
    #[arg(long, env = "GITCANARY_GITHUB_URL", default_value = "https://api.github.com")]
    github_url: String,
    /// The repository on GitHub, owner/name; with GITCANARY_GITHUB_TOKEN (or _FILE) it turns on
    /// pull-request comments, commit statuses and /gitcanary commands.
    #[arg(long, env = "GITCANARY_GITHUB_REPO")]
    github_repo: Option<String>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    sync: SyncArgs,
    /// Address for the webhook, /healthz and /readyz endpoints.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    leader: LeaderArgs,
}

#[derive(Args)]
struct LeaderArgs {
    /// Act without holding the Lease (only when no other agent can run).
    #[arg(long)]
    no_leader_election: bool,
    /// Seconds a Lease lasts without renewal before another agent may take it.
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// Who holds the Lease; default POD_NAME, else hostname-pid.
    #[arg(long)]
    leader_identity: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime starts");
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("GITCANARY_LOG").unwrap_or_else(|_| "gitcanary=info,warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn dispatch(command: Command) -> Result<ExitCode, Error> {
    match command {
        Command::Validate { dir, namespaces } => validate(dir, namespaces),
        Command::Diff(args) => run_diff(args).await,
        Command::Sync(args) => run_sync(args, None, None).await,
        Command::Run(args) => run_sync(args.sync, Some(args.listen), Some(args.leader)).await,
        Command::Crd => {
            print!("{}", gitcanary::rollout::api::crd_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Promote {
            name,
            namespace,
            cluster,
        } => signal(&cluster, &namespace, &name, Signal::Promote).await,
        Command::Abort {
            name,
            namespace,
            cluster,
        } => signal(&cluster, &namespace, &name, Signal::Abort).await,
        Command::Status {
            name,
            namespace,
            output,
            watch,
            cluster,
        } => status(&cluster, namespace.as_deref(), name.as_deref(), &output, watch).await,
    }
}

async fn signal(args: &ClusterArgs, namespace: &str, name: &str, signal: Signal) -> Result<ExitCode, Error> {
    let cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    send_signal(&cluster, namespace, name, signal).await?;
    let verb = match signal {
        Signal::Promote => "promote",
        Signal::Abort => "abort",
    };
    println!("rollout {namespace}/{name}: {verb} requested");
    Ok(ExitCode::SUCCESS)
}

async fn status(
    args: &ClusterArgs,
    namespace: Option<&str>,
    name: Option<&str>,
    output: &str,
    watch: bool,
) -> Result<ExitCode, Error> {
    let cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    loop {
        let rollouts = gitcanary::rollout::cli::list(&cluster, namespace, name).await?;
        if output == "json" {
            println!("{}", serde_json::to_string_pretty(&rollouts).unwrap_or_default());
        } else {
            let text = gitcanary::rollout::cli::render(&rollouts, jiff::Timestamp::now());
            if watch {
                // Redraw in place: clear the screen, cursor home.
                print!("\x1b[2J\x1b[H");
            }
            print!("{text}");
        }
        let releasing = rollouts.iter().any(|r| {
            r.status.as_ref().is_some_and(|s| {
                matches!(
                    s.phase,
                    gitcanary::rollout::api::Phase::Progressing
                        | gitcanary::rollout::api::Phase::Paused
                        | gitcanary::rollout::api::Phase::Promoting
                )
            })
        });
        if !watch || !releasing {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn validate(dir: PathBuf, namespaces: Vec<String>) -> Result<ExitCode, Error> {
    if !dir.is_dir() {
        return Err(Error::Usage(format!("{} is not a directory", dir.display())));
    }
    let mut set = manifest::load_dir(&dir)?;
    gitcanary::rollout::validate::validate(&mut set, &namespaces);
    let problems: Vec<_> = set.problems().collect();
    for problem in &problems {
        println!("{problem}");
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn options(args: &SourceArgs) -> SyncOptions {
    SyncOptions {
        instance: args.instance.clone(),
        state_namespace: args.state_namespace.clone(),
        prune: args.prune,
        allowed_namespaces: args.namespaces.clone(),
        prometheus_url: args.prometheus_url.clone(),
        ..SyncOptions::default()
    }
}

fn open_source(args: &SourceArgs) -> Result<Source, Error> {
    let cache = args.cache_dir.clone().unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)
            .join(".cache/gitcanary")
    });
    Source::open(&args.repo, &args.branch, &args.path, Credentials::from_env()?, &cache)
}

async fn connect(args: &SourceArgs) -> Result<Cluster, Error> {
    Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await
}

async fn run_diff(args: SourceArgs) -> Result<ExitCode, Error> {
    let source = open_source(&args)?;
    let cluster = connect(&args).await?;
    let revision = gitcanary::blocking("fetching", move || source.fetch()).await??;
    let (diffs, problems) = diff(&cluster, &revision, &options(&args)).await?;
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::IsTerminal::is_terminal(&std::io::stdout()),
    };
    print!("{}", render_diff(&diffs, color));
    for problem in &problems {
        eprintln!("{problem}");
    }
    if !problems.is_empty() {
        return Ok(ExitCode::from(2));
    }
    Ok(if diffs.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn run_sync(args: SyncArgs, listen: Option<SocketAddr>, leader: Option<LeaderArgs>) -> Result<ExitCode, Error> {
    let source = Arc::new(open_source(&args.source)?);
    let cluster = Arc::new(connect(&args.source).await?);
    let options = options(&args.source);
    let writeback = WritebackConfig {
        author: Author::parse(&args.git_author).map_err(Error::Usage)?,
        status_branch: args.status_branch.clone(),
    };
    if args.once {
        let fetch_source = source.clone();
        let revision = gitcanary::blocking("fetching", move || fetch_source.fetch()).await??;
        let mut report = sync_owned(&cluster, revision, &options).await?;
        write_back(&cluster, &source, &writeback, &mut report).await;
        let count = |f: fn(&gitcanary::sync::AppReport) -> usize| report.apps.iter().map(f).sum::<usize>();
        println!(
            "synced {} app(s) at {}: {} applied, {} unchanged, {} pruned; API requests: {} reads, {} writes, {} dry runs",
            report.apps.len(),
            &report.commit[..report.commit.len().min(12)],
            count(|a| a.applied.len()),
            count(|a| a.unchanged),
            count(|a| a.pruned.len()),
            cluster.requests.reads(),
            cluster.requests.writes(),
            cluster.requests.dry_runs()
        );
        for problem in report.problems() {
            println!("{problem}");
        }
        return Ok(if report.is_clean() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let ready = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(gitcanary::telemetry::Metrics::default());
    let _ = metrics.kube_requests.set(cluster.requests.clone());
    let (triggers, queue) = trigger_channel();
    if let Some(addr) = listen {
        let secret = webhook_secret()?;
        let state = ServerState {
            webhook_secret: secret.map(Arc::from),
            branch: args.source.branch.clone(),
            triggers: triggers.clone(),
            ready: ready.clone(),
            metrics: metrics.clone(),
            deliveries: Arc::default(),
        };
        let bound = serve(addr, state).await.map_err(|source| Error::Read {
            path: format!("listen address {addr}"),
            source,
        })?;
        tracing::info!(%bound, source = %source.describe(), "agent listening");
    }
    let agent = Agent {
        cluster,
        source: source.clone(),
        options,
        poll_interval: Duration::from_secs(args.poll_interval.max(1)),
        ready,
        writeback: writeback.clone(),
        github: github_client(&args, metrics.clone())?.map(Arc::new),
        metrics,
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
    let leadership = match leader.filter(|l| !l.no_leader_election) {
        Some(leader) => {
            ensure_namespace(&agent.cluster, &args.source.state_namespace).await?;
            let leadership = Leadership::new(&agent.cluster, lease_config(&args.source, &leader));
            if !leadership.acquire(&mut stopped).await {
                return Ok(ExitCode::SUCCESS);
            }
            tracing::info!(identity = %leadership.config().identity, "leading: this agent acts");
            Some(leadership)
        }
        None => None,
    };
    let running = agent.run(triggers, queue, stopped.clone());
    tokio::pin!(running);
    let lost = async {
        match &leadership {
            Some(leadership) => leadership.keep().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = &mut running => {}
        _ = stopped.wait_for(|s| *s) => {
            if tokio::time::timeout(Duration::from_secs(30), &mut running).await.is_err() {
                tracing::warn!("the sync in progress did not finish within 30 s; stopping anyway");
            }
        }
        _ = lost => {
            // Another agent may act from now on: stop at once, and let the
            // restart rejoin as a follower.
            tracing::error!("leadership lost; exiting so that only one agent acts");
            return Ok(ExitCode::from(3));
        }
    }
    signals.abort();
    if let Some(leadership) = leadership {
        leadership.release().await;
    }
    Ok(ExitCode::SUCCESS)
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

fn github_client(args: &SyncArgs, metrics: Arc<gitcanary::telemetry::Metrics>) -> Result<Option<GitHub>, Error> {
    let Some(repo) = &args.github_repo else { return Ok(None) };
    let token = match std::env::var("GITCANARY_GITHUB_TOKEN") {
        Ok(token) => Some(token),
        Err(_) => match std::env::var("GITCANARY_GITHUB_TOKEN_FILE") {
            Ok(path) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|source| Error::Read { path, source })?
                    .trim_end()
                    .to_string(),
            ),
            Err(_) => None,
        },
    };
    match token {
        Some(token) => Ok(Some(GitHub::new(&args.github_url, &token, repo, metrics)?)),
        None => {
            tracing::warn!("--github-repo is set but no GITCANARY_GITHUB_TOKEN: GitHub reporting is off");
            Ok(None)
        }
    }
}

/// `GITCANARY_WEBHOOK_SECRET` or the file named by `GITCANARY_WEBHOOK_SECRET_FILE`.
fn webhook_secret() -> Result<Option<Vec<u8>>, Error> {
    if let Ok(secret) = std::env::var("GITCANARY_WEBHOOK_SECRET") {
        return Ok(Some(secret.into_bytes()));
    }
    match std::env::var("GITCANARY_WEBHOOK_SECRET_FILE") {
        Ok(path) => std::fs::read_to_string(&path)
            .map(|s| Some(s.trim_end().as_bytes().to_vec()))
            .map_err(|source| Error::Read { path, source }),
        Err(_) => Ok(None),
    }
}
