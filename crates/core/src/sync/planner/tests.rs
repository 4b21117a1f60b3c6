//! Whole plans of an app: each test syncs an app to a cluster fixture and
//! compares everything the plan would do, read as a reviewer reads it,
//! with the plan written out in the test.

use std::time::Duration;

use serde_json::Value;

use super::Prepared;
use super::fixtures::{Cluster, Git, StepPause, config_map, deployment, http_route, ingress, key, service, traffic};
use crate::manifest::Manifest;
use crate::rollout::api::{Phase, Rollout, StepState, WritebackAction};
use crate::rollout::plan::{RequeueReason, Transition};

/// A plan as a reviewer reads it: each object written (and why) or left as
/// it is, with what matters of it; what is pruned or kept; and each
/// Rollout's release.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    writes: Vec<String>,
    unchanged: Vec<String>,
    fresh: bool,
    pending: Vec<String>,
    prunes: Vec<String>,
    released_namespaces: Vec<String>,
    kept: Vec<String>,
    problems: Vec<String>,
    autoscaled: Vec<String>,
    releases: Vec<Release>,
}

#[derive(Debug, Clone, PartialEq)]
struct Release {
    /// Written before the app's objects.
    canary_writes: Vec<String>,
    /// Deleted before anything is written: canary routes.
    route_deletions: Vec<String>,
    /// Deleted once the routes are back on stable.
    canary_deletions: Vec<String>,
    status: Status,
    changed: bool,
    transitions: Vec<Transition>,
    requeue: Option<(Duration, RequeueReason)>,
    failed: Option<String>,
    promoted: bool,
    batch_step: Option<u32>,
    ignored_signals: Vec<String>,
    writeback: Option<WritebackAction>,
}

/// What `kubectl get rollout` and the release's commits show.
#[derive(Debug, Clone, PartialEq)]
struct Status {
    phase: Phase,
    step: Option<(u32, StepState)>,
    traffic: String,
    message: String,
    stable_commit: String,
    canary_commit: String,
}

fn outcome(prepared: &Prepared<'_>) -> Outcome {
    let plan = &prepared.plan;
    let object = |index: usize| described(&plan.objects[index].key.to_string(), &plan.objects[index].desired);
    Outcome {
        writes: plan
            .writes
            .iter()
            .map(|&(index, reason)| format!("{reason:?} {}", object(index)))
            .collect(),
        unchanged: plan.unchanged.iter().map(|&(index, _)| object(index)).collect(),
        fresh: plan.fresh,
        pending: plan.pending.iter().map(|m| m.key().to_string()).collect(),
        prunes: plan.prunes.iter().map(|d| d.key.to_string()).collect(),
        released_namespaces: plan.releases.iter().map(|r| r.entry.key().to_string()).collect(),
        kept: plan.kept.iter().map(|e| e.key().to_string()).collect(),
        problems: plan.problems.iter().map(ToString::to_string).collect(),
        autoscaled: prepared.autoscaled.iter().map(|a| a.workload.clone()).collect(),
        releases: prepared.rollouts.iter().map(release).collect(),
    }
}

fn release(work: &crate::rollout::model::RolloutWork) -> Release {
    let plan = &work.plan;
    let deleted = |deletions: &[crate::model::Deletion]| -> Vec<String> {
        deletions
            .iter()
            .map(|d| format!("{}{}", d.key, if d.foreground { " (foreground)" } else { "" }))
            .collect()
    };
    let canary = plan.status.canary_status.as_ref();
    Release {
        canary_writes: work
            .canary_writes
            .iter()
            .map(|w| {
                let verb = if w.live.is_some() { "Update" } else { "Create" };
                format!("{verb} {}", described(&w.key.to_string(), &w.object))
            })
            .collect(),
        route_deletions: deleted(&work.route_deletions),
        canary_deletions: deleted(&work.canary_deletions),
        status: Status {
            phase: plan.status.phase,
            step: canary.map(|c| (c.current_step_index, c.current_step_state)),
            traffic: canary.map(|c| c.traffic.clone()).unwrap_or_default(),
            message: canary.map(|c| c.message.clone()).unwrap_or_default(),
            stable_commit: plan.status.stable_commit.clone(),
            canary_commit: plan.status.canary_commit.clone(),
        },
        changed: plan.changed,
        transitions: plan.transitions.clone(),
        requeue: plan.requeue.map(|r| (r.after, r.reason)),
        failed: plan.failed.clone(),
        promoted: plan.promoted,
        batch_step: plan.batch_step,
        ignored_signals: plan.ignored_signals.iter().map(|(_, value)| value.clone()).collect(),
        writeback: plan.status.pending_writeback.as_ref().map(|w| w.action),
    }
}

