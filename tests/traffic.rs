//! Releases judged by what requests see: real requests through a real
//! gateway (Traefik, serving the HTTPRoute gitcanary weights), answered by
//! the pods of each version (tests/testenv/pod-player.py).

mod support;

use std::time::{Duration, Instant};

use gitcanary::rollout::api::{Phase, Rollout, RolloutStatus};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use support::agent::Scenario;
use support::eventually;
use support::traffic::{Counts, Load, burst, burst_with};

const WAIT: Duration = Duration::from_secs(90);
const STABLE: &str = "registry.test/echo:1.0";
const CANARY: &str = "registry.test/echo:2.0";
/// How long the test gateway may take to apply a route written to it
/// (its reloads are throttled to 100 ms; the rest is its watch and a
/// loaded machine).
const ROUTER_RELOAD: Duration = Duration::from_secs(5);

/// The step of [`write_app`]: 20% of the requests, then a wait for a promote.
const TWENTY_PERCENT: &str = "{traffic: 20%, replicas: 1, pause: {}}";

/// The echo app at `version`, routed by the test gateway for host
/// `<namespace>.test`, released in one step of 20% that waits for a promote.
fn write_app(scenario: &Scenario, version: &str) {
    write_app_with(scenario, version, TWENTY_PERCENT);
}

/// The echo app at `version`, released in the one `step` given.
fn write_app_with(scenario: &Scenario, version: &str, step: &str) {
    write_release(scenario, version, "canary", &[step]);
}

/// The echo app at `version`, released by `style` (`canary` or
/// `blueGreen`) in `steps`.
fn write_release(scenario: &Scenario, version: &str, style: &str, steps: &[&str]) {
    let ns = &scenario.ns;
    let steps: String = steps.iter().map(|step| format!("      - {step}\n")).collect();
    let files = [
        (
            "echo/deployment.yaml",
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: echo, namespace: {ns}}}\nspec:\n  replicas: 4\n  selector: {{matchLabels: {{app: echo}}}}\n  template:\n    metadata: {{labels: {{app: echo}}}}\n    spec:\n      containers:\n      - name: echo\n        image: registry.test/echo:{version}\n        ports: [{{containerPort: 8080}}]\n"
            ),
        ),
        (
            "echo/service.yaml",
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: echo, namespace: {ns}}}\nspec:\n  selector: {{app: echo}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
            ),
        ),
        (
            "echo/route.yaml",
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: echo, namespace: {ns}}}\nspec:\n  parentRefs: [{{name: gateway, namespace: gitcanary-test}}]\n  hostnames: [{ns}.test]\n  rules:\n  - backendRefs: [{{name: echo, port: 80}}]\n"
            ),
        ),
        (
            "echo/rollout.yaml",
            format!(
                "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {{name: echo, namespace: {ns}}}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: echo}}\n  strategy:\n    {style}:\n      steps:\n{steps}      trafficRoutings:\n      - service: echo\n        gateway: {{httpRouteName: echo}}\n      gracePeriodSeconds: 1\n      progressDeadline: 60\n"
            ),
        ),
    ];
    for (path, text) in files {
        scenario.repo.write(path, &text);
    }
}

fn host(scenario: &Scenario) -> String {
    format!("{}.test", scenario.ns)
}

async fn status(scenario: &Scenario) -> Option<RolloutStatus> {
    Api::<Rollout>::namespaced(scenario.client.clone(), &scenario.ns)
        .get_opt("echo")
        .await
        .ok()??
        .status
}

async fn canary_exists(scenario: &Scenario) -> bool {
    Api::<Deployment>::namespaced(scenario.client.clone(), &scenario.ns)
        .get_opt("echo-canary")
        .await
        .ok()
        .flatten()
        .is_some()
}

/// Healthy on 1.0, which answers every request through the gateway.
async fn answering_on_1_0(scenario: &Scenario) {
    let host = host(scenario);
    eventually("1.0 answers through the gateway", WAIT, || async {
        let healthy = status(scenario).await?.phase == Phase::Healthy;
        (healthy && burst(&host, 40, Duration::from_secs(10)).by_image.get(STABLE) == Some(&40)).then_some(())
    })
    .await;
}

/// The release paused at its first step.
async fn paused_at_step_1(scenario: &Scenario) {
    eventually("2.0 paused at its first step", WAIT, || async {
        let status = status(scenario).await?;
        (status.phase == Phase::Paused && status.canary_status?.current_step_index == 1).then_some(())
    })
    .await;
}

