//! One sync: make the cluster match a revision, app by app. An app with a
//! problem is not applied at all; the others go on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::cluster::{AppStatus, Cluster, InventoryEntry, ObjectDiff, Resolved, ensure_namespace, is_subset, prepare};
use crate::manifest::{App, Manifest, ObjectKey, Problem};
use crate::rollout;
use crate::source::Revision;
use crate::{APPLIED_HASH_ANNOTATION, Error, FIELD_MANAGER, MANAGED_BY_LABEL, Result, SOURCE_ANNOTATION};

#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Agent instance name, the value of the `gitcanary.io/managed-by` label.
    pub instance: String,
    /// Namespace of the per-app status ConfigMaps.
    pub state_namespace: String,
    /// Delete managed objects that left Git.
    pub prune: bool,
    /// Namespaces manifests may use; empty allows all.
    pub allowed_namespaces: Vec<String>,
    /// Requests in flight at once while applying.
    pub concurrency: usize,
    /// Prometheus for analysis templates that name none.
    pub prometheus_url: Option<String>,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            instance: "gitcanary".to_string(),
            state_namespace: "gitcanary-system".to_string(),
            prune: false,
            allowed_namespaces: Vec::new(),
            concurrency: 16,
            prometheus_url: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppResult {
    Synced,
    /// Not applied: the manifests have problems.
    Invalid,
    /// Applied in part: the API server refused some objects.
    Failed,
}

impl AppResult {
    fn as_str(self) -> &'static str {
        match self {
            AppResult::Synced => "Synced",
            AppResult::Invalid => "Invalid",
            AppResult::Failed => "Failed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct AppReport {
    pub app: String,
    pub result: AppResult,
    pub applied: Vec<ObjectKey>,
    pub unchanged: usize,
    pub pruned: Vec<ObjectKey>,
    /// Objects someone changed in the cluster, put back by this sync.
    pub drifted: Vec<ObjectKey>,
    pub problems: Vec<Problem>,
    pub health: String,
    pub duration: Duration,
    /// Sync this app again after this long: a rollout waits for time to pass.
    pub requeue_after: Option<Duration>,
    /// Promotes and reverts of this app's rollouts still to be written to Git.
    pub writebacks: Vec<crate::writeback::Request>,
    /// The app's rollouts as this sync left them.
    pub rollouts: Vec<rollout::engine::RolloutSummary>,
}

#[derive(Debug, Clone)]
pub struct SyncReport {
    pub commit: String,
    pub apps: Vec<AppReport>,
    /// Every (apiVersion, kind) the revision holds.
    pub kinds: BTreeSet<(String, String)>,
}

impl SyncReport {
    pub fn app(&self, name: &str) -> Option<&AppReport> {
        self.apps.iter().find(|a| a.app == name)
    }
    pub fn is_clean(&self) -> bool {
        self.apps.iter().all(|a| a.result == AppResult::Synced)
    }
    pub fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.apps.iter().flat_map(|a| a.problems.iter())
    }
    /// Every promote and revert still to be written to Git.
    pub fn writebacks(&self) -> impl Iterator<Item = &crate::writeback::Request> {
        self.apps.iter().flat_map(|a| a.writebacks.iter())
    }

    /// The soonest any app asked to be synced again.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.apps.iter().filter_map(|a| a.requeue_after).min()
    }
}

/// An object of the revision, resolved against the API server.
pub(crate) struct Planned<'a> {
    pub(crate) manifest: &'a Manifest,
    pub(crate) resolved: Resolved,
    pub(crate) desired: Value,
    pub(crate) key: ObjectKey,
}

impl Planned<'_> {
    pub(crate) fn namespace(&self) -> Option<&str> {
        self.desired["metadata"]["namespace"].as_str()
    }
    pub(crate) fn name(&self) -> &str {
        self.manifest.name()
    }
    fn is_staged_first(&self) -> bool {
        matches!(self.manifest.kind(), "Namespace" | "CustomResourceDefinition")
    }
    fn inventory_entry(&self) -> InventoryEntry {
        InventoryEntry {
            api_version: self.manifest.api_version().to_string(),
            kind: self.manifest.kind().to_string(),
            namespace: self.namespace().map(str::to_string),
            name: self.name().to_string(),
        }
    }
}

