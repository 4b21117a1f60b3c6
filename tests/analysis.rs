//! Metric analysis against a real Prometheus scraping an exporter whose
//! error ratios the test sets: a healthy canary is promoted through an
//! analysed step, a rising error ratio fails the release and reverts it in
//! Git with the values, and a Prometheus that goes away, a query with no
//! series and a NaN each pause the release instead of promoting it.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout, RolloutStatus};
use kube::api::Api;
use support::agent::{AgentProcess, Scenario};
use support::eventually;
use support::prometheus::{Exporter, Prometheus};

const WAIT: Duration = Duration::from_secs(90);

const TEMPLATE: &str = "  analysisTemplates:
  - name: errors
    interval: 1s
    count: 3
    failureLimit: 0
    inconclusiveLimit: 1
    metrics:
    - name: error-ratio
      query: max(error_ratio{service=\"{{canaryService}}\"})
      successCondition: < 0.05
    - name: versus-stable
      query: max(error_ratio{service=\"{{canaryService}}\"})
      successCondition: canary <= stable * 1.5
";

fn write_app(scenario: &Scenario, image: &str, canary: &str) {
    let named = TEMPLATE
        .replace("  analysisTemplates:\n", "")
        .replace("name: errors", "name: named\n    prometheus: {name: metrics}");
    let spec = format!(
        "{TEMPLATE}{named}  strategy:\n    canary:\n{canary}      trafficRoutings:\n      - service: echo\n        gateway: {{httpRouteName: echo}}\n      gracePeriodSeconds: 1\n"
    );
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, &spec);
}

const ANALYSED_STEP: &str =
    "      steps:\n      - {traffic: 20%, replicas: 1, analysis: {templateRef: errors}}\n      - {traffic: 100%}\n";
/// The analysed step, its template asking the Prometheus named `metrics`.
const NAMED_STEP: &str =
    "      steps:\n      - {traffic: 20%, replicas: 1, analysis: {templateRef: named}}\n      - {traffic: 100%}\n";
const BACKGROUND: &str = "      analysis: {templateRef: errors}\n      steps:\n      - {traffic: 20%, replicas: 1, pause: {duration: 60}}\n      - {traffic: 100%}\n";

async fn status(scenario: &Scenario) -> Option<RolloutStatus> {
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    rollouts.get_opt("echo").await.ok().flatten()?.status
}

async fn start(scenario: &Scenario, prometheus: &Prometheus, canary: &str) -> AgentProcess {
    start_with(scenario, &["--prometheus-url", &prometheus.url], canary).await
}

async fn start_with(scenario: &Scenario, args: &[&str], canary: &str) -> AgentProcess {
    write_app(scenario, "1.0", canary);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = AgentProcess::start_with(&scenario.repo, &scenario.ns, scenario.cache.path(), args, &[]);
    eventually("healthy on 1.0", WAIT, || async {
        (status(scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;
    agent
}

/// Successful measurements of a run so far.
async fn successes(scenario: &Scenario, run: &str) -> u32 {
    status(scenario)
        .await
        .and_then(|s| s.analysis_runs.into_iter().find(|r| r.name == run))
        .map_or(0, |r| r.successful)
}

#[tokio::test]
async fn a_canary_with_a_low_error_ratio_is_promoted_through_an_analysed_step() {
    let scenario = Scenario::new("analysis-ok").await;
    let exporter = Exporter::start();
    exporter.set("echo", 0.02);
    exporter.set("echo-canary", 0.01);
    let prometheus = Prometheus::start(&exporter).await;
    // The template names the server the operator gave the agent; the
    // default points nowhere, so only the named one can pass the step.
    let named = format!("metrics={}", prometheus.url);
    let args = ["--prometheus", named.as_str(), "--prometheus-url", "http://127.0.0.1:9"];
    let _agent = start_with(&scenario, &args, NAMED_STEP).await;

    write_app(&scenario, "2.0", NAMED_STEP);
    let released = scenario.repo.commit_and_push("echo 2.0");
    let done = eventually("promoted after the analysis", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Healthy && status.stable_commit == released).then_some(status)
    })
    .await;
    let run = done
        .analysis_runs
        .iter()
        .find(|r| r.name == "step-1")
        .expect("the step's run");
    assert!(run.successful >= 3, "{run:?}");
    assert_eq!((run.failed, run.inconclusive), (0, 0), "{run:?}");
    assert!(run.message.contains("0.01 against `< 0.05`"), "{}", run.message);
    assert!(run.message.contains("canary 0.01, stable 0.02"), "{}", run.message);
    assert!(
        run.message.contains("service=\"echo-canary\""),
        "the query was templated: {}",
        run.message
    );
    let status_file = format!("main:.gitcanary/status/{}/echo.yaml", scenario.ns);
    let record = eventually("the promote commit", WAIT, || async {
        scenario.try_git(&["show", &status_file])
    })
    .await;
    assert!(record.contains("analysis named: 3 successful"), "{record}");
}

#[tokio::test]
async fn a_rising_error_ratio_fails_the_release_and_reverts_it_in_git_with_the_values() {
    let scenario = Scenario::new("analysis-fail").await;
    let exporter = Exporter::start();
    exporter.set("echo", 0.01);
    exporter.set("echo-canary", 0.01);
    let prometheus = Prometheus::start(&exporter).await;
    let _agent = start(&scenario, &prometheus, BACKGROUND).await;

    write_app(&scenario, "2.0", BACKGROUND);
    let released = scenario.repo.commit_and_push("echo 2.0");
    eventually("the background analysis measures", WAIT, || async {
        (successes(&scenario, "background").await >= 1).then_some(())
    })
    .await;
    exporter.set("echo-canary", 0.4);
    let failed = eventually("failed by the analysis", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Failed || status.written_back.is_some()).then_some(status)
    })
    .await;
    let message = failed.canary_status.expect("canary").message;
    assert!(message.contains("analysis errors failed"), "{message}");
    let revert = scenario
        .wait_for_commit("the revert commit", |m| {
            m.contains(&format!("Gitcanary-Reverts: {released}"))
        })
        .await;
    assert!(
        revert.1.contains("error-ratio FAILED: 0.4 against `< 0.05`"),
        "{}",
        revert.1
    );
    assert!(
        revert.1.contains("query: max(error_ratio{service=\"echo-canary\"})"),
        "{}",
        revert.1
    );
    assert!(
        scenario
            .git(&["show", "main:echo/deployment.yaml"])
            .contains("echo:1.0")
    );
}

#[tokio::test]
async fn prometheus_gone_mid_analysis_pauses_the_release_and_never_promotes() {
    let scenario = Scenario::new("analysis-gone").await;
    let exporter = Exporter::start();
    exporter.set("echo", 0.01);
    exporter.set("echo-canary", 0.01);
    let mut prometheus = Prometheus::start(&exporter).await;
    // Five successes needed: Prometheus goes away before then.
    let steps = ANALYSED_STEP.replace("analysis: {templateRef: errors}", "analysis: {templateRef: slow}");
    let template = TEMPLATE
        .replace("name: errors", "name: slow")
        .replace("count: 3", "count: 30");
    write_app(&scenario, "1.0", &steps);
    let rollout = scenario.repo.path().join("echo/rollout.yaml");
    let text = std::fs::read_to_string(&rollout)
        .expect("rollout")
        .replace(TEMPLATE, &template);
    scenario.repo.write("echo/rollout.yaml", &text);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--prometheus-url", &prometheus.url],
        &[],
    );
    eventually("healthy on 1.0", WAIT, || async {
        (status(&scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;
    let next = text.replace("echo:1.0", "echo:2.0");
    let deployment = std::fs::read_to_string(scenario.repo.path().join("echo/deployment.yaml"))
        .expect("deployment")
        .replace("echo:1.0", "echo:2.0");
    scenario.repo.write("echo/rollout.yaml", &next);
    scenario.repo.write("echo/deployment.yaml", &deployment);
    scenario.repo.commit_and_push("echo 2.0");
    eventually("the analysis measures", WAIT, || async {
        (successes(&scenario, "step-1").await >= 1).then_some(())
    })
    .await;
    prometheus.stop();
    let paused = eventually("paused for want of data", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Paused).then_some(status)
    })
    .await;
    let message = paused.canary_status.expect("canary").message;
    assert!(message.contains("inconclusive"), "{message}");
    assert!(message.contains("unreachable"), "{message}");
    agent.resyncs(3).await;
    let still = status(&scenario).await.expect("status");
    assert_eq!(still.phase, Phase::Paused, "never promoted on missing data");
    assert_eq!(still.canary_status.expect("canary").current_step_index, 1);
}

/// A release whose canary's series is `canary` (absent when `None`), with
/// stable's at 0.01: the step's analysis asks Prometheus until the release
/// pauses; returns the pause's message once the agent has looked again.
async fn paused_without_an_answer(name: &str, canary: Option<f64>) -> String {
    let scenario = Scenario::new(name).await;
    let exporter = Exporter::start();
    exporter.set("echo", 0.01);
    let prometheus = Prometheus::start(&exporter).await;
    let agent = start(&scenario, &prometheus, ANALYSED_STEP).await;
    if let Some(value) = canary {
        exporter.set("echo-canary", value);
    }
    write_app(&scenario, "2.0", ANALYSED_STEP);
    scenario.repo.commit_and_push("echo 2.0");
    let paused = eventually("paused for want of an answer", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Paused).then_some(status)
    })
    .await;
    let run = paused
        .analysis_runs
        .iter()
        .find(|r| r.name == "step-1")
        .expect("the step's run");
    assert_eq!((run.successful, run.failed), (0, 0), "{run:?}");
    assert!(run.inconclusive >= 2, "{run:?}");
    agent.resyncs(3).await;
    let still = status(&scenario).await.expect("status");
    assert_eq!(still.phase, Phase::Paused, "never promoted, never failed, on no answer");
    assert_eq!(still.canary_status.as_ref().expect("canary").current_step_index, 1);
    paused.canary_status.expect("canary").message
}

#[tokio::test]
async fn a_query_with_no_series_for_the_canary_is_inconclusive_and_pauses() {
    let message = paused_without_an_answer("analysis-empty", None).await;
    assert!(message.contains("inconclusive"), "{message}");
    assert!(
        message.contains("error-ratio inconclusive: no data against `< 0.05`"),
        "{message}"
    );
}

#[tokio::test]
async fn a_nan_answer_is_inconclusive_and_pauses() {
    let message = paused_without_an_answer("analysis-nan", Some(f64::NAN)).await;
    assert!(message.contains("inconclusive"), "{message}");
    assert!(
        message.contains("error-ratio inconclusive: NaN against `< 0.05`"),
        "{message}"
    );
}

/// What the test's web check answers.
#[derive(Clone, Copy)]
enum Answer {
    Score(f64),
    Hang,
}

type Checks = std::sync::Arc<std::sync::Mutex<(Answer, Vec<String>)>>;

async fn score(
    axum::extract::State(checks): axum::extract::State<Checks>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let answer = {
        let mut checks = checks.lock().unwrap();
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        checks.1.push(format!("{} {token}", uri.path()));
        checks.0
    };
    match answer {
        Answer::Score(score) => axum::Json(serde_json::json!({"score": score})).into_response(),
        Answer::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            axum::http::StatusCode::OK.into_response()
        }
    }
}

const WEB_TEMPLATE: &str = "  analysisTemplates:
  - name: web
    interval: 1s
    count: 2
    failureLimit: 0
    inconclusiveLimit: 0
    metrics:
    - name: score
      web: {name: checks, path: \"/score/{{rolloutID}}\", jsonPath: $.score}
      successCondition: \">= 0.9\"
  strategy:
    canary:
      steps:
      - {replicas: 1, analysis: {templateRef: web}}
";

#[tokio::test]
async fn a_web_check_passes_fails_and_reverts_or_times_out_and_pauses() {
    let scenario = Scenario::new("analysis-web").await;
    let checks: Checks = std::sync::Arc::new(std::sync::Mutex::new((Answer::Score(0.95), Vec::new())));
    let app = axum::Router::new()
        .route("/score/{id}", axum::routing::get(score))
        .with_state(checks.clone());
    let address = support::serve_on_own_thread(app, "web check");
    let headers = tempfile::NamedTempFile::new().expect("headers file");
    std::fs::write(headers.path(), "Authorization: Bearer check-token\n").expect("headers");
    let check = format!("checks=http://{address}");
    let header_file = format!("checks={}", headers.path().display());
    let release = |image: &str| {
        support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, WEB_TEMPLATE);
        scenario.repo.commit_and_push(&format!("echo {image}"))
    };
    release("1.0");
    let _agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--web-check", &check, "--web-check-headers", &header_file],
        &[],
    );
    eventually("healthy on 1.0", WAIT, || async {
        (status(&scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;

    let two = release("2.0");
    eventually("2.0 promoted through its web check", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Healthy && status.stable_commit == two).then_some(())
    })
    .await;
    let asked = checks.lock().unwrap().1.clone();
    assert!(
        asked
            .iter()
            .any(|a| a == &format!("/score/{} Bearer check-token", &two[..7])),
        "the release's id in the path, the operator's header sent: {asked:?}"
    );

    checks.lock().unwrap().0 = Answer::Score(0.2);
    release("3.0");
    let (_, revert) = scenario
        .wait_for_commit("the revert commit", |m| m.starts_with("revert("))
        .await;
    assert!(revert.contains("score FAILED: 0.2 against `>= 0.9`"), "{revert}");
    assert!(
        !revert.contains(&address.to_string()),
        "the operator's address stays out of Git: {revert}"
    );

    checks.lock().unwrap().0 = Answer::Hang;
    // Build on the revert, as a person would.
    support::run(
        scenario.repo.path(),
        "git",
        &["pull", "-q", "--rebase", "origin", "main"],
    );
    release("4.0");
    let paused = eventually("paused when the check does not answer", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Paused).then_some(status)
    })
    .await;
    let message = paused.canary_status.expect("canary").message;
    assert!(message.contains("inconclusive"), "{message}");
    assert!(message.contains("did not answer within 5s"), "{message}");
}

