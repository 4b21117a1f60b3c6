//! `gitcanary diff`: the same observe and plan as a sync, applied as a dry
//! run.

use super::apply::{refused, release_target};
use super::*;

/// What the next sync would change, without changing anything: the same
/// observe and plan as `sync`, applied as a dry run. Lists exactly the
/// objects the next sync would write or delete, and the notes a reader
/// needs to read them (fields left to an autoscaler).
pub async fn diff(
    cluster: &Cluster,
    revision: &Revision,
    options: &SyncOptions,
) -> Result<(Vec<ObjectDiff>, Vec<Problem>, Vec<String>)> {
    let mut revision = revision.clone();
    validate_revision(&mut revision, options);
    let observed = observe_revision(cluster, &revision, options, &SyncMemo::default()).await?;
    let statuses = AppStatus::load_all(cluster, &options.state_namespace, &options.instance).await?;
    let mut diffs = Vec::new();
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for app in revision.manifests.apps.values() {
        let previous = statuses.get(&app.name).map(AsRef::as_ref);
        let commit = revision.commit_for(&app.name);
        match observe_and_plan(cluster, app, commit, &observed, previous, options, false).await? {
            Ok(prepared) => {
                notes.extend(prepared.autoscaled.iter().map(ToString::to_string));
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
    Ok((diffs, problems, notes))
}

/// The apply stage of `diff`: each write dry-run through the one apply path,
/// each delete shown with the object it would remove.
pub(super) async fn dry_run_diff(
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
