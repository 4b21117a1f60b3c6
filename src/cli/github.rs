//! The agent's GitHub options: where GitHub is, how gitcanary signs in
//! (a token, or a GitHub App's installation), and whose approvals count.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use crate::Error;
use crate::github::{Credentials, GatePolicy, GitHub};

#[derive(Args, Clone)]
pub struct GitHubArgs {
    /// GitHub API URL (GitHub Enterprise: https://HOST/api/v3).
    #[arg(long, env = "GITCANARY_GITHUB_URL", default_value = "https://api.github.com")]
    pub github_url: String,
    /// The repository on GitHub, owner/name; with GITCANARY_GITHUB_TOKEN (or _FILE) it turns on
    /// pull-request comments, commit statuses and /gitcanary commands.
    #[arg(long, env = "GITCANARY_GITHUB_REPO")]
    pub github_repo: Option<String>,
    /// Seconds between looks for `/gitcanary` commands and approvals while a
    /// release waits at a pause with GitHub on; doubled after each look that
    /// finds the release where it was, up to --github-poll-max. GitHub's
    /// webhook events (issue_comment, pull_request_review, pull_request) are
    /// acted on at once; this poll only catches a missed one.
    #[arg(long, default_value_t = 15)]
    pub github_poll: u64,
    /// The longest wait between two such looks, in seconds.
    #[arg(long, default_value_t = 120)]
    pub github_poll_max: u64,
    /// GitHub requests of each rate-limit window (5,000 an hour for a
    /// token) left to the token's other users: once an answer says no more
    /// remain, the agent makes no GitHub call until the window resets.
    /// Releases go on; commands and approvals wait for the reset (or come
    /// through `gitcanary promote`).
    #[arg(long, default_value_t = 500)]
    pub github_reserve: u64,
    /// Let the author of a change approve its own promotion pull request
    /// (GitHub's own rule forbids it; off by default).
    #[arg(long)]
    pub gate_allow_self_approval: bool,
    /// Bot accounts whose approvals, merges and commands pass a gate
    /// (repeatable or comma-separated, e.g. --github-bot release-bot[bot]);
    /// no other bot's count, and a bot never passes its own commits.
    #[arg(long = "github-bot", visible_alias = "gate-bots", value_delimiter = ',')]
    pub gate_bots: Vec<String>,
    /// Sign in as this GitHub App (its numeric id) instead of with a token:
    /// installation tokens are minted from the App's private key and
    /// renewed before they expire; the App's bot account is gitcanary's own.
    #[arg(long, env = "GITCANARY_GITHUB_APP_ID", requires = "github_app_key_file")]
    pub github_app_id: Option<u64>,
    /// The App's private key (PEM, as GitHub gives it), e.g. a mounted Secret.
    #[arg(long, env = "GITCANARY_GITHUB_APP_KEY_FILE", requires = "github_app_id")]
    pub github_app_key_file: Option<PathBuf>,
    /// The App's installation on --github-repo's account; found from the
    /// repository when not given.
    #[arg(long, env = "GITCANARY_GITHUB_APP_INSTALLATION", requires = "github_app_id")]
    pub github_app_installation: Option<u64>,
}

/// The GitHub client `--github-repo` asks for, signed in with the App when
/// `--github-app-id` is given, else with GITCANARY_GITHUB_TOKEN (or _FILE).
pub fn github_client(args: &GitHubArgs, metrics: Arc<crate::telemetry::Metrics>) -> Result<Option<GitHub>, Error> {
    let Some(repo) = &args.github_repo else {
        if args.github_app_id.is_some() {
            tracing::warn!("--github-app-id is set but --github-repo is not: GitHub reporting is off");
        }
        return Ok(None);
    };
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
    let credentials = match (args.github_app_id, &args.github_app_key_file, token) {
        (Some(_), _, Some(_)) => {
            return Err(Error::Usage(
                "--github-app-id and GITCANARY_GITHUB_TOKEN both say how to sign in to GitHub: give one".into(),
            ));
        }
        (Some(id), Some(path), None) => Credentials::App {
            id,
            key_pem: std::fs::read(path).map_err(|source| Error::Read {
                path: path.display().to_string(),
                source,
            })?,
            installation: args.github_app_installation,
        },
        (_, _, Some(token)) => Credentials::Token(token),
        _ => {
            tracing::warn!(
                "--github-repo is set but neither GITCANARY_GITHUB_TOKEN nor --github-app-id: GitHub reporting is off"
            );
            return Ok(None);
        }
    };
    let mut github = GitHub::new(&args.github_url, credentials, repo, metrics)?;
    github.reserve = args.github_reserve;
    github.gate_policy = GatePolicy {
        allow_self_approval: args.gate_allow_self_approval,
        bots: args.gate_bots.clone(),
    };
    Ok(Some(github))
}