/// Apps synced at once (each with up to `SyncOptions::concurrency` requests).
const APP_CONCURRENCY: usize = 8;

/// Live managed objects, listed once per kind for the whole sync. Each is
/// kept as compact JSON and parsed when its app syncs: a parsed object
/// takes several times the memory of its text, and a large repository's
/// objects would all be held at once.
#[derive(Default)]
struct LiveObjects {
    objects: HashMap<ObjectKey, Box<str>>,
}

impl LiveObjects {
    fn get(&self, key: &ObjectKey) -> Option<Value> {
        self.objects.get(key).and_then(|text| serde_json::from_str(text).ok())
    }
    fn contains_key(&self, key: &ObjectKey) -> bool {
        self.objects.contains_key(key)
    }
}

/// Syncs every app of the revision.
pub async fn sync(cluster: &Cluster, revision: &Revision, options: &SyncOptions) -> Result<SyncReport> {
    sync_owned(cluster, revision.clone(), options).await
}

/// `sync` of a revision the caller no longer needs: its manifests are
/// validated in place rather than copied.
pub async fn sync_owned(cluster: &Cluster, mut revision: Revision, options: &SyncOptions) -> Result<SyncReport> {
    let mut manifests = std::mem::take(&mut revision.manifests);
    manifests.validate(&options.allowed_namespaces);
    ensure_namespace(cluster, &options.state_namespace).await?;
    let crd_kinds = kinds_defined_by_crds(manifests.apps.values().flat_map(|a| a.manifests.iter()));
    // A kind the API server did not serve when discovery last ran may be
    // served now (a CRD installed by hand): look again, at most every 10 s.
    for manifest in manifests.apps.values().flat_map(|a| a.manifests.iter()) {
        let known = crd_kinds.contains(&(manifest.group().to_string(), manifest.kind().to_string()));
        if !known && cluster.resolve(manifest.api_version(), manifest.kind()).await.is_none() {
            cluster.refresh_discovery_unless_fresh(Duration::from_secs(10)).await?;
            break;
        }
    }
    let live = list_live(cluster, &manifests.apps, options).await?;
    let statuses = AppStatus::load_all(cluster, &options.state_namespace, &options.instance).await?;

    // Apps that hold Namespaces or CRDs go first: other apps may use them.
    let (first, rest): (Vec<&App>, Vec<&App>) = manifests.apps.values().partition(|app| {
        app.manifests
            .iter()
            .any(|m| matches!(m.kind(), "Namespace" | "CustomResourceDefinition"))
    });
    let one = async |app: &App| -> Result<AppReport> {
        let started = Instant::now();
        let previous = statuses.get(&app.name);
        // The app's own commit: a push that leaves the app alone rewrites nothing of it.
        let app_commit = revision.commit_for(&app.name);
        let mut report = match sync_app(cluster, app, app_commit, &crd_kinds, &live, previous, options).await {
            Ok((report, inventory)) => {
                save_status(cluster, app_commit, &report, inventory, previous, options).await?;
                report
            }
            Err(error) => {
                let report = failed_report(app, &error.to_string());
                let inventory = previous.map(|p| p.inventory.clone()).unwrap_or_default();
                save_status(cluster, app_commit, &report, inventory, previous, options).await?;
                report
            }
        };
        report.duration = started.elapsed();
        log_report(app_commit, &report);
        Ok(report)
    };
    let mut reports = Vec::new();
    for app in first {
        reports.push(one(app).await?);
    }
    // The other apps are independent of each other: a few at a time.
    let mut rest = stream::iter(rest).map(one).buffered(APP_CONCURRENCY);
    while let Some(report) = rest.next().await {
        reports.push(report?);
    }
    let kinds = manifests
        .apps
        .values()
        .flat_map(|a| a.manifests.iter())
        .map(|m| (m.api_version().to_string(), m.kind().to_string()))
        .collect();
    Ok(SyncReport {
        commit: revision.commit.clone(),
        apps: reports,
        kinds,
    })
}

fn rollout_problem(app: &App, work: &rollout::engine::RolloutWork, error: &Error) -> Problem {
    Problem {
        file: app.name.clone(),
        line: 0,
        message: format!("rollout {}/{}: {error}", work.namespace, work.name),
    }
}

