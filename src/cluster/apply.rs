//! The one server-side-apply path and the one delete path. Every object
//! gitcanary writes for an app (Git's objects with their overlays, canary
//! objects, the take-back of a failed new app, Rollout status and Events,
//! batch labels, signal annotations, app status) and every delete it makes
//! (prune, canary cleanup) goes through here, each write with a deadline;
//! applies and deletes with a dry-run mode that `gitcanary diff` uses. Writes are made by a [`Writer`]: as the agent, or
//! as the ServiceAccount the agent's configuration maps the app to, so that
//! Kubernetes RBAC bounds what a commit to that app can do.

use http::{HeaderValue, Request};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, ValidationDirective};
use kube::client::Body;
use kube::runtime::events::{Event, Recorder, Reporter};
use serde_json::Value;

use super::Cluster;
use crate::FIELD_MANAGER;
use crate::model::{Deletion, Fence, Resolved, ServiceAccountRef, SyncOptions};

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

/// The identity an app's writes are made as: the agent's, or a tenant's.
pub struct Writer<'c> {
    cluster: &'c Cluster,
    client: Client,
    /// With `--shards`: asked before each write, so that a replica stopped
    /// mid-sync writes nothing more for the app once it wakes.
    fence: Option<AppFence>,
}

/// Whether this replica still holds an app's shard. Once refused, refused
/// for the rest of the writer's sync (and its `as_agent` copies), even if
/// the shard is taken again meanwhile: half a sync is never resumed.
#[derive(Clone)]
struct AppFence {
    fence: Fence,
    app: String,
    lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl AppFence {
    fn holds(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.lost.load(Ordering::SeqCst) {
            return false;
        }
        let holds = (self.fence.0)(&self.app);
        if !holds {
            self.lost.store(true, Ordering::SeqCst);
        }
        holds
    }
}

impl Cluster {
    /// Writes as `tenant` (impersonated), or as the agent when `None`.
    pub fn writer<'c>(&'c self, tenant: Option<&'c ServiceAccountRef>) -> Writer<'c> {
        let client = match tenant {
            None => self.client.clone(),
            Some(account) => {
                let mut clients = self.impersonating.lock().unwrap_or_else(|e| e.into_inner());
                clients
                    .entry(account.user())
                    .or_insert_with(|| impersonating(&self.client, account))
                    .clone()
            }
        };
        Writer {
            cluster: self,
            client,
            fence: None,
        }
    }

    /// The writer of `app`'s objects: as its tenant, fenced by its shard.
    pub fn writer_for<'c>(&'c self, app: &str, options: &'c SyncOptions) -> Writer<'c> {
        self.writer(options.tenant_of(app)).fenced(options.fence.as_ref(), app)
    }
}

/// A client that sends every request of `base` as the ServiceAccount. The
/// API server adds the ServiceAccount's groups itself.
fn impersonating(base: &Client, account: &ServiceAccountRef) -> Client {
    let base = base.clone();
    let default_namespace = base.default_namespace().to_string();
    // Validated names: a header value cannot fail; an empty one is refused by the server.
    let user = HeaderValue::from_str(&account.user()).unwrap_or(HeaderValue::from_static(""));
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let (base, user) = (base.clone(), user.clone());
        async move {
            request.headers_mut().insert("Impersonate-User", user);
            base.send(request).await
        }
    });
    Client::new(service, default_namespace)
}

