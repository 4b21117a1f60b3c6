//! One sync: make the cluster match a revision, app by app, each in four
//! stages: observe (`observe_app`: the app's objects resolved, its Rollouts
//! read, what left Git looked up, into one `AppObserved`), plan
//! (`planner::plan`, pure), execute (`execute`, the one executor, through
//! `cluster::Writer`) and report (the app's status, logs; Rollouts' status
//! and Events, written last). `diff` is the same observe and plan, executed
//! as a dry run. An app with a problem is not applied at all; the others go
//! on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use serde_json::{Value, json};
use tracing::{Instrument, info, info_span, warn};

use crate::cluster::observe::{self, resolve_manifest};
use crate::cluster::{AppStatus, Cluster, Deleted, Mode, ObjectDiff, Writer, api_message, ensure_namespace};
use crate::manifest::{App, Manifest, ObjectKey, Problem};
use crate::model::{InventoryEntry, LiveMeta};
use crate::plan::desired::is_subset;
use crate::plan::{self, AppPlan, LiveObjects, Planned, Reason, RevisionKeys};
use crate::rollout;
use crate::rollout::model::RolloutWork;
use crate::rollout::plan::Requeue;
use crate::source::Revision;
use crate::{Error, Result, short_commit};

pub use crate::model::SyncOptions;
pub use diff::diff;
pub use memo::SyncMemo;

mod apply;
mod diff;
mod execute;
mod in_flight;
mod memo;
mod outcome;
mod preview;

pub use gitcanary_core::sync::offline;
use gitcanary_core::sync::planner;

use execute::Executed;
use planner::{AppObserved, PlanContext, Prepared};

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
    pub rollouts: Vec<rollout::model::RolloutSummary>,
    /// Nothing the app holds changed since the last sync, which found it in
    /// order: this is that sync's answer, with nothing observed or planned.
    pub recalled: bool,
}

#[derive(Debug, Clone)]
pub struct SyncReport {
    pub commit: String,
    /// Shared: a sync answered from the last one hands it on without a copy.
    pub apps: Arc<Vec<AppReport>>,
    /// Every (apiVersion, kind) the revision holds (shared with the memo).
    pub kinds: Arc<BTreeSet<(String, String)>>,
    /// Where the revision's Rollouts release which kind of workload.
    pub released: Arc<crate::rollout::overlay::Released>,
    /// Only some apps were synced (a scoped sync): the others are not in `apps`.
    pub scoped: bool,
    /// The whole sync was answered from the last one (see `SyncInputs`).
    pub recalled: bool,
}

impl AppReport {
    /// A report of `app` that did nothing yet.
    pub fn new(app: &str, result: AppResult) -> AppReport {
        AppReport {
            app: app.to_string(),
            result,
            applied: Vec::new(),
            unchanged: 0,
            pruned: Vec::new(),
            released: Vec::new(),
            canary_applied: Vec::new(),
            canary_deleted: Vec::new(),
            drifted: Vec::new(),
            problems: Vec::new(),
            health: String::new(),
            duration: Duration::ZERO,
            requeue: None,
            writebacks: Vec::new(),
            rollouts: Vec::new(),
            recalled: false,
        }
    }
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
struct Observed<'r> {
    crd_kinds: BTreeSet<(String, String)>,
    live: LiveObjects,
    /// The revision and the memo its keys are made and kept in.
    source: (&'r Revision, &'r SyncMemo),
    /// Every object's key, made only for an app that has objects that left
    /// Git (nothing else reads them): see [`Observed::revision_keys`].
    revision_keys: std::sync::OnceLock<std::sync::Arc<RevisionKeys>>,
    history: Option<std::sync::Arc<dyn crate::rollout::record::History>>,
    /// What the agent wrote to Git for pending write-backs.
    written_back: rollout::model::WrittenBacks,
}

