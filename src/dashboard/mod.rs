//! `gitcanary dashboard`: a page per release to keep open while it runs,
//! and a list of every Rollout, problems first. Read-only, as the identity
//! of the kubeconfig (so Kubernetes RBAC decides what it shows), and never
//! more than `kubectl get` shows: Rollouts, their pods' names and
//! readiness, Events. A release page follows the Rollout and its pods with
//! watches and sends each newer rendering to the open page (server-sent
//! events), so it changes without a reload and polls nothing. Promote and
//! abort buttons only with `--allow-actions` (`actions.rs`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::rollout::api::Rollout;
use crate::rollout::overlay::{BATCH_ID_LABEL, ROLLOUT_ID_LABEL};

mod actions;
pub mod page;

pub use actions::new_token;

use page::{BatchPod, EventLine, ReleaseView, RolloutRow};

/// What the dashboard reads and how it links.
pub struct Dashboard {
    pub cluster: Cluster,
    /// Only this namespace's Rollouts (`-n`); every namespace otherwise.
    pub namespace: Option<String>,
    /// `OWNER/REPO`: commits and promotion pull requests are linked.
    pub github_repo: Option<String>,
    /// Where the agent of this cluster keeps its records (its gate branches).
    pub records: crate::rollout::record::Records,
    /// The repository's records of every environment, when it is known.
    pub environments: Option<Arc<crate::wave::standing::StandingReader>>,
    /// With `--allow-actions`: the token the pages' forms carry.
    pub actions: Option<String>,
    /// Listening on a loopback address: only requests naming a loopback
    /// host are served, so a name rebound to 127.0.0.1 reads nothing.
    pub loopback: bool,
    /// Live pages open at once.
    pub streams: Arc<tokio::sync::Semaphore>,
}

/// Live pages open at once at most: each holds two watches.
pub const MAX_STREAMS: usize = 32;

type Shared = Arc<Dashboard>;

/// Whether a `Host` header names this machine's loopback.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

/// Refuses a request for another host (DNS rebinding) on a loopback
/// listener; no page may be framed by another site, nor run a script
/// but its own.
async fn guard(
    State(dashboard): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok());
    if dashboard.loopback && !host.is_some_and(loopback_host) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard answers for localhost only",
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert("x-frame-options", axum::http::HeaderValue::from_static("DENY"));
    headers.insert(
        "content-security-policy",
        axum::http::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    response
}

/// A namespace and name as Kubernetes spells them (DNS-1123): nothing
/// else reaches the API server or a page.
fn valid_names(namespace: &str, name: &str) -> bool {
    let label = |s: &str, max: usize| {
        (1..=max).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !s.starts_with(['-', '.'])
            && !s.ends_with(['-', '.'])
    };
    label(namespace, 63) && !namespace.contains('.') && label(name, 253)
}

/// The dashboard's routes.
pub fn router(dashboard: Shared) -> Router {
    Router::new()
        .route("/", get(list_page))
        .route(
            "/live.js",
            get(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "text/javascript")],
                    page::LIVE_SCRIPT,
                )
            }),
        )
        .route("/rollouts/{namespace}/{name}", get(release_page))
        .route("/rollouts/{namespace}/{name}/live", get(live))
        .route(
            "/rollouts/{namespace}/{name}/{action}",
            axum::routing::post(actions::act),
        )
        .layer(axum::middleware::from_fn_with_state(dashboard.clone(), guard))
        .with_state(dashboard)
}

/// Serves until the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, dashboard: Shared) -> std::io::Result<()> {
    axum::serve(listener, router(dashboard)).await
}

fn failed(what: &str, error: impl std::fmt::Display) -> Response {
    let body = page::document(
        "gitcanary",
        &format!(
            "<main><p>{}: {}</p></main>",
            page::escape(what),
            page::escape(&error.to_string())
        ),
        false,
    );
    (StatusCode::BAD_GATEWAY, Html(body)).into_response()
}

async fn list_page(State(dashboard): State<Shared>) -> Response {
    let rollouts: Api<Rollout> = match &dashboard.namespace {
        Some(namespace) => Api::namespaced(dashboard.cluster.client.clone(), namespace),
        None => Api::all(dashboard.cluster.client.clone()),
    };
    let list = match rollouts.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(error) => return failed("listing Rollouts", error),
    };
    let rows: Vec<RolloutRow> = list
        .items
        .into_iter()
        .map(|r| RolloutRow {
            namespace: r.metadata.namespace.clone().unwrap_or_default(),
            name: r.metadata.name.clone().unwrap_or_default(),
            created: r
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            status: r.status.unwrap_or_default(),
        })
        .collect();
    Html(page::document("Rollouts", &page::list(&rows), false)).into_response()
}

