//! Function canaries on Knative Serving: the agent releases a Knative
//! Service through its Revisions against the real Knative controller and
//! autoscaler (tests/testenv/knative-up.sh), and each test reads what a user
//! would: the Service's `status.traffic`, its Revisions, the Rollout, Git,
//! and the answers to real requests through Knative's own routing.

mod support;

use std::time::Duration;

use gitcanary::rollout::api::{Phase, Rollout, RolloutStatus};
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::ApiResource;
use serde_json::json;
use support::agent::Scenario;
use support::eventually;
use support::traffic::burst;

const WAIT: Duration = Duration::from_secs(90);

/// The function as Git holds it: as users write it, for Knative's webhook
/// to default.
struct Function<'a> {
    image: &'a str,
    never_ready: bool,
    traffic: &'a str,
    strategy: &'a str,
}

impl<'a> Function<'a> {
    fn new(image: &'a str, strategy: &'a str) -> Function<'a> {
        Function {
            image,
            never_ready: false,
            traffic: "",
            strategy,
        }
    }

    fn write(&self, scenario: &Scenario) {
        let ns = &scenario.ns;
        let labels = if self.never_ready {
            "{app: fn, gitcanary.test/never-ready: \"true\"}"
        } else {
            "{app: fn}"
        };
        scenario.repo.write(
            "fn/service.yaml",
            &format!(
                "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata:\n  name: fn\n  namespace: {ns}\nspec:\n  template:\n    metadata:\n      labels: {labels}\n    spec:\n      containers:\n      - image: registry.test/fn:{}\n{}",
                self.image, self.traffic
            ),
        );
        scenario.repo.write(
            "fn/rollout.yaml",
            &format!(
                "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata:\n  name: fn\n  namespace: {ns}\nspec:\n  workloadRef: {{apiVersion: serving.knative.dev/v1, kind: Service, name: fn}}\n  strategy:\n    canary:\n{}",
                self.strategy
            ),
        );
    }
}

/// One entry of a Service's traffic: tag, Revision, percent.
type Route = (String, String, u64);

fn route(tag: &str, revision: &str, percent: u64) -> Route {
    (tag.to_string(), revision.to_string(), percent)
}

struct Knative {
    client: kube::Client,
    ns: String,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "serving.knative.dev".into(),
        version: "v1".into(),
        api_version: "serving.knative.dev/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

impl Knative {
    /// Knative on the test control plane (up.sh starts it with
    /// GITCANARY_TESTENV_KNATIVE=1, as scripts/test.sh and a test binary
    /// starting its own plane set); a clear failure when it is not served.
    async fn of(scenario: &Scenario) -> Knative {
        let knative = Knative {
            client: scenario.client.clone(),
            ns: scenario.ns.clone(),
        };
        let api: Api<DynamicObject> = Api::all_with(knative.client.clone(), &resource("Service", "services"));
        if let Err(error) = api.list(&ListParams::default().limit(1)).await {
            panic!(
                "Knative Serving is not served by the test control plane ({error}): start it with GITCANARY_TESTENV_KNATIVE=1 tests/testenv/up.sh (scripts/test.sh does)"
            );
        }
        knative
    }

    async fn service(&self) -> Option<DynamicObject> {
        Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &resource("Service", "services"))
            .get_opt("fn")
            .await
            .ok()
            .flatten()
    }

