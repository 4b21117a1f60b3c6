//! The subcommands, as the binary runs them: `main.rs` parses the command
//! line and dispatches here, so tests and the binary run the same code.

mod github;
mod pages;
mod run;
mod status;

pub use pages::dashboard;
pub use run::{Listen, run_agent, sync_once};
pub use status::{EnvironmentsArgs, RolloutsView, status};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::cluster::{Cluster, render_diff};
use crate::model::ServiceAccountRef;
use crate::rollout::cli::{Signal, send_signal};
use crate::source::{Credentials, Source};
use crate::sync::SyncOptions;
use crate::{Error, manifest};
pub use github::GitHubArgs;

/// Where manifests may put objects.
#[derive(Args, Clone)]
pub struct AllowedArgs {
    /// Namespaces manifests may use (comma-separated); default all. An object
    /// without a namespace lands in `default`, which must then be listed.
    #[arg(long, env = "GITCANARY_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// With --namespaces: the cluster-scoped kinds manifests may hold
    /// as group/Kind, comma-separated (Namespace or /Namespace for the core
    /// group, rbac.authorization.k8s.io/ClusterRole); a Namespace only of a listed name.
    #[arg(long, value_delimiter = ',')]
    pub cluster_kinds: Vec<String>,
    /// Where a namespaced object whose manifest names no namespace lands.
    #[arg(long, default_value = manifest::DEFAULT_NAMESPACE)]
    pub default_namespace: String,
}

impl AllowedArgs {
    fn to_allowed(&self) -> manifest::Allowed {
        manifest::Allowed {
            namespaces: self.namespaces.clone(),
            cluster_kinds: self.cluster_kinds.clone(),
            default_namespace: self.default_namespace.clone(),
        }
    }
}

/// How Kustomize and Helm apps are rendered.
#[derive(Args, Clone)]
pub struct RenderArgs {
    /// The kustomize program for apps holding a kustomization; default `kustomize` on PATH.
    #[arg(long, env = "GITCANARY_KUSTOMIZE")]
    pub kustomize: Option<PathBuf>,
    /// The helm program for apps holding Chart.yaml; default `helm` on PATH.
    #[arg(long, env = "GITCANARY_HELM")]
    pub helm: Option<PathBuf>,
    /// Let kustomizations name remote bases and resources, fetched over the network.
    #[arg(long)]
    pub render_allow_remote: bool,
    /// Seconds one render may run before it is stopped.
    #[arg(long, default_value_t = 60)]
    pub render_timeout: u64,
    /// Largest output of one render, in bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub render_max_output: u64,
}

impl RenderArgs {
    /// The renderers, keeping clean renders under `cache` when given.
    pub fn renderers(
        &self,
        default_namespace: &str,
        cache: Option<PathBuf>,
    ) -> std::sync::Arc<crate::render::Renderers> {
        let mut renderers = crate::render::Renderers::new(crate::render::RenderConfig {
            kustomize: self.kustomize.clone(),
            helm: self.helm.clone(),
            allow_remote: self.render_allow_remote,
            timeout: Duration::from_secs(self.render_timeout),
            max_output: self.render_max_output,
            default_namespace: default_namespace.to_string(),
            ..crate::render::RenderConfig::default()
        });
        renderers.disk = cache;
        std::sync::Arc::new(renderers)
    }
}

#[derive(Args, Clone)]
pub struct ClusterArgs {
    /// Default: as kubectl finds it (KUBECONFIG, possibly several files; ~/.kube/config; in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long)]
    pub context: Option<String>,
    /// The cluster's name among those sharing the repository (the agent's
    /// --cluster-name): promotion branches are linked under it.
    #[arg(long, env = "GITCANARY_CLUSTER_NAME", value_parser = parse_cluster_name)]
    pub cluster_name: Option<String>,
}

/// A `--cluster-name`: a DNS label, as it becomes one segment of paths and branches.
fn parse_cluster_name(name: &str) -> Result<String, String> {
    crate::rollout::record::Records::of_cluster(name).map(|_| name.to_string())
}

impl ClusterArgs {
    /// Where the agent of this cluster keeps its records.
    pub fn records(&self) -> crate::rollout::record::Records {
        records_of(self.cluster_name.as_deref())
    }
}

