//! One sync: make the cluster match a revision, app by app, each in four
//! stages: observe (`cluster::observe` and the rollout engine's reads), plan
//! (`plan::plan_app`, pure), apply (`cluster::apply`, the one write path) and
//! report (the app's status, logs; rollouts' status and Events). `diff` is
//! the same observe and plan, applied as a dry run. An app with a problem is
//! not applied at all; the others go on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use serde_json::{Value, json};
use tracing::{Instrument, info, info_span, warn};

use crate::cluster::observe::{self, resolve_manifest};
use crate::cluster::{AppStatus, Cluster, Deleted, Mode, ObjectDiff, Writer, api_message, ensure_namespace};
use crate::manifest::{App, Manifest, ObjectKey, Problem};
use crate::plan::desired::{applies_as_is, is_subset};
use crate::plan::{self, AppInputs, AppPlan, InventoryEntry, LiveMeta, LiveObjects, Planned, Reason, RevisionKeys};
use crate::rollout;
use crate::rollout::engine::RolloutWork;
use crate::rollout::plan::Requeue;
use crate::source::Revision;
use crate::{Error, FIELD_MANAGER, Result, short_commit};

pub use crate::plan::SyncOptions;
pub use memo::SyncMemo;

mod memo;

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
    /// Adopted Namespaces that left Git: gitcanary's fields removed, the Namespace kept.
    pub released: Vec<ObjectKey>,
    /// Canary objects (workload, Service, Ingress) this sync wrote.
    pub canary_applied: Vec<ObjectKey>,
    /// Canary objects this sync deleted (the release ended or went back).
    pub canary_deleted: Vec<ObjectKey>,
    /// Objects someone changed in the cluster, put back by this sync.
    pub drifted: Vec<ObjectKey>,
    pub problems: Vec<Problem>,
    pub health: String,
    pub duration: Duration,
    /// Sync this app again after this long, and why: a rollout waits for time to pass.
    pub requeue: Option<Requeue>,
    /// Promotes and reverts of this app's rollouts still to be written to Git.
    pub writebacks: Vec<crate::writeback::Request>,
    /// The app's rollouts as this sync left them.
    pub rollouts: Vec<rollout::engine::RolloutSummary>,
    /// Nothing the app holds changed since the last sync, which found it in
    /// order: this is that sync's answer, with nothing observed or planned.
    pub recalled: bool,
}

#[derive(Debug, Clone)]
pub struct SyncReport {
    pub commit: String,
    pub apps: Vec<AppReport>,
    /// Every (apiVersion, kind) the revision holds.
    pub kinds: BTreeSet<(String, String)>,
    /// Only some apps were synced (a scoped sync): the others are not in `apps`.
    pub scoped: bool,
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
}

/// Apps synced at once (each with up to `SyncOptions::concurrency` requests).
const APP_CONCURRENCY: usize = 8;

/// Syncs every app of the revision.
pub async fn sync(cluster: &Cluster, revision: &Revision, options: &SyncOptions) -> Result<SyncReport> {
    sync_owned(cluster, revision.clone(), options).await
}

/// What every app's observe shares: the revision's kinds, resolved and listed once.
struct Observed {
    crd_kinds: BTreeSet<(String, String)>,
    live: LiveObjects,
    revision: RevisionKeys,
    history: Option<std::sync::Arc<dyn crate::rollout::record::History>>,
}

/// The checks a revision passes before any of it is applied (they need no
/// cluster); their problems are added to the apps.
pub fn validate_revision(revision: &mut Revision, options: &SyncOptions) {
    for app in revision.manifests.apps.values_mut() {
        crate::manifest::load::cap_documents(app);
    }
    rollout::validate::validate(&mut revision.manifests, &options.allowed);
    for app in revision.manifests.apps.values_mut() {
        if let Some(message) = options.tenant_problem(&app.name) {
            let (file, line) = app
                .manifests
                .first()
                .map_or((app.name.clone(), 1), |m| (m.file.clone(), m.line));
            app.problems.push(crate::manifest::Problem { file, line, message });
        }
    }
}

async fn observe_revision(cluster: &Cluster, revision: &Revision, options: &SyncOptions) -> Result<Observed> {
    let history = revision.history.clone();
    let manifests = &revision.manifests;
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
    let live = observe::list_live(cluster, &manifests.apps, options).await?;
    let revision = RevisionKeys::of(
        manifests.apps.values().flat_map(|a| a.manifests.iter()),
        &options.allowed.default_namespace,
    );
    Ok(Observed {
        crd_kinds,
        live,
        revision,
        history,
    })
}

/// `sync` of a revision the caller no longer needs: its manifests are
/// validated in place rather than copied.
pub async fn sync_owned(cluster: &Cluster, mut revision: Revision, options: &SyncOptions) -> Result<SyncReport> {
    validate_revision(&mut revision, options);
    sync_validated(cluster, &revision, options, &SyncMemo::default(), None).await
}