/// `key: what matters of it` — the image and size of a Deployment, whom a
/// Service selects, where a route sends requests.
fn described(key: &str, object: &Value) -> String {
    let spec = &object["spec"];
    let gist = match object["kind"].as_str().unwrap_or_default() {
        "Deployment" => format!(
            "image {}, replicas {}",
            spec["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or("?"),
            spec["replicas"]
        ),
        "Service" => format!("selects {}", pairs(&spec["selector"])),
        "HTTPRoute" => {
            let backends = spec["rules"][0]["backendRefs"].as_array().cloned().unwrap_or_default();
            let backends: Vec<String> = backends
                .iter()
                .map(|b| match b["weight"].as_u64() {
                    Some(weight) => format!("{} {weight}", b["name"].as_str().unwrap_or("?")),
                    None => b["name"].as_str().unwrap_or("?").to_string(),
                })
                .collect();
            format!("to {}", backends.join(", "))
        }
        "Ingress" => {
            let backend = &spec["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"];
            let weight = &object["metadata"]["annotations"]["nginx.ingress.kubernetes.io/canary-weight"];
            match weight.as_str() {
                Some(weight) => format!("to {}, canary weight {weight}", backend.as_str().unwrap_or("?")),
                None => format!("to {}", backend.as_str().unwrap_or("?")),
            }
        }
        "ConfigMap" => format!("color {}", object["data"]["color"].as_str().unwrap_or("?")),
        _ => return key.to_string(),
    };
    format!("{key}: {gist}")
}

fn pairs(map: &Value) -> String {
    let pairs: Vec<String> = map
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?")))
        .collect();
    pairs.join(", ")
}

fn sync(cluster: &mut Cluster, git: &Git) -> Outcome {
    cluster.sync(git, outcome)
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_plain_app_writes_what_changed_leaves_the_rest_and_prunes_what_left_git() {
    let mut cluster = Cluster::empty();
    let before = Git::at(
        "commit1",
        vec![
            config_map("settings", "blue"),
            config_map("colors", "blue"),
            config_map("legacy", "grey"),
        ],
    );
    assert_eq!(
        sync(&mut cluster, &before),
        Outcome {
            writes: strings(&[
                "Create ConfigMap demo/settings: color blue",
                "Create ConfigMap demo/colors: color blue",
                "Create ConfigMap demo/legacy: color grey",
            ]),
            // Nothing of the app exists yet: a refused object takes the others back.
            fresh: true,
            ..Outcome::default()
        }
    );

    // Someone edits `settings` in the cluster; Git changes `colors`, adds `flags` and drops `legacy`.
    let settings = key("", "ConfigMap", "settings");
    cluster.live.get_mut(&settings).expect("applied")["data"]["color"] = "red".into();
    let after = Git::at(
        "commit2",
        vec![
            config_map("settings", "blue"),
            config_map("colors", "green"),
            config_map("flags", "on"),
        ],
    );
    assert_eq!(
        sync(&mut cluster, &after),
        Outcome {
            writes: strings(&[
                "Drift ConfigMap demo/settings: color blue",
                "Change ConfigMap demo/colors: color green",
                "Create ConfigMap demo/flags: color on",
            ]),
            prunes: strings(&["ConfigMap demo/legacy"]),
            ..Outcome::default()
        }
    );
    assert_eq!(
        sync(&mut cluster, &after),
        Outcome {
            unchanged: strings(&[
                "ConfigMap demo/settings: color blue",
                "ConfigMap demo/colors: color green",
                "ConfigMap demo/flags: color on",
            ]),
            ..Outcome::default()
        },
        "once applied, nothing is written again"
    );
}

#[test]
fn without_prune_an_object_that_left_git_stays_and_is_kept_in_the_inventory() {
    let mut cluster = Cluster::empty();
    cluster.prune = false;
    sync(
        &mut cluster,
        &Git::at(
            "commit1",
            vec![config_map("settings", "blue"), config_map("legacy", "grey")],
        ),
    );
    let after = Git::at("commit2", vec![config_map("settings", "blue")]);
    let kept = Outcome {
        unchanged: strings(&["ConfigMap demo/settings: color blue"]),
        kept: strings(&["ConfigMap demo/legacy"]),
        ..Outcome::default()
    };
    assert_eq!(sync(&mut cluster, &after), kept);
    assert_eq!(sync(&mut cluster, &after), kept, "kept at every sync, never forgotten");
}

/// Steps of 25% for a minute, 50% until promoted, then 100%.
fn echo_rollout() -> Manifest {
    Rollout::test()
        .workload("echo")
        .steps([
            traffic("25%").paused_for(60),
            traffic("50%").paused_until_promoted(),
            traffic("100%"),
        ])
        .route("echo", "echo")
        .manifest()
}

/// The echo app at `commit`, running `image`, released by `rollout` through `route`.
fn echo_app(commit: &str, image: &str, rollout: Manifest, route: Manifest) -> Git {
    Git::at(
        commit,
        vec![deployment("echo", image, 4), service("echo"), route, rollout],
    )
}

fn through_gateway(commit: &str, image: &str) -> Git {
    echo_app(commit, image, echo_rollout(), http_route("echo", "echo"))
}

fn through_ingress(commit: &str, image: &str) -> Git {
    let rollout = Rollout::test()
        .workload("echo")
        .steps([traffic("25%").paused_for(60), traffic("100%")])
        .ingress("echo", "echo")
        .manifest();
    echo_app(commit, image, rollout, ingress("echo", "echo"))
}

/// A cluster running `git` as the stable release its Rollout recorded.
fn running(git: &Git) -> Cluster {
    let mut cluster = Cluster::empty();
    cluster.sync(git, |_| ());
    cluster.pods.stable = "stable-rs".to_string();
    cluster.sync(git, |_| ());
    cluster
}

/// The syncs that take `git`'s new template to its first step's traffic:
/// the stable Service pinned, the canary made, its pods ready.
fn route_first_step(cluster: &mut Cluster, git: &Git) {
    cluster.sync(git, |_| ());
    cluster.wait(1);
    cluster.sync(git, |_| ());
    cluster.pods.canary = "canary-rs".to_string();
    cluster.pods.canary_ready = 1;
    cluster.wait(20);
    cluster.sync(git, |_| ());
}

/// A release under way, as its status shows it.
fn releasing(step: (u32, StepState), traffic: &str, message: &str) -> Status {
    Status {
        phase: Phase::Progressing,
        step: Some(step),
        traffic: traffic.to_string(),
        message: message.to_string(),
        stable_commit: "commit1".to_string(),
        canary_commit: "commit2".to_string(),
    }
}

fn no_release_change() -> Release {
    Release {
        canary_writes: Vec::new(),
        route_deletions: Vec::new(),
        canary_deletions: Vec::new(),
        status: releasing((1, StepState::StepUpgrade), "0%", ""),
        changed: false,
        transitions: Vec::new(),
        requeue: None,
        failed: None,
        promoted: false,
        batch_step: Some(1),
        ignored_signals: Vec::new(),
        writeback: None,
    }
}

#[test]
fn a_new_image_starts_a_release_that_keeps_the_stable_template_until_the_canary_takes_its_share() {
    let mut cluster = running(&through_gateway("commit1", "echo:1"));
    let git = through_gateway("commit2", "echo:2");
    let stable_deployment = "Deployment.apps demo/echo: image echo:1, replicas 4";
    let git_route = "HTTPRoute.gateway.networking.k8s.io demo/echo: to echo";
    let rollout = "Rollout.gitcanary.io demo/echo";

    // First the stable Service is pinned to the stable pods: the canary's would match it too.
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            writes: strings(&["Change Service demo/echo: selects app=echo, pod-template-hash=stable-rs"]),
            unchanged: strings(&[stable_deployment, git_route, rollout]),
            releases: vec![Release {
                status: releasing(
                    (1, StepState::StepUpgrade),
                    "0%",
                    "waiting for the stable Service to select the stable pods alone before making canary pods",
                ),
                changed: true,
                transitions: vec![Transition::Started {
                    rollout_id: "commit2".to_string(),
                    commit: "commit2".to_string(),
                }],
                requeue: Some((Duration::ZERO, RequeueReason::Grace)),
                ..no_release_change()
            }],
            ..Outcome::default()
        }
    );

    // The pin is live: the canary Deployment is made at the first step's size.
    cluster.wait(1);
    let pinned = "Service demo/echo: selects app=echo, pod-template-hash=stable-rs";
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            unchanged: strings(&[stable_deployment, pinned, git_route, rollout]),
            releases: vec![Release {
                canary_writes: strings(&["Create Deployment.apps demo/echo-canary: image echo:2, replicas 1"]),
                status: releasing(
                    (1, StepState::StepUpgrade),
                    "0%",
                    "step 1: waiting for 1 canary pod(s) to be ready",
                ),
                changed: true,
                requeue: Some((Duration::from_secs(599), RequeueReason::Deadline)),
                ..no_release_change()
            }],
            ..Outcome::default()
        }
    );

    // Its pod is ready: the canary Service selects it and the route gives it the step's 25%.
    cluster.pods.canary = "canary-rs".to_string();
    cluster.pods.canary_ready = 1;
    cluster.wait(20);
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            writes: strings(&["Change HTTPRoute.gateway.networking.k8s.io demo/echo: to echo 75, echo-canary 25"]),
            unchanged: strings(&[stable_deployment, pinned, rollout]),
            releases: vec![Release {
                canary_writes: strings(&[
                    "Create Service demo/echo-canary: selects app=echo, pod-template-hash=canary-rs"
                ]),
                status: releasing(
                    (1, StepState::StepTrafficRouting),
                    "25%",
                    "step 1: routing 25% of traffic to the canary",
                ),
                changed: true,
                transitions: vec![Transition::CanaryReady { step: 1, pods: 1 }],
                requeue: Some((Duration::from_secs(3), RequeueReason::Grace)),
                ..no_release_change()
            }],
            ..Outcome::default()
        }
    );
}

