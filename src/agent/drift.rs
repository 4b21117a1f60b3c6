//! Watches on what the agent manages and on what its Rollouts read: they
//! keep the cluster's watch caches current (so a resync lists nothing) and
//! wake a sync when someone else changes a managed object.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use tracing::debug;

use super::{Seen, Trigger, Triggers};
use crate::MANAGED_BY_LABEL;
use crate::cluster::Cluster;
use crate::rollout::knative;
use crate::rollout::overlay::Released;
use crate::rollout::overlay::WorkloadKind;
use crate::sync::{SyncOptions, SyncReport};

/// Whether a Rollout carries a promote or abort token its status has not
/// acted on yet.
fn pending_signal(rollout: &DynamicObject) -> bool {
    use crate::rollout::api::{ABORT_ANNOTATION, PROMOTE_ANNOTATION};
    let annotations = rollout.metadata.annotations.as_ref();
    let status = &rollout.data["status"];
    [
        (PROMOTE_ANNOTATION, "lastPromoteSignal"),
        (ABORT_ANNOTATION, "lastAbortSignal"),
    ]
    .into_iter()
    .any(|(annotation, acted_on)| {
        let token = annotations.and_then(|a| a.get(annotation));
        crate::rollout::signal::unspent(token, status[acted_on].as_str().unwrap_or_default()).is_some()
    })
}

/// Watches on the kinds gitcanary manages: they keep the cluster's watch
/// cache current (so a resync lists nothing) and wake a sync when someone
/// else changes an object (`kubectl edit`, a deletion), to put it back.
#[derive(Default)]
pub(super) struct DriftWatch {
    /// By apiVersion, kind and namespace (`None`: all namespaces).
    watches: HashMap<(String, String, Option<String>), JoinHandle<()>>,
    /// The app status ConfigMaps, which the sync reads every time.
    statuses: Option<JoinHandle<()>>,
    /// What Rollouts read besides their own objects, by scope.
    kept: HashMap<(Read, Option<String>), JoinHandle<()>>,
    /// What each new watch starts with.
    bookmarks: Bookmarks,
}

/// What a Rollout's release step reads of objects the agent does not manage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Read {
    /// The ReplicaSets of a Deployment (their metadata).
    ReplicaSets,
    /// The pods of a workload kind's revisions.
    Pods(WorkloadKind),
    /// A Knative Service's Revisions.
    KnativeRevisions,
}

impl Read {
    fn of(kind: WorkloadKind) -> &'static [Read] {
        match kind {
            WorkloadKind::Deployment => &[Read::ReplicaSets, Read::Pods(WorkloadKind::Deployment)],
            WorkloadKind::StatefulSet => &[Read::Pods(WorkloadKind::StatefulSet)],
            WorkloadKind::KnativeService => &[Read::KnativeRevisions, Read::Pods(WorkloadKind::KnativeService)],
        }
    }

    /// Its label selects objects of workloads no Rollout governs too: a
    /// StatefulSet's pods carry `controller-revision-hash`, as every
    /// DaemonSet's pod on every node does. Watched in the namespaces
    /// released in only, never in all of them.
    fn selects_others(self) -> bool {
        self == Read::Pods(WorkloadKind::StatefulSet)
    }

    /// Drops what the watch of `scope` kept.
    fn forget(self, cluster: &Cluster, scope: &Option<String>) {
        match self {
            Read::ReplicaSets => cluster.replica_sets.forget(scope),
            Read::Pods(kind) => cluster.revision_pods.of(kind).forget(scope),
            Read::KnativeRevisions => cluster.knative_revisions.forget(scope),
        }
    }
}

/// The watches the revision's Rollouts need: for each kind of workload they
/// release, what its observe reads, in each scope the agent watches
/// (`scopes`: all namespaces, or those it is limited to) that holds one of
/// their namespaces. A scope no Rollout releases in any more is not watched.
fn kept_watches(released: &Released, scopes: &[Option<&str>]) -> BTreeSet<(Read, Option<String>)> {
    let mut watches = BTreeSet::new();
    for (kind, namespace) in released {
        let Some(scope) = scopes.iter().find(|s| s.is_none_or(|s| s == namespace)) else {
            continue;
        };
        for read in Read::of(*kind) {
            let scope = if read.selects_others() {
                Some(namespace.as_str())
            } else {
                *scope
            };
            watches.insert((*read, scope.map(str::to_string)));
        }
    }
    watches
}

/// Wait before a broken watch lists again.
const WATCH_RESTART: Duration = Duration::from_secs(1);

