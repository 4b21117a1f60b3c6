//! The reads a Rollout's observe makes of single objects: from the agent's
//! watch caches when they keep the object, else from the API server.

use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

use super::api::Rollout;
use crate::cluster::Cluster;
use crate::cluster::observe::cached_managed;
use crate::plan::SyncOptions;
use crate::{Error, Result};

/// The Rollout as the cluster has it: from the agent's watch when it keeps
/// it (the status the agent wrote last is there at once), else read.
pub(super) async fn get_rollout(
    cluster: &Cluster,
    options: &SyncOptions,
    namespace: &str,
    name: &str,
) -> Result<Option<Rollout>> {
    if let Some(resolved) = cluster.resolve(super::api::API_VERSION, super::api::KIND).await
        && let Some(kept) = cached_managed(cluster, &resolved, Some(namespace), name, options)
        && let Ok(rollout) = serde_json::from_value(kept)
    {
        return Ok(Some(rollout));
    }
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