/// Version 1.0 released and answering every request through the gateway,
/// then 2.0 pushed and paused at its 20% step.
async fn paused_at_20_percent(scenario: &Scenario) -> support::agent::AgentProcess {
    paused_at(scenario, TWENTY_PERCENT).await
}

/// As [`paused_at_20_percent`], with the one `step` given.
async fn paused_at(scenario: &Scenario, step: &str) -> support::agent::AgentProcess {
    write_app_with(scenario, "1.0", step);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = scenario.start_agent();
    answering_on_1_0(scenario).await;
    write_app_with(scenario, "2.0", step);
    scenario.repo.commit_and_push("echo 2.0");
    paused_at_step_1(scenario).await;
    agent
}

fn summary(counts: &Counts) -> String {
    format!(
        "{:?}, statuses {:?}, {} without an answer",
        counts.by_image, counts.by_status, counts.failed
    )
}

#[tokio::test]
async fn a_20_percent_step_sends_a_fifth_of_the_requests_to_the_canary_and_a_promote_fails_none() {
    let scenario = Scenario::new("traffic-split").await;
    let _agent = paused_at_20_percent(&scenario).await;
    let host = host(&scenario);
    let counts = burst(&host, 2_000, Duration::from_secs(60));
    assert_eq!(counts.answered(), 2_000, "{}", summary(&counts));
    assert_eq!(counts.failures(), 0, "{}", summary(&counts));
    let share = counts.share(CANARY);
    assert!(
        (0.16..=0.24).contains(&share),
        "canary share {share}: {}",
        summary(&counts)
    );
    assert!(
        counts.by_image.keys().all(|image| image == STABLE || image == CANARY),
        "{}",
        summary(&counts)
    );

    // The promote, the stable roll-out and the canary's removal, under load.
    let load = Load::start(&host);
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("promoted, the canary removed and 2.0 answering", WAIT, || async {
        let healthy = status(&scenario).await?.phase == Phase::Healthy;
        let recent = load.answers();
        let last: Vec<_> = recent.iter().rev().take(50).collect();
        let all_new = last.len() == 50 && last.iter().all(|a| a.image == CANARY);
        (healthy && !canary_exists(&scenario).await && all_new).then_some(())
    })
    .await;
    let answers = load.stop();
    let counts = Counts::of(&answers);
    assert!(counts.answered() > 100, "{}", summary(&counts));
    assert_eq!(
        counts.failures(),
        0,
        "failed requests during the promote: {}",
        summary(&counts)
    );
}

