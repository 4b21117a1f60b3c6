//! What one Rollout's reconcile reads of the cluster: the Rollout's status
//! and signals, the workload, its ReplicaSets or ControllerRevisions and pods,
//! the canary objects, and the analysis measurements due. Reads only; the
//! planner and `desired` decide.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;
use tracing::{Instrument, info, info_span};

use super::analysis;
use super::api::StepState;
use super::api::is_rollout;
use super::api::{ABORT_ANNOTATION, LAST_COMMENT_ANNOTATION, PROMOTE_ANNOTATION};
use super::api::{Rollout, RolloutSpec, RolloutStatus};
use super::knative;
use super::model::find_in;
use super::model::{RolloutObserved, RolloutsObserved, Target, WrittenBacks};
use super::overlay::{CANARY_HASH_ANNOTATION, STABLE_HASH_ANNOTATION, WorkloadKind};
use super::plan::{GatewaySeen, Observed, Resumed, Revisions, RouteSeen, route_seen, supported_features};
use super::reads::{get_any, get_rollout, get_value};
use super::record::{History, Outcome as RecordOutcome};
use crate::cluster::Cluster;
use crate::manifest::Problem;
use crate::model::{Resolved, SyncOptions};
use crate::plan::Planned;
use crate::plan::WorkloadProgress;
use crate::plan::desired::{canonical_hash, is_stored_as};
use crate::{Error, Result};
use std::sync::Arc;

/// The kinds a release may make a canary of.
const CANARY_KINDS: [(&str, &str); 4] = [
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("networking.k8s.io/v1", "Ingress"),
    ("batch/v1", "Job"),
];

