//! Per-app sync status and inventory, kept in a ConfigMap
//! `gitcanary-app-<app>` in the agent's state namespace, so that
//! `kubectl get configmap -l gitcanary.io/app-status` shows what was synced
//! and prune knows exactly what gitcanary created.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::Cluster;
use crate::model::InventoryEntry;
use crate::{Error, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::Api;

pub const APP_STATUS_LABEL: &str = "gitcanary.io/app-status";

/// The label selector of an instance's status ConfigMaps: the agent's watch
/// of them and every read that expects that watch use the same one.
pub fn status_selector(instance: &str) -> String {
    format!("{APP_STATUS_LABEL}={instance}")
}

/// What the cluster records about an app's last sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppStatus {
    pub app: String,
    /// The source the app was synced from (see `SyncOptions::source`).
    pub source: String,
    pub commit: String,
    /// `Synced`, `Invalid` (not applied: the manifests have problems) or `Failed`.
    pub result: String,
    pub message: String,
    /// `Healthy` or `Progressing`, as workloads report after apply.
    pub health: String,
    pub inventory: Vec<InventoryEntry>,
    /// The recorded inventory, when it cannot be parsed: prune is off for the
    /// app, and the text is written back as it was, so nothing is forgotten.
    pub unreadable_inventory: Option<UnreadableInventory>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableInventory {
    pub text: String,
    pub error: String,
}

/// `gitcanary-app-<app>` for the default instance, `<instance>-app-<app>`
/// for others, so that instances sharing a state namespace never share a status.
fn configmap_name(instance: &str, app: &str) -> String {
    let clean = |text: &str| -> String {
        let cleaned: String = text
            .to_ascii_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        cleaned.trim_matches('-').to_string()
    };
    if instance == crate::DEFAULT_INSTANCE {
        format!("gitcanary-app-{}", clean(app))
    } else {
        format!("{}-app-{}", clean(instance), clean(app))
    }
}

impl AppStatus {
    pub async fn load(cluster: &Cluster, namespace: &str, instance: &str, app: &str) -> Result<Option<AppStatus>> {
        let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), namespace);
        let cm = api
            .get_opt(&configmap_name(instance, app))
            .await
            .map_err(Error::kube(format!("reading the status of app {app}")))?;
        Ok(cm.map(|cm| AppStatus::from_configmap(app, cm)))
    }

    /// Every app's status in one list call, keyed by app.
    pub async fn load_all(
        cluster: &Cluster,
        namespace: &str,
        instance: &str,
    ) -> Result<BTreeMap<String, Arc<AppStatus>>> {
        let selector = status_selector(instance);
        // The agent's watch of its status ConfigMaps answers without a
        // request, and a status whose resourceVersion is the one parsed
        // last time is not parsed again.
        let watched = match cluster.resolve("v1", "ConfigMap").await {
            Some(resolved) => cluster.watch_cache.kind(&resolved, Some(namespace), &selector),
            None => None,
        };
        if let Some(cache) = watched {
            let mut parsed = cluster.parsed_statuses.lock().unwrap_or_else(|e| e.into_inner());
            let mut statuses = BTreeMap::new();
            let mut seen = HashMap::new();
            let current = cache.visit(|key, version, text| {
                let status = match parsed.get(&key.name) {
                    Some((known, status)) if **known == *version => status.clone(),
                    _ => serde_json::from_str::<ConfigMap>(text).ok().and_then(|cm| {
                        let app = cm.data.as_ref()?.get("app")?.clone();
                        Some(Arc::new(AppStatus::from_configmap(&app, cm)))
                    }),
                };
                if let Some(status) = &status {
                    statuses.insert(status.app.clone(), status.clone());
                }
                seen.insert(key.name.clone(), (Box::<str>::from(version), status));
            });
            if current {
                *parsed = seen;
                return Ok(statuses);
            }
        }
        let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), namespace);
        let items = api
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube("listing app statuses"))?
            .items;
        Ok(items
            .into_iter()
            .filter_map(|cm| {
                let app = cm.data.as_ref()?.get("app")?.clone();
                Some((app.clone(), Arc::new(AppStatus::from_configmap(&app, cm))))
            })
            .collect())
    }

    fn from_configmap(app: &str, cm: ConfigMap) -> AppStatus {
        let data = cm.data.unwrap_or_default();
        let field = |k: &str| data.get(k).cloned().unwrap_or_default();
        let text = field("inventory");
        let (inventory, unreadable_inventory) = match serde_json::from_str(if text.is_empty() { "[]" } else { &text }) {
            Ok(inventory) => (inventory, None),
            Err(error) => (
                Vec::new(),
                Some(UnreadableInventory {
                    text,
                    error: error.to_string(),
                }),
            ),
        };
        AppStatus {
            app: app.to_string(),
            source: field("source"),
            commit: field("commit"),
            result: field("result"),
            message: field("message"),
            health: field("health"),
            inventory,
            unreadable_inventory,
        }
    }

    /// Written by `agent`: the agent's identity, fenced by the app's shard.
    pub async fn save(&self, agent: &super::Writer<'_>, namespace: &str, instance: &str) -> Result<()> {
        let data: BTreeMap<String, String> = [
            ("app", self.app.clone()),
            ("source", self.source.clone()),
            ("commit", self.commit.clone()),
            ("result", self.result.clone()),
            ("message", self.message.clone()),
            ("health", self.health.clone()),
            ("objects", self.inventory.len().to_string()),
            (
                "inventory",
                match &self.unreadable_inventory {
                    Some(unreadable) => unreadable.text.clone(),
                    None => serde_json::to_string(&self.inventory).unwrap_or_default(),
                },
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let name = configmap_name(instance, &self.app);
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {APP_STATUS_LABEL: instance}},
            "data": data,
        });
        write_own(agent, &body, true, format!("writing the status of app {}", self.app)).await
    }

    /// Deletes the app's status (an app that left Git with nothing left of
    /// it), as `agent`; the one read now, not one written meanwhile.
    pub async fn remove(agent: &super::Writer<'_>, namespace: &str, instance: &str, app: &str) -> Result<()> {
        let name = configmap_name(instance, app);
        let api: Api<ConfigMap> = Api::namespaced(agent.cluster().client.clone(), namespace);
        let context = || format!("deleting the status of app {app}, which left Git");
        let Some(live) = api.get_opt(&name).await.map_err(Error::kube(context()))? else {
            return Ok(());
        };
        // Another app whose name makes the same ConfigMap name (`my_app`
        // gone, `my-app` new) may have written it since: not this app's.
        if live.data.as_ref().and_then(|data| data.get("app")).map(String::as_str) != Some(app) {
            return Ok(());
        }
        let deletion = crate::model::Deletion {
            api_version: "v1".into(),
            key: crate::manifest::ObjectKey {
                group: String::new(),
                kind: "ConfigMap".into(),
                namespace: Some(namespace.to_string()),
                name,
            },
            uid: live.metadata.uid.unwrap_or_default(),
            resource_version: live.metadata.resource_version,
            foreground: false,
        };
        agent
            .delete(&deletion, super::Mode::Apply)
            .await
            .map_err(Error::kube(context()))?;
        Ok(())
    }
}

