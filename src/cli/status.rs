//! `gitcanary status` and `gitcanary get rollout`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::ClusterArgs;
use crate::Error;
use crate::cluster::Cluster;
use crate::rollout::api::{Phase, Rollout};
use crate::wave::standing::{StandingReader, describe_all};

/// What `status` and `get rollout` show.
#[derive(Args)]
pub struct RolloutsView {
    name: Option<String>,
    #[arg(short, long)]
    namespace: Option<String>,
    /// Output: text or json.
    #[arg(short, long, default_value = "text")]
    output: String,
    /// Follow until every release it saw running has ended (redrawn on a
    /// terminal, a block per change when piped); exit 1 when one failed or
    /// was aborted.
    #[arg(short, long)]
    watch: bool,
    /// The agent's state namespace: with `--shards`, which replica holds
    /// each shard and each Rollout's app is shown from its Leases.
    #[arg(long, default_value = "gitcanary-system")]
    state_namespace: String,
    /// The agent's instance name, whose app statuses name each app.
    #[arg(long, default_value = crate::DEFAULT_INSTANCE)]
    instance: String,
    #[command(flatten)]
    environments: EnvironmentsArgs,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// The repository whose records tell where each release stands in every
/// environment of its waves.
#[derive(Args, Clone, Default)]
pub struct EnvironmentsArgs {
    /// The agents' repository (as `run --repo`): each Rollout's release in
    /// every environment of its root `gitcanary.yaml` is shown from the
    /// status files there.
    #[arg(long = "repo")]
    pub repo: Option<String>,
    #[arg(long, default_value = "main")]
    pub branch: String,
    /// The author of gitcanary's commits (as `run --git-author`): only its
    /// records count.
    #[arg(long, default_value = "gitcanary <gitcanary@localhost>")]
    pub git_author: String,
    /// Allowed-signers file (as `run --verify-status-signers`): a record
    /// counts only when signed by a key it lists for --git-author's email.
    /// The agents that verify their records should be read with it: without
    /// it, anyone who can push may write a record in the author's name.
    #[arg(long, env = "GITCANARY_VERIFY_STATUS_SIGNERS")]
    pub verify_status_signers: Option<std::path::PathBuf>,
}

impl EnvironmentsArgs {
    /// A reader of the repository's records, when a repository is named.
    pub fn reader(&self, here: crate::rollout::record::Records) -> Result<Option<Arc<StandingReader>>, Error> {
        let Some(repo) = &self.repo else {
            return Ok(None);
        };
        let cache = std::env::var_os("HOME")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)
            .join(".cache/gitcanary");
        let mut author = crate::identity::Author::parse(&self.git_author).map_err(Error::Usage)?;
        if let Some(allowed) = &self.verify_status_signers {
            if !allowed.is_file() {
                return Err(Error::Usage(format!(
                    "--verify-status-signers {}: no such file",
                    allowed.display()
                )));
            }
            author.verifier = Some(crate::identity::signing::Verifier {
                allowed_signers: allowed.clone(),
            });
        }
        let source =
            crate::source::Source::open(repo, &self.branch, "", crate::source::Credentials::from_env()?, &cache)?
                .with_record_writer(author);
        let git = source
            .git()
            .cloned()
            .ok_or_else(|| Error::Usage(format!("--repo {repo}: environments are read from a Git repository")))?;
        Ok(Some(Arc::new(StandingReader::new(git, here, true))))
    }
}