/// `sync` of a revision that `validate_revision` has checked; `memo` holds
/// what earlier syncs of the same agent found (see [`SyncMemo`]). With
/// `scope`, only the apps it names are synced and reported (a drift or a
/// timer concerns one app); the others are left as the last sync left them.
pub async fn sync_validated(
    cluster: &Cluster,
    revision: &Revision,
    options: &SyncOptions,
    memo: &SyncMemo,
    scope: Option<&BTreeSet<String>>,
) -> Result<SyncReport> {
    let span = info_span!("sync", commit = short_commit(&revision.commit));
    async move {
        let statuses = AppStatus::load_all(cluster, &options.state_namespace, &options.instance).await?;
        // Recorded statuses live in the namespace: it exists.
        if statuses.is_empty() {
            ensure_namespace(cluster, &options.state_namespace).await?;
        }
        let manifests = &revision.manifests;
        let in_scope = |app: &&App| scope.is_none_or(|apps| apps.contains(&app.name));
        // Before the live objects are read: a change after this is seen by
        // the plan and misses the memo next time, never the other way round.
        let mut inputs = BTreeMap::new();
        let mut recalled = BTreeMap::new();
        for app in manifests.apps.values().filter(in_scope) {
            let app_commit = revision.commit_for(&app.name);
            let previous = statuses.get(&app.name).map(AsRef::as_ref);
            if let Some((found, keys)) = memo::inputs_of(cluster, app, app_commit, options).await {
                if let Some(report) = memo.recall(&app.name, &found, previous) {
                    recalled.insert(app.name.as_str(), report);
                } else if memo::holds_exactly(previous, keys) {
                    inputs.insert(app.name.as_str(), found);
                }
            }
        }
        memo.keep_only(manifests.apps.keys().map(String::as_str));
        // Observed once, and only if some app is planned at all.
        let observed = tokio::sync::OnceCell::new();
        // Apps that hold Namespaces or CRDs go first: other apps may use them.
        let (first, rest): (Vec<&App>, Vec<&App>) = manifests
            .apps
            .values()
            .filter(in_scope)
            .partition(|app| app.kinds().iter().any(|(_, kind)| plan::is_staged_first_kind(kind)));
        let one = async |app: &App| -> Result<AppReport> {
            if let Some(report) = recalled.get(app.name.as_str()) {
                tracing::debug!(app = %app.name, "app unchanged since the last sync: nothing it holds changed");
                return Ok(report.clone());
            }
            let observed = observed
                .get_or_try_init(|| observe_revision(cluster, revision, options))
                .await?;
            // The app's own commit: a push that leaves the app alone rewrites nothing of it.
            let app_commit = revision.commit_for(&app.name);
            let previous = statuses.get(&app.name).map(AsRef::as_ref);
            let (report, kept) = sync_one(cluster, app, app_commit, observed, previous, options)
                .instrument(info_span!("app", app = %app.name, commit = short_commit(app_commit)))
                .await?;
            match (inputs.get(app.name.as_str()), kept) {
                (Some(inputs), Some(status)) => memo.remember(*inputs, status, &report),
                _ => memo.forget(&app.name),
            }
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
        let kinds: BTreeSet<&(String, String)> = manifests.apps.values().flat_map(|a| a.kinds()).collect();
        let kinds = kinds.into_iter().cloned().collect();
        Ok(SyncReport {
            commit: revision.commit.clone(),
            apps: reports,
            kinds,
            scoped: scope.is_some(),
        })
    }
    .instrument(span)
    .await
}

/// One app: observe, plan, apply, report. With the report, the status it
/// recorded when that was already in place (nothing written).
async fn sync_one(
    cluster: &Cluster,
    app: &App,
    commit: &str,
    observed: &Observed,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
) -> Result<(AppReport, Option<AppStatus>)> {
    let started = Instant::now();
    let previous_inventory = previous.map(|p| p.inventory.clone()).unwrap_or_default();
    let (mut report, inventory) = match reconcile_app(cluster, app, commit, observed, previous, options).await {
        Ok(Reconciled::Applied(report, inventory)) => (*report, inventory),
        Ok(Reconciled::Refused(result, problems)) => (report_of(app, result, problems), previous_inventory),
        Err(error) => (
            report_of(app, AppResult::Failed, vec![app_problem(app, error.to_string())]),
            previous_inventory,
        ),
    };
    let (status, wrote) = save_status(cluster, commit, &report, inventory, previous, options).await?;
    report.duration = started.elapsed();
    log_report(&report);
    Ok((report, (!wrote).then_some(status)))
}

/// How an app's reconcile ended.
enum Reconciled {
    /// Applied (perhaps in part): the report and the inventory to record.
    Applied(Box<AppReport>, Vec<InventoryEntry>),
    /// Nothing applied (or all taken back): the app keeps the inventory it had.
    Refused(AppResult, Vec<Problem>),
}

/// An app observed and planned, ready for the apply stage.
struct Prepared<'a> {
    plan: AppPlan<'a>,
    rollouts: Vec<RolloutWork>,
}