#[test]
fn a_timed_pause_with_nothing_changed_writes_nothing_and_wakes_when_it_ends() {
    let mut cluster = running(&through_gateway("commit1", "echo:1"));
    let git = through_gateway("commit2", "echo:2");
    route_first_step(&mut cluster, &git);
    let in_place = strings(&[
        "Deployment.apps demo/echo: image echo:1, replicas 4",
        "Service demo/echo: selects app=echo, pod-template-hash=stable-rs",
        "HTTPRoute.gateway.networking.k8s.io demo/echo: to echo 75, echo-canary 25",
        "Rollout.gitcanary.io demo/echo",
    ]);
    let paused = releasing((1, StepState::StepPaused), "25%", "step 1: paused for 60s");

    // The grace period over and the route read back at 25%, the pause begins.
    cluster.wait(3);
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            unchanged: in_place.clone(),
            releases: vec![Release {
                status: paused.clone(),
                changed: true,
                transitions: vec![Transition::TrafficInForce { step: 1, percent: 25 }],
                requeue: Some((Duration::from_secs(60), RequeueReason::Pause)),
                ..no_release_change()
            }],
            ..Outcome::default()
        }
    );

    cluster.wait(20);
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            unchanged: in_place,
            releases: vec![Release {
                status: paused,
                requeue: Some((Duration::from_secs(40), RequeueReason::Pause)),
                ..no_release_change()
            }],
            ..Outcome::default()
        }
    );
}