impl DriftWatch {
    /// With `always_bookmarks` (`--watch-bookmarks`, for a path that drops
    /// idle connections silently), every watch asks for bookmarks from the
    /// start; otherwise none does until it needs them.
    pub(super) fn new(always_bookmarks: bool) -> DriftWatch {
        let mut watch = DriftWatch::default();
        watch.bookmarks = Bookmarks(always_bookmarks);
        watch
    }

    pub(super) async fn follow(
        &mut self,
        cluster: &Arc<Cluster>,
        report: &SyncReport,
        options: &SyncOptions,
        triggers: &Triggers,
    ) {
        let selector = format!("{MANAGED_BY_LABEL}={}", options.instance);
        for (api_version, kind) in report.kinds.iter() {
            let Some(resolved) = cluster.resolve(api_version, kind).await else {
                continue;
            };
            // Where the sync lists the kind.
            for scope in options.scopes(resolved.namespaced) {
                let id = (api_version.clone(), kind.clone(), scope.map(str::to_string));
                if self.watches.get(&id).is_some_and(|w| !w.is_finished()) {
                    continue;
                }
                let handle = Self::watch(
                    cluster,
                    &resolved,
                    id.2.as_deref(),
                    &selector,
                    Some(triggers.clone()),
                    self.bookmarks,
                );
                self.watches.insert(id, handle);
            }
        }
        if self.statuses.as_ref().is_none_or(|w| w.is_finished())
            && let Some(resolved) = cluster.resolve("v1", "ConfigMap").await
        {
            let selector = crate::cluster::status_selector(&options.instance);
            self.statuses = Some(Self::watch(
                cluster,
                &resolved,
                Some(&options.state_namespace),
                &selector,
                None,
                self.bookmarks,
            ));
        }
        let wanted = kept_watches(&report.released, &options.scopes(true));
        let stopped: Vec<_> = self.kept.keys().filter(|id| !wanted.contains(id)).cloned().collect();
        for (read, scope) in stopped {
            if let Some(handle) = self.kept.remove(&(read, scope.clone())) {
                // Ended before what it kept is dropped: no late event brings it back.
                handle.abort();
                let _ = handle.await;
            }
            read.forget(cluster, &scope);
        }
        for (read, scope) in wanted {
            if self.kept.get(&(read, scope.clone())).is_some_and(|w| !w.is_finished()) {
                continue;
            }
            if let Some(handle) = Self::watch_read(cluster, read, scope.clone(), self.bookmarks).await {
                self.kept.insert((read, scope), handle);
            }
        }
    }

    /// Starts the watch that keeps `read` in `scope` for the Rollouts'
    /// release steps. Its changes wake nothing: the workload's own watch
    /// does, and what the watch holds is used only where it can stand for a
    /// list (see its readers).
    async fn watch_read(
        cluster: &Arc<Cluster>,
        read: Read,
        scope: Option<String>,
        bookmarks: Bookmarks,
    ) -> Option<JoinHandle<()>> {
        use crate::cluster::pods::{PodHeld, selector};
        use crate::cluster::replica_sets::Held;
        use k8s_openapi::api::apps::v1::ReplicaSet;
        use k8s_openapi::api::core::v1::Pod;
        use kube::core::PartialObjectMeta;
        let client = cluster.client.clone();
        let cluster = cluster.clone();
        Some(match read {
            Read::ReplicaSets => {
                // Metadata only: a ReplicaSet's spec and status are never read.
                let api: Api<PartialObjectMeta<ReplicaSet>> = scoped(client, &scope);
                keep(
                    read,
                    api,
                    watcher::Config::default(),
                    scope,
                    bookmarks,
                    move |scope, event| cluster.replica_sets.take(scope, event, |set| Held::of(&set.metadata)),
                )
            }
            Read::Pods(kind) => {
                let api: Api<Pod> = scoped(client, &scope);
                let config = watcher::Config::default().labels(selector(kind));
                keep(read, api, config, scope, bookmarks, move |scope, event| {
                    cluster
                        .revision_pods
                        .of(kind)
                        .take(scope, event, |pod| PodHeld::of(pod, kind))
                })
            }
            Read::KnativeRevisions => {
                let resolved = cluster.resolve(knative::API_VERSION, "Revision").await?;
                let api = cluster.api(&resolved, scope.as_deref());
                let config = watcher::Config::default().labels(knative::SERVICE_LABEL);
                keep(read, api, config, scope, bookmarks, move |scope, event| {
                    cluster.knative_revisions.take(scope, event, |revision| {
                        let mut value = serde_json::to_value(revision).unwrap_or_default();
                        if let Some(meta) = value["metadata"].as_object_mut() {
                            meta.remove("managedFields");
                        }
                        value
                    })
                })
            }
        })
    }

