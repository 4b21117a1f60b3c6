//! The agent's HTTP endpoints: GitHub webhooks, health and readiness.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use tracing::{info, warn};

use crate::agent::Trigger;
use crate::source::webhook::{self, PushEvent};
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct ServerState {
    pub webhook_secret: Option<Arc<[u8]>>,
    pub branch: String,
    pub triggers: crate::agent::Triggers,
    /// Set once the first sync has finished.
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    /// Recent `X-GitHub-Delivery` ids: a replayed delivery is acted on once.
    pub deliveries: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    /// Webhook requests that may be served at once.
    pub webhook_permits: Arc<tokio::sync::Semaphore>,
}

/// Permits for the webhook requests served at once.
pub fn webhook_permits() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_REQUESTS))
}

/// Delivery ids remembered against replays.
const REMEMBERED_DELIVERIES: usize = 1024;

impl ServerState {
    /// Whether this delivery was seen before (and remembers it if not).
    fn replayed(&self, headers: &HeaderMap) -> bool {
        let Some(id) = headers.get("x-github-delivery").and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let mut seen = self.deliveries.lock().unwrap_or_else(|e| e.into_inner());
        if seen.iter().any(|s| s == id) {
            return true;
        }
        if seen.len() >= REMEMBERED_DELIVERIES {
            seen.pop_front();
        }
        seen.push_back(id.to_string());
        false
    }
}

/// The webhook and the probes, and `/metrics` unless it has a listener of
/// its own (`--metrics-listen`): the address GitHub reaches then exposes
/// nothing but the webhook and the probes.
pub fn router(state: ServerState, with_metrics: bool) -> Router {
    let webhook_bound = axum::middleware::from_fn_with_state(state.webhook_permits.clone(), bounded);
    let mut router = Router::new()
        .route("/webhook", post(github_webhook).route_layer(webhook_bound))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz));
    if with_metrics {
        router = router.route("/metrics", get(metrics));
    }
    router
        .layer(DefaultBodyLimit::max(webhook::MAX_BODY_BYTES))
        .with_state(state)
}

/// `/metrics` alone, for `--metrics-listen`.
pub fn metrics_router(state: ServerState) -> Router {
    Router::new().route("/metrics", get(metrics)).with_state(state)
}

/// Bounds on the listener's connections, whatever their requests ask.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub max_open: usize,
    /// Connections one address may hold at once, so that a single client
    /// cannot take every slot (and the kubelet's probes with them).
    pub max_per_peer: usize,
    /// How long a client may take to send a request's headers.
    pub header_timeout: std::time::Duration,
    /// How long a connection may stay open: an idle keep-alive connection
    /// is closed by then at the latest (after the request in flight).
    pub max_age: std::time::Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_open: 256,
            max_per_peer: 32,
            header_timeout: std::time::Duration::from_secs(10),
            max_age: std::time::Duration::from_secs(60),
        }
    }
}

/// Webhook requests served at once; more get 503 at once instead of waiting.
const MAX_CONCURRENT_REQUESTS: usize = 32;
/// How long a webhook request (its body included) may take.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Every webhook request: a bounded number at once, each within a deadline,
/// so a slow or flooding client cannot tie the server up; the probes and
/// metrics are not counted against it.
async fn bounded(
    State(permits): State<Arc<tokio::sync::Semaphore>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Ok(_permit) = permits.try_acquire() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many requests at once").into_response();
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::REQUEST_TIMEOUT, "the request took too long").into_response(),
    }
}

