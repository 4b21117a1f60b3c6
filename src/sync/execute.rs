//! The one executor of an app's plan, in two modes that share its check.
//! `apply` is the sync: the API server checks every write first, then the
//! plan is applied in order (see `apply_checked`). `dry_run` is `gitcanary
//! diff`: the same check, with the same adoption rule, then every other
//! write and every delete sent as a dry run, so that a diff lists exactly
//! what the sync would write or delete and the refusals it would meet. Each
//! mode answers in its own type: a sync never holds a preview, a diff never
//! an inventory.

use super::apply::{Adoption, apply_checked, release_target};
use super::*;

/// What applying an app's plan did.
pub(super) enum Executed {
    /// Applied (perhaps in part): the report and the inventory to record.
    Synced(Box<AppReport>, Vec<InventoryEntry>),
    /// Nothing applied (or all taken back): the app keeps the inventory it had.
    Refused(AppResult, Vec<Problem>),
}

/// What a dry run of an app's plan would change, and what it would refuse.
#[derive(Default)]
pub(super) struct Preview {
    pub diffs: Vec<ObjectDiff>,
    pub problems: Vec<Problem>,
}

/// The sync: the plan checked, then applied in order.
pub(super) async fn apply(
    writer: &Writer<'_>,
    app: &App,
    mut prepared: Prepared<'_>,
    live: &LiveObjects,
    previous: &[InventoryEntry],
    options: &SyncOptions,
) -> Result<Executed> {
    let adoption = adoption(previous, options);
    match check(writer, &prepared.plan, live, &adoption, options).await? {
        Err(problems) => Ok(Executed::Refused(AppResult::Invalid, problems)),
        Ok(answers) => {
            prepared.plan.settle(&answers, live);
            Ok(apply_checked(writer, app, prepared, live, &adoption, options).await)
        }
    }
}

/// `gitcanary diff`: the same check as the sync's, then the rest of the
/// plan sent as a dry run.
pub(super) async fn dry_run(
    writer: &Writer<'_>,
    mut prepared: Prepared<'_>,
    live: &LiveObjects,
    previous: &[InventoryEntry],
    options: &SyncOptions,
) -> Result<Preview> {
    let adoption = adoption(previous, options);
    match check(writer, &prepared.plan, live, &adoption, options).await? {
        // The sync would write nothing of the app: neither does the diff list anything.
        Err(problems) => Ok(Preview {
            diffs: Vec::new(),
            problems,
        }),
        Ok(answers) => {
            prepared.plan.settle(&answers, live);
            Ok(preview(writer, &prepared, live, &answers).await)
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

/// The rest of the plan sent as a dry run: each write the check left shown
/// with what the server would store, every canary write, release and
/// delete (with the same preconditions as the sync's) dry-run in turn.
async fn preview(
    writer: &Writer<'_>,
    prepared: &Prepared<'_>,
    live: &LiveObjects,
    answers: &BTreeMap<usize, Value>,
) -> Preview {
    let cluster = writer.cluster();
    let plan = &prepared.plan;
    let mut diffs = Vec::new();
    let mut problems = Vec::new();
    for &(index, _) in &plan.writes {
        let item = &plan.objects[index];
        // An object the sync adopts is not listed as ours: read it to show what changes.
        let before = match live.get(&item.key) {
            Some(object) => Some(object),
            None => match read_value(cluster, &item.resolved, item.namespace(), item.name()).await {
                Ok(before) => before,
                Err(error) => {
                    problems.push(item.manifest.problem(api_message(&error)));
                    continue;
                }
            },
        };
        // Not checked (its namespace does not exist yet): shown as Git has it.
        let after = answers.get(&index).unwrap_or(&item.desired);
        diffs.push(write_diff(
            item.key.clone(),
            item.manifest.location(),
            before.as_ref(),
            after,
        ));
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
        .flat_map(|w| w.route_deletions.iter().chain(&w.canary_deletions))
        .chain(plan.prunes.iter());
    for deletion in deletions {
        match deletion_diff(writer, deletion, live).await {
            Ok(diff) => diffs.extend(diff),
            Err(error) => problems.push(Problem {
                file: String::new(),
                line: 0,
                message: format!("deleting {}: {}", deletion.key, api_message(&error)),
            }),
        }
    }
    Preview { diffs, problems }
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

/// A delete the sync would make, dry-run with its preconditions and shown
/// with the object it removes; none when the sync would find the object
/// gone or changed (it then keeps it).
async fn deletion_diff(
    writer: &Writer<'_>,
    deletion: &crate::model::Deletion,
    live: &LiveObjects,
) -> Result<Option<ObjectDiff>, kube::Error> {
    if writer.delete(deletion, Mode::DryRun).await? != Deleted::Deleted {
        return Ok(None);
    }
    let cluster = writer.cluster();
    // Shown as the sync's live objects hold it; read only when they do not.
    let shown = match live.get(&deletion.key) {
        Some(object) => Some(object),
        None => match cluster.resolve(&deletion.api_version, &deletion.key.kind).await {
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
        },
    };
    let shown = shown.unwrap_or_else(|| json!({"metadata": {"name": deletion.key.name, "uid": deletion.uid}}));
    Ok(ObjectDiff::between(
        deletion.key.clone(),
        String::new(),
        Some(&shown),
        None,
    ))
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
    resolved: &crate::model::Resolved,
    namespace: Option<&str>,
    name: &str,
) -> std::result::Result<Option<Value>, kube::Error> {
    let object = cluster.api(resolved, namespace).get_opt(name).await?;
    Ok(object.map(|o| serde_json::to_value(o).unwrap_or(Value::Null)))
}
