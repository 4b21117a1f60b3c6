//! Web checks: an analysis metric read from an HTTP endpoint the operator
//! named at agent start (`--web-check NAME=URL`, its headers from a file),
//! never an address from Git. A GET (or a POST with the metric's body) of a
//! path under the endpoint; the number or boolean at a JSON path of the
//! answer is judged as a Prometheus value is. No answer, an error status or
//! nothing at the path is inconclusive, as an unreachable Prometheus is.

use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use sha2::Sha256;

use super::api::WebCheck;

pub use super::web_paths::{Segment, parse_json_path, path_problem, value_at};
pub use crate::model::{HookEndpoint, WebEndpoint as Endpoint};

const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Answers larger than this are refused: a check answers with a few
/// fields, a Prometheus query with one number.
const MAX_ANSWER: usize = 1 << 20;
const MAX_ERROR: usize = 200;

/// `Header: value` lines (a mounted Secret), blank lines and `#` comments skipped.
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut headers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("line {}: not `Header: value`", n + 1))?;
        let (name, value) = (name.trim(), value.trim());
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() || http::HeaderValue::from_str(value).is_err() {
            return Err(format!("line {}: not a valid header", n + 1));
        }
        headers.push((name.to_string(), value.to_string()));
    }
    Ok(headers)
}

/// Asks the endpoint for one metric at `path` (rendered, with `body` for a
/// POST): what was asked, as a message may say it (the check's name and
/// path: the operator's URL stays out of Git and comments), and the value.
pub async fn check(
    endpoint: &Endpoint,
    web: &WebCheck,
    path: &str,
    body: Option<String>,
) -> Result<(String, Option<f64>), String> {
    let asked = format!("web check {} {path}", web.name);
    // Checked again once filled in: an empty variable could make `..`.
    if let Some(problem) = path_problem(path) {
        return Err(format!("{asked}: {problem}"));
    }
    let url = format!("{}{path}", endpoint.url.trim_end_matches('/'));
    let value = ask(endpoint, web, &url, body)
        .await
        .map_err(|e| super::api::bounded_line(&e.replace(&url, &asked), MAX_ERROR))?;
    Ok((asked, value))
}

async fn ask(endpoint: &Endpoint, web: &WebCheck, url: &str, body: Option<String>) -> Result<Option<f64>, String> {
    let json_path = parse_json_path(&web.json_path)?;
    let post = web.method.as_deref() == Some("POST");
    let body = match body {
        Some(body) if post => Bytes::from(body),
        _ => Bytes::new(),
    };
    let mut request = http::Request::builder()
        .method(if post { http::Method::POST } else { http::Method::GET })
        .uri(url)
        .header("accept", "application/json");
    if post {
        request = request.header("content-type", "application/json");
    }
    for (name, value) in &endpoint.headers {
        request = request.header(name, value);
    }
    let request = request.body(Full::new(body)).map_err(|e| format!("request: {e}"))?;
    let (status, body) = exchange(request, CHECK_TIMEOUT, url).await?;
    if !status.is_success() {
        return Err(format!("{url} answered {status}"));
    }
    let answer: Value = serde_json::from_slice(&body).map_err(|e| format!("{url}: the answer is not JSON: {e}"))?;
    value_at(&answer, &json_path)
}

/// What a hook's call came to, each with the line that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookAnswer {
    /// A 2xx.
    Passed(String),
    /// Another status, with the first line of the answer.
    Refused(String),
    /// No answer.
    Unanswered(String),
}

