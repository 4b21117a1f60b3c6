//! The Knative Service workload. There is no second workload: Knative makes
//! a Revision of each template, and a release is an overlay of the Service's
//! `spec.traffic` on the one apply path. The stable Revision is pinned by
//! name and the step's share goes to the new Revision (by name once it
//! exists), tagged `stable` and `canary` so that each has its own URL.
//! Pure: Git's Service, the live one and its Revisions in, decisions out.

use serde_json::{Value, json};

use super::api::{Phase, RolloutStatus};
use super::plan::{Intent, Observed, Revisions, SelfRouted, StableTemplate, canary_percent};
use crate::plan::desired::is_stored_as;

pub const API_VERSION: &str = "serving.knative.dev/v1";
pub const GROUP: &str = "serving.knative.dev";
/// On a Revision's pods: the Revision's name.
pub const REVISION_LABEL: &str = "serving.knative.dev/revision";
/// On a Revision: the Service it belongs to.
pub const SERVICE_LABEL: &str = "serving.knative.dev/service";
pub const MIN_SCALE_ANNOTATION: &str = "autoscaling.knative.dev/min-scale";
pub const STABLE_TAG: &str = "stable";
pub const CANARY_TAG: &str = "canary";

/// Whether a workloadRef names a Knative Service.
pub fn is_knative_service(api_version: &str, kind: &str) -> bool {
    kind == "Service" && api_version.split('/').next() == Some(GROUP)
}

/// The share of requests Git's `traffic` gives the latest Revision: what a
/// release splits between stable and canary. 100 when Git names no traffic.
pub fn latest_share(git_service: &Value) -> u32 {
    match git_service["spec"]["traffic"].as_array() {
        None => 100,
        Some(entries) => entries
            .iter()
            .filter(|e| follows_latest(e))
            .map(|e| e["percent"].as_u64().unwrap_or(0).min(100) as u32)
            .sum::<u32>()
            .min(100),
    }
}

/// A traffic entry that follows the latest Revision (Knative's default when
/// it names none).
fn follows_latest(entry: &Value) -> bool {
    entry["latestRevision"]
        .as_bool()
        .unwrap_or(entry["revisionName"].is_null())
}

/// Why a Rollout cannot govern this Service as Git has it, if it cannot.
pub fn git_problem(git_service: &Value) -> Option<String> {
    let traffic = &git_service["spec"]["traffic"];
    if traffic.is_null() {
        return None;
    }
    let Some(entries) = traffic.as_array() else {
        return Some("spec.traffic must be a list".to_string());
    };
    for (i, entry) in entries.iter().enumerate() {
        if !entry.is_object() {
            return Some(format!("spec.traffic[{i}] must be a mapping"));
        }
        if let Some(tag) = entry["tag"].as_str()
            && (tag == STABLE_TAG || tag == CANARY_TAG)
        {
            return Some(format!(
                "spec.traffic[{i}] uses the tag {tag:?}, which the release gives its stable and canary Revisions: rename the tag"
            ));
        }
    }
    if latest_share(git_service) == 0 {
        return Some(
            "spec.traffic sends no share to the latest Revision (every percent goes to a Revision named in Git), so no release could reach a new one: give `latestRevision: true` a percent, or remove the Rollout to keep managing traffic by hand".to_string(),
        );
    }
    None
}

/// What the live Service and its Revisions say, read by `observe`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub revisions: Revisions,
    /// The canary Revision is Ready.
    pub canary_ready: bool,
    /// Knative reports the Ready canary Revision scaled to zero: no pod
    /// would answer its share until a cold start.
    pub canary_scaled_to_zero: bool,
    /// The percent `status.traffic` gives the canary Revision by name, once
    /// the Service's controller has seen its latest spec.
    pub canary_percent: Option<u32>,
    /// Knative serves Git's template: its newest Revision is Ready and is of
    /// Git's template, so Git's own `traffic` may take over.
    pub settled: bool,
}

