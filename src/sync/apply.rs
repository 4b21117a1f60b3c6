//! The apply mode of the executor (the sync): what it keeps of each answer
//! of the walk is the app's report and the inventory of what it wrote. The
//! app's objects are applied in stages (Namespaces and CRDs first), a new
//! app that failed is taken back, and the Rollouts' reports come last.

use super::outcome::{Adoption, DeleteAnswer, ObjectsStep, Outcome, WriteAnswer, release_target, released_already};
use super::*;
use crate::model::{Deletion, Resolved};
use crate::rollout::model::CanaryWrite;

/// The sync being made of an app's plan: its report, and what it wrote.
pub(super) struct Synced<'r, 'w> {
    /// The app's writer: the app's objects are applied by this outcome.
    writer: &'r Writer<'w>,
    app: &'r App,
    /// The app's inventory as the last sync left it.
    previous: &'r [InventoryEntry],
    report: AppReport,
    failures: Vec<Problem>,
    applied: Applied,
    /// Prunes and releases that failed: after the plan's own problems in the report.
    prune_failures: Vec<Problem>,
    /// What left Git but stays recorded: a prune refused, an object that
    /// changed since it was read, a release whose kind is gone.
    still_held: Vec<InventoryEntry>,
}

impl<'r, 'w> Synced<'r, 'w> {
    pub(super) fn new(writer: &'r Writer<'w>, app: &'r App, previous: &'r [InventoryEntry]) -> Self {
        Synced {
            writer,
            app,
            previous,
            report: report_of(app, AppResult::Synced, Vec::new()),
            failures: Vec::new(),
            applied: Applied::default(),
            prune_failures: Vec::new(),
            still_held: Vec::new(),
        }
    }
}

impl Outcome for Synced<'_, '_> {
    const MODE: Mode = Mode::Apply;
    type Done = (AppReport, Vec<InventoryEntry>);

    async fn canary_written(&mut self, work: &RolloutWork, write: &CanaryWrite, answer: WriteAnswer) {
        match answer {
            Ok(_) => self.report.canary_applied.push(write.key.clone()),
            Err(error) => {
                let message = format!("applying {}: {}", write.key, api_message(&error));
                self.failures.push(rollout_problem(self.app, work, &message));
            }
        }
    }

    async fn canary_deleted(&mut self, _: &Cluster, work: &RolloutWork, deletion: &Deletion, answer: DeleteAnswer) {
        match answer {
            Ok(Deleted::Deleted) => self.report.canary_deleted.push(deletion.key.clone()),
            Ok(_) => {}
            Err(error) => {
                let message = format!("deleting {}: {}", deletion.key, api_message(&error));
                self.failures.push(rollout_problem(self.app, work, &message));
            }
        }
    }

    /// Applied in stages; a new app that failed is taken back whole.
    async fn objects(&mut self, step: ObjectsStep<'_, '_>) -> std::result::Result<(), Vec<Problem>> {
        let ObjectsStep {
            plan,
            live,
            adoption,
            options,
            ..
        } = step;
        let writer = self.writer;
        self.applied = apply_objects(writer, plan, live, adoption, options, &mut self.failures).await;
        let applied = &self.applied;
        if plan.fresh && !self.failures.is_empty() {
            take_back(writer, &plan.objects, &applied.results, adoption.started).await;
            let mut failures = std::mem::take(&mut self.failures);
            failures.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
            return Err(failures);
        }
        self.report.unchanged = plan.objects.len() - applied.written.len();
        for &index in &applied.written {
            if applied.results[index].is_null() {
                continue;
            }
            let key = plan.objects[index].key.clone();
            if plan.writes.contains(&(index, Reason::Drift)) {
                self.report.drifted.push(key.clone());
            }
            self.report.applied.push(key);
        }
        Ok(())
    }

    async fn pruned(&mut self, _: &Cluster, deletion: &Deletion, answer: DeleteAnswer) {
        match answer {
            Ok(Deleted::Deleted) => self.report.pruned.push(deletion.key.clone()),
            Ok(Deleted::Gone) => {}
            // Another app took it over, or someone re-created it: keep tracking it.
            Ok(Deleted::Changed) => self.still_held.push(deletion.inventory_entry()),
            Err(error) => {
                let message = format!("pruning {}: {}", deletion.key, api_message(&error));
                self.prune_failures.push(app_problem(self.app, message));
                self.still_held.push(deletion.inventory_entry());
            }
        }
    }

