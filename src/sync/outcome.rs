//! What the executor's walk hands each mode (see `execute`): the answer
//! of each write and delete, step by step, and the rule that decides
//! whether an object written as new may be taken over.

use super::*;
use crate::model::{Deletion, Resolved};
use crate::rollout::model::CanaryWrite;
use kube::api::DynamicObject;

/// What a dry run of an app's plan would change, and what it would refuse.
#[derive(Default)]
pub(super) struct Preview {
    pub diffs: Vec<ObjectDiff>,
    pub problems: Vec<Problem>,
}

/// What one mode keeps of the walk's answers, step by step. Only the walk
/// writes, in `MODE`; an outcome is handed the cluster, for reads. (The
/// sync's outcome holds the app's writer for the one step the walk leaves
/// to it: the app's objects, applied in stages, which the diff shows from
/// the check's answers instead.)
pub(super) trait Outcome {
    const MODE: Mode;
    type Done;
    async fn canary_written(&mut self, work: &RolloutWork, write: &CanaryWrite, answer: WriteAnswer);
    async fn canary_deleted(
        &mut self,
        cluster: &Cluster,
        work: &RolloutWork,
        deletion: &Deletion,
        answer: DeleteAnswer,
    );
    /// The app's objects, with the check's answers; `Err`: the app is
    /// refused whole (a new app that failed, taken back).
    async fn objects(&mut self, step: ObjectsStep<'_, '_>) -> std::result::Result<(), Vec<Problem>>;
    async fn pruned(&mut self, cluster: &Cluster, deletion: &Deletion, answer: DeleteAnswer);
    /// An adopted Namespace that left Git, with the write that releases it;
    /// none when its kind is no longer served.
    async fn released(&mut self, cluster: &Cluster, entry: &InventoryEntry, release: Option<(Resolved, WriteAnswer)>);
    async fn done(self, plan: AppPlan<'_>, rollouts: Vec<RolloutWork>) -> Self::Done;
}

pub(super) type WriteAnswer = std::result::Result<DynamicObject, kube::Error>;
pub(super) type DeleteAnswer = std::result::Result<Deleted, kube::Error>;

/// What the app's objects step is given.
pub(super) struct ObjectsStep<'s, 'p> {
    pub cluster: &'s Cluster,
    pub plan: &'s mut AppPlan<'p>,
    pub live: &'s LiveObjects,
    pub adoption: &'s Adoption<'s>,
    /// The check's answer for each write it checked.
    pub answers: &'s BTreeMap<usize, Value>,
    pub options: &'s SyncOptions,
}

/// The object an inventory entry names, with nothing else: applied, it
/// releases the object (gitcanary's fields removed, the object kept). Its
/// uid is a precondition: an object deleted since is not created again,
/// and one made anew under the name is not touched.
pub(super) fn release_target(entry: &InventoryEntry, uid: &str) -> Value {
    let mut object = json!({
        "apiVersion": entry.api_version,
        "kind": entry.kind,
        "metadata": {"name": entry.name, "uid": uid},
    });
    if let Some(namespace) = &entry.namespace {
        object["metadata"]["namespace"] = json!(namespace);
    }
    object
}

/// Whether a release's refusal says that the object it was for is no
/// longer there: nothing to give back. The API server answers a uid that
/// no object has with 409 ("uid mismatch"), and one that another object
/// under the name has with 422 (`metadata.uid` is immutable). Any other
/// refusal (an admission webhook's 409, say) leaves the release owed.
pub(super) fn released_already(error: &kube::Error) -> bool {
    let kube::Error::Api(status) = error else {
        return false;
    };
    match status.code {
        404 => true,
        409 => status.message.contains("uid mismatch"),
        422 => status.message.contains("metadata.uid"),
        _ => false,
    }
}

/// What decides whether an object written as new may be taken over.
pub(super) struct Adoption<'a> {
    /// When the sync began: an object created before is not gitcanary's new one.
    pub started: jiff::Timestamp,
    /// The app's inventory as the last sync left it.
    pub previous: &'a [InventoryEntry],
    /// `--adopt`: take over every existing object (a migration).
    pub adopt_all: bool,
}

impl Adoption<'_> {
    pub(super) fn creation(&self, item: &Planned<'_>, answer: &Value) -> plan::Creation {
        plan::creation(item, answer, self.started, self.previous, self.adopt_all)
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    #[test]
    fn a_release_names_the_object_observe_found_by_its_uid() {
        let entry = InventoryEntry {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            namespace: None,
            name: "team".into(),
            adopted: true,
        };
        assert_eq!(
            release_target(&entry, "uid-1"),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "uid": "uid-1"}}),
            "nothing else of the object: applied, gitcanary owns none of its fields"
        );
    }

    #[test]
    fn a_release_refused_because_its_object_is_gone_has_nothing_left_to_give_back() {
        // The API server's answers, as kubectl showed them (v1.36).
        let refusal = |code, message: &str| kube::Error::Api(Box::new(Status::failure(message, "").with_code(code)));
        let deleted = refusal(
            409,
            "Operation cannot be fulfilled on namespaces \"team\": uid mismatch: the provided object specified uid uid-1, and no existing object was found",
        );
        let made_anew = refusal(
            422,
            "Namespace \"team\" is invalid: metadata.uid: Invalid value: \"uid-1\": field is immutable",
        );
        assert!(released_already(&deleted));
        assert!(released_already(&made_anew));
        assert!(released_already(&refusal(404, "namespaces \"team\" not found")));
        // Anything else is a release still owed: kept, and tried again.
        assert!(!released_already(&refusal(422, "metadata.labels: Invalid value")));
        assert!(!released_already(&refusal(
            409,
            "admission webhook \"guard\" denied the request"
        )));
        assert!(!released_already(&refusal(403, "forbidden")));
        assert!(!released_already(&refusal(500, "etcd timed out")));
        assert!(!released_already(&kube::Error::LinesCodecMaxLineLengthExceeded));
    }
}