    /// `status.traffic` once Knative has seen the latest spec, sorted by tag.
    async fn traffic(&self) -> Option<Vec<Route>> {
        let service = self.service().await?;
        let status = &service.data["status"];
        if status["observedGeneration"].as_i64() != service.metadata.generation {
            return None;
        }
        let mut routes: Vec<Route> = status["traffic"]
            .as_array()?
            .iter()
            .map(|t| {
                (
                    t["tag"].as_str().unwrap_or_default().to_string(),
                    t["revisionName"].as_str().unwrap_or_default().to_string(),
                    t["percent"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        routes.sort();
        Some(routes)
    }

    async fn wait_for_traffic(&self, what: &str, want: Vec<Route>) {
        let mut want = want;
        want.sort();
        eventually(what, WAIT, || async { (self.traffic().await? == want).then_some(()) }).await;
    }

    /// A tagged entry's own URL, as `status.traffic` gives it.
    async fn tag_url(&self, tag: &str) -> Option<String> {
        let service = self.service().await?;
        service.data["status"]["traffic"]
            .as_array()?
            .iter()
            .find(|t| t["tag"].as_str() == Some(tag))?["url"]
            .as_str()
            .map(str::to_string)
    }

    async fn revisions(&self) -> Vec<DynamicObject> {
        let mut revisions =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &self.ns, &resource("Revision", "revisions"))
                .list(&ListParams::default().labels("serving.knative.dev/service=fn"))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
        revisions.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        revisions
    }

    async fn revision_image(&self, name: &str) -> Option<String> {
        let revision = self
            .revisions()
            .await
            .into_iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))?;
        revision.data["spec"]["containers"][0]["image"]
            .as_str()
            .map(str::to_string)
    }

    async fn status(&self) -> Option<RolloutStatus> {
        Api::<Rollout>::namespaced(self.client.clone(), &self.ns)
            .get_opt("fn")
            .await
            .ok()
            .flatten()?
            .status
    }

    async fn wait_for(&self, what: &str, phase: Phase, step: u32) -> RolloutStatus {
        eventually(what, WAIT, || async {
            let status = self.status().await?;
            let at = status.canary_status.as_ref().map_or(0, |c| c.current_step_index);
            (status.phase == phase && at == step).then_some(status)
        })
        .await
    }

    /// Healthy on `image`, with Git's own traffic: all on the latest Revision,
    /// as Knative's webhook defaults a Service that names none.
    async fn healthy_on(&self, image: &str) -> String {
        eventually("healthy, with Git's traffic on the latest Revision", WAIT, || async {
            let status = self.status().await?;
            let routes = self.traffic().await?;
            let [(tag, revision, 100)] = routes.as_slice() else {
                return None;
            };
            let serves = self.revision_image(revision).await? == format!("registry.test/fn:{image}");
            let git_traffic =
                self.service().await?.data["spec"]["traffic"] == json!([{"latestRevision": true, "percent": 100}]);
            (status.phase == Phase::Healthy && tag.is_empty() && serves && git_traffic).then(|| revision.clone())
        })
        .await
    }
}

/// `gitcanary validate` on the repository's working tree: (exit code, stdout, stderr).
fn validate(scenario: &Scenario) -> (Option<i32>, String, String) {
    let output = support::agent::gitcanary()
        .arg("validate")
        .arg(scenario.repo.path())
        .output()
        .expect("validate runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Version 1.0 pushed and serving under a started agent; its Revision's name.
async fn serving_1_0(scenario: &Scenario, function: &Function<'_>) -> (support::agent::AgentProcess, Knative, String) {
    serving_1_0_with(scenario, function, &[]).await
}

/// As `serving_1_0`, with the agent's environment extended by `env`.
async fn serving_1_0_with(
    scenario: &Scenario,
    function: &Function<'_>,
    env: &[(&str, &str)],
) -> (support::agent::AgentProcess, Knative, String) {
    let knative = Knative::of(scenario).await;
    function.write(scenario);
    scenario.repo.commit_and_push("fn 1.0");
    let agent = support::agent::AgentProcess::start_with(&scenario.repo, &scenario.ns, scenario.cache.path(), &[], env);
    let stable = knative.healthy_on("1.0").await;
    (agent, knative, stable)
}

// Step 1 lasts long enough for its 20% to be read on a loaded machine.
const STEPS_TO_PROMOTE: &str = "      steps:\n      - {traffic: 20%, pause: {duration: 5}}\n      - {traffic: 50%, pause: {}}\n      - {traffic: 100%}\n      progressDeadline: 60\n      canaryMinScale: 1\n";

#[tokio::test]
async fn a_function_is_released_in_three_steps_with_stable_pinned_by_name_and_promoted() {
    let scenario = Scenario::new("kn-promote").await;
    // Every request the agent sends, in its log.
    let trace = [("GITCANARY_LOG", "gitcanary=info,gitcanary::cluster::requests=trace")];
    let (agent, knative, stable) = serving_1_0_with(&scenario, &Function::new("1.0", STEPS_TO_PROMOTE), &trace).await;
    assert_eq!(knative.revisions().await.len(), 1, "no release for the first version");
    let (code, stdout, stderr) = validate(&scenario);
    assert_eq!(code, Some(0), "{stdout}{stderr}");

    Function::new("2.0", STEPS_TO_PROMOTE).write(&scenario);
    let commit = scenario.repo.commit_and_push("fn 2.0");

    // Step 1: Knative made the new Revision; 20% goes to it by name.
    let canary = eventually("a canary Revision of 2.0", WAIT, || async {
        let status = knative.status().await?;
        let canary = status.canary_revision.clone();
        (!canary.is_empty()).then_some(canary)
    })
    .await;
    assert_ne!(canary, stable);
    assert_eq!(
        knative.revision_image(&canary).await.as_deref(),
        Some("registry.test/fn:2.0")
    );
    knative
        .wait_for_traffic(
            "20% to the canary, read back",
            vec![route("stable", &stable, 80), route("canary", &canary, 20)],
        )
        .await;
    for tag in ["stable", "canary"] {
        let url = knative.tag_url(tag).await.expect("each tag has its URL");
        assert!(url.starts_with(&format!("http://{tag}-fn.")), "{url}");
    }
    // The canary Revision keeps a pod while the release runs.
    let revision = knative
        .revisions()
        .await
        .into_iter()
        .find(|r| r.metadata.name.as_deref() == Some(canary.as_str()))
        .expect("the canary Revision");
    assert_eq!(
        revision.metadata.annotations.expect("annotations")["autoscaling.knative.dev/min-scale"],
        "1"
    );

    // Step 2: half the requests, then a pause until promoted.
    let status = knative.wait_for("paused at step 2", Phase::Paused, 2).await;
    assert_eq!(
        knative.traffic().await.expect("traffic"),
        vec![route("canary", &canary, 50), route("stable", &stable, 50)]
    );
    assert_eq!(
        (status.stable_revision.as_str(), status.canary_revision.as_str()),
        (stable.as_str(), canary.as_str())
    );
    assert_eq!(status.canary_commit, commit);
    let (code, stdout, _) = scenario.run_cli(&["status", "fn", "-n", &scenario.ns]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains(&format!("stable Revision {stable}, canary Revision {canary}")) && stdout.contains("step 2/3"),
        "{stdout}"
    );
    read_from_the_watches_at_a_pause(&scenario, &agent).await;

    let (code, _, stderr) = scenario.run_cli(&["promote", "fn", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    // Step 3 and promote: everything to the canary by name, then Git's traffic.
    let serving = knative.healthy_on("2.0").await;
    assert_ne!(serving, stable);
    let status = knative.status().await.expect("status");
    assert_eq!(status.stable_commit, commit);
    let history: Vec<u32> = status.step_history.iter().map(|r| r.step).collect();
    assert_eq!(history, [1, 2, 3]);
    assert!(
        status.canary_status.expect("canary status").message == "promoted",
        "promoted"
    );
    // The promote is the state of record in Git.
    let record = eventually("the status file in Git", WAIT, || async {
        scenario.try_git(&["show", &format!("main:.gitcanary/status/{}/fn.yaml", scenario.ns)])
    })
    .await;
    assert!(record.contains("registry.test/fn:2.0"), "{record}");
}

/// Someone annotates the paused Rollout: its app is planned again, and the
/// step reads the Service's Revisions and their pods from the watches.
async fn read_from_the_watches_at_a_pause(scenario: &Scenario, agent: &support::agent::AgentProcess) {
    let ns = &scenario.ns;
    let before = agent
        .annotate_rollout_and_wait_for_its_app(&scenario.client, ns, "fn", "fn")
        .await;
    let requests = agent.requests_since(before);
    assert!(
        requests.iter().any(|(_, path)| path.ends_with("/rollouts/fn")),
        "the app's sync is in the log: {requests:#?}"
    );
    for kept in [
        format!("/apis/serving.knative.dev/v1/namespaces/{ns}/revisions"),
        format!("/api/v1/namespaces/{ns}/pods"),
    ] {
        let reads: Vec<_> = requests
            .iter()
            .filter(|(method, path)| method == "GET" && *path == kept)
            .collect();
        assert!(
            reads.is_empty(),
            "{kept} was listed though a watch keeps it: {reads:#?}"
        );
    }
}

/// The canary Revision's share of real requests at each step, through
/// Knative's own routing: Traefik as its ingress (from the KIngress Knative
/// writes for the split gitcanary set), kube-proxy to each Revision's
/// Service, the Revisions' pods answering.
#[tokio::test]
async fn each_step_of_a_function_release_sends_its_share_of_real_requests_to_the_canary_revision() {
    let scenario = Scenario::new("kn-requests").await;
    let strategy = "      steps:\n      - {traffic: 20%, pause: {}}\n      - {traffic: 50%, pause: {}}\n      progressDeadline: 60\n      canaryMinScale: 1\n";
    let (_agent, knative, _) = serving_1_0(&scenario, &Function::new("1.0", strategy)).await;
    let (stable, canary) = ("registry.test/fn:1.0", "registry.test/fn:2.0");
    let url = knative.service().await.expect("the Service").data["status"]["url"]
        .as_str()
        .expect("the Service's URL")
        .to_string();
    let host = url.trim_start_matches("http://").to_string();
    eventually("1.0 answers every request through Knative's routing", WAIT, || async {
        (burst(&host, 40, Duration::from_secs(10)).by_image.get(stable) == Some(&40)).then_some(())
    })
    .await;

    Function::new("2.0", strategy).write(&scenario);
    scenario.repo.commit_and_push("fn 2.0");
    for (step, share) in [(1, 0.2), (2, 0.5)] {
        knative
            .wait_for(&format!("paused at step {step}"), Phase::Paused, step)
            .await;
        let counts = burst(&host, 2_000, Duration::from_secs(60));
        let seen = format!("{:?}, statuses {:?}", counts.by_image, counts.by_status);
        assert_eq!(
            (counts.answered(), counts.failures()),
            (2_000, 0),
            "step {step}: {seen}"
        );
        assert!(
            (share - 0.04..=share + 0.04).contains(&counts.share(canary)),
            "step {step}: {seen}"
        );
        assert!(counts.by_image.keys().all(|i| i == stable || i == canary), "{seen}");
        let (code, _, stderr) = scenario.run_cli(&["promote", "fn", "-n", &scenario.ns]);
        assert_eq!(code, 0, "{stderr}");
    }
    knative.healthy_on("2.0").await;
    let counts = burst(&host, 500, Duration::from_secs(30));
    assert_eq!(
        counts.by_image.get(canary),
        Some(&500),
        "after the promote: {:?}, statuses {:?}",
        counts.by_image,
        counts.by_status
    );
}

#[tokio::test]
async fn a_canary_revision_that_never_becomes_ready_fails_at_the_deadline_and_is_reverted_in_git() {
    let scenario = Scenario::new("kn-deadline").await;
    let strategy = "      steps:\n      - {traffic: 50%, pause: {}}\n      progressDeadline: 10\n";
    let (_agent, knative, stable) = serving_1_0(&scenario, &Function::new("1.0", strategy)).await;

    let broken = Function {
        never_ready: true,
        ..Function::new("2.0", strategy)
    };
    broken.write(&scenario);
    let released = scenario.repo.commit_and_push("fn 2.0, never ready");

    let seen_traffic = std::cell::RefCell::new(Vec::new());
    let revert = eventually("reverted in Git", WAIT, || async {
        if let Some(routes) = knative.traffic().await {
            seen_traffic.borrow_mut().push(routes);
        }
        scenario
            .history()
            .into_iter()
            .find(|(_, m)| m.contains(&format!("Gitcanary-Reverts: {released}")))
    })
    .await;
    let file = scenario.git(&["show", &format!("{}:fn/service.yaml", revert.0)]);
    assert!(
        file.contains("registry.test/fn:1.0") && !file.contains("never-ready"),
        "{file}"
    );
    // All requests stayed on the stable Revision: the canary never took any.
    for routes in seen_traffic.into_inner() {
        let to_stable: u64 = routes.iter().filter(|r| r.1 == stable).map(|r| r.2).sum();
        assert_eq!(to_stable, 100, "{routes:?}");
    }
    // The sync after the revert commit records it in the status.
    let written = eventually("the revert is recorded in the status", WAIT, || async {
        knative.status().await?.written_back
    })
    .await;
    assert_eq!(written.action, gitcanary::rollout::api::WritebackAction::Revert);
    assert_eq!(written.rollout_id, released[..7]);
    // Git asks for 1.0 again, and Knative serves it.
    knative.healthy_on("1.0").await;
}

#[tokio::test]
async fn abort_mid_release_puts_every_request_on_stable_and_never_on_the_aborted_revision() {
    let scenario = Scenario::new("kn-abort").await;
    let strategy = "      steps:\n      - {traffic: 30%, pause: {}}\n      progressDeadline: 60\n";
    let (_agent, knative, stable) = serving_1_0(&scenario, &Function::new("1.0", strategy)).await;
    Function::new("2.0", strategy).write(&scenario);
    let released = scenario.repo.commit_and_push("fn 2.0");
    let status = knative.wait_for("paused at step 1", Phase::Paused, 1).await;
    let canary = status.canary_revision;
    knative
        .wait_for_traffic(
            "30% to the canary",
            vec![route("stable", &stable, 70), route("canary", &canary, 30)],
        )
        .await;
    // Mid-release the cluster is what Git plus the rollout asks for.
    let (code, stdout, stderr) = scenario.diff();
    assert_eq!(code, 0, "diff mid-release: {stdout}{stderr}");

    let (code, _, stderr) = scenario.run_cli(&["abort", "fn", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    knative
        .wait_for_traffic("all on stable", vec![route("stable", &stable, 100)])
        .await;
    // From here on the aborted Revision takes nothing, through the revert
    // commit and until Git's own traffic is back on a Revision of 1.0.
    let to_aborted = std::cell::RefCell::new(Vec::new());
    let serving = eventually("back on Git's traffic, serving 1.0", WAIT, || async {
        let routes = knative.traffic().await?;
        to_aborted
            .borrow_mut()
            .extend(routes.iter().filter(|r| r.1 == canary && r.2 > 0).cloned());
        let status = knative.status().await?;
        let [(tag, revision, 100)] = routes.as_slice() else {
            return None;
        };
        let image = knative.revision_image(revision).await?;
        (tag.is_empty() && status.phase == Phase::Healthy && image == "registry.test/fn:1.0").then(|| revision.clone())
    })
    .await;
    assert_eq!(to_aborted.into_inner(), Vec::<Route>::new());
    assert_ne!(serving, canary);
    let revert = scenario
        .history()
        .into_iter()
        .find(|(_, m)| m.contains(&format!("Gitcanary-Reverts: {released}")))
        .expect("a revert commit");
    assert!(
        revert.1.contains(&format!("Gitcanary-Rollout: {}/fn", scenario.ns)),
        "{}",
        revert.1
    );
}

#[tokio::test]
async fn the_agent_killed_mid_release_resumes_with_the_same_revisions() {
    let scenario = Scenario::new("kn-kill").await;
    let strategy = "      steps:\n      - {traffic: 20%, pause: {duration: 6}}\n      - {traffic: 60%, pause: {}}\n      progressDeadline: 60\n";
    let (mut agent, knative, stable) = serving_1_0(&scenario, &Function::new("1.0", strategy)).await;
    Function::new("2.0", strategy).write(&scenario);
    scenario.repo.commit_and_push("fn 2.0");
    let canary = eventually("step 1 in force", WAIT, || async {
        let status = knative.status().await?;
        let canary = status.canary_revision.clone();
        let routes = knative.traffic().await?;
        let mut want = vec![route("stable", &stable, 80), route("canary", &canary, 20)];
        want.sort();
        (routes == want
            && status.canary_status?.current_step_state != gitcanary::rollout::api::StepState::StepTrafficRouting)
            .then_some(canary)
    })
    .await;
    agent.kill();

    let _agent = scenario.start_agent();
    let seen = std::cell::RefCell::new(Vec::new());
    knative
        .wait_for_traffic_recording(
            "60% after the restart",
            &seen,
            vec![route("stable", &stable, 40), route("canary", &canary, 60)],
        )
        .await;
    let status = knative.wait_for("paused at step 2", Phase::Paused, 2).await;
    assert_eq!(status.canary_revision, canary);
    assert!(
        seen.into_inner().iter().all(|percent| *percent >= 20),
        "the canary's share never went backwards"
    );
    assert_eq!(knative.revisions().await.len(), 2, "no second canary Revision");
    let history: Vec<u32> = status.step_history.iter().map(|r| r.step).collect();
    assert_eq!(history, [1, 2], "step 1 was not run again");
}

impl Knative {
    /// Waits for `want`, keeping every canary share seen on the way.
    async fn wait_for_traffic_recording(&self, what: &str, seen: &std::cell::RefCell<Vec<u64>>, want: Vec<Route>) {
        let mut want = want;
        want.sort();
        eventually(what, WAIT, || async {
            let routes = self.traffic().await?;
            seen.borrow_mut()
                .extend(routes.iter().filter(|r| r.0 == "canary").map(|r| r.2));
            (routes == want).then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn a_revision_git_names_keeps_its_entry_and_only_the_latest_share_is_released() {
    let scenario = Scenario::new("kn-named").await;
    let strategy = "      steps:\n      - {traffic: 50%, pause: {}}\n      progressDeadline: 60\n";
    let first = "fn-00001".to_string();
    // Git keeps a URL on the first Revision, and sends it a tenth of the requests.
    let traffic = format!(
        "  traffic:\n  - {{revisionName: {first}, percent: 10, tag: first}}\n  - {{latestRevision: true, percent: 90}}\n"
    );
    let knative = Knative::of(&scenario).await;
    let function = Function {
        traffic: &traffic,
        ..Function::new("1.0", strategy)
    };
    function.write(&scenario);
    scenario.repo.commit_and_push("fn 1.0");
    let _agent = scenario.start_agent();
    knative
        .wait_for_traffic("Git's traffic", vec![route("", &first, 90), route("first", &first, 10)])
        .await;
    knative.wait_for("healthy", Phase::Healthy, 0).await;

    Function {
        traffic: &traffic,
        ..Function::new("2.0", strategy)
    }
    .write(&scenario);
    scenario.repo.commit_and_push("fn 2.0");
    let status = knative.wait_for("paused at step 1", Phase::Paused, 1).await;
    let canary = status.canary_revision;
    knative
        .wait_for_traffic(
            "the latest share split in half, the named entry as Git has it",
            vec![
                route("first", &first, 10),
                route("stable", &first, 45),
                route("canary", &canary, 45),
            ],
        )
        .await;

    let (code, _, stderr) = scenario.run_cli(&["promote", "fn", "-n", &scenario.ns]);
    assert_eq!(code, 0, "{stderr}");
    eventually("promoted, with Git's traffic again", WAIT, || async {
        let healthy = knative.status().await?.phase == Phase::Healthy;
        let mut want = vec![route("", &canary, 90), route("first", &first, 10)];
        want.sort();
        let git_traffic = knative.service().await?.data["spec"]["traffic"]
            .as_array()
            .is_some_and(|t| t.len() == 2 && t.iter().all(|e| e["tag"] != "stable" && e["tag"] != "canary"));
        (healthy && git_traffic && knative.traffic().await? == want).then_some(())
    })
    .await;

    // Traffic Git pins wholly to a named Revision leaves nothing to release:
    // refused with the Service's file and line.
    Function {
        traffic: &format!("  traffic:\n  - {{revisionName: {first}, percent: 100}}\n"),
        ..Function::new("3.0", strategy)
    }
    .write(&scenario);
    let (code, stdout, _) = validate(&scenario);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("fn/service.yaml:1") && stdout.contains("no share to the latest Revision"),
        "{stdout}"
    );
}