/// The checks a revision passes before any of it is applied (they need no
/// cluster); their problems are added to the apps.
pub fn validate_revision(revision: &mut Revision, options: &SyncOptions) {
    revision.mark_validated();
    for app in revision.manifests.apps.values_mut() {
        crate::manifest::parse::cap_documents(app);
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

impl Observed<'_> {
    /// The keys of every object of the revision, in any app: made once per
    /// revision, and only when an app has objects that left Git.
    fn revision_keys(&self, default_namespace: &str) -> &RevisionKeys {
        let (revision, memo) = self.source;
        self.revision_keys.get_or_init(|| {
            memo.revision_keys(revision.validated(), || {
                let manifests = revision.manifests.apps.values().flat_map(|a| a.manifests.iter());
                RevisionKeys::of(manifests, default_namespace)
            })
        })
    }
}

async fn observe_revision<'r>(
    cluster: &Cluster,
    revision: &'r Revision,
    options: &SyncOptions,
    memo: &'r SyncMemo,
    wanted: Option<&RevisionKeys>,
) -> Result<Observed<'r>> {
    let history = revision.history.clone();
    let manifests = &revision.manifests;
    let crd_kinds = kinds_defined_by_crds(
        manifests
            .apps
            .values()
            .filter(|a| a.kinds().iter().any(|(_, kind)| kind == "CustomResourceDefinition"))
            .flat_map(|a| a.manifests.iter()),
    );
    // A kind the API server did not serve when discovery last ran may be
    // served now (a CRD installed by hand): look again, at most every 10 s.
    // Each kind once, not each object.
    let kinds = memo.revision_kinds(revision.validated(), || kinds_of(manifests));
    for (api_version, kind) in kinds.iter() {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let known = crd_kinds.contains(&(group.to_string(), kind.clone()));
        if !known && cluster.resolve(api_version, kind).await.is_none() {
            cluster.refresh_discovery_unless_fresh(Duration::from_secs(10)).await?;
            break;
        }
    }
    let live = observe::list_live(cluster, &kinds, options, wanted).await?;
    Ok(Observed {
        crd_kinds,
        live,
        source: (revision, memo),
        revision_keys: std::sync::OnceLock::new(),
        history,
        written_back: memo.written_back(),
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
        let inputs_read = memo::SyncInputs::of(cluster, revision, scope, options);
        if let Some(report) = memo.recall_sync(inputs_read.as_ref()) {
            return Ok(report);
        }
        let statuses = AppStatus::load_all(cluster, &options.state_namespace, &options.instance).await?;
        // Recorded statuses live in the namespace: it exists.
        if statuses.is_empty() {
            ensure_namespace(cluster, &options.state_namespace).await?;
        }
        let manifests = &revision.manifests;
        let in_scope = |app: &&App| scope.is_none_or(|apps| apps.contains(&app.name));
        // Before the live objects are read: a change after this is seen by
        // the plan and misses the memo next time, never the other way round.
        let in_scope_apps = manifests.apps.values().filter(in_scope);
        let (inputs, recalled) = recall_apps(cluster, revision, in_scope_apps, &statuses, options, memo).await;
        memo.keep_only(manifests.apps.keys().map(String::as_str));
        let gone = gone_apps(manifests, &statuses, scope, options);
        // Observed once, and only if some app is planned at all; a sync of
        // some apps reads the live objects of those apps only.
        let observed = tokio::sync::OnceCell::new();
        let wanted = || {
            let apps = manifests.apps.values().filter(in_scope).chain(&gone);
            scope.map(|_| keys_of(apps, &statuses, options))
        };
        // Apps that hold Namespaces or CRDs go first: other apps may use them.
        let (first, mut rest): (Vec<&App>, Vec<&App>) = manifests
            .apps
            .values()
            .filter(in_scope)
            .partition(|app| app.kinds().iter().any(|(_, kind)| plan::is_staged_first_kind(kind)));
        // Last: an object that moved from a gone app to another is the other's first.
        rest.extend(&gone);
        let one = async |app: &App| -> Result<Option<AppReport>> {
            // A shard lost since the sync began: its apps are another's now.
            if options.fence.as_ref().is_some_and(|fence| !(fence.0)(&app.name)) {
                // Per app, and a lost shard may hold thousands: the shard's own loss is logged once.
                tracing::debug!(app = %app.name, "this replica no longer holds the app's shard: nothing written for it");
                return Ok(None);
            }
            if let Some(report) = recalled.get(app.name.as_str()) {
                tracing::debug!(app = %app.name, "app unchanged since the last sync: nothing it holds changed");
                return Ok(Some(report.clone()));
            }
            let observed = observed
                .get_or_try_init(|| async { observe_revision(cluster, revision, options, memo, wanted().as_ref()).await })
                .await?;
            // The app's own commit: a push that leaves the app alone rewrites nothing of it.
            let app_commit = revision.commit_for(&app.name);
            let previous = statuses.get(&app.name).map(AsRef::as_ref);
            let left_git = !manifests.apps.contains_key(&app.name);
            let synced = sync_one(cluster, app, app_commit, observed, previous, options, left_git)
                .instrument(info_span!("app", app = %app.name, commit = short_commit(app_commit)))
                .await?;
            // The shard lost during its sync: no report either, so that no
            // write-back, comment or notification follows from half a sync
            // even if the shard is held again by the time reports are made.
            let Some((report, kept)) = synced else {
                memo.forget(&app.name);
                return Ok(None);
            };
            match (inputs.get(app.name.as_str()), kept) {
                (Some(inputs), Some(status)) => memo.remember(*inputs, status, &report),
                _ => memo.forget(&app.name),
            }
            Ok(Some(report))
        };
        let mut reports = Vec::new();
        for app in first {
            reports.extend(one(app).await?);
        }
        // The other apps are independent of each other: a few at a time,
        // each to its end even when another fails.
        let rest = in_flight::each_to_its_end(rest, APP_CONCURRENCY, one).await?;
        reports.extend(rest.into_iter().flatten());
        memo.settle_written(&reports);
        let report = SyncReport {
            commit: revision.commit.clone(),
            apps: Arc::new(reports),
            kinds: memo.revision_kinds(revision.validated(), || kinds_of(manifests)),
            released: released_of(memo, revision, options),
            scoped: scope.is_some(),
            recalled: false,
        };
        let in_scope_count = manifests.apps.values().filter(in_scope).count() + gone.len();
        memo.remember_sync(inputs_read, &report, in_scope_count);
        Ok(report)
    }
    .instrument(span)
    .await
}