/// The records of the named cluster, or of the only one.
pub fn records_of(cluster_name: Option<&str>) -> crate::rollout::record::Records {
    cluster_name
        .and_then(|name| crate::rollout::record::Records::of_cluster(name).ok())
        .unwrap_or_default()
}

#[derive(Args, Clone)]
pub struct SourceArgs {
    /// Git URL (https://, ssh://, file://), path to a Git repository, or a plain directory.
    #[arg(long, env = "GITCANARY_REPO")]
    pub repo: String,
    #[arg(long, env = "GITCANARY_BRANCH", default_value = "main")]
    pub branch: String,
    /// Sub-directory of the repository that holds the apps.
    #[arg(long, env = "GITCANARY_PATH", default_value = "")]
    pub path: String,
    /// This cluster's name, when agents of several clusters share the
    /// repository: status files (`.gitcanary/status/NAME/…`), gate files and
    /// branches, commit statuses and trailers carry it, so no agent writes
    /// or reads back another's. A DNS label.
    #[arg(long, env = "GITCANARY_CLUSTER_NAME", value_parser = parse_cluster_name)]
    pub cluster_name: Option<String>,
    /// Delete managed objects that left Git.
    #[arg(long)]
    pub prune: bool,
    /// Take over objects that already exist in the cluster (a migration to
    /// gitcanary); without it, only manifests annotated gitcanary.io/adopt: "true".
    #[arg(long)]
    pub adopt: bool,
    #[command(flatten)]
    pub allowed: AllowedArgs,
    #[command(flatten)]
    pub render: RenderArgs,
    /// APP=NAMESPACE/SERVICEACCOUNT (repeatable, or comma-separated): every
    /// write of the app is made as that ServiceAccount, so RBAC bounds what a
    /// commit to it can do.
    #[arg(long = "tenant", env = "GITCANARY_TENANTS", value_delimiter = ',', value_parser = parse_tenant)]
    pub tenants: Vec<(String, ServiceAccountRef)>,
    /// NAMESPACE/SERVICEACCOUNT for the apps --tenant does not name; default:
    /// they write as the agent.
    #[arg(long, env = "GITCANARY_DEFAULT_SERVICE_ACCOUNT", value_parser = parse_service_account)]
    pub default_service_account: Option<ServiceAccountRef>,
    /// Name of this agent instance (the gitcanary.io/managed-by label value).
    #[arg(long, default_value = "gitcanary")]
    pub instance: String,
    /// Namespace for the per-app status ConfigMaps.
    #[arg(long, default_value = "gitcanary-system")]
    pub state_namespace: String,
    /// Default: as kubectl finds it (KUBECONFIG, possibly several files; ~/.kube/config; in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long)]
    pub context: Option<String>,
    /// Where the Git mirror is kept.
    #[arg(long, env = "GITCANARY_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Prometheus for analysis templates that name none (http://HOST:9090).
    #[arg(long, env = "GITCANARY_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,
    /// A Prometheus an analysis template may name (`prometheus: {name: NAME}`),
    /// NAME=http://HOST:9090; repeat for more. Templates cannot give an address.
    #[arg(long = "prometheus", env = "GITCANARY_PROMETHEUS", value_delimiter = ',', value_parser = parse_prometheus)]
    pub prometheus: Vec<(String, String)>,
    /// A web endpoint an analysis metric may read (`web: {name: NAME, path,
    /// jsonPath}`), NAME=http://HOST:PORT; repeat for more. Metrics cannot
    /// give an address.
    #[arg(long = "web-check", value_parser = parse_web_check)]
    pub web_check: Vec<(String, String)>,
    /// NAME=FILE: `Header: value` lines (a mounted Secret) sent with each
    /// request to the web check NAME.
    #[arg(long = "web-check-headers", value_name = "NAME=FILE")]
    pub web_check_headers: Vec<String>,
    /// An endpoint a Rollout's hooks may call (`hooks: {preRelease: {name:
    /// NAME, path}}`), NAME=http://HOST:PORT; repeat for more. Each needs
    /// --hook-secret.
    #[arg(long = "hook", value_parser = parse_hook)]
    pub hook: Vec<(String, String)>,
    /// NAME=FILE: the secret (a mounted Secret) the hook NAME's bodies are
    /// signed with (`X-Gitcanary-Signature-256`), so it can tell the agent's
    /// calls from anyone's.
    #[arg(long = "hook-secret", value_name = "NAME=FILE")]
    pub hook_secret: Vec<String>,
    /// Colour the diff: auto (when a terminal), always, never.
    #[arg(long, default_value = "auto")]
    pub color: String,
}

