//! Canary releases end to end: the agent runs against a pushed repository
//! on the real control plane, and each test watches what a user would see.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use support::agent::Scenario;
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);

struct App<'a> {
    ns: &'a str,
    image: &'a str,
    replicas: u32,
    extra_pod_labels: &'a str,
    service_selector: &'a str,
    route: bool,
    ingress: bool,
    strategy: &'a str,
}

impl<'a> App<'a> {
    fn new(ns: &'a str, image: &'a str, strategy: &'a str) -> App<'a> {
        App {
            ns,
            image,
            replicas: 4,
            extra_pod_labels: "",
            service_selector: "{app: echo}",
            route: true,
            ingress: false,
            strategy,
        }
    }

    fn write(&self, scenario: &Scenario) {
        let App {
            ns,
            image,
            replicas,
            extra_pod_labels,
            service_selector,
            strategy,
            ..
        } = self;
        let mut files = vec![(
            "echo/deployment.yaml",
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: echo}}\n  template:\n    metadata:\n      labels: {{app: echo, version: base{extra_pod_labels}}}\n    spec:\n      containers:\n      - name: echo\n        image: registry.test/echo:{image}\n"
            ),
        )];
        files.push((
            "echo/service.yaml",
            format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  selector: {service_selector}\n  ports:\n  - port: 80\n    targetPort: 8080\n"),
        ));
        if self.route {
            files.push((
                "echo/route.yaml",
                format!("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  parentRefs: [{{name: public}}]\n  rules:\n  - backendRefs:\n    - {{name: echo, port: 80}}\n"),
            ));
        }
        if self.ingress {
            files.push((
                "echo/ingress.yaml",
                format!("apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  ingressClassName: nginx\n  rules:\n  - host: echo.example\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend:\n          service: {{name: echo, port: {{number: 80}}}}\n"),
            ));
        }
        files.push((
            "echo/rollout.yaml",
            format!("apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: echo}}\n  strategy:\n    canary:\n{strategy}"),
        ));
        for (path, content) in files {
            scenario.repo.write(path, &content);
        }
    }
}

const GATEWAY: &str = "      trafficRoutings:\n      - service: echo\n        gateway: {httpRouteName: echo}\n      gracePeriodSeconds: 1\n      progressDeadline: 60\n";

struct Cluster {
    client: kube::Client,
    ns: String,
}

impl Cluster {
    fn of(scenario: &Scenario) -> Cluster {
        Cluster {
            client: scenario.client.clone(),
            ns: scenario.ns.clone(),
        }
    }

    async fn rollout(&self) -> Option<Rollout> {
        Api::<Rollout>::namespaced(self.client.clone(), &self.ns)
            .get_opt("echo")
            .await
            .ok()
            .flatten()
    }

    async fn phase_and_step(&self) -> Option<(Phase, u32)> {
        let status = self.rollout().await?.status?;
        Some((status.phase, status.canary_status.map_or(0, |c| c.current_step_index)))
    }

    async fn deployment(&self, name: &str) -> Option<Deployment> {
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .ok()
            .flatten()
    }

    async fn image(&self, name: &str) -> Option<String> {
        self.deployment(name).await?.spec?.template.spec?.containers[0]
            .image
            .clone()
    }

    async fn available(&self, name: &str) -> i32 {
        self.deployment(name)
            .await
            .and_then(|d| d.status?.available_replicas)
            .unwrap_or(0)
    }

    async fn service_selector(&self, name: &str) -> Option<BTreeMap<String, String>> {
        Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .ok()
            .flatten()?
            .spec?
            .selector
    }