/// Observe and plan: everything decided, nothing written.
async fn observe_and_plan<'a>(
    cluster: &Cluster,
    app: &'a App,
    commit: &str,
    observed: &Observed,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
    measure: bool,
) -> Result<std::result::Result<Prepared<'a>, Vec<Problem>>> {
    if !app.problems.is_empty() {
        return Ok(Err(app.problems.clone()));
    }
    let resolved = observe::resolve_app(cluster, app, &observed.crd_kinds, options).await;
    if !resolved.problems.is_empty() {
        return Ok(Err(resolved.problems));
    }
    let problems = plan::landing_problems(&resolved.objects, &options.allowed);
    if !problems.is_empty() {
        return Ok(Err(problems));
    }
    let mut objects = resolved.objects;
    // Rollouts overlay the objects they govern before anything is compared.
    let (rollouts, problems) = rollout::engine::prepare(
        cluster,
        &mut objects,
        commit,
        observed.history.as_ref(),
        options,
        measure,
    )
    .await?;
    if !problems.is_empty() {
        return Ok(Err(problems));
    }
    let inventory = previous.map_or(&[][..], |p| &p.inventory[..]);
    let unreadable = previous.and_then(|p| p.unreadable_inventory.as_ref());
    let left_git = if options.prune && unreadable.is_none() {
        observe::left_git(
            cluster,
            &plan::left_git(
                &objects,
                &resolved.pending,
                inventory,
                &options.allowed.default_namespace,
            ),
        )
        .await
    } else {
        BTreeMap::new()
    };
    let plan = plan::plan_app(AppInputs {
        app: &app.name,
        objects,
        pending: resolved.pending,
        live: &observed.live,
        previous: inventory,
        left_git: &left_git,
        revision: &observed.revision,
        unreadable_inventory: unreadable.map(|u| u.error.as_str()),
        has_rollouts: !rollouts.is_empty(),
        instance: &options.instance,
        default_namespace: &options.allowed.default_namespace,
        prune: options.prune,
    });
    Ok(Ok(Prepared { plan, rollouts }))
}

async fn reconcile_app(
    cluster: &Cluster,
    app: &App,
    commit: &str,
    observed: &Observed,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
) -> Result<Reconciled> {
    let prepared = match observe_and_plan(cluster, app, commit, observed, previous, options, true).await? {
        Ok(prepared) => prepared,
        Err(problems) => return Ok(Reconciled::Refused(AppResult::Invalid, problems)),
    };
    let previous_inventory = previous.map_or(&[][..], |p| &p.inventory[..]);
    apply_app(
        &cluster.writer(options.tenant_of(&app.name)),
        app,
        prepared,
        &observed.live,
        previous_inventory,
        options,
    )
    .await
}

/// The apply stage: executes the plan through the one write path.
async fn apply_app(
    writer: &Writer<'_>,
    app: &App,
    prepared: Prepared<'_>,
    live: &LiveObjects,
    previous: &[InventoryEntry],
    options: &SyncOptions,
) -> Result<Reconciled> {
    let Prepared { mut plan, rollouts } = prepared;
    let adoption = Adoption {
        started: jiff::Timestamp::now(),
        previous,
        adopt_all: options.adopt,
    };
    // The API server validates everything before anything is written, a
    // fresh app's objects too: one of them may be someone else's object,
    // which must be refused before gitcanary's fields are merged into it.
    // (Objects in a namespace this revision creates cannot exist yet, and
    // are not dry-run.)
    let (problems, answers) = dry_run(writer, &plan, live, &adoption, options).await?;
    if !problems.is_empty() {
        return Ok(Reconciled::Refused(AppResult::Invalid, problems));
    }
    plan.settle(&answers, live);
    let mut failures = Vec::new();
    let mut report = report_of(app, AppResult::Synced, Vec::new());
    // Canary objects first, so that a route never names a canary Service that does not exist yet.
    report.canary_applied = apply_canary_objects(writer, app, &rollouts, &mut failures).await;
    // Canary routes no longer wanted go before anything else is written: an
    // abort's traffic is back on stable as soon as it can be.
    delete_canary_objects(writer, app, &rollouts, true, &mut report, &mut failures).await;
    let applied = apply_objects(writer, &mut plan, live, &adoption, options, &mut failures).await?;
    if plan.fresh && !failures.is_empty() {
        take_back(writer, &plan.objects, &applied.results, adoption.started).await;
        failures.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
        return Ok(Reconciled::Refused(AppResult::Invalid, failures));
    }
    report.unchanged = plan.objects.len() - applied.written.len();
    for &index in &applied.written {
        if applied.results[index].is_null() {
            continue;
        }
        let key = plan.objects[index].key.clone();
        if plan.writes.contains(&(index, Reason::Drift)) {
            report.drifted.push(key.clone());
        }
        report.applied.push(key);
    }
    finish_rollouts(writer, app, &rollouts, &mut report, &mut failures).await;
    let inventory = prune(writer, app, &mut plan, &applied, previous, &mut report, &mut failures).await;
    report.health = if applied.results.iter().all(plan::is_healthy) {
        "Healthy".to_string()
    } else {
        "Progressing".to_string()
    };
    if !failures.is_empty() {
        report.problems = failures;
        report.result = AppResult::Failed;
    }
    Ok(Reconciled::Applied(Box::new(report), inventory))
}

