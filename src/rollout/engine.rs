//! The rollout engine: reads what the planner needs from the cluster, asks
//! the planner, and turns its intent into overlays on the app's desired
//! objects (applied by the one sync path), plus the canary objects, pod
//! batch labels and the Rollout's status, written after the app is applied.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{ControllerRevision, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::analysis;
use super::api::{API_VERSION, GROUP, KIND, Phase, Rollout, RolloutSpec, RolloutStatus};
use super::overlay::{
    self, BATCH_ID_LABEL, CANARY_HASH_ANNOTATION, ROLLOUT_ID_LABEL, Revisions, STABLE_HASH_ANNOTATION, WorkloadKind,
    canary_name,
};
use super::plan::{self, Observed, Plan};
use crate::cluster::Cluster;
use crate::manifest::{ObjectKey, Problem};
use crate::plan::desired::{canonical_hash, is_subset, rehash};
use crate::plan::{Deletion, LiveMeta, Planned, Resolved, SyncOptions};
use crate::{Error, FIELD_MANAGER, MANAGED_BY_LABEL, Result, SOURCE_ANNOTATION};

/// Annotations that carry a signal; each value is acted on once.
pub const PROMOTE_ANNOTATION: &str = "gitcanary.io/promote";
pub const ABORT_ANNOTATION: &str = "gitcanary.io/abort";
/// The last pull-request comment whose `/gitcanary` command was handled.
pub const LAST_COMMENT_ANNOTATION: &str = "gitcanary.io/github-last-comment";

/// What remains to do for one rollout once its app has been applied.
#[derive(Debug)]
pub struct RolloutWork {
    pub namespace: String,
    pub name: String,
    /// The app the Rollout belongs to.
    pub app: String,
    /// Images of the template in Git, for the status written on promote.
    pub images: Vec<String>,
    pub spec: RolloutSpec,
    /// The last GitHub comment whose command was handled.
    pub last_command_comment: u64,
    pub kind: WorkloadKind,
    pub workload: String,
    pub plan: Plan,
    /// `file:line` of the Rollout.
    pub source: String,
    /// Canary objects to write before the app's objects (routes may name them).
    pub canary_writes: Vec<CanaryWrite>,
    /// Canary objects of this instance to delete once the routes are back on stable.
    pub canary_deletions: Vec<Deletion>,
    previous: Option<RolloutStatus>,
    revisions: Revisions,
}

/// A canary object that differs from what the cluster has.
#[derive(Debug)]
pub struct CanaryWrite {
    pub key: ObjectKey,
    pub resolved: Resolved,
    pub object: Value,
    /// The live object by that name, if any.
    pub live: Option<Value>,
    /// The live object is this instance's: conflicts are forced.
    pub ours: bool,
}

impl RolloutWork {
    pub fn requeue_after(&self) -> Option<Duration> {
        self.plan.requeue_after
    }

    /// What GitHub reporting needs to know of this rollout.
    pub fn summary(&self) -> RolloutSummary {
        RolloutSummary {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            spec: self.spec.clone(),
            status: self.plan.status.clone(),
            changed: self.previous.as_ref() != Some(&self.plan.status),
            last_command_comment: self.last_command_comment,
        }
    }
}

/// A rollout after a sync, for reporting.
#[derive(Debug, Clone)]
pub struct RolloutSummary {
    pub namespace: String,
    pub name: String,
    pub spec: RolloutSpec,
    pub status: RolloutStatus,
    /// The status changed in this sync.
    pub changed: bool,
    pub last_command_comment: u64,
}

/// Writes a Rollout's whole status with gitcanary's field manager.
pub async fn apply_status(cluster: &Cluster, namespace: &str, name: &str, status: &RolloutStatus) -> Result<()> {
    let rollouts: Api<Rollout> = Api::namespaced(cluster.client.clone(), namespace);
    let body = json!({"apiVersion": API_VERSION, "kind": KIND, "status": status});
    rollouts
        .patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
        .map_err(Error::kube(format!("writing the status of Rollout {namespace}/{name}")))?;
    Ok(())
}

