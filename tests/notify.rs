//! Release events where teams talk: receivers on loopback, as a chat's
//! incoming webhook and a team's signed webhook are, told of a promoted and
//! a failed release, each event once.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use gitcanary::rollout::api::{Phase, Rollout};
use kube::api::Api;
use serde_json::Value;
use support::agent::{AgentProcess, Scenario};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);
const SECRET: &str = "s3cret-for-hooks";

/// What the receivers got: (receiver, event header, delivery id, body,
/// signature header).
#[derive(Default)]
struct Received {
    posts: Vec<(String, String, String, Value, String)>,
    /// Answers still to fail for the chat receiver.
    chat_failures: usize,
    /// Requests the hanging receiver took.
    stuck: usize,
}

type Shared = Arc<Mutex<Received>>;

async fn receive(
    State(received): State<Shared>,
    Path(receiver): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    if receiver == "stuck" {
        // A receiver that takes the request and never answers.
        received.lock().unwrap().stuck += 1;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let mut received = received.lock().unwrap();
    if receiver == "chat" && received.chat_failures > 0 {
        received.chat_failures -= 1;
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let signature = header("x-gitcanary-signature-256");
    // Verified as a receiver would: the HMAC of the exact bytes received.
    if !signature.is_empty() && signature != gitcanary::notify::event::signature(SECRET.as_bytes(), &body) {
        return StatusCode::UNAUTHORIZED;
    }
    received.posts.push((
        receiver,
        header("x-gitcanary-event"),
        header("x-gitcanary-delivery"),
        json,
        signature,
    ));
    StatusCode::OK
}

fn write_app(scenario: &Scenario, image: &str, never_ready: bool) {
    let spec = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {duration: 1}}\n      progressDeadline: 5s\n";
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, spec);
    if never_ready {
        let path = scenario.repo.path().join("echo/deployment.yaml");
        let text = std::fs::read_to_string(&path).expect("deployment").replace(
            "labels: {app: echo}\n    spec",
            "labels: {app: echo, gitcanary.test/never-ready: \"true\"}\n    spec",
        );
        assert!(text.contains("never-ready"), "{text}");
        std::fs::write(&path, text).expect("written");
    }
}

async fn phase(scenario: &Scenario) -> Option<Phase> {
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    Some(rollouts.get_opt("echo").await.ok()??.status?.phase)
}

/// The events `receiver` got, as (event, id).
fn events_of(received: &Shared, receiver: &str) -> Vec<(String, String)> {
    let received = received.lock().unwrap();
    received
        .posts
        .iter()
        .filter(|p| p.0 == receiver)
        .map(|p| (p.1.clone(), p.2.clone()))
        .collect()
}

