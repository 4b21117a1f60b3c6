//! The command line: parse, then dispatch to `gitcanary::cli`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use gitcanary::Error;
use gitcanary::cli::{self, AllowedArgs, ClusterArgs, RenderArgs, RolloutsView, RunArgs, SourceArgs, SyncArgs};
use gitcanary::rollout::cli::Signal;

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
enum GetWhat {
    /// Rollouts: phase, step, traffic, what each waits for.
    #[command(alias = "rollouts")]
    Rollout(RolloutsView),
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
        #[command(flatten)]
        allowed: AllowedArgs,
        #[command(flatten)]
        render: RenderArgs,
        /// The Kubernetes version Helm charts render for (`.Capabilities.KubeVersion`);
        /// default the one gitcanary supports.
        #[arg(long)]
        kube_version: Option<String>,
        /// API versions Helm charts see besides the built-in ones and gitcanary's
        /// (`.Capabilities.APIVersions`), comma-separated: group/version or group/version/Kind.
        #[arg(long, value_delimiter = ',')]
        api_versions: Vec<String>,
    },
    /// Show what the next sync would change; exit 1 when the cluster differs.
    Diff(SourceArgs),
    /// Show rollouts: phase, step, traffic, what each waits for.
    Status(RolloutsView),
    /// `get rollout [NAME]`: the same view as `status`, as kubectl names it.
    Get {
        #[command(subcommand)]
        what: GetWhat,
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
    /// Serve a page per release to keep open while it runs, and the list
    /// of Rollouts (problems first); read-only, as the kubeconfig's identity.
    Dashboard {
        /// Where to listen; port 0 picks a free one (the URL is printed).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Only this namespace's Rollouts; default every namespace.
        #[arg(short, long)]
        namespace: Option<String>,
        /// OWNER/REPO on GitHub: commits and promotion pull requests are linked.
        #[arg(long)]
        github_repo: Option<String>,
        /// Promote and abort buttons on the release pages, sent as the
        /// kubeconfig's identity (so Kubernetes RBAC decides).
        #[arg(long)]
        allow_actions: bool,
        #[command(flatten)]
        environments: cli::EnvironmentsArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Print the Rollout CustomResourceDefinition.
    Crd,
    /// Rewrite Kruise Rollouts (rollouts.kruise.io v1alpha1, v1beta1) as
    /// gitcanary's: printed, or written back with --write; what could not be
    /// carried over is said on stderr as file:line: note.
    Convert {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write each converted file back in place.
        #[arg(long)]
        write: bool,
    },
}

/// Two malloc arenas instead of glibc's eight per core: the agent's memory
/// is a few long-lived caches filled from many threads, and each arena
/// keeps what was freed in it (peak for 5,000 objects: 104 MiB, with two 83).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: called first in main, before any other thread exists or any
    // allocation is shared.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

/// How long an idle blocking thread waits for work before it ends: longer
/// than a poll's interval (60 s by default), so that each poll's fetch finds
/// a thread waiting instead of starting one and ending it 10 s later.
const BLOCKING_THREAD_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(300);

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .build()
        .expect("a tokio runtime starts");
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
    let colour = gitcanary::cli::colour_wanted(
        "auto",
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn dispatch(command: Command) -> Result<ExitCode, Error> {
    match command {
        Command::Validate {
            dir,
            allowed,
            render,
            kube_version,
            api_versions,
        } => {
            let capabilities = gitcanary::render::Capabilities::offline(kube_version.as_deref(), &api_versions)
                .map_err(Error::Usage)?;
            cli::validate(dir, allowed, render, capabilities)
        }
        Command::Diff(args) => cli::diff(args).await,
        Command::Sync(args) if args.once => cli::sync_once(args).await,
        Command::Sync(args) => cli::run_agent(args, None, None).await,
        Command::Run(args) => {
            let listen = cli::Listen {
                webhook: args.listen,
                metrics: args.metrics_listen,
                dashboard: args.dashboard_listen,
            };
            cli::run_agent(args.sync, Some(listen), Some(args.leader)).await
        }
        Command::Dashboard {
            listen,
            namespace,
            github_repo,
            allow_actions,
            environments,
            cluster,
        } => cli::dashboard(&cluster, &listen, namespace, github_repo, (allow_actions, environments)).await,
        Command::Crd => {
            print!("{}", gitcanary::rollout::api::crd_yaml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Convert { files, write } => cli::convert(&files, write),
        Command::Promote {
            name,
            namespace,
            cluster,
        } => cli::signal(&cluster, &namespace, &name, Signal::Promote).await,
        Command::Abort {
            name,
            namespace,
            cluster,
        } => cli::signal(&cluster, &namespace, &name, Signal::Abort).await,
        Command::Status(view)
        | Command::Get {
            what: GetWhat::Rollout(view),
        } => cli::status(view).await,
    }
}
