//! Shared test support: one real control plane per test run, a fresh
//! namespace per test, and a local Git server.
#![allow(dead_code)] // each test binary uses a different part

pub mod agent;
pub mod git_server;
pub mod github;
pub mod library;
pub mod prometheus;
mod serve;
pub mod traffic;
pub use serve::serve_on_own_thread;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The kubeconfig of the test control plane: `GITCANARY_TEST_KUBECONFIG`
/// when the caller started one (the test script does), otherwise one started
/// now with tests/testenv/up.sh and stopped when this process exits.
pub fn kubeconfig() -> &'static PathBuf {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        if let Some(path) = std::env::var_os("GITCANARY_TEST_KUBECONFIG") {
            return PathBuf::from(path);
        }
        let up = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testenv/up.sh");
        let output = Command::new("bash")
            .arg(&up)
            .env("GITCANARY_TESTENV_PARENT", std::process::id().to_string())
            .env("GITCANARY_TESTENV_GATEWAY", "1")
            .env("GITCANARY_TESTENV_KNATIVE", if knative_tests() { "1" } else { "0" })
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("tests/testenv/up.sh runs");
        assert!(output.status.success(), "the test control plane did not start");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("KUBECONFIG="))
            .expect("up.sh prints KUBECONFIG=<path>");
        PathBuf::from(line)
    })
}

/// Whether this test binary is tests/knative.rs, the one that needs Knative
/// Serving on a plane it starts itself (the others start none, for speed).
fn knative_tests() -> bool {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().starts_with("knative-")))
        .unwrap_or(false)
}

pub async fn client() -> Client {
    let file = Kubeconfig::read_from(kubeconfig()).expect("the test kubeconfig is readable");
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("the test kubeconfig is valid");
    Client::try_from(config).expect("a client for the test control plane")
}

/// A namespace of its own for one test.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("a namespace");
    api.create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
    name
}

/// Polls `check` until it returns Some, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs a command and returns its stdout; panics with its stderr on failure.
pub fn run(dir: &std::path::Path, program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A plain HTTP/1.1 request on loopback: (status, body), or None when the
/// server does not answer.
pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    // A server may answer before it has read the whole body (a 413) and
    // close: the body's write then fails, and the answer is read all the same.
    let _ = stream.write_all(body);
    let mut received = Vec::new();
    let read = stream.read_to_end(&mut received);
    let response = String::from_utf8(received).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    // Whole only when all its Content-Length arrived (then a reset after it
    // still counts: a 413 sent before the body was read); without one, when
    // the server closed cleanly.
    let whole = match content_length(head) {
        Some(length) => body.len() >= length,
        None => read.is_ok(),
    };
    whole.then(|| (status, body.to_string()))
}

fn content_length(head: &str) -> Option<usize> {
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// The `color` key of a ConfigMap as the cluster has it now; none when the
/// ConfigMap or the key is missing, or the read fails.
pub async fn color_of(configmaps: &kube::Api<k8s_openapi::api::core::v1::ConfigMap>, name: &str) -> Option<String> {
    configmaps
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .data?
        .get("color")
        .cloned()
}

/// A control plane of a test's own, for faults that must not reach the
/// others (stopping the API server); stopped when dropped.
pub struct DedicatedControlPlane {
    pub state: PathBuf,
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl DedicatedControlPlane {
    pub fn start() -> DedicatedControlPlane {
        let dir = tempfile::tempdir().expect("a dir");
        let state = dir.path().join("cluster");
        let testenv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testenv");
        let output = Command::new("bash")
            .arg(testenv.join("up.sh"))
            .arg(&state)
            .env("GITCANARY_TESTENV_PARENT", std::process::id().to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("up.sh runs");
        assert!(output.status.success(), "the dedicated control plane did not start");
        let kubeconfig = state.join("kubeconfig");
        DedicatedControlPlane {
            state,
            kubeconfig,
            _dir: dir,
        }
    }

    /// Stops or starts one component (`kube-apiserver`, `etcd`, ...).
    pub fn component(&self, action: &str, name: &str) {
        let testenv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testenv");
        let state = self.state.display().to_string();
        run(&testenv, "bash", &["restart.sh", &state, action, name]);
    }

    /// The last lines each component logged and the nodes' Ready
    /// conditions: what a failed test needs to tell gitcanary's fault from
    /// the control plane's.
    pub fn diagnosis(&self) -> String {
        let mut text = String::new();
        for name in ["kube-controller-manager", "kube-scheduler", "kwok"] {
            let log = std::fs::read_to_string(self.state.join(format!("logs/{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            text.push_str(&format!("--- {name} (last 15 lines)\n"));
            for line in &lines[lines.len().saturating_sub(15)..] {
                text.push_str(line);
                text.push('\n');
            }
        }
        let kubectl = self.state.join("kubectl");
        let nodes = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["get", "nodes,pods", "-A", "-o", "wide"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        text.push_str(&format!("--- nodes and pods\n{nodes}"));
        text
    }

    /// A client of this plane, with the Rollout CRD installed and the
    /// namespace `name` made: another cluster for an agent on the same repository.
    pub async fn with_namespace(&self, name: &str) -> Client {
        let client = self.client().await;
        agent::install_rollout_crd_on(&client).await;
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
        client
    }

    pub async fn client(&self) -> Client {
        let file = Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .expect("valid kubeconfig");
        Client::try_from(config).expect("client")
    }
}

impl Drop for DedicatedControlPlane {
    fn drop(&mut self) {
        let testenv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testenv");
        let _ = Command::new("bash")
            .arg(testenv.join("down.sh"))
            .arg(&self.state)
            .output();
    }
}

/// A TCP server that accepts connections and never answers: a dependency
/// that hangs. Its connections are held until it is dropped.
pub struct BlackHole {
    pub addr: std::net::SocketAddr,
}

impl BlackHole {
    pub fn start() -> BlackHole {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                held.push(stream);
            }
        });
        BlackHole { addr }
    }
}

/// An ed25519 key and an allowed-signers file naming it for gitcanary's
/// default commit identity.
pub fn signing_key(dir: &std::path::Path, name: &str) -> (String, String) {
    let key = dir.join(name);
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen runs");
    assert!(status.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).expect("public key");
    let allowed = dir.join(format!("{name}.allowed"));
    std::fs::write(&allowed, format!("gitcanary@localhost {public}")).expect("allowed signers");
    (key.display().to_string(), allowed.display().to_string())
}