/// For each app: its answer from the last sync when nothing it reads
/// changed since (see [`SyncMemo`]), else the inputs its answer is
/// remembered under if it turns out to have nothing to do.
async fn recall_apps<'a>(
    cluster: &Cluster,
    revision: &Revision,
    apps: impl Iterator<Item = &'a App>,
    statuses: &BTreeMap<String, Arc<AppStatus>>,
    options: &SyncOptions,
    memo: &SyncMemo,
) -> (BTreeMap<&'a str, memo::Inputs>, BTreeMap<&'a str, AppReport>) {
    let mut inputs = BTreeMap::new();
    let mut recalled = BTreeMap::new();
    for app in apps {
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
    (inputs, recalled)
}

/// The apps this instance recorded a status for that Git no longer holds
/// (their directory was removed), in scope, when prune is on: each is
/// synced as an app without objects, so that what it made is pruned as an
/// object that left Git would be, and its status goes once nothing is left.
/// Without prune they are left as they are, objects and status. Only an app
/// whose status names this sync's source (repository, branch, path) is
/// pruned: a `sync --once` of another path under the same instance prunes
/// nothing of the agent's. Nor is an app that names no tenant where tenants
/// are required (it would be pruned as the agent). A revision without any
/// app prunes nothing (Argo CD's `allowEmpty: false`): a repository emptied
/// whole is more likely a mistake than a wish.
fn gone_apps(
    manifests: &crate::manifest::ManifestSet,
    statuses: &BTreeMap<String, Arc<AppStatus>>,
    scope: Option<&BTreeSet<String>>,
    options: &SyncOptions,
) -> Vec<App> {
    if !options.prune || manifests.apps.is_empty() || options.source.is_empty() {
        return Vec::new();
    }
    statuses
        .iter()
        .filter(|(name, status)| !manifests.apps.contains_key(*name) && status.source == options.source)
        // An app that may not write as the agent is not pruned as the agent.
        .filter(|(name, _)| options.tenant_problem(name).is_none())
        .map(|(name, _)| name)
        .filter(|name| scope.is_none_or(|apps| apps.contains(*name)))
        .map(|name| App {
            name: name.clone(),
            ..App::default()
        })
        .collect()
}

/// The keys of every object `apps` hold in Git (as [`RevisionKeys`] has
/// them) and of every object their statuses record: what a sync of those
/// apps alone reads of the live objects.
fn keys_of<'a>(
    apps: impl Iterator<Item = &'a App> + Clone,
    statuses: &BTreeMap<String, Arc<AppStatus>>,
    options: &SyncOptions,
) -> RevisionKeys {
    let manifests = apps.clone().flat_map(|app| app.manifests.iter());
    let mut keys = RevisionKeys::of(manifests, &options.allowed.default_namespace);
    let recorded = apps.filter_map(|app| statuses.get(&app.name));
    keys.extend(recorded.flat_map(|status| status.inventory.iter().map(InventoryEntry::key)));
    keys
}

