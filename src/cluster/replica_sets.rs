//! Which pod-template-hash each Deployment revision runs, kept by a
//! metadata-only watch of ReplicaSets where the revision's Rollouts release
//! a Deployment: a release step reads it from memory instead of listing its
//! namespace's ReplicaSets every time it is planned. Until the watch's list
//! is done (and in `sync --once`) the caller lists as before.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::Cluster;
use super::kept::Kept;
use crate::{Error, Result};

const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
const HASH_LABEL: &str = "pod-template-hash";

/// What a ReplicaSet says of the Deployment revision it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    owners: Vec<String>,
    revision: Option<String>,
    hash: String,
}

impl Held {
    pub fn of(meta: &ObjectMeta) -> Held {
        Held {
            owners: meta.owner_references.iter().flatten().map(|o| o.uid.clone()).collect(),
            revision: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(REVISION_ANNOTATION))
                .cloned(),
            hash: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(HASH_LABEL))
                .cloned()
                .unwrap_or_default(),
        }
    }
}

/// The ReplicaSets of the namespaces where a Rollout's Deployment runs, kept
/// by one watch per scope (all namespaces, or each one the agent is limited
/// to) however many Rollouts there are.
pub type ReplicaSets = Kept<Held>;

impl Kept<Held> {
    /// The pod-template-hash of the ReplicaSet `owner` (a Deployment's uid)
    /// made for `revision`, when a watch covering the namespace knows it.
    /// `None` (not listed yet, or no such ReplicaSet seen yet) asks the API server.
    pub fn hash_of(&self, namespace: &str, owner: &str, revision: Option<&str>) -> Option<String> {
        let revision = revision?;
        self.read(namespace, |sets| {
            sets.values()
                .find(|set| set.revision.as_deref() == Some(revision) && set.owners.iter().any(|uid| uid == owner))
                .map(|set| set.hash.clone())
        })?
    }
}

/// A Deployment as its ReplicaSets name it: its uid and current revision.
type Owner = (String, Option<String>);

fn owner(deployment: &Value) -> Owner {
    let uid = deployment["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let revision = deployment["metadata"]["annotations"][REVISION_ANNOTATION].as_str();
    (uid, revision.map(str::to_string))
}

/// The pod-template-hash each Deployment's current revision runs ("" for
/// none, or none found): from the watch when it knows them all, else from a
/// list of the namespace's ReplicaSets (its watch has not listed yet, or has
/// not seen a new revision's ReplicaSet yet).
pub async fn current_hashes<const N: usize>(
    cluster: &Cluster,
    namespace: &str,
    deployments: [Option<&Value>; N],
) -> Result<[String; N]> {
    let owners = deployments.map(|deployment| deployment.map(owner));
    let remembered = owners.each_ref().map(|owner| match owner {
        None => Some(String::new()),
        Some((uid, revision)) => cluster.replica_sets.hash_of(namespace, uid, revision.as_deref()),
    });
    if remembered.iter().all(Option::is_some) {
        return Ok(remembered.map(Option::unwrap_or_default));
    }
    let listed: Api<ReplicaSet> = Api::namespaced(cluster.client.clone(), namespace);
    let sets = listed
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing ReplicaSets in {namespace}")))?;
    let held: Vec<Held> = sets.items.iter().map(|set| Held::of(&set.metadata)).collect();
    Ok(owners.map(|owner| {
        let Some((uid, revision)) = owner else {
            return String::new();
        };
        held.iter()
            .find(|set| set.owners.contains(&uid) && set.revision == revision)
            .map(|set| set.hash.clone())
            .unwrap_or_default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::kept::place_of;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn set(name: &str, owner: &str, revision: &str, hash: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            owner_references: Some(vec![OwnerReference {
                uid: owner.into(),
                ..Default::default()
            }]),
            annotations: Some([(REVISION_ANNOTATION.to_string(), revision.to_string())].into()),
            labels: Some([(HASH_LABEL.to_string(), hash.to_string())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_revision_is_answered_by_the_replica_set_its_deployment_owns_once_the_watch_has_listed() {
        for scope in [None, Some("shop".to_string())] {
            let sets = ReplicaSets::default();
            let listed = |meta: ObjectMeta| sets.listed(&scope, place_of(&meta), Held::of(&meta));
            sets.list_started(&scope);
            listed(set("echo-1", "uid-echo", "1", "aaa"));
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("1")), None, "not listed yet");
            sets.list_done(&scope);
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("1")).as_deref(), Some("aaa"));
            // Another Deployment's ReplicaSet, another revision, another namespace: asked of the API server.
            assert_eq!(sets.hash_of("shop", "uid-other", Some("1")), None);
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("2")), None);
            assert_eq!(sets.hash_of("shop", "uid-echo", None), None);
            assert_eq!(sets.hash_of("other", "uid-echo", Some("1")), None);
            let changed = set("echo-2", "uid-echo", "2", "bbb");
            sets.changed(&scope, place_of(&changed), Held::of(&changed));
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("2")).as_deref(), Some("bbb"));
            sets.deleted(&scope, &place_of(&set("echo-1", "uid-echo", "1", "aaa")));
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("1")), None);
            sets.interrupted(&scope);
            assert_eq!(
                sets.hash_of("shop", "uid-echo", Some("2")),
                None,
                "a broken watch answers nothing"
            );
        }
    }
}
