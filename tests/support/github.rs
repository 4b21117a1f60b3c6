//! A GitHub API fake on loopback, serving the endpoints gitcanary uses with
//! JSON shaped like GitHub's own responses, and recording every request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{get, patch, post};
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
    next_id: u64,
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

fn comment_json(owner: &str, repo: &str, pull: u64, id: u64, login: &str, body: &str) -> Value {
    json!({
        "id": id, "node_id": "IC_kwDOA", "body": body, "user": user(login),
        "url": format!("https://api.github.example.test/repos/{owner}/{repo}/issues/comments/{id}"),
        "html_url": format!("https://github.example.test/{owner}/{repo}/pull/{pull}#issuecomment-{id}"),
        "issue_url": format!("https://api.github.example.test/repos/{owner}/{repo}/issues/{pull}"),
        "created_at": "2026-11-30T12:00:00Z", "updated_at": "2026-11-30T12:00:00Z",
        "author_association": "CONTRIBUTOR"
    })
}

impl GitHubFake {
    pub async fn start() -> GitHubFake {
        let data: Shared = Arc::new(Mutex::new(Data {
            next_id: 1000,
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
            .layer(axum::middleware::from_fn_with_state(data.clone(), record))
            .with_state(data.clone());
        let addr = super::serve_on_own_thread(app, "GitHub fake");
        GitHubFake {
            url: format!("http://{addr}"),
            data,
        }
    }

    pub fn carry(&self, sha: &str, pull: u64) {
        self.data
            .lock()
            .expect("lock")
            .pulls
            .entry(sha.to_string())
            .or_default()
            .push(pull);
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
        let mut data = self.data.lock().expect("lock");
        data.next_id += 1;
        let id = data.next_id;
        data.comments.push((pull, id, user.to_string(), body.to_string()));
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
    data.lock()
        .expect("lock")
        .requests
        .push((method.to_string(), uri.path().to_string()));
    next.run(request).await
}

async fn pulls_for_commit(
    State(data): State<Shared>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
) -> Json<Value> {
    let data = data.lock().expect("lock");
    let pulls: Vec<Value> = data
        .pulls
        .get(&sha)
        .into_iter()
        .flatten()
        .map(|n| {
            json!({
                "id": 9000 + n, "number": n, "state": "closed", "title": format!("Change {n}"),
                "user": user("alice"), "merged_at": "2026-11-30T11:00:00Z", "merge_commit_sha": sha,
                "html_url": format!("https://github.example.test/{owner}/{repo}/pull/{n}"),
                "url": format!("https://api.github.example.test/repos/{owner}/{repo}/pulls/{n}"),
                "head": {"ref": format!("change-{n}"), "sha": sha}, "base": {"ref": "main"}
            })
        })
        .collect();
    Json(Value::Array(pulls))
}

async fn list_comments(
    State(data): State<Shared>,
    Path((owner, repo, pull)): Path<(String, String, u64)>,
) -> Json<Value> {
    let data = data.lock().expect("lock");
    let comments: Vec<Value> = data
        .comments
        .iter()
        .filter(|c| c.0 == pull)
        .map(|c| comment_json(&owner, &repo, pull, c.1, &c.2, &c.3))
        .collect();
    Json(Value::Array(comments))
}

async fn create_comment(
    State(data): State<Shared>,
    Path((owner, repo, pull)): Path<(String, String, u64)>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut data = data.lock().expect("lock");
    data.next_id += 1;
    let id = data.next_id;
    let text = body["body"].as_str().unwrap_or_default().to_string();
    data.comments.push((pull, id, "gitcanary[bot]".into(), text.clone()));
    (
        StatusCode::CREATED,
        Json(comment_json(&owner, &repo, pull, id, "gitcanary[bot]", &text)),
    )
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
    Ok(Json(comment_json(
        &owner,
        &repo,
        comment.0,
        id,
        &comment.2.clone(),
        &comment.3.clone(),
    )))
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
    Json(json!({"permission": permission, "role_name": permission, "user": user(&login)}))
}