#[derive(Args)]
pub struct SyncArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Sync once and exit: 0 when every app synced, 1 when one has problems.
    #[arg(long)]
    pub once: bool,
    /// Seconds between polls of the branch.
    #[arg(long, default_value_t = 60)]
    pub poll_interval: u64,
    /// Every watch asks the API server for bookmarks from the start. By
    /// default a watch asks for none (each is a wake-up a minute at rest)
    /// until its resourceVersion expires or its stream breaks; this is for a
    /// path to the API server that drops connections idle for less than
    /// 3 minutes without a word.
    #[arg(long)]
    pub watch_bookmarks: bool,
    /// Author of gitcanary's own commits (promote status, reverts).
    #[arg(long, default_value = "gitcanary <gitcanary@localhost>")]
    pub git_author: String,
    /// Branch for promote status files; default the tracked branch.
    #[arg(long)]
    pub status_branch: Option<String>,
    /// SSH private key that signs gitcanary's commits (status files,
    /// reverts, gates) as Git's SSH signing does.
    #[arg(long, env = "GITCANARY_SIGN_STATUS_KEY")]
    pub sign_status_key: Option<PathBuf>,
    /// Allowed-signers file (ssh-keygen's format): a status file, or a
    /// commit of gitcanary's found by its trailers, counts only when signed
    /// by a key it lists for --git-author's email.
    #[arg(long, env = "GITCANARY_VERIFY_STATUS_SIGNERS")]
    pub verify_status_signers: Option<PathBuf>,
    #[command(flatten)]
    pub github: GitHubArgs,
    /// A receiver of release events (started, step passed, waiting for a
    /// promote, promoted, failed, aborted): `NAME=slack:URL`,
    /// `NAME=teams:URL` or `NAME=webhook:URL`, the URL or `@FILE` holding it
    /// (a mounted Secret). Repeatable; every Rollout's events go to each
    /// unless --notify-default says otherwise.
    #[arg(long = "notify", value_name = "NAME=KIND:URL")]
    pub notify: Vec<String>,
    /// The receivers told of every Rollout's releases (comma-separated);
    /// the others only of those of Rollouts that name them (`spec.notify`).
    /// Default: every receiver.
    #[arg(long = "notify-default", value_delimiter = ',', value_name = "NAME")]
    pub notify_default: Option<Vec<String>>,
    /// `NAME=FILE`: the file holding the secret a webhook receiver's bodies
    /// are signed with (HMAC-SHA256, `X-Gitcanary-Signature-256`).
    #[arg(long = "notify-secret", value_name = "NAME=FILE")]
    pub notify_secret: Vec<String>,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub sync: SyncArgs,
    /// Address for the webhook, /healthz and /readyz endpoints.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve /metrics here instead of on --listen (so the address the Git
    /// host reaches exposes only the webhook and the probes).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the dashboard (`gitcanary dashboard`'s pages, read-only, as
    /// the agent's identity) here; off by default.
    #[arg(long)]
    pub dashboard_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Args)]
pub struct LeaderArgs {
    /// Act without holding the Lease (only when no other agent can run).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Seconds a Lease lasts without renewal before another agent may take it.
    #[arg(long, default_value_t = 15)]
    pub lease_duration: u64,
    /// Who holds the Lease; default POD_NAME, else hostname-pid.
    #[arg(long)]
    pub leader_identity: Option<String>,
    /// Share the apps among the agent's replicas: N shard Leases
    /// (`gitcanary-shard-0` …) in the state namespace, each replica holding
    /// about N / replicas of them and syncing only their apps (an app's
    /// shard: FNV-1a of its name, modulo N). Replaces leader election.
    #[arg(long, value_name = "N")]
    pub shards: Option<u32>,
}

pub async fn signal(args: &ClusterArgs, namespace: &str, name: &str, signal: Signal) -> Result<ExitCode, Error> {
    let cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    send_signal(&cluster, namespace, name, signal).await?;
    let verb = signal.verb();
    println!("rollout {namespace}/{name}: {verb} requested");
    Ok(ExitCode::SUCCESS)
}