/// The canary objects that differ from the cluster; returns those written.
async fn apply_canary_objects(
    writer: &Writer<'_>,
    app: &App,
    rollouts: &[RolloutWork],
    failures: &mut Vec<Problem>,
) -> Vec<ObjectKey> {
    let mut written = Vec::new();
    for work in rollouts {
        for write in &work.canary_writes {
            match writer
                .apply(&write.resolved, &write.object, write.ours, Mode::Apply)
                .await
            {
                Ok(_) => written.push(write.key.clone()),
                Err(error) => {
                    let message = format!("applying {}: {}", write.key, api_message(&error));
                    failures.push(rollout_problem(app, work, &message));
                }
            }
        }
    }
    written
}

/// What the staged apply did to an app's objects.
struct Applied {
    /// By object index: what the API server answered (or what health reads
    /// of an unchanged object); null for an object not applied.
    results: Vec<Value>,
    /// Indices of the objects written, in the order written.
    written: Vec<usize>,
    /// Objects that existed and were taken over in this sync, as asked.
    adopted: BTreeSet<ObjectKey>,
}

/// Namespaces and CRDs first; then, once those CRDs are established, the
/// objects of the kinds they add; then the rest.
async fn apply_objects(
    writer: &Writer<'_>,
    plan: &mut AppPlan<'_>,
    live: &LiveObjects,
    adoption: &Adoption<'_>,
    options: &SyncOptions,
    failures: &mut Vec<Problem>,
) -> Result<Applied> {
    let cluster = writer.cluster();
    let mut applied = Applied {
        results: vec![Value::Null; plan.objects.len()],
        written: Vec::new(),
        adopted: BTreeSet::new(),
    };
    for (index, health) in std::mem::take(&mut plan.unchanged) {
        applied.results[index] = health;
    }
    let (first, mut rest) = plan.staged_writes();
    failures.extend(apply_writes(writer, &plan.objects, &first, live, adoption, &mut applied, options).await);
    let crds: Vec<&str> = first
        .iter()
        .filter(|&&i| plan.objects[i].manifest.kind() == "CustomResourceDefinition")
        .map(|&i| plan.objects[i].name())
        .collect();
    if !crds.is_empty() {
        let served = match wait_for_crds(cluster, &crds).await {
            Ok(()) => cluster.refresh_discovery().await,
            Err(error) => Err(error),
        };
        // What was written stays recorded (the inventory is made from the
        // plan's objects); the objects of the new kinds wait for a later sync.
        if let Err(error) = served {
            let failed = match &error {
                Error::NotEstablished { name, .. } | Error::NamesNotAccepted { name, .. } => Some(name.as_str()),
                _ => None,
            };
            let crd = crds.iter().find(|&&name| Some(name) == failed).or(crds.first());
            let blamed = first
                .iter()
                .map(|&i| &plan.objects[i])
                .find(|item| item.manifest.kind() == "CustomResourceDefinition" && Some(&item.name()) == crd);
            let message = match &error {
                Error::NamesNotAccepted { .. } => {
                    format!("{error}; the objects of its kinds wait until its names are fixed")
                }
                _ => format!("{error}; the objects of its kinds are applied by a later sync"),
            };
            failures.extend(blamed.map(|item| item.manifest.problem(message)));
            for manifest in std::mem::take(&mut plan.pending) {
                failures.push(manifest.problem(format!("kind {} is not served yet", manifest.kind())));
            }
        }
    }
    for manifest in std::mem::take(&mut plan.pending) {
        let Some(item) = resolve_manifest(cluster, manifest, options).await else {
            failures.push(manifest.problem(format!(
                "kind {} is still not served after its CRD was applied",
                manifest.kind()
            )));
            continue;
        };
        match live.get(&item.key) {
            Some(current) if is_subset(&item.desired, &current) => applied.results.push(plan::health_view(&current)),
            _ => {
                rest.push(plan.objects.len());
                applied.results.push(Value::Null);
            }
        }
        plan.objects.push(item);
    }
    failures.extend(apply_writes(writer, &plan.objects, &rest, live, adoption, &mut applied, options).await);
    applied.written = first;
    applied.written.append(&mut rest);
    Ok(applied)
}

/// After the app's objects: the canary objects no longer wanted go (routes
/// are back on stable by now: the canary Ingresses went before the app's
/// objects, Git's HTTPRoutes were among them), then each rollout reports.
async fn finish_rollouts(
    writer: &Writer<'_>,
    app: &App,
    rollouts: &[RolloutWork],
    report: &mut AppReport,
    failures: &mut Vec<Problem>,
) {
    let cluster = writer.cluster();
    delete_canary_objects(writer, app, rollouts, false, report, failures).await;
    for work in rollouts {
        if let Err(error) = rollout::engine::finish(cluster, work).await {
            failures.push(rollout_problem(app, work, &error.to_string()));
        }
    }
    report.requeue = rollouts.iter().map(|w| w.requeue()).fold(None, Requeue::sooner);
    report.writebacks = rollouts.iter().filter_map(crate::writeback::Request::of).collect();
    report.rollouts = rollouts.iter().map(|w| w.summary()).collect();
}