/// A Rollout this dashboard may show: well named, in its namespace.
pub(crate) fn allowed(dashboard: &Dashboard, namespace: &str, name: &str) -> bool {
    valid_names(namespace, name) && dashboard.namespace.as_deref().is_none_or(|n| n == namespace)
}

async fn release_page(State(dashboard): State<Shared>, Path((namespace, name)): Path<(String, String)>) -> Response {
    if !allowed(&dashboard, &namespace, &name) {
        return (StatusCode::NOT_FOUND, "not a Rollout this dashboard shows").into_response();
    }
    match view(&dashboard, &namespace, &name).await {
        Ok(Some(view)) => {
            let title = format!("{namespace}/{name}");
            Html(page::document(&title, &page::release(&view), true)).into_response()
        }
        Ok(None) => (StatusCode::NOT_FOUND, "no such Rollout").into_response(),
        Err(error) => failed("reading the Rollout", error),
    }
}

/// Everything the release page shows of one Rollout, read now.
async fn view(dashboard: &Dashboard, namespace: &str, name: &str) -> Result<Option<ReleaseView>, kube::Error> {
    let client = dashboard.cluster.client.clone();
    let Some(rollout) = Api::<Rollout>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    let status = rollout.status.clone().unwrap_or_default();
    let workload = &rollout.spec.workload_ref;
    let (stable, canary_name) = (
        workload_value(
            &dashboard.cluster,
            namespace,
            &workload.api_version,
            &workload.kind,
            &workload.name,
        )
        .await,
        rollout.spec.strategy.canary.canary_name(&workload.name),
    );
    let canary = workload_value(
        &dashboard.cluster,
        namespace,
        &workload.api_version,
        &workload.kind,
        &canary_name,
    )
    .await;
    let pods = batch_pods(&dashboard.cluster, namespace, stable.as_ref(), &status.rollout_id).await;
    let events = rollout_events(dashboard, namespace, name).await;
    let environments = standings(dashboard, namespace, name).await;
    Ok(Some(ReleaseView {
        namespace: namespace.to_string(),
        name: name.to_string(),
        stable_images: images(stable.as_ref()),
        canary_images: images(canary.as_ref()),
        spec: rollout.spec,
        status,
        pods,
        events,
        github_repo: dashboard.github_repo.clone(),
        records: dashboard.records.clone(),
        environments,
        actions: dashboard.actions.clone(),
    }))
}

/// The Rollout's release in every environment; none when the repository
/// is not known or cannot be read (logged).
async fn standings(dashboard: &Dashboard, namespace: &str, name: &str) -> Vec<crate::wave::standing::Standing> {
    let Some(reader) = dashboard.environments.clone() else {
        return Vec::new();
    };
    let (namespace, name) = (namespace.to_string(), name.to_string());
    let read = crate::blocking("reading the environments' records", move || {
        reader.read(&namespace, &name)
    })
    .await;
    match read.and_then(|read| read) {
        Ok(standings) => standings,
        Err(error) => {
            tracing::warn!(%error, "the environments' records cannot be read");
            Vec::new()
        }
    }
}