fn failed_report(app: &App, message: &str) -> AppReport {
    AppReport {
        app: app.name.clone(),
        result: AppResult::Failed,
        applied: Vec::new(),
        unchanged: 0,
        pruned: Vec::new(),
        drifted: Vec::new(),
        problems: vec![Problem {
            file: app.name.clone(),
            line: 0,
            message: message.to_string(),
        }],
        health: String::new(),
        duration: Duration::ZERO,
        requeue_after: None,
        writebacks: Vec::new(),
        rollouts: Vec::new(),
    }
}

fn log_report(commit: &str, report: &AppReport) {
    let short = &commit[..commit.len().min(12)];
    if report.problems.is_empty() {
        info!(
            commit = short, app = %report.app, result = report.result.as_str(),
            applied = report.applied.len(), unchanged = report.unchanged, pruned = report.pruned.len(),
            drifted = report.drifted.len(), health = %report.health,
            duration_ms = report.duration.as_millis() as u64, "app synced"
        );
    } else {
        for problem in &report.problems {
            warn!(commit = short, app = %report.app, result = report.result.as_str(), "{problem}");
        }
    }
    for key in &report.drifted {
        info!(app = %report.app, object = %key, "drift healed: the live object differed from Git");
    }
}

fn kinds_defined_by_crds<'a>(manifests: impl Iterator<Item = &'a Manifest>) -> BTreeSet<(String, String)> {
    manifests
        .filter(|m| m.kind() == "CustomResourceDefinition")
        .filter_map(|m| {
            let spec = &m.object["spec"];
            Some((
                spec["group"].as_str()?.to_string(),
                spec["names"]["kind"].as_str()?.to_string(),
            ))
        })
        .collect()
}