impl<'c> Writer<'c> {
    /// The cluster, for reads (always the agent's).
    pub fn cluster(&self) -> &'c Cluster {
        self.cluster
    }

    /// Each write first asks `fence` whether this replica still holds `app`.
    pub fn fenced(mut self, fence: Option<&Fence>, app: &str) -> Self {
        self.fence = fence.map(|fence| AppFence {
            fence: fence.clone(),
            app: app.to_string(),
            lost: Default::default(),
        });
        self
    }

    /// Whether the app's shard was lost at any point of this writer's use.
    pub fn fence_lost(&self) -> bool {
        self.fence.as_ref().is_some_and(|fence| !fence.holds())
    }

    /// Writes of the agent's own bookkeeping for the same app (Rollout
    /// status, batch labels, app status): as the agent, with the same fence.
    pub fn as_agent(&self) -> Writer<'c> {
        Writer {
            cluster: self.cluster,
            client: self.cluster.client.clone(),
            fence: self.fence.clone(),
        }
    }

    /// Refuses a write once the app's shard is no longer held. A request
    /// already sent is not recalled: only one answered within the Lease's
    /// margin (a third of its duration) is surely before another holder's.
    pub fn may_write(&self) -> Result<(), kube::Error> {
        match &self.fence {
            Some(fence) if !fence.holds() => Err(kube::Error::Service(
                format!(
                    "this replica no longer holds the shard of app {}: nothing more is written for it",
                    fence.app
                )
                .into(),
            )),
            _ => Ok(()),
        }
    }

    fn api(&self, resolved: &Resolved, namespace: Option<&str>) -> Api<DynamicObject> {
        super::api_for(&self.client, resolved, namespace)
    }

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
        // Strict: a field the server would drop is an error, as `validate` says.
        let mut params = PatchParams::apply(FIELD_MANAGER).validation(ValidationDirective::Strict);
        if ours {
            params = params.force();
        }
        match mode {
            Mode::DryRun => params = params.dry_run(),
            Mode::Apply => self.may_write()?,
        }
        let api = self.api(resolved, namespace);
        let applied = within_write_timeout(api.patch(name, &params, &Patch::Apply(object))).await?;
        if mode == Mode::Apply {
            self.recorded(resolved, &applied);
        }
        Ok(applied)
    }

    /// Server-side apply of `body` (apiVersion, kind and `status`) to the
    /// object's status subresource, forced: the status is gitcanary's alone.
    pub async fn apply_status(
        &self,
        resolved: &Resolved,
        namespace: Option<&str>,
        name: &str,
        body: &Value,
    ) -> Result<DynamicObject, kube::Error> {
        self.may_write()?;
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let api = self.api(resolved, namespace);
        let applied = within_write_timeout(api.patch_status(name, &params, &Patch::Apply(body))).await?;
        self.recorded(resolved, &applied);
        Ok(applied)
    }

    /// A JSON merge patch (a label, an annotation). A `resourceVersion` in
    /// the patch's metadata makes it fail if the object changed meanwhile.
    pub async fn merge(
        &self,
        resolved: &Resolved,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, kube::Error> {
        let patched = self.merge_as_news(resolved, namespace, name, patch).await?;
        self.recorded(resolved, &patched);
        Ok(patched)
    }

    /// A JSON patch (RFC 6902): its `test` operations make it fail, writing
    /// nothing, when the object no longer holds what the plan saw.
    pub async fn patch_json(
        &self,
        resolved: &Resolved,
        namespace: Option<&str>,
        name: &str,
        operations: json_patch::Patch,
    ) -> Result<DynamicObject, kube::Error> {
        self.may_write()?;
        let api = self.api(resolved, namespace);
        let patch = Patch::Json::<()>(operations);
        let patched = within_write_timeout(api.patch(name, &PatchParams::default(), &patch)).await?;
        self.recorded(resolved, &patched);
        Ok(patched)
    }

    /// Kubernetes Events about `regarding`, published as this writer, each
    /// with the write's deadline and fence (an Event is a write too), by one
    /// recorder, which makes a series of Events that repeat. Stops at the
    /// first refusal.
    pub async fn publish_events(&self, events: &[Event], regarding: &ObjectReference) -> Result<(), kube::Error> {
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: std::env::var("HOSTNAME").ok(),
        };
        let recorder = Recorder::new(self.client.clone(), reporter);
        for event in events {
            self.may_write()?;
            within_write_timeout(recorder.publish(event, regarding)).await?;
        }
        Ok(())
    }

    /// A merge patch whose watch event must wake the agent as anyone's
    /// would (a promote or abort handed to a Rollout): with the write's
    /// deadline, but not recorded as the agent's own write.
    pub async fn merge_as_news(
        &self,
        resolved: &Resolved,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, kube::Error> {
        self.may_write()?;
        let api = self.api(resolved, namespace);
        within_write_timeout(api.patch(name, &PatchParams::default(), &Patch::Merge(patch))).await
    }

    /// Remembers a write, so that its own watch event wakes nothing; only
    /// for a kind a watch follows in that namespace: a pod's batch label,
    /// which no watch delivers, is not remembered forever.
    fn recorded(&self, resolved: &Resolved, written: &DynamicObject) {
        let watched = self
            .cluster
            .watch_cache
            .watches(resolved, written.metadata.namespace.as_deref());
        if watched {
            self.cluster.own_writes.record(written);
            self.cluster.watch_cache.wrote(resolved, written);
        }
    }

    /// Deletes the object decided on, and only it: the uid (and
    /// resourceVersion, when the plan recorded one) must still match.
    pub async fn delete(&self, deletion: &Deletion, mode: Mode) -> Result<Deleted, kube::Error> {
        let Some(resolved) = self.cluster.resolve(&deletion.api_version, &deletion.key.kind).await else {
            return Ok(Deleted::Gone);
        };
        let params = DeleteParams {
            dry_run: mode == Mode::DryRun,
            preconditions: Some(Preconditions {
                uid: Some(deletion.uid.clone()),
                resource_version: deletion.resource_version.clone(),
            }),
            ..if deletion.foreground {
                DeleteParams::foreground()
            } else {
                DeleteParams::background()
            }
        };
        if mode == Mode::Apply {
            self.may_write()?;
        }
        let api = self.api(&resolved, deletion.key.namespace.as_deref());
        match within_write_timeout(api.delete(&deletion.key.name, &params)).await {
            Ok(_) => {
                if mode == Mode::Apply {
                    self.cluster.watch_cache.removed(&resolved, &deletion.key);
                }
                Ok(Deleted::Deleted)
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Deleted::Gone),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Deleted::Changed),
            Err(error) => Err(error),
        }
    }
}

/// How long one write may wait for the API server: a hanging server
/// delays this app's sync, never the agent.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn within_write_timeout<T>(
    write: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(answer) => answer,
        Err(_) => Err(kube::Error::Service(
            format!("no answer from the API server within {} s", WRITE_TIMEOUT.as_secs()).into(),
        )),
    }
}

/// The API server's own words for a refusal, without the client's wrapping.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}