/// The release of commit2 failed: what its status shows.
fn aborted_by(who: &str, step: (u32, StepState)) -> Status {
    Status {
        phase: Phase::Failed,
        step: Some(step),
        traffic: "0%".to_string(),
        message: format!("aborted by {who}; traffic is back on stable and the canary is removed"),
        stable_commit: "commit1".to_string(),
        canary_commit: "commit2".to_string(),
    }
}

#[test]
fn an_abort_deletes_the_canary_ingress_before_the_canary_service_and_deployment() {
    let mut cluster = running(&through_ingress("commit1", "echo:1"));
    let git = through_ingress("commit2", "echo:2");
    route_first_step(&mut cluster, &git);
    assert_eq!(
        cluster
            .canary_live
            .keys()
            .map(|(kind, name)| format!("{kind} {name}"))
            .collect::<Vec<_>>(),
        ["Deployment echo-canary", "Ingress echo-canary", "Service echo-canary"],
        "the canary takes its share through its own Ingress"
    );

    cluster.abort_by("alice");
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            // The stable Service stays pinned while the canary's pods remain.
            unchanged: strings(&[
                "Deployment.apps demo/echo: image echo:1, replicas 4",
                "Service demo/echo: selects app=echo, pod-template-hash=stable-rs",
                "Ingress.networking.k8s.io demo/echo: to echo",
                "Rollout.gitcanary.io demo/echo",
            ]),
            releases: vec![Release {
                canary_writes: Vec::new(),
                route_deletions: strings(&["Ingress.networking.k8s.io demo/echo-canary"]),
                canary_deletions: strings(&[
                    "Service demo/echo-canary",
                    "Deployment.apps demo/echo-canary (foreground)"
                ]),
                status: aborted_by("alice", (1, StepState::StepTrafficRouting)),
                changed: true,
                transitions: vec![Transition::Failed {
                    rollout_id: "commit2".to_string(),
                    cause: "aborted by alice".to_string(),
                }],
                requeue: None,
                failed: Some("aborted by alice".to_string()),
                promoted: false,
                batch_step: None,
                ignored_signals: Vec::new(),
                writeback: Some(WritebackAction::Revert),
            }],
            ..Outcome::default()
        }
    );
}

