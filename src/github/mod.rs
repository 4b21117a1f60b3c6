//! GitHub: one comment per release on the pull request that carried the
//! change (edited in place, found again by a hidden marker), a commit status
//! per rollout, and `/gitcanary promote|abort` commands from writers. All
//! through octocrab, with a configurable base URL (Enterprise, tests).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::Method;
use octocrab::Octocrab;
use serde_json::{Value, json};

use crate::rollout::api::Signal;
use crate::telemetry::Metrics;
use crate::{Error, Result};

pub use answers::{is_edited, is_writer, release_people};
use budget::now_epoch;
pub use budget::rate_limit_wait;
pub use comment::{commit_status, defang, escape_inline, is_reportable, marker, parse_command, render_comment};
pub use judge::{Approval, GatePolicy, PullFile, PullRequest};
pub use session::Credentials;
use session::Session;

mod answers;
mod budget;
mod comment;
mod etags;
pub mod gate;
pub use gitcanary_core::github::judge;
mod session;

pub struct GitHub {
    session: Session,
    /// Where the API is; pagination links elsewhere are not followed.
    base: http::Uri,
    owner: String,
    repo: String,
    metrics: Arc<Metrics>,
    /// No calls before this instant: GitHub asked (rate limit), or the
    /// reserve was reached; and why, as a refused call says.
    quiet_until: std::sync::Mutex<Option<(Instant, String)>>,
    /// Requests of each rate-limit window left to the token's other users.
    pub reserve: u64,
    /// The account gitcanary acts as: its own comments are never commands.
    login: tokio::sync::OnceCell<String>,
    /// Whose approvals pass a gate.
    pub gate_policy: GatePolicy,
    /// The last answer of each `GET`, for conditional requests.
    etags: etags::Etags,
    /// The newest command comment this process handled, by Rollout
    /// (`namespace/name`): a look that starts from a status read before the
    /// last look's record landed (events come fast) acts on none twice.
    handled: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

/// One comment that holds a command.
#[derive(Debug, Clone)]
pub struct CommandComment {
    pub id: u64,
    pub user: String,
    pub command: Signal,
    /// When GitHub says it was written.
    pub written: Option<jiff::Timestamp>,
}

/// How long GitHub may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may wait for GitHub between bytes.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one call may take in all, answer read included.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

impl GitHub {
    /// `repository` is `owner/name`; `base_url` is `https://api.github.com` or an Enterprise or test URL.
    pub fn new(base_url: &str, credentials: Credentials, repository: &str, metrics: Arc<Metrics>) -> Result<GitHub> {
        let (owner, repo) = repository
            .split_once('/')
            .ok_or_else(|| Error::Usage(format!("--github-repo {repository:?} is not owner/name")))?;
        let builder = Octocrab::builder()
            .base_uri(base_url)
            .map_err(|e| Error::GitHub {
                context: "client".into(),
                status: None,
                message: e.to_string(),
            })?
            .set_connect_timeout(Some(CONNECT_TIMEOUT))
            .set_read_timeout(Some(REQUEST_TIMEOUT))
            .set_write_timeout(Some(REQUEST_TIMEOUT));
        let session = Session::new(builder, credentials, repo)?;
        let base = base_url
            .parse()
            .map_err(|e: http::uri::InvalidUri| Error::Usage(format!("--github-url: {e}")))?;
        Ok(GitHub {
            session,
            base,
            owner: owner.to_string(),
            repo: repo.to_string(),
            metrics,
            quiet_until: std::sync::Mutex::new(None),
            reserve: 0,
            login: tokio::sync::OnceCell::new(),
            gate_policy: GatePolicy::default(),
            etags: etags::Etags::default(),
            handled: std::sync::Mutex::default(),
        })
    }

    /// The newest command comment handled for `rollout`: the one its
    /// status records, or a newer one this process handled since.
    pub fn handled_since(&self, rollout: &str, recorded: u64) -> u64 {
        let handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        handled.get(rollout).copied().unwrap_or(0).max(recorded)
    }