/// Deletes the rollouts' canary objects no longer wanted, in the order
/// planned: the routes (`routes`), or all but the routes.
async fn delete_canary_objects(
    writer: &Writer<'_>,
    app: &App,
    rollouts: &[RolloutWork],
    routes: bool,
    report: &mut AppReport,
    failures: &mut Vec<Problem>,
) {
    for work in rollouts {
        let chosen = work
            .canary_deletions
            .iter()
            .filter(|d| rollout::engine::is_route(d) == routes);
        for deletion in chosen {
            match writer.delete(deletion, Mode::Apply).await {
                Ok(Deleted::Deleted) => report.canary_deleted.push(deletion.key.clone()),
                Ok(_) => {}
                Err(error) => {
                    let message = format!("deleting {}: {}", deletion.key, api_message(&error));
                    failures.push(rollout_problem(app, work, &message));
                }
            }
        }
    }
}

/// The plan's prunes and releases; returns the inventory to record: what
/// Git holds now (adopted or created), plus what left Git but was not pruned.
async fn prune(
    writer: &Writer<'_>,
    app: &App,
    plan: &mut AppPlan<'_>,
    applied: &Applied,
    previous: &[InventoryEntry],
    report: &mut AppReport,
    failures: &mut Vec<Problem>,
) -> Vec<InventoryEntry> {
    let cluster = writer.cluster();
    let was_adopted =
        |key: &ObjectKey| applied.adopted.contains(key) || previous.iter().any(|e| e.adopted && e.key() == *key);
    let mut inventory: Vec<InventoryEntry> = plan
        .objects
        .iter()
        .map(|item| item.inventory_entry(was_adopted(&item.key)))
        .collect();
    inventory.append(&mut plan.kept);
    failures.append(&mut plan.problems);
    for deletion in &plan.prunes {
        match writer.delete(deletion, Mode::Apply).await {
            Ok(Deleted::Deleted) => report.pruned.push(deletion.key.clone()),
            Ok(Deleted::Gone) => {}
            // Another app took it over, or someone re-created it: keep tracking it.
            Ok(Deleted::Changed) => inventory.push(deletion.inventory_entry()),
            Err(error) => {
                let message = format!("pruning {}: {}", deletion.key, api_message(&error));
                failures.push(app_problem(app, message));
                inventory.push(deletion.inventory_entry());
            }
        }
    }
    for entry in &plan.releases {
        match cluster.resolve(&entry.api_version, &entry.kind).await {
            Some(resolved) => {
                release(writer, &resolved, &release_target(entry)).await;
                report.released.push(entry.key());
            }
            None => inventory.push(entry.clone()),
        }
    }
    inventory.sort();
    inventory
}

/// The object an inventory entry names, as [`release`] needs it.
fn release_target(entry: &InventoryEntry) -> Value {
    let mut object = json!({"apiVersion": entry.api_version, "kind": entry.kind, "metadata": {"name": entry.name}});
    if let Some(namespace) = &entry.namespace {
        object["metadata"]["namespace"] = json!(namespace);
    }
    object
}

/// What decides whether an object written as new may be taken over.
struct Adoption<'a> {
    /// When the sync began: an object created before is not gitcanary's new one.
    started: jiff::Timestamp,
    /// The app's inventory as the last sync left it.
    previous: &'a [InventoryEntry],
    /// `--adopt`: take over every existing object (a migration).
    adopt_all: bool,
}

impl Adoption<'_> {
    fn creation(&self, item: &Planned<'_>, answer: &Value) -> plan::Creation {
        plan::creation(item, answer, self.started, self.previous, self.adopt_all)
    }
}

/// Applies the objects at `indices`; each result goes to `results`, each
/// refusal is returned. An object that already existed and that nothing
/// asked to adopt is refused, and gitcanary's fields are taken back from it.
async fn apply_writes(
    writer: &Writer<'_>,
    objects: &[Planned<'_>],
    indices: &[usize],
    live: &LiveObjects,
    adoption: &Adoption<'_>,
    applied: &mut Applied,
    options: &SyncOptions,
) -> Vec<Problem> {
    let outcomes = stream::iter(indices.iter().map(|&i| async move {
        let item = &objects[i];
        let outcome = writer
            .apply(&item.resolved, &item.desired, live.contains_key(&item.key), Mode::Apply)
            .await
            .map(|applied| serde_json::to_value(applied).unwrap_or(Value::Null))
            .map_err(|e| {
                item.manifest
                    .problem(format!("applying {}: {}", item.key, api_message(&e)))
            });
        (i, outcome)
    }))
    .buffer_unordered(options.concurrency.max(1))
    .collect::<Vec<_>>()
    .await;
    let mut problems = Vec::new();
    for (index, outcome) in outcomes {
        let item = &objects[index];
        match outcome {
            Ok(answer) if live.contains_key(&item.key) => applied.results[index] = answer,
            Ok(answer) => match adoption.creation(item, &answer) {
                plan::Creation::Created => applied.results[index] = answer,
                plan::Creation::Adopted => {
                    applied.adopted.insert(item.key.clone());
                    applied.results[index] = answer;
                }
                plan::Creation::Refused(message) => {
                    release(writer, &item.resolved, &item.desired).await;
                    problems.push(item.manifest.problem(message));
                }
            },
            Err(problem) => problems.push(problem),
        }
    }
    problems
}

/// Removes gitcanary's fields (its label and annotations among them) from an
/// object it does not keep, by applying an empty configuration.
async fn release(writer: &Writer<'_>, resolved: &crate::plan::Resolved, object: &Value) {
    let mut empty = json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
        "metadata": {"name": object["metadata"]["name"]}});
    if let Some(namespace) = object["metadata"]["namespace"].as_str() {
        empty["metadata"]["namespace"] = json!(namespace);
    }
    if let Err(error) = writer.apply(resolved, &empty, false, Mode::Apply).await {
        warn!(object = %object["metadata"]["name"], error = %api_message(&error), "could not take back gitcanary's fields");
    }
}