/// Connections open per peer address.
#[derive(Default)]
struct PeerCounts(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection of a peer, given back when dropped.
struct PeerSlot {
    counts: Arc<PeerCounts>,
    peer: std::net::IpAddr,
}

impl PeerCounts {
    /// A slot for `peer`, or `None` when it holds `max` already.
    fn hold(counts: &Arc<PeerCounts>, peer: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut map = counts.0.lock().unwrap_or_else(|e| e.into_inner());
        let held = map.entry(peer).or_insert(0);
        if *held >= max {
            return None;
        }
        *held += 1;
        Some(PeerSlot {
            counts: counts.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = map.get_mut(&self.peer) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                map.remove(&self.peer);
            }
        }
    }
}

/// Serves `router` with the default connection limits; returns the bound
/// address at once.
pub async fn serve(addr: SocketAddr, router: Router) -> std::io::Result<SocketAddr> {
    serve_with(addr, router, ConnectionLimits::default()).await
}

/// Serves `router` until the process ends: a bounded number of connections,
/// each with a deadline for its headers and a maximum age, so that clients
/// that connect and say nothing cannot use up the agent's sockets.
pub async fn serve_with(addr: SocketAddr, router: Router, limits: ConnectionLimits) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_open));
    let peers = Arc::new(PeerCounts::default());
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: try again shortly.
                    warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(held) = PeerCounts::hold(&peers, peer.ip(), limits.max_per_peer) else {
                drop(stream);
                continue;
            };
            let Ok(permit) = open.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let service = hyper_util::service::TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let (_permit, _held) = (permit, held);
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(limits.header_timeout);
                let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let mut connection = std::pin::pin!(connection);
                tokio::select! {
                    _ = connection.as_mut() => {}
                    () = tokio::time::sleep(limits.max_age) => {
                        connection.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(limits.header_timeout, connection).await;
                    }
                }
            });
        }
    });
    Ok(bound)
}

async fn metrics(State(state): State<ServerState>) -> ([(&'static str, &'static str); 1], String) {
    ([("content-type", "text/plain; version=0.0.4")], state.metrics.render())
}

async fn readyz(State(state): State<ServerState>) -> (StatusCode, &'static str) {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "first sync not finished")
    }
}

/// A delivery's event, as a bounded metric label.
fn event_label(headers: &HeaderMap) -> &'static str {
    match headers.get("x-github-event").and_then(|v| v.to_str().ok()) {
        Some("push") => "push",
        Some("issue_comment") => "issue_comment",
        Some("pull_request_review") => "pull_request_review",
        Some("pull_request") => "pull_request",
        Some("ping") => "ping",
        _ => "other",
    }
}

/// Answers a delivery and counts it: `acted` (it woke a sync or a look at
/// the gates), `ignored`, `duplicate`, `malformed`, or `refused` (no valid
/// signature: its event is not believed, so labelled `unverified`).
async fn github_webhook(State(state): State<ServerState>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let (status, message) = webhook_answer(&state, &headers, &body);
    let (event, outcome) = match status {
        StatusCode::UNAUTHORIZED => ("unverified", "refused"),
        StatusCode::ACCEPTED => (event_label(&headers), "acted"),
        StatusCode::BAD_REQUEST => (event_label(&headers), "malformed"),
        _ if message.starts_with("duplicate") => (event_label(&headers), "duplicate"),
        _ => (event_label(&headers), "ignored"),
    };
    if status != StatusCode::NOT_FOUND {
        state.metrics.webhook_deliveries.add(event, outcome);
    }
    (status, message)
}

