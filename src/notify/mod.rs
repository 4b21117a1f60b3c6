//! Notifications where teams talk: each event of a release (started, a
//! step passed, waiting for a promote, promoted, failed, aborted) posted
//! once to each receiver the operator configured (Slack, Microsoft Teams,
//! a signed generic webhook). Receivers are named at agent start, their
//! URLs read from the command line or a file (a mounted Secret), never from
//! Git. Delivery runs in a task per receiver, retried with backoff: a slow
//! or failing receiver delays its own messages, never a release.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use crate::sync::SyncReport;
use crate::telemetry::Metrics;

pub mod event;

pub use event::{Event, Kind};

/// A receiver's message format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Slack,
    Teams,
    Webhook,
    /// A Rollout's `postRelease` hook: told its own releases' outcomes.
    Hook,
}

/// One receiver, as the operator named it.
#[derive(Clone)]
pub struct Receiver {
    pub name: String,
    pub format: Format,
    pub url: String,
    /// Signs a webhook's body (`X-Gitcanary-Signature-256`).
    pub secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for Receiver {
    // The URL of a chat webhook is its password: never in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("name", &self.name)
            .field("format", &self.format)
            .finish()
    }
}

/// `NAME=slack:URL`, `NAME=teams:URL` or `NAME=webhook:URL`; `URL` may be
/// `@PATH`, a file holding it (a mounted Secret). `secrets` maps a webhook's
/// name to the file of its signing secret.
pub fn parse_receiver(spec: &str, secrets: &BTreeMap<String, String>) -> Result<Receiver, String> {
    let (name, target) = spec
        .split_once('=')
        .ok_or_else(|| "--notify: write NAME=slack:URL, NAME=teams:URL or NAME=webhook:URL".to_string())?;
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(format!(
            "--notify: receiver name {name:?} is not letters, digits, - and _"
        ));
    }
    let (format, url) = target
        .split_once(':')
        .ok_or_else(|| format!("--notify {name}: write {name}=slack:URL, teams:URL or webhook:URL"))?;
    let format = match format {
        "slack" => Format::Slack,
        "teams" => Format::Teams,
        "webhook" => Format::Webhook,
        other => return Err(format!("--notify {name}: {other:?} is not slack, teams or webhook")),
    };
    let url = match url.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("--notify {name}: reading {path}: {e}"))?
            .trim()
            .to_string(),
        None => url.to_string(),
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) || url.parse::<http::Uri>().is_err() {
        return Err(format!("--notify {name}: the URL is not an http(s) URL"));
    }
    let secret = match secrets.get(name) {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| format!("--notify-secret {name}: reading {path}: {e}"))?
                .trim_ascii()
                .to_vec(),
        ),
        None => None,
    };
    if secret.as_ref().is_some_and(Vec::is_empty) {
        return Err(format!(
            "--notify-secret {name}: the secret is empty: anyone could sign with it"
        ));
    }
    if secret.is_some() && format != Format::Webhook {
        return Err(format!("--notify-secret {name}: only a webhook receiver is signed"));
    }
    Ok(Receiver {
        name: name.to_string(),
        format,
        url,
        secret,
    })
}

/// The receivers, and those told of every Rollout (`None`: all of them);
/// the others are told of the Rollouts that name them (`spec.notify`).
pub struct Routes {
    pub receivers: Vec<Receiver>,
    pub defaults: Option<BTreeSet<String>>,
}

/// Whether `receiver` is told of the releases of a Rollout that names
/// `subscribed`: a Rollout adds receivers, never takes a default away.
pub fn tells(defaults: Option<&BTreeSet<String>>, receiver: &str, subscribed: &[String]) -> bool {
    defaults.is_none_or(|d| d.contains(receiver)) || subscribed.iter().any(|s| s == receiver)
}

/// Events waiting for one receiver at most; more are dropped and counted.
const QUEUE: usize = 256;
/// Tries of one delivery, and the waits between them (doubling).
const ATTEMPTS: u32 = 5;
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// How long one delivery may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// One message for one receiver: the event, and for a hook the path it
/// is posted to and its body.
struct Delivery {
    event: Event,
    path: String,
    body: Option<serde_json::Value>,
}

/// Tells each receiver each event once, and each `postRelease` hook its
/// Rollout's outcomes.
pub struct Notifier {
    queues: Vec<(String, mpsc::Sender<Delivery>)>,
    /// Receivers told of every Rollout (`None`: all).
    defaults: Option<BTreeSet<String>>,
    /// Per `--hook` name.
    hooks: BTreeMap<String, mpsc::Sender<Delivery>>,
    /// Per Rollout, the keys of the events told (or there when first seen).
    told: Mutex<BTreeMap<(String, String), BTreeSet<String>>>,
    metrics: Arc<Metrics>,
}