/// [`WEB_TEMPLATE`], with measurements that go on: each one waits for the
/// check's answer, which never comes, for the agent's 5 s.
fn unanswered_template() -> String {
    WEB_TEMPLATE
        .replace("count: 2", "count: 100")
        .replace("inconclusiveLimit: 0", "inconclusiveLimit: 100")
}

/// A second app beside the echo app: a Deployment and a Rollout that
/// moves through timed pauses of 1 s.
fn write_quick_app(scenario: &Scenario, image: &str) {
    let ns = &scenario.ns;
    scenario.repo.write(
        "quick/deployment.yaml",
        &format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: quick\n  namespace: {ns}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: quick}}\n  template:\n    metadata:\n      labels: {{app: quick}}\n    spec:\n      containers:\n      - name: quick\n        image: registry.test/quick:{image}\n"
        ),
    );
    let steps = "      - {replicas: 1, pause: {duration: 1}}\n".repeat(30);
    scenario.repo.write(
        "quick/rollout.yaml",
        &format!(
            "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: quick\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: quick}}\n  strategy:\n    canary:\n      steps:\n{steps}"
        ),
    );
}

/// When each request to the check came.
type Asked = std::sync::Arc<std::sync::Mutex<Vec<std::time::Instant>>>;

async fn never_answer(axum::extract::State(asked): axum::extract::State<Asked>) -> axum::http::StatusCode {
    asked.lock().unwrap().push(std::time::Instant::now());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    axum::http::StatusCode::OK
}

