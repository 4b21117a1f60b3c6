//! The types every stage shares: what discovery says of a kind, what an
//! app's inventory records, what a delete may remove, and the sync's
//! settings. Observe fills them, the planner decides with them, the
//! executor writes with them; this module imports none of those stages.

mod options;
pub use options::{Fence, HookEndpoint, ServiceAccountRef, SyncOptions, WebEndpoint};

use kube_core::discovery::ApiResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::manifest::ObjectKey;
use crate::{MANAGED_BY_LABEL, SOURCE_ANNOTATION};

/// What discovery says about one kind.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// One object gitcanary applied for an app.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InventoryEntry {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The object existed before gitcanary applied it, and was adopted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

impl InventoryEntry {
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            group: self
                .api_version
                .rsplit_once('/')
                .map(|(g, _)| g.to_string())
                .unwrap_or_default(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// What was read of a live object that this reconcile may delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveMeta {
    pub uid: String,
    pub resource_version: String,
    /// The value of the `gitcanary.io/managed-by` label.
    pub managed_by: Option<String>,
    /// The value of the `gitcanary.io/source` annotation.
    pub source: Option<String>,
}

impl LiveMeta {
    /// From an object's JSON; `None` when it has no uid (not a live object).
    pub fn of(object: &Value) -> Option<LiveMeta> {
        let metadata = &object["metadata"];
        Some(LiveMeta {
            uid: metadata["uid"].as_str()?.to_string(),
            resource_version: metadata["resourceVersion"].as_str().unwrap_or_default().to_string(),
            managed_by: metadata["labels"][MANAGED_BY_LABEL].as_str().map(str::to_string),
            source: metadata["annotations"][SOURCE_ANNOTATION].as_str().map(str::to_string),
        })
    }
}

/// What observe found of an inventory entry that left Git.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftGit {
    /// The object (or its kind) no longer exists.
    Gone,
    Live(LiveMeta),
    /// It could not be read; the message says why.
    Unreadable(String),
}

/// A delete the apply stage makes: only of the object as it was observed
/// (its uid and, for prune, its resourceVersion), so that an object someone
/// re-created or another app took over meanwhile is left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    pub api_version: String,
    pub key: ObjectKey,
    pub uid: String,
    pub resource_version: Option<String>,
    /// The object stays (being deleted) until the garbage collector has
    /// removed what it owns: a canary workload is seen until its pods are gone.
    pub foreground: bool,
}

impl Deletion {
    /// The delete of a live object exactly as read.
    pub fn of(api_version: &str, key: ObjectKey, live: &LiveMeta) -> Deletion {
        Deletion {
            api_version: api_version.to_string(),
            key,
            uid: live.uid.clone(),
            resource_version: Some(live.resource_version.clone()).filter(|v| !v.is_empty()),
            foreground: false,
        }
    }

    pub fn inventory_entry(&self) -> InventoryEntry {
        InventoryEntry {
            api_version: self.api_version.clone(),
            kind: self.key.kind.clone(),
            namespace: self.key.namespace.clone(),
            name: self.key.name.clone(),
            adopted: false,
        }
    }
}