#[tokio::test]
async fn once_an_abort_is_reported_and_the_gateway_reloaded_no_request_reaches_the_canary() {
    let scenario = Scenario::new("traffic-abort").await;
    let _agent = paused_at_20_percent(&scenario).await;
    let host = host(&scenario);
    let load = Load::start(&host);
    eventually("the canary answers under load", WAIT, || async {
        load.answers().iter().any(|a| a.image == CANARY).then_some(())
    })
    .await;
    let asked = Instant::now();
    let (code, _, stderr) = scenario.run_cli(&["abort", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    let reported = eventually("the abort reported", WAIT, || async {
        let status = status(&scenario).await?;
        support::agent::failed_or_reverted(&status).then(Instant::now)
    })
    .await;
    // The gateway applies a route some time after it is written (Traefik
    // reloads its configuration): within that, no request reaches the
    // canary any more, and none does afterwards.
    let quiet = eventually("the gateway sends the canary nothing", ROUTER_RELOAD, || async {
        (burst(&host, 100, Duration::from_secs(10)).share(CANARY) == 0.0).then(Instant::now)
    })
    .await;
    let after = burst(&host, 500, Duration::from_secs(30));
    let answers = load.stop();
    let last_canary = answers.iter().filter(|a| a.image == CANARY).map(|a| a.at).max();
    assert!(
        last_canary.is_none_or(|t| t < quiet),
        "a canary answer {:?} after the gateway sent it nothing",
        last_canary.map(|t| t - quiet)
    );
    let during = Counts::of(&answers);
    assert_eq!(
        during.failures(),
        0,
        "failed requests during the abort: {}",
        summary(&during)
    );
    assert_eq!(after.share(CANARY), 0.0, "{}", summary(&after));
    assert_eq!(after.failures(), 0, "{}", summary(&after));
    eprintln!(
        "abort asked → last canary answer: {:?}; → reported: {:?}",
        last_canary.map(|t| t.saturating_duration_since(asked)),
        reported - asked
    );
}

/// The `success-rate` template of examples/analysis/rollout.yaml, as JSON
/// (which YAML reads as it is).
fn success_rate_template() -> String {
    let example: serde_json::Value =
        serde_saphyr::from_str(include_str!("../examples/analysis/rollout.yaml")).expect("the example parses");
    let template = example["spec"]["analysisTemplates"]
        .as_array()
        .and_then(|all| all.iter().find(|t| t["name"] == "success-rate"))
        .expect("the example has a success-rate template");
    serde_json::to_string(template).expect("JSON")
}

#[tokio::test]
async fn a_canary_answering_503_fails_its_analysis_on_the_gateways_metrics_and_is_reverted() {
    let scenario = Scenario::new("traffic-503").await;
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    let prometheus = support::prometheus::Prometheus::scraping(&support::traffic::gateway_metrics_address()).await;
    let _agent = support::agent::AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--prometheus-url", &prometheus.url],
        &[],
    );
    let host = host(&scenario);
    answering_on_1_0(&scenario).await;
    // 2.0's pods answer 503; the step measures the canary's success rate.
    write_app(&scenario, "2.0");
    let rollout = std::fs::read_to_string(scenario.repo.path().join("echo/rollout.yaml")).expect("the Rollout");
    let analysed = rollout
        .replace(
            "  strategy:\n",
            &format!("  analysisTemplates: [{}]\n  strategy:\n", success_rate_template()),
        )
        .replace(
            "      - {traffic: 20%, replicas: 1, pause: {}}\n",
            "      - {traffic: 20%, replicas: 1, analysis: {templateRef: success-rate}}\n      - {traffic: 100%}\n      patchPodTemplateMetadata: {labels: {gitcanary.test/http-status: \"503\"}}\n",
        );
    scenario.repo.write("echo/rollout.yaml", &analysed);
    scenario.repo.commit_and_push("echo 2.0, whose pods fail");
    let load = Load::start(&host);
    let failed = eventually("the release failed on its analysis", WAIT, || async {
        let status = status(&scenario).await?;
        support::agent::failed_or_reverted(&status).then_some(status)
    })
    .await;
    let message = failed.canary_status.expect("canary status").message;
    assert!(message.contains("success-rate FAILED: 0 against"), "{message}");
    eventually("every request back on 1.0", WAIT, || async {
        let counts = burst(&host, 200, Duration::from_secs(20));
        (counts.by_image.get(STABLE) == Some(&200)).then_some(())
    })
    .await;
    let answers = load.stop();
    let counts = Counts::of(&answers);
    assert!(
        counts.by_status.get(&503).is_some_and(|n| *n > 0),
        "the canary's 503s were seen: {}",
        summary(&counts)
    );
    let key = format!("{}/echo", scenario.ns);
    let (_, revert) = scenario
        .wait_for_commit("the revert commit", |m| m.starts_with(&format!("revert({key})")))
        .await;
    // Every answer of the canary was a 503: the measured rate is 0.
    assert!(revert.contains("success-rate FAILED: 0 against"), "{revert}");
}

#[tokio::test]
async fn an_ab_step_sends_every_request_with_the_header_to_the_canary_with_its_header_changes_and_no_other() {
    let scenario = Scenario::new("traffic-ab").await;
    let step = "{matches: [{headers: [{name: x-canary, value: \"yes\"}]}], requestHeaderModifier: {set: [{name: x-release, value: canary}], remove: [x-debug]}, replicas: 1, pause: {}}";
    let _agent = paused_at(&scenario, step).await;
    let host = host(&scenario);
    let sent = [("x-canary", "yes"), ("x-debug", "1")];
    let matched = eventually("the header routed to the canary", WAIT, || async {
        let counts = burst_with(&host, &sent, 1_000, Duration::from_secs(60));
        (counts.share(CANARY) == 1.0).then_some(counts)
    })
    .await;
    assert_eq!(matched.answered(), 1_000, "{}", summary(&matched));
    assert_eq!(matched.failures(), 0, "{}", summary(&matched));
    let changed = [("x-canary", "yes"), ("x-release", "canary")];
    assert_eq!(
        matched.received(CANARY, &changed),
        1_000,
        "every matched request reaches the canary with x-release set and x-debug removed: {:?}",
        matched.by_image_and_headers
    );
    for headers in [&[][..], &[("x-canary", "no"), ("x-debug", "1")][..]] {
        let other = burst_with(&host, headers, 1_000, Duration::from_secs(60));
        assert_eq!(other.answered(), 1_000, "{headers:?}: {}", summary(&other));
        assert_eq!(other.share(STABLE), 1.0, "{headers:?}: {}", summary(&other));
        assert_eq!(
            other.received(STABLE, headers),
            1_000,
            "the stable's requests arrive as sent: {:?}",
            other.by_image_and_headers
        );
    }
    let status = status(&scenario).await.expect("status");
    assert_eq!(status.canary_status.expect("canary").traffic, "0% + matching requests");
}

/// A gateway that cannot mirror (Traefik's class lists no
/// HTTPRouteRequestMirror) would answer every request of a rule with a
/// mirror with an error: the release does not start, and 1.0 answers all.
#[tokio::test]
async fn a_mirror_step_is_refused_where_the_gateway_cannot_mirror_and_no_request_fails() {
    let scenario = Scenario::new("traffic-mirror").await;
    let step = "{mirror: {percent: 100}, replicas: 1, pause: {}}";
    write_app_with(&scenario, "1.0", step);
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = scenario.start_agent();
    answering_on_1_0(&scenario).await;
    let load = Load::start(&host(&scenario));
    write_app_with(&scenario, "2.0", step);
    scenario.repo.commit_and_push("echo 2.0");
    let refused = eventually("the mirror refused", WAIT, || async {
        let status = status(&scenario).await?;
        let message = status.canary_status?.message;
        (status.phase == Phase::Failed && message.contains("HTTPRouteRequestMirror")).then_some(message)
    })
    .await;
    assert!(
        refused.contains("GatewayClass gitcanary-test of Gateway gitcanary-test/gateway (serving HTTPRoute echo) does not list HTTPRouteRequestMirror"),
        "{refused}"
    );
    let routes = Api::<kube::api::DynamicObject>::namespaced_with(
        scenario.client.clone(),
        &scenario.ns,
        &kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "gateway.networking.k8s.io",
            "v1",
            "HTTPRoute",
        )),
    );
    let route = serde_json::to_value(routes.get("echo").await.expect("route")).unwrap();
    assert!(!route.to_string().contains("RequestMirror"), "{route}");
    assert!(!canary_exists(&scenario).await, "no canary was made");
    let counts = Counts::of(&load.stop());
    assert!(counts.answered() > 100, "{}", summary(&counts));
    assert_eq!(counts.failures(), 0, "{}", summary(&counts));
    assert_eq!(counts.share(STABLE), 1.0, "{}", summary(&counts));
}

