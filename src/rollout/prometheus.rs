//! Asking Prometheus: one instant query per metric (`/api/v1/query`), over
//! plain HTTP, with a short timeout so that an unreachable server makes a
//! measurement inconclusive instead of holding up the sync.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::Value;

use super::analysis::{self, Bindings, Measurement, Outcome};
use super::api::AnalysisTemplate;

const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest error from a server kept in a status or comment.
const MAX_ERROR: usize = 200;

/// The Prometheus servers the operator started the agent with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Servers {
    /// `--prometheus-url`: for templates that name none.
    pub default: Option<String>,
    /// `--prometheus NAME=URL`.
    pub named: BTreeMap<String, String>,
    /// `--web-check NAME=URL`, for metrics read from the web.
    pub web: BTreeMap<String, super::web::Endpoint>,
}

impl Servers {
    /// The address a template's queries go to: the operator's, never Git's.
    pub fn address_for(&self, template: &AnalysisTemplate) -> Result<&str, String> {
        match &template.prometheus {
            None => self
                .default
                .as_deref()
                .ok_or_else(|| "no Prometheus address (set --prometheus-url)".to_string()),
            Some(reference) => {
                if let Some(problem) = analysis::prometheus_ref_problem(reference) {
                    return Err(problem);
                }
                self.named.get(&reference.name).map(String::as_str).ok_or_else(|| {
                    format!(
                        "the agent has no Prometheus named {:?} (start it with --prometheus {}=URL)",
                        reference.name, reference.name
                    )
                })
            }
        }
    }
}

/// The value of an instant query: `None` when it returned no series. Its
/// error is one short line: a server's text never fills a status or comment.
pub async fn query(address: &str, promql: &str) -> Result<Option<f64>, String> {
    ask(address, promql)
        .await
        .map_err(|e| super::api::bounded_line(&e, MAX_ERROR))
}

