//! The dry-run mode of the executor (`gitcanary diff`): what it keeps of
//! each answer of the walk is a diff (or the refusal the sync would meet).

use super::outcome::{DeleteAnswer, ObjectsStep, Outcome, Preview, WriteAnswer, released_already};
use super::*;
use crate::model::{Deletion, Resolved};
use crate::rollout::model::CanaryWrite;

/// The diff being made of an app's plan.
pub(super) struct Previewing<'l> {
    /// The sync's live objects: a delete is shown as they hold the object.
    live: &'l LiveObjects,
    preview: Preview,
    /// Problems by step, listed as the diff always listed them: the app's
    /// objects, canary writes, releases, then deletes.
    canary_problems: Vec<Problem>,
    release_problems: Vec<Problem>,
    delete_problems: Vec<Problem>,
}

impl<'l> Previewing<'l> {
    pub(super) fn new(live: &'l LiveObjects) -> Self {
        Previewing {
            live,
            preview: Preview::default(),
            canary_problems: Vec::new(),
            release_problems: Vec::new(),
            delete_problems: Vec::new(),
        }
    }

    /// A delete the sync would make, shown with the object it removes;
    /// none when the sync would find the object gone or changed (it then
    /// keeps it).
    async fn deleted(&mut self, cluster: &Cluster, deletion: &Deletion, answer: DeleteAnswer) {
        match answer {
            Ok(Deleted::Deleted) => {
                let shown = shown_deleted(cluster, deletion, self.live).await;
                let diff = ObjectDiff::between(deletion.key.clone(), String::new(), Some(&shown), None);
                self.preview.diffs.extend(diff);
            }
            Ok(_) => {}
            Err(error) => self.delete_problems.push(Problem {
                file: String::new(),
                line: 0,
                message: format!("deleting {}: {}", deletion.key, api_message(&error)),
            }),
        }
    }
}

impl Outcome for Previewing<'_> {
    const MODE: Mode = Mode::DryRun;
    type Done = Preview;

    async fn canary_written(&mut self, work: &RolloutWork, write: &CanaryWrite, answer: WriteAnswer) {
        let after = match answer {
            Ok(after) => serde_json::to_value(after).unwrap_or(Value::Null),
            // Its namespace does not exist yet: shown as planned.
            Err(kube::Error::Api(status)) if status.code == 404 => write.object.clone(),
            Err(e) => {
                let message = format!("{} refused by the API server: {}", write.key, api_message(&e));
                let file = work.app.clone();
                return self.canary_problems.push(Problem { file, line: 0, message });
            }
        };
        let diff = write_diff(write.key.clone(), work.source.clone(), write.live.as_ref(), &after);
        self.preview.diffs.push(diff);
    }

    async fn canary_deleted(&mut self, cluster: &Cluster, _: &RolloutWork, deletion: &Deletion, answer: DeleteAnswer) {
        self.deleted(cluster, deletion, answer).await;
    }

    /// Each write the check left shown with what the server would store
    /// (the check sent it as a dry run already: it is not sent again).
    async fn objects(&mut self, step: ObjectsStep<'_, '_>) -> std::result::Result<(), Vec<Problem>> {
        let cluster = step.cluster;
        let plan = &*step.plan;
        for &(index, _) in &plan.writes {
            let item = &plan.objects[index];
            // An object the sync adopts is not listed as ours: read it to show what changes.
            let before = match step.live.get(&item.key) {
                Some(object) => Some(object),
                None => match read_value(cluster, &item.resolved, item.namespace(), item.name()).await {
                    Ok(before) => before,
                    Err(error) => {
                        self.preview.problems.push(item.manifest.problem(api_message(&error)));
                        continue;
                    }
                },
            };
            // Not checked (its namespace does not exist yet): shown as Git has it.
            let after = step.answers.get(&index).unwrap_or(&item.desired);
            let diff = write_diff(item.key.clone(), item.manifest.location(), before.as_ref(), after);
            self.preview.diffs.push(diff);
        }
        for manifest in &plan.pending {
            let diff = write_diff(manifest.key(), manifest.location(), None, &manifest.object);
            self.preview.diffs.push(diff);
        }
        Ok(())
    }

    async fn pruned(&mut self, cluster: &Cluster, deletion: &Deletion, answer: DeleteAnswer) {
        self.deleted(cluster, deletion, answer).await;
    }

    async fn released(&mut self, cluster: &Cluster, entry: &InventoryEntry, release: Option<(Resolved, WriteAnswer)>) {
        let Some((resolved, answer)) = release else {
            return;
        };
        match answer {
            Ok(after) => {
                // A dry run changed nothing: what it shows as before is still there.
                let before = read_value(cluster, &resolved, entry.namespace.as_deref(), &entry.name)
                    .await
                    .ok()
                    .flatten();
                let after = serde_json::to_value(after).unwrap_or(Value::Null);
                let diff = write_diff(entry.key(), String::new(), before.as_ref(), &after);
                self.preview.diffs.push(diff);
            }
            // The sync would find it gone too: nothing to show.
            Err(e) if released_already(&e) => {}
            Err(e) => self.release_problems.push(Problem {
                file: String::new(),
                line: 0,
                message: format!("releasing {}: {}", entry.key(), api_message(&e)),
            }),
        }
    }

    async fn done(mut self, _: AppPlan<'_>, _: Vec<RolloutWork>) -> Preview {
        let problems = &mut self.preview.problems;
        problems.append(&mut self.canary_problems);
        problems.append(&mut self.release_problems);
        problems.append(&mut self.delete_problems);
        self.preview
    }
}

/// A deleted object as the sync's live objects hold it; read only when
/// they do not.
async fn shown_deleted(cluster: &Cluster, deletion: &Deletion, live: &LiveObjects) -> Value {
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
    shown.unwrap_or_else(|| json!({"metadata": {"name": deletion.key.name, "uid": deletion.uid}}))
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
    resolved: &Resolved,
    namespace: Option<&str>,
    name: &str,
) -> std::result::Result<Option<Value>, kube::Error> {
    let object = cluster.api(resolved, namespace).get_opt(name).await?;
    Ok(object.map(|o| serde_json::to_value(o).unwrap_or(Value::Null)))
}
