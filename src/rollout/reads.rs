//! The reads a Rollout's observe makes of single objects: the Rollout from
//! the API server; the others from the agent's watch caches when they keep
//! the object, else from the API server.

use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

use super::api::Rollout;
use crate::cluster::Cluster;
use crate::cluster::observe::cached_managed;
use crate::model::SyncOptions;
use crate::{Error, Result};

/// The Rollout as the API server has it, always read: its status is the
/// release's state, which the agent writes without a precondition, so it is
/// not taken from a watch that may lag another writer (a replica that held
/// the app's shard before, the CLI) and then written back over theirs.
pub(super) async fn get_rollout(cluster: &Cluster, namespace: &str, name: &str) -> Result<Option<Rollout>> {
    let rollouts: Api<Rollout> = Api::namespaced(cluster.client.clone(), namespace);
    rollouts
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading Rollout {namespace}/{name}")))
}

pub(super) async fn get_value(
    cluster: &Cluster,
    options: &SyncOptions,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>> {
    get_any(cluster, options, api_version, kind, Some(namespace), name).await
}

/// An object of any kind, namespaced or not; `None` when it, or its kind,
/// is not there. One the agent's watches keep is read from memory; any
/// other (not the agent's, or not there) is asked of the API server.
pub(super) async fn get_any(
    cluster: &Cluster,
    options: &SyncOptions,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Value>> {
    let Some(resolved) = cluster.resolve(api_version, kind).await else {
        return Ok(None);
    };
    if let Some(kept) = cached_managed(cluster, &resolved, namespace, name, options) {
        return Ok(Some(kept));
    }
    let api: Api<DynamicObject> = cluster.api(&resolved, namespace);
    let shown = namespace.map_or(name.to_string(), |ns| format!("{ns}/{name}"));
    let object = api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading {kind} {shown}")))?;
    Ok(object.map(|o| {
        let mut value = serde_json::to_value(o).unwrap_or(Value::Null);
        value["apiVersion"] = json!(api_version);
        value["kind"] = json!(kind);
        value
    }))
}