/// `gitcanary status` and `gitcanary get rollout`. With `watch`, until
/// every release it saw running has ended: redrawn in place on a terminal,
/// a new block only when something but the clock changed when piped; the
/// exit code is then 1 when one of them failed or was aborted.
pub async fn status(view: RolloutsView) -> Result<ExitCode, Error> {
    use std::io::Write;
    let (namespace, name, output, watch) = (
        view.namespace.as_deref(),
        view.name.as_deref(),
        view.output.as_str(),
        view.watch,
    );
    let args = &view.cluster;
    let cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let environments = view.environments.reader(args.records())?;
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    // Each release seen running, by Rollout: its id, judged when it ends.
    let mut watched = std::collections::BTreeMap::new();
    let mut last_shown = String::new();
    loop {
        let rollouts = crate::rollout::cli::list(&cluster, namespace, name).await?;
        for rollout in rollouts.iter().filter(|r| releasing(r)) {
            let id = rollout
                .status
                .as_ref()
                .map(|s| s.rollout_id.clone())
                .unwrap_or_default();
            watched.insert(key(rollout), id);
        }
        let (text, changed) = if output == "json" {
            let json = serde_json::to_string_pretty(&rollouts).unwrap_or_default() + "\n";
            (json.clone(), json)
        } else {
            let agent = (view.state_namespace.as_str(), view.instance.as_str());
            let text = render_text(&cluster, &rollouts, agent, environments.as_ref()).await;
            let changed = crate::rollout::cli::without_clock(&text);
            (text, changed)
        };
        let shown = if watch && terminal && output != "json" {
            // Redraw in place: clear the screen, cursor home.
            format!("\x1b[2J\x1b[H{text}")
        } else if changed != last_shown {
            if watch { format!("{text}\n") } else { text }
        } else {
            String::new()
        };
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`| head`) ends the watch quietly.
        if stdout
            .write_all(shown.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(ExitCode::SUCCESS);
        }
        drop(stdout);
        last_shown = changed;
        if !watch || !rollouts.iter().any(releasing) {
            let failed = rollouts.iter().any(|r| {
                let id = watched.get(&key(r));
                id.is_some_and(|id| {
                    r.status
                        .as_ref()
                        .is_some_and(|s| crate::rollout::cli::release_failed(s, id))
                })
            });
            return Ok(if watch && failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn key(rollout: &Rollout) -> (Option<String>, Option<String>) {
    (rollout.metadata.namespace.clone(), rollout.metadata.name.clone())
}

fn releasing(rollout: &Rollout) -> bool {
    rollout
        .status
        .as_ref()
        .is_some_and(|s| matches!(s.phase, Phase::Progressing | Phase::Paused | Phase::Promoting))
}

/// The table, the batches' pods, the shards, and with a repository each
/// Rollout's release in every environment.
async fn render_text(
    cluster: &Cluster,
    rollouts: &[Rollout],
    agent: (&str, &str),
    environments: Option<&Arc<StandingReader>>,
) -> String {
    let mut pods = crate::rollout::model::BatchPods::new();
    for rollout in rollouts.iter().filter(|r| releasing(r)) {
        let (namespace, name) = key(rollout);
        let found = crate::dashboard::release_pods(cluster, rollout).await;
        pods.insert((namespace.unwrap_or_default(), name.unwrap_or_default()), found);
    }
    let mut text = crate::rollout::cli::render(rollouts, &pods, jiff::Timestamp::now());
    let listed: Vec<String> = rollouts
        .iter()
        .map(|r| {
            let (ns, name) = key(r);
            format!("{}/{}", ns.unwrap_or_default(), name.unwrap_or_default())
        })
        .collect();
    text += &crate::shards::describe(cluster, agent.0, agent.1, &listed)
        .await
        .unwrap_or_default();
    if let Some(reader) = environments {
        text += &environment_lines(reader, listed).await;
    }
    text
}

/// `ENVIRONMENTS`, then a line per Rollout: its release in each
/// environment, in the waves' order, this cluster's starred.
async fn environment_lines(reader: &Arc<StandingReader>, listed: Vec<String>) -> String {
    let reader = reader.clone();
    let read = crate::blocking("reading the environments' records", move || {
        let mut lines = String::new();
        for rollout in &listed {
            let (namespace, name) = rollout.split_once('/').unwrap_or(("", rollout));
            match reader.read(namespace, name) {
                Ok(standings) if standings.is_empty() => {}
                Ok(standings) => lines.push_str(&format!("{rollout}  {}\n", describe_all(&standings))),
                Err(error) => lines.push_str(&format!("{rollout}  environments unknown: {error}\n")),
            }
        }
        lines
    })
    .await;
    match read {
        Ok(lines) if !lines.is_empty() => format!("\nENVIRONMENTS\n{lines}"),
        Ok(_) => String::new(),
        Err(error) => format!("\nENVIRONMENTS\nunknown: {error}\n"),
    }
}