/// Kruise's blue-green: 2.0 at full size beside 1.0, previewed by header,
/// then every request switched to it.
const PREVIEW: &str =
    "{replicas: 100%, traffic: 0%, matches: [{headers: [{name: x-preview, value: \"yes\"}]}], pause: {}}";
const SWITCH: &str = "{replicas: 100%, traffic: 100%, pause: {}}";

/// 1.0 serving, 2.0 pushed as a blue-green release: previewed (asserted
/// here: at full size, the header's requests on 2.0 and no other), then
/// switched under load; returns the load, still running, once every
/// request is on 2.0.
async fn switched_to_green(scenario: &Scenario) -> (support::agent::AgentProcess, Load) {
    write_release(scenario, "1.0", "blueGreen", &[PREVIEW, SWITCH]);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = scenario.start_agent();
    let host = host(scenario);
    answering_on_1_0(scenario).await;
    // Live requests from before 2.0 is pushed: none reaches it until the switch.
    let load = Load::start(&host);
    write_release(scenario, "2.0", "blueGreen", &[PREVIEW, SWITCH]);
    scenario.repo.commit_and_push("echo 2.0");
    paused_at_step_1(scenario).await;
    let deployments = Api::<Deployment>::namespaced(scenario.client.clone(), &scenario.ns);
    for name in ["echo", "echo-canary"] {
        let ready = deployments
            .get(name)
            .await
            .expect(name)
            .status
            .and_then(|s| s.ready_replicas);
        assert_eq!(ready, Some(4), "{name} at full size during the preview");
    }
    let previewed = burst_with(&host, &[("x-preview", "yes")], 500, Duration::from_secs(60));
    assert_eq!(previewed.by_image.get(CANARY), Some(&500), "{}", summary(&previewed));
    let live = burst(&host, 500, Duration::from_secs(60));
    assert_eq!(live.by_image.get(STABLE), Some(&500), "{}", summary(&live));
    let before_switch = Counts::of(&load.answers());
    assert!(
        before_switch.answered() > 0 && before_switch.share(STABLE) == 1.0,
        "live requests while 2.0 came up and was previewed: {}",
        summary(&before_switch)
    );

    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("switched: paused at step 2, every request on 2.0", WAIT, || async {
        let status = status(scenario).await?;
        let at_switch = status.phase == Phase::Paused && status.canary_status?.current_step_index == 2;
        let answers = load.answers();
        let last: Vec<_> = answers.iter().rev().take(50).collect();
        (at_switch && last.len() == 50 && last.iter().all(|a| a.image == CANARY)).then_some(())
    })
    .await;
    (agent, load)
}