    pub fn note_handled(&self, rollout: &str, last: u64) {
        let mut handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        let entry = handled.entry(rollout.to_string()).or_default();
        *entry = (*entry).max(last);
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// `owner/name`.
    pub fn repository(&self) -> String {
        format!("{}/{}", self.owner, self.repo)
    }

    /// Whether `full_name` (a pull request's head repository) is this
    /// repository, as GitHub names it: owner and name ignore case.
    pub fn is_this_repository(&self, full_name: &str) -> bool {
        full_name.eq_ignore_ascii_case(&self.repository())
    }

    /// The login of the account gitcanary's token acts as (asked once).
    pub async fn login(&self) -> Result<&str> {
        let login = self
            .login
            .get_or_try_init(|| async {
                if let Some(login) = self.session.app_login(&self.metrics).await {
                    return login;
                }
                let (me, _) = self
                    .request(Method::GET, "/user".to_string(), None, "the token's account")
                    .await?;
                me["login"].as_str().map(str::to_string).ok_or_else(|| Error::GitHub {
                    context: "the token's account".into(),
                    status: None,
                    message: "the answer names no login".into(),
                })
            })
            .await?;
        Ok(login)
    }

    fn path(&self, rest: &str) -> String {
        format!("/repos/{}/{}/{rest}", self.owner, self.repo)
    }

    /// Until when GitHub asked for quiet, if it did.
    pub fn backing_off(&self) -> Option<Instant> {
        self.quiet().map(|(until, _)| until)
    }

    /// Every GitHub call goes through here: counted, refused locally while
    /// GitHub asked for quiet, and backed off as the rate-limit headers say.
    async fn call(&self, method: Method, rest: &str, body: Option<&Value>, context: &str) -> Result<Value> {
        let (value, _) = self.request(method, self.path(rest), body, context).await?;
        Ok(value)
    }

    /// Every page of a list, following GitHub's `Link: <…>; rel="next"` on
    /// the same host, at most [`MAX_PAGES`] pages.
    async fn list(&self, rest: &str, context: &str) -> Result<Vec<Value>> {
        let separator = if rest.contains('?') { '&' } else { '?' };
        let mut uri = self.path(&format!("{rest}{separator}per_page=100"));
        let mut items = Vec::new();
        for _ in 0..MAX_PAGES {
            let (page, headers) = self.request(Method::GET, uri, None, context).await?;
            items.extend(array(&page).iter().cloned());
            match next_page(&headers, &self.base) {
                Some(next) => uri = next,
                None => return Ok(items),
            }
        }
        tracing::warn!(
            context,
            pages = MAX_PAGES,
            "GitHub: a list longer than this many pages was cut off"
        );
        Ok(items)
    }

    async fn request(
        &self,
        method: Method,
        uri: String,
        body: Option<&Value>,
        context: &str,
    ) -> Result<(Value, http::HeaderMap)> {
        let endpoint = budget::endpoint(method.as_str(), &uri);
        match tokio::time::timeout(CALL_TIMEOUT, self.request_once(method, uri, body, context)).await {
            Ok(answer) => answer,
            Err(_) => {
                self.metrics.github_errors.fetch_add(1, Ordering::Relaxed);
                self.metrics.github_calls.add(&endpoint, "error");
                Err(Error::GitHub {
                    context: context.to_string(),
                    status: None,
                    message: format!("no answer within {} s", CALL_TIMEOUT.as_secs()),
                })
            }
        }
    }

    async fn request_once(
        &self,
        method: Method,
        uri: String,
        body: Option<&Value>,
        context: &str,
    ) -> Result<(Value, http::HeaderMap)> {
        let error = |status: Option<u16>, message: String| Error::GitHub {
            context: context.to_string(),
            status,
            message,
        };
        let endpoint = budget::endpoint(method.as_str(), &uri);
        if let Some((until, why)) = self.quiet() {
            self.metrics.github_calls.add(&endpoint, "refused");
            let wait = until.saturating_duration_since(Instant::now()).as_secs();
            return Err(error(None, format!("rate limited ({why}); {wait} s more")));
        }
        let client = self
            .session
            .client(&self.owner, &self.repo, &self.metrics)
            .await
            .inspect_err(|_| {
                self.metrics.github_errors.fetch_add(1, Ordering::Relaxed);
                self.metrics.github_calls.add(&endpoint, "error");
            })?;
        let get = method == Method::GET;
        let remembered = get.then(|| self.etags.remembered(&uri)).flatten();
        let sent = match method {
            Method::GET => {
                let mut headers = http::HeaderMap::new();
                if let Some(value) = remembered
                    .as_ref()
                    .and_then(|(etag, _)| http::HeaderValue::from_str(etag).ok())
                {
                    headers.insert(http::header::IF_NONE_MATCH, value);
                }
                client._get_with_headers(uri.as_str(), Some(headers)).await
            }
            Method::POST => client._post(uri.as_str(), body).await,
            Method::PATCH => client._patch(uri.as_str(), body).await,
            Method::PUT => client._put(uri.as_str(), body).await,
            _ => client._delete(uri.as_str(), body).await,
        };
        let response = sent.map_err(|e| {
            self.metrics.github_errors.fetch_add(1, Ordering::Relaxed);
            self.metrics.github_calls.add(&endpoint, "error");
            error(None, e.to_string())
        })?;
        let status = response.status().as_u16();
        self.metrics.github_calls.add(&endpoint, &status.to_string());
        let headers = response.headers().clone();
        self.note_budget(&headers);
        if status == 304
            && let Some((_, answer)) = remembered
        {
            self.metrics.github_not_modified.fetch_add(1, Ordering::Relaxed);
            return Ok(answer.as_ref().clone());
        }
        let text = client.body_to_string(response).await.map_err(|e| {
            self.metrics.github_errors.fetch_add(1, Ordering::Relaxed);
            // An answer cut off is no answer: asking again may get it whole.
            error(None, e.to_string())
        })?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            let answer = (value, headers);
            if get {
                self.etags.remember(&uri, &answer);
            }
            return Ok(answer);
        }
        self.metrics.github_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(wait) = rate_limit_wait(status, &headers, now_epoch()) {
            self.metrics.github_rate_limited.fetch_add(1, Ordering::Relaxed);
            self.keep_quiet(wait, format!("GitHub answered {status}"));
            tracing::warn!(
                status,
                wait_seconds = wait.as_secs(),
                "GitHub rate limit: no GitHub calls until it resets; releases go on"
            );
        }
        let message = value["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| text.chars().take(200).collect());
        Err(error(Some(status), message))
    }

    /// Pull requests that carried a commit, each with its author.
    pub async fn carried_by(&self, sha: &str) -> Result<Vec<(u64, String)>> {
        let pulls = self
            .list(&format!("commits/{sha}/pulls"), "pull requests of a commit")
            .await?;
        Ok(pulls
            .iter()
            .filter_map(|p| {
                let author = p["user"]["login"].as_str().unwrap_or_default().to_string();
                Some((p["number"].as_u64()?, author))
            })
            .collect())
    }

    async fn comments(&self, pull: u64) -> Result<Vec<Value>> {
        self.list(&format!("issues/{pull}/comments"), "comments").await
    }

    /// Creates the comment holding `marker`, or edits it in place.
    pub async fn upsert_comment(&self, pull: u64, marker: &str, body: &str) -> Result<u64> {
        let existing = self
            .comments(pull)
            .await?
            .into_iter()
            .find(|c| c["body"].as_str().is_some_and(|b| b.contains(marker)));
        let full = format!("{marker}\n{}", defang(body));
        let comment = match existing {
            Some(comment) if comment["body"].as_str() == Some(full.as_str()) => comment,
            Some(comment) => {
                let id = comment["id"].as_u64().unwrap_or_default();
                self.call(
                    Method::PATCH,
                    &format!("issues/comments/{id}"),
                    Some(&json!({"body": full})),
                    "editing a comment",
                )
                .await?
            }
            None => {
                self.call(
                    Method::POST,
                    &format!("issues/{pull}/comments"),
                    Some(&json!({"body": full})),
                    "creating a comment",
                )
                .await?
            }
        };
        Ok(comment["id"].as_u64().unwrap_or_default())
    }

    pub async fn set_status(&self, sha: &str, context: &str, state: &str, description: &str) -> Result<()> {
        let description: String = description.chars().take(140).collect();
        self.call(
            Method::POST,
            &format!("statuses/{sha}"),
            Some(&json!({"state": state, "context": context, "description": description})),
            "setting the commit status",
        )
        .await?;
        Ok(())
    }

    /// Commands in comments newer than `after` and written since the release
    /// began (`since`), oldest first; comments by gitcanary's own account
    /// never count.
    pub async fn commands(&self, pull: u64, after: u64, since: Option<jiff::Timestamp>) -> Result<Vec<CommandComment>> {
        let own = self.login().await?.to_string();
        // GitHub's times are whole seconds: compare in whole seconds, so a
        // command written in the second the release began still counts.
        let since = since.map(|t| t.as_second());
        let written_since = |c: &Value| {
            let created = c["created_at"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
            since.is_none_or(|since| created.is_some_and(|created| created.as_second() >= since))
        };
        let mut found: Vec<CommandComment> = self
            .comments(pull)
            .await?
            .iter()
            .filter(|c| c["user"]["login"].as_str() != Some(own.as_str()))
            .filter(|c| written_since(c))
            // A writer may edit anyone's comment: an edited one is no longer
            // only its author's words, so it commands nothing.
            .filter(|c| !is_edited(c))
            .filter_map(|c| {
                let id = c["id"].as_u64()?;
                let command = parse_command(c["body"].as_str()?)?;
                (id > after).then(|| CommandComment {
                    id,
                    user: c["user"]["login"].as_str().unwrap_or_default().to_string(),
                    command,
                    written: c["created_at"].as_str().and_then(|t| t.parse().ok()),
                })
            })
            .collect();
        found.sort_by_key(|c| c.id);
        Ok(found)
    }

    /// Whether the user may act on releases: write, maintain or admin.
    pub async fn can_write(&self, user: &str) -> Result<bool> {
        let answer = self
            .call(
                Method::GET,
                &format!("collaborators/{user}/permission"),
                None,
                "a collaborator's permission",
            )
            .await?;
        Ok(is_writer(&answer))
    }

    pub async fn reply(&self, pull: u64, body: &str) -> Result<()> {
        self.call(
            Method::POST,
            &format!("issues/{pull}/comments"),
            Some(&json!({"body": defang(body)})),
            "replying",
        )
        .await?;
        Ok(())
    }

    /// The newest pull request (open or closed) from `branch` of this repository.
    pub async fn pull_for_branch(&self, branch: &str) -> Result<Option<PullRequest>> {
        let pulls = self
            .list(
                &format!("pulls?state=all&head={}:{branch}", self.owner),
                "pull requests of a branch",
            )
            .await?;
        // `head=owner:branch` also lists forks within the same owner: only a
        // branch of this repository is the one asked for.
        Ok(pulls
            .iter()
            .filter_map(PullRequest::from_json)
            .filter(|p| p.head_ref == branch && self.is_this_repository(&p.head_repo))
            .max_by_key(|p| p.number))
    }

    /// Open pull requests against `base`.
    pub async fn open_pulls(&self, base: &str) -> Result<Vec<PullRequest>> {
        let pulls = self
            .list(&format!("pulls?state=open&base={base}"), "open pull requests")
            .await?;
        Ok(pulls.iter().filter_map(PullRequest::from_json).collect())
    }

    pub async fn create_pull(&self, head: &str, base: &str, title: &str, body: &str) -> Result<PullRequest> {
        let created = self
            .call(
                Method::POST,
                "pulls",
                Some(
                    &json!({"title": escape_inline(title), "head": head, "base": base, "body": defang(body), "maintainer_can_modify": false}),
                ),
                "opening a pull request",
            )
            .await?;
        PullRequest::from_json(&created).ok_or_else(|| Error::GitHub {
            context: "opening a pull request".into(),
            status: None,
            message: "the answer has no number".into(),
        })
    }

    /// Each reviewer's latest verdict on the pull request (comment-only
    /// reviews change none), with the commit it was given on.
    pub async fn approvals(&self, pull: u64) -> Result<Vec<Approval>> {
        let reviews = self.list(&format!("pulls/{pull}/reviews"), "reviews").await?;
        let mut latest: Vec<(Approval, bool)> = Vec::new();
        for review in &reviews {
            let user = review["user"]["login"].as_str().unwrap_or_default().to_string();
            let state = review["state"].as_str().unwrap_or_default();
            if user.is_empty() || state == "COMMENTED" || state == "PENDING" {
                continue;
            }
            latest.retain(|(a, _)| a.user != user);
            let approval = Approval {
                bot: review["user"]["type"] == "Bot" || user.ends_with("[bot]"),
                user,
                commit: review["commit_id"].as_str().unwrap_or_default().to_string(),
            };
            latest.push((approval, state == "APPROVED"));
        }
        Ok(latest
            .into_iter()
            .filter(|(_, approved)| *approved)
            .map(|(a, _)| a)
            .collect())
    }

    /// The files a pull request changes, renames with their old paths.
    pub async fn pull_files(&self, pull: u64) -> Result<Vec<PullFile>> {
        let files = self
            .list(&format!("pulls/{pull}/files"), "a pull request's files")
            .await?;
        Ok(files
            .iter()
            .filter_map(|f| {
                Some(PullFile {
                    filename: f["filename"].as_str()?.to_string(),
                    previous_filename: f["previous_filename"].as_str().map(str::to_string),
                })
            })
            .collect())
    }

    /// Whether a branch of this name exists in the repository.
    pub async fn branch_exists(&self, branch: &str) -> Result<bool> {
        match self
            .call(Method::GET, &format!("git/ref/heads/{branch}"), None, "a branch")
            .await
        {
            Ok(found) => Ok(found["ref"].as_str() == Some(format!("refs/heads/{branch}").as_str())),
            Err(Error::GitHub { status: Some(404), .. }) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// The GitHub logins of the authors and committers of the commits after
    /// `base` up to `head` (GitHub's compare), or of `head` alone without a
    /// base, as far as GitHub tied them to an account.
    pub async fn commit_people(&self, base: Option<&str>, head: &str, own_email: &str) -> Result<Vec<String>> {
        let mut total = None;
        let commits = match base {
            Some(base) => {
                let compare = self
                    .call(
                        Method::GET,
                        &format!("compare/{base}...{head}"),
                        None,
                        "the release's commits",
                    )
                    .await?;
                total = compare["total_commits"].as_u64();
                array(&compare["commits"]).to_vec()
            }
            None => vec![
                self.call(Method::GET, &format!("commits/{head}"), None, "the release's commit")
                    .await?,
            ],
        };
        release_people(&commits, total, own_email)
    }

    /// Who closed the issue or pull request, when it is closed.
    pub async fn closed_by(&self, number: u64) -> Result<Option<String>> {
        let issue = self
            .call(
                Method::GET,
                &format!("issues/{number}"),
                None,
                "who closed a pull request",
            )
            .await?;
        Ok(issue["closed_by"]["login"].as_str().map(str::to_string))
    }

    pub async fn reopen_pull(&self, pull: u64) -> Result<()> {
        self.set_pull_state(pull, "open", "reopening a pull request").await
    }

    /// Merges the pull request if its head is still `sha`.
    pub async fn merge(&self, pull: u64, sha: &str, title: &str) -> Result<()> {
        self.call(
            Method::PUT,
            &format!("pulls/{pull}/merge"),
            Some(&json!({"sha": sha, "merge_method": "merge", "commit_title": title})),
            "merging a pull request",
        )
        .await?;
        Ok(())
    }

    /// One pull request as `GET pulls/{n}` has it: unlike a list, it says
    /// who merged it.
    pub async fn pull(&self, pull: u64) -> Result<PullRequest> {
        let found = self
            .call(Method::GET, &format!("pulls/{pull}"), None, "a pull request")
            .await?;
        PullRequest::from_json(&found).ok_or_else(|| Error::GitHub {
            context: "a pull request".into(),
            status: None,
            message: format!("pull request #{pull} came back without a number"),
        })
    }

    /// A commit's message.
    pub async fn commit_message(&self, sha: &str) -> Result<String> {
        let commit = self
            .call(Method::GET, &format!("commits/{sha}"), None, "a commit")
            .await?;
        Ok(commit["commit"]["message"].as_str().unwrap_or_default().to_string())
    }

    pub async fn close_pull(&self, pull: u64) -> Result<()> {
        self.set_pull_state(pull, "closed", "closing a pull request").await
    }

    async fn set_pull_state(&self, pull: u64, state: &str, context: &str) -> Result<()> {
        self.call(
            Method::PATCH,
            &format!("pulls/{pull}"),
            Some(&json!({"state": state})),
            context,
        )
        .await?;
        Ok(())
    }
}

/// Pages a list may have: 100 items each.
const MAX_PAGES: usize = 50;

/// The `rel="next"` link of a page, when it is on the API's own host.
fn next_page(headers: &http::HeaderMap, base: &http::Uri) -> Option<String> {
    let link = headers.get("link")?.to_str().ok()?;
    let next = link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| target.trim().trim_start_matches('<').trim_end_matches('>').to_string())
    })?;
    let uri: http::Uri = next.parse().ok()?;
    // Sent as a path, as the first page is: octocrab signs an App's (and
    // an installation's) requests only when they name no other host.
    (uri.scheme() == base.scheme() && uri.authority() == base.authority())
        .then(|| uri.path_and_query().map(ToString::to_string))
        .flatten()
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}