fn webhook_answer(state: &ServerState, headers: &HeaderMap, body: &Bytes) -> (StatusCode, String) {
    let Some(secret) = &state.webhook_secret else {
        return (StatusCode::NOT_FOUND, "webhooks are not configured".into());
    };
    let signature = headers.get("x-hub-signature-256").and_then(|v| v.to_str().ok());
    if !webhook::signature_is_valid(secret, body, signature) {
        warn!("webhook refused: missing or wrong X-Hub-Signature-256");
        return (StatusCode::UNAUTHORIZED, "bad signature".into());
    }
    // Checked after the signature, so a forged delivery cannot burn an id.
    if state.replayed(headers) {
        info!("webhook: a delivery seen before; ignored");
        return (StatusCode::OK, "duplicate delivery ignored".into());
    }
    let event = headers
        .get("x-github-event")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match event {
        "ping" => (StatusCode::OK, "pong".into()),
        "push" => match PushEvent::parse(body) {
            Ok(push) if push.is_for_branch(&state.branch) => {
                info!(
                    commit = push.after.as_deref().unwrap_or_default(),
                    "push webhook: syncing"
                );
                // A full queue refuses it, and its next burst reads the head anyway.
                let _ = state.triggers.try_send(Trigger::Webhook);
                (StatusCode::ACCEPTED, "sync triggered".into())
            }
            Ok(push) => (
                StatusCode::OK,
                format!("ignored: {} is not the tracked branch", push.git_ref),
            ),
            Err(message) => (StatusCode::BAD_REQUEST, message),
        },
        // A comment or review may carry a `/gitcanary` command or an approval:
        // look at the open releases now rather than at the next poll.
        "issue_comment" | "pull_request_review" | "pull_request" => {
            let Ok(payload) = serde_json::from_slice::<serde_json::Value>(body) else {
                return (StatusCode::BAD_REQUEST, format!("malformed {event} event"));
            };
            if !may_decide(event, &payload) {
                return (StatusCode::OK, "nothing for a release in it".into());
            }
            let _ = state.triggers.try_send(Trigger::GitHubEvent);
            (StatusCode::ACCEPTED, "releases will be looked at".into())
        }
        other => (StatusCode::OK, format!("ignored event {other:?}")),
    }
}