#[test]
fn an_aborted_canary_is_deleted_only_once_its_http_route_is_back_on_stable() {
    let mut cluster = running(&through_gateway("commit1", "echo:1"));
    let git = through_gateway("commit2", "echo:2");
    route_first_step(&mut cluster, &git);
    let unchanged = strings(&[
        "Deployment.apps demo/echo: image echo:1, replicas 4",
        "Service demo/echo: selects app=echo, pod-template-hash=stable-rs",
        "Rollout.gitcanary.io demo/echo",
    ]);
    let failed = Release {
        canary_writes: Vec::new(),
        route_deletions: Vec::new(),
        canary_deletions: Vec::new(),
        status: aborted_by("bob", (1, StepState::StepTrafficRouting)),
        changed: false,
        transitions: Vec::new(),
        requeue: None,
        failed: None,
        promoted: false,
        batch_step: None,
        ignored_signals: Vec::new(),
        writeback: Some(WritebackAction::Revert),
    };

    // Git's route again; the canary stays while the live route still sends to it.
    cluster.abort_by("bob");
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            writes: strings(&["Change HTTPRoute.gateway.networking.k8s.io demo/echo: to echo"]),
            unchanged: unchanged.clone(),
            releases: vec![Release {
                changed: true,
                transitions: vec![Transition::Failed {
                    rollout_id: "commit2".to_string(),
                    cause: "aborted by bob".to_string(),
                }],
                requeue: Some((Duration::from_secs(1), RequeueReason::Grace)),
                failed: Some("aborted by bob".to_string()),
                ..failed.clone()
            }],
            ..Outcome::default()
        }
    );

    let mut in_place = unchanged;
    in_place.insert(2, "HTTPRoute.gateway.networking.k8s.io demo/echo: to echo".to_string());
    assert_eq!(
        sync(&mut cluster, &git),
        Outcome {
            unchanged: in_place,
            releases: vec![Release {
                canary_deletions: strings(&[
                    "Service demo/echo-canary",
                    "Deployment.apps demo/echo-canary (foreground)"
                ]),
                ..failed
            }],
            ..Outcome::default()
        }
    );
}