/// What the planner reads of a Knative Service, decided from the live
/// Service and its Revisions (`observe` only reads them): the Revisions
/// seen, with the recorded stable one pinned while a release is in flight
/// or a failure is held; the traffic Git's share and the status give; and
/// why a release cannot start yet.
pub fn look(
    observed: &mut Observed,
    status: &RolloutStatus,
    live: Option<&Value>,
    revisions: &[Value],
    git_service: &Value,
    namespace: &str,
    name: &str,
) -> Seen {
    let seen = see(
        live,
        revisions,
        &git_service["spec"]["template"],
        &status.stable_revision,
        pins_stable(status.phase),
    );
    let share = latest_share(git_service);
    observed.canary_ready = i32::from(seen.canary_ready);
    observed.stable_rolled_out = seen.canary_percent == Some(share);
    observed.self_routed = Some(SelfRouted {
        share,
        canary_percent: seen.canary_percent,
        canary_scaled_to_zero: seen.canary_scaled_to_zero,
    });
    if seen.revisions.stable.is_empty() {
        observed.start_problem = Some(format!(
            "Knative Service {namespace}/{name} has no Ready Revision to keep as stable yet; the release starts once one is Ready"
        ));
    }
    seen
}

/// A release in flight, or a held failure, keeps its stable Revision pinned.
pub fn pins_stable(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::Progressing | Phase::Paused | Phase::Promoting | Phase::Failed
    )
}

/// Whether a Revision was made from `template` (Knative adds labels and
/// annotations of its own, and the release may add a minimum scale).
pub fn made_from(revision: &Value, template: &Value) -> bool {
    is_stored_as(&template["spec"], &revision["spec"])
        && is_stored_as(&template["metadata"]["labels"], &revision["metadata"]["labels"])
        && is_stored_as(
            &template["metadata"]["annotations"],
            &revision["metadata"]["annotations"],
        )
}

fn is_ready(object: &Value) -> bool {
    holds(object, "Ready")
}