pub fn validate(
    dir: PathBuf,
    allowed: AllowedArgs,
    render: RenderArgs,
    capabilities: crate::render::Capabilities,
) -> Result<ExitCode, Error> {
    if !dir.is_dir() {
        return Err(Error::Usage(format!("{} is not a directory", dir.display())));
    }
    // Offline: Helm renders for the version gitcanary supports (or the one
    // asked for), never Helm's own old default.
    let renderers = render.renderers(&allowed.default_namespace, None);
    renderers.set_capabilities(capabilities);
    let mut set = crate::render::load_dir(&dir, &renderers)?;
    let options = SyncOptions {
        allowed: allowed.to_allowed(),
        ..SyncOptions::default()
    };
    crate::rollout::validate::validate(&mut set, &options.allowed);
    let planned = crate::sync::offline::plan_problems(&set, &options);
    let problems: Vec<_> = set.problems().chain(planned.iter()).collect();
    for problem in &problems {
        println!("{problem}");
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn parse_service_account(value: &str) -> Result<ServiceAccountRef, String> {
    value.parse()
}

/// `NAME=URL` of a server the agent may ask: NAME a DNS label, as the
/// templates that name it must write it.
fn named_url<'v>(value: &'v str, what: &str) -> Result<(&'v str, &'v str), String> {
    let (name, url) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not NAME=http://HOST:PORT"))?;
    if !crate::rollout::analysis::is_server_name(name) {
        return Err(format!(
            "{what} name {name:?} must be lowercase letters, digits and '-'"
        ));
    }
    Ok((name, url))
}

fn parse_prometheus(value: &str) -> Result<(String, String), String> {
    let (name, url) = named_url(value, "Prometheus")?;
    if !url.starts_with("http://") {
        return Err(format!("Prometheus {name}: {url:?} must start with http://"));
    }
    Ok((name.to_string(), url.to_string()))
}

fn parse_hook(value: &str) -> Result<(String, String), String> {
    parse_endpoint(value, "hook", "a hook's body is signed with --hook-secret")
}

fn parse_web_check(value: &str) -> Result<(String, String), String> {
    parse_endpoint(value, "web check", "send them with --web-check-headers")
}

/// NAME=http://HOST:PORT[/PATH] of an endpoint the agent calls: a path
/// from Git is appended, so it has no query, fragment or credentials.
fn parse_endpoint(value: &str, what: &str, credentials: &str) -> Result<(String, String), String> {
    let (name, url) = named_url(value, what)?;
    let parsed: http::Uri = url.parse().map_err(|e| format!("{what} {name}: {e}"))?;
    let plain = parsed.query().is_none() && !url.contains('#');
    if parsed.scheme_str() != Some("http") || parsed.authority().is_none_or(|a| a.as_str().contains('@')) || !plain {
        return Err(format!(
            "{what} {name}: give http://HOST:PORT[/PATH], without credentials ({credentials}), query or fragment"
        ));
    }
    Ok((name.to_string(), url.to_string()))
}

/// The web checks with their headers, read from their files.
pub(crate) fn web_checks(
    args: &SourceArgs,
) -> Result<std::collections::BTreeMap<String, crate::model::WebEndpoint>, Error> {
    let mut checks: std::collections::BTreeMap<String, crate::model::WebEndpoint> = args
        .web_check
        .iter()
        .map(|(name, url)| {
            (
                name.clone(),
                crate::model::WebEndpoint {
                    url: url.clone(),
                    headers: Vec::new(),
                },
            )
        })
        .collect();
    for pair in &args.web_check_headers {
        let (name, path) = pair
            .split_once('=')
            .ok_or_else(|| Error::Usage(format!("--web-check-headers {pair:?}: write NAME=FILE")))?;
        let check = checks
            .get_mut(name)
            .ok_or_else(|| Error::Usage(format!("--web-check-headers {name}: no --web-check has that name")))?;
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_string(),
            source,
        })?;
        check.headers = crate::rollout::web::parse_headers(&text)
            .map_err(|e| Error::Usage(format!("--web-check-headers {name}: {path}: {e}")))?;
    }
    Ok(checks)
}