pub(crate) fn is_rollout(planned: &Planned<'_>) -> bool {
    planned.manifest.group() == GROUP && planned.manifest.kind() == KIND
}

fn find<'p, 'a>(planned: &'p [Planned<'a>], kind: &str, namespace: &str, name: &str) -> Option<usize> {
    planned
        .iter()
        .position(|p| p.manifest.kind() == kind && p.name() == name && p.namespace() == Some(namespace))
}

async fn get_value(
    cluster: &Cluster,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>> {
    let Some(resolved) = cluster.resolve(api_version, kind).await else {
        return Ok(None);
    };
    let api: Api<DynamicObject> = cluster.api(&resolved, Some(namespace));
    let object = api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading {kind} {namespace}/{name}")))?;
    Ok(object.map(|o| {
        let mut value = serde_json::to_value(o).unwrap_or(Value::Null);
        value["apiVersion"] = json!(api_version);
        value["kind"] = json!(kind);
        value
    }))
}

/// Plans every Rollout of an app and overlays the app's desired objects.
/// Problems (a Rollout naming a workload the app does not hold) keep the
/// app from being applied, like any invalid manifest.
pub(crate) async fn prepare(
    cluster: &Cluster,
    planned: &mut [Planned<'_>],
    commit: &str,
    options: &SyncOptions,
    measure: bool,
) -> Result<(Vec<RolloutWork>, Vec<Problem>)> {
    let mut work = Vec::new();
    let mut problems = Vec::new();
    let rollouts: Vec<usize> = (0..planned.len()).filter(|&i| is_rollout(&planned[i])).collect();
    for index in rollouts {
        match prepare_one(cluster, planned, index, commit, options, measure).await? {
            Ok(item) => work.push(item),
            Err(problem) => problems.push(problem),
        }
    }
    Ok((work, problems))
}

async fn prepare_one(
    cluster: &Cluster,
    planned: &mut [Planned<'_>],
    index: usize,
    commit: &str,
    options: &SyncOptions,
    measure: bool,
) -> Result<std::result::Result<RolloutWork, Problem>> {
    let instance = options.instance.as_str();
    let manifest = planned[index].manifest;
    let spec: RolloutSpec = match serde_json::from_value(manifest.object["spec"].clone()) {
        Ok(spec) => spec,
        Err(e) => return Ok(Err(manifest.problem(format!("invalid Rollout spec: {e}")))),
    };
    let namespace = planned[index].namespace().unwrap_or("default").to_string();
    let name = manifest.name().to_string();
    let target = &spec.workload_ref;
    let Some(kind) = WorkloadKind::parse(&target.kind) else {
        return Ok(Err(manifest.problem(format!(
            "workloadRef.kind {:?} is not supported: use Deployment or StatefulSet",
            target.kind
        ))));
    };
    let Some(workload_index) = find(planned, &target.kind, &namespace, &target.name) else {
        return Ok(Err(manifest.problem(format!(
            "workloadRef names {} {namespace}/{}, which this app does not hold",
            target.kind, target.name
        ))));
    };

    let rollouts: Api<Rollout> = Api::namespaced(cluster.client.clone(), &namespace);
    let live_rollout = rollouts
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading Rollout {namespace}/{name}")))?;
    let previous = live_rollout.as_ref().and_then(|r| r.status.clone());
    let annotation = |key: &str| {
        live_rollout
            .as_ref()
            .and_then(|r| r.metadata.annotations.as_ref()?.get(key).cloned())
    };

    let git_workload = planned[workload_index].desired.clone();
    let git_template = manifest_template(planned[workload_index].manifest);
    let git_hash = canonical_hash(&git_template);
    let live = get_value(cluster, &target.api_version, &target.kind, &namespace, &target.name).await?;
    let status = previous.clone().unwrap_or_default();
    let replicas = git_workload["spec"]["replicas"].as_i64().unwrap_or(1) as i32;

    let mut observed = Observed {
        commit: commit.to_string(),
        git_template_hash: git_hash.clone(),
        workload_exists: live.is_some(),
        workload_stable_hash: live.as_ref().and_then(|l| {
            l["metadata"]["annotations"][STABLE_HASH_ANNOTATION]
                .as_str()
                .map(str::to_string)
        }),
        git_matches_live: live
            .as_ref()
            .is_some_and(|l| is_subset(&git_template, &l["spec"]["template"])),
        replicas,
        promote_signal: annotation(PROMOTE_ANNOTATION),
        abort_signal: annotation(ABORT_ANNOTATION),
        now: Timestamp::now(),
        ..Observed::default()
    };

    // The canary Service check, before any canary pod exists.
    let rollout_id = if status.rollout_id.is_empty() {
        spec.rollout_id.clone().unwrap_or_default()
    } else {
        status.rollout_id.clone()
    };
    let pod_labels = overlay::canary_pod_labels(&spec, &git_workload, &rollout_id);
    for routing in &spec.strategy.canary.traffic_routings {
        match find(planned, "Service", &namespace, &routing.service) {
            Some(i) => {
                if let Some(problem) = overlay::selector_problem(&spec, &planned[i].desired, &pod_labels) {
                    observed.selector_problem = Some(problem);
                }
            }
            None => {
                return Ok(Err(manifest.problem(format!(
                    "trafficRoutings names Service {namespace}/{}, which this app does not hold",
                    routing.service
                ))));
            }
        }
    }

    let canary_live = observe_canary_objects(cluster, kind, &spec, &namespace, &target.name).await?;
    let (revisions, stable_template) = match kind {
        WorkloadKind::Deployment => {
            let canary = canary_live.get(&("Deployment", canary_name(&target.name)));
            observe_deployment(
                cluster,
                &mut observed,
                &status,
                live.as_ref(),
                canary,
                &git_template,
                &namespace,
            )
            .await?
        }
        WorkloadKind::StatefulSet => {
            observe_statefulset(cluster, &mut observed, live.as_ref(), &git_template, &namespace).await?
        }
    };

    if measure {
        let routing = spec.strategy.canary.traffic_routings.first();
        let bindings = analysis::Bindings {
            namespace: namespace.clone(),
            canary_service: routing.map(|r| format!("{}-canary", r.service)).unwrap_or_default(),
            stable_service: routing.map(|r| r.service.clone()).unwrap_or_default(),
            canary_revision: revisions.canary.clone(),
            stable_revision: revisions.stable.clone(),
            rollout_id: status.rollout_id.clone(),
        };
        for (run, template) in analysis::due_runs(&spec, &status, observed.now) {
            let measurement =
                super::prometheus::measure(&run, template, options.prometheus_url.as_deref(), &bindings).await;
            info!(namespace = %namespace, rollout = %name, rollout_id = %status.rollout_id, run = %run, outcome = ?measurement.outcome, "analysis: {}", measurement.message);
            observed.measurements.push(measurement);
        }
    }
    let mut plan = plan::plan(&spec, &status, &observed);
    plan.status.stable_revision = if plan.status.stable_revision.is_empty() || plan.status.phase != Phase::Healthy {
        revisions.stable.clone()
    } else {
        plan.status.stable_revision.clone()
    };
    plan.status.canary_revision = if plan.intent.canary_replicas.is_some() {
        revisions.canary.clone()
    } else {
        String::new()
    };
    let intent = plan.intent.clone();

    // Overlays on Git's objects.
    let stable = overlay::stable_workload(
        kind,
        &git_workload,
        stable_template.as_ref(),
        &intent,
        &plan.status.stable_template_hash,
    );
    set_desired(&mut planned[workload_index], stable);
    let mut wanted = Vec::new();
    let mut unwanted = Vec::new();
    let disabled = spec.strategy.canary.canary_service.as_ref().is_some_and(|c| c.disabled);
    if let (WorkloadKind::Deployment, Some(replicas)) = (kind, intent.canary_replicas) {
        let canary_hash = plan.status.canary_template_hash.clone();
        wanted.push(overlay::canary_deployment(
            &spec,
            &git_workload,
            replicas,
            &intent.rollout_id,
            &canary_hash,
        ));
    } else if kind == WorkloadKind::Deployment && intent.canary_replicas.is_none() {
        unwanted.push(("apps/v1", "Deployment", canary_name(&target.name)));
    }
    for routing in &spec.strategy.canary.traffic_routings {
        let Some(service_index) = find(planned, "Service", &namespace, &routing.service) else {
            continue;
        };
        let canary_ready_to_route = intent.canary_replicas.is_some() && !revisions.canary.is_empty() && !disabled;
        if canary_ready_to_route {
            wanted.push(overlay::canary_service(
                &spec,
                &planned[service_index].desired,
                kind,
                &revisions.canary,
            ));
        } else if intent.canary_replicas.is_none() {
            unwanted.push(("v1", "Service", canary_name(&routing.service)));
        }
        if intent.pin_stable_service && !revisions.stable.is_empty() && canary_ready_to_route {
            let pinned = overlay::pinned_stable_service(&planned[service_index].desired, kind, &revisions.stable);
            set_desired(&mut planned[service_index], pinned);
        }
        let traffic = intent.traffic.filter(|_| canary_ready_to_route);
        if let Some(gateway) = &routing.gateway {
            match find(planned, "HTTPRoute", &namespace, &gateway.http_route_name) {
                Some(route_index) => {
                    if let Some(traffic) = traffic {
                        let weighted =
                            overlay::weighted_route(&planned[route_index].desired, &routing.service, traffic);
                        set_desired(&mut planned[route_index], weighted);
                    }
                }
                None => {
                    return Ok(Err(manifest.problem(format!(
                        "trafficRoutings names HTTPRoute {namespace}/{}, which this app does not hold",
                        gateway.http_route_name
                    ))));
                }
            }
        }
        if let Some(ingress) = &routing.ingress {
            let Some(ingress_index) = find(planned, "Ingress", &namespace, &ingress.name) else {
                return Ok(Err(manifest.problem(format!(
                    "trafficRoutings names Ingress {namespace}/{}, which this app does not hold",
                    ingress.name
                ))));
            };
            match traffic {
                Some(traffic) => wanted.push(overlay::canary_ingress(
                    &planned[ingress_index].desired,
                    &routing.service,
                    traffic,
                )),
                None => unwanted.push(("networking.k8s.io/v1", "Ingress", canary_name(&ingress.name))),
            }
        }
    }
    for object in &mut wanted {
        mark_managed(object, instance, &manifest.location());
    }
    let (canary_writes, canary_deletions) =
        match canary_changes(cluster, wanted, unwanted, &canary_live, &namespace, instance).await {
            Ok(changes) => changes,
            Err(problem) => return Ok(Err(manifest.problem(problem))),
        };
    let images = git_workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["image"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let last_command_comment = annotation(LAST_COMMENT_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(Ok(RolloutWork {
        namespace,
        name,
        app: manifest.app.clone(),
        images,
        spec: spec.clone(),
        last_command_comment,
        kind,
        workload: target.name.clone(),
        plan,
        source: manifest.location(),
        canary_writes,
        canary_deletions,
        previous,
        revisions,
    }))
}

/// The canary objects a release of this rollout may make, as the cluster has them.
async fn observe_canary_objects(
    cluster: &Cluster,
    kind: WorkloadKind,
    spec: &RolloutSpec,
    namespace: &str,
    workload: &str,
) -> Result<BTreeMap<(&'static str, String), Value>> {
    let mut names: Vec<(&'static str, &'static str, String)> = Vec::new();
    if kind == WorkloadKind::Deployment {
        names.push(("apps/v1", "Deployment", canary_name(workload)));
    }
    for routing in &spec.strategy.canary.traffic_routings {
        names.push(("v1", "Service", canary_name(&routing.service)));
        if let Some(ingress) = &routing.ingress {
            names.push(("networking.k8s.io/v1", "Ingress", canary_name(&ingress.name)));
        }
    }
    let mut live = BTreeMap::new();
    for (api_version, kind, name) in names {
        if let Some(object) = get_value(cluster, api_version, kind, namespace, &name).await? {
            live.insert((kind, name), object);
        }
    }
    Ok(live)
}

/// Which canary objects to write (those that differ from the cluster) and
/// which to delete (only this instance's, only the object observed).
async fn canary_changes(
    cluster: &Cluster,
    wanted: Vec<Value>,
    unwanted: Vec<(&'static str, &'static str, String)>,
    live: &BTreeMap<(&'static str, String), Value>,
    namespace: &str,
    instance: &str,
) -> std::result::Result<(Vec<CanaryWrite>, Vec<Deletion>), String> {
    let key = |api_version: &str, kind: &str, name: &str| ObjectKey {
        group: api_version
            .rsplit_once('/')
            .map(|(g, _)| g.to_string())
            .unwrap_or_default(),
        kind: kind.to_string(),
        namespace: Some(namespace.to_string()),
        name: name.to_string(),
    };
    let ours = |object: &Value| LiveMeta::of(object).filter(|m| m.managed_by.as_deref() == Some(instance));
    let mut writes = Vec::new();
    for object in wanted {
        let api_version = object["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let current = live
            .iter()
            .find(|((k, n), _)| *k == kind && *n == name)
            .map(|(_, v)| v.clone());
        if current.as_ref().is_some_and(|current| is_subset(&object, current)) {
            continue;
        }
        let Some(resolved) = cluster.resolve(&api_version, &kind).await else {
            return Err(format!(
                "{kind} in {api_version} is not served: the canary {kind} {namespace}/{name} cannot be made"
            ));
        };
        writes.push(CanaryWrite {
            key: key(&api_version, &kind, &name),
            resolved,
            ours: current.as_ref().and_then(ours).is_some(),
            live: current,
            object,
        });
    }
    let mut deletions = Vec::new();
    for (api_version, kind, name) in unwanted {
        let Some(meta) = live.get(&(kind, name.clone())).and_then(ours) else {
            continue;
        };
        // The uid only: the canary's controller updates its status meanwhile.
        deletions.push(Deletion {
            resource_version: None,
            ..Deletion::of(api_version, key(api_version, kind, &name), &meta)
        });
    }
    Ok((writes, deletions))
}

/// The pod template exactly as Git has it (before gitcanary's own metadata).
fn manifest_template(manifest: &crate::manifest::Manifest) -> Value {
    manifest.object["spec"]["template"].clone()
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

fn int(value: &Value) -> i64 {
    value.as_i64().unwrap_or(0)
}

/// Ready pods of the current template: counted only once the controller
/// has seen the latest spec.
fn ready_of_current(workload: &Value, ready_field: &str) -> i32 {
    let status = &workload["status"];
    if int(&status["observedGeneration"]) < int(&workload["metadata"]["generation"]) {
        return 0;
    }
    int(&status["updatedReplicas"]).min(int(&status[ready_field])) as i32
}

fn rolled_out(workload: &Value, git_template: &Value, ready_field: &str) -> bool {
    let want = workload["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &workload["status"];
    is_subset(git_template, &workload["spec"]["template"])
        && int(&status["observedGeneration"]) >= int(&workload["metadata"]["generation"])
        && int(&status["updatedReplicas"]) == want
        && int(&status[ready_field]) == want
        && int(&status["replicas"]) == want
}

async fn observe_deployment(
    cluster: &Cluster,
    observed: &mut Observed,
    status: &RolloutStatus,
    live: Option<&Value>,
    canary: Option<&Value>,
    git_template: &Value,
    namespace: &str,
) -> Result<(Revisions, Option<Value>)> {
    let canary_hash = if status.canary_template_hash.is_empty() {
        &observed.git_template_hash
    } else {
        &status.canary_template_hash
    };
    if let Some(canary) = canary
        && canary["metadata"]["annotations"][CANARY_HASH_ANNOTATION].as_str() == Some(canary_hash.as_str())
    {
        observed.canary_ready = ready_of_current(canary, "availableReplicas");
    }
    observed.stable_rolled_out = live.is_some_and(|l| rolled_out(l, git_template, "availableReplicas"));
    let replica_sets: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), namespace);
    let sets = replica_sets
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing ReplicaSets in {namespace}")))?;
    let current_hash = |owner: Option<&Value>| -> String {
        let Some(owner) = owner else { return String::new() };
        let uid = owner["metadata"]["uid"].as_str().unwrap_or_default();
        let revision = owner["metadata"]["annotations"]["deployment.kubernetes.io/revision"].as_str();
        sets.items
            .iter()
            .filter(|rs| rs.metadata.owner_references.iter().flatten().any(|o| o.uid == uid))
            .find(|rs| {
                rs.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("deployment.kubernetes.io/revision"))
                    .map(String::as_str)
                    == revision
            })
            .and_then(|rs| rs.metadata.labels.as_ref()?.get("pod-template-hash").cloned())
            .unwrap_or_default()
    };
    let revisions = Revisions {
        stable: current_hash(live),
        canary: current_hash(canary),
    };
    Ok((revisions, live.map(|l| l["spec"]["template"].clone())))
}

async fn observe_statefulset(
    cluster: &Cluster,
    observed: &mut Observed,
    live: Option<&Value>,
    git_template: &Value,
    namespace: &str,
) -> Result<(Revisions, Option<Value>)> {
    let Some(live) = live else {
        return Ok((Revisions::default(), None));
    };
    let status = &live["status"];
    let current = status["currentRevision"].as_str().unwrap_or_default().to_string();
    let update = status["updateRevision"].as_str().unwrap_or_default().to_string();
    observed.stable_rolled_out = rolled_out(live, git_template, "readyReplicas") && current == update;
    // Once the controller has seen Git's template, its update revision is the canary.
    let seen_latest = int(&status["observedGeneration"]) >= int(&live["metadata"]["generation"]);
    let canary_revision = if seen_latest && is_subset(git_template, &live["spec"]["template"]) {
        update.clone()
    } else {
        String::new()
    };
    if !canary_revision.is_empty() {
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
        let list = pods
            .list(&ListParams::default().labels(&format!("controller-revision-hash={canary_revision}")))
            .await
            .map_err(Error::kube(format!("listing pods in {namespace}")))?;
        observed.canary_ready = list.items.iter().filter(|p| pod_ready(p)).count() as i32;
    }
    // The stable template lives in the ControllerRevision of the current revision.
    let revisions: Api<ControllerRevision> = Api::namespaced(cluster.client.clone(), namespace);
    let stable_template = match revisions.get_opt(&current).await {
        Ok(Some(revision)) => revision.data.map(|d| {
            let mut template = d.0["spec"]["template"].clone();
            if let Some(map) = template.as_object_mut() {
                map.remove("$patch");
            }
            template
        }),
        _ => None,
    };
    let revisions = Revisions {
        stable: current,
        canary: canary_revision,
    };
    Ok((
        revisions,
        stable_template.or_else(|| Some(live["spec"]["template"].clone())),
    ))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// After the app is applied (and the canary objects no longer wanted are
/// deleted): batch labels, status, Events.
pub async fn finish(cluster: &Cluster, work: &RolloutWork) -> Result<()> {
    let intent = &work.plan.intent;
    // Pods of the last batch may become ready in the same moment as the promotion.
    let step = work
        .plan
        .status
        .canary_status
        .as_ref()
        .map_or(0, |c| c.current_step_index);
    if (intent.canary_replicas.is_some() || work.plan.promoted) && step > 0 {
        label_batch(cluster, work, step, &work.plan.status.rollout_id).await?;
    }
    write_status(cluster, work).await?;
    for transition in &work.plan.transitions {
        info!(namespace = %work.namespace, rollout = %work.name, rollout_id = %work.plan.status.rollout_id, "{transition}");
    }
    if !work.plan.transitions.is_empty() {
        record_events(cluster, work).await;
    }
    if let Some(cause) = &work.plan.failed {
        warn!(namespace = %work.namespace, rollout = %work.name, rollout_id = %work.plan.status.rollout_id, %cause, "release failed: traffic back on stable, canary removed");
    }
    Ok(())
}

/// Kubernetes Events on the Rollout, one per transition, so that
/// `kubectl describe rollout` tells the story. Best effort: a lost Event
/// never holds a release back.
async fn record_events(cluster: &Cluster, work: &RolloutWork) {
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let rollouts: Api<Rollout> = Api::namespaced(cluster.client.clone(), &work.namespace);
    let Ok(rollout) = rollouts.get(&work.name).await else {
        return;
    };
    let reference = rollout.object_ref(&());
    let recorder = Recorder::new(
        cluster.client.clone(),
        Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: std::env::var("HOSTNAME").ok(),
        },
    );
    for transition in &work.plan.transitions {
        let (type_, reason) = if transition.contains("failed") || transition.contains("refused") {
            (EventType::Warning, "ReleaseFailed")
        } else if transition.starts_with("release") && transition.contains("promoted") {
            (EventType::Normal, "Promoted")
        } else if transition.contains("promoted") {
            (EventType::Normal, "GatePassed")
        } else if transition.contains("started") {
            (EventType::Normal, "ReleaseStarted")
        } else {
            (EventType::Normal, "StepChanged")
        };
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(transition.chars().take(1000).collect()),
            action: "Reconcile".to_string(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &reference).await {
            warn!(%error, "cannot record an Event on the Rollout");
        }
    }
}

/// Canary pods carry the release's id and the step that created them.
async fn label_batch(cluster: &Cluster, work: &RolloutWork, step: u32, rollout_id: &str) -> Result<()> {
    if work.revisions.canary.is_empty() {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &work.namespace);
    let selector = format!("{}={}", work.kind.revision_label(), work.revisions.canary);
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube(format!("listing canary pods in {}", work.namespace)))?;
    for pod in list.items {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        if labels.contains_key(BATCH_ID_LABEL) {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let patch = json!({"metadata": {"labels": {
            BATCH_ID_LABEL: step.to_string(),
            ROLLOUT_ID_LABEL: rollout_id,
        }}});
        match pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("labelling pod {}/{name}", work.namespace))(e)),
        }
    }
    Ok(())
}

async fn write_status(cluster: &Cluster, work: &RolloutWork) -> Result<()> {
    let mut status = work.plan.status.clone();
    if let (Some(previous), Some(canary)) = (&work.previous, status.canary_status.as_mut()) {
        // Only a real change moves lastUpdateTime.
        let mut same = work.plan.status.clone();
        if let (Some(prev_canary), Some(same_canary)) = (&previous.canary_status, same.canary_status.as_mut()) {
            same_canary.last_update_time = prev_canary.last_update_time.clone();
        }
        if same == *previous {
            return Ok(());
        }
        if canary.last_update_time.is_empty() {
            canary.last_update_time = Timestamp::now().to_string();
        }
    }
    apply_status(cluster, &work.namespace, &work.name, &status).await
}