/// The object's condition `kind` is True.
fn holds(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

/// Ready, yet scaled to zero as Knative reports it (`actualReplicas: 0`; a
/// Knative that reports no count is not taken to have none).
fn is_scaled_to_zero(revision: &Value) -> bool {
    is_ready(revision) && revision["status"]["actualReplicas"].as_i64() == Some(0)
}

/// Reads the live Service and its Revisions. `recorded_stable` is the
/// Revision the Rollout's status pins; `releasing` says whether a release (or
/// a held failure) keeps it pinned.
pub fn see(
    live: Option<&Value>,
    revisions: &[Value],
    git_template: &Value,
    recorded_stable: &str,
    releasing: bool,
) -> Seen {
    let Some(live) = live else {
        return Seen::default();
    };
    let status = &live["status"];
    let caught_up =
        status["observedGeneration"].as_i64().unwrap_or(0) >= live["metadata"]["generation"].as_i64().unwrap_or(0);
    let revision = |name: &str| {
        revisions
            .iter()
            .find(|r| !name.is_empty() && r["metadata"]["name"].as_str() == Some(name))
    };
    let latest_created = status["latestCreatedRevisionName"].as_str().unwrap_or_default();
    let latest_ready = status["latestReadyRevisionName"].as_str().unwrap_or_default();
    // Settled on a Revision of Git's template as is: not on one the release
    // gave a minimum scale, which Knative is about to replace.
    let min_scale = |object: &Value| object["metadata"]["annotations"][MIN_SCALE_ANNOTATION].clone();
    let settled = caught_up
        && latest_created == latest_ready
        && revision(latest_ready)
            .is_some_and(|r| is_ready(r) && made_from(r, git_template) && min_scale(r) == min_scale(git_template));
    let recorded = revision(recorded_stable).map(|_| recorded_stable);
    let stable = match recorded {
        Some(recorded) if releasing || !settled => recorded.to_string(),
        _ => latest_ready.to_string(),
    };
    // The canary is the Revision Knative made of Git's template, once it made one.
    let canary = revision(latest_created)
        .filter(|r| caught_up && latest_created != stable && made_from(r, git_template))
        .map(|_| latest_created.to_string())
        .unwrap_or_default();
    let canary_ready = revision(&canary).is_some_and(is_ready);
    let canary_scaled_to_zero = revision(&canary).is_some_and(is_scaled_to_zero);
    // `status.traffic` is the split asked for as soon as the Route computes
    // it; RoutesReady says its ingress took it (the KIngress is Ready).
    let routed = caught_up && holds(live, "RoutesReady");
    let canary_percent = (routed && !canary.is_empty()).then(|| {
        status["traffic"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["revisionName"].as_str() == Some(canary.as_str()))
            .map(|t| t["percent"].as_u64().unwrap_or(0) as u32)
            .sum()
    });
    Seen {
        revisions: Revisions { stable, canary },
        canary_ready,
        canary_scaled_to_zero,
        canary_percent,
        settled,
    }
}

/// Whether `revisions`, as a watch holds them, can stand for a list: the
/// Service is at rest (Ready, its latest Revision the latest ready one), and
/// they hold every Revision its status and the Rollout's status
/// (`recorded_stable`) name, the latest Ready in them too. A watch that has
/// not seen a change the Service already reports is not believed, nor one
/// that dropped the pinned Revision, and while a Revision comes up or goes
/// down (a moment when a watch may lag) the Revisions are listed.
pub fn revisions_agree(live: Option<&Value>, revisions: &[Value], recorded_stable: &str) -> bool {
    let Some(live) = live else {
        return true;
    };
    let named = |name: &str| revisions.iter().find(|r| r["metadata"]["name"].as_str() == Some(name));
    let status = &live["status"];
    let latest_created = status["latestCreatedRevisionName"].as_str().unwrap_or_default();
    let latest_ready = status["latestReadyRevisionName"].as_str().unwrap_or_default();
    let at_rest = is_ready(live) && !latest_ready.is_empty() && latest_created == latest_ready;
    at_rest
        && named(latest_ready).is_some_and(is_ready)
        && (recorded_stable.is_empty() || named(recorded_stable).is_some())
}

/// The Service to apply: Git's, with the release's traffic (and, while a
/// canary runs, its minimum scale) overlaid. `recorded_template` is the
/// template Git's status file says is stable, for a Service the cluster
/// lacks (a rebuilt cluster): it is made with that one first.
pub fn desired_service(
    git: &Value,
    intent: &Intent,
    revisions: &Revisions,
    settled: bool,
    min_scale: Option<u32>,
    recorded_template: Option<&Value>,
) -> Value {
    let mut desired = git.clone();
    if !desired["spec"].is_object() {
        // Refused by validation; never a panic on what Git holds.
        return desired;
    }
    let stable = revisions.stable.as_str();
    let share = latest_share(git);
    match intent.canary_replicas {
        Some(_) if stable.is_empty() => {}
        Some(_) => {
            if let Some(scale) = min_scale
                && git["spec"]["template"]["metadata"]["annotations"][MIN_SCALE_ANNOTATION].is_null()
                && desired["spec"]["template"].is_object()
            {
                if !desired["spec"]["template"]["metadata"].is_object() {
                    desired["spec"]["template"]["metadata"] = json!({});
                }
                if !desired["spec"]["template"]["metadata"]["annotations"].is_object() {
                    desired["spec"]["template"]["metadata"]["annotations"] = json!({});
                }
                desired["spec"]["template"]["metadata"]["annotations"][MIN_SCALE_ANNOTATION] = json!(scale.to_string());
            }
            let canary = match intent.stable_template {
                // Promoting: the whole share on the canary, by name.
                StableTemplate::Git => share,
                StableTemplate::Live => canary_percent(share, intent.traffic.unwrap_or(0)),
            };
            let canary_target = if revisions.canary.is_empty() {
                json!({"latestRevision": true, "percent": 0, "tag": CANARY_TAG})
            } else {
                json!({"revisionName": revisions.canary, "latestRevision": false, "percent": canary, "tag": CANARY_TAG})
            };
            desired["spec"]["traffic"] = split(git, stable, share - canary, Some(canary_target));
        }
        None => {
            // Without a canary the template is Git's as is: the minimum scale
            // goes with the canary, and a failed Revision scales down.
            if intent.stable_template == StableTemplate::Live
                && stable.is_empty()
                && let Some(template) = recorded_template
            {
                desired["spec"]["template"] = template.clone();
            }
            let git_takes_over = intent.stable_template == StableTemplate::Git && settled;
            if !stable.is_empty() && !git_takes_over {
                desired["spec"]["traffic"] = split(git, stable, share, None);
            }
        }
    }
    desired
}

/// Git's traffic with its latest share replaced by the stable Revision's
/// part and the canary's.
fn split(git: &Value, stable: &str, stable_percent: u32, canary: Option<Value>) -> Value {
    let mut entries: Vec<Value> = git["spec"]["traffic"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| !follows_latest(e))
        .cloned()
        .collect();
    entries
        .push(json!({"revisionName": stable, "latestRevision": false, "percent": stable_percent, "tag": STABLE_TAG}));
    entries.extend(canary);
    Value::Array(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(canary: Option<i32>, stable_template: StableTemplate, traffic: Option<u32>) -> Intent {
        Intent {
            stable_template,
            canary_replicas: canary,
            traffic,
            matches: Vec::new(),
            header_modifier: None,
            mirror: None,
            hold_canary: false,
            pin_stable_service: false,
            await_pin: false,
            route_canary: canary.is_some(),
            rollout_id: "r1".into(),
        }
    }

    fn service(traffic: Option<Value>) -> Value {
        let mut service = json!({
            "apiVersion": API_VERSION, "kind": "Service",
            "metadata": {"name": "fn", "namespace": "demo"},
            "spec": {"template": {"metadata": {"labels": {"app": "fn"}}, "spec": {"containers": [{"image": "fn:2"}]}}},
        });
        if let Some(traffic) = traffic {
            service["spec"]["traffic"] = traffic;
        }
        service
    }

    fn revisions(stable: &str, canary: &str) -> Revisions {
        Revisions {
            stable: stable.into(),
            canary: canary.into(),
        }
    }

    #[test]
    fn a_step_pins_stable_by_name_and_gives_the_canary_its_share() {
        let git = service(None);
        let desired = desired_service(
            &git,
            &intent(Some(1), StableTemplate::Live, Some(20)),
            &revisions("fn-00001", "fn-00002"),
            false,
            Some(1),
            None,
        );
        assert_eq!(
            desired["spec"]["traffic"],
            json!([
                {"revisionName": "fn-00001", "latestRevision": false, "percent": 80, "tag": "stable"},
                {"revisionName": "fn-00002", "latestRevision": false, "percent": 20, "tag": "canary"},
            ])
        );
        assert_eq!(
            desired["spec"]["template"]["metadata"]["annotations"][MIN_SCALE_ANNOTATION],
            "1"
        );
        assert_eq!(desired["spec"]["template"]["spec"], git["spec"]["template"]["spec"]);
    }

    #[test]
    fn before_the_new_revision_exists_the_canary_follows_latest_with_nothing() {
        let desired = desired_service(
            &service(None),
            &intent(Some(1), StableTemplate::Live, None),
            &revisions("fn-00001", ""),
            false,
            None,
            None,
        );
        assert_eq!(desired["spec"]["traffic"][0]["percent"], 100);
        assert_eq!(
            desired["spec"]["traffic"][1],
            json!({"latestRevision": true, "percent": 0, "tag": "canary"})
        );
        assert!(desired["spec"]["template"]["metadata"]["annotations"].is_null());
    }

    #[test]
    fn revisions_git_names_keep_their_entries_and_the_release_splits_the_latest_share() {
        let git = service(Some(json!([
            {"revisionName": "fn-00001", "percent": 10, "tag": "old"},
            {"latestRevision": true, "percent": 90},
        ])));
        assert_eq!(latest_share(&git), 90);
        let desired = desired_service(
            &git,
            &intent(Some(1), StableTemplate::Live, Some(50)),
            &revisions("fn-00002", "fn-00003"),
            false,
            None,
            None,
        );
        let percents: Vec<_> = desired["spec"]["traffic"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["tag"].as_str().unwrap().to_string(), e["percent"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            percents,
            [("old".into(), 10), ("stable".into(), 45), ("canary".into(), 45)]
        );
    }

    #[test]
    fn promote_moves_the_whole_share_then_git_takes_over_once_settled() {
        let git = service(None);
        let promoting = desired_service(
            &git,
            &intent(Some(1), StableTemplate::Git, Some(100)),
            &revisions("fn-00001", "fn-00002"),
            false,
            None,
            None,
        );
        assert_eq!(promoting["spec"]["traffic"][0]["percent"], 0);
        assert_eq!(promoting["spec"]["traffic"][1]["percent"], 100);
        let healthy = intent(None, StableTemplate::Git, None);
        let unsettled = desired_service(&git, &healthy, &revisions("fn-00002", ""), false, None, None);
        assert_eq!(unsettled["spec"]["traffic"][0]["revisionName"], "fn-00002");
        let settled = desired_service(&git, &healthy, &revisions("fn-00002", ""), true, None, None);
        assert_eq!(settled, git);
    }

    #[test]
    fn a_failure_puts_all_traffic_on_stable_and_drops_the_minimum_scale() {
        let git = service(None);
        let failed = desired_service(
            &git,
            &intent(None, StableTemplate::Live, None),
            &revisions("fn-00001", ""),
            true,
            Some(1),
            None,
        );
        assert_eq!(failed["spec"]["template"], git["spec"]["template"]);
        assert_eq!(
            failed["spec"]["traffic"],
            json!([{"revisionName": "fn-00001", "latestRevision": false, "percent": 100, "tag": "stable"}])
        );
    }

    fn revision(name: &str, image: &str, ready: bool) -> Value {
        json!({
            "metadata": {"name": name, "labels": {"app": "fn", SERVICE_LABEL: "fn"}},
            "spec": {"containers": [{"image": image}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "Unknown" }}],
                "actualReplicas": 1},
        })
    }

    fn live(created: &str, ready: &str, traffic: Value) -> Value {
        json!({
            "metadata": {"generation": 3},
            "status": {"observedGeneration": 3, "latestCreatedRevisionName": created, "latestReadyRevisionName": ready, "traffic": traffic,
                "conditions": [{"type": "RoutesReady", "status": "True"}]},
        })
    }

    #[test]
    fn revisions_a_watch_holds_stand_for_a_list_only_for_a_service_at_rest_and_all_it_names() {
        let ready = |mut service: Value| {
            service["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
            service
        };
        let service = ready(live("fn-00002", "fn-00002", json!([])));
        let both = [revision("fn-00001", "fn:1", true), revision("fn-00002", "fn:2", true)];
        assert!(revisions_agree(Some(&service), &both, "fn-00001"));
        assert!(revisions_agree(Some(&service), &both, ""));
        assert!(
            revisions_agree(None, &[], "fn-00001"),
            "no Service: nothing is read of them"
        );
        // The latest Revision not seen yet.
        assert!(!revisions_agree(Some(&service), &both[..1], "fn-00001"));
        // The Revision the Rollout pins not held.
        assert!(!revisions_agree(Some(&service), &both, "fn-00000"));
        // The Service reports its latest Revision Ready before the watch does.
        let behind = [revision("fn-00001", "fn:1", true), revision("fn-00002", "fn:2", false)];
        assert!(!revisions_agree(Some(&service), &behind, "fn-00001"));
        // A Revision coming up, or the Service not Ready: listed.
        let coming_up = ready(live("fn-00002", "fn-00001", json!([])));
        assert!(!revisions_agree(Some(&coming_up), &both, "fn-00001"));
        let not_ready = live("fn-00002", "fn-00002", json!([]));
        assert!(!revisions_agree(Some(&not_ready), &both, "fn-00001"));
    }

    #[test]
    fn the_canary_is_the_revision_made_of_git_and_its_share_is_read_back() {
        let git_template = service(None)["spec"]["template"].clone();
        let revisions = [revision("fn-00001", "fn:1", true), revision("fn-00002", "fn:2", true)];
        let service = live(
            "fn-00002",
            "fn-00002",
            json!([{"revisionName": "fn-00001", "percent": 80}, {"revisionName": "fn-00002", "percent": 20}]),
        );
        let seen = see(Some(&service), &revisions, &git_template, "fn-00001", true);
        assert_eq!(
            seen.revisions,
            super::Revisions {
                stable: "fn-00001".into(),
                canary: "fn-00002".into()
            }
        );
        assert!(seen.canary_ready);
        assert_eq!(seen.canary_percent, Some(20));
        assert!(!seen.canary_scaled_to_zero);
        // Scaled to zero, the canary is still Ready but serves nothing yet.
        let mut cold = revisions.clone();
        cold[1]["status"]["actualReplicas"] = json!(0);
        let cold = see(Some(&service), &cold, &git_template, "fn-00001", true);
        assert!(cold.canary_ready && cold.canary_scaled_to_zero);
        // A Knative that reports no count is not taken to have none.
        let mut unreported = revisions.clone();
        unreported[1]["status"]
            .as_object_mut()
            .unwrap()
            .remove("actualReplicas");
        assert!(!see(Some(&service), &unreported, &git_template, "fn-00001", true).canary_scaled_to_zero);
        // The split asked for, before its ingress has taken it, is not read back.
        let mut unrouted = service.clone();
        unrouted["status"]["conditions"][0]["status"] = json!("Unknown");
        assert_eq!(
            see(Some(&unrouted), &revisions, &git_template, "fn-00001", true).canary_percent,
            None
        );
        // Before the controller has seen the latest spec, nothing is read back.
        let mut behind = service.clone();
        behind["metadata"]["generation"] = json!(4);
        assert_eq!(
            see(Some(&behind), &revisions, &git_template, "fn-00001", true).canary_percent,
            None
        );
    }

    #[test]
    fn git_takes_over_only_once_the_newest_revision_of_its_template_is_ready() {
        let git_template = service(None)["spec"]["template"].clone();
        // Reverted: fn-00003 has Git's template again, not Ready yet; fn-00002 (aborted) is.
        let revisions = [
            revision("fn-00001", "fn:2", true),
            revision("fn-00002", "fn:3", true),
            revision("fn-00003", "fn:2", false),
        ];
        let service = live("fn-00003", "fn-00002", json!([]));
        let seen = see(Some(&service), &revisions, &git_template, "fn-00001", false);
        assert!(!seen.settled);
        assert_eq!(seen.revisions.stable, "fn-00001");
        let revisions = [
            revisions[0].clone(),
            revisions[1].clone(),
            revision("fn-00003", "fn:2", true),
        ];
        let service = self::live("fn-00003", "fn-00003", json!([]));
        let seen = see(Some(&service), &revisions, &git_template, "fn-00001", false);
        assert!(seen.settled);
        assert_eq!(seen.revisions.stable, "fn-00003");
    }

    #[test]
    fn a_release_in_flight_or_a_held_failure_keeps_the_recorded_stable_revision() {
        let git_service = service(None);
        let revisions = [revision("fn-00001", "fn:1", true), revision("fn-00002", "fn:2", true)];
        let settled = live(
            "fn-00002",
            "fn-00002",
            json!([{"revisionName": "fn-00002", "percent": 100}]),
        );
        let stable_of = |phase: Phase| {
            let status = RolloutStatus {
                phase,
                stable_revision: "fn-00001".into(),
                ..RolloutStatus::default()
            };
            let mut observed = Observed::default();
            let seen = look(
                &mut observed,
                &status,
                Some(&settled),
                &revisions,
                &git_service,
                "ns",
                "fn",
            );
            (seen.revisions.stable, observed.stable_rolled_out)
        };
        // The canary Revision has Git's whole share: the stable one is rolled out.
        for phase in [Phase::Progressing, Phase::Paused, Phase::Promoting, Phase::Failed] {
            assert_eq!(stable_of(phase), ("fn-00001".to_string(), true), "{phase:?}");
        }
        // Settled on Git's template with no release: Knative's newest Revision is stable.
        assert_eq!(stable_of(Phase::Healthy).0, "fn-00002");
        // No Ready Revision at all: the release waits, and says why.
        let mut observed = Observed::default();
        let none_ready = [revision("fn-00001", "fn:1", false)];
        let unready = live("fn-00001", "", json!([]));
        let status = RolloutStatus::default();
        look(
            &mut observed,
            &status,
            Some(&unready),
            &none_ready,
            &git_service,
            "ns",
            "fn",
        );
        assert!(observed.start_problem.is_some_and(|p| p.contains("no Ready Revision")));
    }

    #[test]
    fn traffic_git_cannot_release_is_refused() {
        assert!(
            git_problem(&service(Some(json!([{"revisionName": "fn-00001", "percent": 100}]))))
                .is_some_and(|p| p.contains("no share to the latest"))
        );
        assert!(
            git_problem(&service(Some(
                json!([{"latestRevision": true, "percent": 100, "tag": "canary"}])
            )))
            .is_some_and(|p| p.contains("tag \"canary\""))
        );
        assert_eq!(
            git_problem(&service(Some(json!([{"latestRevision": true, "percent": 100}])))),
            None
        );
    }
}