/// The hook endpoints, each with its signing secret read from its file.
pub(crate) fn hooks(
    args: &SourceArgs,
) -> Result<std::collections::BTreeMap<String, crate::model::HookEndpoint>, Error> {
    let mut secrets = std::collections::BTreeMap::new();
    for pair in &args.hook_secret {
        let (name, path) = pair
            .split_once('=')
            .ok_or_else(|| Error::Usage(format!("--hook-secret {pair:?}: write NAME=FILE")))?;
        if !args.hook.iter().any(|(hook, _)| hook == name) {
            return Err(Error::Usage(format!("--hook-secret {name}: no --hook has that name")));
        }
        if secrets.contains_key(name) {
            return Err(Error::Usage(format!("--hook-secret {name}: given twice")));
        }
        let secret = std::fs::read(path)
            .map_err(|source| Error::Read {
                path: path.to_string(),
                source,
            })?
            .trim_ascii()
            .to_vec();
        if secret.is_empty() {
            return Err(Error::Usage(format!(
                "--hook-secret {name}: {path} is empty: anyone could sign with it"
            )));
        }
        secrets.insert(name.to_string(), secret);
    }
    let mut hooks = std::collections::BTreeMap::new();
    for (name, url) in &args.hook {
        if hooks.contains_key(name) {
            return Err(Error::Usage(format!("--hook: two hooks are named {name}")));
        }
        let secret = secrets.remove(name).ok_or_else(|| {
            Error::Usage(format!(
                "--hook {name}: give --hook-secret {name}=FILE: a hook's calls are signed"
            ))
        })?;
        let endpoint = crate::model::HookEndpoint {
            url: url.clone(),
            secret,
        };
        hooks.insert(name.clone(), endpoint);
    }
    Ok(hooks)
}

fn parse_tenant(value: &str) -> Result<(String, ServiceAccountRef), String> {
    let (app, account) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not APP=NAMESPACE/SERVICEACCOUNT"))?;
    Ok((app.to_string(), account.parse()?))
}

pub(crate) fn options(args: &SourceArgs) -> SyncOptions {
    SyncOptions {
        instance: args.instance.clone(),
        source: source_of(&args.repo, &args.branch, &args.path),
        state_namespace: args.state_namespace.clone(),
        prune: args.prune,
        allowed: args.allowed.to_allowed(),
        adopt: args.adopt,
        tenants: args.tenants.iter().cloned().collect(),
        default_tenant: args.default_service_account.clone(),
        prometheus_url: args.prometheus_url.clone(),
        prometheus: args.prometheus.iter().cloned().collect(),
        ..SyncOptions::default()
    }
}

/// What an app's status records as its source: the repository (without
/// credentials), the branch and the path.
pub(crate) fn source_of(repo: &str, branch: &str, path: &str) -> String {
    format!(
        "{} {branch} /{}",
        crate::source::redact_url(repo),
        path.trim_matches('/')
    )
}

pub(crate) fn open_source(args: &SourceArgs) -> Result<Source, Error> {
    let cache = args.cache_dir.clone().unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)
            .join(".cache/gitcanary")
    });
    let renderers = args
        .render
        .renderers(&args.allowed.default_namespace, Some(cache.join("renders")));
    Ok(
        Source::open(&args.repo, &args.branch, &args.path, Credentials::from_env()?, &cache)?
            .with_renderers(renderers)
            .with_records(records_of(args.cluster_name.as_deref())),
    )
}

/// Fetches the source's newest revision, rendered for the cluster.
pub(crate) async fn fetch(source: std::sync::Arc<Source>, cluster: &Cluster) -> Result<crate::source::Revision, Error> {
    source.renderers().set_capabilities(cluster.capabilities().await);
    crate::blocking("fetching", move || source.fetch()).await?
}

pub(crate) async fn connect(args: &SourceArgs) -> Result<Cluster, Error> {
    Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await
}

/// Whether to write colour: `always`, `never`, or (`auto`) only to a
/// terminal and only when `NO_COLOR` is unset or empty (no-color.org), so a
/// log file or a pipe gets plain text.
pub fn colour_wanted(setting: &str, terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    match setting {
        "always" => true,
        "never" => false,
        _ => terminal && no_color.is_none_or(|v| v.is_empty()),
    }
}