    /// (backend, weight) of the route's first rule.
    async fn weights(&self) -> Vec<(String, Option<i64>)> {
        let resource = ApiResource {
            group: "gateway.networking.k8s.io".into(),
            version: "v1".into(),
            api_version: "gateway.networking.k8s.io/v1".into(),
            kind: "HTTPRoute".into(),
            plural: "httproutes".into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &resource);
        let Ok(route) = api.get("echo").await else {
            return Vec::new();
        };
        route.data["spec"]["rules"][0]["backendRefs"]
            .as_array()
            .map(|refs| {
                refs.iter()
                    .map(|r| (r["name"].as_str().unwrap_or_default().to_string(), r["weight"].as_i64()))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn wait_for(&self, what: &str, phase: Phase, step: u32) {
        eventually(what, WAIT, || async {
            (self.phase_and_step().await == Some((phase, step))).then_some(())
        })
        .await;
    }

    async fn canary_pods(&self) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default().labels("gitcanary.io/rollout-id"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }
}

/// The route as Git has it: one backend, whose weight the API server defaults to 1.
fn restored() -> Vec<(String, Option<i64>)> {
    vec![w("echo", 1)]
}

fn w(name: &str, weight: i64) -> (String, Option<i64>) {
    (name.to_string(), Some(weight))
}

/// Version 1.0 pushed and running under a started agent.
async fn running_on_1_0(scenario: &Scenario, strategy: &str) -> (support::agent::AgentProcess, Cluster) {
    running(scenario, &App::new(&scenario.ns, "1.0", strategy)).await
}

/// `app` (at 1.0) pushed and running under a started agent.
async fn running(scenario: &Scenario, app: &App<'_>) -> (support::agent::AgentProcess, Cluster) {
    app.write(scenario);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = scenario.start_agent();
    let cluster = Cluster::of(scenario);
    healthy_with(scenario, &cluster, "1.0").await;
    (agent, cluster)
}

async fn healthy_with(scenario: &Scenario, cluster: &Cluster, image: &str) {
    eventually("the stable Deployment serves the image", WAIT, || async {
        let ok = cluster.image("echo").await.as_deref() == Some(&format!("registry.test/echo:{image}") as &str)
            && cluster.available("echo").await == 4
            && cluster.rollout().await?.status?.phase == Phase::Healthy;
        ok.then_some(())
    })
    .await;
    let _ = scenario;
}

#[tokio::test]
async fn three_step_deployment_canary_moves_httproute_weights_and_is_promoted() {
    let scenario = Scenario::new("ro-gateway").await;
    let strategy = format!(
        "      steps:\n      - {{traffic: 25%, replicas: 1, pause: {{duration: 1}}}}\n      - {{traffic: 50%, replicas: 50%, pause: {{}}}}\n      - {{traffic: 100%, replicas: 100%}}\n{GATEWAY}"
    );
    let (_agent, cluster) = running_on_1_0(&scenario, &strategy).await;
    assert!(
        cluster.deployment("echo-canary").await.is_none(),
        "no release for the first version"
    );

    App::new(&scenario.ns, "2.0", &strategy).write(&scenario);
    let commit = scenario.repo.commit_and_push("echo 2.0");

    // Step 1: one canary pod, 25% of requests, stable untouched.
    eventually("25% to the canary", WAIT, || async {
        (cluster.weights().await == vec![w("echo", 75), w("echo-canary", 25)]).then_some(())
    })
    .await;
    assert_eq!(cluster.image("echo").await.as_deref(), Some("registry.test/echo:1.0"));
    assert_eq!(
        cluster.image("echo-canary").await.as_deref(),
        Some("registry.test/echo:2.0")
    );
    let stable_selector = cluster.service_selector("echo").await.expect("stable service");
    assert!(
        stable_selector.contains_key("pod-template-hash"),
        "stable Service pinned: {stable_selector:?}"
    );
    let canary_selector = cluster.service_selector("echo-canary").await.expect("canary service");
    assert_eq!(canary_selector.get("app").map(String::as_str), Some("echo"));
    assert_ne!(
        canary_selector.get("pod-template-hash"),
        stable_selector.get("pod-template-hash")
    );

    // Step 2: half the pods and half the requests, then a pause until promoted.
    cluster.wait_for("paused at step 2", Phase::Paused, 2).await;
    assert_eq!(cluster.weights().await, vec![w("echo", 50), w("echo-canary", 50)]);
    let canary = cluster.deployment("echo-canary").await.expect("canary");
    assert_eq!(canary.spec.and_then(|s| s.replicas), Some(2));
    let rollout = cluster.rollout().await.expect("rollout");
    let status = rollout.status.expect("status");
    assert_eq!(status.canary_commit, commit);
    assert_eq!(status.rollout_id, commit[..7]);

    // Each canary pod says which release and which step created it.
    let batches = eventually("both batches labelled", WAIT, || async {
        let pods = cluster.canary_pods().await;
        let mut batches: Vec<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| {
                p.metadata
                    .labels
                    .as_ref()?
                    .get("gitcanary.io/rollout-batch-id")
                    .cloned()
            })
            .collect();
        batches.sort();
        (batches.len() == 2).then_some(batches)
    })
    .await;
    assert_eq!(batches, vec!["1", "2"]);
    for pod in cluster.canary_pods().await {
        assert_eq!(
            pod.metadata.labels.expect("labels")["gitcanary.io/rollout-id"],
            commit[..7]
        );
    }

    let (code, stdout, _) = scenario.run_cli(&["status", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0);
    assert!(stdout.contains("step 2/3"), "{stdout}");
    assert!(
        stdout.contains(&format!("gitcanary promote echo -n {}", scenario.ns)),
        "{stdout}"
    );

    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");

    // Promoted: stable runs 2.0, routes and Services as Git has them, canary gone.
    healthy_with(&scenario, &cluster, "2.0").await;
    eventually("canary removed and routes restored", WAIT, || async {
        let clean = cluster.deployment("echo-canary").await.is_none()
            && cluster.service_selector("echo-canary").await.is_none()
            && cluster.weights().await == restored();
        clean.then_some(())
    })
    .await;
    // The stable Service is Git's again once the canary's pods are gone.
    eventually("the stable Service as Git has it", WAIT, || async {
        let selector = cluster.service_selector("echo").await?;
        (selector == BTreeMap::from([("app".to_string(), "echo".to_string())])).then_some(())
    })
    .await;
    let rollout = cluster.rollout().await.expect("rollout");
    let status = rollout.status.expect("status");
    assert_eq!(status.stable_commit, commit);

    // `kubectl describe rollout` tells the story through Events: they name
    // this Rollout by its uid, as `describe` finds them.
    let uid = rollout.metadata.uid.expect("uid");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let wanted = ["ReleaseStarted", "StepChanged", "GatePassed", "Promoted"];
    // Events follow the status writes.
    eventually("the release's Events", WAIT, || async {
        let reasons: Vec<String> = events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| {
                e.regarding
                    .as_ref()
                    .is_some_and(|r| r.kind.as_deref() == Some("Rollout") && r.uid.as_ref() == Some(&uid))
            })
            .filter_map(|e| e.reason)
            .collect();
        wanted.iter().all(|w| reasons.iter().any(|r| r == w)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_canary_that_never_becomes_ready_fails_at_the_deadline_and_traffic_returns() {
    let scenario = Scenario::new("ro-deadline").await;
    // hold: no revert commit, so the failed version stays in Git and must not be retried.
    let strategy = "      steps:\n      - {traffic: 20%, replicas: 1, pause: {}}\n      trafficRoutings:\n      - service: echo\n        gateway: {httpRouteName: echo}\n      gracePeriodSeconds: 1\n      progressDeadline: 4s\n      onFailure: hold\n";
    let (agent, cluster) = running_on_1_0(&scenario, strategy).await;

    let mut broken = App::new(&scenario.ns, "2.0-broken", strategy);
    broken.extra_pod_labels = ", gitcanary.test/never-ready: \"true\"";
    broken.write(&scenario);
    scenario.repo.commit_and_push("echo 2.0, broken");
    eventually("a canary pod exists", WAIT, || async {
        cluster.deployment("echo-canary").await.map(|_| ())
    })
    .await;
    eventually("the release fails", WAIT, || async {
        (cluster.phase_and_step().await?.0 == Phase::Failed).then_some(())
    })
    .await;
    let status = cluster.rollout().await.expect("rollout").status.expect("status");
    let message = status.canary_status.expect("canary status").message;
    assert!(
        message.contains("not ready within 4s: 0/1 ready at step 1"),
        "{message}"
    );
    assert!(message.contains("holding for a fix in Git"), "{message}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    // The Event follows the status write.
    let failed = eventually("a ReleaseFailed Event", WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ReleaseFailed"))
    })
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert!(failed.note.unwrap_or_default().contains("not ready within 4s"));
    eventually("canary removed", WAIT, || async {
        cluster.deployment("echo-canary").await.is_none().then_some(())
    })
    .await;
    assert_eq!(cluster.weights().await, restored());
    assert_eq!(cluster.image("echo").await.as_deref(), Some("registry.test/echo:1.0"));
    // It stays failed (no second attempt) while Git still asks for the broken version.
    agent.resyncs(2).await;
    assert!(cluster.deployment("echo-canary").await.is_none());
    assert_eq!(cluster.phase_and_step().await.map(|p| p.0), Some(Phase::Failed));
}

#[tokio::test]
async fn the_seed_selector_conflict_is_refused_with_the_fix_and_then_runs() {
    let scenario = Scenario::new("ro-selector").await;
    let conflicting = format!(
        "      steps:\n      - {{traffic: 10%, replicas: 1, pause: {{}}}}\n      patchPodTemplateMetadata: {{labels: {{version: canary}}}}\n{GATEWAY}"
    );
    let mut app = App::new(&scenario.ns, "1.0", &conflicting);
    app.service_selector = "{app: echo, version: base}";
    let (_agent, cluster) = running(&scenario, &app).await;

    app.image = "2.0";
    app.write(&scenario);
    scenario.repo.commit_and_push("echo 2.0");
    let message = eventually("the release is refused", WAIT, || async {
        let status = cluster.rollout().await?.status?;
        (status.phase == Phase::Failed).then(|| status.canary_status.map(|c| c.message).unwrap_or_default())
    })
    .await;
    assert!(message.contains("version=base"), "{message}");
    assert!(
        message.contains("add \"version\" to canaryService.selector.remove"),
        "{message}"
    );
    assert!(
        cluster.deployment("echo-canary").await.is_none(),
        "no canary pod before the check passes"
    );

    let fixed = format!("{conflicting}      canaryService:\n        selector: {{remove: [version]}}\n");
    app.strategy = &fixed;
    app.write(&scenario);
    scenario.repo.commit_and_push("drop version from the canary selector");
    cluster.wait_for("the release runs", Phase::Paused, 1).await;
    let selector = cluster.service_selector("echo-canary").await.expect("canary service");
    assert!(!selector.contains_key("version"), "{selector:?}");
    let pods = cluster.canary_pods().await;
    assert!(
        pods.iter()
            .all(|p| p.metadata.labels.as_ref().expect("labels")["version"] == "canary")
    );
}

/// 1.0 running under a started agent, then 2.0 pushed and paused for a
/// promote at its one step of 30%.
async fn paused_at_30_percent(scenario: &Scenario) -> (support::agent::AgentProcess, Cluster) {
    let strategy = format!("      steps:\n      - {{traffic: 30%, replicas: 1, pause: {{}}}}\n{GATEWAY}");
    let (agent, cluster) = running_on_1_0(scenario, &strategy).await;
    App::new(&scenario.ns, "2.0", &strategy).write(scenario);
    scenario.repo.commit_and_push("echo 2.0");
    cluster.wait_for("paused at step 1", Phase::Paused, 1).await;
    (agent, cluster)
}

#[tokio::test]
async fn abort_from_the_cli_returns_traffic_and_removes_the_canary() {
    let scenario = Scenario::new("ro-abort").await;
    let (_agent, cluster) = paused_at_30_percent(&scenario).await;
    assert_eq!(cluster.weights().await, vec![w("echo", 70), w("echo-canary", 30)]);
    // Mid-release the cluster is what Git plus the rollout asks for: diff sees no change.
    let (code, stdout, stderr) = scenario.diff();
    assert_eq!(code, 0, "diff mid-release: {stdout}{stderr}");

    let (code, _, stderr) = scenario.run_cli(&["abort", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("aborted and cleaned up", WAIT, || async {
        let status = cluster.rollout().await?.status?;
        let done = support::agent::failed_or_reverted(&status)
            && cluster.deployment("echo-canary").await.is_none()
            && cluster.weights().await == restored();
        done.then_some(())
    })
    .await;
    let status = cluster.rollout().await.expect("rollout").status.expect("status");
    assert!(status.canary_status.expect("canary").message.starts_with("aborted"));
    assert_eq!(cluster.image("echo").await.as_deref(), Some("registry.test/echo:1.0"));
    let (code, _, stderr) = scenario.run_cli(&["promote", "missing", "-n", &scenario.ns]);
    assert_eq!(code, 2);
    assert!(stderr.contains("Rollout") && stderr.contains("missing"), "{stderr}");
}

/// API requests the agent sent besides starting its watches and renewing
/// its leader Lease, which go on whatever the syncs do.
async fn requests_besides_watches(agent: &support::agent::AgentProcess) -> u64 {
    let counts = agent
        .counters(&[
            "gitcanary_kube_requests_total{kind=\"read\"}",
            "gitcanary_kube_requests_total{kind=\"write\"}",
            "gitcanary_kube_requests_total{kind=\"dry_run\"}",
            "gitcanary_kube_reads_total{kind=\"watch\"}",
            "gitcanary_kube_lease_requests_total",
        ])
        .await;
    counts[0] + counts[1] + counts[2] - counts[3] - counts[4]
}

#[tokio::test]
async fn a_release_paused_for_a_promote_costs_no_request_while_nothing_changes() {
    let scenario = Scenario::new("ro-at-rest").await;
    let (agent, cluster) = paused_at_30_percent(&scenario).await;
    const RECALLED: &str = "gitcanary_apps_recalled_total";
    eventually("a resync answers for the paused app from memory", WAIT, || async {
        let recalled = agent.counter(RECALLED).await;
        agent.resync().await;
        (agent.counter(RECALLED).await > recalled).then_some(())
    })
    .await;
    let (requests, syncs) = (requests_besides_watches(&agent).await, agent.syncs().await);
    for _ in 0..3 {
        agent.resync().await;
    }
    assert_eq!(
        requests_besides_watches(&agent).await,
        requests,
        "{} resyncs of a paused release sent requests",
        agent.syncs().await - syncs
    );
    // Nor do its own polls: at rest they find the head where it was and sync nothing.
    let polls_at_rest = || agent.counter("gitcanary_git_polls_at_rest_total");
    let (polls, syncs) = (polls_at_rest().await, agent.syncs().await);
    eventually("two polls at rest", WAIT, || async {
        (polls_at_rest().await >= polls + 2).then_some(())
    })
    .await;
    assert_eq!(agent.syncs().await, syncs, "a poll at rest syncs nothing");
    assert_eq!(requests_besides_watches(&agent).await, requests, "nor sends a request");
    assert_eq!(cluster.weights().await, vec![w("echo", 70), w("echo-canary", 30)]);

    // At rest is not asleep: a promote, and a drift of the canary, are acted on.
    Api::<Deployment>::namespaced(scenario.client.clone(), &scenario.ns)
        .patch(
            "echo-canary",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale the canary by hand");
    eventually("the canary's drift is put back", WAIT, || async {
        let canary = cluster.deployment("echo-canary").await?;
        (canary.spec?.replicas == Some(1)).then_some(())
    })
    .await;
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    healthy_with(&scenario, &cluster, "2.0").await;
}

#[tokio::test]
async fn a_release_is_observed_from_the_watch_caches_not_read_again() {
    let scenario = Scenario::new("ro-cached").await;
    let strategy = format!("      steps:\n      - {{traffic: 30%, replicas: 1, pause: {{}}}}\n{GATEWAY}");
    App::new(&scenario.ns, "1.0", &strategy).write(&scenario);
    scenario.repo.commit_and_push("echo 1.0");
    // Every request the agent sends, in its log.
    let trace = [("GITCANARY_LOG", "gitcanary=debug,gitcanary::cluster::requests=trace")];
    let agent =
        support::agent::AgentProcess::start_with(&scenario.repo, &scenario.ns, scenario.cache.path(), &[], &trace);
    let cluster = Cluster::of(&scenario);
    healthy_with(&scenario, &cluster, "1.0").await;
    App::new(&scenario.ns, "2.0", &strategy).write(&scenario);
    scenario.repo.commit_and_push("echo 2.0");
    cluster.wait_for("paused at step 1", Phase::Paused, 1).await;
    agent.resyncs(1).await;
    let before = std::fs::read_to_string(&agent.log).expect("the agent's log").len();

    // A drift of the canary: its app is planned again, its Rollout observed.
    Api::<Deployment>::namespaced(scenario.client.clone(), &scenario.ns)
        .patch(
            "echo-canary",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale the canary by hand");
    eventually("the canary's drift is put back", WAIT, || async {
        let canary = cluster.deployment("echo-canary").await?;
        (canary.spec?.replicas == Some(1)).then_some(())
    })
    .await;
    agent.resyncs(1).await;
    let requests = agent.requests_since(before);
    let requests: Vec<(&str, &str)> = requests.iter().map(|(m, p)| (m.as_str(), p.as_str())).collect();
    assert!(
        requests.contains(&(
            "PATCH",
            format!("/apis/apps/v1/namespaces/{}/deployments/echo-canary", scenario.ns).as_str()
        )),
        "the drift's sync is in the log: {requests:#?}"
    );
    let ns = &scenario.ns;
    // The workload, canary objects, route, the ReplicaSets that name the
    // revisions' pod-template-hash and the canary pods the step labels with
    // its batch: the watches keep them. (The Rollout itself is read: its
    // status is the release's state.)
    for kept in [
        format!("/apis/apps/v1/namespaces/{ns}/replicasets"),
        format!("/api/v1/namespaces/{ns}/pods"),
        format!("/apis/apps/v1/namespaces/{ns}/deployments/echo"),
        format!("/apis/apps/v1/namespaces/{ns}/deployments/echo-canary"),
        format!("/api/v1/namespaces/{ns}/services/echo-canary"),
        format!("/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/echo"),
    ] {
        let reads: Vec<_> = requests
            .iter()
            .filter(|(method, path)| *method == "GET" && *path == kept)
            .collect();
        assert!(reads.is_empty(), "{kept} was read though a watch keeps it: {reads:#?}");
    }
}

#[tokio::test]
async fn an_abort_never_waits_for_the_render_of_a_newer_commit() {
    let scenario = Scenario::new("ro-slow-render").await;
    let strategy = format!("      steps:\n      - {{traffic: 30%, replicas: 1, pause: {{}}}}\n{GATEWAY}");
    App::new(&scenario.ns, "1.0", &strategy).write(&scenario);
    scenario.repo.commit_and_push("echo 1.0");
    let agent = support::agent::AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        scenario.cache.path(),
        &["--render-timeout", "30"],
        &[],
    );
    let cluster = Cluster::of(&scenario);
    healthy_with(&scenario, &cluster, "1.0").await;
    App::new(&scenario.ns, "2.0", &strategy).write(&scenario);
    scenario.repo.commit_and_push("echo 2.0");
    cluster.wait_for("paused at step 1", Phase::Paused, 1).await;

    // Someone who may push to another app adds a chart that renders until its deadline.
    scenario
        .repo
        .write("spin/Chart.yaml", "apiVersion: v2\nname: spin\nversion: 0.1.0\n")
        .write(
            "spin/templates/cm.yaml",
            "{{- range until 100000 }}{{- range until 100000 }}{{- end }}{{- end }}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: spin\n",
        );
    scenario.repo.commit_and_push("a chart that spins");
    let rendering = || agent.counter("gitcanary_renders_running");
    eventually("the agent renders the newer commit", WAIT, || async {
        (rendering().await >= 1).then_some(())
    })
    .await;

    let (code, _, stderr) = scenario.run_cli(&["abort", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("aborted, traffic back on stable", WAIT, || async {
        let status = cluster.rollout().await?.status?;
        let done = support::agent::failed_or_reverted(&status) && cluster.weights().await == restored();
        done.then_some(())
    })
    .await;
    assert!(
        rendering().await >= 1,
        "the abort was acted on while the render still ran, not after its deadline"
    );
}

#[tokio::test]
async fn a_commit_back_to_stable_rolls_back_at_once_and_a_third_template_restarts() {
    let scenario = Scenario::new("ro-newcommit").await;
    let strategy = format!(
        "      steps:\n      - {{traffic: 10%, replicas: 1, pause: {{}}}}\n      - {{traffic: 100%}}\n{GATEWAY}"
    );
    let (_agent, cluster) = running_on_1_0(&scenario, &strategy).await;

    App::new(&scenario.ns, "2.0", &strategy).write(&scenario);
    let v2 = scenario.repo.commit_and_push("echo 2.0");
    cluster.wait_for("paused at step 1", Phase::Paused, 1).await;
    App::new(&scenario.ns, "3.0", &strategy).write(&scenario);
    let v3 = scenario.repo.commit_and_push("echo 3.0");
    eventually("the canary runs 3.0", WAIT, || async {
        (cluster.image("echo-canary").await.as_deref() == Some("registry.test/echo:3.0")).then_some(())
    })
    .await;
    // The canary Deployment is written before the status: wait for the status of the 3.0 release.
    let status = eventually("3.0 paused at step 1", WAIT, || async {
        let status = cluster.rollout().await?.status?;
        let step = status.canary_status.as_ref()?.current_step_index;
        (status.canary_commit == v3 && status.phase == Phase::Paused && step == 1).then_some(status)
    })
    .await;
    assert_eq!(status.superseded.len(), 1, "{status:#?}");
    assert_eq!(status.superseded[0].commit, v2);

    App::new(&scenario.ns, "1.0", &strategy).write(&scenario);
    scenario.repo.commit_and_push("back to 1.0");
    eventually("fast rollback", WAIT, || async {
        let done = cluster.phase_and_step().await?.0 == Phase::Healthy
            && cluster.deployment("echo-canary").await.is_none()
            && cluster.weights().await == restored();
        done.then_some(())
    })
    .await;
    assert_eq!(cluster.image("echo").await.as_deref(), Some("registry.test/echo:1.0"));
    let status = cluster.rollout().await.expect("rollout").status.expect("status");
    assert_eq!(status.superseded.len(), 2);
}

#[tokio::test]
async fn the_agent_killed_mid_step_resumes_without_repeating_it() {
    let scenario = Scenario::new("ro-kill").await;
    let strategy = format!(
        "      steps:\n      - {{traffic: 20%, replicas: 1, pause: {{duration: 6}}}}\n      - {{traffic: 60%, replicas: 2, pause: {{}}}}\n{GATEWAY}"
    );
    let (mut agent, cluster) = running_on_1_0(&scenario, &strategy).await;
    App::new(&scenario.ns, "2.0", &strategy).write(&scenario);
    scenario.repo.commit_and_push("echo 2.0");
    eventually("step 1 routed", WAIT, || async {
        (cluster.weights().await == vec![w("echo", 80), w("echo-canary", 20)]).then_some(())
    })
    .await;
    let canary_uid = cluster.deployment("echo-canary").await.expect("canary").metadata.uid;
    let before = cluster.rollout().await.expect("rollout").status.expect("status");
    let step_1 = before.step_history.first().cloned().expect("step 1 recorded");
    assert_eq!(step_1.step, 1);
    agent.kill();

    // The next agent waits out what is left of step 1's pause, from its recorded start.
    let _agent = scenario.start_agent();
    let seen = std::cell::RefCell::new(Vec::new());
    eventually("paused at step 2 after the restart", WAIT, || async {
        let weights = cluster.weights().await;
        if let Some((_, Some(canary))) = weights.get(1) {
            seen.borrow_mut().push(*canary);
        }
        (cluster.phase_and_step().await == Some((Phase::Paused, 2))).then_some(())
    })
    .await;
    let seen = seen.into_inner();
    assert!(seen.iter().all(|w| *w >= 20), "traffic never went backwards: {seen:?}");
    assert_eq!(cluster.weights().await, vec![w("echo", 40), w("echo-canary", 60)]);
    let canary = cluster.deployment("echo-canary").await.expect("canary");
    assert_eq!(
        canary.metadata.uid, canary_uid,
        "the same canary Deployment, not a second one"
    );
    let history = cluster
        .rollout()
        .await
        .expect("rollout")
        .status
        .expect("status")
        .step_history;
    let steps: Vec<u32> = history.iter().map(|r| r.step).collect();
    assert_eq!(steps, vec![1, 2], "step 1 once, then step 2: {history:?}");
    assert_eq!(
        history[0].started_at, step_1.started_at,
        "step 1 kept the start it had before the kill: {history:?}"
    );
    let at = |text: &str| text.parse::<jiff::Timestamp>().expect("a time");
    let paused = at(&history[0].finished_at).duration_since(at(&history[0].started_at));
    assert!(
        paused >= jiff::SignedDuration::from_secs(6),
        "step 1's pause was served in full across the restart: {history:?}"
    );
}

#[tokio::test]
async fn putting_a_rollout_on_a_running_deployment_restarts_no_pod() {
    let scenario = Scenario::new("ro-adopt").await;
    let cluster = Cluster::of(&scenario);
    let app = App::new(&scenario.ns, "1.0", "      steps:\n      - {replicas: 1, pause: {}}\n");
    app.write(&scenario);
    // The Deployment already runs, created by someone else from the same
    // manifest; the manifest asks gitcanary to adopt it.
    let path = scenario.repo.path().join("echo/deployment.yaml");
    let manifest = std::fs::read_to_string(&path).expect("manifest").replacen(
        "metadata:\n",
        "metadata:\n  annotations: {gitcanary.io/adopt: \"true\"}\n",
        1,
    );
    std::fs::write(&path, &manifest).expect("written");
    let deployment: Deployment = serde_saphyr::from_str(&manifest).expect("a Deployment");
    Api::<Deployment>::namespaced(scenario.client.clone(), &scenario.ns)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("created by hand");
    eventually("running", WAIT, || async {
        (cluster.available("echo").await == 4).then_some(())
    })
    .await;
    let pods = |cluster: &Cluster| {
        let api = Api::<Pod>::namespaced(cluster.client.clone(), &cluster.ns);
        async move {
            let mut uids: Vec<String> = api
                .list(&ListParams::default().labels("app=echo"))
                .await
                .expect("pods")
                .items
                .into_iter()
                .filter_map(|p| p.metadata.uid)
                .collect();
            uids.sort();
            uids
        }
    };
    let before = pods(&cluster).await;

    scenario.repo.commit_and_push("echo under gitcanary");
    let agent = scenario.start_agent();
    eventually("adopted", WAIT, || async {
        (cluster.phase_and_step().await.map(|p| p.0) == Some(Phase::Healthy)).then_some(())
    })
    .await;
    agent.resyncs(2).await;
    assert_eq!(pods(&cluster).await, before, "no pod was replaced");
    assert!(cluster.deployment("echo-canary").await.is_none());
}

/// 1.0 behind an nginx Ingress, then 2.0 pushed and paused at its one
/// step, `percent` of requests on the canary.
async fn paused_behind_nginx(scenario: &Scenario, percent: u32) -> (support::agent::AgentProcess, Cluster) {
    let strategy = format!(
        "      steps:\n      - {{traffic: {percent}%, replicas: 1, pause: {{}}}}\n      trafficRoutings:\n      - service: echo\n        ingress: {{name: echo, classType: nginx}}\n      gracePeriodSeconds: 1\n"
    );
    let mut app = App::new(&scenario.ns, "1.0", &strategy);
    app.route = false;
    app.ingress = true;
    let (agent, cluster) = running(scenario, &app).await;
    app.image = "2.0";
    app.write(scenario);
    scenario.repo.commit_and_push("echo 2.0");
    cluster.wait_for("paused at step 1", Phase::Paused, 1).await;
    (agent, cluster)
}

#[tokio::test]
async fn nginx_ingress_gets_a_weighted_canary_ingress_during_the_release() {
    let scenario = Scenario::new("ro-nginx").await;
    let (_agent, cluster) = paused_behind_nginx(&scenario, 40).await;
    let ingresses: Api<Ingress> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let canary = ingresses.get("echo-canary").await.expect("canary ingress");
    let annotations = canary.metadata.annotations.expect("annotations");
    assert_eq!(annotations["nginx.ingress.kubernetes.io/canary"], "true");
    assert_eq!(annotations["nginx.ingress.kubernetes.io/canary-weight"], "40");
    let rules = canary.spec.expect("spec").rules.expect("rules");
    let backend = &rules[0].http.as_ref().expect("http").paths[0].backend;
    assert_eq!(backend.service.as_ref().expect("service").name, "echo-canary");

    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    healthy_with(&scenario, &cluster, "2.0").await;
    eventually("canary ingress removed", WAIT, || async {
        ingresses.get_opt("echo-canary").await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Kruise Rollout's v1beta1 e2e bases in their shape (written for this
/// fixture: its names, shorter pauses), with only the apiVersion changed.
const KRUISE_BLUE_GREEN: &str = "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: NS\nspec:\n  workloadRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: echo\n  strategy:\n    blueGreen:\n      steps:\n      - replicas: 50%\n        traffic: 0%\n        pause: {}\n      - replicas: 100%\n        traffic: 0%\n      - replicas: 100%\n        traffic: 50%\n      - replicas: 100%\n        traffic: 100%\n      trafficRoutings:\n      - service: echo\n        ingress:\n          classType: nginx\n          name: echo\n";
const KRUISE_CANARY: &str = "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: echo\n  namespace: NS\nspec:\n  workloadRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: echo\n  strategy:\n    canary:\n      enableExtraWorkloadForCanary: true\n      steps:\n      - traffic: 20%\n        replicas: 20%\n        pause: {}\n      - traffic: 40%\n        replicas: 40%\n        pause: {duration: 1}\n      - traffic: 100%\n        replicas: 100%\n        pause: {duration: 0}\n      trafficRoutings:\n      - service: echo\n        ingress:\n          classType: nginx\n          name: echo\n";

/// `rollout` (a Kruise file) governing the echo app behind an nginx
/// Ingress: 1.0 released, 2.0 pushed and paused at step 1, where the
/// canary Deployment runs `pods` and the canary Ingress weighs `weight`;
/// then promoted through its other steps (`steps` in all) to 2.0.
async fn kruise_file_runs(scenario: &Scenario, rollout: &str, steps: u32, (pods, weight): (i32, &str)) {
    let mut app = App::new(&scenario.ns, "1.0", "");
    app.route = false;
    app.ingress = true;
    let rollout = rollout.replace("NS", &scenario.ns);
    app.write(scenario);
    scenario.repo.write("echo/rollout.yaml", &rollout);
    scenario.repo.commit_and_push("echo 1.0");
    let _agent = scenario.start_agent();
    let cluster = Cluster::of(scenario);
    healthy_with(scenario, &cluster, "1.0").await;
    app.image = "2.0";
    app.write(scenario);
    scenario.repo.write("echo/rollout.yaml", &rollout);
    scenario.repo.commit_and_push("echo 2.0");
    cluster.wait_for("paused at step 1", Phase::Paused, 1).await;
    let canary = cluster.deployment("echo-canary").await.expect("the canary Deployment");
    assert_eq!(canary.spec.and_then(|s| s.replicas), Some(pods));
    let stable = cluster.deployment("echo").await.expect("the stable Deployment");
    assert_eq!(
        stable.spec.and_then(|s| s.replicas),
        Some(4),
        "the stable Deployment untouched"
    );
    let ingresses: Api<Ingress> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let annotations = ingresses
        .get("echo-canary")
        .await
        .expect("the canary Ingress")
        .metadata
        .annotations
        .expect("annotations");
    assert_eq!(annotations["nginx.ingress.kubernetes.io/canary-weight"], weight);
    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    healthy_with(scenario, &cluster, "2.0").await;
    let history: Vec<u32> = cluster
        .rollout()
        .await
        .and_then(|r| r.status)
        .expect("status")
        .step_history
        .iter()
        .map(|r| r.step)
        .collect();
    assert_eq!(history, (1..=steps).collect::<Vec<_>>(), "every step ran");
}

#[tokio::test]
async fn kruises_blue_green_base_runs_with_only_its_api_version_changed() {
    let scenario = Scenario::new("ro-kruise-bg").await;
    // Half the new version's pods beside all of the old, nothing routed to them.
    kruise_file_runs(&scenario, KRUISE_BLUE_GREEN, 4, (2, "0")).await;
}

#[tokio::test]
async fn kruises_canary_base_runs_with_only_its_api_version_changed() {
    let scenario = Scenario::new("ro-kruise-canary").await;
    kruise_file_runs(&scenario, KRUISE_CANARY, 3, (1, "20")).await;
}

/// The resourceVersion of the deletion of `name`, once a watch sees it:
/// one API server's resourceVersions order its writes across kinds.
/// Returns once the watch has listed, so no deletion after the call is missed.
async fn deletion_revision<K>(api: Api<K>, name: &str) -> tokio::task::JoinHandle<u64>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (listed, on_listed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                }
                Ok(watcher::Event::Delete(object)) => {
                    return object
                        .meta()
                        .resource_version
                        .as_deref()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                }
                _ => {}
            }
        }
        0
    });
    tokio::time::timeout(WAIT, on_listed)
        .await
        .expect("the watch lists within the wait")
        .expect("the watch task runs");
    task
}

#[tokio::test]
async fn an_abort_takes_the_canary_ingress_away_before_the_canary_pods() {
    let scenario = Scenario::new("ro-nginx-abort").await;
    let (_agent, cluster) = paused_behind_nginx(&scenario, 30).await;
    let ingresses: Api<Ingress> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let deployments: Api<Deployment> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let services: Api<Service> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    assert!(ingresses.get_opt("echo-canary").await.expect("read").is_some());
    let ingress_gone = deletion_revision(ingresses, "echo-canary").await;
    let service_gone = deletion_revision(services, "echo-canary").await;
    let deployment_gone = deletion_revision(deployments, "echo-canary").await;

    let (code, _, stderr) = scenario.run_cli(&["abort", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    let within = async |task: tokio::task::JoinHandle<u64>| {
        tokio::time::timeout(WAIT, task).await.expect("deleted").expect("watch")
    };
    let ingress = within(ingress_gone).await;
    let service = within(service_gone).await;
    let deployment = within(deployment_gone).await;
    // While the canary Ingress exists, its share needs the canary Service and pods.
    assert!(
        ingress < service && service < deployment,
        "deleted at revisions: Ingress {ingress}, Service {service}, Deployment {deployment}"
    );
    eventually("aborted", WAIT, || async {
        let status = cluster.rollout().await?.status?;
        support::agent::failed_or_reverted(&status).then_some(())
    })
    .await;
}

/// A StatefulSet `db` of three pods on `image`, released by a Rollout with `steps`.
fn write_db(scenario: &Scenario, image: &str, steps: &str) {
    let ns = &scenario.ns;
    scenario.repo.write(
        "db/statefulset.yaml",
        &format!("apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: db\n  namespace: {ns}\nspec:\n  replicas: 3\n  serviceName: db\n  podManagementPolicy: Parallel\n  selector:\n    matchLabels: {{app: db}}\n  template:\n    metadata:\n      labels: {{app: db}}\n    spec:\n      containers:\n      - name: db\n        image: registry.test/db:{image}\n"),
    );
    scenario.repo.write(
        "db/rollout.yaml",
        &format!("apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: db\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: StatefulSet, name: db}}\n  strategy:\n    canary:\n      steps:\n{steps}"),
    );
}

#[tokio::test]
async fn a_statefulset_step_counts_its_ready_pods_and_finds_its_batch_without_a_list() {
    let scenario = Scenario::new("ro-sts-kept").await;
    let ns = scenario.ns.clone();
    let steps = "      - {replicas: 1, pause: {}}\n      - {replicas: 3}\n";
    write_db(&scenario, "1", steps);
    scenario.repo.commit_and_push("db 1");
    let trace = [("GITCANARY_LOG", "gitcanary=info,gitcanary::cluster::requests=trace")];
    let agent = support::agent::AgentProcess::start_with(&scenario.repo, &ns, scenario.cache.path(), &[], &trace);
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &ns);
    let phase_and_step = || async {
        let status = rollouts.get("db").await.ok()?.status?;
        Some((status.phase, status.canary_status.map_or(0, |c| c.current_step_index)))
    };
    eventually("db healthy", WAIT, || async {
        (phase_and_step().await?.0 == Phase::Healthy).then_some(())
    })
    .await;
    write_db(&scenario, "2", steps);
    scenario.repo.commit_and_push("db 2");
    eventually("paused at step 1 with its pod ready and labelled", WAIT, || async {
        let paused = phase_and_step().await? == (Phase::Paused, 1);
        let pod = Api::<Pod>::namespaced(scenario.client.clone(), &ns)
            .get("db-2")
            .await
            .ok()?;
        let labelled = pod
            .metadata
            .labels?
            .get("gitcanary.io/rollout-batch-id")
            .map(String::as_str)
            == Some("1");
        (paused && labelled).then_some(())
    })
    .await;
    // Someone annotates the Rollout: its app is planned again, the step observed.
    let before = agent
        .annotate_rollout_and_wait_for_its_app(&scenario.client, &ns, "db", "db")
        .await;
    assert_eq!(phase_and_step().await, Some((Phase::Paused, 1)), "still at step 1");
    let requests = agent.requests_since(before);
    assert!(
        requests.iter().any(|(_, path)| path.ends_with("/rollouts/db")),
        "the app's sync is in the log: {requests:#?}"
    );
    // The ready canary pods (the StatefulSet's status says) and the batch
    // labels (the pod watch keeps them).
    let listed: Vec<_> = requests
        .iter()
        .filter(|(method, path)| method == "GET" && *path == format!("/api/v1/namespaces/{ns}/pods"))
        .collect();
    assert!(
        listed.is_empty(),
        "the step listed pods though a watch keeps them: {listed:#?}"
    );
}

#[tokio::test]
async fn a_statefulset_is_released_in_three_batches_through_its_partition() {
    let scenario = Scenario::new("ro-sts").await;
    let ns = scenario.ns.clone();
    let steps = "      - {replicas: 1, pause: {duration: 2}}\n      - {replicas: 2, pause: {duration: 2}}\n      - {replicas: 3}\n";
    let write = |image: &str| write_db(&scenario, image, steps);
    write("1");
    scenario.repo.commit_and_push("db 1");
    // Every request the agent sends, in its log.
    let trace = [("GITCANARY_LOG", "gitcanary=info,gitcanary::cluster::requests=trace")];
    let agent = support::agent::AgentProcess::start_with(&scenario.repo, &ns, scenario.cache.path(), &[], &trace);
    let sts: Api<StatefulSet> = Api::namespaced(scenario.client.clone(), &ns);
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &ns);
    eventually("db ready", WAIT, || async {
        let ready = sts.get("db").await.ok()?.status?.ready_replicas == Some(3);
        let healthy = rollouts.get("db").await.ok()?.status?.phase == Phase::Healthy;
        (ready && healthy).then_some(())
    })
    .await;

    // Every version of the StatefulSet, from a watch: a poll on a loaded
    // machine can miss a batch that lasts only its 2 s pause.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<i32>::new()));
    let (listed, on_listed) = tokio::sync::oneshot::channel();
    let recorder = {
        let (sts, seen) = (sts.clone(), seen.clone());
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::{WatchStreamExt, watcher};
            let mut listed = Some(listed);
            // A watch error (a timeout on a loaded machine) re-lists after a
            // backoff instead of ending the record.
            let events = watcher(sts, watcher::Config::default().fields("metadata.name=db")).default_backoff();
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                let set = match event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(listed) = listed.take() {
                            let _ = listed.send(());
                        }
                        continue;
                    }
                    Ok(watcher::Event::Apply(set) | watcher::Event::InitApply(set)) => set,
                    _ => continue,
                };
                let partition = set
                    .spec
                    .and_then(|s| s.update_strategy)
                    .and_then(|u| u.rolling_update)
                    .and_then(|r| r.partition)
                    .unwrap_or(0);
                let mut seen = seen.lock().expect("partitions");
                // Leading zeros are the StatefulSet before the release.
                if (!seen.is_empty() || partition > 0) && seen.last() != Some(&partition) {
                    seen.push(partition);
                }
            }
        })
    };
    // The record starts before the release does.
    tokio::time::timeout(WAIT, on_listed)
        .await
        .expect("the watch lists within the wait")
        .expect("the watch task runs");
    write("2");
    scenario.repo.commit_and_push("db 2");
    eventually("all batches released", WAIT, || async {
        let set = sts.get("db").await.ok()?;
        let phase = rollouts.get("db").await.ok()?.status?.phase;
        let image = set.spec.as_ref()?.template.spec.as_ref()?.containers[0].image.clone();
        let status = set.status?;
        let done = phase == Phase::Healthy
            && image.as_deref() == Some("registry.test/db:2")
            && status.updated_replicas == Some(3)
            && status.current_revision == status.update_revision;
        done.then_some(())
    })
    .await;
    // The record catches up with the end of the release (its watch may lag
    // the read above on a loaded machine) before it is read.
    eventually("the record reaches the last batch", WAIT, || async {
        (seen.lock().expect("partitions").last() == Some(&0)).then_some(())
    })
    .await;
    recorder.abort();
    let partitions = std::mem::take(&mut *seen.lock().expect("partitions"));
    assert!(!partitions.is_empty(), "the release went through no batch");
    assert!(
        partitions[0] >= 2,
        "the first batch holds back at least two pods: {partitions:?}"
    );
    assert!(
        partitions.windows(2).all(|p| p[1] < p[0]),
        "the partition only goes down: {partitions:?}"
    );
    assert!(partitions.contains(&1), "{partitions:?}");
    // Each step read the stable template from the current revision: each
    // ControllerRevision once, its data being immutable (twice at most: a
    // read that failed on a loaded machine is made again).
    let log = std::fs::read_to_string(&agent.log).expect("the agent's log");
    let mut reads = BTreeMap::<&str, usize>::new();
    let revisions = format!("/apis/apps/v1/namespaces/{ns}/controllerrevisions/");
    for line in log.lines().filter(|line| line.contains("method=GET")) {
        if let Some(name) = line
            .split_once(revisions.as_str())
            .and_then(|(_, rest)| rest.split([' ', '?']).next())
        {
            *reads.entry(name).or_default() += 1;
        }
    }
    assert!(
        !reads.is_empty(),
        "the stable revision is read: the log has no such request"
    );
    assert!(
        reads.values().all(|n| *n <= 2),
        "a revision read again and again: {reads:?}"
    );
    let pods: Api<Pod> = Api::namespaced(scenario.client.clone(), &ns);
    let mut batches = BTreeMap::new();
    for pod in pods
        .list(&ListParams::default().labels("app=db"))
        .await
        .expect("pods")
        .items
    {
        let labels = pod.metadata.labels.unwrap_or_default();
        batches.insert(
            pod.metadata.name.unwrap_or_default(),
            labels.get("gitcanary.io/rollout-batch-id").cloned().unwrap_or_default(),
        );
        assert_eq!(
            pod.spec.expect("spec").containers[0].image.as_deref(),
            Some("registry.test/db:2")
        );
    }
    assert_eq!(batches["db-2"], "1", "{batches:?}");
    assert_eq!(batches["db-1"], "2", "{batches:?}");
    assert_eq!(batches["db-0"], "3", "{batches:?}");
}

#[tokio::test]
async fn git_back_on_the_promoted_version_after_a_failure_is_healthy_again() {
    let scenario = Scenario::new("ro-revert").await;
    // hold: the human commit below is what brings Git back (gitcanary's own revert is tested in writeback.rs).
    let strategy = "      steps:\n      - {traffic: 50%, replicas: 1}\n      trafficRoutings:\n      - service: echo\n        gateway: {httpRouteName: echo}\n      gracePeriodSeconds: 1\n      progressDeadline: 3s\n      onFailure: hold\n";
    let (_agent, cluster) = running_on_1_0(&scenario, strategy).await;
    App::new(&scenario.ns, "2.0", strategy).write(&scenario);
    let promoted = scenario.repo.commit_and_push("echo 2.0");
    healthy_with(&scenario, &cluster, "2.0").await;

    let mut broken = App::new(&scenario.ns, "3.0", strategy);
    broken.extra_pod_labels = ", gitcanary.test/never-ready: \"true\"";
    broken.write(&scenario);
    scenario.repo.commit_and_push("echo 3.0, broken");
    eventually("the release fails", WAIT, || async {
        (cluster.phase_and_step().await?.0 == Phase::Failed).then_some(())
    })
    .await;
    App::new(&scenario.ns, "2.0", strategy).write(&scenario);
    scenario.repo.commit_and_push("back to 2.0");
    eventually("healthy on 2.0 again", WAIT, || async {
        (cluster.phase_and_step().await?.0 == Phase::Healthy).then_some(())
    })
    .await;
    let status = cluster.rollout().await.expect("rollout").status.expect("status");
    assert_eq!(status.stable_commit, promoted);
    assert!(cluster.deployment("echo-canary").await.is_none());
}

#[tokio::test]
async fn an_autoscaled_deployment_keeps_the_autoscalers_count_through_a_release() {
    let scenario = Scenario::new("ro-hpa").await;
    let strategy = format!("      steps:\n      - {{traffic: 20%, replicas: 50%, pause: {{}}}}\n{GATEWAY}");
    let hpa = format!(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: echo\n  namespace: {}\nspec:\n  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: echo}}\n  minReplicas: 4\n  maxReplicas: 6\n",
        scenario.ns
    );
    let app = App {
        replicas: 2,
        ..App::new(&scenario.ns, "1.0", &strategy)
    };
    app.write(&scenario);
    scenario.repo.write("echo/hpa.yaml", &hpa);
    scenario.repo.commit_and_push("echo 1.0, scaled by an autoscaler");
    let agent = scenario.start_agent();
    let cluster = Cluster::of(&scenario);
    // Git says 2; the autoscaler's minimum is 4, and the agent leaves it so.
    healthy_with(&scenario, &cluster, "1.0").await;
    agent.resyncs(2).await;
    let replicas = |d: Option<Deployment>| d.and_then(|d| d.spec?.replicas);
    assert_eq!(replicas(cluster.deployment("echo").await), Some(4));
    let annotations = cluster.deployment("echo").await.and_then(|d| d.metadata.annotations);
    assert_eq!(
        annotations
            .unwrap_or_default()
            .get("gitcanary.io/replicas-from")
            .map(String::as_str),
        Some("HorizontalPodAutoscaler/echo")
    );
    let (code, stdout, stderr) = scenario.diff();
    assert_eq!(code, 0, "nothing to change: {stdout}{stderr}");
    assert!(
        stderr.contains("spec.replicas is left to HorizontalPodAutoscaler/echo (Git says 2, applied 4)"),
        "{stderr}"
    );

    // The step's 50% is half the autoscaler's 4 pods, not half of Git's 2.
    App {
        replicas: 2,
        ..App::new(&scenario.ns, "2.0", &strategy)
    }
    .write(&scenario);
    scenario.repo.commit_and_push("echo 2.0");
    cluster.wait_for("paused at step 1", Phase::Paused, 1).await;
    assert_eq!(replicas(cluster.deployment("echo-canary").await), Some(2));

    let (code, _, stderr) = scenario.run_cli(&["promote", "echo", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    healthy_with(&scenario, &cluster, "2.0").await;
    eventually("the canary removed", WAIT, || async {
        cluster.deployment("echo-canary").await.is_none().then_some(())
    })
    .await;
    agent.resyncs(1).await;
    assert_eq!(
        replicas(cluster.deployment("echo").await),
        Some(4),
        "the autoscaler's count kept"
    );
}

#[tokio::test]
async fn get_rollout_watch_follows_a_release_to_its_end_and_exits_by_its_outcome() {
    let scenario = Scenario::new("ro-watch").await;
    // A failure is reverted in Git and synced back to Healthy at once: the
    // watch must still call it a failure.
    let strategy = "      steps:\n      - {replicas: 1, pause: {duration: 3}}\n      progressDeadline: 15s\n";
    let (_agent, cluster) = running_on_1_0(&scenario, strategy).await;
    let releasing = || async {
        eventually("a release running", WAIT, || async {
            matches!(cluster.phase_and_step().await?.0, Phase::Progressing | Phase::Paused).then_some(())
        })
        .await
    };
    let watch = || scenario.run_cli(&["get", "rollout", "echo", "-n", &scenario.ns, "--watch"]);
    let last_block = |shown: &str| shown.trim_end().rsplit("\n\n").next().unwrap_or_default().to_string();

    App::new(&scenario.ns, "2.0", strategy).write(&scenario);
    scenario.repo.commit_and_push("echo 2.0");
    releasing().await;
    let (code, shown, stderr) = watch();
    assert_eq!(code, 0, "promoted: {shown}{stderr}");
    assert!(
        !shown.contains('\u{1b}'),
        "piped: plain lines, no escape codes: {shown:?}"
    );
    assert!(shown.contains("step 1/1"), "the release's step while it ran: {shown}");
    let ns = &scenario.ns;
    assert!(
        last_block(&shown).starts_with(&format!("{ns}/echo: Healthy")),
        "{shown}"
    );

    let mut broken = App::new(&scenario.ns, "3.0-broken", strategy);
    broken.extra_pod_labels = ", gitcanary.test/never-ready: \"true\"";
    broken.write(&scenario);
    scenario.repo.commit_and_push("echo 3.0, broken");
    releasing().await;
    let (code, shown, stderr) = watch();
    assert_eq!(code, 1, "failed: {shown}{stderr}");
    assert!(shown.contains("not ready within 15s"), "{shown}");
}

#[tokio::test]
async fn get_rollout_watch_on_a_terminal_redraws_each_step_in_place() {
    let scenario = Scenario::new("ro-watch-tty").await;
    let strategy =
        "      steps:\n      - {replicas: 1, pause: {duration: 4}}\n      - {replicas: 2, pause: {duration: 2}}\n";
    let (_agent, cluster) = running_on_1_0(&scenario, strategy).await;
    App::new(&scenario.ns, "2.0", strategy).write(&scenario);
    scenario.repo.commit_and_push("echo 2.0");
    eventually("a release running", WAIT, || async {
        matches!(cluster.phase_and_step().await?.0, Phase::Progressing | Phase::Paused).then_some(())
    })
    .await;
    // A pseudo-terminal, as a person's: `script` runs the watch on one.
    let command = format!(
        "{} get rollout echo -n {} --watch --kubeconfig {}",
        env!("CARGO_BIN_EXE_gitcanary"),
        scenario.ns,
        support::kubeconfig().display()
    );
    // Bounded: a release that never ends fails the test, not CI.
    let output = std::process::Command::new("timeout")
        .args(["120", "script", "-qefc", &command, "/dev/null"])
        .env("NO_COLOR", "1")
        .output()
        .expect("script runs the watch on a terminal");
    let screen = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "promoted: {screen}");
    let redraws: Vec<&str> = screen.split("\u{1b}[2J\u{1b}[H").skip(1).collect();
    assert!(redraws.len() >= 2, "redrawn in place, not scrolled: {screen:?}");
    let first_with = |text: &str| redraws.iter().position(|r| r.contains(text));
    let (one, two) = (first_with("step 1/2"), first_with("step 2/2"));
    assert!(
        one.is_some() && two.is_some() && one < two,
        "the screen showed step 1, then step 2: {screen:?}"
    );
    assert!(
        redraws
            .iter()
            .any(|r| r.contains("batch 1: echo-canary-") && r.contains(" ready")),
        "each batch's pods on the screen: {screen:?}"
    );
    assert!(redraws.last().is_some_and(|r| r.contains("Healthy")), "{screen:?}");
}