    /// Keeps the kind's cache in `namespace` (`None`: all) and, with
    /// `triggers`, wakes a sync on every change. A watch that breaks lists
    /// again (and wakes a sync, for what changed in between); its cache does
    /// not answer until that list is done.
    fn watch(
        cluster: &Arc<Cluster>,
        resolved: &crate::model::Resolved,
        namespace: Option<&str>,
        selector: &str,
        triggers: Option<Triggers>,
        bookmarks: Bookmarks,
    ) -> JoinHandle<()> {
        let api = cluster.api(resolved, namespace);
        let config = watcher::Config::default().labels(selector);
        let cache = cluster.watch_cache.register(resolved, namespace, selector);
        let resource = resolved.resource.clone();
        let cluster = cluster.clone();
        let rollouts = resource.group == crate::API_GROUP && resource.kind == crate::rollout::api::KIND;
        let wake = move |version, signal: bool| {
            if let Some(triggers) = &triggers {
                let trigger = if signal {
                    Trigger::Signal(version)
                } else {
                    Trigger::Drift(version)
                };
                let _ = triggers.try_send(trigger);
            }
        };
        // After a break, its list again wakes a sync, for what changed in between.
        let mut relist = false;
        keep(
            resource.kind.clone(),
            api,
            config,
            namespace.map(str::to_string),
            bookmarks,
            move |_, event| match event {
                Some(watcher::Event::Init) => cache.list_started(),
                Some(watcher::Event::InitApply(object)) => cache.listed(&resource, object),
                Some(watcher::Event::InitDone) => {
                    cache.list_done();
                    if relist {
                        wake(None, false);
                    }
                }
                Some(watcher::Event::Apply(object)) => {
                    let version = Seen::of(&resource.group, &resource.kind, &object);
                    let signal = rollouts && pending_signal(&object);
                    cache.changed(&resource, object);
                    wake(version, signal);
                }
                Some(watcher::Event::Delete(object)) => {
                    cluster.own_writes.forget(object.metadata.uid.as_deref());
                    cache.deleted(&crate::cluster::cache::entry(&resource, object).0);
                    wake(None, false);
                }
                None => {
                    cache.interrupted();
                    relist = true;
                }
            },
        )
    }
}

/// An Api of `scope`: one namespace, or all.
fn scoped<K>(client: kube::Client, scope: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    }
}

/// Whether a watch asks the API server for bookmarks.
///
/// A bookmark only moves a watch's resourceVersion on, so that the restart
/// every 290 s (kube's watch timeout) finds it still in the server's window;
/// the server sends one to each watch about once a minute, each a wake-up of
/// the agent at rest. Without them a watch starts again from its last
/// event's (or list's) version, which the server still holds unless its kind
/// had more events since than its watch cache keeps. So a watch asks for
/// none until its version fell out (410 Gone: a list, and a sync, more) or
/// its stream broke (a reset that reached it, such as a load balancer's that
/// closes connections idle for less than the API server's own TCP
/// keepalive, 3 minutes, where bookmarks are traffic), and for them from
/// then on. A path that drops such connections without a word is not seen:
/// kube's idle timer (295 s) resumes the watch, which stalls meanwhile;
/// there `--watch-bookmarks` asks for them from the start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Bookmarks(bool);

impl Bookmarks {
    fn config(self, config: &watcher::Config) -> watcher::Config {
        let mut config = config.clone();
        config.bookmarks = self.0;
        config
    }

    fn after(self, error: &watcher::Error) -> Bookmarks {
        const GONE: u16 = 410;
        let wanted = match error {
            watcher::Error::WatchError(status) => status.code == GONE,
            watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == GONE,
            watcher::Error::WatchFailed(_) => true,
            _ => false,
        };
        Bookmarks(self.0 || wanted)
    }
}

/// Runs a watch of `api` (of `what`) in `scope` that hands each event to
/// `take` (`None` when the watch broke), and lists again after a break. It
/// starts with `bookmarks` (see `Bookmarks`).
fn keep<K>(
    what: impl std::fmt::Debug + Send + 'static,
    api: Api<K>,
    config: watcher::Config,
    scope: Option<String>,
    mut bookmarks: Bookmarks,
    mut take: impl FnMut(&Option<String>, Option<watcher::Event<K>>) + Send + 'static,
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let mut events = std::pin::pin!(watcher(api.clone(), bookmarks.config(&config)));
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => take(&scope, Some(event)),
                    Err(error) => {
                        bookmarks = bookmarks.after(&error);
                        debug!(%error, ?what, ?scope, ?bookmarks, "watch interrupted; it lists again");
                        break;
                    }
                }
            }
            take(&scope, None);
            tokio::time::sleep(WATCH_RESTART).await;
        }
    })
}