/// Observes every Rollout of an app, all at once: nothing of them is
/// planned until all are read (see `desired::plan_rollouts`). A write-back
/// already done is handed to its Rollout's planner.
pub(crate) async fn observe_rollouts(
    cluster: &Cluster,
    planned: &[Planned<'_>],
    commit: &str,
    history: Option<&Arc<dyn History>>,
    written: &WrittenBacks,
    options: &SyncOptions,
    measure: bool,
) -> Result<RolloutsObserved> {
    let targets = (0..planned.len())
        .filter(|&i| is_rollout(planned[i].manifest))
        .map(|index| Target::find(planned, index));
    let reads = targets.map(async |target| -> Result<Result<(Target, RolloutObserved), Problem>> {
        let target = match target {
            Ok(target) => target,
            Err(problem) => return Ok(Err(problem)),
        };
        let span = info_span!("rollout", namespace = %target.namespace, rollout = %target.name);
        let mut observed = observe_rollout(cluster, planned, &target, commit, history, options, measure)
            .instrument(span)
            .await?;
        let key = (target.namespace.clone(), target.name.clone());
        observed.planner.written_back = written.get(&key).cloned();
        Ok(Ok((target, observed)))
    });
    // Every read runs to its end, even when another fails: a hook call
    // already sent is not dropped half way.
    let found = futures::future::join_all(reads).await;
    Ok(RolloutsObserved(found.into_iter().collect::<Result<_>>()?))
}

pub(crate) async fn observe_rollout(
    cluster: &Cluster,
    planned: &[Planned<'_>],
    target: &Target,
    commit: &str,
    history: Option<&Arc<dyn History>>,
    options: &SyncOptions,
    measure: bool,
) -> Result<RolloutObserved> {
    let (namespace, name, spec) = (&target.namespace, &target.name, &target.spec);
    let workload_ref = &spec.workload_ref;
    // Independent reads, sent together: an abort waits on all of them.
    let (live_rollout, live, canary_live) = futures::join!(
        get_rollout(cluster, namespace, name),
        get_value(
            cluster,
            options,
            &workload_ref.api_version,
            &workload_ref.kind,
            namespace,
            &workload_ref.name,
        ),
        observe_canary_objects(cluster, options, spec, namespace),
    );
    let live_rollout = live_rollout?;
    let (live, canary_live) = (live?, canary_live?);
    let previous = live_rollout.as_ref().and_then(|r| r.status.clone());
    let annotation = |key: &str| {
        live_rollout
            .as_ref()
            .and_then(|r| r.metadata.annotations.as_ref()?.get(key).cloned())
    };

    let workload = planned[target.workload].manifest;
    let git_template = workload.object["spec"]["template"].clone();
    let status = previous.clone().unwrap_or_default();
    let mut observed = first_look(&git_template, live.as_ref(), live_rollout.as_ref(), commit);

    let default_namespace = &options.allowed.default_namespace;
    let (record_problem, recorded_template) =
        match resume_from_git(history, previous.as_ref(), target, workload, default_namespace).await? {
            Ok(None) => (None, None),
            Ok(Some((resumed, template))) => {
                observed.resumed = Some(resumed);
                (None, Some(template))
            }
            Err(problem) => (Some(problem), None),
        };

    let (revisions, stable_template, knative_settled) = observe_workload(
        cluster,
        &mut observed,
        &status,
        live.as_ref(),
        &canary_live,
        &git_template,
        target,
        &workload.object,
    )
    .await?;
    // A rebuilt cluster lacks the workload: its stable is what Git promoted.
    let stable_template = recorded_template.filter(|_| live.is_none()).or(stable_template);
    observed.stable_revision = revisions.stable.clone();
    observed.canary_revision = revisions.canary.clone();
    // Only while a canary Deployment may be about to make its first pods.
    if target.kind == WorkloadKind::Deployment && revisions.canary.is_empty() && !observed.git_matches_live {
        observed.stable_services_pinned =
            stable_services_pinned(cluster, options, spec, namespace, &revisions.stable).await?;
    }
    if measure {
        observed.measurements = measure_due(target, &status, &revisions, &canary_live, observed.now, options).await;
    }
    if routes_needed(spec, &status, &canary_live) {
        observed.routes = Some(observe_routes(cluster, options, spec, namespace).await);
    }
    let canary_kinds = served_canary_kinds(cluster).await;
    let gateways = if spec.strategy.canary.steps.iter().any(|s| s.mirror.is_some()) {
        observe_gateways(cluster, options, planned, spec, namespace).await
    } else {
        Vec::new()
    };
    Ok(RolloutObserved {
        planner: observed,
        previous,
        rollout_uid: live_rollout.as_ref().and_then(|r| r.metadata.uid.clone()),
        last_command_comment: annotation(LAST_COMMENT_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        revisions,
        stable_template,
        knative_settled,
        canary_live,
        canary_kinds,
        gateways,
        record_problem,
    })
}

/// What the Rollout and its workload say before the workload's own
/// revisions are read: Git's template against the live one, and the
/// signals on the Rollout. (The replicas are the planner's to read.)
fn first_look(git_template: &Value, live: Option<&Value>, live_rollout: Option<&Rollout>, commit: &str) -> Observed {
    let annotation = |key: &str| live_rollout.and_then(|r| r.metadata.annotations.as_ref()?.get(key).cloned());
    Observed {
        commit: commit.to_string(),
        git_template_hash: canonical_hash(git_template),
        workload_exists: live.is_some(),
        workload_stable_hash: live.and_then(|l| {
            l["metadata"]["annotations"][STABLE_HASH_ANNOTATION]
                .as_str()
                .map(str::to_string)
        }),
        git_matches_live: live.is_some_and(|l| is_stored_as(git_template, &l["spec"]["template"])),
        promote_signal: annotation(PROMOTE_ANNOTATION),
        abort_signal: annotation(ABORT_ANNOTATION),
        rollout_uid: live_rollout.and_then(|r| r.metadata.uid.clone()).unwrap_or_default(),
        now: Timestamp::now(),
        ..Observed::default()
    }
}

/// The workload's revisions (stable and canary), the template its stable
/// pods run, and for a Knative Service whether Git's traffic may take over.
#[allow(clippy::too_many_arguments)]
async fn observe_workload(
    cluster: &Cluster,
    observed: &mut Observed,
    status: &RolloutStatus,
    live: Option<&Value>,
    canary_live: &BTreeMap<(&'static str, String), Value>,
    git_template: &Value,
    target: &Target,
    git_object: &Value,
) -> Result<(Revisions, Option<Value>, bool)> {
    let (namespace, spec) = (&target.namespace, &target.spec);
    let workload_name = &spec.workload_ref.name;
    Ok(match target.kind {
        WorkloadKind::Deployment => {
            let canary = canary_live.get(&("Deployment", spec.strategy.canary.canary_name(workload_name)));
            let (revisions, stable) =
                observe_deployment(cluster, observed, status, live, canary, git_template, namespace).await?;
            (revisions, stable, false)
        }
        WorkloadKind::StatefulSet => {
            let (revisions, stable) = observe_statefulset(cluster, observed, live, git_template, namespace).await?;
            (revisions, stable, false)
        }
        WorkloadKind::KnativeService => {
            let seen = observe_knative(cluster, observed, status, live, git_object, target).await?;
            (seen.revisions, None, seen.settled)
        }
    })
}

/// A Knative Service's Revisions: which is stable, which is the canary and
/// whether it is Ready, and the traffic its status reads back.
async fn observe_knative(
    cluster: &Cluster,
    observed: &mut Observed,
    status: &RolloutStatus,
    live: Option<&Value>,
    git_service: &Value,
    target: &Target,
) -> Result<knative::Seen> {
    let (namespace, name) = (&target.namespace, &target.spec.workload_ref.name);
    let kept = cluster.knative_revisions.read(namespace, |held| {
        let of_service = held
            .values()
            .filter(|r| r["metadata"]["labels"][knative::SERVICE_LABEL].as_str() == Some(name.as_str()));
        of_service.cloned().collect::<Vec<_>>()
    });
    let revisions = match kept {
        Some(kept) if knative::revisions_agree(live, &kept, &status.stable_revision) => kept,
        _ => list_knative_revisions(cluster, namespace, name).await?,
    };
    let seen = knative::look(observed, status, live, &revisions, git_service, namespace, name);
    Ok(seen)
}

async fn list_knative_revisions(cluster: &Cluster, namespace: &str, name: &str) -> Result<Vec<Value>> {
    let Some(resolved) = cluster.resolve(knative::API_VERSION, "Revision").await else {
        return Ok(Vec::new());
    };
    let api: Api<DynamicObject> = cluster.api(&resolved, Some(namespace));
    let selector = format!("{}={name}", knative::SERVICE_LABEL);
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube(format!(
            "listing the Revisions of Knative Service {namespace}/{name}"
        )))?;
    Ok(list
        .items
        .into_iter()
        .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
        .collect())
}

async fn served_canary_kinds(cluster: &Cluster) -> BTreeMap<&'static str, Resolved> {
    let mut canary_kinds = BTreeMap::new();
    for (api_version, kind) in CANARY_KINDS {
        if let Some(resolved) = cluster.resolve(api_version, kind).await {
            canary_kinds.insert(kind, resolved);
        }
    }
    canary_kinds
}

/// For a Rollout with no status, its status file at the synced head: what
/// Git says is stable and the template that commit held, or why it cannot be
/// used. `Ok(Ok(None))` when the Rollout has a status, or there is no file.
async fn resume_from_git(
    history: Option<&Arc<dyn History>>,
    previous: Option<&RolloutStatus>,
    target: &Target,
    workload: &crate::manifest::Manifest,
    default_namespace: &str,
) -> Result<std::result::Result<Option<(Resumed, Value)>, String>> {
    let has_status = previous.is_some_and(|s| !s.stable_template_hash.is_empty());
    let Some(history) = history.filter(|_| !has_status).cloned() else {
        return Ok(Ok(None));
    };
    let (namespace, name) = (target.namespace.clone(), target.name.clone());
    let (app, mut key) = (workload.app.clone(), workload.key());
    key.namespace.get_or_insert_with(|| namespace.clone());
    let default_namespace = default_namespace.to_string();
    crate::blocking("reading the status file", move || {
        let Some(record) = history.record(&namespace, &name)? else {
            return Ok(None);
        };
        let file = history.record_path(&namespace, &name);
        let template_at = |commit: &str| -> std::result::Result<Value, String> {
            let object = history
                .object_at(commit, &app, &key, &default_namespace)?
                .ok_or_else(|| {
                    format!(
                        "{file} names commit {}, whose app {app} holds no {key}",
                        crate::short_commit(commit)
                    )
                })?;
            Ok(object["spec"]["template"].clone())
        };
        let stable_template = template_at(&record.stable_commit)?;
        let failed_template_hash = match record.outcome {
            RecordOutcome::Failed => canonical_hash(&template_at(&record.failed_commit)?),
            RecordOutcome::Promoted => String::new(),
        };
        info!(file = %file, stable = %record.stable_commit, "a Rollout with no status resumes from Git");
        let resumed = Resumed {
            from: file,
            stable_commit: record.stable_commit.clone(),
            stable_template_hash: canonical_hash(&stable_template),
            failed_commit: record.failed_commit.clone(),
            failed_template_hash,
            cause: record.cause.clone(),
        };
        Ok(Some((resumed, stable_template)))
    })
    .await
}

/// The analysis runs due now, measured against Prometheus or the web,
/// and the hook calls due, each a measurement of its run.
async fn measure_due(
    target: &Target,
    status: &RolloutStatus,
    revisions: &Revisions,
    canary_live: &BTreeMap<(&'static str, String), Value>,
    now: Timestamp,
    options: &SyncOptions,
) -> Vec<analysis::Measurement> {
    let (spec, namespace) = (&target.spec, target.namespace.as_str());
    let bindings = analysis::Bindings::of_release(
        namespace,
        spec,
        &status.rollout_id,
        &revisions.canary,
        &revisions.stable,
    );
    let servers = super::prometheus::Servers {
        default: options.prometheus_url.clone(),
        named: options.prometheus.clone(),
        web: options.web_checks.clone(),
    };
    let mut measurements = Vec::new();
    for (run, template) in analysis::due_runs(spec, status, now) {
        if super::jobs::job_of(template).is_some() {
            measurements.extend(super::jobs::measurement(spec, status, (&run, template), canary_live));
            continue;
        }
        let mut measurement = super::prometheus::measure(&run, template, &servers, &bindings).await;
        measurement.release = analysis::release(status);
        info!(rollout_id = %status.rollout_id, run = %run, outcome = ?measurement.outcome, "analysis: {}", measurement.message);
        measurements.push(measurement);
    }
    use super::web::HookAnswer;
    for (point, hook) in super::hooks::due(spec, status, now) {
        let (outcome, message) = match options.hooks.get(&hook.name) {
            None => (
                analysis::Outcome::Inconclusive,
                format!(
                    "the agent has no hook named {:?} (start it with --hook {}=URL)",
                    hook.name, hook.name
                ),
            ),
            Some(endpoint) => match analysis::render(&hook.path, &bindings) {
                Err(e) => (analysis::Outcome::Inconclusive, format!("hook {}: {e}", hook.name)),
                Ok(path) => {
                    let body = super::hooks::body(point, &target.name, &status.canary_commit, &bindings, None);
                    match super::web::call_hook(&hook.name, endpoint, &path, &body).await {
                        HookAnswer::Passed(line) => (analysis::Outcome::Successful, line),
                        HookAnswer::Refused(line) => (analysis::Outcome::Failed, line),
                        HookAnswer::Unanswered(line) => (analysis::Outcome::Inconclusive, line),
                    }
                }
            },
        };
        info!(rollout_id = %status.rollout_id, hook = point.name(), outcome = ?outcome, "hook: {message}");
        measurements.push(analysis::Measurement {
            release: analysis::release(status),
            run: point.run(),
            template: hook.name.clone(),
            outcome,
            message,
        });
    }
    measurements
}

/// Whether the release's routes are read: while a step's route must be in
/// force, and while a canary Service is live (a release ending deletes it
/// only once no route sends to it).
fn routes_needed(
    spec: &RolloutSpec,
    status: &RolloutStatus,
    canary_live: &BTreeMap<(&'static str, String), Value>,
) -> bool {
    let routing = status
        .canary_status
        .as_ref()
        .is_some_and(|c| c.current_step_state == StepState::StepTrafficRouting);
    let canary = &spec.strategy.canary;
    routing
        || canary
            .gateway_routes()
            .any(|(service, _)| canary_live.contains_key(&("Service", canary.canary_name(service))))
}

/// Whether every live stable Service of the release's routings selects
/// the stable revision alone.
async fn stable_services_pinned(
    cluster: &Cluster,
    options: &SyncOptions,
    spec: &RolloutSpec,
    namespace: &str,
    stable: &str,
) -> Result<bool> {
    let routings = &spec.strategy.canary.traffic_routings;
    let reads = routings
        .iter()
        .map(|r| get_value(cluster, options, "v1", "Service", namespace, &r.service));
    let mut pinned = true;
    for live in futures::future::join_all(reads).await {
        pinned &= live?.is_some_and(|service| super::overlay::is_pinned(&service, WorkloadKind::Deployment, stable));
    }
    Ok(pinned)
}

/// The release's HTTPRoutes as they are live, read while a step waits for
/// its route to be in force. One that cannot be read is left out: the
/// grace period alone then decides, as for a route no gateway reports on.
async fn observe_routes(
    cluster: &Cluster,
    options: &SyncOptions,
    spec: &RolloutSpec,
    namespace: &str,
) -> Vec<RouteSeen> {
    let mut routes = Vec::new();
    for (service, route_name) in spec.strategy.canary.gateway_routes() {
        let live = get_value(
            cluster,
            options,
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            namespace,
            route_name,
        )
        .await;
        if let Ok(Some(route)) = live {
            routes.push(route_seen(&route, service, &spec.strategy.canary.canary_name(service)));
        }
    }
    routes
}

/// The Gateways Git's HTTPRoutes of the release name as parents, with what
/// their classes say they can do; read only for a release that mirrors.
async fn observe_gateways(
    cluster: &Cluster,
    options: &SyncOptions,
    planned: &[Planned<'_>],
    spec: &RolloutSpec,
    namespace: &str,
) -> Vec<GatewaySeen> {
    let mut seen = Vec::new();
    for (_, route_name) in spec.strategy.canary.gateway_routes() {
        let group = "gateway.networking.k8s.io";
        let Some(route) = find_in(planned, group, "HTTPRoute", namespace, route_name) else {
            continue;
        };
        let parents = planned[route].desired["spec"]["parentRefs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let gateways = parents
            .iter()
            .filter(|p| p["kind"].as_str().is_none_or(|k| k == "Gateway"))
            .filter(|p| p["group"].as_str().is_none_or(|g| g == group))
            .filter_map(|p| Some((p["namespace"].as_str().unwrap_or(namespace), p["name"].as_str()?)));
        for (gateway_namespace, gateway_name) in gateways {
            let gateway = get_any(
                cluster,
                options,
                GATEWAY_API,
                "Gateway",
                Some(gateway_namespace),
                gateway_name,
            )
            .await;
            let class = match &gateway {
                Ok(Some(gateway)) => gateway["spec"]["gatewayClassName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                _ => String::new(),
            };
            let features = match gateway {
                Err(e) => Err(e.to_string()),
                Ok(None) => Err("the Gateway does not exist".to_string()),
                Ok(Some(_)) => match get_any(cluster, options, GATEWAY_API, "GatewayClass", None, &class).await {
                    Err(e) => Err(e.to_string()),
                    Ok(None) => Err(format!("GatewayClass {class:?} does not exist")),
                    Ok(Some(class_object)) => supported_features(&class_object)
                        .ok_or_else(|| format!("GatewayClass {class} lists no supportedFeatures")),
                },
            };
            seen.push(GatewaySeen {
                route: route_name.to_string(),
                gateway: format!("{gateway_namespace}/{gateway_name}"),
                class,
                features,
            });
        }
    }
    seen
}

const GATEWAY_API: &str = "gateway.networking.k8s.io/v1";

/// The canary objects a release of this rollout may make, as the cluster has them.
async fn observe_canary_objects(
    cluster: &Cluster,
    options: &SyncOptions,
    spec: &RolloutSpec,
    namespace: &str,
) -> Result<BTreeMap<(&'static str, String), Value>> {
    let names = super::model::canary_object_names(spec).unwrap_or_default();
    let reads = names.into_iter().map(|(api_version, kind, name)| async move {
        let object = get_value(cluster, options, api_version, kind, namespace, &name).await?;
        Ok::<_, Error>(object.map(|object| ((kind, name), object)))
    });
    let mut live = BTreeMap::new();
    for found in futures::future::join_all(reads).await {
        live.extend(found?);
    }
    Ok(live)
}

/// The live workload runs Git's template, every wanted pod of it ready and none other left.
fn rolled_out(workload: &Value, kind: &str, git_template: &Value) -> bool {
    is_stored_as(git_template, &workload["spec"]["template"])
        && WorkloadProgress::of_kind(workload, kind).is_some_and(|progress| progress.is_complete())
}

pub(super) async fn observe_deployment(
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
        observed.canary_ready =
            WorkloadProgress::of_kind(canary, "Deployment").map_or(0, |progress| progress.ready_of_latest());
    }
    observed.stable_rolled_out = live.is_some_and(|l| rolled_out(l, "Deployment", git_template));
    let [stable, canary] = crate::cluster::replica_sets::current_hashes(cluster, namespace, [live, canary]).await?;
    Ok((
        Revisions { stable, canary },
        live.map(|l| l["spec"]["template"].clone()),
    ))
}

pub(super) async fn observe_statefulset(
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
    observed.stable_rolled_out = rolled_out(live, "StatefulSet", git_template) && current == update;
    // Once the controller has seen Git's template, its update revision is the canary.
    let progress = WorkloadProgress::of_kind(live, "StatefulSet");
    let seen_latest = progress.is_some_and(|p| p.seen_latest());
    let canary_revision = if seen_latest && is_stored_as(git_template, &live["spec"]["template"]) {
        update.clone()
    } else {
        String::new()
    };
    if !canary_revision.is_empty() {
        observed.canary_ready = match progress.and_then(|p| p.ready_of_latest_when_all_ready()) {
            Some(ready) => ready,
            None => {
                let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
                let selector = format!("{}={canary_revision}", WorkloadKind::StatefulSet.revision_label());
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(Error::kube(format!("listing pods in {namespace}")))?;
                // As the StatefulSet counts them: its own pods, not terminating.
                let uid = live["metadata"]["uid"].as_str().unwrap_or_default();
                let owned = |pod: &&Pod| {
                    pod.metadata.deletion_timestamp.is_none()
                        && pod.metadata.owner_references.iter().flatten().any(|o| o.uid == uid)
                };
                let counted = list.items.iter().filter(owned);
                counted.filter(|p| crate::cluster::pods::is_ready(p)).count() as i32
            }
        };
    }
    // The stable template lives in the ControllerRevision of the current revision.
    let stable_template = if current.is_empty() {
        None
    } else {
        cluster.revision_template(namespace, &current).await
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