/// Calls a hook: a POST of `body`, signed, to `path` under the operator's
/// endpoint. Messages name `name` and the path, never the URL.
pub async fn call_hook(name: &str, endpoint: &HookEndpoint, path: &str, body: &Value) -> HookAnswer {
    let asked = format!("hook {name} {}", if path.is_empty() { "/" } else { path });
    if let Some(problem) = (!path.is_empty()).then(|| path_problem(path)).flatten() {
        return HookAnswer::Unanswered(format!("{asked}: {problem}"));
    }
    let url = format!("{}{path}", endpoint.url.trim_end_matches('/'));
    let body = Bytes::from(body.to_string());
    let request = http::Request::post(&url)
        .header("content-type", "application/json")
        .header("user-agent", "gitcanary")
        .header("x-gitcanary-signature-256", signature(&endpoint.secret, &body))
        .body(Full::new(body));
    let request = match request {
        Ok(request) => request,
        Err(e) => return HookAnswer::Unanswered(format!("{asked}: request: {e}")),
    };
    match exchange(request, CHECK_TIMEOUT, &asked).await {
        Err(e) => HookAnswer::Unanswered(super::api::bounded_line(&e.replace(&url, &asked), MAX_ERROR)),
        Ok((status, _)) if status.is_success() => HookAnswer::Passed(format!("{asked} answered {status}")),
        Ok((status, answer)) => {
            let text = String::from_utf8_lossy(&answer);
            let first = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
            let first = super::api::bounded_line(first, MAX_ERROR);
            let said = if first.is_empty() {
                String::new()
            } else {
                format!(": {first}")
            };
            HookAnswer::Refused(format!("{asked} answered {status}{said}"))
        }
    }
}

/// Sends `request` over plain HTTP and reads the answer, each within
/// `timeout` and the answer at most [`MAX_ANSWER`] bytes: a server that is
/// slow, silent or too talkative delays or fills nothing. Errors name `who`.
pub(super) async fn exchange(
    request: http::Request<Full<Bytes>>,
    timeout: Duration,
    who: &str,
) -> Result<(http::StatusCode, Bytes), String> {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = tokio::time::timeout(timeout, client.request(request))
        .await
        .map_err(|_| format!("{who} did not answer within {}s", timeout.as_secs()))?
        .map_err(|e| format!("{who} unreachable: {e}"))?;
    let status = response.status();
    let body = tokio::time::timeout(
        timeout,
        http_body_util::Limited::new(response.into_body(), MAX_ANSWER).collect(),
    )
    .await
    .map_err(|_| format!("{who}: the answer timed out"))?
    .map_err(|e| format!("{who}: the answer: {e}"))?
    .to_bytes();
    Ok((status, body))
}

/// `sha256=<hex>`: the HMAC-SHA256 of the body with the receiver's or hook's secret,
/// as GitHub signs its webhooks (`X-Gitcanary-Signature-256`).
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_json_path_reads_a_number_or_a_boolean_and_nothing_else() {
        let answer = json!({"data": {"checks": [{"ok": true, "rate": 0.25, "n": "7", "none": null, "list": []}]}});
        let at = |path: &str| value_at(&answer, &parse_json_path(path).unwrap());
        assert_eq!(at("$.data.checks[0].ok"), Ok(Some(1.0)));
        assert_eq!(at("$.data.checks[0].rate"), Ok(Some(0.25)));
        assert_eq!(at("$.data.checks[0].n"), Ok(Some(7.0)));
        assert_eq!(at("$.data.checks[0].none"), Ok(None), "null is no data");
        assert_eq!(at("$.data.checks[3].ok"), Ok(None), "nothing there is no data");
        assert!(at("$.data.checks[0].list").is_err());
        assert!(at("$.data").is_err());
        for bad in ["data.x", "$..x", "$.a[x]", "$.a]", "$.a[0"] {
            assert!(parse_json_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_path_from_git_stays_under_the_operators_url() {
        assert_eq!(path_problem("/score/{{rolloutID}}?window=5m"), None);
        for bad in [
            "score",
            "/../admin",
            "//evil.example/x",
            "/a#frag",
            "/a b",
            "/a@b",
            "/x\ny",
            "/%2e%2e/admin",
            "/a%2fb",
        ] {
            assert!(path_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn header_files_are_lines_of_name_and_value() {
        let headers = parse_headers("# a token\nAuthorization: Bearer abc\n\nX-Team: shop\n").unwrap();
        assert_eq!(
            headers,
            [
                ("Authorization".to_string(), "Bearer abc".to_string()),
                ("X-Team".to_string(), "shop".to_string())
            ]
        );
        assert!(parse_headers("no colon").unwrap_err().contains("line 1"));
        assert!(parse_headers("Bad Name: x").is_err());
        let endpoint = Endpoint {
            url: "http://checks".into(),
            headers,
        };
        assert!(
            !format!("{endpoint:?}").contains("Bearer"),
            "credentials never in a log"
        );
    }
}