/// Where the revision's Rollouts release which workloads, made once per revision.
fn released_of(memo: &SyncMemo, revision: &Revision, options: &SyncOptions) -> Arc<crate::rollout::overlay::Released> {
    memo.released(revision.validated(), || {
        crate::rollout::overlay::released_workloads(&revision.manifests, &options.allowed.default_namespace)
    })
}

/// Every (apiVersion, kind) the revision holds.
fn kinds_of(manifests: &crate::manifest::ManifestSet) -> BTreeSet<(String, String)> {
    let kinds: BTreeSet<&(String, String)> = manifests.apps.values().flat_map(|a| a.kinds()).collect();
    kinds.into_iter().cloned().collect()
}

/// One app: observe, plan, apply, report. With the report, the status it
/// recorded when that was already in place (nothing written); `None` when
/// the app's shard was lost during the sync.
async fn sync_one(
    cluster: &Cluster,
    app: &App,
    commit: &str,
    observed: &Observed<'_>,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
    left_git: bool,
) -> Result<Option<(AppReport, Option<AppStatus>)>> {
    let started = Instant::now();
    let previous_inventory = previous.map(|p| p.inventory.clone()).unwrap_or_default();
    let writer = cluster.writer_for(&app.name, options);
    let (mut report, inventory) = match reconcile_app(&writer, app, commit, observed, previous, options).await {
        Ok(Executed::Synced(report, inventory)) => (*report, inventory),
        Ok(Executed::Refused(result, problems)) => (report_of(app, result, problems), previous_inventory),
        // Only before the first write (observe, plan, the check): once
        // writing, the executor reports failures as problems, with the
        // inventory of what it wrote.
        Err(error) => (
            report_of(app, AppResult::Failed, vec![app_problem(app, error.to_string())]),
            previous_inventory,
        ),
    };
    // The status write is fenced too: it is refused once the shard is lost.
    let saved = if left_git && inventory.is_empty() && previous.is_some_and(|p| p.unreadable_inventory.is_none()) {
        // Nothing of it is left: neither is its status.
        AppStatus::remove(
            &writer.as_agent(),
            &options.state_namespace,
            &options.instance,
            &report.app,
        )
        .await
        .map(|()| (AppStatus::default(), true))
    } else {
        save_status(&writer.as_agent(), commit, &report, inventory, previous, options).await
    };
    // A shard lost at any point of the app's sync (even while its status
    // was being written): its new holder syncs it and records the status.
    if writer.fence_lost() {
        tracing::warn!(app = %app.name, "this replica lost the app's shard while syncing it: its status and report are left to the new holder");
        return Ok(None);
    }
    let (status, wrote) = saved?;
    report.duration = started.elapsed();
    log_report(&report);
    Ok(Some((report, (!wrote).then_some(status))))
}

