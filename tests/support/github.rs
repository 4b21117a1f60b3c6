//! A GitHub API fake on loopback, serving the endpoints gitcanary uses with
//! JSON shaped like GitHub's own responses, and recording every request.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::{get, patch, post, put};
use serde_json::{Value, json};

#[derive(Default)]
pub struct Data {
    /// Commit sha -> pull request numbers.
    pub pulls: BTreeMap<String, Vec<u64>>,
    /// Every comment: (pull, id, user, body).
    pub comments: Vec<(u64, u64, String, String)>,
    /// Every status posted: (sha, state, context, description).
    pub statuses: Vec<(String, String, String, String)>,
    /// User -> permission ("admin", "write", "read", ...).
    pub permissions: BTreeMap<String, String>,
    /// (method, path) of every request.
    pub requests: Vec<(String, String)>,
    /// Pull requests opened through the API.
    pub pull_requests: Vec<FakePull>,
    /// The tracked branch's protection, as GitHub applies it to a merge.
    pub protection: Protection,
    /// The next this many requests are refused as rate limited.
    pub rate_limited: usize,
    /// Requests whose path holds this text are answered 502, this many times.
    pub failing: Option<(String, usize)>,
    /// GitHub's rate limit, when set: every answer says what is left, each
    /// counted request (not a 304) spends one, and none is served once spent.
    pub quota: Option<Quota>,
    /// Conditional requests answered 304 Not Modified (GitHub counts none
    /// of them against the rate limit).
    pub not_modified: usize,
    /// (method, path) of each request answered 304.
    pub free: Vec<(String, String)>,
    /// The repository pull requests merge into.
    pub bare: Option<PathBuf>,
    /// API token -> user; any other token acts as `gitcanary[bot]`.
    pub tokens: BTreeMap<String, String>,
    /// Pull request carrying a commit -> its author (default `carol`).
    pub authors: BTreeMap<u64, String>,
    /// Commit email -> the GitHub login it belongs to (others are unlinked).
    pub logins: BTreeMap<String, String>,
    /// User -> a custom role name (`role_name`) besides its base permission.
    pub roles: BTreeMap<String, String>,
    /// Comment id -> when it was written.
    pub comment_times: BTreeMap<u64, String>,
    /// The GitHub App installed on the repository's account, if one is.
    pub app: Option<FakeApp>,
    /// Installation tokens minted -> when each expires (epoch seconds).
    pub installation_tokens: BTreeMap<String, u64>,
    /// Requests refused for their credentials (401).
    pub bad_credentials: usize,
    /// GitHub's secondary rate limit, when set: a burst past it is refused.
    pub secondary: Option<SecondaryLimit>,
    /// The repository webhook events are delivered to, if one is set.
    pub webhook: Option<Webhook>,
    next_id: u64,
}

/// A repository webhook: GitHub's events, signed with its secret, posted
/// one at a time in the order they happened, by a thread of their own.
pub struct Webhook {
    queue: std::sync::mpsc::Sender<(String, Vec<u8>)>,
    /// Deliveries the receiver answered with a 2xx.
    pub delivered: Arc<std::sync::atomic::AtomicUsize>,
}

/// A secondary rate limit: more than `max` requests within `per` are
/// refused with `status` (403 or 429) and `Retry-After`, whatever the quota.
#[derive(Clone, Debug)]
pub struct SecondaryLimit {
    pub max: usize,
    pub per: Duration,
    pub status: StatusCode,
    pub retry_after: u64,
    pub recent: std::collections::VecDeque<std::time::Instant>,
}

/// The answer to a request past the secondary limit, if it is one.
fn past_secondary_limit(limit: &mut SecondaryLimit) -> Option<axum::response::Response> {
    let now = std::time::Instant::now();
    while limit
        .recent
        .front()
        .is_some_and(|at| now.duration_since(*at) > limit.per)
    {
        limit.recent.pop_front();
    }
    if limit.recent.len() >= limit.max {
        let message = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.";
        return Some(
            (
                limit.status,
                [("retry-after", limit.retry_after.to_string())],
                Json(json!({"message": message, "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"})),
            )
                .into_response(),
        );
    }
    limit.recent.push_back(now);
    None
}

/// The repository the fake plays.
const OWNER: &str = "acme";
const REPO: &str = "apps";

fn repository_json() -> Value {
    json!({"full_name": format!("{OWNER}/{REPO}"), "name": REPO, "owner": user(OWNER), "default_branch": "main"})
}

/// Queues event `event` with `payload` for the webhook, if one is set.
fn emit(data: &Data, event: &str, mut payload: Value) {
    let Some(webhook) = &data.webhook else { return };
    payload["repository"] = repository_json();
    let _ = webhook
        .queue
        .send((event.to_string(), serde_json::to_vec(&payload).expect("JSON")));
}

fn comment_event(action: &str, pull: u64, id: u64, login: &str, body: &str, at: &str) -> Value {
    json!({"action": action,
        "issue": {"number": pull, "pull_request": {"url": format!("https://api.github.example.test/repos/{OWNER}/{REPO}/pulls/{pull}")}},
        "comment": comment_json(OWNER, REPO, pull, id, login, body, at), "sender": user(login)})
}

fn review_event(data: &Data, pull: &FakePull, id: u64, reviewer: &str, state: &str, commit: &str) -> Value {
    json!({"action": "submitted",
        "review": {"id": id, "user": user(reviewer), "state": state.to_lowercase(), "commit_id": commit},
        "pull_request": pull_json(OWNER, REPO, pull, data), "sender": user(reviewer)})
}

fn pull_event(data: &Data, action: &str, pull: &FakePull, sender: &str) -> Value {
    json!({"action": action, "number": pull.number, "pull_request": pull_json(OWNER, REPO, pull, data), "sender": user(sender)})
}