async fn workload_value(
    cluster: &Cluster,
    namespace: &str,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Option<Value> {
    let resolved = cluster.resolve(api_version, kind).await?;
    let api: Api<kube::api::DynamicObject> = cluster.api(&resolved, Some(namespace));
    let object = api.get_opt(name).await.ok()??;
    serde_json::to_value(object).ok()
}

fn images(workload: Option<&Value>) -> Vec<String> {
    workload
        .and_then(|w| w["spec"]["template"]["spec"]["containers"].as_array())
        .map(|c| {
            c.iter()
                .filter_map(|c| c["image"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The canary pods of a Rollout's running release, by batch.
pub async fn release_pods(cluster: &Cluster, rollout: &Rollout) -> Vec<BatchPod> {
    let namespace = rollout.metadata.namespace.clone().unwrap_or_default();
    let workload = &rollout.spec.workload_ref;
    let rollout_id = rollout.status.as_ref().map_or("", |s| s.rollout_id.as_str());
    let stable = workload_value(
        cluster,
        &namespace,
        &workload.api_version,
        &workload.kind,
        &workload.name,
    )
    .await;
    batch_pods(cluster, &namespace, stable.as_ref(), rollout_id).await
}

/// The release's canary pods, by batch: the workload's pods labelled with
/// the release's id and a batch.
async fn batch_pods(cluster: &Cluster, namespace: &str, workload: Option<&Value>, rollout_id: &str) -> Vec<BatchPod> {
    if rollout_id.is_empty() {
        return Vec::new();
    }
    let mut selector: Vec<String> = workload
        .and_then(|w| w["spec"]["selector"]["matchLabels"].as_object())
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some(format!("{k}={}", v.as_str()?)))
                .collect()
        })
        .unwrap_or_default();
    selector.push(format!("{ROLLOUT_ID_LABEL}={rollout_id}"));
    selector.push(BATCH_ID_LABEL.to_string());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let Ok(list) = pods.list(&ListParams::default().labels(&selector.join(","))).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .map(|pod| {
            let status = pod.status.unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            BatchPod {
                batch: pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(BATCH_ID_LABEL).cloned())
                    .unwrap_or_default(),
                name: pod.metadata.name.unwrap_or_default(),
                ready,
                restarts: status
                    .container_statuses
                    .iter()
                    .flatten()
                    .map(|c| c.restart_count)
                    .sum(),
            }
        })
        .collect()
}

async fn rollout_events(dashboard: &Dashboard, namespace: &str, name: &str) -> Vec<EventLine> {
    let events: Api<Event> = Api::namespaced(dashboard.cluster.client.clone(), namespace);
    let selector = format!("regarding.kind=Rollout,regarding.name={name}");
    let Ok(list) = events.list(&ListParams::default().fields(&selector)).await else {
        return Vec::new();
    };
    let mut lines: Vec<EventLine> = list
        .items
        .into_iter()
        .map(|e| EventLine {
            time: e
                .event_time
                .map(|t| t.0.to_string())
                .or_else(|| e.metadata.creation_timestamp.map(|t| t.0.to_string()))
                .unwrap_or_default(),
            warning: e.type_.as_deref() == Some("Warning"),
            reason: e.reason.unwrap_or_default(),
            note: e.note.unwrap_or_default(),
        })
        .collect();
    lines.sort_by(|a, b| a.time.cmp(&b.time));
    lines
}

/// Newer renderings of a release page, each sent when a watch of the
/// Rollout or of its namespace's batch pods saw a change and the page
/// reads differently; a burst of changes is rendered once.
async fn live(State(dashboard): State<Shared>, Path((namespace, name)): Path<(String, String)>) -> Response {
    if !allowed(&dashboard, &namespace, &name) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Ok(permit) = dashboard.streams.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many live pages open").into_response();
    };
    // One that cannot be read (absent, or RBAC says no) gets no watches.
    if !matches!(view(&dashboard, &namespace, &name).await, Ok(Some(_))) {
        return StatusCode::NOT_FOUND.into_response();
    }
    Sse::new(renderings(dashboard, namespace, name, permit))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Changes after one are gathered this long before the page is rendered.
const SETTLE: Duration = Duration::from_millis(100);

fn renderings(
    dashboard: Shared,
    namespace: String,
    name: String,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    use kube::runtime::WatchStreamExt;
    let client = dashboard.cluster.client.clone();
    let rollouts = watcher(
        Api::<Rollout>::namespaced(client.clone(), &namespace),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff()
    .map(|_| ());
    let pods = watcher(
        Api::<Pod>::namespaced(client, &namespace),
        watcher::Config::default().labels(BATCH_ID_LABEL),
    )
    .default_backoff()
    .map(|_| ());
    let changes = futures::stream::select(rollouts, pods).boxed();
    futures::stream::unfold(
        (changes, String::new(), permit),
        move |(mut changes, mut last, permit)| {
            let (dashboard, namespace, name) = (dashboard.clone(), namespace.clone(), name.clone());
            async move {
                loop {
                    changes.next().await?;
                    tokio::time::sleep(SETTLE).await;
                    while let Some(Some(())) = changes.next().now_or_never() {}
                    let Ok(Some(view)) = view(&dashboard, &namespace, &name).await else {
                        continue;
                    };
                    let rendering = page::release(&view);
                    if rendering != last {
                        last = rendering.clone();
                        let event = SseEvent::default().event("page").data(rendering);
                        return Some((Ok(event), (changes, last, permit)));
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_dashboard_answers_for_loopback_names_only() {
        for host in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "localhost"] {
            assert!(loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "localhost.evil.example:80",
            "",
        ] {
            assert!(!loopback_host(host), "{host}");
        }
    }

    #[test]
    fn only_kubernetes_names_reach_the_api_server_or_a_page() {
        assert!(valid_names("shop", "web"));
        assert!(valid_names("shop", "web.v2"));
        for (namespace, name) in [
            ("shop", "web#</script><script>alert(1)</script>"),
            ("shop", "Web"),
            ("sh.op", "web"),
            ("", "web"),
            ("shop", "-web"),
            ("shop", "web/x"),
        ] {
            assert!(!valid_names(namespace, name), "{namespace}/{name}");
        }
    }
}