async fn list_live(cluster: &Cluster, apps: &BTreeMap<String, App>, options: &SyncOptions) -> Result<LiveObjects> {
    let mut kinds: BTreeMap<(String, String), Resolved> = BTreeMap::new();
    for manifest in apps.values().flat_map(|a| a.manifests.iter()) {
        let id = (manifest.api_version().to_string(), manifest.kind().to_string());
        if kinds.contains_key(&id) {
            continue;
        }
        if let Some(resolved) = cluster.resolve(&id.0, &id.1).await {
            kinds.insert(id, resolved);
        }
    }
    let selector = format!("{MANAGED_BY_LABEL}={}", options.instance);
    let lists = stream::iter(kinds.into_values().map(|resolved| {
        let selector = selector.clone();
        async move {
            let api = cluster.api(&resolved, None);
            let mut params = ListParams::default().labels(&selector).limit(500);
            let mut objects = Vec::new();
            loop {
                let page = api
                    .list(&params)
                    .await
                    .map_err(Error::kube(format!("listing {}", resolved.resource.plural)))?;
                let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
                // Page by page into the form kept, without managedFields (nothing
                // reads them; they are a good part of each object's size).
                objects.extend(page.items.into_iter().map(|mut object| {
                    object.metadata.managed_fields = None;
                    live_entry(&resolved.resource, object)
                }));
                match next {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
            Ok::<_, Error>(objects)
        }
    }))
    .buffer_unordered(options.concurrency.max(1))
    .try_collect::<Vec<_>>()
    .await?;
    Ok(LiveObjects {
        objects: lists.into_iter().flatten().collect(),
    })
}

fn live_entry(resource: &kube::discovery::ApiResource, mut object: kube::api::DynamicObject) -> (ObjectKey, Box<str>) {
    let key = ObjectKey {
        group: resource.group.clone(),
        kind: resource.kind.clone(),
        namespace: object.metadata.namespace.clone(),
        name: object.metadata.name.clone().unwrap_or_default(),
    };
    // List items carry no type; the desired objects do.
    object.types = Some(kube::api::TypeMeta {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
    });
    let text = serde_json::to_string(&object).unwrap_or_default();
    (key, text.into_boxed_str())
}

fn key_of(desired: &Value, manifest: &Manifest) -> ObjectKey {
    ObjectKey {
        group: manifest.group().to_string(),
        kind: manifest.kind().to_string(),
        namespace: desired["metadata"]["namespace"].as_str().map(str::to_string),
        name: manifest.name().to_string(),
    }
}

/// Resolves every manifest of the app; kinds that CRDs of this revision will
/// add are returned apart, to be resolved once those CRDs are established.
async fn resolve_app<'a>(
    cluster: &Cluster,
    app: &'a App,
    crd_kinds: &BTreeSet<(String, String)>,
    instance: &str,
) -> (Vec<Planned<'a>>, Vec<&'a Manifest>, Vec<Problem>) {
    let mut planned = Vec::new();
    let mut pending = Vec::new();
    let mut problems = Vec::new();
    for manifest in &app.manifests {
        match cluster.resolve(manifest.api_version(), manifest.kind()).await {
            Some(resolved) => {
                let desired = prepare(manifest, resolved.namespaced, instance);
                let key = key_of(&desired, manifest);
                planned.push(Planned {
                    manifest,
                    resolved,
                    desired,
                    key,
                });
            }
            None if crd_kinds.contains(&(manifest.group().to_string(), manifest.kind().to_string())) => {
                pending.push(manifest)
            }
            None if manifest.group() == rollout::api::GROUP => problems.push(manifest.problem(format!(
                "kind {} in {} is not installed: apply the CRD first (gitcanary crd | kubectl apply -f -, or deploy/)",
                manifest.kind(),
                manifest.api_version()
            ))),
            None => problems.push(manifest.problem(format!(
                "unknown kind {} in {}: the API server does not serve it and no CRD in this revision defines it",
                manifest.kind(),
                manifest.api_version()
            ))),
        }
    }
    (planned, pending, problems)
}

async fn sync_app(
    cluster: &Cluster,
    app: &App,
    commit: &str,
    crd_kinds: &BTreeSet<(String, String)>,
    live: &LiveObjects,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
) -> Result<(AppReport, Vec<InventoryEntry>)> {
    let previous_inventory = previous.map(|p| p.inventory.clone()).unwrap_or_default();
    let mut report = AppReport {
        app: app.name.clone(),
        result: AppResult::Synced,
        applied: Vec::new(),
        unchanged: 0,
        pruned: Vec::new(),
        drifted: Vec::new(),
        problems: app.problems.clone(),
        health: String::new(),
        duration: Duration::ZERO,
        requeue_after: None,
        writebacks: Vec::new(),
        rollouts: Vec::new(),
    };
    if !report.problems.is_empty() {
        report.result = AppResult::Invalid;
        return Ok((report, previous_inventory));
    }
    let (mut planned, pending, problems) = resolve_app(cluster, app, crd_kinds, &options.instance).await;
    if !problems.is_empty() {
        report.problems = problems;
        report.result = AppResult::Invalid;
        return Ok((report, previous_inventory));
    }

    // Rollouts overlay the objects they govern before anything is compared.
    let (rollouts, problems) = rollout::engine::prepare(cluster, &mut planned, commit, options, true).await?;
    if !problems.is_empty() {
        report.problems = problems;
        report.result = AppResult::Invalid;
        return Ok((report, previous_inventory));
    }

    // Decide what to write: missing, changed in Git, or changed in the cluster.
    let mut to_apply = Vec::new();
    let mut results: Vec<Value> = Vec::new();
    for (index, item) in planned.iter().enumerate() {
        match live.get(&item.key) {
            Some(current) if is_subset(&item.desired, &current) => {
                report.unchanged += 1;
                results.push(health_view(&current));
            }
            Some(current) => {
                let same_hash = current["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
                    == item.desired["metadata"]["annotations"][APPLIED_HASH_ANNOTATION];
                if same_hash {
                    report.drifted.push(item.key.clone());
                }
                to_apply.push(index);
                results.push(Value::Null);
            }
            None => {
                to_apply.push(index);
                results.push(Value::Null);
            }
        }
    }

    // An app none of whose objects exists yet skips the dry run: if the API
    // server refuses one of them, the ones just created are deleted again,
    // which leaves the cluster as it was, for half the requests.
    let fresh = previous.is_none_or(|p| p.inventory.is_empty())
        && rollouts.is_empty()
        && pending.is_empty()
        && planned
            .iter()
            .all(|p| !live.contains_key(&p.key) && p.manifest.kind() != "CustomResourceDefinition");
    let started = jiff::Timestamp::now();
    // The API server validates everything before anything is written.
    let problems = if fresh {
        Vec::new()
    } else {
        dry_run(cluster, &planned, &to_apply, live, options).await?
    };
    if !problems.is_empty() {
        report.problems = problems;
        report.result = AppResult::Invalid;
        report.drifted.clear();
        return Ok((report, previous_inventory));
    }

    let (first, rest): (Vec<usize>, Vec<usize>) = to_apply.iter().partition(|&&i| planned[i].is_staged_first());
    let mut failures = Vec::new();
    for work in &rollouts {
        if let Err(error) = rollout::engine::apply_canary_objects(cluster, work).await {
            failures.push(rollout_problem(app, work, &error));
        }
    }
    for (index, outcome) in apply_all(cluster, &planned, &first, live, options).await {
        match outcome {
            Ok(value) => results[index] = value,
            Err(problem) => failures.push(problem),
        }
    }
    let crds: Vec<&str> = first
        .iter()
        .filter(|&&i| planned[i].manifest.kind() == "CustomResourceDefinition")
        .map(|&i| planned[i].name())
        .collect();
    if !crds.is_empty() {
        wait_for_crds(cluster, &crds).await?;
        cluster.refresh_discovery().await?;
    }
    // Objects of kinds that the CRDs above just added.
    let mut rest = rest;
    for manifest in pending {
        let Some(resolved) = cluster.resolve(manifest.api_version(), manifest.kind()).await else {
            failures.push(manifest.problem(format!(
                "kind {} is still not served after its CRD was applied",
                manifest.kind()
            )));
            continue;
        };
        let desired = prepare(manifest, resolved.namespaced, &options.instance);
        let key = key_of(&desired, manifest);
        match live.get(&key) {
            Some(current) if is_subset(&desired, &current) => {
                report.unchanged += 1;
                results.push(health_view(&current));
            }
            _ => {
                rest.push(planned.len());
                results.push(Value::Null);
            }
        }
        planned.push(Planned {
            manifest,
            resolved,
            desired,
            key,
        });
    }
    for (index, outcome) in apply_all(cluster, &planned, &rest, live, options).await {
        match outcome {
            Ok(value) => results[index] = value,
            Err(problem) => failures.push(problem),
        }
    }
    if fresh && !failures.is_empty() {
        roll_back_creations(cluster, &planned, &results, started).await;
        failures.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        report.problems = failures;
        report.result = AppResult::Invalid;
        return Ok((report, previous_inventory));
    }
    for &index in first.iter().chain(rest.iter()) {
        if !results[index].is_null() {
            report.applied.push(planned[index].key.clone());
        }
    }

    for work in &rollouts {
        if let Err(error) = rollout::engine::finish(cluster, work).await {
            failures.push(rollout_problem(app, work, &error));
        }
    }
    report.requeue_after = rollouts.iter().filter_map(|w| w.requeue_after()).min();
    report.writebacks = rollouts.iter().filter_map(|w| w.writeback()).collect();
    report.rollouts = rollouts.iter().map(|w| w.summary()).collect();

    // Inventory: what Git holds now, plus what left Git but was not pruned.
    let current: BTreeSet<ObjectKey> = planned.iter().map(|p| p.key.clone()).collect();
    let mut inventory: Vec<InventoryEntry> = planned.iter().map(Planned::inventory_entry).collect();
    let gone: Vec<InventoryEntry> = previous_inventory
        .into_iter()
        .filter(|entry| !current.contains(&entry.key()))
        .collect();
    if options.prune {
        let (pruned, kept, prune_failures) = prune(cluster, &app.name, gone, options).await;
        report.pruned = pruned;
        inventory.extend(kept);
        failures.extend(prune_failures);
    } else {
        inventory.extend(gone);
    }
    inventory.sort();

    report.health = if results.iter().all(is_healthy) {
        "Healthy".to_string()
    } else {
        "Progressing".to_string()
    };
    if !failures.is_empty() {
        report.problems = failures;
        report.result = AppResult::Failed;
    }
    Ok((report, inventory))
}

async fn dry_run(
    cluster: &Cluster,
    planned: &[Planned<'_>],
    indices: &[usize],
    live: &LiveObjects,
    options: &SyncOptions,
) -> Result<Vec<Problem>> {
    // Objects in a namespace this revision creates cannot be dry-run before it exists.
    let mut namespaces: BTreeMap<String, bool> = BTreeMap::new();
    let ns_api: Api<Namespace> = Api::all(cluster.client.clone());
    for &i in indices {
        if let Some(ns) = planned[i].namespace()
            && !namespaces.contains_key(ns)
        {
            let exists = ns_api
                .get_opt(ns)
                .await
                .map_err(Error::kube(format!("reading namespace {ns}")))?
                .is_some();
            namespaces.insert(ns.to_string(), exists);
        }
    }
    let checkable: Vec<usize> = indices
        .iter()
        .copied()
        .filter(|&i| {
            planned[i]
                .namespace()
                .is_none_or(|ns| namespaces.get(ns).copied().unwrap_or(false))
        })
        .collect();
    let outcomes = stream::iter(checkable.into_iter().map(|i| async move {
        let item = &planned[i];
        let params = apply_params(live, &item.key).dry_run();
        let api = cluster.api(&item.resolved, item.namespace());
        api.patch(item.name(), &params, &Patch::Apply(&item.desired))
            .await
            .err()
            .map(|e| {
                item.manifest
                    .problem(format!("{} refused by the API server: {}", item.key, api_message(&e)))
            })
    }))
    .buffer_unordered(options.concurrency.max(1))
    .collect::<Vec<_>>()
    .await;
    let mut problems: Vec<Problem> = outcomes.into_iter().flatten().collect();
    problems.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Ok(problems)
}

fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// Conflicts are forced only on objects gitcanary already manages (so a
/// `kubectl edit` is healed); someone else's object is not taken over.
fn apply_params(live: &LiveObjects, key: &ObjectKey) -> PatchParams {
    let params = PatchParams::apply(FIELD_MANAGER);
    if live.contains_key(key) { params.force() } else { params }
}

/// Takes back what this sync did to a fresh app that failed, newest first:
/// deletes the objects it created (gitcanary their only field manager,
/// created after the sync began), and from an object that someone else
/// made it removes gitcanary's fields by applying an empty configuration.
async fn roll_back_creations(cluster: &Cluster, planned: &[Planned<'_>], results: &[Value], started: jiff::Timestamp) {
    let started_second = started.as_second();
    for (index, applied) in results.iter().enumerate().rev() {
        if applied["metadata"]["uid"].is_null() {
            continue; // not applied by this sync
        }
        let managers = applied["metadata"]["managedFields"].as_array().map_or(0, Vec::len);
        let only_ours = managers == 1 && applied["metadata"]["managedFields"][0]["manager"] == FIELD_MANAGER;
        let created = applied["metadata"]["creationTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .is_some_and(|t| t.as_second() >= started_second);
        let item = &planned[index];
        let api = cluster.api(&item.resolved, item.namespace());
        if !only_ours || !created {
            let mut empty = json!({"apiVersion": item.desired["apiVersion"], "kind": item.desired["kind"],
                "metadata": {"name": item.name()}});
            if let Some(namespace) = item.namespace() {
                empty["metadata"]["namespace"] = json!(namespace);
            }
            if let Err(error) = api
                .patch(item.name(), &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&empty))
                .await
            {
                warn!(object = %item.key, error = %api_message(&error), "could not take back gitcanary's fields");
            }
            continue;
        }
        let uid = applied["metadata"]["uid"].as_str().map(str::to_string);
        if let Err(error) = api.delete(item.name(), &delete_only(uid, None)).await {
            warn!(object = %item.key, error = %api_message(&error), "could not take back an object of a failed app");
        }
    }
}

async fn apply_all(
    cluster: &Cluster,
    planned: &[Planned<'_>],
    indices: &[usize],
    live: &LiveObjects,
    options: &SyncOptions,
) -> Vec<(usize, std::result::Result<Value, Problem>)> {
    stream::iter(indices.iter().map(|&i| async move {
        let item = &planned[i];
        let params = apply_params(live, &item.key);
        let api = cluster.api(&item.resolved, item.namespace());
        let outcome = api
            .patch(item.name(), &params, &Patch::Apply(&item.desired))
            .await
            .map(|applied| {
                cluster.own_writes.record(&applied);
                serde_json::to_value(applied).unwrap_or(Value::Null)
            })
            .map_err(|e| {
                item.manifest
                    .problem(format!("applying {}: {}", item.key, api_message(&e)))
            });
        (i, outcome)
    }))
    .buffer_unordered(options.concurrency.max(1))
    .collect()
    .await
}

async fn wait_for_crds(cluster: &Cluster, names: &[&str]) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    for name in names {
        loop {
            let crd = api
                .get(name)
                .await
                .map_err(Error::kube(format!("reading CRD {name}")))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Object {
                    object: format!("CustomResourceDefinition {name}"),
                    message: "not established within 60 s".to_string(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Deletes objects that left Git, but only those this instance manages and
/// this app applied; workloads first, then CRDs, then Namespaces.
async fn prune(
    cluster: &Cluster,
    app: &str,
    mut gone: Vec<InventoryEntry>,
    options: &SyncOptions,
) -> (Vec<ObjectKey>, Vec<InventoryEntry>, Vec<Problem>) {
    let rank = |e: &InventoryEntry| match e.kind.as_str() {
        "Namespace" => 2,
        "CustomResourceDefinition" => 1,
        _ => 0,
    };
    gone.sort_by_key(rank);
    let mut pruned = Vec::new();
    let mut kept = Vec::new();
    let mut problems = Vec::new();
    for entry in gone {
        let Some(resolved) = cluster.resolve(&entry.api_version, &entry.kind).await else {
            continue; // its kind is gone, so is the object
        };
        let api = cluster.api(&resolved, entry.namespace.as_deref());
        let live = match api.get_opt(&entry.name).await {
            Ok(live) => live,
            Err(e) => {
                problems.push(prune_problem(app, &entry, &api_message(&e)));
                kept.push(entry);
                continue;
            }
        };
        let Some(live) = live else { continue };
        let ours = live.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)) == Some(&options.instance);
        if !ours {
            continue; // someone else owns it now: never delete
        }
        // An object that moved to another app in the same commit now names that app's file.
        let source = live
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SOURCE_ANNOTATION));
        if source.is_some_and(|file| !belongs_to(file, app)) {
            continue;
        }
        // Only the object as just read: one that another app took over since is kept.
        let params = delete_only(live.metadata.uid.clone(), live.metadata.resource_version.clone());
        match api.delete(&entry.name, &params).await {
            Ok(_) => pruned.push(entry.key()),
            Err(kube::Error::Api(status)) if status.code == 409 => kept.push(entry),
            Err(e) => {
                problems.push(prune_problem(app, &entry, &api_message(&e)));
                kept.push(entry);
            }
        }
    }
    (pruned, kept, problems)
}

/// A background delete that fails with a conflict unless the object is still
/// the one with this uid (and resourceVersion, when given).
fn delete_only(uid: Option<String>, resource_version: Option<String>) -> DeleteParams {
    DeleteParams {
        preconditions: Some(kube::api::Preconditions { uid, resource_version }),
        ..DeleteParams::background()
    }
}

/// Whether a `file:line` source annotation names a file of `app`.
fn belongs_to(source: &str, app: &str) -> bool {
    let file = source.rsplit_once(':').map_or(source, |(file, _)| file);
    match file.split_once('/') {
        Some((dir, _)) => dir == app,
        None => app == crate::manifest::ROOT_APP,
    }
}

fn prune_problem(app: &str, entry: &InventoryEntry, message: &str) -> Problem {
    Problem {
        file: app.to_string(),
        line: 0,
        message: format!("pruning {}: {message}", entry.key()),
    }
}

/// What `is_healthy` reads of an object, and no more (a copy of every
/// unchanged object would double the memory of a large sync).
fn health_view(object: &Value) -> Value {
    json!({
        "kind": object["kind"],
        "metadata": {"generation": object["metadata"]["generation"]},
        "spec": {"replicas": object["spec"]["replicas"]},
        "status": object["status"],
    })
}

/// Workloads are healthy when rolled out and available; other objects when present.
pub fn is_healthy(object: &Value) -> bool {
    let kind = object["kind"].as_str().unwrap_or_default();
    if !matches!(kind, "Deployment" | "StatefulSet") {
        return true;
    }
    let status = &object["status"];
    let want = object["spec"]["replicas"].as_i64().unwrap_or(1);
    let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    let updated = status["updatedReplicas"].as_i64().unwrap_or(0);
    let ready = match kind {
        "Deployment" => status["availableReplicas"].as_i64().unwrap_or(0),
        _ => status["readyReplicas"].as_i64().unwrap_or(0),
    };
    observed >= generation && updated >= want && ready >= want
}

async fn save_status(
    cluster: &Cluster,
    commit: &str,
    report: &AppReport,
    inventory: Vec<InventoryEntry>,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
) -> Result<()> {
    let status = AppStatus {
        app: report.app.clone(),
        commit: commit.to_string(),
        result: report.result.as_str().to_string(),
        message: report
            .problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        health: report.health.clone(),
        inventory,
    };
    // A no-op resync writes nothing.
    if previous == Some(&status) {
        return Ok(());
    }
    status.save(cluster, &options.state_namespace, &options.instance).await
}

/// What the next sync would change, without changing anything.
pub async fn diff(
    cluster: &Cluster,
    revision: &Revision,
    options: &SyncOptions,
) -> Result<(Vec<ObjectDiff>, Vec<Problem>)> {
    let mut manifests = revision.manifests.clone();
    manifests.validate(&options.allowed_namespaces);
    let crd_kinds = kinds_defined_by_crds(manifests.apps.values().flat_map(|a| a.manifests.iter()));
    let mut diffs = Vec::new();
    let mut problems: Vec<Problem> = manifests.problems().cloned().collect();
    for app in manifests.apps.values().filter(|a| a.is_valid()) {
        let (mut planned, pending, resolve_problems) = resolve_app(cluster, app, &crd_kinds, &options.instance).await;
        problems.extend(resolve_problems);
        // What a rollout would keep or change (the stable template, routes, Service pins).
        let (_, rollout_problems) =
            rollout::engine::prepare(cluster, &mut planned, revision.commit_for(&app.name), options, false).await?;
        problems.extend(rollout_problems);
        for manifest in pending {
            diffs.push(
                ObjectDiff::between(manifest.key(), manifest.location(), None, Some(&manifest.object))
                    .expect("new object differs from nothing"),
            );
        }
        let outcomes = stream::iter(planned.iter().map(|item| async move {
            let api = cluster.api(&item.resolved, item.namespace());
            let live = api
                .get_opt(item.name())
                .await
                .map_err(|e| item.manifest.problem(api_message(&e)))?;
            let managed = live
                .as_ref()
                .and_then(|o| o.metadata.labels.as_ref()?.get(MANAGED_BY_LABEL).cloned());
            let mut params = PatchParams::apply(FIELD_MANAGER).dry_run();
            if managed.as_deref() == Some(options.instance.as_str()) {
                params = params.force();
            }
            let live = live.map(|o| serde_json::to_value(o).unwrap_or(Value::Null));
            let after = match api.patch(item.name(), &params, &Patch::Apply(&item.desired)).await {
                Ok(after) => serde_json::to_value(after).unwrap_or(Value::Null),
                // A namespace that does not exist yet: show the object as Git has it.
                Err(kube::Error::Api(status)) if status.code == 404 && live.is_none() => item.desired.clone(),
                Err(e) => {
                    return Err(item.manifest.problem(format!(
                        "{} refused by the API server: {}",
                        item.key,
                        api_message(&e)
                    )));
                }
            };
            Ok(ObjectDiff::between(
                item.key.clone(),
                item.manifest.location(),
                live.as_ref(),
                Some(&after),
            ))
        }))
        .buffer_unordered(options.concurrency.max(1))
        .collect::<Vec<_>>()
        .await;
        for outcome in outcomes {
            match outcome {
                Ok(Some(diff)) => diffs.push(diff),
                Ok(None) => {}
                Err(problem) => problems.push(problem),
            }
        }
        if options.prune {
            let current: BTreeSet<ObjectKey> = planned.iter().map(|p| p.key.clone()).collect();
            let previous = AppStatus::load(cluster, &options.state_namespace, &options.instance, &app.name).await?;
            for entry in previous.map(|p| p.inventory).unwrap_or_default() {
                if current.contains(&entry.key()) {
                    continue;
                }
                let Some(resolved) = cluster.resolve(&entry.api_version, &entry.kind).await else {
                    continue;
                };
                let api = cluster.api(&resolved, entry.namespace.as_deref());
                if let Ok(Some(live)) = api.get_opt(&entry.name).await {
                    let live = serde_json::to_value(live).unwrap_or(Value::Null);
                    diffs.extend(ObjectDiff::between(entry.key(), String::new(), Some(&live), None));
                }
            }
        }
    }
    diffs.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((diffs, problems))
}