/// Namespaces (of the objects at `indices`) that exist now. Objects in a
/// namespace this revision creates cannot be dry-run before it exists.
async fn existing_namespaces(
    cluster: &Cluster,
    objects: &[Planned<'_>],
    indices: &[usize],
) -> Result<BTreeSet<String>> {
    let mut checked: BTreeMap<String, bool> = BTreeMap::new();
    let api: Api<Namespace> = Api::all(cluster.client.clone());
    for &i in indices {
        if let Some(ns) = objects[i].namespace()
            && !checked.contains_key(ns)
        {
            let exists = api
                .get_opt(ns)
                .await
                .map_err(Error::kube(format!("reading namespace {ns}")))?
                .is_some();
            checked.insert(ns.to_string(), exists);
        }
    }
    Ok(checked
        .into_iter()
        .filter(|(_, exists)| *exists)
        .map(|(ns, _)| ns)
        .collect())
}

/// The pre-check: every write dry-run, so that the API server validates
/// everything before anything is written. Returns the refusals, and the
/// server's answer for each write of a live object (what it would store).
async fn dry_run(
    writer: &Writer<'_>,
    plan: &AppPlan<'_>,
    live: &LiveObjects,
    adoption: &Adoption<'_>,
    options: &SyncOptions,
) -> Result<(Vec<Problem>, BTreeMap<usize, Value>)> {
    let cluster = writer.cluster();
    let indices: Vec<usize> = plan.writes.iter().map(|&(i, _)| i).collect();
    let namespaces = existing_namespaces(cluster, &plan.objects, &indices).await?;
    let checkable = indices
        .into_iter()
        .filter(|&i| plan.objects[i].namespace().is_none_or(|ns| namespaces.contains(ns)));
    let outcomes = stream::iter(checkable.map(|i| async move {
        let item = &plan.objects[i];
        let ours = live.contains_key(&item.key);
        let outcome = match writer.apply(&item.resolved, &item.desired, ours, Mode::DryRun).await {
            Err(e) => Err(refused(item, &e)),
            Ok(answer) if ours => Ok(Some(serde_json::to_value(answer).unwrap_or(Value::Null))),
            Ok(answer) => match adoption.creation(item, &serde_json::to_value(answer).unwrap_or(Value::Null)) {
                plan::Creation::Refused(message) => Err(item.manifest.problem(message)),
                plan::Creation::Created | plan::Creation::Adopted => Ok(None),
            },
        };
        (i, outcome)
    }))
    .buffer_unordered(options.concurrency.max(1))
    .collect::<Vec<_>>()
    .await;
    let mut problems = Vec::new();
    let mut answers = BTreeMap::new();
    for (index, outcome) in outcomes {
        match outcome {
            Ok(Some(answer)) => {
                answers.insert(index, answer);
            }
            Ok(None) => {}
            Err(problem) => problems.push(problem),
        }
    }
    problems.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Ok((problems, answers))
}

fn refused(item: &Planned<'_>, error: &kube::Error) -> Problem {
    item.manifest.problem(format!(
        "{} refused by the API server: {}",
        item.key,
        api_message(error)
    ))
}

/// Takes back what this sync did to a fresh app that failed, newest first:
/// deletes the objects it created (gitcanary their only field manager,
/// created after the sync began), and from an object that someone else
/// made it removes gitcanary's fields by applying an empty configuration.
async fn take_back(writer: &Writer<'_>, objects: &[Planned<'_>], results: &[Value], started: jiff::Timestamp) {
    let started_second = started.as_second();
    for (index, applied) in results.iter().enumerate().rev() {
        let Some(meta) = LiveMeta::of(applied) else {
            continue; // not applied by this sync
        };
        let managers = applied["metadata"]["managedFields"].as_array().map_or(0, Vec::len);
        let only_ours = managers == 1 && applied["metadata"]["managedFields"][0]["manager"] == FIELD_MANAGER;
        let created = applied["metadata"]["creationTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .is_some_and(|t| t.as_second() >= started_second);
        let item = &objects[index];
        if !only_ours || !created {
            release(writer, &item.resolved, &item.desired).await;
            continue;
        }
        let deletion = plan::Deletion {
            resource_version: None,
            ..plan::Deletion::of(item.manifest.api_version(), item.key.clone(), &meta)
        };
        if let Err(error) = writer.delete(&deletion, Mode::Apply).await {
            warn!(object = %item.key, error = %api_message(&error), "could not take back an object of a failed app");
        }
    }
}

/// How long a CRD the sync applied may take to become established.
const CRD_WAIT: Duration = Duration::from_secs(60);

async fn wait_for_crds(cluster: &Cluster, names: &[&str]) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let deadline = Instant::now() + CRD_WAIT;
    for name in names {
        loop {
            let crd = api
                .get(name)
                .await
                .map_err(Error::kube(format!("reading CRD {name}")))?;
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                break;
            }
            if let Some(refused) = conditions
                .iter()
                .find(|c| c.type_ == "NamesAccepted" && c.status == "False")
            {
                return Err(Error::NamesNotAccepted {
                    name: name.to_string(),
                    message: refused.message.clone().unwrap_or_default(),
                });
            }
            if Instant::now() > deadline {
                return Err(Error::NotEstablished {
                    name: name.to_string(),
                    seconds: CRD_WAIT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
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

fn app_problem(app: &App, message: String) -> Problem {
    Problem {
        file: app.name.clone(),
        line: 0,
        message,
    }
}

fn rollout_problem(app: &App, work: &RolloutWork, message: &str) -> Problem {
    app_problem(app, format!("rollout {}/{}: {message}", work.namespace, work.name))
}

fn report_of(app: &App, result: AppResult, problems: Vec<Problem>) -> AppReport {
    AppReport {
        app: app.name.clone(),
        result,
        applied: Vec::new(),
        unchanged: 0,
        pruned: Vec::new(),
        released: Vec::new(),
        canary_applied: Vec::new(),
        canary_deleted: Vec::new(),
        drifted: Vec::new(),
        problems,
        health: String::new(),
        duration: Duration::ZERO,
        requeue: None,
        writebacks: Vec::new(),
        rollouts: Vec::new(),
        recalled: false,
    }
}

fn log_report(report: &AppReport) {
    if report.problems.is_empty() {
        info!(
            result = report.result.as_str(),
            applied = report.applied.len(), unchanged = report.unchanged, pruned = report.pruned.len(),
            drifted = report.drifted.len(), health = %report.health,
            duration_ms = report.duration.as_millis() as u64, "app synced"
        );
    } else {
        for problem in &report.problems {
            warn!(result = report.result.as_str(), "{problem}");
        }
    }
    for key in &report.drifted {
        info!(object = %key, "drift healed: the live object differed from Git");
    }
}

async fn save_status(
    cluster: &Cluster,
    commit: &str,
    report: &AppReport,
    inventory: Vec<InventoryEntry>,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
) -> Result<(AppStatus, bool)> {
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
        // An inventory that cannot be read is kept as it is until someone fixes it.
        unreadable_inventory: previous.and_then(|p| p.unreadable_inventory.clone()),
    };
    // A no-op resync writes nothing.
    if previous == Some(&status) {
        return Ok((status, false));
    }
    status
        .save(cluster, &options.state_namespace, &options.instance)
        .await?;
    Ok((status, true))
}

/// What the next sync would change, without changing anything: the same
/// observe and plan as `sync`, applied as a dry run. Lists exactly the
/// objects the next sync would write or delete.
pub async fn diff(
    cluster: &Cluster,
    revision: &Revision,
    options: &SyncOptions,
) -> Result<(Vec<ObjectDiff>, Vec<Problem>)> {
    let mut revision = revision.clone();
    validate_revision(&mut revision, options);
    let observed = observe_revision(cluster, &revision, options).await?;
    let statuses = AppStatus::load_all(cluster, &options.state_namespace, &options.instance).await?;
    let mut diffs = Vec::new();
    let mut problems = Vec::new();
    for app in revision.manifests.apps.values() {
        let previous = statuses.get(&app.name).map(AsRef::as_ref);
        let commit = revision.commit_for(&app.name);
        match observe_and_plan(cluster, app, commit, &observed, previous, options, false).await? {
            Ok(prepared) => {
                let (app_diffs, app_problems) = dry_run_diff(
                    &cluster.writer(options.tenant_of(&app.name)),
                    &prepared,
                    &observed.live,
                    options,
                )
                .await;
                diffs.extend(app_diffs);
                problems.extend(app_problems);
                problems.extend(prepared.plan.problems.iter().cloned());
            }
            Err(app_problems) => problems.extend(app_problems),
        }
    }
    diffs.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((diffs, problems))
}

/// The apply stage of `diff`: each write dry-run through the one apply path,
/// each delete shown with the object it would remove.
async fn dry_run_diff(
    writer: &Writer<'_>,
    prepared: &Prepared<'_>,
    live: &LiveObjects,
    options: &SyncOptions,
) -> (Vec<ObjectDiff>, Vec<Problem>) {
    let cluster = writer.cluster();
    let plan = &prepared.plan;
    let mut diffs = Vec::new();
    let mut problems = Vec::new();
    let outcomes = stream::iter(plan.writes.iter().map(|&(i, _)| async move {
        let item = &plan.objects[i];
        let ours = live.contains_key(&item.key);
        // Someone else's object by that name is not listed as ours: read it to show what changes.
        let before = match live.get(&item.key) {
            Some(object) => Some(object),
            None => read_value(cluster, &item.resolved, item.namespace(), item.name())
                .await
                .map_err(|e| item.manifest.problem(api_message(&e)))?,
        };
        let after = match writer.apply(&item.resolved, &item.desired, ours, Mode::DryRun).await {
            Ok(after) => serde_json::to_value(after).unwrap_or(Value::Null),
            // A namespace that does not exist yet: show the object as Git has it.
            Err(kube::Error::Api(status)) if status.code == 404 && before.is_none() => item.desired.clone(),
            Err(e) => return Err(refused(item, &e)),
        };
        // The server would store it as it is: the sync settles it, no write.
        if ours
            && before
                .as_ref()
                .is_some_and(|before| applies_as_is(before, &after, &item.desired))
        {
            return Ok(None);
        }
        Ok(Some(write_diff(
            item.key.clone(),
            item.manifest.location(),
            before.as_ref(),
            &after,
        )))
    }))
    .buffer_unordered(options.concurrency.max(1))
    .collect::<Vec<_>>()
    .await;
    for outcome in outcomes {
        match outcome {
            Ok(diff) => diffs.extend(diff),
            Err(problem) => problems.push(problem),
        }
    }
    for manifest in &plan.pending {
        diffs.push(write_diff(manifest.key(), manifest.location(), None, &manifest.object));
    }
    for work in &prepared.rollouts {
        for write in &work.canary_writes {
            let after = match writer
                .apply(&write.resolved, &write.object, write.ours, Mode::DryRun)
                .await
            {
                Ok(after) => serde_json::to_value(after).unwrap_or(Value::Null),
                Err(kube::Error::Api(status)) if status.code == 404 => write.object.clone(),
                Err(e) => {
                    problems.push(Problem {
                        file: work.app.clone(),
                        line: 0,
                        message: format!("{} refused by the API server: {}", write.key, api_message(&e)),
                    });
                    continue;
                }
            };
            diffs.push(write_diff(
                write.key.clone(),
                work.source.clone(),
                write.live.as_ref(),
                &after,
            ));
        }
    }
    release_diffs(writer, &plan.releases, &mut diffs, &mut problems).await;
    let deletions = prepared
        .rollouts
        .iter()
        .flat_map(|w| w.canary_deletions.iter())
        .chain(plan.prunes.iter());
    for deletion in deletions {
        diffs.extend(deletion_diff(cluster, deletion).await);
    }
    (diffs, problems)
}

/// What releasing each adopted Namespace would change.
async fn release_diffs(
    writer: &Writer<'_>,
    releases: &[InventoryEntry],
    diffs: &mut Vec<ObjectDiff>,
    problems: &mut Vec<Problem>,
) {
    let cluster = writer.cluster();
    for entry in releases {
        let Some(resolved) = cluster.resolve(&entry.api_version, &entry.kind).await else {
            continue;
        };
        let target = release_target(entry);
        let before = read_value(cluster, &resolved, entry.namespace.as_deref(), &entry.name)
            .await
            .ok()
            .flatten();
        match writer.apply(&resolved, &target, false, Mode::DryRun).await {
            Ok(after) => {
                let after = serde_json::to_value(after).unwrap_or(Value::Null);
                diffs.push(write_diff(entry.key(), String::new(), before.as_ref(), &after));
            }
            Err(e) => problems.push(Problem {
                file: String::new(),
                line: 0,
                message: format!("releasing {}: {}", entry.key(), api_message(&e)),
            }),
        }
    }
}

/// A delete the sync would make, shown with the object it removes.
async fn deletion_diff(cluster: &Cluster, deletion: &plan::Deletion) -> Option<ObjectDiff> {
    let shown = match cluster.resolve(&deletion.api_version, &deletion.key.kind).await {
        Some(resolved) => read_value(
            cluster,
            &resolved,
            deletion.key.namespace.as_deref(),
            &deletion.key.name,
        )
        .await
        .ok()
        .flatten(),
        None => None,
    };
    let shown = shown.unwrap_or_else(|| json!({"metadata": {"name": deletion.key.name, "uid": deletion.uid}}));
    ObjectDiff::between(deletion.key.clone(), String::new(), Some(&shown), None)
}

/// A diff for an object the sync would write, even when only gitcanary's
/// bookkeeping (which a diff does not show) changes.
fn write_diff(key: ObjectKey, location: String, before: Option<&Value>, after: &Value) -> ObjectDiff {
    ObjectDiff::between(key.clone(), location.clone(), before, Some(after)).unwrap_or_else(|| ObjectDiff {
        unified: format!("{key}: only gitcanary's annotations change\n"),
        key,
        location,
        change: crate::cluster::Change::Update,
    })
}

async fn read_value(
    cluster: &Cluster,
    resolved: &crate::plan::Resolved,
    namespace: Option<&str>,
    name: &str,
) -> std::result::Result<Option<Value>, kube::Error> {
    let object = cluster.api(resolved, namespace).get_opt(name).await?;
    Ok(object.map(|o| serde_json::to_value(o).unwrap_or(Value::Null)))
}