/// Whether a GitHub event can pass, hold or abort a release, so that it is
/// worth a look at the gates (each look costs GitHub requests): a comment
/// that names `/gitcanary`, or a review, a merge or a close of one of
/// gitcanary's promotion pull requests. Any other comment or pull request
/// on a busy repository wakes nothing; the poll catches a miss.
fn may_decide(event: &str, payload: &serde_json::Value) -> bool {
    let gate = || {
        payload["pull_request"]["head"]["ref"]
            .as_str()
            .is_some_and(|head| head.starts_with(crate::github::gate::BRANCH_PREFIX))
    };
    match event {
        "issue_comment" => payload["comment"]["body"]
            .as_str()
            .is_some_and(|body| body.contains("/gitcanary")),
        "pull_request_review" | "pull_request" => gate(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn post(addr: SocketAddr, event: &str, body: &[u8], signature: &str) -> u16 {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let head = format!(
            "POST /webhook HTTP/1.1\r\nHost: test\r\nConnection: close\r\nX-GitHub-Event: {event}\r\nX-Hub-Signature-256: {signature}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        stream.write_all(body).await.expect("write");
        status_of(&mut stream).await
    }

    fn test_state() -> (ServerState, crate::agent::TriggerQueue) {
        let (triggers, queue) = crate::agent::trigger_channel();
        let state = ServerState {
            webhook_secret: Some(Arc::from(&b"s3cret"[..])),
            branch: "main".into(),
            triggers,
            ready: Arc::new(AtomicBool::new(true)),
            metrics: Arc::new(Metrics::default()),
            deliveries: Arc::default(),
            webhook_permits: webhook_permits(),
        };
        (state, queue)
    }

    async fn status_of(stream: &mut tokio::net::TcpStream) -> u16 {
        use tokio::io::AsyncReadExt;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn slow_and_flooding_webhook_clients_are_bounded_and_the_probes_still_answer() {
        use tokio::io::AsyncWriteExt;
        let (state, _queue) = test_state();
        let state_permits = state.webhook_permits.clone();
        // Every client here is one address: the per-peer share is not what is tested.
        let limits = ConnectionLimits {
            max_per_peer: 256,
            ..ConnectionLimits::default()
        };
        let addr = serve_with("127.0.0.1:0".parse().expect("addr"), router(state, true), limits)
            .await
            .expect("serves");
        // Clients that promise a body and never send it hold every permit.
        let mut slow = Vec::new();
        for _ in 0..MAX_CONCURRENT_REQUESTS {
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let head = "POST /webhook HTTP/1.1\r\nHost: test\r\nConnection: close\r\nX-GitHub-Event: push\r\nContent-Length: 1000\r\n\r\n{";
            stream.write_all(head.as_bytes()).await.expect("write");
            slow.push(stream);
        }
        // Once the server holds them all, the next one finds no permit.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state_permits.available_permits() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            state_permits.available_permits(),
            0,
            "the slow clients hold every permit"
        );
        let started = std::time::Instant::now();
        assert_eq!(
            post(addr, "ping", b"{}", "sha256=00").await,
            503,
            "one too many is refused at once"
        );
        assert!(started.elapsed() < REQUEST_TIMEOUT);
        let mut probe = tokio::net::TcpStream::connect(addr).await.expect("connect");
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        assert_eq!(status_of(&mut probe).await, 200, "the probes are not counted");
        // The slow ones are cut off at the deadline.
        for stream in &mut slow {
            assert_eq!(status_of(stream).await, 408);
        }
        assert!(started.elapsed() < REQUEST_TIMEOUT * 2);
    }

    #[tokio::test]
    async fn a_signed_comment_event_wakes_the_agent_and_a_forged_one_does_not() {
        let (state, mut queue) = test_state();
        let metrics = state.metrics.clone();
        let addr = serve("127.0.0.1:0".parse().expect("addr"), router(state, true))
            .await
            .expect("serves");
        let body = br#"{"action":"created","comment":{"id":1,"body":"/gitcanary promote","user":{"login":"alice"}},"issue":{"number":7}}"#;
        let forged = webhook::sign(b"wrong", body);
        assert_eq!(post(addr, "issue_comment", body, &forged).await, 401);
        assert!(queue.try_recv().is_err(), "a refused event wakes nothing");
        let signed = webhook::sign(b"s3cret", body);
        assert_eq!(post(addr, "issue_comment", body, &signed).await, 202);
        assert_eq!(queue.recv().await, Some(Trigger::GitHubEvent));
        // A comment that names no command wakes nothing.
        let chatter = br#"{"action":"created","comment":{"id":2,"body":"looks good","user":{"login":"alice"}},"issue":{"number":7}}"#;
        assert_eq!(
            post(addr, "issue_comment", chatter, &webhook::sign(b"s3cret", chatter)).await,
            200
        );
        let review =
            br#"{"action":"submitted","pull_request":{"number":8,"head":{"ref":"gitcanary/promote/ns/web/abc-1"}}}"#;
        assert_eq!(
            post(addr, "pull_request_review", review, &webhook::sign(b"s3cret", review)).await,
            202
        );
        let other = br#"{"action":"submitted","pull_request":{"number":9,"head":{"ref":"feature"}}}"#;
        assert_eq!(
            post(addr, "pull_request_review", other, &webhook::sign(b"s3cret", other)).await,
            200
        );
        assert_eq!(queue.recv().await, Some(Trigger::GitHubEvent));
        assert!(queue.try_recv().is_err(), "only the gate's review woke the agent");
        let junk = b"{not json";
        assert_eq!(
            post(addr, "issue_comment", junk, &webhook::sign(b"s3cret", junk)).await,
            400
        );
        let text = metrics.render();
        for line in [
            "gitcanary_webhook_deliveries_total{event=\"unverified\",outcome=\"refused\"} 1",
            "gitcanary_webhook_deliveries_total{event=\"issue_comment\",outcome=\"acted\"} 1",
            "gitcanary_webhook_deliveries_total{event=\"issue_comment\",outcome=\"ignored\"} 1",
            "gitcanary_webhook_deliveries_total{event=\"issue_comment\",outcome=\"malformed\"} 1",
            "gitcanary_webhook_deliveries_total{event=\"pull_request_review\",outcome=\"acted\"} 1",
            "gitcanary_webhook_deliveries_total{event=\"pull_request_review\",outcome=\"ignored\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    async fn closed_within(stream: &mut tokio::net::TcpStream, limit: std::time::Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buffer = Vec::new();
        matches!(
            tokio::time::timeout(limit, stream.read_to_end(&mut buffer)).await,
            Ok(Ok(_)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn silent_idle_and_surplus_connections_are_closed() {
        use tokio::io::AsyncWriteExt;
        let (state, _queue) = test_state();
        let limits = ConnectionLimits {
            max_open: 2,
            max_per_peer: 2,
            header_timeout: std::time::Duration::from_millis(300),
            max_age: std::time::Duration::from_millis(1500),
        };
        let addr = serve_with("127.0.0.1:0".parse().expect("addr"), router(state, true), limits)
            .await
            .expect("serves");
        let patience = std::time::Duration::from_secs(10);
        // A client that connects and never sends its headers is cut off.
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        silent
            .write_all(b"GET /healthz HTTP/1.1\r\nHost:")
            .await
            .expect("write");
        assert!(closed_within(&mut silent, patience).await, "a slow header is cut off");

        // A keep-alive connection left idle is closed at its maximum age.
        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .expect("write");
        assert!(closed_within(&mut idle, patience).await, "an idle connection is closed");

        // Past the cap, a connection is closed at once; the held ones are not.
        let mut held = Vec::new();
        // The closed connections' slots are given back as their tasks end:
        // a connection refused meanwhile is tried again.
        for _ in 0..100 {
            if held.len() == 2 {
                break;
            }
            use tokio::io::AsyncReadExt;
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").await;
            let mut first = [0u8; 12];
            match stream.read_exact(&mut first).await {
                Ok(_) if &first == b"HTTP/1.1 200" => held.push(stream),
                _ => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
        assert_eq!(held.len(), 2, "two connections are served");
        let mut surplus = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _ = surplus.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").await;
        assert!(
            closed_within(&mut surplus, limits.max_age / 2).await,
            "one over the cap is closed before the held ones age out"
        );
    }

    #[tokio::test]
    async fn metrics_can_have_a_listener_of_their_own() {
        let (state, _queue) = test_state();
        let webhook = serve("127.0.0.1:0".parse().expect("addr"), router(state.clone(), false))
            .await
            .expect("serves");
        let metrics = serve("127.0.0.1:0".parse().expect("addr"), metrics_router(state))
            .await
            .expect("serves");
        let get = |addr: SocketAddr, path: &'static str| async move {
            use tokio::io::AsyncWriteExt;
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.expect("write");
            status_of(&mut stream).await
        };
        assert_eq!(get(webhook, "/metrics").await, 404, "not beside the webhook");
        assert_eq!(get(webhook, "/healthz").await, 200);
        assert_eq!(get(metrics, "/metrics").await, 200);
        assert_eq!(get(metrics, "/webhook").await, 404, "nothing else beside the metrics");
    }

    #[test]
    fn one_peer_holds_at_most_its_share_of_connections() {
        let counts = Arc::new(PeerCounts::default());
        let (a, b): (std::net::IpAddr, std::net::IpAddr) =
            ("127.0.0.1".parse().expect("ip"), "127.0.0.2".parse().expect("ip"));
        let first = PeerCounts::hold(&counts, a, 2).expect("a slot");
        let _second = PeerCounts::hold(&counts, a, 2).expect("a slot");
        assert!(PeerCounts::hold(&counts, a, 2).is_none(), "a's share is used up");
        assert!(PeerCounts::hold(&counts, b, 2).is_some(), "b still gets one");
        drop(first);
        assert!(
            PeerCounts::hold(&counts, a, 2).is_some(),
            "a slot comes back when a connection ends"
        );
    }
}