impl Notifier {
    /// Starts a delivery task per receiver and per hook endpoint.
    pub fn start(
        routes: Routes,
        hooks: BTreeMap<String, crate::model::HookEndpoint>,
        metrics: Arc<Metrics>,
    ) -> Notifier {
        let client = Client::builder(TokioExecutor::new()).build(connector());
        let start = |receiver: Receiver| {
            let (send, queue) = mpsc::channel(QUEUE);
            tokio::spawn(deliver(receiver, queue, client.clone(), metrics.clone()));
            send
        };
        let Routes { receivers, defaults } = routes;
        let queues = receivers
            .into_iter()
            .map(|receiver| (receiver.name.clone(), start(receiver)))
            .collect();
        let hooks = hooks
            .into_iter()
            .map(|(name, endpoint)| {
                let receiver = Receiver {
                    name: format!("hook:{name}"),
                    format: Format::Hook,
                    url: endpoint.url,
                    secret: Some(endpoint.secret),
                };
                (name, start(receiver))
            })
            .collect();
        Notifier {
            queues,
            defaults,
            hooks,
            told: Mutex::default(),
            metrics,
        }
    }

    /// The events of the Rollouts a sync reported that no earlier report
    /// implied, queued for every receiver; never waits. A Rollout seen for
    /// the first time (the agent just started) tells nothing of its past.
    pub fn submit(&self, report: &SyncReport) {
        let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
        for rollout in report.apps.iter().flat_map(|app| &app.rollouts) {
            let key = (rollout.namespace.clone(), rollout.name.clone());
            let events = event::implied(&rollout.namespace, &rollout.name, &rollout.spec, &rollout.status);
            let first_sight = !told.contains_key(&key);
            let keys = told.entry(key).or_default();
            let started = rollout
                .status
                .step_history
                .first()
                .map_or("", |r| r.started_at.as_str());
            let release = event::release_key(&rollout.namespace, &rollout.name, &rollout.status.rollout_id, started);
            keys.retain(|k| k.starts_with(&release));
            for event in events {
                if !keys.insert(event.key.clone()) || first_sight {
                    continue;
                }
                if let Some((hook, delivery)) = post_release(rollout, &event) {
                    match self.hooks.get(&hook) {
                        Some(queue) => self.queue(&format!("hook:{hook}"), queue, delivery),
                        None => {
                            tracing::warn!(rollout = %rollout.name, %hook, "no --hook of this name: the postRelease hook is not told")
                        }
                    }
                }
                for (name, queue) in &self.queues {
                    if !tells(self.defaults.as_ref(), name, &rollout.spec.notify) {
                        continue;
                    }
                    let delivery = Delivery {
                        event: event.clone(),
                        path: String::new(),
                        body: None,
                    };
                    self.queue(name, queue, delivery);
                }
            }
        }
    }
}

impl Notifier {
    fn queue(&self, name: &str, queue: &mpsc::Sender<Delivery>, delivery: Delivery) {
        if queue.try_send(delivery).is_err() {
            self.metrics.notifications.add(name, "dropped");
        }
    }
}

/// The `postRelease` hook's call for an outcome of a release of a Rollout
/// that names one: the hook's name and what it is sent.
fn post_release(rollout: &crate::rollout::model::RolloutSummary, event: &Event) -> Option<(String, Delivery)> {
    use crate::rollout::hooks::{self, Point};
    if !matches!(event.kind, Kind::Promoted | Kind::Failed | Kind::Aborted) {
        return None;
    }
    let hook = rollout.spec.hooks.post_release.as_ref()?;
    let status = &rollout.status;
    let bindings = crate::rollout::analysis::Bindings::of_release(
        &rollout.namespace,
        &rollout.spec,
        &status.rollout_id,
        &status.canary_revision,
        &status.stable_revision,
    );
    let path = match crate::rollout::analysis::render(&hook.path, &bindings) {
        Ok(path) if path.is_empty() || crate::rollout::web::path_problem(&path).is_none() => path,
        _ => {
            tracing::warn!(rollout = %rollout.name, hook = %hook.name, "the postRelease hook's path is not valid once filled in: not told");
            return None;
        }
    };
    let cause = event
        .facts
        .iter()
        .find(|(title, _)| *title == "cause")
        .map_or("", |(_, v)| v.as_str());
    let body = hooks::body(
        Point::PostRelease,
        &rollout.name,
        &event.commit,
        &bindings,
        Some((event.kind.as_str(), cause)),
    );
    let delivery = Delivery {
        event: event.clone(),
        path,
        body: Some(body),
    };
    Some((hook.name.clone(), delivery))
}

fn connector() -> hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let roots = builder.with_native_roots().unwrap_or_else(|error| {
        tracing::warn!(%error, "no system CA certificates: https receivers cannot be reached");
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
    });
    roots.https_or_http().enable_http1().build()
}

type HttpClient = Client<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, Full<Bytes>>;