#[tokio::test]
async fn a_check_that_does_not_answer_delays_only_its_own_app() {
    let scenario = Scenario::new("analysis-slow").await;
    let asked: Asked = Default::default();
    let app = axum::Router::new()
        .route("/score/{id}", axum::routing::get(never_answer))
        .with_state(asked.clone());
    let address = support::serve_on_own_thread(app, "web check");
    let check = format!("checks=http://{address}");
    let release = |image: &str| {
        support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, &unanswered_template());
        write_quick_app(&scenario, image);
        scenario.repo.commit_and_push(&format!("echo and quick {image}"))
    };
    release("1.0");
    let _agent = AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--web-check", &check],
        &[],
    );
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let phase_of = |name: &'static str| {
        let rollouts = rollouts.clone();
        async move { rollouts.get_opt(name).await.ok().flatten()?.status.map(|s| s.phase) }
    };
    eventually("both healthy on 1.0", WAIT, || async {
        (phase_of("echo").await? == Phase::Healthy && phase_of("quick").await? == Phase::Healthy).then_some(())
    })
    .await;

    release("2.0");
    // Each of the echo app's syncs waits 5 s for the check's answer, from
    // the moment it asks (the check notes it a little later). A write of
    // the quick app's seen between two polls 2 to 4 s after that was made
    // while the echo app's sync waited, and not by a sync of both apps that
    // began with it (the quick app's part of one takes far less than 2 s):
    // a loop that starts no sync while another runs could not have made it.
    let step_of = || async {
        let status = rollouts.get_opt("quick").await.ok().flatten()?.status?;
        let step = status.canary_status.as_ref().map_or(0, |c| c.current_step_index);
        Some((status.rollout_id, step))
    };
    let deadline = std::time::Instant::now() + WAIT;
    let mut before = (std::time::Instant::now(), step_of().await);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = std::time::Instant::now();
        let now = step_of().await;
        let seen = std::time::Instant::now();
        let moved = now.is_some() && before.1.is_some() && now != before.1;
        let within_a_wait = asked
            .lock()
            .unwrap()
            .iter()
            .any(|&asked| before.0 >= asked + Duration::from_secs(2) && seen <= asked + Duration::from_secs(4));
        if moved && within_a_wait {
            break;
        }
        assert!(
            seen < deadline,
            "the quick app never moved a step while the echo app's check went unanswered (asked {} times)",
            asked.lock().unwrap().len()
        );
        before = (sent, now);
    }
}

