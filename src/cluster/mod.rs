//! The cluster side: client, API discovery, observe (every read of a
//! reconcile), and the one apply and delete path.

mod apply;
pub mod cache;
mod diff;
mod inventory;
pub mod kept;
pub mod observe;
pub mod pods;
pub mod replica_sets;
mod requests;

pub use apply::{Deleted, Mode, Writer, api_message};
pub use diff::{Change, ObjectDiff, render_diff};
pub use inventory::{APP_STATUS_LABEL, AppStatus, UnreadableInventory, ensure_namespace, status_selector};
pub use requests::RequestCounts;

pub use crate::model::{InventoryEntry, Resolved};

use std::path::Path;

use kube::api::{Api, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{Discovery, Scope};
use kube::{Client, Config};
use tokio::sync::RwLock;

use crate::{Error, Result};

/// A connected cluster and what its API server serves.
pub struct Cluster {
    pub client: Client,
    discovery: RwLock<Discovery>,
    /// Requests this client sent (only for clients made by `connect`).
    pub requests: RequestCounts,
    /// When discovery last ran.
    discovered_at: std::sync::Mutex<std::time::Instant>,
    /// The object versions a sync wrote itself, so that their watch events do
    /// not wake the agent for another sync.
    pub own_writes: OwnWrites,
    /// Clients that impersonate an app's ServiceAccount, by user name.
    impersonating: std::sync::Mutex<std::collections::HashMap<String, Client>>,
    /// The API server's version (`v1.36.3`); empty when it would not say.
    kube_version: String,
    /// Live objects kept current by the agent's watches.
    pub watch_cache: cache::WatchCache,
    /// The ReplicaSets of Rollouts' namespaces, kept by the agent's watches.
    pub replica_sets: replica_sets::ReplicaSets,
    /// The pods of the workloads Rollouts release, kept likewise.
    pub revision_pods: pods::RevisionPods,
    /// The Knative Revisions of Rollouts' namespaces (without managedFields), kept likewise.
    pub knative_revisions: kept::Kept<serde_json::Value>,
    /// What each (apiVersion, kind) resolved to in the current discovery:
    /// a sync asks once per manifest, and kube's lookup copies a whole group.
    resolved: std::sync::Mutex<std::collections::HashMap<(String, String), Option<Resolved>>>,
    /// What `capabilities` made, and from which discovery run.
    capabilities: std::sync::Mutex<Option<(u64, std::sync::Arc<crate::render::Capabilities>)>>,
    /// Counts discovery runs: what was decided from an older one may be stale.
    discovery_generation: std::sync::atomic::AtomicU64,
    /// Status ConfigMaps as last parsed, by name: their resourceVersion and status.
    parsed_statuses: std::sync::Mutex<ParsedStatuses>,
    /// The pod template of each StatefulSet revision read, by namespace and
    /// ControllerRevision name (see `Cluster::revision_template`).
    revision_templates: std::sync::Mutex<std::collections::HashMap<(String, String), serde_json::Value>>,
}

/// How many StatefulSet revisions' templates are kept before they are read afresh.
const REVISION_TEMPLATES_KEPT: usize = 1024;

type ParsedStatuses = std::collections::HashMap<String, (Box<str>, Option<std::sync::Arc<AppStatus>>)>;

/// Discovery, tried again when it fails: an API group that goes away while
/// it runs (a CRD deleted meanwhile) fails the whole run.
async fn discover(client: &Client) -> Result<Discovery> {
    let mut attempt = 0;
    loop {
        match Discovery::new(client.clone()).run().await {
            Ok(discovery) => return Ok(discovery),
            Err(error) if attempt < 3 => {
                attempt += 1;
                tracing::debug!(%error, attempt, "discovery failed; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
            }
            Err(error) => return Err(Error::kube("discovering the API server's resources")(error)),
        }
    }
}

/// The last resourceVersion gitcanary's own apply gave each object (by uid).
#[derive(Debug, Default)]
pub struct OwnWrites {
    versions: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl OwnWrites {
    pub fn record(&self, object: &DynamicObject) {
        if let (Some(uid), Some(version)) = (&object.metadata.uid, &object.metadata.resource_version) {
            let mut versions = self.versions.lock().expect("own writes lock");
            versions.insert(uid.clone(), version.clone());
        }
    }

    /// Whether this version of the object is one gitcanary wrote. A later
    /// change by anyone else has another resourceVersion.
    pub fn wrote(&self, uid: &str, version: &str) -> bool {
        let versions = self.versions.lock().expect("own writes lock");
        versions.get(uid).is_some_and(|v| v == version)
    }

    pub fn forget(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.versions.lock().expect("own writes lock").remove(uid);
        }
    }
}

impl Cluster {
    /// Connects as kubectl would: `--kubeconfig`, then `KUBECONFIG`,
    /// `~/.kube/config`, then the in-cluster service account.
    pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Cluster> {
        let options = KubeConfigOptions {
            context: context.map(str::to_string),
            ..KubeConfigOptions::default()
        };
        let config = match kubeconfig {
            Some(path) => {
                let file =
                    Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig(format!("{}: {e}", path.display())))?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| Error::Kubeconfig(e.to_string()))?
            }
            None if context.is_some() => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| Error::Kubeconfig(e.to_string()))?,
            None => Config::infer().await.map_err(|e| Error::Kubeconfig(e.to_string()))?,
        };
        let requests = RequestCounts::default();
        let client = kube::client::ClientBuilder::try_from(config)
            .map_err(Error::kube("creating the client"))?
            .with_layer(&requests::CountLayer(requests.clone()))
            .build();
        let mut cluster = Cluster::from_client(client).await?;
        cluster.requests = requests;
        Ok(cluster)
    }

    pub async fn from_client(client: Client) -> Result<Cluster> {
        let discovery = discover(&client).await?;
        let kube_version = match client.apiserver_version().await {
            Ok(info) => info.git_version,
            Err(error) => {
                tracing::warn!(%error, "the API server did not give its version; Helm renders for its default");
                String::new()
            }
        };
        Ok(Cluster {
            kube_version,
            client,
            discovery: RwLock::new(discovery),
            requests: RequestCounts::default(),
            discovered_at: std::sync::Mutex::new(std::time::Instant::now()),
            own_writes: OwnWrites::default(),
            impersonating: std::sync::Mutex::default(),
            watch_cache: cache::WatchCache::default(),
            replica_sets: replica_sets::ReplicaSets::default(),
            revision_pods: pods::RevisionPods::default(),
            knative_revisions: kept::Kept::default(),
            resolved: std::sync::Mutex::default(),
            capabilities: std::sync::Mutex::default(),
            discovery_generation: std::sync::atomic::AtomicU64::new(0),
            parsed_statuses: std::sync::Mutex::default(),
            revision_templates: std::sync::Mutex::default(),
        })
    }

    /// The pod template a StatefulSet's ControllerRevision `name` holds,
    /// read once: the API server refuses any change to a revision's data,
    /// and its name carries the hash of that data, so a name read before is
    /// answered from memory. `None` when there is no such revision.
    pub async fn revision_template(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        use k8s_openapi::api::apps::v1::ControllerRevision;
        let key = (namespace.to_string(), name.to_string());
        if let Some(template) = self
            .revision_templates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Some(template.clone());
        }
        let revisions: kube::Api<ControllerRevision> = kube::Api::namespaced(self.client.clone(), namespace);
        let mut template = revisions.get_opt(name).await.ok()??.data?.0["spec"]["template"].take();
        if let Some(map) = template.as_object_mut() {
            map.remove("$patch");
        }
        let mut kept = self.revision_templates.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: a long-lived agent sees many revisions come and go.
        if kept.len() >= REVISION_TEMPLATES_KEPT {
            kept.clear();
        }
        kept.insert(key, template.clone());
        Some(template)
    }

    /// Runs discovery again, after CRDs were added.
    pub async fn refresh_discovery(&self) -> Result<()> {
        let fresh = discover(&self.client).await?;
        let mut discovery = self.discovery.write().await;
        *discovery = fresh;
        // Under the write lock: whoever reads the new discovery reads its generation.
        self.resolved.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.discovery_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        drop(discovery);
        *self.discovered_at.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
        Ok(())
    }

    /// Runs discovery again unless it ran in the last `fresh_for`: for kinds
    /// that someone installed after the agent started (a CRD applied by hand).
    pub async fn refresh_discovery_unless_fresh(&self, fresh_for: std::time::Duration) -> Result<()> {
        let age = self.discovered_at.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
        if age < fresh_for {
            return Ok(());
        }
        self.refresh_discovery().await
    }

    /// The version and API versions the cluster serves, as `helm template`
    /// takes them (`apps/v1` and `apps/v1/Deployment`).
    pub async fn capabilities(&self) -> std::sync::Arc<crate::render::Capabilities> {
        let discovery = self.discovery.read().await;
        // Made once per discovery run: every load of the head asks.
        let generation = self.discovery_generation();
        let mut kept = self.capabilities.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made_at, capabilities)) = kept.as_ref()
            && *made_at == generation
        {
            return capabilities.clone();
        }
        let mut api_versions = Vec::new();
        for group in discovery.groups() {
            for version in group.versions() {
                let group_version = if group.name().is_empty() {
                    version.to_string()
                } else {
                    format!("{}/{version}", group.name())
                };
                for (resource, _) in group.versioned_resources(version) {
                    api_versions.push(format!("{group_version}/{}", resource.kind));
                }
                api_versions.push(group_version);
            }
        }
        api_versions.sort();
        api_versions.dedup();
        let capabilities = std::sync::Arc::new(crate::render::Capabilities {
            kube_version: self.kube_version.clone(),
            api_versions,
        });
        *kept = Some((generation, capabilities.clone()));
        capabilities
    }

    /// Which discovery run the cluster's answers come from.
    pub fn discovery_generation(&self) -> u64 {
        self.discovery_generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How the API server serves a kind gitcanary writes for itself (a
    /// status, a label); an error when it does not.
    pub async fn served(&self, api_version: &str, kind: &str) -> std::result::Result<Resolved, kube::Error> {
        self.resolve(api_version, kind)
            .await
            .ok_or_else(|| kube::Error::Service(format!("the API server does not serve {kind} ({api_version})").into()))
    }

    pub async fn resolve(&self, api_version: &str, kind: &str) -> Option<Resolved> {
        let id = (api_version.to_string(), kind.to_string());
        if let Some(known) = self.resolved.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            return known.clone();
        }
        let discovery = self.discovery.read().await;
        let resolved = resolve_in(&discovery, api_version, kind);
        // Under the read lock: a refresh cannot clear the map between the lookup and this.
        self.resolved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, resolved.clone());
        resolved
    }

    pub fn api(&self, resolved: &Resolved, namespace: Option<&str>) -> Api<DynamicObject> {
        api_for(&self.client, resolved, namespace)
    }
}

fn resolve_in(discovery: &Discovery, api_version: &str, kind: &str) -> Option<Resolved> {
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    discovery.resolve_gvk(&gvk).map(|(resource, caps)| Resolved {
        resource,
        namespaced: caps.scope == Scope::Namespaced,
    })
}

/// The API of a kind through `client`: in `namespace` for a namespaced kind.
fn api_for(client: &Client, resolved: &Resolved, namespace: Option<&str>) -> Api<DynamicObject> {
    match (resolved.namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resolved.resource),
        _ => Api::all_with(client.clone(), &resolved.resource),
    }
}