#[tokio::test]
async fn a_blue_green_release_is_previewed_then_switched_and_promoted_with_no_failed_request() {
    let scenario = Scenario::new("traffic-bg").await;
    let (_agent, load) = switched_to_green(&scenario).await;
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("promoted, the green copy removed and 2.0 answering", WAIT, || async {
        let healthy = status(&scenario).await?.phase == Phase::Healthy;
        let answers = load.answers();
        let last: Vec<_> = answers.iter().rev().take(50).collect();
        let all_new = last.len() == 50 && last.iter().all(|a| a.image == CANARY);
        (healthy && !canary_exists(&scenario).await && all_new).then_some(())
    })
    .await;
    let counts = Counts::of(&load.stop());
    assert!(counts.answered() > 100, "{}", summary(&counts));
    assert_eq!(
        counts.failures(),
        0,
        "failed requests across the switch and the promote: {}",
        summary(&counts)
    );
}

#[tokio::test]
async fn an_abort_after_the_blue_green_switch_puts_every_request_back_on_the_old_version() {
    let scenario = Scenario::new("traffic-bg-abort").await;
    let (_agent, load) = switched_to_green(&scenario).await;
    let (code, _, stderr) = scenario.run_cli(&["abort", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("the abort reported", WAIT, || async {
        support::agent::failed_or_reverted(&status(&scenario).await?).then_some(())
    })
    .await;
    let host = host(&scenario);
    // The old version never went away: once the gateway reloaded, every
    // request is on it.
    eventually("every request back on 1.0", ROUTER_RELOAD, || async {
        (burst(&host, 100, Duration::from_secs(10)).share(STABLE) == 1.0).then_some(())
    })
    .await;
    let after = burst(&host, 500, Duration::from_secs(30));
    assert_eq!(after.by_image.get(STABLE), Some(&500), "{}", summary(&after));
    let counts = Counts::of(&load.stop());
    assert_eq!(
        counts.failures(),
        0,
        "failed requests across the switch and the abort: {}",
        summary(&counts)
    );
}

#[tokio::test]
async fn gitcanary_convert_turns_kruises_v1alpha1_gateway_example_into_a_release_that_runs() {
    let scenario = Scenario::new("traffic-convert").await;
    // Kruise's v1alpha1 gateway example, in its shape, for this fixture.
    let kruise = format!(
        "apiVersion: rollouts.kruise.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: {}\nspec:\n  objectRef:\n    workloadRef:\n      apiVersion: apps/v1\n      kind: Deployment\n      name: echo\n  strategy:\n    canary:\n      steps:\n      - weight: 20\n        pause: {{}}\n      - weight: 40\n        pause: {{duration: 1}}\n      - weight: 100\n      trafficRoutings:\n      - service: echo\n        gateway:\n          httpRouteName: echo\n",
        scenario.ns
    );
    let rollout = scenario.repo.path().join("echo/rollout.yaml");
    let converted = |version: &str| {
        write_app(&scenario, version);
        scenario.repo.write("echo/rollout.yaml", &kruise);
        let output = support::agent::gitcanary()
            .args(["convert", "--write"])
            .arg(&rollout)
            .output()
            .expect("convert runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success() && stderr.contains("converted"), "{stderr}");
    };
    converted("1.0");
    scenario
        .repo
        .commit_and_push("echo 1.0, its Rollout converted from Kruise's");
    let _agent = scenario.start_agent();
    let host = host(&scenario);
    answering_on_1_0(&scenario).await;
    converted("2.0");
    scenario.repo.commit_and_push("echo 2.0");
    paused_at_step_1(&scenario).await;
    let counts = burst(&host, 2_000, Duration::from_secs(60));
    let share = counts.share(CANARY);
    assert!(
        (0.16..=0.24).contains(&share),
        "Kruise's weight 20: {}",
        summary(&counts)
    );
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("promoted through weight 40 and 100, 2.0 answering", WAIT, || async {
        let healthy = status(&scenario).await?.phase == Phase::Healthy;
        (healthy && burst(&host, 40, Duration::from_secs(10)).by_image.get(CANARY) == Some(&40)).then_some(())
    })
    .await;
}