/// A step checked by a Job whose pod ends as `outcome` (kwok's stage).
fn job_template(outcome: &str) -> String {
    format!(
        "  analysisTemplates:
  - name: smoke
    interval: 1s
    metrics:
    - name: smoke
      job:
        spec:
          backoffLimit: 0
          template:
            metadata:
              labels: {{gitcanary.test/job-outcome: {outcome}}}
            spec:
              restartPolicy: Never
              containers:
              - name: smoke
                image: registry.test/smoke:1
                args: [\"--release\", \"{{{{rolloutID}}}}\"]
  strategy:
    canary:
      steps:
      - {{replicas: 1, analysis: {{templateRef: smoke}}}}
"
    )
}

#[tokio::test]
async fn a_job_check_that_succeeds_promotes_and_one_that_fails_reverts_and_is_kept() {
    let scenario = Scenario::new("analysis-job").await;
    let release = |image: &str, outcome: &str| {
        support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, &job_template(outcome));
        scenario.repo.commit_and_push(&format!("echo {image}"))
    };
    release("1.0", "succeeded");
    let _agent = AgentProcess::start_with(&scenario.repo, &scenario.ns, scenario.cache.path(), &[], &[]);
    eventually("healthy on 1.0", WAIT, || async {
        (status(&scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(scenario.client.clone(), &scenario.ns);

    let two = release("2.0", "succeeded");
    let promoted = eventually("2.0 promoted through its Job", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Healthy && status.stable_commit == two).then_some(status)
    })
    .await;
    let run = promoted
        .analysis_runs
        .iter()
        .find(|r| r.name == "step-1")
        .expect("the step's run");
    assert_eq!((run.successful, run.failed), (1, 0), "{run:?}");
    assert_eq!(run.message, "Job echo-canary-step-1 completed");
    eventually("the passed step's Job deleted", WAIT, || async {
        jobs.get_opt("echo-canary-step-1").await.ok()?.is_none().then_some(())
    })
    .await;

    let three = release("3.0", "failed");
    let (_, revert) = scenario
        .wait_for_commit("the revert commit", |m| m.starts_with("revert("))
        .await;
    assert!(
        revert.contains("Job echo-canary-step-1 failed: BackoffLimitExceeded"),
        "the Job's verdict in the revert: {revert}"
    );
    let failed = status(&scenario).await.expect("status");
    assert_eq!(failed.rollout_id, three[..7]);
    // Kept for inspection: the failed release's Job, made for it, owned by the Rollout.
    let job = jobs.get("echo-canary-step-1").await.expect("the failed Job is kept");
    let annotations = job.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("gitcanary.io/rollout-id").map(String::as_str),
        Some(&three[..7])
    );
    let owner = &job.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Rollout", "echo"));
    let args = job.spec.expect("spec").template.spec.expect("pod spec").containers[0]
        .args
        .clone();
    assert_eq!(args, Some(vec!["--release".to_string(), three[..7].to_string()]));
}
