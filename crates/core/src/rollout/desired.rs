//! One Rollout's plan, pure: from what was observed, the planner's decision,
//! turned into overlays on the app's desired objects (stable workload,
//! pinned Service, weighted routes) and the canary objects to write or
//! delete. Nothing here reads the cluster, and nothing after the planner
//! changes its decision: routes follow `Intent::route_canary` and `traffic`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::api::{API_VERSION, DEFAULT_CANARY_SUFFIX, GROUP, RolloutSpec, Strategy};
use super::knative;
use super::model::{CanaryWrite, RolloutWork};
use super::model::{RolloutObserved, RolloutsObserved};
use super::model::{Target, find_in};
use super::overlay::{self, WorkloadKind};
use super::plan;
use crate::manifest::{ObjectKey, Problem};
use crate::model::{Deletion, LiveMeta, Resolved};
use crate::plan::Planned;
use crate::plan::desired::{is_stored_as, rehash};
use crate::{MANAGED_BY_LABEL, SOURCE_ANNOTATION};

/// A routing object of the app: a core Service, an HTTPRoute or an Ingress.
fn find(planned: &[Planned<'_>], kind: &str, namespace: &str, name: &str) -> Option<usize> {
    let group = match kind {
        "HTTPRoute" => "gateway.networking.k8s.io",
        "Ingress" => "networking.k8s.io",
        _ => "",
    };
    find_in(planned, group, kind, namespace, name)
}

fn not_held(target: &Target, planned: &[Planned<'_>], kind: &str, name: &str) -> Problem {
    planned[target.index].manifest.problem(format!(
        "trafficRoutings names {kind} {}/{name}, which this app does not hold",
        target.namespace
    ))
}

/// Plans every Rollout of an app, in the app's order, and overlays the
/// app's objects each governs. Problems (a Rollout naming a workload the
/// app does not hold, an unusable status file) keep the app from being
/// applied, like any invalid manifest.
pub fn plan_rollouts(
    planned: &mut [Planned<'_>],
    observed: RolloutsObserved,
    instance: &str,
) -> (Vec<RolloutWork>, Vec<Problem>) {
    let mut work = Vec::new();
    let mut problems = Vec::new();
    for found in observed.0 {
        let (target, observed) = match found {
            Ok(found) => found,
            Err(problem) => {
                problems.push(problem);
                continue;
            }
        };
        if let Some(message) = &observed.record_problem {
            let rollout = planned[target.index].manifest;
            problems.push(rollout.problem(format!(
                "Rollout {}/{}: it has no status, and its status file in Git cannot be used: {message}; nothing of the app is applied until the file is fixed or removed",
                target.namespace, target.name
            )));
            continue;
        }
        match plan_rollout(planned, target, observed, instance) {
            Ok(item) => work.push(item),
            Err(problem) => problems.push(problem),
        }
    }
    (work, problems)
}

/// Plans one Rollout and overlays the app's objects it governs.
pub fn plan_rollout(
    planned: &mut [Planned<'_>],
    target: Target,
    observed: RolloutObserved,
    instance: &str,
) -> Result<RolloutWork, Problem> {
    let manifest = planned[target.index].manifest;
    let (spec, namespace, kind) = (&target.spec, target.namespace.as_str(), target.kind);
    let git_workload = planned[target.workload].desired.clone();
    let status = observed.previous.clone().unwrap_or_default();
    let mut seen = observed.planner;
    // The workload's replicas as this sync writes them (an autoscaler's count may stand for Git's).
    seen.replicas = git_workload["spec"]["replicas"].as_i64().unwrap_or(1) as i32;

    // The checks a release must pass to start, made with the ID it would start with.
    let rollout_id = super::plan::release_id(spec.rollout_id.as_deref(), &seen.commit);
    let pod_labels = overlay::canary_pod_labels(spec, &git_workload, &rollout_id);
    let mut services = Vec::new();
    for routing in &spec.strategy.canary.traffic_routings {
        let service = find(planned, "Service", namespace, &routing.service)
            .ok_or_else(|| not_held(&target, planned, "Service", &routing.service))?;
        if let Some(problem) = overlay::selector_problem(spec, &planned[service].desired, &pod_labels) {
            seen.start_problem = Some(problem);
        }
        services.push(service);
    }

    let owner = CanaryOwner {
        instance,
        rollout: &target.name,
        rollout_uid: observed.rollout_uid.as_deref(),
    };
    if seen.start_problem.is_none() {
        seen.start_problem = taken_canary_name(namespace, &observed.canary_live, &owner, &spec.strategy);
    }
    if seen.start_problem.is_none() {
        seen.start_problem = plan::mirror_problem(spec, &observed.gateways);
    }
    let plan = plan::plan(spec, &status, &seen);
    let revisions = &observed.revisions;
    let live = LiveWorkload {
        revisions,
        stable_template: observed.stable_template.as_ref(),
        knative_settled: observed.knative_settled,
    };
    let stable = governed_workload(kind, &git_workload, &live, &plan, spec);
    set_desired(&mut planned[target.workload], stable);

    let (mut wanted, mut unwanted) = overlay_routes(planned, &target, &services, &plan, revisions, &git_workload)?;
    let (jobs, jobs_done) = check_jobs(&target, &plan, revisions, &observed.canary_live);
    wanted.extend(jobs);
    unwanted.extend(jobs_done);
    for object in &mut wanted {
        mark_managed(object, instance, &manifest.location());
        owner.mark(object);
    }
    let changes = CanaryObjects {
        live: &observed.canary_live,
        kinds: &observed.canary_kinds,
        namespace,
        owner: &owner,
    };
    let canary_writes = changes.writes(wanted).map_err(|problem| manifest.problem(problem))?;
    let (route_deletions, canary_deletions) = if plan.intent.hold_canary {
        (Vec::new(), Vec::new())
    } else {
        changes.deletions(unwanted)
    };
    let images = git_workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["image"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Ok(RolloutWork {
        app: manifest.app.clone(),
        source: manifest.location(),
        images,
        last_command_comment: observed.last_command_comment,
        kind,
        workload: spec.workload_ref.name.clone(),
        plan,
        canary_writes,
        route_deletions,
        canary_deletions,
        revisions: observed.revisions,
        rollout_uid: observed.rollout_uid,
        spec: target.spec,
        namespace: target.namespace,
        name: target.name,
    })
}

/// The release's check Jobs wanted, and those to delete.
fn check_jobs(
    target: &Target,
    plan: &plan::Plan,
    revisions: &plan::Revisions,
    live: &BTreeMap<(&'static str, String), Value>,
) -> (Vec<Value>, Unwanted) {
    let bindings = super::analysis::Bindings::of_release(
        &target.namespace,
        &target.spec,
        &plan.status.rollout_id,
        &revisions.canary,
        &revisions.stable,
    );
    super::jobs::planned(&target.spec, &plan.status, live, &bindings)
}

/// What the governed workload's overlay takes from what was observed.
struct LiveWorkload<'o> {
    revisions: &'o plan::Revisions,
    stable_template: Option<&'o Value>,
    knative_settled: bool,
}

/// The governed workload as the plan wants it: a Deployment's or
/// StatefulSet's stable template and partition, or a Knative Service's
/// traffic; each marked with the stable template's hash.
fn governed_workload(
    kind: WorkloadKind,
    git_workload: &Value,
    observed: &LiveWorkload<'_>,
    plan: &plan::Plan,
    spec: &RolloutSpec,
) -> Value {
    let stable_hash = &plan.status.stable_template_hash;
    if kind != WorkloadKind::KnativeService {
        return overlay::stable_workload(kind, git_workload, observed.stable_template, &plan.intent, stable_hash);
    }
    // Just promoted, the stable Revision is the canary's.
    let revisions = plan::Revisions {
        stable: plan.status.stable_revision.clone(),
        canary: observed.revisions.canary.clone(),
    };
    let mut service = knative::desired_service(
        git_workload,
        &plan.intent,
        &revisions,
        observed.knative_settled,
        spec.strategy.canary.canary_min_scale,
        observed.stable_template,
    );
    if !stable_hash.is_empty() && service["metadata"].is_object() {
        overlay::mark_stable_hash(&mut service, stable_hash);
    }
    service
}

/// Whose canary objects these are: this instance's, made for this Rollout.
struct CanaryOwner<'o> {
    instance: &'o str,
    rollout: &'o str,
    /// `None` until the Rollout exists; no release runs before that.
    rollout_uid: Option<&'o str>,
}

impl CanaryOwner<'_> {
    /// Canary objects name their Rollout, so that they go with it when it is
    /// deleted and no other Rollout's cleanup takes them.
    fn mark(&self, object: &mut Value) {
        if let Some(uid) = self.rollout_uid {
            object["metadata"]["ownerReferences"] = json!([{
                "apiVersion": API_VERSION,
                "kind": "Rollout",
                "name": self.rollout,
                "uid": uid,
            }]);
        }
    }

    /// The Rollout a live canary object names, when it names one.
    fn named_rollout(object: &Value) -> Option<(&str, &str)> {
        object["metadata"]["ownerReferences"]
            .as_array()?
            .iter()
            .find(|r| r["kind"] == "Rollout" && r["apiVersion"].as_str().is_some_and(|v| v.starts_with(GROUP)))
            .map(|r| {
                (
                    r["name"].as_str().unwrap_or_default(),
                    r["uid"].as_str().unwrap_or_default(),
                )
            })
    }

    /// This instance made the object for this Rollout: by owner reference
    /// only. The managed-by label alone is on every object gitcanary applies
    /// from Git, so an app's own `web-canary` would pass for the canary.
    fn owns(&self, object: &Value) -> bool {
        object["metadata"]["labels"][MANAGED_BY_LABEL].as_str() == Some(self.instance)
            && self
                .rollout_uid
                .is_some_and(|uid| Self::named_rollout(object).is_some_and(|(_, named)| named == uid))
    }
}

/// A canary object's name held by an object this Rollout did not make: the
/// release must not start, or it would write over (and later delete) it.
fn taken_canary_name(
    namespace: &str,
    canary_live: &BTreeMap<(&'static str, String), Value>,
    owner: &CanaryOwner<'_>,
    strategy: &Strategy,
) -> Option<String> {
    let canary = &strategy.canary;
    canary_live.iter().find_map(|((kind, name), object)| {
        if owner.owns(object) {
            return None;
        }
        let managed = object["metadata"]["labels"][MANAGED_BY_LABEL].as_str() == Some(owner.instance);
        let holder = match (CanaryOwner::named_rollout(object), object["metadata"]["annotations"][SOURCE_ANNOTATION].as_str()) {
            (Some((rollout, _)), _) if managed => {
                format!("it is the canary of Rollout {namespace}/{rollout}")
            }
            (None, Some(source)) if managed => format!("it is an object of Git ({source})"),
            _ => format!("gitcanary did not make it ({})", field_managers(object)),
        };
        let suffix = canary.canary_suffix.as_deref().unwrap_or(DEFAULT_CANARY_SUFFIX);
        Some(format!(
            "{kind} {namespace}/{name} already exists and {holder}; the canary of Rollout {namespace}/{} needs that name: rename or delete that {kind}, or set spec.strategy.{}.canarySuffix to something other than {suffix:?}",
            owner.rollout,
            strategy.style.field()
        ))
    })
}

fn field_managers(object: &Value) -> String {
    let mut managers: Vec<&str> = object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["manager"].as_str())
        .collect();
    managers.sort_unstable();
    managers.dedup();
    if managers.is_empty() {
        "no field manager recorded".to_string()
    } else {
        format!("managed by {}", managers.join(", "))
    }
}

/// Unwanted canary objects, by apiVersion, kind and name.
type Unwanted = Vec<(&'static str, &'static str, String)>;

/// The routes and Services of the plan's intent: overlays on the app's
/// objects, and the canary objects wanted and no longer wanted.
fn overlay_routes(
    planned: &mut [Planned<'_>],
    target: &Target,
    services: &[usize],
    plan: &plan::Plan,
    revisions: &plan::Revisions,
    git_workload: &Value,
) -> Result<(Vec<Value>, Unwanted), Problem> {
    let (spec, namespace, kind, intent) = (&target.spec, target.namespace.as_str(), target.kind, &plan.intent);
    let mut wanted = Vec::new();
    let mut unwanted = Vec::new();
    if kind == WorkloadKind::Deployment {
        match intent.canary_replicas {
            // Made once the live stable Service is pinned; kept as it is till then.
            Some(_) if intent.await_pin => {}
            Some(replicas) => wanted.push(overlay::canary_deployment(
                spec,
                git_workload,
                replicas,
                &intent.rollout_id,
                &plan.status.canary_template_hash,
            )),
            None => unwanted.push((
                "apps/v1",
                "Deployment",
                spec.strategy.canary.canary_name(&spec.workload_ref.name),
            )),
        }
    }
    for (routing, &service) in spec.strategy.canary.traffic_routings.iter().zip(services) {
        if intent.route_canary {
            wanted.push(overlay::canary_service(
                spec,
                &planned[service].desired,
                kind,
                &revisions.canary,
            ));
        } else if intent.canary_replicas.is_none() {
            unwanted.push(("v1", "Service", spec.strategy.canary.canary_name(&routing.service)));
        }
        if intent.pin_stable_service {
            let pinned = overlay::pinned_stable_service(&planned[service].desired, kind, &revisions.stable);
            set_desired(&mut planned[service], pinned);
        }
        if let Some(gateway) = &routing.gateway {
            let route = find(planned, "HTTPRoute", namespace, &gateway.http_route_name)
                .ok_or_else(|| not_held(target, planned, "HTTPRoute", &gateway.http_route_name))?;
            if let Some(step) = intent.step_route() {
                let weighted = overlay::weighted_route(spec, &planned[route].desired, &routing.service, &step);
                set_desired(&mut planned[route], weighted);
            }
        }
        if let Some(ingress) = &routing.ingress {
            let index = find(planned, "Ingress", namespace, &ingress.name)
                .ok_or_else(|| not_held(target, planned, "Ingress", &ingress.name))?;
            match intent.traffic {
                Some(traffic) => wanted.push(overlay::canary_ingress(
                    spec,
                    &planned[index].desired,
                    &routing.service,
                    traffic,
                    &intent.matches,
                )),
                None => unwanted.push((
                    "networking.k8s.io/v1",
                    "Ingress",
                    spec.strategy.canary.canary_name(&ingress.name),
                )),
            }
        }
    }
    Ok((wanted, unwanted))
}

/// The canary objects that exist, against which the wanted ones are decided.
struct CanaryObjects<'o> {
    live: &'o BTreeMap<(&'static str, String), Value>,
    kinds: &'o BTreeMap<&'static str, Resolved>,
    namespace: &'o str,
    owner: &'o CanaryOwner<'o>,
}

impl CanaryObjects<'_> {
    fn key(&self, api_version: &str, kind: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: api_version
                .rsplit_once('/')
                .map(|(g, _)| g.to_string())
                .unwrap_or_default(),
            kind: kind.to_string(),
            namespace: Some(self.namespace.to_string()),
            name: name.to_string(),
        }
    }

    fn live(&self, kind: &str, name: &str) -> Option<&Value> {
        self.live
            .iter()
            .find(|((k, n), _)| *k == kind && n == name)
            .map(|(_, v)| v)
    }

    /// The live object, when this Rollout made it.
    fn ours(&self, object: &Value) -> Option<LiveMeta> {
        LiveMeta::of(object).filter(|_| self.owner.owns(object))
    }

    /// The wanted canary objects that differ from what the cluster has.
    fn writes(&self, wanted: Vec<Value>) -> Result<Vec<CanaryWrite>, String> {
        let mut writes = Vec::new();
        for object in wanted {
            let api_version = object["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let current = self.live(&kind, &name).cloned();
            if current.as_ref().is_some_and(|current| is_stored_as(&object, current)) {
                continue;
            }
            let Some(resolved) = self.kinds.get(kind.as_str()).cloned() else {
                return Err(format!(
                    "{kind} in {api_version} is not served: the canary {kind} {}/{name} cannot be made",
                    self.namespace
                ));
            };
            writes.push(CanaryWrite {
                key: self.key(&api_version, &kind, &name),
                resolved,
                ours: current.as_ref().and_then(|c| self.ours(c)).is_some(),
                live: current,
                object,
            });
        }
        Ok(writes)
    }

    /// Deletes of the unwanted canary objects that exist and are this
    /// instance's: the routes (canary Ingresses), and the others. Routes go
    /// first, before anything else is written; then the Services they named,
    /// then the canary workload: no request is ever routed to a canary that
    /// is gone.
    fn deletions(&self, mut unwanted: Vec<(&'static str, &'static str, String)>) -> (Vec<Deletion>, Vec<Deletion>) {
        unwanted.sort_by_key(|(_, kind, _)| match *kind {
            "Ingress" => 0,
            "Service" => 1,
            _ => 2,
        });
        let deletions: Vec<Deletion> = unwanted
            .into_iter()
            .filter_map(|(api_version, kind, name)| {
                let meta = self.ours(self.live(kind, &name)?)?;
                // The uid only: the canary's controller updates its status meanwhile.
                Some(Deletion {
                    resource_version: None,
                    // A Job's pods go with it.
                    foreground: matches!(kind, "Deployment" | "Job"),
                    ..Deletion::of(api_version, self.key(api_version, kind, &name), &meta)
                })
            })
            .collect();
        deletions.into_iter().partition(|d| d.key.kind == "Ingress")
    }
}

fn set_desired(planned: &mut Planned<'_>, mut desired: Value) {
    rehash(&mut desired);
    planned.desired = desired;
}

fn mark_managed(object: &mut Value, instance: &str, source: &str) {
    if !object["metadata"]["labels"].is_object() {
        object["metadata"]["labels"] = json!({});
    }
    object["metadata"]["labels"][MANAGED_BY_LABEL] = json!(instance);
    if !object["metadata"]["annotations"].is_object() {
        object["metadata"]["annotations"] = json!({});
    }
    object["metadata"]["annotations"][SOURCE_ANNOTATION] = json!(source);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_deleted_before_the_services_and_the_canary_workload() {
        let owner = CanaryOwner {
            instance: "prod",
            rollout: "echo",
            rollout_uid: Some("r-1"),
        };
        let live_object = |kind: &str, uid: &str| {
            json!({"kind": kind, "metadata": {
                "name": "echo-canary", "namespace": "shop", "uid": uid,
                "labels": {MANAGED_BY_LABEL: "prod"},
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": "Rollout", "name": "echo", "uid": "r-1"}],
            }})
        };
        let live: BTreeMap<(&'static str, String), Value> = [
            (
                ("Deployment", "echo-canary".to_string()),
                live_object("Deployment", "d"),
            ),
            (("Service", "echo-canary".to_string()), live_object("Service", "s")),
            (("Ingress", "echo-canary".to_string()), live_object("Ingress", "i")),
        ]
        .into();
        let changes = CanaryObjects {
            live: &live,
            kinds: &BTreeMap::new(),
            namespace: "shop",
            owner: &owner,
        };
        // The order overlay_routes finds them in: the workload first.
        let (routes, others) = changes.deletions(vec![
            ("apps/v1", "Deployment", "echo-canary".to_string()),
            ("v1", "Service", "echo-canary".to_string()),
            ("networking.k8s.io/v1", "Ingress", "echo-canary".to_string()),
        ]);
        let kinds = |deletions: &[Deletion]| -> Vec<String> { deletions.iter().map(|d| d.key.kind.clone()).collect() };
        assert_eq!(
            kinds(&routes),
            ["Ingress"],
            "the route goes before anything else is written"
        );
        assert_eq!(kinds(&others), ["Service", "Deployment"]);
    }

    #[test]
    fn an_object_of_git_with_the_canary_name_is_never_the_canary() {
        let owner = CanaryOwner {
            instance: "prod",
            rollout: "web",
            rollout_uid: Some("r-1"),
        };
        // Another app's Deployment: gitcanary applied it, so it has the label.
        let from_git = json!({"kind": "Deployment", "metadata": {
            "name": "web-canary", "namespace": "shop", "uid": "d",
            "labels": {MANAGED_BY_LABEL: "prod"},
            "annotations": {SOURCE_ANNOTATION: "other/deployment.yaml:1"},
        }});
        assert!(!owner.owns(&from_git));
        let live: BTreeMap<(&'static str, String), Value> =
            [(("Deployment", "web-canary".to_string()), from_git)].into();
        let changes = CanaryObjects {
            live: &live,
            kinds: &BTreeMap::new(),
            namespace: "shop",
            owner: &owner,
        };
        let (routes, others) = changes.deletions(vec![("apps/v1", "Deployment", "web-canary".to_string())]);
        assert!(routes.is_empty() && others.is_empty(), "never deleted");
        let problem = taken_canary_name("shop", &live, &owner, &Strategy::default()).expect("refused");
        assert!(
            problem.contains("it is an object of Git (other/deployment.yaml:1)")
                && problem.contains("the canary of Rollout shop/web needs that name"),
            "{problem}"
        );
        // Before the Rollout exists nothing is its canary.
        let unborn = CanaryOwner {
            rollout_uid: None,
            ..owner
        };
        let made = json!({"metadata": {"labels": {MANAGED_BY_LABEL: "prod"},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": "Rollout", "name": "web", "uid": "r-1"}]}});
        assert!(!unborn.owns(&made));
    }
}
