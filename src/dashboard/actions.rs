//! Promote and abort from the release page, only with `gitcanary dashboard
//! --allow-actions`. Each is sent as the kubeconfig's identity (Kubernetes
//! RBAC decides, as for `gitcanary promote`), names the release and step
//! the page showed (a page left open never passes a later pause), and
//! carries the page's token: another site's form cannot post one.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::{Shared, page};
use crate::rollout::cli::{DecidedOn, Signal, send_signal_token};

/// What a page's form sends.
#[derive(Deserialize)]
pub struct Decision {
    csrf: String,
    /// The release's commit and step the page showed.
    commit: String,
    step: u32,
}

/// A token for the forms of this process's pages, from the system's randomness.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Equal without telling, by its timing, how much of a guess was right.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether the request comes from one of this dashboard's own pages: the
/// browser's own say (`Sec-Fetch-Site`, `Origin`) where it gives one.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let site_ok = text("sec-fetch-site").is_none_or(|site| site == "same-origin");
    let origin_ok = match (text(header::ORIGIN.as_str()), text(header::HOST.as_str())) {
        (Some(origin), Some(host)) => origin.split_once("://").is_some_and(|(_, rest)| rest == host),
        (Some(_), None) => false,
        (None, _) => true,
    };
    site_ok && origin_ok
}

pub async fn act(
    State(dashboard): State<Shared>,
    Path((namespace, name, action)): Path<(String, String, String)>,
    headers: HeaderMap,
    Form(decision): Form<Decision>,
) -> Response {
    let Some(token) = dashboard.actions.as_deref() else {
        return (StatusCode::NOT_FOUND, "this dashboard is read-only").into_response();
    };
    if !super::allowed(&dashboard, &namespace, &name) {
        return StatusCode::NOT_FOUND.into_response();
    }
    if !same(&decision.csrf, token) || !same_origin(&headers) {
        return (
            StatusCode::FORBIDDEN,
            "not from this dashboard's page: nothing was sent",
        )
            .into_response();
    }
    let signal = match action.as_str() {
        "promote" => Signal::Promote,
        "abort" => Signal::Abort,
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let decided = DecidedOn {
        canary_commit: &decision.commit,
        step: (signal == Signal::Promote).then_some(decision.step),
    };
    let by = format!("the dashboard at {}", jiff::Timestamp::now());
    let page_url = format!("/rollouts/{namespace}/{name}");
    match send_signal_token(
        &dashboard.cluster.writer(None),
        &namespace,
        &name,
        signal,
        &by,
        Some(decided),
    )
    .await
    {
        Ok(()) => (StatusCode::SEE_OTHER, [(header::LOCATION, page_url)]).into_response(),
        Err(error) => {
            let main = format!(
                "<main><p id=refused>{}</p><p><a href=\"{}\">Back to the release</a></p></main>",
                page::escape(&error.to_string()),
                page::escape(&page_url)
            );
            (StatusCode::CONFLICT, Html(page::document("refused", &main, false))).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dashboards_own_pages_may_post() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        assert!(
            same_origin(&headers(&[("host", "127.0.0.1:8080")])),
            "a client that says nothing"
        );
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "https://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
        assert_eq!(new_token().unwrap().len(), 64);
        assert_ne!(new_token().unwrap(), new_token().unwrap());
    }
}
