//! A real Git server on loopback: bare repositories in a temp dir, served
//! over `file://` and over HTTP through `git http-backend` (CGI), with
//! optional Basic authentication so the token path of the agent is real.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use tokio::io::AsyncWriteExt;

use super::run;

pub struct GitServer {
    pub root: tempfile::TempDir,
    pub addr: SocketAddr,
}

#[derive(Clone)]
struct ServerConfig {
    root: PathBuf,
    /// `user:password` required on every request, when set.
    credentials: Option<Arc<str>>,
}

impl GitServer {
    /// Starts a server; with `credentials` ("user:password") every request must authenticate.
    pub async fn start(credentials: Option<&str>) -> GitServer {
        let root = tempfile::tempdir().expect("a temp dir for repositories");
        let config = ServerConfig {
            root: root.path().to_path_buf(),
            credentials: credentials.map(Arc::from),
        };
        let app = Router::new()
            .fallback(handle)
            .layer(DefaultBodyLimit::disable())
            .with_state(config);
        let addr = super::serve_on_own_thread(app, "Git server");
        GitServer { root, addr }
    }

    /// Creates a bare repository `name.git` and a working clone to write to.
    pub fn create_repo(&self, name: &str) -> GitRepo {
        let bare = self.root.path().join(format!("{name}.git"));
        run(
            self.root.path(),
            "git",
            &[
                "init",
                "--bare",
                "--initial-branch=main",
                bare.to_str().expect("utf-8 path"),
            ],
        );
        let work = tempfile::tempdir().expect("a temp dir for the working clone");
        run(work.path(), "git", &["init", "--initial-branch=main", "."]);
        run(work.path(), "git", &["config", "user.name", "Test Author"]);
        run(work.path(), "git", &["config", "user.email", "author@example.test"]);
        run(
            work.path(),
            "git",
            &["remote", "add", "origin", &format!("file://{}", bare.display())],
        );
        GitRepo {
            name: name.to_string(),
            bare,
            work,
            http_base: format!("http://{}", self.addr),
        }
    }
}

pub struct GitRepo {
    pub name: String,
    pub bare: PathBuf,
    pub work: tempfile::TempDir,
    http_base: String,
}

impl GitRepo {
    pub fn file_url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    pub fn http_url(&self) -> String {
        format!("{}/{}.git", self.http_base, self.name)
    }

    /// The HTTP URL with credentials in it, for the git CLI only.
    pub fn http_url_with(&self, credentials: &str) -> String {
        self.http_url()
            .replacen("http://", &format!("http://{credentials}@"), 1)
    }

    pub fn write(&self, path: &str, content: &str) -> &Self {
        let file = self.work.path().join(path);
        std::fs::create_dir_all(file.parent().expect("a parent dir")).expect("mkdir");
        std::fs::write(file, content).expect("write file");
        self
    }

    pub fn remove(&self, path: &str) -> &Self {
        std::fs::remove_file(self.work.path().join(path)).expect("remove file");
        self
    }

    /// Commits everything and pushes to `main` on the bare repository; returns the commit id.
    pub fn commit_and_push(&self, message: &str) -> String {
        self.commit_and_push_to("origin", message)
    }

    pub fn commit_and_push_to(&self, remote: &str, message: &str) -> String {
        let dir = self.work.path();
        run(dir, "git", &["add", "-A"]);
        run(dir, "git", &["commit", "-q", "--allow-empty", "-m", message]);
        // gitcanary may have pushed (a status or revert commit), even between
        // the pull and the push: take it first and try again, as a user would.
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(dir)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let pushed = (0..10).any(|attempt| {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let pulled = git(&["pull", "-q", "--rebase", remote, "main"]);
            let git_dir = dir.join(".git");
            if !pulled && (git_dir.join("rebase-merge").exists() || git_dir.join("rebase-apply").exists()) {
                // A conflict with gitcanary's commit: a test that means to
                // build on it must pull first. Never push a half-done rebase.
                let _ = git(&["rebase", "--abort"]);
                panic!(
                    "the commit {message:?} conflicts with what the remote holds now; pull before changing those files"
                );
            }
            git(&["push", "-q", remote, "HEAD:main"])
        });
        if !pushed {
            run(dir, "git", &["push", "-q", remote, "HEAD:main"]); // fails, with git's reason
        }
        run(dir, "git", &["rev-parse", "HEAD"]).trim().to_string()
    }

    pub fn path(&self) -> &Path {
        self.work.path()
    }
}

async fn handle(
    State(config): State<ServerConfig>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let mut remote_user = None;
    if let Some(expected) = &config.credentials {
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| base64_decode(b.trim()));
        if given.as_deref() != Some(expected.as_ref()) {
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header("WWW-Authenticate", "Basic realm=\"git\"")
                .body(Body::empty())
                .expect("a response");
        }
        remote_user = expected.split(':').next().map(str::to_string);
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", &config.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", uri.path())
        .env("QUERY_STRING", uri.query().unwrap_or_default())
        .env("REQUEST_METHOD", method.as_str())
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", remote_user.unwrap_or_else(|| "anonymous".to_string()))
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "http.receivepack")
        .env("GIT_CONFIG_VALUE_0", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = command.spawn().expect("git http-backend starts");
    let mut stdin = child.stdin.take().expect("stdin piped");
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = child.wait_with_output().await.expect("git http-backend finishes");
    let _ = writer.await;
    cgi_response(&output.stdout)
}

fn cgi_response(raw: &[u8]) -> Response<Body> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    let split = split.or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let (head, body) = match split {
        Some((i, n)) => (&raw[..i], &raw[i + n..]),
        None => (&raw[..0], raw),
    };
    let mut response = Response::builder();
    let mut status = StatusCode::OK;
    for line in String::from_utf8_lossy(head).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            status = value
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::OK);
        } else {
            response = response.header(name.trim(), value);
        }
    }
    response
        .status(status)
        .body(Body::from(body.to_vec()))
        .expect("a response")
}

fn base64_decode(input: &str) -> Option<String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in input.bytes().filter(|&c| c != b'=') {
        let value = ALPHABET.iter().position(|&a| a == c)? as u32;
        bits = (bits << 6) | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    String::from_utf8(out).ok()
}
