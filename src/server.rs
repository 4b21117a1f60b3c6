//! The agent's HTTP endpoints: GitHub webhooks, health and readiness.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::agent::Trigger;
use crate::source::webhook::{self, PushEvent};
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct ServerState {
    pub webhook_secret: Option<Arc<[u8]>>,
    pub branch: String,
    pub triggers: mpsc::Sender<Trigger>,
    /// Set once the first sync has finished.
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/webhook", post(github_webhook))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(webhook::MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves until the listener fails; returns the bound address at once.
pub async fn serve(addr: SocketAddr, state: ServerState) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router(state)).await {
            warn!(%error, "HTTP server stopped");
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

async fn github_webhook(State(state): State<ServerState>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let Some(secret) = &state.webhook_secret else {
        return (StatusCode::NOT_FOUND, "webhooks are not configured".into());
    };
    let signature = headers.get("x-hub-signature-256").and_then(|v| v.to_str().ok());
    if !webhook::signature_is_valid(secret, &body, signature) {
        warn!("webhook refused: missing or wrong X-Hub-Signature-256");
        return (StatusCode::UNAUTHORIZED, "bad signature".into());
    }
    let event = headers
        .get("x-github-event")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match event {
        "ping" => (StatusCode::OK, "pong".into()),
        "push" => match PushEvent::parse(&body) {
            Ok(push) if push.is_for_branch(&state.branch) => {
                info!(
                    commit = push.after.as_deref().unwrap_or_default(),
                    "push webhook: syncing"
                );
                // A full queue already holds a sync that will see this push.
                let _ = state.triggers.try_send(Trigger::Webhook);
                (StatusCode::ACCEPTED, "sync triggered".into())
            }
            Ok(push) => (
                StatusCode::OK,
                format!("ignored: {} is not the tracked branch", push.git_ref),
            ),
            Err(message) => (StatusCode::BAD_REQUEST, message),
        },
        other => (StatusCode::OK, format!("ignored event {other:?}")),
    }
}