pub async fn diff(args: SourceArgs) -> Result<ExitCode, Error> {
    let source = std::sync::Arc::new(open_source(&args)?);
    let cluster = connect(&args).await?;
    let revision = fetch(source, &cluster).await?;
    let (diffs, problems, notes) = crate::sync::diff(&cluster, &revision, &options(&args)).await?;
    let color = colour_wanted(
        &args.color,
        std::io::IsTerminal::is_terminal(&std::io::stdout()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    print!("{}", render_diff(&diffs, color));
    for note in &notes {
        eprintln!("note: {note}");
    }
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

/// `gitcanary convert FILE…`: Kruise Rollouts as gitcanary's, printed (or
/// written back with `write`), with what was left behind on stderr.
/// Exit 1 when a file cannot be read or parsed, holds no Kruise Rollout, or
/// holds one that converted would release what Kruise holds back.
pub fn convert(files: &[PathBuf], write: bool) -> Result<ExitCode, Error> {
    let mut failed = false;
    let mut printed = false;
    for file in files {
        let path = file.display().to_string();
        let converted = std::fs::read_to_string(file)
            .map_err(|e| format!("{path}: {e}"))
            .and_then(|text| crate::rollout::convert::convert_file(&path, &text));
        let converted = match converted {
            Ok(converted) => converted,
            Err(error) => {
                eprintln!("{error}");
                failed = true;
                continue;
            }
        };
        for note in &converted.notes {
            eprintln!("{note}");
        }
        failed |= converted.refused;
        match converted.text {
            None => {
                eprintln!("{path}: no Kruise Rollout (rollouts.kruise.io) to convert");
                failed = true;
            }
            Some(text) if write => {
                std::fs::write(file, text).map_err(|e| Error::Usage(format!("{path}: {e}")))?;
                eprintln!("{path}: converted");
            }
            Some(text) => {
                // Files printed one after another stay separate documents.
                if printed {
                    println!("---");
                }
                print!("{text}");
                printed = true;
            }
        }
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use super::colour_wanted;
    use std::ffi::OsStr;

    #[test]
    fn every_hook_has_one_url_and_one_secret_from_a_file() {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            source: super::SourceArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let (secret, empty) = (dir.path().join("secret"), dir.path().join("empty"));
        std::fs::write(&secret, "k3y\n").unwrap();
        std::fs::write(&empty, "\n").unwrap();
        let (secret, empty) = (secret.display().to_string(), empty.display().to_string());
        let hooks = |extra: &[String]| -> Result<usize, String> {
            let line = ["gitcanary", "--repo", "r"]
                .iter()
                .map(|s| s.to_string())
                .chain(extra.iter().cloned());
            let line = <Line as clap::Parser>::try_parse_from(line).map_err(|e| e.to_string())?;
            super::hooks(&line.source).map(|h| h.len()).map_err(|e| e.to_string())
        };
        let args = |pairs: &[(&str, &str)]| -> Vec<String> {
            pairs
                .iter()
                .flat_map(|(flag, value)| [flag.to_string(), value.to_string()])
                .collect()
        };
        let hook = ("--hook", "smoke=http://checks:8080");
        let signed = format!("smoke={secret}");
        assert_eq!(hooks(&args(&[hook, ("--hook-secret", &signed)])), Ok(1));
        let refused = [
            (args(&[hook]), "give --hook-secret smoke=FILE"),
            (args(&[hook, ("--hook-secret", &format!("smoke={empty}"))]), "is empty"),
            (
                args(&[
                    hook,
                    ("--hook-secret", &signed),
                    ("--hook-secret", &format!("other={secret}")),
                ]),
                "no --hook has that name",
            ),
            (
                args(&[hook, ("--hook-secret", &signed), ("--hook-secret", &signed)]),
                "given twice",
            ),
            (
                args(&[hook, hook, ("--hook-secret", &signed)]),
                "two hooks are named smoke",
            ),
            (
                args(&[("--hook", "smoke=http://user:pw@checks")]),
                "without credentials",
            ),
            (args(&[("--hook", "smoke=http://checks/?x=1")]), "query or fragment"),
        ];
        for (line, wanted) in refused {
            let error = hooks(&line).unwrap_err();
            assert!(error.contains(wanted), "{line:?}: {error}");
        }
    }

    #[test]
    fn colour_goes_only_to_a_terminal_and_never_against_no_color() {
        assert!(colour_wanted("auto", true, None));
        assert!(
            !colour_wanted("auto", false, None),
            "a log file or a pipe gets plain text"
        );
        assert!(!colour_wanted("auto", true, Some(OsStr::new("1"))), "NO_COLOR set");
        assert!(
            colour_wanted("auto", true, Some(OsStr::new(""))),
            "NO_COLOR empty counts as unset"
        );
        assert!(colour_wanted("always", false, Some(OsStr::new("1"))), "asked for");
        assert!(!colour_wanted("never", true, None));
    }
}
