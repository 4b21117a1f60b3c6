//! Builders of the planner's inputs, for tests: Git's manifests, a Rollout
//! (`Rollout::test()`), and a cluster that observes the app and applies
//! its plan as the agent would, so that a test walks an app from one sync
//! to the next with no API server.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube_core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::{AppObserved, PlanContext, Prepared, plan};
use crate::manifest::{Manifest, ObjectKey};
use crate::model::{InventoryEntry, LeftGit, LiveMeta, Resolved};
use crate::plan::desired::{canonical_hash, is_stored_as, prepare};
use crate::plan::{LiveObjects, Planned, RevisionKeys, key_of};
use crate::rollout::api::{
    CanaryStep, GatewayRouting, IngressRouting, Pause, Rollout, RolloutSpec, RolloutStatus, Signal, Strategy,
    TrafficRouting, WorkloadRef, is_rollout,
};
use crate::rollout::model::{RolloutObserved, RolloutsObserved, Target};
use crate::rollout::overlay::{STABLE_HASH_ANNOTATION, is_pinned};
use crate::rollout::plan::{Observed, Revisions, route_seen};
use crate::rollout::signal;

pub const APP: &str = "shop";
pub const NAMESPACE: &str = "demo";
pub const INSTANCE: &str = "gitcanary";
/// The uid the cluster gives the Rollout once it exists.
pub const ROLLOUT_UID: &str = "rollout-uid";

/// A manifest of the app, as the loader reads it from `shop/<name>-<kind>.yaml`.
pub fn manifest(object: Value) -> Manifest {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
    Manifest {
        app: APP.to_string(),
        file: format!("{APP}/{name}-{kind}.yaml"),
        line: 1,
        object,
    }
}

/// A Deployment of `replicas` pods labelled `app: <name>`, running `image`.
pub fn deployment(name: &str, image: &str, replicas: i64) -> Manifest {
    manifest(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": image}]},
            },
        },
    }))
}

/// A Service selecting the pods labelled `app: <name>`, on port 80.
pub fn service(name: &str) -> Manifest {
    manifest(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]},
    }))
}

/// An HTTPRoute sending every request to `service`.
pub fn http_route(name: &str, service: &str) -> Manifest {
    manifest(json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "parentRefs": [{"name": "edge"}],
            "rules": [{"backendRefs": [{"name": service, "port": 80}]}],
        },
    }))
}

/// An nginx Ingress sending every request to `service`.
pub fn ingress(name: &str, service: &str) -> Manifest {
    manifest(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "ingressClassName": "nginx",
            "rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}],
        },
    }))
}

pub fn config_map(name: &str, color: &str) -> Manifest {
    manifest(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"color": color},
    }))
}

/// A canary step sending `percent` of requests to the canary.
pub fn traffic(percent: &str) -> CanaryStep {
    CanaryStep {
        traffic: Some(percent.to_string()),
        ..CanaryStep::default()
    }
}

/// The pause that ends a step.
pub trait StepPause {
    fn paused_for(self, seconds: u64) -> Self;
    /// An indefinite pause: the step waits for a promote.
    fn paused_until_promoted(self) -> Self;
}

impl StepPause for CanaryStep {
    fn paused_for(mut self, seconds: u64) -> Self {
        self.pause = Some(Pause {
            duration: Some(crate::rollout::api::Duration::Seconds(seconds)),
        });
        self
    }
    fn paused_until_promoted(mut self) -> Self {
        self.pause = Some(Pause { duration: None });
        self
    }
}

impl Rollout {
    /// A canary Rollout `echo` in the test namespace, governing the
    /// Deployment `echo`, with no step and no routing yet.
    pub fn test() -> RolloutBuilder {
        let spec = RolloutSpec {
            workload_ref: WorkloadRef {
                api_version: "apps/v1".to_string(),
                kind: "Deployment".to_string(),
                name: "echo".to_string(),
            },
            strategy: Strategy::default(),
            ..RolloutSpec::default()
        };
        let mut rollout = Rollout::new("echo", spec);
        rollout.metadata.namespace = Some(NAMESPACE.to_string());
        RolloutBuilder { rollout }
    }
}

pub struct RolloutBuilder {
    rollout: Rollout,
}

impl RolloutBuilder {
    /// The Deployment the Rollout governs.
    pub fn workload(mut self, name: &str) -> Self {
        self.rollout.spec.workload_ref.name = name.to_string();
        self
    }

    pub fn steps(mut self, steps: impl IntoIterator<Item = CanaryStep>) -> Self {
        self.rollout.spec.strategy.canary.steps = steps.into_iter().collect();
        self
    }

    /// Splits `service`'s requests through the HTTPRoute `http_route`.
    pub fn route(mut self, service: &str, http_route: &str) -> Self {
        self.rollout.spec.strategy.canary.traffic_routings.push(TrafficRouting {
            service: service.to_string(),
            gateway: Some(GatewayRouting {
                http_route_name: http_route.to_string(),
            }),
            ingress: None,
        });
        self
    }

