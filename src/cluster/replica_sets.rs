//! Which pod-template-hash each Deployment revision runs, kept by a
//! metadata-only watch of ReplicaSets once a Rollout's Deployment needs it:
//! a release step reads it from memory instead of listing its namespace's
//! ReplicaSets every time it is planned. The agent starts the watch after
//! the first sync that asks; until its list is done (and in `sync --once`)
//! the caller lists as before.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::Cluster;
use crate::{Error, Result};

const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
const HASH_LABEL: &str = "pod-template-hash";

/// What a ReplicaSet says of the Deployment revision it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    owners: Vec<String>,
    revision: Option<String>,
    hash: String,
}

impl Held {
    fn of(meta: &ObjectMeta) -> Held {
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

/// What one watch keeps: all namespaces (`None`) or one.
#[derive(Default)]
struct Watched {
    /// The watch's list is done and nothing broke it since.
    listed: bool,
    /// By namespace, then name: a lookup reads one namespace's.
    sets: HashMap<String, HashMap<String, Held>>,
    /// What a list in progress has found so far.
    listing: HashMap<String, HashMap<String, Held>>,
}

fn namespace_and_name(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The ReplicaSets of the namespaces where a Rollout's Deployment runs, by
/// the scope of the watch that keeps them: the agent watches where it
/// watches the kinds it manages (all namespaces, or each one it is limited
/// to), one watch per scope however many Rollouts there are.
#[derive(Default)]
pub struct ReplicaSets {
    wanted: Mutex<BTreeSet<String>>,
    scopes: Mutex<HashMap<Option<String>, Watched>>,
}

impl ReplicaSets {
    /// A sync needs the namespace's ReplicaSets: the agent keeps them from then on.
    pub fn want(&self, namespace: &str) {
        let mut wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
        if !wanted.contains(namespace) {
            wanted.insert(namespace.to_string());
        }
    }

    /// The namespaces a sync asked for.
    pub fn wanted(&self) -> BTreeSet<String> {
        self.wanted.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The pod-template-hash of the ReplicaSet `owner` (a Deployment's uid)
    /// made for `revision`, when a watch covering the namespace knows it.
    /// `None` (not listed yet, or no such ReplicaSet seen yet) asks the API server.
    pub fn hash_of(&self, namespace: &str, owner: &str, revision: Option<&str>) -> Option<String> {
        let revision = revision?;
        let scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        let watched = [Some(namespace.to_string()), None]
            .iter()
            .find_map(|scope| scopes.get(scope).filter(|w| w.listed))?;
        let set = watched
            .sets
            .get(namespace)?
            .values()
            .find(|set| set.revision.as_deref() == Some(revision) && set.owners.iter().any(|uid| uid == owner))?;
        Some(set.hash.clone())
    }

    fn with(&self, scope: &Option<String>, change: impl FnOnce(&mut Watched)) {
        let mut scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        change(scopes.entry(scope.clone()).or_default());
    }

    pub fn list_started(&self, scope: &Option<String>) {
        self.with(scope, |watched| {
            watched.listed = false;
            watched.listing.clear();
        });
    }

    pub fn listed(&self, scope: &Option<String>, meta: &ObjectMeta) {
        let (namespace, name) = namespace_and_name(meta);
        self.with(scope, |watched| {
            watched
                .listing
                .entry(namespace)
                .or_default()
                .insert(name, Held::of(meta));
        });
    }

    pub fn list_done(&self, scope: &Option<String>) {
        self.with(scope, |watched| {
            watched.sets = std::mem::take(&mut watched.listing);
            watched.listed = true;
        });
    }

    pub fn changed(&self, scope: &Option<String>, meta: &ObjectMeta) {
        let (namespace, name) = namespace_and_name(meta);
        self.with(scope, |watched| {
            watched.sets.entry(namespace).or_default().insert(name, Held::of(meta));
        });
    }

    pub fn deleted(&self, scope: &Option<String>, meta: &ObjectMeta) {
        let (namespace, name) = namespace_and_name(meta);
        self.with(scope, |watched| {
            if let Some(sets) = watched.sets.get_mut(&namespace) {
                sets.remove(&name);
            }
        });
    }

    /// The watch broke: nothing is answered until it has listed again.
    pub fn interrupted(&self, scope: &Option<String>) {
        self.with(scope, |watched| watched.listed = false);
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
/// not seen a new revision's ReplicaSet yet). Either way the namespace is
/// kept from now on.
pub async fn current_hashes<const N: usize>(
    cluster: &Cluster,
    namespace: &str,
    deployments: [Option<&Value>; N],
) -> Result<[String; N]> {
    let owners = deployments.map(|deployment| deployment.map(owner));
    cluster.replica_sets.want(namespace);
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
    fn a_revision_is_answered_only_once_a_watch_covering_the_namespace_has_listed_and_while_it_holds() {
        for scope in [None, Some("shop".to_string())] {
            let sets = ReplicaSets::default();
            sets.list_started(&scope);
            sets.listed(&scope, &set("echo-1", "uid-echo", "1", "aaa"));
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("1")), None, "not listed yet");
            sets.list_done(&scope);
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("1")).as_deref(), Some("aaa"));
            // Another Deployment's ReplicaSet, another revision, another namespace: asked of the API server.
            assert_eq!(sets.hash_of("shop", "uid-other", Some("1")), None);
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("2")), None);
            assert_eq!(sets.hash_of("shop", "uid-echo", None), None);
            assert_eq!(sets.hash_of("other", "uid-echo", Some("1")), None);
            sets.changed(&scope, &set("echo-2", "uid-echo", "2", "bbb"));
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("2")).as_deref(), Some("bbb"));
            sets.deleted(&scope, &set("echo-1", "uid-echo", "1", "aaa"));
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("1")), None);
            sets.interrupted(&scope);
            assert_eq!(
                sets.hash_of("shop", "uid-echo", Some("2")),
                None,
                "a broken watch answers nothing"
            );
            // A list again replaces what the watch held: a set deleted meanwhile is gone.
            sets.list_done(&scope);
            sets.list_started(&scope);
            assert_eq!(
                sets.hash_of("shop", "uid-echo", Some("2")),
                None,
                "a list in progress answers nothing"
            );
            sets.listed(&scope, &set("echo-3", "uid-echo", "3", "ccc"));
            sets.list_done(&scope);
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("2")), None);
            assert_eq!(sets.hash_of("shop", "uid-echo", Some("3")).as_deref(), Some("ccc"));
        }
    }
}