    async fn released(&mut self, _: &Cluster, entry: &InventoryEntry, release: Option<(Resolved, WriteAnswer)>) {
        match release {
            Some((_, Ok(_))) => self.report.released.push(entry.key()),
            // Deleted, or made anew by another, since observe: nothing of
            // gitcanary's left on the object it recorded.
            Some((_, Err(error))) if released_already(&error) => {
                tracing::debug!(object = %entry.key(), error = %api_message(&error), "the released object is gone");
            }
            // Still holding gitcanary's fields: recorded, and released by a later sync.
            Some((_, Err(error))) => {
                let message = format!("releasing {}: {}", entry.key(), api_message(&error));
                self.prune_failures.push(app_problem(self.app, message));
                self.still_held.push(entry.clone());
            }
            None => self.still_held.push(entry.clone()),
        }
    }

    /// The inventory to record: what Git holds now (adopted or created),
    /// plus what left Git but was not pruned; then each rollout's report,
    /// written last, once, saying what this sync did.
    async fn done(mut self, mut plan: AppPlan<'_>, rollouts: Vec<RolloutWork>) -> Self::Done {
        let applied = &self.applied;
        let previous = self.previous;
        let was_adopted =
            |key: &ObjectKey| applied.adopted.contains(key) || previous.iter().any(|e| e.adopted && e.key() == *key);
        let mut inventory: Vec<InventoryEntry> = plan
            .objects
            .iter()
            .map(|item| item.inventory_entry(was_adopted(&item.key)))
            .collect();
        inventory.append(&mut plan.kept);
        inventory.append(&mut self.still_held);
        inventory.sort();
        self.failures.append(&mut plan.problems);
        self.failures.append(&mut self.prune_failures);
        let mut report = self.report;
        finish_rollouts(self.writer, self.app, &rollouts, &mut report, &mut self.failures).await;
        report.health = if self.applied.results.iter().all(plan::is_healthy) {
            "Healthy".to_string()
        } else {
            "Progressing".to_string()
        };
        if !self.failures.is_empty() {
            report.problems = self.failures;
            report.result = AppResult::Failed;
        }
        (report, inventory)
    }
}

/// What the staged apply did to an app's objects.
#[derive(Default)]
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
) -> Applied {
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
    applied
}

/// After everything else is written: each rollout's batch labels, status
/// and Events.
async fn finish_rollouts(
    writer: &Writer<'_>,
    app: &App,
    rollouts: &[RolloutWork],
    report: &mut AppReport,
    failures: &mut Vec<Problem>,
) {
    let agent = writer.as_agent();
    for work in rollouts {
        if let Err(error) = rollout::report::finish(&agent, work).await {
            failures.push(rollout_problem(app, work, &error.to_string()));
        }
    }
    report.requeue = rollouts.iter().map(|w| w.requeue()).fold(None, Requeue::sooner);
    report.writebacks = rollouts.iter().filter_map(crate::writeback::Request::of).collect();
    report.rollouts = rollouts.iter().map(|w| w.summary()).collect();
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
                    release(writer, &item.resolved, item, &answer).await;
                    problems.push(item.manifest.problem(message));
                }
            },
            Err(problem) => problems.push(problem),
        }
    }
    problems
}

/// Removes gitcanary's fields (its label and annotations among them) from an
/// object it does not keep, by applying an empty configuration to the
/// object `applied` (the answer to this sync's write) names.
async fn release(writer: &Writer<'_>, resolved: &Resolved, item: &Planned<'_>, applied: &Value) {
    let Some(meta) = LiveMeta::of(applied) else {
        return; // no object named: nothing of gitcanary's on one
    };
    let empty = release_target(&item.inventory_entry(false), &meta.uid);
    match writer.apply(resolved, &empty, false, Mode::Apply).await {
        Err(error) if !released_already(&error) => {
            warn!(object = %item.key, error = %api_message(&error), "could not take back gitcanary's fields");
        }
        _ => {}
    }
}

/// Takes back what this sync did to a fresh app that failed, newest first:
/// deletes the objects it created (gitcanary their only field manager,
/// created after the sync began), and from an object that someone else
/// made it removes gitcanary's fields by applying an empty configuration.
async fn take_back(writer: &Writer<'_>, objects: &[Planned<'_>], results: &[Value], started: jiff::Timestamp) {
    for (index, applied) in results.iter().enumerate().rev() {
        let Some(meta) = LiveMeta::of(applied) else {
            continue; // not applied by this sync
        };
        let item = &objects[index];
        if !plan::made_by_this_sync(applied, started) {
            release(writer, &item.resolved, item, applied).await;
            continue;
        }
        let deletion = crate::model::Deletion {
            resource_version: None,
            ..crate::model::Deletion::of(item.manifest.api_version(), item.key.clone(), &meta)
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