    /// Splits `service`'s requests through an nginx canary of the Ingress `ingress`.
    pub fn ingress(mut self, service: &str, ingress: &str) -> Self {
        self.rollout.spec.strategy.canary.traffic_routings.push(TrafficRouting {
            service: service.to_string(),
            gateway: None,
            ingress: Some(IngressRouting {
                name: ingress.to_string(),
                class_type: "nginx".to_string(),
            }),
        });
        self
    }

    pub fn build(self) -> Rollout {
        self.rollout
    }

    /// The Rollout as a manifest of the app.
    pub fn manifest(self) -> Manifest {
        manifest(serde_json::to_value(self.build()).expect("a Rollout serialises"))
    }
}

/// The app as Git holds it at a commit.
pub struct Git {
    pub commit: String,
    pub manifests: Vec<Manifest>,
}

impl Git {
    pub fn at(commit: &str, manifests: Vec<Manifest>) -> Git {
        Git {
            commit: commit.to_string(),
            manifests,
        }
    }
}

/// What the workload's pods run, as observe reads their revisions.
#[derive(Clone, Default)]
pub struct Pods {
    /// The revision (`pod-template-hash`) the stable pods run.
    pub stable: String,
    /// The canary pods' revision, once their Deployment made them.
    pub canary: String,
    pub canary_ready: i32,
}

/// The cluster an app syncs to: its live objects, the app's inventory, the
/// Rollout's status and canary objects, and the pods. `sync` observes it as
/// the agent's observe does, plans, and applies the plan to it.
pub struct Cluster {
    pub live: BTreeMap<ObjectKey, Value>,
    pub inventory: Vec<InventoryEntry>,
    pub prune: bool,
    pub rollout_status: Option<RolloutStatus>,
    pub canary_live: BTreeMap<(&'static str, String), Value>,
    pub pods: Pods,
    /// The abort annotation on the Rollout.
    pub abort_signal: Option<String>,
    /// Seconds since the test began.
    pub clock: i64,
}

impl Cluster {
    /// A cluster that holds nothing of the app, with `--prune`.
    pub fn empty() -> Cluster {
        Cluster {
            live: BTreeMap::new(),
            inventory: Vec::new(),
            prune: true,
            rollout_status: None,
            canary_live: BTreeMap::new(),
            pods: Pods::default(),
            abort_signal: None,
            clock: 0,
        }
    }

    pub fn wait(&mut self, seconds: i64) {
        self.clock += seconds;
    }