impl Drop for DriftWatch {
    fn drop(&mut self) {
        for handle in self
            .watches
            .values()
            .chain(self.statuses.as_ref())
            .chain(self.kept.values())
        {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rollout(annotations: serde_json::Value, status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "echo", "annotations": annotations},
            "status": status,
        }))
        .expect("a Rollout")
    }

    #[test]
    fn a_scope_is_watched_for_what_its_rollouts_read_and_no_longer_once_none_releases_there() {
        use WorkloadKind::{Deployment, KnativeService, StatefulSet};
        let released: Released = [(Deployment, "shop".into()), (StatefulSet, "db".into())].into();
        let watches = |released: &Released, scopes: &[Option<&str>]| -> Vec<(Read, Option<String>)> {
            kept_watches(released, scopes).into_iter().collect()
        };
        assert_eq!(
            watches(&released, &[None]),
            [
                (Read::ReplicaSets, None),
                (Read::Pods(Deployment), None),
                (Read::Pods(StatefulSet), Some("db".to_string()))
            ]
        );
        // Limited to some namespaces: only those a Rollout releases in.
        let shop = Some("shop".to_string());
        assert_eq!(
            watches(&released, &[Some("shop"), Some("web")]),
            [(Read::ReplicaSets, shop.clone()), (Read::Pods(Deployment), shop)]
        );
        let knative: Released = [(KnativeService, "fn".into())].into();
        assert_eq!(
            watches(&knative, &[None]),
            [(Read::Pods(KnativeService), None), (Read::KnativeRevisions, None)]
        );
        // The last Rollout gone: nothing is watched (and what was kept is dropped).
        assert!(watches(&Released::new(), &[None]).is_empty());
    }

    #[test]
    fn a_watch_asks_for_bookmarks_only_once_its_version_expired_or_its_stream_broke() {
        use kube::core::Status;
        use watcher::Error::{InitialListFailed, NoResourceVersion, WatchError, WatchFailed, WatchStartFailed};
        let status = |code| Box::new(Status::failure("watch ended", "").with_code(code));
        let first = Bookmarks::default();
        assert!(!first.config(&watcher::Config::default()).bookmarks);
        // `--watch-bookmarks`: from the start, whatever comes.
        assert!(Bookmarks(true).config(&watcher::Config::default()).bookmarks);
        let asks = |error: watcher::Error| first.after(&error).config(&watcher::Config::default()).bookmarks;
        // Its version fell out of the server's window (in the stream, or as the answer to its start).
        assert!(asks(WatchError(status(410))));
        assert!(asks(WatchStartFailed(kube::Error::Api(status(410)))));
        // Its connection broke.
        assert!(asks(WatchFailed(kube::Error::Api(status(410)))));
        assert!(asks(WatchFailed(kube::Error::LinesCodecMaxLineLengthExceeded)));
        // Anything else leaves it as it was.
        assert!(!asks(WatchError(status(500))));
        assert!(!asks(WatchStartFailed(kube::Error::Api(status(403)))));
        assert!(!asks(InitialListFailed(kube::Error::Api(status(410)))));
        assert!(!asks(NoResourceVersion));
        assert_eq!(Bookmarks(true).after(&NoResourceVersion), Bookmarks(true));
    }

    #[test]
    fn only_a_token_not_acted_on_is_a_pending_signal() {
        let token = json!({"gitcanary.io/abort": "the CLI at 12:00"});
        assert!(pending_signal(&rollout(token.clone(), json!({"phase": "Paused"}))));
        assert!(!pending_signal(&rollout(
            token,
            json!({"phase": "Failed", "lastAbortSignal": "the CLI at 12:00"})
        )));
        assert!(!pending_signal(&rollout(json!({}), json!({"phase": "Paused"}))));
        // As the planner reads it: an empty annotation is new only once a token was acted on.
        assert!(!pending_signal(&rollout(
            json!({"gitcanary.io/abort": ""}),
            json!({"phase": "Paused"})
        )));
        let spent = json!({"phase": "Failed", "lastAbortSignal": "the CLI at 12:00"});
        assert!(pending_signal(&rollout(json!({"gitcanary.io/abort": ""}), spent)));
    }
}