async fn ask(address: &str, promql: &str) -> Result<Option<f64>, String> {
    if !address.starts_with("http://") {
        return Err(format!("Prometheus address {address:?}: only http:// is supported"));
    }
    let encoded: String = form_urlencoded::byte_serialize(promql.as_bytes()).collect();
    let uri = format!("{}/api/v1/query?query={encoded}", address.trim_end_matches('/'));
    let request = http::Request::get(&uri)
        .header("accept", "application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("Prometheus request: {e}"))?;
    let (status, body) = super::web::exchange(request, QUERY_TIMEOUT, &format!("Prometheus at {address}")).await?;
    let answer: Value =
        serde_json::from_slice(&body).map_err(|e| format!("Prometheus answer is not JSON ({status}): {e}"))?;
    if answer["status"] != "success" {
        return Err(failure(&answer));
    }
    parse_value(&answer["data"])
}

/// A failed query's error: the server's own words, one short line.
fn failure(answer: &Value) -> String {
    let said = answer["error"].as_str().unwrap_or("the query failed");
    super::api::bounded_line(&format!("Prometheus: {said}"), MAX_ERROR)
}

/// The number in a query's `data`: a scalar, or a vector of one series.
fn parse_value(data: &Value) -> Result<Option<f64>, String> {
    let sample = match data["resultType"].as_str() {
        Some("scalar") => &data["result"],
        Some("vector") => {
            let series = data["result"].as_array().map_or(&[][..], Vec::as_slice);
            match series {
                [] => return Ok(None),
                [one] => &one["value"],
                many => return Err(format!("the query returned {} series: aggregate it to one", many.len())),
            }
        }
        other => {
            return Err(format!(
                "the query returned a {}, not a number",
                other.unwrap_or("nothing")
            ));
        }
    };
    let text = sample[1].as_str().ok_or("the sample has no value")?;
    // Prometheus writes NaN and infinities as text.
    match text {
        "NaN" => Ok(Some(f64::NAN)),
        "+Inf" => Ok(Some(f64::INFINITY)),
        "-Inf" => Ok(Some(f64::NEG_INFINITY)),
        _ => text
            .parse::<f64>()
            .map(Some)
            .map_err(|_| format!("{:?} is not a number", super::api::bounded_line(text, 40))),
    }
}

fn show(value: Option<f64>) -> String {
    value.map_or("no data".into(), |v| format!("{v}"))
}

#[derive(Clone, Copy)]
enum Source<'a> {
    Prometheus(&'a str),
    Web(&'a super::web::Endpoint, &'a super::api::WebCheck),
}

/// Measures every metric of a template once: failed when one fails,
/// inconclusive when one is (and none fails), else successful.
pub async fn measure(run: &str, template: &AnalysisTemplate, servers: &Servers, bindings: &Bindings) -> Measurement {
    let mut outcomes = Vec::new();
    let mut messages = Vec::new();
    for metric in &template.metrics {
        // Where the metric is read: a web endpoint, or the template's Prometheus.
        let source = match &metric.web {
            Some(web) => servers
                .web
                .get(&web.name)
                .map(|endpoint| Source::Web(endpoint, web))
                .ok_or_else(|| {
                    format!(
                        "the agent has no web check named {:?} (start it with --web-check {}=URL)",
                        web.name, web.name
                    )
                }),
            None => servers.address_for(template).map(Source::Prometheus),
        };
        let (outcome, message) = match (source, analysis::parse_condition(&metric.success_condition)) {
            (Err(e), _) => (Outcome::Inconclusive, e),
            (_, Err(e)) => (Outcome::Inconclusive, e),
            (Ok(source), Ok(condition)) => {
                let asked = async |bindings: &Bindings| -> Result<(String, Option<f64>), String> {
                    match source {
                        Source::Web(endpoint, web) => {
                            let path = analysis::render(&web.path, bindings)?;
                            let body = web.body.as_deref().map(|b| analysis::render(b, bindings)).transpose()?;
                            super::web::check(endpoint, web, &path, body).await
                        }
                        Source::Prometheus(address) => {
                            let promql = analysis::render(&metric.query, bindings)?;
                            let value = query(address, &promql).await?;
                            Ok((promql, value))
                        }
                    }
                };
                match asked(bindings).await {
                    Err(error) => (Outcome::Inconclusive, error),
                    Ok((promql, canary)) if condition.needs_stable() => match asked(&bindings.for_stable()).await {
                        Err(error) => (Outcome::Inconclusive, format!("stable: {error}")),
                        Ok((_, stable)) => (
                            condition.judge(canary, stable),
                            format!(
                                "canary {}, stable {} against `{}` (query: {promql})",
                                show(canary),
                                show(stable),
                                metric.success_condition
                            ),
                        ),
                    },
                    Ok((promql, canary)) => (
                        condition.judge(canary, None),
                        format!(
                            "{} against `{}` (query: {promql})",
                            show(canary),
                            metric.success_condition
                        ),
                    ),
                }
            }
        };
        let verdict = match outcome {
            Outcome::Successful => "ok",
            Outcome::Failed => "FAILED",
            Outcome::Inconclusive => "inconclusive",
        };
        messages.push(format!("{} {verdict}: {message}", metric.name));
        outcomes.push(outcome);
    }
    let outcome = if outcomes.contains(&Outcome::Failed) {
        Outcome::Failed
    } else if outcomes.contains(&Outcome::Inconclusive) || outcomes.is_empty() {
        Outcome::Inconclusive
    } else {
        Outcome::Successful
    };
    Measurement {
        release: String::new(),
        run: run.to_string(),
        template: template.name.clone(),
        outcome,
        message: messages.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_servers_error_text_is_not_copied_whole() {
        let page = format!(
            "secret-line-1\n{}\n<html>{}</html>",
            "x".repeat(10_000),
            "é".repeat(5_000)
        );
        let answer = json!({"status": "error", "error": page});
        let error = failure(&answer);
        assert!(
            error.chars().count() <= MAX_ERROR + 1,
            "{} chars",
            error.chars().count()
        );
        assert!(!error.contains('\n'), "{error}");
        let not_a_number = json!({"resultType": "scalar", "result": [1, "é".repeat(10_000)]});
        let error = parse_value(&not_a_number).expect_err("not a number");
        assert!(super::super::api::bounded_line(&error, MAX_ERROR).len() < 1024);
    }

    #[test]
    fn templates_reach_only_the_operators_servers() {
        let servers = Servers {
            default: Some("http://default:9090".into()),
            named: [("eu".to_string(), "http://eu:9090".to_string())].into(),
            web: BTreeMap::new(),
        };
        let mut template = AnalysisTemplate::default();
        assert_eq!(servers.address_for(&template), Ok("http://default:9090"));
        template.prometheus = Some(super::super::api::PrometheusRef {
            name: "eu".into(),
            address: None,
        });
        assert_eq!(servers.address_for(&template), Ok("http://eu:9090"));
        template.prometheus = Some(super::super::api::PrometheusRef {
            name: "us".into(),
            address: None,
        });
        assert!(
            servers
                .address_for(&template)
                .expect_err("unknown")
                .contains("no Prometheus named \"us\"")
        );
        template.prometheus = Some(super::super::api::PrometheusRef {
            name: "eu".into(),
            address: Some("http://attacker:80".into()),
        });
        assert!(servers.address_for(&template).is_err(), "Git's address is never asked");
    }

    #[test]
    fn answers_are_read_as_one_number_or_no_data() {
        let vector = |result: Value| json!({"resultType": "vector", "result": result});
        assert_eq!(parse_value(&vector(json!([]))), Ok(None));
        assert_eq!(
            parse_value(&vector(json!([{"metric": {}, "value": [1.7e9, "0.25"]}]))),
            Ok(Some(0.25))
        );
        assert!(
            parse_value(&vector(json!([{"metric": {}, "value": [1.7e9, "NaN"]}])))
                .expect("NaN")
                .is_some_and(f64::is_nan)
        );
        assert!(parse_value(&vector(json!([{"value": [1, "1"]}, {"value": [1, "2"]}]))).is_err());
        assert_eq!(
            parse_value(&json!({"resultType": "scalar", "result": [1.7e9, "3"]})),
            Ok(Some(3.0))
        );
        assert!(parse_value(&json!({"resultType": "matrix", "result": []})).is_err());
    }
}