#[tokio::test]
async fn every_event_of_a_promoted_and_a_failed_release_reaches_each_receiver_once() {
    let scenario = Scenario::new("notify").await;
    let received: Shared = Arc::new(Mutex::new(Received {
        chat_failures: 2,
        ..Received::default()
    }));
    let app = axum::Router::new()
        .route("/{receiver}", axum::routing::post(receive))
        .with_state(received.clone());
    let address = support::serve_on_own_thread(app, "notification receivers");
    let files = tempfile::tempdir().expect("tempdir");
    let (url_file, secret_file) = (files.path().join("hook-url"), files.path().join("hook-secret"));
    std::fs::write(&url_file, format!("http://{address}/hook\n")).expect("url");
    std::fs::write(&secret_file, format!("{SECRET}\n")).expect("secret");
    let chat = format!("chat=slack:http://{address}/chat");
    let hook = format!("hook=webhook:@{}", url_file.display());
    let hook_secret = format!("hook={}", secret_file.display());
    let stuck = format!("stuck=webhook:http://{address}/stuck");
    write_app(&scenario, "1.0", false);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &[
            "--notify",
            &chat,
            "--notify",
            &hook,
            "--notify-secret",
            &hook_secret,
            "--notify",
            &stuck,
        ],
        &[],
    );
    eventually("1.0 healthy", WAIT, || async {
        (phase(&scenario).await == Some(Phase::Healthy)).then_some(())
    })
    .await;

    write_app(&scenario, "2.0", false);
    scenario.repo.commit_and_push("echo 2.0");
    let promoted = ["started", "step-passed", "promoted"];
    let kinds = |events: &[(String, String)]| events.iter().map(|e| e.0.clone()).collect::<Vec<_>>();
    eventually("2.0's events at the webhook", WAIT, || async {
        (kinds(&events_of(&received, "hook")) == promoted).then_some(())
    })
    .await;

    // A never-ready 3.0 misses its deadline: failed, reverted in Git.
    write_app(&scenario, "3.0", true);
    scenario.repo.commit_and_push("echo 3.0, never ready");
    let all = ["started", "step-passed", "promoted", "started", "failed"];
    eventually("3.0's events at the webhook", WAIT, || async {
        (kinds(&events_of(&received, "hook")) == all).then_some(())
    })
    .await;
    // The chat failed twice before taking the first event: it still has each once.
    let chat_events = eventually("every event in the chat", WAIT, || async {
        let events = events_of(&received, "chat");
        (kinds(&events) == all).then_some(events)
    })
    .await;
    // Later syncs look at the same statuses again: nothing more is told.
    agent.resyncs(3).await;
    assert_eq!(events_of(&received, "chat"), chat_events, "no event told twice");
    let hook_events = events_of(&received, "hook");
    assert_eq!(chat_events, hook_events, "the same events, with the same ids");
    let ids: std::collections::BTreeSet<_> = hook_events.iter().map(|e| &e.1).collect();
    assert_eq!(ids.len(), 5, "five events, five ids: {hook_events:?}");

    {
        let received = received.lock().unwrap();
        let hook_bodies: Vec<&Value> = received.posts.iter().filter(|p| p.0 == "hook").map(|p| &p.3).collect();
        assert!(
            received
                .posts
                .iter()
                .filter(|p| p.0 == "hook")
                .all(|p| p.4.starts_with("sha256=")),
            "every webhook signed"
        );
        let failed = hook_bodies[4];
        assert_eq!(failed["event"], "failed");
        assert_eq!(failed["rollout"]["name"], "echo");
        let cause = failed["facts"]["cause"].as_str().unwrap_or_default();
        assert!(cause.contains("not ready within 5s"), "{failed}");
        let revert = failed["facts"]["revert commit"].as_str().unwrap_or_default();
        let (revert_sha, _) = scenario
            .history()
            .into_iter()
            .find(|(_, m)| m.starts_with("revert("))
            .expect("a revert commit");
        assert!(
            !revert.is_empty() && revert_sha.starts_with(revert),
            "{revert} of {revert_sha}"
        );
        let slack = &received
            .posts
            .iter()
            .find(|p| p.0 == "chat" && p.1 == "promoted")
            .expect("promoted in the chat")
            .3;
        assert!(
            slack["text"].as_str().unwrap_or_default().ends_with("promoted"),
            "{slack}"
        );
        assert_eq!(slack["blocks"][0]["type"], "section", "{slack}");
        // The hanging receiver took the first event and never answered, while
        // both releases ran to their ends and the others got every event.
        assert!(received.stuck >= 1, "the hanging receiver was asked");
    }
    assert!(!agent.log_text().contains('\u{1b}'), "a log file gets no colour codes");
    let address = agent.address().await;
    let (_, metrics) = support::http(&address, "GET", "/metrics", &[], b"").expect("metrics");
    for line in [
        "gitcanary_notifications_total{receiver=\"chat\",outcome=\"delivered\"} 5",
        "gitcanary_notifications_total{receiver=\"hook\",outcome=\"delivered\"} 5",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

/// What the hook endpoint got: (path, body) of each signed call; and the
/// hook it answers 500 to.
#[derive(Default)]
struct Calls {
    calls: Vec<(String, Value)>,
    refuse: Option<&'static str>,
}

async fn hook_call(
    State(calls): State<Arc<Mutex<Calls>>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, String) {
    let signature = headers
        .get("x-gitcanary-signature-256")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if signature != gitcanary::notify::event::signature(SECRET.as_bytes(), &body) {
        return (StatusCode::UNAUTHORIZED, "bad signature".into());
    }
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut calls = calls.lock().unwrap();
    calls.calls.push((path, json.clone()));
    if calls.refuse.is_some_and(|hook| json["hook"] == hook) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "\nsmoke test failed: checkout answered 502\nmore detail".into(),
        );
    }
    (StatusCode::OK, "ok".into())
}