impl Cluster {
    /// The apps whose status the last read of the statuses' watch found.
    pub fn recorded_apps(&self) -> std::collections::BTreeSet<String> {
        let parsed = self.parsed_statuses.lock().unwrap_or_else(|e| e.into_inner());
        parsed
            .values()
            .filter_map(|(_, status)| Some(status.as_ref()?.app.clone()))
            .collect()
    }
}

/// Applies an object of gitcanary's own bookkeeping, as the agent.
async fn write_own(agent: &super::Writer<'_>, body: &serde_json::Value, ours: bool, context: String) -> Result<()> {
    let (api_version, kind) = (
        body["apiVersion"].as_str().unwrap_or_default(),
        body["kind"].as_str().unwrap_or_default(),
    );
    let written = async {
        let resolved = agent.cluster().served(api_version, kind).await?;
        agent.apply(&resolved, body, ours, super::Mode::Apply).await
    };
    written.await.map_err(Error::kube(context))?;
    Ok(())
}

/// Creates the state namespace when it is missing.
pub async fn ensure_namespace(cluster: &Cluster, namespace: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(cluster.client.clone());
    if api
        .get_opt(namespace)
        .await
        .map_err(Error::kube(format!("reading namespace {namespace}")))?
        .is_some()
    {
        return Ok(());
    }
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    write_own(
        &cluster.writer(None),
        &body,
        false,
        format!("creating namespace {namespace}"),
    )
    .await
}
