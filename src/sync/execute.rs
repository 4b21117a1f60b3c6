//! The one executor of an app's plan: `execute` walks it once, in the
//! order the sync writes it, in either mode. It begins with the check
//! (every write dry-run, the adoption rule applied); then the canary
//! objects, the canary routes no longer wanted, the app's objects, the other
//! canary objects no longer wanted, prunes and releases, each write and
//! delete sent in the walk's mode. `Mode::Apply` is the sync, `Mode::DryRun`
//! is `gitcanary diff`, so a diff meets exactly the refusals and
//! preconditions a sync would. What a mode keeps of each answer is its
//! [`Outcome`]'s: the sync's report and inventory (`apply::Synced`), or the
//! diff's changes (`preview::Previewing`). One step differs by mode: the
//! sync applies the app's objects in stages (Namespaces and CRDs first),
//! while the diff shows the check's answers for them, the dry run of those
//! very writes. Nothing after the check returns an error: a failure is a
//! problem, kept with what was written.

use super::apply::Synced;
use super::outcome::{Adoption, ObjectsStep, Outcome, Preview, release_target};
use super::preview::Previewing;
use super::*;
use crate::model::Deletion;

/// What applying an app's plan did.
pub(super) enum Executed {
    /// Applied (perhaps in part): the report and the inventory to record.
    Synced(Box<AppReport>, Vec<InventoryEntry>),
    /// Nothing applied (or all taken back): the app keeps the inventory it had.
    Refused(AppResult, Vec<Problem>),
}

/// The sync: the plan checked, then applied in order.
pub(super) async fn apply(
    writer: &Writer<'_>,
    app: &App,
    prepared: Prepared<'_>,
    live: &LiveObjects,
    previous: &[InventoryEntry],
    options: &SyncOptions,
) -> Result<Executed> {
    let synced = Synced::new(writer, app, previous);
    Ok(
        match execute(writer, prepared, live, previous, options, synced).await? {
            Ok((report, inventory)) => Executed::Synced(Box::new(report), inventory),
            Err(problems) => Executed::Refused(AppResult::Invalid, problems),
        },
    )
}

/// `gitcanary diff`: the same walk, every write and delete a dry run.
pub(super) async fn dry_run(
    writer: &Writer<'_>,
    prepared: Prepared<'_>,
    live: &LiveObjects,
    previous: &[InventoryEntry],
    options: &SyncOptions,
) -> Result<Preview> {
    let previewing = Previewing::new(live);
    Ok(
        match execute(writer, prepared, live, previous, options, previewing).await? {
            Ok(preview) => preview,
            // The sync would write nothing of the app: neither does the diff list anything.
            Err(problems) => Preview {
                diffs: Vec::new(),
                problems,
            },
        },
    )
}

/// The walk. An error is returned only by the check, before any write.
async fn execute<O: Outcome>(
    writer: &Writer<'_>,
    prepared: Prepared<'_>,
    live: &LiveObjects,
    previous: &[InventoryEntry],
    options: &SyncOptions,
    mut outcome: O,
) -> Result<std::result::Result<O::Done, Vec<Problem>>> {
    let adoption = adoption(previous, options);
    let Prepared { mut plan, rollouts, .. } = prepared;
    let answers = match check(writer, &plan, live, &adoption, options).await? {
        Err(problems) => return Ok(Err(problems)),
        Ok(answers) => answers,
    };
    plan.settle(&answers, live);
    // Canary objects first, so that a route never names a canary Service that does not exist yet.
    for work in &rollouts {
        for write in &work.canary_writes {
            let answer = writer.apply(&write.resolved, &write.object, write.ours, O::MODE).await;
            outcome.canary_written(work, write, answer).await;
        }
    }
    // Canary routes no longer wanted go before anything else is written: an
    // abort's traffic is back on stable as soon as it can be.
    delete_canary_objects(writer, &rollouts, |work| &work.route_deletions, &mut outcome).await;
    let cluster = writer.cluster();
    let step = ObjectsStep {
        cluster,
        plan: &mut plan,
        live,
        adoption: &adoption,
        answers: &answers,
        options,
    };
    if let Err(problems) = outcome.objects(step).await {
        return Ok(Err(problems));
    }
    // Routes are back on stable by now (the canary Ingresses went before the
    // app's objects, Git's HTTPRoutes were among them): the other canary
    // objects no longer wanted go, then what left Git.
    delete_canary_objects(writer, &rollouts, |work| &work.canary_deletions, &mut outcome).await;
    for deletion in &plan.prunes {
        let answer = writer.delete(deletion, O::MODE).await;
        outcome.pruned(cluster, deletion, answer).await;
    }
    for release in &plan.releases {
        let entry = &release.entry;
        let answer = match cluster.resolve(&entry.api_version, &entry.kind).await {
            Some(resolved) => {
                let target = release_target(entry, &release.uid);
                let answer = writer.apply(&resolved, &target, false, O::MODE).await;
                Some((resolved, answer))
            }
            None => None,
        };
        outcome.released(cluster, entry, answer).await;
    }
    Ok(Ok(outcome.done(plan, rollouts).await))
}

/// Deletes each rollout's canary objects that `chosen` names, in the order planned.
async fn delete_canary_objects<O: Outcome>(
    writer: &Writer<'_>,
    rollouts: &[RolloutWork],
    chosen: impl Fn(&RolloutWork) -> &Vec<Deletion>,
    outcome: &mut O,
) {
    for work in rollouts {
        for deletion in chosen(work) {
            let answer = writer.delete(deletion, O::MODE).await;
            outcome.canary_deleted(writer.cluster(), work, deletion, answer).await;
        }
    }
}

fn adoption<'p>(previous: &'p [InventoryEntry], options: &SyncOptions) -> Adoption<'p> {
    Adoption {
        started: jiff::Timestamp::now(),
        previous,
        adopt_all: options.adopt,
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

/// The check, before anything is written: every write dry-run, the
/// adoption rule applied to each object the server would create. The API
/// server validates a fresh app's objects too: one of them may be someone
/// else's object, which must be refused before gitcanary's fields are
/// merged into it. (Objects in a namespace this revision creates cannot
/// exist yet, and are not checked.) Returns the server's answer for each
/// write it checked (what it would store), or the refusals.
async fn check(
    writer: &Writer<'_>,
    plan: &AppPlan<'_>,
    live: &LiveObjects,
    adoption: &Adoption<'_>,
    options: &SyncOptions,
) -> Result<Result<BTreeMap<usize, Value>, Vec<Problem>>> {
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
            Ok(answer) => {
                let answer = serde_json::to_value(answer).unwrap_or(Value::Null);
                match ours {
                    true => Ok(answer),
                    false => match adoption.creation(item, &answer) {
                        plan::Creation::Refused(message) => Err(item.manifest.problem(message)),
                        plan::Creation::Created | plan::Creation::Adopted => Ok(answer),
                    },
                }
            }
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
            Ok(answer) => {
                answers.insert(index, answer);
            }
            Err(problem) => problems.push(problem),
        }
    }
    problems.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Ok(if problems.is_empty() {
        Ok(answers)
    } else {
        Err(problems)
    })
}

pub(super) fn refused(item: &Planned<'_>, error: &kube::Error) -> Problem {
    item.manifest.problem(format!(
        "{} refused by the API server: {}",
        item.key,
        api_message(error)
    ))
}