const HOOKED: &str = "  notify: [team]
  hooks:
    preRelease: {name: smoke, path: \"/pre/{{rolloutID}}\"}
    step: {name: smoke, path: \"/step/{{canaryRevision}}\"}
    prePromote: {name: smoke, path: /promote}
    postRelease: {name: smoke, path: /post}
  strategy:
    canary:
      steps:
      - {replicas: 1, pause: {duration: 1}}
      - {replicas: 1}
";

#[tokio::test]
async fn hooks_are_called_in_order_a_failing_pre_promote_reverts_and_receivers_hear_their_rollouts_refusal() {
    let scenario = Scenario::new("hooks").await;
    let calls = Arc::new(Mutex::new(Calls::default()));
    let app = axum::Router::new()
        .route("/{*path}", axum::routing::post(hook_call))
        .with_state(calls.clone());
    let address = support::serve_on_own_thread(app, "hook endpoint");
    let secret = tempfile::NamedTempFile::new().expect("secret file");
    std::fs::write(secret.path(), format!("{SECRET}\n")).expect("secret");
    let hook = format!("smoke=http://{address}");
    let hook_secret = format!("smoke={}", secret.path().display());
    // Receivers on the same endpoint: `ops` told of every Rollout, `team`
    // of the Rollouts that name it, `other` of none here.
    let receivers: Vec<String> = ["ops", "team", "other"]
        .iter()
        .flat_map(|name| {
            [
                "--notify".to_string(),
                format!("{name}=webhook:http://{address}/receiver/{name}"),
                "--notify-secret".to_string(),
                format!("{name}={}", secret.path().display()),
            ]
        })
        .chain(["--notify-default".to_string(), "ops".to_string()])
        .collect();
    let release = |image: &str| {
        support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, HOOKED);
        scenario.repo.commit_and_push(&format!("echo {image}"))
    };
    release("1.0");
    let _agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &[
            &["--hook", &hook, "--hook-secret", &hook_secret][..],
            &receivers.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
        &[],
    );
    eventually("1.0 healthy", WAIT, || async {
        (phase(&scenario).await == Some(Phase::Healthy)).then_some(())
    })
    .await;
    assert!(calls.lock().unwrap().calls.is_empty(), "no release, no hook");
    let told = |receiver: &str| -> Vec<String> {
        let calls = calls.lock().unwrap();
        let path = format!("receiver/{receiver}");
        calls
            .calls
            .iter()
            .filter(|(p, _)| *p == path)
            .map(|(_, body)| body["event"].as_str().unwrap_or("?").to_string())
            .collect()
    };

    let two = release("2.0");
    let id = &two[..7];
    let hooks_of = |id: &str| -> Vec<(String, String)> {
        let calls = calls.lock().unwrap();
        calls
            .calls
            .iter()
            .filter(|(_, body)| body["rolloutID"] == id && body["hook"].is_string())
            .map(|(path, body)| {
                let step = body["step"].as_u64().map_or(String::new(), |s| format!("-{s}"));
                let outcome = body["outcome"].as_str().map_or(String::new(), |o| format!(":{o}"));
                (
                    format!("{}{step}{outcome}", body["hook"].as_str().unwrap_or("?")),
                    path.clone(),
                )
            })
            .collect()
    };
    // A release's hook calls, once its postRelease was told.
    let to_the_end = |id: String| async move {
        eventually("a release's hooks, to its postRelease", WAIT, || async {
            let called = hooks_of(&id);
            called
                .iter()
                .any(|(hook, _)| hook.starts_with("postRelease"))
                .then_some(called)
        })
        .await
    };
    let called = to_the_end(id.to_string()).await;
    let names: Vec<&str> = called.iter().map(|(hook, _)| hook.as_str()).collect();
    assert_eq!(
        names,
        ["preRelease", "step-1", "step-2", "prePromote", "postRelease:promoted"],
        "each hook once, in order: {called:?}"
    );
    assert_eq!(
        called[0].1,
        format!("pre/{id}"),
        "the path under the endpoint, filled in"
    );
    assert!(
        called[1].1.starts_with("step/") && called[1].1.len() > "step/".len(),
        "the canary's revision in the step hook's path: {called:?}"
    );
    {
        let calls = calls.lock().unwrap();
        let pre = &calls
            .calls
            .iter()
            .find(|(_, b)| b["hook"] == "preRelease")
            .expect("preRelease")
            .1;
        assert_eq!(
            pre["rollout"],
            serde_json::json!({"namespace": scenario.ns, "name": "echo"})
        );
        assert_eq!(pre["commit"], two.as_str());
    }
    assert_eq!(phase(&scenario).await, Some(Phase::Healthy));

    calls.lock().unwrap().refuse = Some("prePromote");
    let three = release("3.0");
    let (_, revert) = scenario
        .wait_for_commit("the revert commit", |m| m.starts_with("revert("))
        .await;
    assert!(
        revert.contains("the prePromote hook smoke failed")
            && revert.contains("smoke test failed: checkout answered 502"),
        "the hook's first line in the revert: {revert}"
    );
    assert!(!revert.contains("more detail"), "only the first line: {revert}");
    assert!(
        !revert.contains(&address.to_string()),
        "the endpoint stays out of Git: {revert}"
    );
    let called = to_the_end(three[..7].to_string()).await;
    let names: Vec<&str> = called.iter().map(|(hook, _)| hook.as_str()).collect();
    assert_eq!(
        names,
        ["preRelease", "step-1", "step-2", "prePromote", "postRelease:failed"],
        "{called:?}"
    );

    // A canary name someone else holds: the next release is refused, and told so.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(scenario.client.clone(), &scenario.ns);
    let squatter: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "echo-canary"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "squatter"}},
                 "template": {"metadata": {"labels": {"app": "squatter"}}, "spec": {"containers": [{"name": "x", "image": "x"}]}}}
    }))
    .expect("a Deployment");
    // The reverted release's canary may still be going (its pods first).
    eventually("the reverted canary gone", WAIT, || async {
        matches!(deployments.get_opt("echo-canary").await, Ok(None)).then_some(())
    })
    .await;
    deployments
        .create(&Default::default(), &squatter)
        .await
        .expect("made by hand");
    support::run(
        scenario.repo.path(),
        "git",
        &["pull", "-q", "--rebase", "origin", "main"],
    );
    release("4.0");
    let ops = eventually("the refusal told", WAIT, || async {
        let ops = told("ops");
        ops.last().is_some_and(|e| e == "refused").then_some(ops)
    })
    .await;
    let expected = [
        "started",
        "step-passed",
        "step-passed",
        "promoted",
        "started",
        "step-passed",
        "failed",
        "refused",
    ];
    assert_eq!(ops, expected, "the default receiver hears every event once");
    eventually("the subscribed receiver too", WAIT, || async {
        (told("team") == expected).then_some(())
    })
    .await;
    assert!(
        told("other").is_empty(),
        "a receiver neither default nor named hears nothing"
    );
    let calls = calls.lock().unwrap();
    let refused = &calls
        .calls
        .iter()
        .rev()
        .find(|(p, b)| p == "receiver/ops" && b["event"] == "refused")
        .expect("refused")
        .1;
    let cause = refused["facts"]["cause"].as_str().unwrap_or_default();
    assert!(
        cause.contains("echo-canary"),
        "the cause names the taken name: {refused}"
    );
}
