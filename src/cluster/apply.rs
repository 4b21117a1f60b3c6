//! The one server-side-apply path and the one delete path. Every object
//! gitcanary writes for an app (Git's objects with their overlays, canary
//! objects, the take-back of a failed new app) and every delete it makes
//! (prune, canary cleanup) goes through here, each with a dry-run mode that
//! `gitcanary diff` uses.

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use serde_json::Value;

use super::Cluster;
use crate::FIELD_MANAGER;
use crate::plan::{Deletion, Resolved};

/// Whether a write reaches the cluster or only the API server's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Apply,
    DryRun,
}

/// What a delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    /// Already gone (or its kind is).
    Gone,
    /// The object is no longer the one decided on (another uid or resourceVersion): kept.
    Changed,
}

impl Cluster {
    /// Server-side apply with gitcanary's field manager. Conflicts are forced
    /// only on an object this instance already manages (`ours`), so that a
    /// `kubectl edit` is healed but someone else's object is not taken over.
    pub async fn apply(
        &self,
        resolved: &Resolved,
        object: &Value,
        ours: bool,
        mode: Mode,
    ) -> Result<DynamicObject, kube::Error> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = object["metadata"]["namespace"].as_str();
        let mut params = PatchParams::apply(FIELD_MANAGER);
        if ours {
            params = params.force();
        }
        if mode == Mode::DryRun {
            params = params.dry_run();
        }
        let applied = self
            .api(resolved, namespace)
            .patch(name, &params, &Patch::Apply(object))
            .await?;
        if mode == Mode::Apply {
            self.own_writes.record(&applied);
        }
        Ok(applied)
    }

    /// Deletes the object decided on, and only it: the uid (and
    /// resourceVersion, when the plan recorded one) must still match.
    pub async fn delete(&self, deletion: &Deletion, mode: Mode) -> Result<Deleted, kube::Error> {
        let Some(resolved) = self.resolve(&deletion.api_version, &deletion.key.kind).await else {
            return Ok(Deleted::Gone);
        };
        let params = DeleteParams {
            dry_run: mode == Mode::DryRun,
            preconditions: Some(Preconditions {
                uid: Some(deletion.uid.clone()),
                resource_version: deletion.resource_version.clone(),
            }),
            ..DeleteParams::background()
        };
        let api = self.api(&resolved, deletion.key.namespace.as_deref());
        match api.delete(&deletion.key.name, &params).await {
            Ok(_) => Ok(Deleted::Deleted),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Deleted::Gone),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Deleted::Changed),
            Err(error) => Err(error),
        }
    }
}

/// The API server's own words for a refusal, without the client's wrapping.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}
