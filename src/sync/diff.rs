//! `gitcanary diff`: the same observe and plan as a sync, executed as a
//! dry run.

use super::execute;
use super::*;

/// What the next sync would change, without changing anything: the same
/// observe, plan and executor as `sync`, run dry. Lists exactly the
/// objects the next sync would write or delete, and the notes a reader
/// needs to read them (fields left to an autoscaler).
pub async fn diff(
    cluster: &Cluster,
    revision: &Revision,
    options: &SyncOptions,
) -> Result<(Vec<ObjectDiff>, Vec<Problem>, Vec<String>)> {
    let mut revision = revision.clone();
    validate_revision(&mut revision, options);
    let memo = SyncMemo::default();
    let observed = observe_revision(cluster, &revision, options, &memo, None).await?;
    let statuses = AppStatus::load_all(cluster, &options.state_namespace, &options.instance).await?;
    let mut diffs = Vec::new();
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let gone = gone_apps(&revision.manifests, &statuses, None, options);
    for app in revision.manifests.apps.values().chain(&gone) {
        let previous = statuses.get(&app.name).map(AsRef::as_ref);
        let commit = revision.commit_for(&app.name);
        match observe_and_plan(cluster, app, commit, &observed, previous, options, false).await? {
            Ok(prepared) => {
                notes.extend(prepared.autoscaled.iter().map(ToString::to_string));
                problems.extend(prepared.plan.problems.iter().cloned());
                let writer = cluster.writer(options.tenant_of(&app.name));
                let inventory = previous.map_or(&[][..], |p| &p.inventory[..]);
                let preview = execute::dry_run(&writer, prepared, &observed.live, inventory, options).await?;
                diffs.extend(preview.diffs);
                problems.extend(preview.problems);
            }
            Err(app_problems) => problems.extend(app_problems),
        }
    }
    diffs.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((diffs, problems, notes))
}