/// One receiver's deliveries, one at a time, each retried with backoff.
async fn deliver(receiver: Receiver, mut queue: mpsc::Receiver<Delivery>, client: HttpClient, metrics: Arc<Metrics>) {
    let metrics = &metrics.notifications;
    while let Some(Delivery { event, path, body }) = queue.recv().await {
        let body = body.unwrap_or_else(|| match receiver.format {
            Format::Slack => event::slack(&event),
            Format::Teams => event::teams(&event),
            Format::Webhook | Format::Hook => event::webhook(&event),
        });
        let url = if path.is_empty() {
            receiver.url.clone()
        } else {
            format!("{}{path}", receiver.url.trim_end_matches('/'))
        };
        let body = Bytes::from(body.to_string());
        let mut wait = FIRST_RETRY;
        let mut delivered = false;
        for attempt in 1..=ATTEMPTS {
            match post(&client, &receiver, &url, &event, body.clone()).await {
                Ok(()) => {
                    delivered = true;
                    break;
                }
                Err(error) if attempt < ATTEMPTS => {
                    tracing::info!(receiver = %receiver.name, event = %event.key, %error, "notification not delivered; trying again");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(error) => {
                    tracing::warn!(receiver = %receiver.name, event = %event.key, %error, "notification given up after {ATTEMPTS} tries");
                }
            }
        }
        metrics.add(&receiver.name, if delivered { "delivered" } else { "failed" });
    }
}

async fn post(client: &HttpClient, receiver: &Receiver, url: &str, event: &Event, body: Bytes) -> Result<(), String> {
    let mut request = http::Request::post(url)
        .header("content-type", "application/json")
        .header("user-agent", "gitcanary")
        .header("x-gitcanary-event", event.kind.as_str())
        .header("x-gitcanary-delivery", &event.key);
    if let Some(secret) = &receiver.secret {
        request = request.header("x-gitcanary-signature-256", event::signature(secret, &body));
    }
    let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
    let answer = tokio::time::timeout(DELIVERY_TIMEOUT, client.request(request))
        .await
        .map_err(|_| format!("no answer within {} s", DELIVERY_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
    let status = answer.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_adds_receivers_to_the_defaults_and_never_takes_one_away() {
        let subscribed = ["team-a".to_string()];
        assert!(tells(None, "ops", &[]), "no defaults given: every receiver");
        let defaults = BTreeSet::from(["ops".to_string()]);
        assert!(tells(Some(&defaults), "ops", &[]));
        assert!(tells(Some(&defaults), "ops", &subscribed), "a default stays");
        assert!(!tells(Some(&defaults), "team-a", &[]), "not a default, not named");
        assert!(tells(Some(&defaults), "team-a", &subscribed));
        assert!(!tells(Some(&defaults), "team-b", &subscribed));
    }

    #[test]
    fn receivers_are_named_with_their_kind_and_a_url_from_the_line_or_a_file() {
        let none = BTreeMap::new();
        let chat = parse_receiver("team-chat=slack:https://hooks.slack.example/T/B/x", &none).unwrap();
        assert_eq!((chat.name.as_str(), chat.format), ("team-chat", Format::Slack));
        assert!(
            !format!("{chat:?}").contains("hooks"),
            "the URL is a password: never in a log"
        );
        let dir = tempfile::tempdir().unwrap();
        let (url, secret, empty) = (
            dir.path().join("url"),
            dir.path().join("secret"),
            dir.path().join("empty"),
        );
        std::fs::write(&url, "https://audit.example/hook\n").unwrap();
        std::fs::write(&secret, "k3y\n").unwrap();
        std::fs::write(&empty, "\n").unwrap();
        let secrets = BTreeMap::from([("audit".to_string(), secret.display().to_string())]);
        let audit = parse_receiver(&format!("audit=webhook:@{}", url.display()), &secrets).unwrap();
        assert_eq!(audit.url, "https://audit.example/hook");
        assert_eq!(audit.secret.as_deref(), Some(&b"k3y"[..]));
        let refused = [
            ("chat", &none, "write NAME=slack:URL"),
            ("chat=irc:https://x", &none, "\"irc\" is not slack, teams or webhook"),
            ("c h=slack:https://x", &none, "is not letters, digits"),
            ("chat=slack:file:///etc/passwd", &none, "is not an http(s) URL"),
            ("chat=slack:@/nonexistent/url", &none, "reading /nonexistent/url"),
        ];
        for (spec, secrets, wanted) in refused {
            let error = parse_receiver(spec, secrets).unwrap_err();
            assert!(error.contains(wanted), "{spec}: {error}");
        }
        let empty = BTreeMap::from([("audit".to_string(), empty.display().to_string())]);
        assert!(
            parse_receiver("audit=webhook:https://x", &empty)
                .unwrap_err()
                .contains("empty")
        );
        let signed_chat = BTreeMap::from([("chat".to_string(), secret.display().to_string())]);
        assert!(
            parse_receiver("chat=slack:https://x", &signed_chat)
                .unwrap_err()
                .contains("only a webhook")
        );
    }
}