/// Observe, then plan: everything decided, nothing written.
async fn observe_and_plan<'a>(
    cluster: &Cluster,
    app: &'a App,
    commit: &str,
    observed: &Observed<'_>,
    previous: Option<&'a AppStatus>,
    options: &'a SyncOptions,
    measure: bool,
) -> Result<std::result::Result<Prepared<'a>, Vec<Problem>>> {
    let app_observed = match observe_app(cluster, app, commit, observed, previous, options, measure).await? {
        Ok(app_observed) => app_observed,
        Err(problems) => return Ok(Err(problems)),
    };
    // Read only for objects that left Git.
    let no_keys = RevisionKeys::default();
    let revision = if app_observed.left_git.is_empty() {
        &no_keys
    } else {
        observed.revision_keys(&options.allowed.default_namespace)
    };
    let context = PlanContext {
        live: &observed.live,
        revision,
        instance: &options.instance,
        default_namespace: &options.allowed.default_namespace,
        prune: options.prune,
    };
    Ok(planner::plan(app_observed, &context))
}

/// The observe stage of one app: its objects resolved against the
/// cluster's kinds, its Rollouts read, and what left Git looked up. An app
/// whose manifests cannot be resolved, or would land where the agent may
/// not write, is refused here, before anything of it is read.
async fn observe_app<'a>(
    cluster: &Cluster,
    app: &'a App,
    commit: &str,
    observed: &Observed<'_>,
    previous: Option<&'a AppStatus>,
    options: &SyncOptions,
    measure: bool,
) -> Result<std::result::Result<AppObserved<'a>, Vec<Problem>>> {
    if !app.problems.is_empty() {
        return Ok(Err(app.problems.clone()));
    }
    let resolved = observe::resolve_app(cluster, app, &observed.crd_kinds, options).await;
    if !resolved.problems.is_empty() {
        return Ok(Err(resolved.problems));
    }
    // Pure, but first: nothing of an app that would land where the agent may
    // not write is read there (Rollouts, pods, analysis, hooks).
    let problems = plan::landing_problems(&resolved.objects, &options.allowed);
    if !problems.is_empty() {
        return Ok(Err(problems));
    }
    let rollouts = rollout::observe::observe_rollouts(
        cluster,
        &resolved.objects,
        commit,
        observed.history.as_ref(),
        &observed.written_back,
        options,
        measure,
    )
    .await?;
    let inventory = previous.map_or(&[][..], |p| &p.inventory[..]);
    let unreadable = previous.and_then(|p| p.unreadable_inventory.as_ref());
    let left_git = if options.prune && unreadable.is_none() {
        let entries = plan::left_git(
            &resolved.objects,
            &resolved.pending,
            inventory,
            &options.allowed.default_namespace,
        );
        observe::left_git(cluster, &entries).await
    } else {
        BTreeMap::new()
    };
    Ok(Ok(AppObserved {
        app: &app.name,
        objects: resolved.objects,
        pending: resolved.pending,
        rollouts,
        left_git,
        inventory,
        unreadable_inventory: unreadable.map(|u| u.error.as_str()),
    }))
}

async fn reconcile_app(
    writer: &Writer<'_>,
    app: &App,
    commit: &str,
    observed: &Observed<'_>,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
) -> Result<Executed> {
    let prepared = match observe_and_plan(writer.cluster(), app, commit, observed, previous, options, true).await? {
        Ok(prepared) => prepared,
        Err(problems) => return Ok(Executed::Refused(AppResult::Invalid, problems)),
    };
    let previous_inventory = previous.map_or(&[][..], |p| &p.inventory[..]);
    execute::apply(writer, app, prepared, &observed.live, previous_inventory, options).await
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
        problems,
        ..AppReport::new(&app.name, result)
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
    agent: &Writer<'_>,
    commit: &str,
    report: &AppReport,
    inventory: Vec<InventoryEntry>,
    previous: Option<&AppStatus>,
    options: &SyncOptions,
) -> Result<(AppStatus, bool)> {
    let status = AppStatus {
        app: report.app.clone(),
        source: options.source.clone(),
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
    status.save(agent, &options.state_namespace, &options.instance).await?;
    Ok((status, true))
}