/// Posts each queued event to `url`, as GitHub's deliveries are made.
fn deliver(
    url: &str,
    secret: &str,
    queue: std::sync::mpsc::Receiver<(String, Vec<u8>)>,
    delivered: Arc<std::sync::atomic::AtomicUsize>,
) {
    use hmac::Mac;
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http:// webhook URL");
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let address: std::net::SocketAddr = host.parse().expect("a HOST:PORT address");
    static DELIVERIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for (event, body) in queue {
        let number = DELIVERIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("any key");
        mac.update(&body);
        let signature = hex::encode(mac.finalize().into_bytes());
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: GitHub-Hookshot/fake\r\nContent-Type: application/json\r\n\
             X-GitHub-Event: {event}\r\nX-GitHub-Delivery: fake-{}-{number}\r\nX-Hub-Signature-256: sha256={signature}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            std::process::id(),
            body.len()
        );
        let sent = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5)).and_then(|mut stream| {
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            stream.write_all(head.as_bytes())?;
            stream.write_all(&body)?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            Ok(answer)
        });
        if sent.is_ok_and(|answer| answer.starts_with("HTTP/1.1 2")) {
            delivered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Branch protection of the branch pull requests merge into.
#[derive(Clone, Debug, Default)]
pub struct Protection {
    /// Approving reviews a merge needs: the latest review of each reviewer
    /// with write access counts, a later "changes requested" undoes it.
    pub required_approvals: usize,
    /// Approvals given on an earlier head commit no longer count.
    pub dismiss_stale_reviews: bool,
    /// A code owner (CODEOWNERS on the base branch) of every changed path
    /// must approve.
    pub require_code_owner_reviews: bool,
    /// Commit status contexts that must be `success` on the head commit.
    pub required_checks: Vec<String>,
    /// Admins are held to the rules too; otherwise an admin's merge bypasses them.
    pub enforce_admins: bool,
}

/// A GitHub App as GitHub knows it: requests signed with its key (a JWT)
/// act as the App; its installation's tokens act as `slug[bot]`.
#[derive(Clone, Debug)]
pub struct FakeApp {
    pub id: u64,
    pub slug: String,
    /// The App's public key (PEM), which its JWTs must verify against.
    pub public_pem: Vec<u8>,
    pub installation: u64,
    /// How long a minted installation token lasts (GitHub: an hour).
    pub token_lifetime: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct Quota {
    pub limit: usize,
    pub remaining: usize,
    /// When the window resets, epoch seconds.
    pub reset: u64,
}

impl Quota {
    fn headers(&self) -> [(&'static str, String); 5] {
        [
            ("x-ratelimit-limit", self.limit.to_string()),
            ("x-ratelimit-remaining", self.remaining.to_string()),
            ("x-ratelimit-reset", self.reset.to_string()),
            ("x-ratelimit-used", (self.limit - self.remaining).to_string()),
            ("x-ratelimit-resource", "core".to_string()),
        ]
    }
}

fn epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

#[derive(Clone, Debug)]
pub struct FakePull {
    pub number: u64,
    pub head: String,
    pub base: String,
    pub title: String,
    pub body: String,
    pub open: bool,
    pub merged_by: Option<String>,
    pub merge_commit: Option<String>,
    /// (id, user, state, the head commit it was given on) in the order submitted.
    pub reviews: Vec<(u64, String, String, String)>,
    /// Who opened it.
    pub author: String,
    /// Who closed it, when it is closed.
    pub closed_by: Option<String>,
    /// The owner of the repository its head branch is in (a fork's, or this one's).
    pub head_owner: String,
    /// The name of that repository when it is not this one's (a fork
    /// within the same organization); empty for this repository's name.
    pub head_repo: String,
}

#[derive(Clone)]
pub struct GitHubFake {
    pub url: String,
    pub data: Arc<Mutex<Data>>,
}

type Shared = Arc<Mutex<Data>>;

fn user(login: &str) -> Value {
    json!({"login": login, "id": login.len() as u64 * 1000 + 7, "node_id": "MDQ6VXNlcjE=", "type": if login.ends_with("[bot]") { "Bot" } else { "User" }, "site_admin": false,
           "avatar_url": format!("https://avatars.example.test/{login}"), "html_url": format!("https://github.example.test/{login}"),
           "url": format!("https://api.github.example.test/users/{login}")})
}

/// Now, as GitHub writes times.
fn now() -> String {
    // Whole seconds, cut (not rounded) as GitHub writes them.
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

fn comment_json(owner: &str, repo: &str, pull: u64, id: u64, login: &str, body: &str, at: &str) -> Value {
    json!({
        "id": id, "node_id": "IC_kwDOA", "body": body, "user": user(login),
        "url": format!("https://api.github.example.test/repos/{owner}/{repo}/issues/comments/{id}"),
        "html_url": format!("https://github.example.test/{owner}/{repo}/pull/{pull}#issuecomment-{id}"),
        "issue_url": format!("https://api.github.example.test/repos/{owner}/{repo}/issues/{pull}"),
        "created_at": at, "updated_at": at,
        "author_association": "CONTRIBUTOR"
    })
}

impl GitHubFake {
    pub async fn start() -> GitHubFake {
        let data: Shared = Arc::new(Mutex::new(Data {
            next_id: 1000,
            // The test repositories' commits are carol's, as the pull
            // requests that carry them are by default.
            // Merges are committed as GitHub's own account.
            logins: BTreeMap::from([
                ("author@example.test".to_string(), "carol".to_string()),
                ("noreply@github.example.test".to_string(), "web-flow".to_string()),
            ]),
            ..Data::default()
        }));
        let app = Router::new()
            .route("/repos/{owner}/{repo}/commits/{sha}/pulls", get(pulls_for_commit))
            .route(
                "/repos/{owner}/{repo}/issues/{pull}/comments",
                get(list_comments).post(create_comment),
            )
            .route("/repos/{owner}/{repo}/issues/comments/{id}", patch(edit_comment))
            .route("/repos/{owner}/{repo}/statuses/{sha}", post(create_status))
            .route("/repos/{owner}/{repo}/collaborators/{user}/permission", get(permission))
            .route("/repos/{owner}/{repo}/pulls", get(list_pulls).post(create_pull))
            .route("/repos/{owner}/{repo}/pulls/{pull}", get(get_pull).patch(edit_pull))
            .route(
                "/repos/{owner}/{repo}/pulls/{pull}/reviews",
                get(list_reviews).post(create_review),
            )
            .route("/repos/{owner}/{repo}/commits/{sha}/statuses", get(list_statuses))
            .route("/repos/{owner}/{repo}/pulls/{pull}/merge", put(merge_pull))
            .route("/repos/{owner}/{repo}/pulls/{pull}/files", get(list_files))
            .route("/repos/{owner}/{repo}/issues/{pull}", get(get_issue))
            .route("/repos/{owner}/{repo}/git/ref/heads/{*branch}", get(get_branch_ref))
            .route("/repos/{owner}/{repo}/compare/{range}", get(compare))
            .route("/repos/{owner}/{repo}/commits/{sha}", get(get_commit))
            .route("/user", get(authenticated_user))
            .route("/app", get(get_app))
            .route("/repos/{owner}/{repo}/installation", get(repo_installation))
            .route("/app/installations/{id}/access_tokens", post(mint_installation_token))
            .layer(axum::middleware::from_fn_with_state(data.clone(), record))
            .with_state(data.clone());
        let addr = super::serve_on_own_thread(app, "GitHub fake");
        GitHubFake {
            url: format!("http://{addr}"),
            data,
        }
    }

    /// A fake whose pull requests merge into `bare` for real.
    pub async fn start_for(bare: &std::path::Path) -> GitHubFake {
        let fake = GitHubFake::start().await;
        fake.data.lock().expect("lock").bare = Some(bare.to_path_buf());
        fake
    }

    pub fn pulls(&self) -> Vec<FakePull> {
        self.data.lock().expect("lock").pull_requests.clone()
    }

    /// A review as if `user` submitted it ("APPROVED", "CHANGES_REQUESTED", "COMMENTED").
    pub fn review(&self, pull: u64, user: &str, state: &str) {
        let mut data = self.data.lock().expect("lock");
        data.next_id += 1;
        let id = data.next_id;
        let head = data
            .pull_requests
            .iter()
            .find(|p| p.number == pull)
            .map(|p| p.head.clone())
            .expect("the pull request exists");
        let commit = branch_sha(&data, &head).unwrap_or_default();
        let pull = data
            .pull_requests
            .iter_mut()
            .find(|p| p.number == pull)
            .expect("the pull request exists");
        pull.reviews
            .push((id, user.to_string(), state.to_string(), commit.clone()));
        let pull = pull.clone();
        emit(
            &data,
            "pull_request_review",
            review_event(&data, &pull, id, user, state, &commit),
        );
    }

    /// A pull request as if `author` opened it from `head_owner`'s `head`.
    pub fn open_pull_as(&self, author: &str, head_owner: &str, head: &str, base: &str, title: &str) -> u64 {
        let mut data = self.data.lock().expect("lock");
        data.next_id += 1;
        let number = data.next_id;
        data.pull_requests.push(FakePull {
            title: title.into(),
            author: author.into(),
            head_owner: head_owner.into(),
            ..GitHubFake::blank_pull(number, head, base)
        });
        number
    }

    /// A pull request from a fork within the same organization: the
    /// repository `head_owner/head_repo`, whose `head` GitHub's `head=`
    /// filter (owner and branch only) cannot tell from this repository's.
    pub fn open_pull_from_fork(&self, author: &str, head_owner: &str, head_repo: &str, head: &str, base: &str) -> u64 {
        let number = self.open_pull_as(
            author,
            head_owner,
            head,
            base,
            "Promote, from a fork in the organization",
        );
        let mut data = self.data.lock().expect("lock");
        if let Some(pull) = data.pull_requests.iter_mut().find(|p| p.number == number) {
            pull.head_repo = head_repo.into();
        }
        number
    }

    /// An open pull request from `head` into `base` with nothing else said.
    pub fn blank_pull(number: u64, head: &str, base: &str) -> FakePull {
        FakePull {
            number,
            head: head.into(),
            base: base.into(),
            title: String::new(),
            body: String::new(),
            open: true,
            merged_by: None,
            merge_commit: None,
            reviews: Vec::new(),
            author: "carol".into(),
            closed_by: None,
            head_owner: "acme".into(),
            head_repo: String::new(),
        }
    }

    /// Closes a pull request unmerged, as `user` would in the web UI.
    pub fn close_as(&self, pull: u64, user: &str) {
        let mut data = self.data.lock().expect("lock");
        let pull = data
            .pull_requests
            .iter_mut()
            .find(|p| p.number == pull)
            .expect("the pull request exists");
        pull.open = false;
        pull.closed_by = Some(user.to_string());
        let pull = pull.clone();
        emit(&data, "pull_request", pull_event(&data, "closed", &pull, user));
    }

    /// Merges a pull request as `user` would with the merge button.
    /// `user` merges `pull` (GitHub's button): refused as GitHub would.
    pub fn merge_as(&self, pull: u64, user: &str) -> String {
        self.try_merge_as(pull, user).expect("the merge succeeds")
    }

    pub fn try_merge_as(&self, pull: u64, user: &str) -> Result<String, String> {
        merge_checked(&self.data, pull, user, None).map_err(|(status, message)| format!("{status}: {message}"))
    }

    /// A commit status, as CI would post it.
    pub fn post_status(&self, sha: &str, context: &str, state: &str) {
        self.data.lock().expect("lock").statuses.push((
            sha.to_string(),
            state.to_string(),
            context.to_string(),
            String::new(),
        ));
    }

    /// Sets the tracked branch's protection.
    pub fn protect(&self, protection: Protection) {
        self.data.lock().expect("lock").protection = protection;
    }

    /// A rate-limit window of `limit` requests, `remaining` of them left,
    /// resetting in an hour.
    pub fn set_quota(&self, limit: usize, remaining: usize) {
        self.data.lock().expect("lock").quota = Some(Quota {
            limit,
            remaining,
            reset: epoch() + 3600,
        });
    }

    pub fn quota(&self) -> Option<Quota> {
        self.data.lock().expect("lock").quota
    }

    /// More than `max` requests within `per` are refused with `status` and
    /// `Retry-After: retry_after`, as GitHub's secondary limits are.
    pub fn secondary_limit(&self, max: usize, per: Duration, status: u16, retry_after: u64) {
        self.data.lock().expect("lock").secondary = Some(SecondaryLimit {
            max,
            per,
            status: StatusCode::from_u16(status).expect("a status"),
            retry_after,
            recent: Default::default(),
        });
    }

    /// The next `times` requests whose path holds `path_part` fail with 502,
    /// as GitHub's front end answers now and then.
    pub fn fail_next(&self, path_part: &str, times: usize) {
        self.data.lock().expect("lock").failing = Some((path_part.to_string(), times));
    }

    pub fn rate_limit_next(&self, requests: usize) {
        self.data.lock().expect("lock").rate_limited = requests;
    }

    pub fn carry(&self, sha: &str, pull: u64) {
        self.carry_by(sha, pull, "carol");
    }

    /// `author`'s pull request `pull` carried the commit `sha`.
    pub fn carry_by(&self, sha: &str, pull: u64, author: &str) {
        let mut data = self.data.lock().expect("lock");
        data.pulls.entry(sha.to_string()).or_default().push(pull);
        data.authors.insert(pull, author.to_string());
    }

    /// Delivers GitHub's events from now on to `url` (a repository webhook
    /// signed with `secret`): `issue_comment`, `pull_request_review`,
    /// `pull_request` and `push` (a merge).
    pub fn deliver_to(&self, url: &str, secret: &str) {
        let (queue, events) = std::sync::mpsc::channel();
        let delivered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (url, secret, count) = (url.to_string(), secret.to_string(), delivered.clone());
        std::thread::spawn(move || deliver(&url, &secret, events, count));
        self.data.lock().expect("lock").webhook = Some(Webhook { queue, delivered });
    }

    /// Webhook deliveries answered with a 2xx.
    pub fn delivered(&self) -> usize {
        let data = self.data.lock().expect("lock");
        data.webhook
            .as_ref()
            .map_or(0, |w| w.delivered.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Installs a GitHub App on the repository's account.
    pub fn install_app(&self, app: FakeApp) {
        self.data.lock().expect("lock").app = Some(app);
    }

    /// Installation tokens minted so far.
    pub fn installation_tokens(&self) -> usize {
        self.data.lock().expect("lock").installation_tokens.len()
    }

    /// Requests refused for their credentials.
    pub fn bad_credentials(&self) -> usize {
        self.data.lock().expect("lock").bad_credentials
    }

    /// Requests with `token` act as `user` (for people using the API, as the demo does).
    pub fn token(&self, token: &str, user: &str) {
        self.data
            .lock()
            .expect("lock")
            .tokens
            .insert(token.to_string(), user.to_string());
    }

    /// Commits whose author or committer email is `email` belong to `login`.
    pub fn link_email(&self, email: &str, login: &str) {
        self.data
            .lock()
            .expect("lock")
            .logins
            .insert(email.to_string(), login.to_string());
    }

    /// A custom repository role: `role_name` is `role`, the base level `permission`.
    pub fn grant_role(&self, user: &str, permission: &str, role: &str) {
        let mut data = self.data.lock().expect("lock");
        data.permissions.insert(user.to_string(), permission.to_string());
        data.roles.insert(user.to_string(), role.to_string());
    }

    pub fn grant(&self, user: &str, permission: &str) {
        self.data
            .lock()
            .expect("lock")
            .permissions
            .insert(user.to_string(), permission.to_string());
    }

    /// A comment as if `user` wrote it on the pull request.
    pub fn comment(&self, pull: u64, user: &str, body: &str) -> u64 {
        self.comment_at(pull, user, body, &now())
    }

    /// A comment as if `user` wrote it at `at` (RFC 3339, whole seconds).
    pub fn comment_at(&self, pull: u64, user: &str, body: &str, at: &str) -> u64 {
        let mut data = self.data.lock().expect("lock");
        data.next_id += 1;
        let id = data.next_id;
        data.comments.push((pull, id, user.to_string(), body.to_string()));
        data.comment_times.insert(id, at.to_string());
        emit(
            &data,
            "issue_comment",
            comment_event("created", pull, id, user, body, at),
        );
        id
    }

    pub fn comments_on(&self, pull: u64) -> Vec<(u64, String, String)> {
        let data = self.data.lock().expect("lock");
        data.comments
            .iter()
            .filter(|c| c.0 == pull)
            .map(|c| (c.1, c.2.clone(), c.3.clone()))
            .collect()
    }

    pub fn statuses_for(&self, sha: &str) -> Vec<(String, String, String)> {
        let data = self.data.lock().expect("lock");
        data.statuses
            .iter()
            .filter(|s| s.0 == sha)
            .map(|s| (s.1.clone(), s.2.clone(), s.3.clone()))
            .collect()
    }

    /// The requests GitHub would count against the rate limit: every one
    /// but the 304s.
    pub fn counted(&self) -> usize {
        let data = self.data.lock().expect("lock");
        data.requests.len() - data.not_modified
    }

    /// Conditional requests answered 304 Not Modified.
    pub fn not_modified(&self) -> usize {
        self.data.lock().expect("lock").not_modified
    }

    pub fn count(&self, method: &str, path_part: &str) -> usize {
        let data = self.data.lock().expect("lock");
        data.requests
            .iter()
            .filter(|(m, p)| m == method && p.contains(path_part))
            .count()
    }
}

async fn record(
    State(data): State<Shared>,
    method: Method,
    uri: Uri,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let signed_as_app = is_app_endpoint(uri.path());
    {
        let mut data = data.lock().expect("lock");
        data.requests.push((method.to_string(), uri.path().to_string()));
        if let Err(refusal) = credentials_check(&data, uri.path(), request.headers()) {
            data.bad_credentials += 1;
            return *refusal;
        }
        if let Some(refusal) = data.secondary.as_mut().and_then(past_secondary_limit) {
            return refusal;
        }
        if let Some((part, left)) = data.failing.as_mut()
            && *left > 0
            && uri.path().contains(part.as_str())
        {
            *left -= 1;
            return (StatusCode::BAD_GATEWAY, Json(json!({"message": "Server Error"}))).into_response();
        }
        let spent = data.quota.filter(|q| q.remaining == 0 && !signed_as_app);
        if (data.rate_limited > 0 && !signed_as_app) || spent.is_some() {
            data.rate_limited = data.rate_limited.saturating_sub(1);
            let quota = spent.unwrap_or(Quota {
                limit: 5000,
                remaining: 0,
                reset: epoch() + 3,
            });
            // GitHub's primary rate limit answer.
            return (
                StatusCode::FORBIDDEN,
                quota.headers(),
                Json(json!({"message": "API rate limit exceeded for user ID 1007.",
                    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"})),
            )
                .into_response();
        }
    }
    if signed_as_app {
        // Signed as the App: not the installation's rate limit.
        return next.run(request).await;
    }
    let if_none_match = request.headers().get("if-none-match").cloned();
    let answer = with_quota(&data, next.run(request).await);
    if method != Method::GET || !answer.status().is_success() {
        return answer;
    }
    // An ETag of every answer, as GitHub gives, and a free 304 to a request
    // that names the current one.
    let (parts, body) = answer.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    let etag = format!("\"{:016x}\"", fnv(&bytes));
    if if_none_match.is_some_and(|v| v.as_bytes() == etag.as_bytes()) {
        let mut data = data.lock().expect("lock");
        data.not_modified += 1;
        data.free.push((method.to_string(), uri.path().to_string()));
        // Free: the request spent none of the quota after all.
        let mut free = (StatusCode::NOT_MODIFIED, [("etag", etag)]).into_response();
        if let Some(quota) = data.quota.as_mut() {
            quota.remaining = (quota.remaining + 1).min(quota.limit);
            for (name, value) in quota.headers() {
                free.headers_mut().insert(name, value.parse().expect("a header"));
            }
        }
        return free;
    }
    let mut answer = axum::response::Response::from_parts(parts, axum::body::Body::from(bytes));
    answer.headers_mut().insert("etag", etag.parse().expect("an ETag"));
    answer
}

/// One request spent of the quota, if one is set, and what is left said
/// on the answer as GitHub says it.
fn with_quota(data: &Shared, mut answer: axum::response::Response) -> axum::response::Response {
    let mut data = data.lock().expect("lock");
    if let Some(quota) = data.quota.as_mut() {
        quota.remaining = quota.remaining.saturating_sub(1);
        for (name, value) in quota.headers() {
            answer.headers_mut().insert(name, value.parse().expect("a header"));
        }
    }
    answer
}

/// FNV-1a: an ETag that changes when the answer does.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The user a request acts as, from its token.
fn caller(data: &Data, headers: &axum::http::HeaderMap) -> String {
    let token = bearer(headers);
    if data.installation_tokens.contains_key(token)
        && let Some(app) = &data.app
    {
        return format!("{}[bot]", app.slug);
    }
    data.tokens
        .get(token)
        .cloned()
        .unwrap_or_else(|| "gitcanary[bot]".to_string())
}

fn bearer(headers: &axum::http::HeaderMap) -> &str {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_whitespace().nth(1))
        .unwrap_or_default()
}

fn is_app_endpoint(path: &str) -> bool {
    path == "/app" || path.starts_with("/app/") || path.ends_with("/installation")
}

/// GitHub's rules for an App's credentials: the App's endpoints take only
/// a JWT signed with its key, issued by it, at most ten minutes long and
/// not expired; a JWT opens nothing else; an installation token works until
/// it expires; and an installation is not a user (`/user`).
fn credentials_check(
    data: &Data,
    path: &str,
    headers: &axum::http::HeaderMap,
) -> Result<(), Box<axum::response::Response>> {
    let refuse = |status: StatusCode, message: &str| {
        let body = Json(json!({"message": message, "documentation_url": "https://docs.github.com/rest"}));
        Err(Box::new((status, body).into_response()))
    };
    let token = bearer(headers);
    let is_jwt = token.split('.').count() == 3;
    if is_app_endpoint(path) {
        let Some(app) = &data.app else {
            return refuse(StatusCode::NOT_FOUND, "Not Found");
        };
        return match verify_app_jwt(app, token) {
            Ok(()) => Ok(()),
            Err(why) => refuse(StatusCode::UNAUTHORIZED, &why),
        };
    }
    if is_jwt {
        return refuse(StatusCode::UNAUTHORIZED, "Bad credentials");
    }
    if token.is_empty() {
        return refuse(StatusCode::UNAUTHORIZED, "Requires authentication");
    }
    if let Some(expires) = data.installation_tokens.get(token) {
        if *expires <= epoch() {
            return refuse(StatusCode::UNAUTHORIZED, "Bad credentials");
        }
        if path == "/user" {
            return refuse(StatusCode::FORBIDDEN, "Resource not accessible by integration");
        }
    } else if token.starts_with("ghs_") {
        return refuse(StatusCode::UNAUTHORIZED, "Bad credentials");
    }
    Ok(())
}

fn verify_app_jwt(app: &FakeApp, token: &str) -> Result<(), String> {
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(&app.public_pem).map_err(|e| e.to_string())?;
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    // `iss` is the App id as a number, which the crate does not see as a claim: checked below.
    validation.set_required_spec_claims(&["exp", "iat"]);
    validation.leeway = 0;
    let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
        .map_err(|e| format!("A JSON web token could not be decoded ({e})"))?
        .claims;
    let issuer = claims["iss"].as_u64().or_else(|| claims["iss"].as_str()?.parse().ok());
    if issuer != Some(app.id) {
        return Err("'Issuer' claim ('iss') must be the App's id".into());
    }
    let (iat, exp) = (claims["iat"].as_u64().unwrap_or(0), claims["exp"].as_u64().unwrap_or(0));
    if iat > epoch() {
        return Err("'Issued at' claim ('iat') must be an Integer representing a time in the past".into());
    }
    if exp > epoch() + 600 {
        return Err("'Expiration time' claim ('exp') is too far in the future".into());
    }
    Ok(())
}

/// `GET /app`: the App the JWT is of.
async fn get_app(State(data): State<Shared>) -> Json<Value> {
    let data = data.lock().expect("lock");
    let app = data.app.as_ref().expect("checked by credentials_check");
    Json(
        json!({"id": app.id, "slug": app.slug, "name": app.slug, "owner": user("acme"),
        "permissions": {"pull_requests": "write", "statuses": "write", "contents": "write", "issues": "write"}}),
    )
}

/// `GET /repos/{owner}/{repo}/installation`: the App's installation there.
async fn repo_installation(State(data): State<Shared>) -> Json<Value> {
    let data = data.lock().expect("lock");
    let app = data.app.as_ref().expect("checked by credentials_check");
    Json(json!({"id": app.installation, "app_id": app.id, "app_slug": app.slug,
        "account": user("acme"), "target_type": "Organization"}))
}

/// `POST /app/installations/{id}/access_tokens`: a new installation token.
async fn mint_installation_token(State(data): State<Shared>, Path(id): Path<u64>) -> axum::response::Response {
    let mut data = data.lock().expect("lock");
    let app = data.app.clone().expect("checked by credentials_check");
    if id != app.installation {
        return (StatusCode::NOT_FOUND, Json(json!({"message": "Not Found"}))).into_response();
    }
    let token = format!("ghs_{:036}", data.installation_tokens.len() + 1);
    let expires = epoch() + app.token_lifetime;
    data.installation_tokens.insert(token.clone(), expires);
    let expires_at = jiff::Timestamp::from_second(expires as i64)
        .expect("a time")
        .to_string();
    (
        StatusCode::CREATED,
        Json(json!({"token": token, "expires_at": expires_at,
        "permissions": {"pull_requests": "write", "statuses": "write"}, "repository_selection": "all"})),
    )
        .into_response()
}

fn unprocessable(message: &str) -> axum::response::Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(json!({"message": "Validation Failed", "errors": [{"resource": "PullRequest", "code": "custom", "message": message}],
            "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request", "status": "422"})),
    )
        .into_response()
}

fn git_in(dir: &std::path::Path, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).to_string())
    }
}

fn branch_sha(data: &Data, branch: &str) -> Option<String> {
    git_in(
        data.bare.as_ref()?,
        &["rev-parse", "--verify", "-q", &format!("refs/heads/{branch}")],
    )
    .ok()
}

fn pull_json(owner: &str, repo: &str, pull: &FakePull, data: &Data) -> Value {
    let head_sha = branch_sha(data, &pull.head).unwrap_or_default();
    let head_repo = if pull.head_repo.is_empty() {
        repo
    } else {
        &pull.head_repo
    };
    let base_sha = branch_sha(data, &pull.base).unwrap_or_default();
    let n = pull.number;
    json!({
        "url": format!("https://api.github.example.test/repos/{owner}/{repo}/pulls/{n}"),
        "id": 9000 + n, "node_id": "PR_kwDOA", "number": n,
        "html_url": format!("https://github.example.test/{owner}/{repo}/pull/{n}"),
        "state": if pull.open { "open" } else { "closed" }, "locked": false, "draft": false,
        "title": pull.title, "body": pull.body, "user": user(&pull.author),
        "created_at": "2026-11-30T12:00:00Z", "updated_at": "2026-11-30T12:00:00Z",
        "closed_at": if pull.open { Value::Null } else { json!("2026-11-30T12:30:00Z") },
        "merged_at": if pull.merged_by.is_some() { json!("2026-11-30T12:30:00Z") } else { Value::Null },
        "merge_commit_sha": pull.merge_commit,
        "merged": pull.merged_by.is_some(),
        "merged_by": pull.merged_by.as_deref().map(user),
        "head": {"label": format!("{}:{}", pull.head_owner, pull.head), "ref": pull.head, "sha": head_sha, "user": user(&pull.head_owner),
            "repo": {"full_name": format!("{}/{head_repo}", pull.head_owner), "name": head_repo, "owner": user(&pull.head_owner)}},
        "base": {"label": format!("{owner}:{}", pull.base), "ref": pull.base, "sha": base_sha, "user": user(owner),
            "repo": {"full_name": format!("{owner}/{repo}"), "name": repo, "owner": user(owner)}},
        "author_association": "NONE"
    })
}

async fn list_pulls(
    State(data): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    uri: Uri,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let data = data.lock().expect("lock");
    let state = query.get("state").map_or("open", String::as_str);
    // GitHub's `head` filter is `user:ref`: the owner of the head's repository and the branch.
    let head = query
        .get("head")
        .map(|h| h.split_once(':').unwrap_or((owner.as_str(), h.as_str())));
    let pulls: Vec<Value> = data
        .pull_requests
        .iter()
        .rev()
        .filter(|p| state == "all" || (state == "open") == p.open)
        .filter(|p| head.is_none_or(|(user, branch)| user == p.head_owner && branch == p.head))
        .filter(|p| query.get("base").is_none_or(|b| *b == p.base))
        .map(|p| {
            // GitHub lists a pull request without who merged it (nor `merged`):
            // only `GET pulls/{n}` says.
            let mut listed = pull_json(&owner, &repo, p, &data);
            if let Some(fields) = listed.as_object_mut() {
                fields.remove("merged_by");
                fields.remove("merged");
            }
            listed
        })
        .collect();
    paginate(pulls, &query, &uri, &headers)
}

/// One page of a list as GitHub serves it: `per_page` (default 30, at most
/// 100) items of page `page`, and a `Link` header with the next and last pages.
fn paginate(
    items: Vec<Value>,
    query: &BTreeMap<String, String>,
    uri: &Uri,
    headers: &axum::http::HeaderMap,
) -> axum::response::Response {
    let per_page = query
        .get("per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(30usize)
        .clamp(1, 100);
    let page = query.get("page").and_then(|v| v.parse().ok()).unwrap_or(1usize).max(1);
    let last = items.len().div_ceil(per_page).max(1);
    let shown: Vec<Value> = items.into_iter().skip((page - 1) * per_page).take(per_page).collect();
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    let link_to = |n: usize| {
        let mut params: Vec<String> = query
            .iter()
            .filter(|(k, _)| k.as_str() != "page")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        params.push(format!("page={n}"));
        format!("<http://{host}{}?{}>", uri.path(), params.join("&"))
    };
    let mut links = Vec::new();
    if page < last {
        links.push(format!("{}; rel=\"next\"", link_to(page + 1)));
        links.push(format!("{}; rel=\"last\"", link_to(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"first\"", link_to(1)));
        links.push(format!("{}; rel=\"prev\"", link_to(page - 1)));
    }
    let mut response = Json(Value::Array(shown)).into_response();
    if !links.is_empty() {
        response
            .headers_mut()
            .insert("link", links.join(", ").parse().expect("a header value"));
    }
    response
}

async fn create_pull(
    State(data): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> axum::response::Response {
    let mut data = data.lock().expect("lock");
    let field = |k: &str| body[k].as_str().unwrap_or_default().to_string();
    let (head, base) = (field("head"), field("base"));
    if branch_sha(&data, &head).is_none() {
        return unprocessable(&format!("head {head} does not exist"));
    }
    if data
        .pull_requests
        .iter()
        .any(|p| p.open && p.head == head && p.base == base && p.head_owner == owner && p.head_repo.is_empty())
    {
        return unprocessable(&format!("A pull request already exists for {owner}:{head}."));
    }
    data.next_id += 1;
    let pull = FakePull {
        number: data.next_id,
        head,
        base,
        title: field("title"),
        body: field("body"),
        open: true,
        merged_by: None,
        merge_commit: None,
        reviews: Vec::new(),
        author: caller(&data, &headers),
        closed_by: None,
        head_owner: owner.clone(),
        head_repo: String::new(),
    };
    let answer = pull_json(&owner, &repo, &pull, &data);
    emit(&data, "pull_request", pull_event(&data, "opened", &pull, &pull.author));
    data.pull_requests.push(pull);
    (StatusCode::CREATED, Json(answer)).into_response()
}

async fn get_pull(
    State(data): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, u64)>,
) -> Result<Json<Value>, StatusCode> {
    let data = data.lock().expect("lock");
    let pull = data
        .pull_requests
        .iter()
        .find(|p| p.number == number)
        .ok_or(StatusCode::NOT_FOUND)?;
    Ok(Json(pull_json(&owner, &repo, pull, &data)))
}

async fn edit_pull(
    State(data): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, u64)>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Result<Json<Value>, StatusCode> {
    let mut data = data.lock().expect("lock");
    let editor = caller(&data, &headers);
    // The author, and triage access or more, may close and reopen.
    let may_close = matches!(
        data.permissions.get(&editor).map(String::as_str),
        Some("triage" | "write" | "maintain" | "admin")
    );
    let pull = data
        .pull_requests
        .iter_mut()
        .find(|p| p.number == number)
        .ok_or(StatusCode::NOT_FOUND)?;
    if body["state"].is_string() && !(may_close || pull.author == editor) {
        return Err(StatusCode::FORBIDDEN);
    }
    match body["state"].as_str() {
        Some("closed") if pull.merged_by.is_none() => {
            pull.open = false;
            pull.closed_by = Some(editor.clone());
        }
        Some("open") if pull.merged_by.is_none() => {
            pull.open = true;
            pull.closed_by = None;
        }
        _ => {}
    }
    let pull = pull.clone();
    if let Some(state) = body["state"].as_str() {
        let action = if state == "closed" { "closed" } else { "reopened" };
        emit(&data, "pull_request", pull_event(&data, action, &pull, &editor));
    }
    Ok(Json(pull_json(&owner, &repo, &pull, &data)))
}

async fn list_reviews(
    State(data): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
    uri: Uri,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let data = data.lock().expect("lock");
    let Some(pull) = data.pull_requests.iter().find(|p| p.number == number) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let reviews: Vec<Value> = pull
        .reviews
        .iter()
        .map(|(id, login, state, commit)| {
            json!({"id": id, "node_id": "PRR_kwDOA", "user": user(login), "body": "", "state": state,
                "html_url": format!("https://github.example.test/{owner}/{repo}/pull/{number}#pullrequestreview-{id}"),
                "pull_request_url": format!("https://api.github.example.test/repos/{owner}/{repo}/pulls/{number}"),
                "submitted_at": "2026-11-30T12:10:00Z", "commit_id": commit, "author_association": "COLLABORATOR"})
        })
        .collect();
    paginate(reviews, &query, &uri, &headers)
}

/// `GET /repos/{owner}/{repo}/issues/{number}`: a pull request is an issue,
/// and the issue says who closed it.
async fn get_issue(
    State(data): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, u64)>,
) -> Result<Json<Value>, StatusCode> {
    let data = data.lock().expect("lock");
    let pull = data
        .pull_requests
        .iter()
        .find(|p| p.number == number)
        .ok_or(StatusCode::NOT_FOUND)?;
    Ok(Json(json!({
        "id": 8000 + number, "number": number, "title": pull.title, "body": pull.body,
        "state": if pull.open { "open" } else { "closed" }, "user": user(&pull.author),
        "closed_by": pull.closed_by.as_deref().or(pull.merged_by.as_deref()).map(user),
        "pull_request": {"url": format!("https://api.github.example.test/repos/{owner}/{repo}/pulls/{number}")},
        "url": format!("https://api.github.example.test/repos/{owner}/{repo}/issues/{number}"),
    })))
}

/// `GET /repos/{owner}/{repo}/pulls/{number}/files`: what its head changes against its base.
async fn list_files(
    State(data): State<Shared>,
    Path((_owner, _repo, number)): Path<(String, String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
    uri: Uri,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let data = data.lock().expect("lock");
    let Some(pull) = data.pull_requests.iter().find(|p| p.number == number) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Some(bare) = data.bare.as_ref() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let range = format!("refs/heads/{}...refs/heads/{}", pull.base, pull.head);
    let names = git_in(bare, &["diff", "-M", "--name-status", &range]).unwrap_or_default();
    let files: Vec<Value> = names
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let zero = "0000000000000000000000000000000000000000";
            match fields.as_slice() {
                // A rename names its new path, and the old one as GitHub does.
                [status, old, new] if status.starts_with('R') => {
                    Some(json!({"filename": new, "previous_filename": old, "status": "renamed", "sha": zero}))
                }
                [status, name, ..] => {
                    let status = match *status {
                        "A" => "added",
                        "D" => "removed",
                        _ => "modified",
                    };
                    Some(json!({"filename": name, "status": status, "sha": zero}))
                }
                _ => None,
            }
        })
        .collect();
    paginate(files, &query, &uri, &headers)
}

/// `GET /user`: who the token is.
async fn authenticated_user(State(data): State<Shared>, headers: axum::http::HeaderMap) -> Json<Value> {
    let data = data.lock().expect("lock");
    Json(user(&caller(&data, &headers)))
}

async fn merge_pull(
    State(data): State<Shared>,
    Path((_owner, _repo, number)): Path<(String, String, u64)>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> axum::response::Response {
    let merger = caller(&data.lock().expect("lock"), &headers);
    match merge_checked(&data, number, &merger, body["sha"].as_str()) {
        Ok(sha) => {
            Json(json!({"sha": sha, "merged": true, "message": "Pull Request successfully merged"})).into_response()
        }
        Err((status, message)) => (
            status,
            Json(json!({"message": message, "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request"})),
        )
            .into_response(),
    }
}

/// A merge as GitHub's API or button makes it: refused (with GitHub's
/// status and message) when the pull request is closed, its head is not
/// `sha`, `merger` may not write, or branch protection is not met.
fn merge_checked(data: &Shared, number: u64, merger: &str, sha: Option<&str>) -> Result<String, (StatusCode, String)> {
    {
        let guard = data.lock().expect("lock");
        let Some(pull) = guard.pull_requests.iter().find(|p| p.number == number) else {
            return Err((StatusCode::NOT_FOUND, "Not Found".into()));
        };
        if !pull.open {
            return Err((StatusCode::METHOD_NOT_ALLOWED, "Pull Request is not mergeable".into()));
        }
        let head = branch_sha(&guard, &pull.head).unwrap_or_default();
        if sha.is_some_and(|sha| sha != head) {
            return Err((
                StatusCode::CONFLICT,
                "Head branch was modified. Review and try the merge again.".into(),
            ));
        }
        if !can_write(&guard, merger) {
            return Err((
                StatusCode::FORBIDDEN,
                "Must have write access to merge pull requests.".into(),
            ));
        }
        let changed = changed_files(&guard, pull);
        let owners = guard
            .bare
            .as_ref()
            .and_then(|bare| codeowners(bare, &pull.base))
            .unwrap_or_default();
        if let Some(message) = merge_refusal(&guard, pull, merger, &head, &changed, &owners) {
            return Err((StatusCode::METHOD_NOT_ALLOWED, message));
        }
    }
    merge_into_bare(data, number, merger).map_err(|message| (StatusCode::METHOD_NOT_ALLOWED, message))
}

/// Whether pull request `pull` brought commit `sha` in, as GitHub lists
/// the pull requests of a commit: a merged one whose merge made `sha`
/// reachable, an open one whose head holds `sha` and whose base does not.
fn introduced(data: &Data, pull: &FakePull, sha: &str) -> bool {
    let Some(bare) = data.bare.as_ref() else { return false };
    let holds = |tip: &str| git_in(bare, &["merge-base", "--is-ancestor", sha, tip]).is_ok();
    match (&pull.merge_commit, pull.open) {
        (Some(merge), _) => holds(merge) && !holds(&format!("{merge}^1")),
        (None, true) => holds(&format!("refs/heads/{}", pull.head)) && !holds(&format!("refs/heads/{}", pull.base)),
        (None, false) => false,
    }
}

/// Whether `login` may push to the repository (and so merge).
fn can_write(data: &Data, login: &str) -> bool {
    match data.permissions.get(login) {
        Some(permission) => matches!(permission.as_str(), "admin" | "maintain" | "write"),
        // The fake's default account and an installed App's bot write.
        None => {
            login == "gitcanary[bot]"
                || data
                    .app
                    .as_ref()
                    .is_some_and(|app| login == format!("{}[bot]", app.slug))
        }
    }
}

/// The paths a pull request changes (a rename's old path too).
fn changed_files(data: &Data, pull: &FakePull) -> Vec<String> {
    let Some(bare) = data.bare.as_ref() else {
        return Vec::new();
    };
    let range = format!("refs/heads/{}...refs/heads/{}", pull.base, pull.head);
    git_in(bare, &["diff", "--name-only", "--no-renames", &range])
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// CODEOWNERS of the base branch, where GitHub looks for it: (pattern, owners) in file order.
fn codeowners(bare: &std::path::Path, base: &str) -> Option<Vec<(String, Vec<String>)>> {
    let text = [".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS"]
        .iter()
        .find_map(|path| git_in(bare, &["show", &format!("refs/heads/{base}:{path}")]).ok())?;
    Some(
        text.lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let pattern = words.next()?.to_string();
                let owners = words.map(|w| w.trim_start_matches('@').to_string()).collect();
                Some((pattern, owners))
            })
            .collect(),
    )
}

/// A CODEOWNERS pattern (gitignore's rules, as GitHub reads them): `*`
/// within a path segment, `**` across them, a leading or inner `/` anchors
/// it at the root, a trailing `/` means everything under a directory.
pub fn codeowners_match(pattern: &str, path: &str) -> bool {
    fn glob(pattern: &[u8], text: &[u8]) -> bool {
        match (pattern.first(), text.first()) {
            (None, None) => true,
            // `**/` is any number of whole directories; a final `**`, anything.
            (Some(b'*'), _) if pattern.get(1) == Some(&b'*') => match pattern[2..].strip_prefix(b"/") {
                Some(rest) => {
                    glob(rest, text) || (0..text.len()).any(|i| text[i] == b'/' && glob(rest, &text[i + 1..]))
                }
                None => true,
            },
            (Some(b'*'), _) => (0..=text.len())
                .take_while(|&i| i == 0 || text[i - 1] != b'/')
                .any(|i| glob(&pattern[1..], &text[i..])),
            (Some(p), Some(t)) if p == t => glob(&pattern[1..], &text[1..]),
            _ => false,
        }
    }
    let directory = pattern.ends_with('/');
    let trimmed = pattern.trim_end_matches('/');
    let anchored = trimmed.starts_with('/') || trimmed.trim_start_matches('/').contains('/');
    let trimmed = trimmed.trim_start_matches('/');
    let starts: Vec<usize> = if anchored {
        vec![0]
    } else {
        std::iter::once(0)
            .chain(path.match_indices('/').map(|(i, _)| i + 1))
            .collect()
    };
    starts.into_iter().any(|start| {
        let rest = &path[start..];
        // The pattern names the path itself, or a directory holding it.
        let whole = !directory && glob(trimmed.as_bytes(), rest.as_bytes());
        // `docs/*` owns the files in docs, not those of its subdirectories.
        let within = !trimmed.ends_with("/*")
            && rest
                .match_indices('/')
                .any(|(i, _)| glob(trimmed.as_bytes(), &rest.as_bytes()[..i]));
        whole || within
    })
}

/// Why GitHub would refuse `merger`'s merge of `pull` at `head`, if it
/// would: the protection's rules, unless an admin may bypass them.
pub fn merge_refusal(
    data: &Data,
    pull: &FakePull,
    merger: &str,
    head: &str,
    changed: &[String],
    owners: &[(String, Vec<String>)],
) -> Option<String> {
    let rules = &data.protection;
    if !rules.enforce_admins && data.permissions.get(merger).is_some_and(|p| p == "admin") {
        return None;
    }
    // The latest review of each reviewer; a comment changes no verdict.
    let mut latest: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for (_, user, state, commit) in &pull.reviews {
        if state != "COMMENTED" {
            latest.insert(user.as_str(), (state.as_str(), commit.as_str()));
        }
    }
    let counts = |state: &str, commit: &str| state == "APPROVED" && (!rules.dismiss_stale_reviews || commit == head);
    let approvers: Vec<&str> = latest
        .iter()
        .filter(|(user, (state, commit))| can_write(data, user) && counts(state, commit))
        .map(|(user, _)| *user)
        .collect();
    // A writer's "changes requested" blocks only where reviews are required.
    if rules.required_approvals > 0
        && latest
            .iter()
            .any(|(user, (state, _))| *state == "CHANGES_REQUESTED" && can_write(data, user))
    {
        return Some("Changes were requested by a reviewer with write access.".into());
    }
    if approvers.len() < rules.required_approvals {
        return Some(format!(
            "At least {} approving review{} required by reviewers with write access.",
            rules.required_approvals,
            if rules.required_approvals == 1 { " is" } else { "s are" }
        ));
    }
    if rules.require_code_owner_reviews {
        for file in changed {
            let owning = owners.iter().rev().find(|(pattern, _)| codeowners_match(pattern, file));
            if let Some((_, people)) = owning
                && !people.is_empty()
                && !people.iter().any(|owner| approvers.contains(&owner.as_str()))
            {
                return Some(format!("Waiting on code owner review from {}.", people.join(", ")));
            }
        }
    }
    for check in &rules.required_checks {
        let state = data
            .statuses
            .iter()
            .rev()
            .find(|(sha, _, context, _)| sha == head && context == check)
            .map(|(_, state, _, _)| state.as_str());
        if state != Some("success") {
            return Some(format!("Required status check \"{check}\" is expected."));
        }
    }
    None
}

/// Merges the pull request's head into its base in the bare repository, as
/// GitHub's merge button does (a merge commit), and marks it merged.
fn merge_into_bare(data: &Shared, number: u64, by: &str) -> Result<String, String> {
    let (bare, pull) = {
        let data = data.lock().expect("lock");
        let pull = data
            .pull_requests
            .iter()
            .find(|p| p.number == number)
            .cloned()
            .ok_or("no such pull request")?;
        (data.bare.clone().ok_or("the fake has no repository")?, pull)
    };
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = work.path();
    let bare = bare.to_string_lossy().to_string();
    let mut merged = Err("not tried".to_string());
    // The base may move while merging; try again as GitHub would.
    for _ in 0..5 {
        let _ = std::fs::remove_dir_all(dir.join("w"));
        git_in(dir, &["clone", "-q", "-b", &pull.base, &bare, "w"])?;
        let w = dir.join("w");
        git_in(&w, &["config", "user.name", by])?;
        git_in(&w, &["config", "user.email", "noreply@github.example.test"])?;
        let message = format!("Merge pull request #{number} from acme/{}\n\n{}", pull.head, pull.title);
        git_in(
            &w,
            &[
                "merge",
                "-q",
                "--no-ff",
                "-m",
                &message,
                &format!("origin/{}", pull.head),
            ],
        )?;
        merged = git_in(&w, &["push", "-q", "origin", &format!("HEAD:{}", pull.base)])
            .and_then(|_| git_in(&w, &["rev-parse", "HEAD"]));
        if merged.is_ok() {
            break;
        }
    }
    let sha = merged?;
    let mut data = data.lock().expect("lock");
    if let Some(pull) = data.pull_requests.iter_mut().find(|p| p.number == number) {
        pull.open = false;
        pull.merged_by = Some(by.to_string());
        pull.merge_commit = Some(sha.clone());
        let pull = pull.clone();
        emit(&data, "pull_request", pull_event(&data, "closed", &pull, by));
        let push = json!({"ref": format!("refs/heads/{}", pull.base), "after": sha, "sender": user(by), "pusher": {"name": by}});
        emit(&data, "push", push);
    }
    Ok(sha)
}

/// Who opened pull request `n`: whoever opened it through the API, else
/// the author `carry_by` named (default `carol`).
fn pull_author(data: &Data, n: u64) -> &str {
    data.pull_requests
        .iter()
        .find(|p| p.number == n)
        .map(|p| p.author.as_str())
        .or_else(|| data.authors.get(&n).map(String::as_str))
        .unwrap_or("carol")
}

async fn pulls_for_commit(
    State(data): State<Shared>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
) -> Json<Value> {
    let data = data.lock().expect("lock");
    let by_hand: Vec<u64> = data.pulls.get(&sha).cloned().unwrap_or_default();
    let mut pulls: Vec<Value> = by_hand
        .iter()
        .map(|n| {
            json!({
                "id": 9000 + n, "number": n, "state": "closed", "title": format!("Change {n}"),
                "user": user(pull_author(&data, *n)), "merged_at": "2026-11-30T11:00:00Z", "merge_commit_sha": sha,
                "html_url": format!("https://github.example.test/{owner}/{repo}/pull/{n}"),
                "url": format!("https://api.github.example.test/repos/{owner}/{repo}/pulls/{n}"),
                "head": {"ref": format!("change-{n}"), "sha": sha}, "base": {"ref": "main"}
            })
        })
        .collect();
    // The fake's own pull requests that brought the commit in.
    pulls.extend(
        data.pull_requests
            .iter()
            .filter(|p| !by_hand.contains(&p.number))
            .filter(|p| p.merge_commit.as_deref() == Some(sha.as_str()) || introduced(&data, p, &sha))
            .map(|p| pull_json(&owner, &repo, p, &data)),
    );
    Json(Value::Array(pulls))
}

async fn list_comments(
    State(data): State<Shared>,
    Path((owner, repo, pull)): Path<(String, String, u64)>,
    Query(query): Query<BTreeMap<String, String>>,
    uri: Uri,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let data = data.lock().expect("lock");
    let comments: Vec<Value> = data
        .comments
        .iter()
        .filter(|c| c.0 == pull)
        .map(|c| {
            let at = data.comment_times.get(&c.1).cloned().unwrap_or_else(now);
            comment_json(&owner, &repo, pull, c.1, &c.2, &c.3, &at)
        })
        .collect();
    paginate(comments, &query, &uri, &headers)
}

async fn create_comment(
    State(data): State<Shared>,
    Path((owner, repo, pull)): Path<(String, String, u64)>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut data = data.lock().expect("lock");
    let author = caller(&data, &headers);
    data.next_id += 1;
    let id = data.next_id;
    let text = body["body"].as_str().unwrap_or_default().to_string();
    data.comments.push((pull, id, author.clone(), text.clone()));
    let at = now();
    data.comment_times.insert(id, at.clone());
    emit(
        &data,
        "issue_comment",
        comment_event("created", pull, id, &author, &text, &at),
    );
    (
        StatusCode::CREATED,
        Json(comment_json(&owner, &repo, pull, id, &author, &text, &at)),
    )
}

async fn create_review(
    State(data): State<Shared>,
    Path((owner, repo, number)): Path<(String, String, u64)>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> axum::response::Response {
    let mut data = data.lock().expect("lock");
    let reviewer = caller(&data, &headers);
    let state = match body["event"].as_str() {
        Some("APPROVE") => "APPROVED",
        Some("REQUEST_CHANGES") => "CHANGES_REQUESTED",
        _ => "COMMENTED",
    };
    data.next_id += 1;
    let id = data.next_id;
    let Some(head) = data
        .pull_requests
        .iter()
        .find(|p| p.number == number)
        .map(|p| p.head.clone())
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let commit = body["commit_id"]
        .as_str()
        .map(str::to_string)
        .or_else(|| branch_sha(&data, &head))
        .unwrap_or_default();
    let Some(pull) = data.pull_requests.iter_mut().find(|p| p.number == number) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if pull.author == reviewer && state != "COMMENTED" {
        return unprocessable("Can not approve your own pull request");
    }
    pull.reviews
        .push((id, reviewer.clone(), state.to_string(), commit.clone()));
    let pull = pull.clone();
    emit(
        &data,
        "pull_request_review",
        review_event(&data, &pull, id, &reviewer, state, &commit),
    );
    Json(
        json!({"id": id, "node_id": "PRR_kwDOA", "user": user(&reviewer), "body": body["body"], "state": state,
        "html_url": format!("https://github.example.test/{owner}/{repo}/pull/{number}#pullrequestreview-{id}"),
        "submitted_at": "2026-11-30T12:10:00Z", "commit_id": commit, "author_association": "COLLABORATOR"}),
    )
    .into_response()
}

async fn list_statuses(
    State(data): State<Shared>,
    Path((_owner, _repo, sha)): Path<(String, String, String)>,
) -> Json<Value> {
    let data = data.lock().expect("lock");
    let statuses: Vec<Value> = data
        .statuses
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, s)| s.0 == sha)
        .map(|(id, s)| {
            json!({"id": id + 1, "state": s.1, "context": s.2, "description": s.3, "target_url": null,
                "creator": user("gitcanary[bot]"), "created_at": "2026-11-30T12:00:00Z", "updated_at": "2026-11-30T12:00:00Z"})
        })
        .collect();
    Json(Value::Array(statuses))
}

async fn edit_comment(
    State(data): State<Shared>,
    Path((owner, repo, id)): Path<(String, String, u64)>,
    Json(body): Json<Value>,
) -> Result<Json<Value>, StatusCode> {
    let mut data = data.lock().expect("lock");
    let comment = data
        .comments
        .iter_mut()
        .find(|c| c.1 == id)
        .ok_or(StatusCode::NOT_FOUND)?;
    comment.3 = body["body"].as_str().unwrap_or_default().to_string();
    let (pull, login, text) = (comment.0, comment.2.clone(), comment.3.clone());
    let at = data.comment_times.get(&id).cloned().unwrap_or_else(now);
    emit(
        &data,
        "issue_comment",
        comment_event("edited", pull, id, &login, &text, &at),
    );
    Ok(Json(comment_json(&owner, &repo, pull, id, &login, &text, &at)))
}

async fn create_status(
    State(data): State<Shared>,
    Path((_owner, _repo, sha)): Path<(String, String, String)>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut data = data.lock().expect("lock");
    let field = |k: &str| body[k].as_str().unwrap_or_default().to_string();
    data.statuses
        .push((sha.clone(), field("state"), field("context"), field("description")));
    (
        StatusCode::CREATED,
        Json(
            json!({"id": data.statuses.len(), "state": field("state"), "context": field("context"),
                    "description": field("description"), "target_url": null, "creator": user("gitcanary[bot]"),
                    "created_at": "2026-11-30T12:00:00Z", "updated_at": "2026-11-30T12:00:00Z"}),
        ),
    )
}

async fn permission(
    State(data): State<Shared>,
    Path((_owner, _repo, login)): Path<(String, String, String)>,
) -> Json<Value> {
    let data = data.lock().expect("lock");
    let permission = data.permissions.get(&login).cloned().unwrap_or_else(|| "read".into());
    let role = data.roles.get(&login).cloned().unwrap_or_else(|| permission.clone());
    // GitHub's base levels: maintain reads as write, triage as read.
    let base = match permission.as_str() {
        "maintain" => "write".to_string(),
        "triage" => "read".to_string(),
        other => other.to_string(),
    };
    Json(json!({"permission": base, "role_name": role, "user": user(&login)}))
}

/// `GET /repos/{owner}/{repo}/git/ref/heads/{branch}`: the branch in the bare repository.
async fn get_branch_ref(
    State(data): State<Shared>,
    Path((_owner, _repo, branch)): Path<(String, String, String)>,
) -> axum::response::Response {
    let data = data.lock().expect("lock");
    match branch_sha(&data, &branch) {
        Some(sha) => Json(json!({"ref": format!("refs/heads/{branch}"), "object": {"type": "commit", "sha": sha}}))
            .into_response(),
        None => (StatusCode::NOT_FOUND, Json(json!({"message": "Not Found"}))).into_response(),
    }
}

/// A commit as GitHub's commits and compare APIs show it: `author` and
/// `committer` are accounts only when their email is linked to one.
fn commit_json(data: &Data, bare: &std::path::Path, sha: &str) -> Option<Value> {
    let line = git_in(bare, &["show", "-s", "--format=%H%x09%ae%x09%ce", sha]).ok()?;
    let fields: Vec<&str> = line.split('\t').collect();
    let [full, author, committer] = fields.as_slice() else {
        return None;
    };
    let message = git_in(bare, &["show", "-s", "--format=%B", sha]).unwrap_or_default();
    let account = |email: &str| data.logins.get(email).map_or(Value::Null, |login| user(login));
    Some(json!({
        "sha": full,
        "commit": {"author": {"email": author}, "committer": {"email": committer}, "message": message},
        "author": account(author),
        "committer": account(committer),
    }))
}

/// `GET /repos/{owner}/{repo}/commits/{sha}`.
async fn get_commit(
    State(data): State<Shared>,
    Path((_owner, _repo, sha)): Path<(String, String, String)>,
) -> axum::response::Response {
    let data = data.lock().expect("lock");
    let found = data.bare.as_deref().and_then(|bare| commit_json(&data, bare, &sha));
    match found {
        Some(commit) => Json(commit).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `GET /repos/{owner}/{repo}/compare/{base}...{head}`: the commits after base up to head.
async fn compare(
    State(data): State<Shared>,
    Path((_owner, _repo, range)): Path<(String, String, String)>,
) -> axum::response::Response {
    let data = data.lock().expect("lock");
    let (Some(bare), Some((base, head))) = (data.bare.as_deref(), range.split_once("...")) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Ok(list) = git_in(bare, &["rev-list", "--reverse", &format!("{base}..{head}")]) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let commits: Vec<Value> = list.lines().filter_map(|sha| commit_json(&data, bare, sha)).collect();
    Json(json!({"status": "ahead", "total_commits": commits.len(), "commits": commits})).into_response()
}
