//! What the operator gave the agent at start, for every app's plan: where
//! objects may land, whom each app writes as, the servers analysis asks.

use std::collections::BTreeMap;

use crate::manifest::Allowed;

/// A web endpoint analysis may ask (`--web-check NAME=URL`), with its headers.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WebEndpoint {
    pub url: String,
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for WebEndpoint {
    // Headers carry credentials: never in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebEndpoint").field("url", &self.url).finish()
    }
}

/// An endpoint a release hook calls (`--hook NAME=URL`), with the secret
/// its bodies are signed with (`--hook-secret NAME=FILE`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HookEndpoint {
    pub url: String,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for HookEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookEndpoint").field("url", &self.url).finish()
    }
}

#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Agent instance name, the value of the `gitcanary.io/managed-by` label.
    pub instance: String,
    /// Where the apps come from (repository, branch and path), recorded in
    /// each app's status: an app that left Git is pruned whole only by a
    /// sync of the source that made it. Empty: none is.
    pub source: String,
    /// Namespace of the per-app status ConfigMaps.
    pub state_namespace: String,
    /// Delete managed objects that left Git.
    pub prune: bool,
    /// Where objects may land (`--namespaces`, `--cluster-kinds`).
    pub allowed: Allowed,
    /// Requests in flight at once while applying.
    pub concurrency: usize,
    /// Prometheus for analysis templates that name none.
    pub prometheus_url: Option<String>,
    /// Prometheus servers templates name (`--prometheus NAME=URL`).
    pub prometheus: BTreeMap<String, String>,
    /// Web endpoints metrics name (`--web-check NAME=URL`).
    pub web_checks: BTreeMap<String, WebEndpoint>,
    /// Endpoints release hooks name (`--hook NAME=URL`).
    pub hooks: BTreeMap<String, HookEndpoint>,
    /// Take over every object that already exists (`--adopt`, for a migration);
    /// otherwise only those whose manifest says `gitcanary.io/adopt: "true"`.
    pub adopt: bool,
    /// The ServiceAccount each app's writes are made as (`--tenant`), from
    /// the agent's configuration, never from the repository.
    pub tenants: BTreeMap<String, ServiceAccountRef>,
    /// For apps `tenants` does not name (`--default-service-account`);
    /// `None`: those apps write as the agent.
    pub default_tenant: Option<ServiceAccountRef>,
    /// With `--shards`: whether this replica may still write for an app,
    /// asked just before each app's writes.
    pub fence: Option<Fence>,
}

/// Whether this replica may write for an app now (its shard's Lease held).
#[derive(Clone)]
pub struct Fence(pub std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fence")
    }
}

impl SyncOptions {
    /// Where a kind is listed and watched: under `--namespaces`, a namespaced
    /// kind in each of those namespaces (so Roles there suffice); otherwise
    /// everywhere (`None`).
    pub fn scopes(&self, namespaced: bool) -> Vec<Option<&str>> {
        match &self.allowed.namespaces[..] {
            namespaces if namespaced && !namespaces.is_empty() => {
                namespaces.iter().map(|ns| Some(ns.as_str())).collect()
            }
            _ => vec![None],
        }
    }

    /// The identity the app's writes are made as; `None`: the agent's own.
    pub fn tenant_of(&self, app: &str) -> Option<&ServiceAccountRef> {
        self.tenants.get(app).or(self.default_tenant.as_ref())
    }

    /// Why the app may not be synced under the tenancy given: with
    /// `--tenant` set, an app no tenant names would write as the agent
    /// itself, so it is refused unless `--default-service-account` names
    /// whom it writes as. Tenancy fails closed.
    pub fn tenant_problem(&self, app: &str) -> Option<String> {
        (!self.tenants.is_empty() && self.tenant_of(app).is_none()).then(|| {
            format!(
                "app {app} names no tenant: with --tenant set, every app writes as a ServiceAccount; add --tenant {app}=NAMESPACE/SERVICEACCOUNT or give --default-service-account"
            )
        })
    }
}

/// A ServiceAccount, written `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountRef {
    /// The user name Kubernetes authenticates the ServiceAccount as.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl std::fmt::Display for ServiceAccountRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl std::str::FromStr for ServiceAccountRef {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        let dns_label = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        match value.split_once('/') {
            Some((namespace, name)) if dns_label(namespace) && dns_label(name) => Ok(ServiceAccountRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            _ => Err(format!("{value:?} is not NAMESPACE/SERVICEACCOUNT")),
        }
    }
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            instance: crate::DEFAULT_INSTANCE.to_string(),
            source: String::new(),
            state_namespace: "gitcanary-system".to_string(),
            prune: false,
            allowed: Allowed::default(),
            concurrency: 16,
            prometheus_url: None,
            prometheus: BTreeMap::new(),
            web_checks: BTreeMap::new(),
            hooks: BTreeMap::new(),
            adopt: false,
            tenants: BTreeMap::new(),
            default_tenant: None,
            fence: None,
        }
    }
}