    pub fn now(&self) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + self.clock).expect("a valid time")
    }

    /// An abort of the running release, as `gitcanary abort` annotates it.
    pub fn abort_by(&mut self, who: &str) {
        let status = self.rollout_status.clone().unwrap_or_default();
        let release = signal::Release::running(ROLLOUT_UID, &status).expect("a release runs");
        assert!(signal::awaited(Signal::Abort, &status).is_ok());
        self.abort_signal = Some(signal::token(&release, who));
    }

    /// Plans the app at `git` against the cluster as it is, lets `look`
    /// read the plan, then applies the plan as the executor would.
    pub fn sync<T>(&mut self, git: &Git, look: impl FnOnce(&Prepared<'_>) -> T) -> T {
        let objects: Vec<Planned<'_>> = git.manifests.iter().map(planned).collect();
        let rollouts = self.observe_rollouts(git, &objects);
        let live: LiveObjects = self
            .live
            .iter()
            .map(|(key, object)| (key.clone(), object.to_string().into_boxed_str()))
            .collect();
        let revision = RevisionKeys::of(git.manifests.iter(), NAMESPACE);
        let context = PlanContext {
            live: &live,
            revision: &revision,
            instance: INSTANCE,
            default_namespace: NAMESPACE,
            prune: self.prune,
        };
        // The plan borrows the inventory that `apply` then replaces.
        let inventory = self.inventory.clone();
        let observed = AppObserved {
            app: APP,
            objects,
            pending: Vec::new(),
            rollouts,
            left_git: self.left_git(&revision),
            inventory: &inventory,
            unreadable_inventory: None,
        };
        let prepared = plan(observed, &context).unwrap_or_else(|problems| panic!("the app is refused: {problems:?}"));
        let seen = look(&prepared);
        self.apply(&prepared);
        seen
    }

    /// What observe reads of each Rollout of the app.
    fn observe_rollouts(&self, git: &Git, objects: &[Planned<'_>]) -> RolloutsObserved {
        let found = (0..objects.len())
            .filter(|&i| is_rollout(objects[i].manifest))
            .map(|i| {
                let target = Target::find(objects, i)?;
                let observed = self.observe(git, objects, &target);
                Ok((target, observed))
            })
            .collect();
        RolloutsObserved(found)
    }

    fn observe(&self, git: &Git, objects: &[Planned<'_>], target: &Target) -> RolloutObserved {
        let git_template = &objects[target.workload].manifest.object["spec"]["template"];
        let workload = self.live.get(&objects[target.workload].key);
        let rollout_exists = self.live.contains_key(&objects[target.index].key);
        let canary = &target.spec.strategy.canary;
        let routes = canary.gateway_routes().filter_map(|(service, route)| {
            let live = self.live.get(&key("gateway.networking.k8s.io", "HTTPRoute", route))?;
            Some(route_seen(live, service, &canary.canary_name(service)))
        });
        let pods = if workload.is_some() {
            self.pods.clone()
        } else {
            Pods::default()
        };
        let stable_services_pinned = canary.traffic_routings.iter().all(|routing| {
            self.live_service(&routing.service)
                .is_some_and(|live| is_pinned(live, target.kind, &pods.stable))
        });
        RolloutObserved {
            planner: Observed {
                commit: git.commit.clone(),
                git_template_hash: canonical_hash(git_template),
                workload_exists: workload.is_some(),
                workload_stable_hash: workload
                    .and_then(|w| w["metadata"]["annotations"][STABLE_HASH_ANNOTATION].as_str())
                    .map(str::to_string),
                git_matches_live: workload.is_some_and(|w| is_stored_as(git_template, &w["spec"]["template"])),
                canary_ready: pods.canary_ready,
                abort_signal: self.abort_signal.clone(),
                rollout_uid: if rollout_exists { ROLLOUT_UID } else { "" }.to_string(),
                stable_revision: pods.stable.clone(),
                canary_revision: pods.canary.clone(),
                routes: Some(routes.collect()),
                stable_services_pinned,
                now: self.now(),
                ..Observed::default()
            },
            previous: self.rollout_status.clone(),
            rollout_uid: rollout_exists.then(|| ROLLOUT_UID.to_string()),
            last_command_comment: 0,
            revisions: Revisions {
                stable: pods.stable.clone(),
                canary: pods.canary.clone(),
            },
            stable_template: workload.map(|w| w["spec"]["template"].clone()),
            knative_settled: false,
            canary_live: self.canary_live.clone(),
            canary_kinds: canary_kinds(),
            gateways: Vec::new(),
            record_problem: None,
        }
    }

    /// What observe reads of the inventory entries that left Git: each as it is live, or gone.
    fn left_git(&self, revision: &RevisionKeys) -> BTreeMap<ObjectKey, LeftGit> {
        self.inventory
            .iter()
            .map(InventoryEntry::key)
            .filter(|key| !revision.holds(key))
            .map(|key| {
                let found = self
                    .live
                    .get(&key)
                    .and_then(LiveMeta::of)
                    .map_or(LeftGit::Gone, LeftGit::Live);
                (key, found)
            })
            .collect()
    }

    fn live_service(&self, name: &str) -> Option<&Value> {
        self.live.get(&key("", "Service", name))
    }

    /// The plan's writes and deletes done, its inventory and statuses recorded.
    fn apply(&mut self, prepared: &Prepared<'_>) {
        let plan = &prepared.plan;
        for &(index, _) in &plan.writes {
            let item = &plan.objects[index];
            self.live.insert(item.key.clone(), stored(&item.desired));
        }
        for deletion in &plan.prunes {
            self.live.remove(&deletion.key);
        }
        self.inventory = plan.objects.iter().map(|p| p.inventory_entry(false)).collect();
        self.inventory.extend(plan.kept.iter().cloned());
        for work in &prepared.rollouts {
            self.rollout_status = Some(work.plan.status.clone());
            for write in &work.canary_writes {
                self.canary_live.insert(
                    (canary_kind(&write.key.kind), write.key.name.clone()),
                    stored(&write.object),
                );
            }
            for deletion in work.route_deletions.iter().chain(&work.canary_deletions) {
                self.canary_live
                    .remove(&(canary_kind(&deletion.key.kind), deletion.key.name.clone()));
            }
        }
    }
}

/// An object as the API server stores it.
fn stored(desired: &Value) -> Value {
    let mut object = desired.clone();
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
    object["metadata"]["uid"] = json!(format!("uid-{kind}-{name}"));
    object["metadata"]["resourceVersion"] = json!("1");
    object
}

fn canary_kind(kind: &str) -> &'static str {
    match kind {
        "Deployment" => "Deployment",
        "Service" => "Service",
        "Ingress" => "Ingress",
        other => panic!("no canary object is a {other}"),
    }
}

/// The key of an object of the test namespace.
pub fn key(group: &str, kind: &str, name: &str) -> ObjectKey {
    ObjectKey {
        group: group.to_string(),
        kind: kind.to_string(),
        namespace: Some(NAMESPACE.to_string()),
        name: name.to_string(),
    }
}

/// A manifest resolved as discovery would resolve it: every kind here is namespaced.
fn planned(manifest: &Manifest) -> Planned<'_> {
    let desired = prepare(manifest, true, INSTANCE, NAMESPACE);
    Planned {
        key: key_of(&desired, manifest),
        resolved: resolved(manifest.api_version(), manifest.kind()),
        manifest,
        desired,
    }
}

fn resolved(api_version: &str, kind: &str) -> Resolved {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Resolved {
        resource: ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase())),
        namespaced: true,
    }
}

fn canary_kinds() -> BTreeMap<&'static str, Resolved> {
    BTreeMap::from([
        ("Deployment", resolved("apps/v1", "Deployment")),
        ("Service", resolved("v1", "Service")),
        ("Ingress", resolved("networking.k8s.io/v1", "Ingress")),
    ])
}
