//! Observe: the reads an app's reconcile makes before anything is decided.
//! Live managed objects (listed once per kind for the whole sync), the
//! kinds each manifest resolves to, and the objects that left Git.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt, stream};
use kube::api::ListParams;

use super::{Cluster, api_message};
use crate::manifest::{App, Manifest, ObjectKey, Problem};
use crate::model::{InventoryEntry, LeftGit, LiveMeta, Resolved, SyncOptions};
use crate::plan::{LiveObjects, Planned};
use crate::{Error, MANAGED_BY_LABEL, Result};

/// Every live object of this instance, of the kinds the apps hold. Under
/// `--namespaces`, namespaced kinds are listed in those namespaces only, so
/// that Roles there (deploy/namespaced/) are all the agent needs.
/// With `wanted`, only the objects whose key it holds (a sync of some apps).
pub async fn list_live(
    cluster: &Cluster,
    revision_kinds: &BTreeSet<(String, String)>,
    options: &SyncOptions,
    wanted: Option<&crate::plan::RevisionKeys>,
) -> Result<LiveObjects> {
    let mut kinds: BTreeMap<&(String, String), Resolved> = BTreeMap::new();
    for id in revision_kinds {
        if let Some(resolved) = cluster.resolve(&id.0, &id.1).await {
            kinds.insert(id, resolved);
        }
    }
    let selector = format!("{MANAGED_BY_LABEL}={}", options.instance);
    let scoped = kinds.into_values().flat_map(|resolved| {
        let scopes = options.scopes(resolved.namespaced);
        scopes.into_iter().map(move |scope| (resolved.clone(), scope))
    });
    let lists = stream::iter(scoped.map(|(resolved, scope)| {
        let selector = selector.clone();
        async move {
            // The agent's watches keep the kind current: no request.
            if let Some(objects) = cluster.watch_cache.objects_where(&resolved, scope, &selector, wanted) {
                return Ok(objects);
            }
            let keep = |key: &ObjectKey| wanted.is_none_or(|wanted| wanted.holds(key));
            let api = cluster.api(&resolved, scope);
            let mut params = ListParams::default().labels(&selector).limit(500);
            let mut objects = Vec::new();
            loop {
                let page = api
                    .list(&params)
                    .await
                    .map_err(Error::kube(format!("listing {}", resolved.resource.plural)))?;
                let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
                // Page by page into the form kept, without managedFields (nothing
                // reads them; they are a good part of each object's size).
                objects.extend(
                    page.items
                        .into_iter()
                        .map(|object| super::cache::entry(&resolved.resource, object))
                        .filter(|(key, _)| keep(key)),
                );
                match next {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
            Ok::<_, Error>(objects)
        }
    }))
    .buffer_unordered(options.concurrency.max(1))
    .try_collect::<Vec<_>>()
    .await?;
    Ok(lists.into_iter().flatten().collect())
}

/// An object of this instance as the agent's watch keeps it, without a
/// request: `None` when no watch keeps its kind current in its namespace,
/// or the watch holds no such object (it may still exist, without the
/// agent's label: the caller reads it then).
pub fn cached_managed(
    cluster: &Cluster,
    resolved: &Resolved,
    namespace: Option<&str>,
    name: &str,
    options: &SyncOptions,
) -> Option<serde_json::Value> {
    let namespace = namespace.filter(|_| resolved.namespaced);
    let scope = match options.scopes(resolved.namespaced)[..] {
        [None] => None,
        ref scopes => Some(*scopes.iter().flatten().find(|s| Some(**s) == namespace)?),
    };
    let selector = format!("{MANAGED_BY_LABEL}={}", options.instance);
    let cache = cluster.watch_cache.kind(resolved, scope, &selector)?;
    let key = ObjectKey {
        group: resolved.resource.group.clone(),
        kind: resolved.resource.kind.clone(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    };
    serde_json::from_str(&cache.get(&key)??).ok()
}

/// Every manifest of the app resolved against discovery. Kinds that CRDs of
/// this revision will add are returned apart, to be resolved once those CRDs
/// are established.
pub struct ResolvedApp<'a> {
    pub objects: Vec<Planned<'a>>,
    pub pending: Vec<&'a Manifest>,
    pub problems: Vec<Problem>,
}

pub async fn resolve_app<'a>(
    cluster: &Cluster,
    app: &'a App,
    crd_kinds: &BTreeSet<(String, String)>,
    options: &SyncOptions,
) -> ResolvedApp<'a> {
    let mut resolved_app = ResolvedApp {
        objects: Vec::new(),
        pending: Vec::new(),
        problems: Vec::new(),
    };
    for manifest in app.manifests.iter() {
        match resolve_manifest(cluster, manifest, options).await {
            Some(planned) => resolved_app.objects.push(planned),
            None if crd_kinds.contains(&(manifest.group().to_string(), manifest.kind().to_string())) => {
                resolved_app.pending.push(manifest)
            }
            None if manifest.group() == crate::API_GROUP => resolved_app.problems.push(manifest.problem(format!(
                "kind {} in {} is not installed: apply the CRD first (gitcanary crd | kubectl apply -f -, or deploy/)",
                manifest.kind(),
                manifest.api_version()
            ))),
            None => resolved_app.problems.push(manifest.problem(format!(
                "unknown kind {} in {}: the API server does not serve it and no CRD in this revision defines it",
                manifest.kind(),
                manifest.api_version()
            ))),
        }
    }
    resolved_app
}

/// The object to apply for a manifest, when the API server serves its kind.
pub async fn resolve_manifest<'a>(
    cluster: &Cluster,
    manifest: &'a Manifest,
    options: &SyncOptions,
) -> Option<Planned<'a>> {
    let resolved = cluster.resolve(manifest.api_version(), manifest.kind()).await?;
    Some(Planned::new(manifest, resolved, options))
}

/// Reads each inventory entry that left Git, for prune to decide on.
pub async fn left_git(cluster: &Cluster, entries: &[InventoryEntry]) -> BTreeMap<ObjectKey, LeftGit> {
    let mut observed = BTreeMap::new();
    for entry in entries {
        let found = match cluster.resolve(&entry.api_version, &entry.kind).await {
            None => LeftGit::Gone, // its kind is gone, so is the object
            Some(resolved) => match cluster
                .api(&resolved, entry.namespace.as_deref())
                .get_opt(&entry.name)
                .await
            {
                Ok(None) => LeftGit::Gone,
                Ok(Some(live)) => serde_json::to_value(live)
                    .ok()
                    .as_ref()
                    .and_then(LiveMeta::of)
                    .map_or(LeftGit::Gone, LeftGit::Live),
                Err(error) => LeftGit::Unreadable(api_message(&error)),
            },
        };
        observed.insert(entry.key(), found);
    }
    observed
}
