//! Apps an earlier sync found in order, and what it found them from. When
//! an app's manifests, its commit, the status it recorded and the
//! resourceVersion of every object it holds are all as they were, observe
//! and plan would decide the same "nothing to do" again: the sync reuses
//! that answer instead of parsing the live objects and planning them. Only
//! the agent's watch caches can say "as they were" without a request, so
//! without them nothing is remembered. A Rollout at rest (Healthy, or
//! paused for a promote) is such an app too: its object, its workload and
//! its canary objects are all in the caches, and nothing of it waits on a
//! clock.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::{AppReport, AppResult, SyncReport};
use crate::cluster::cache::KindCache;
use crate::cluster::{AppStatus, Cluster};
use crate::manifest::{App, ObjectKey};
use crate::model::SyncOptions;
use crate::plan::RevisionKeys;
use crate::rollout::api::WrittenBack;
use crate::rollout::model::WrittenBacks;
use crate::{MANAGED_BY_LABEL, rollout};

/// What the inputs of one app's reconcile hash to.
pub type Inputs = [u8; 32];

struct Remembered {
    inputs: Inputs,
    status: AppStatus,
    report: AppReport,
}

/// (apiVersion, kind) pairs.
type Kinds = BTreeSet<(String, String)>;

/// A value made once for the revision validated as a given id; never kept
/// for one not validated (id 0).
struct PerRevision<T>(Mutex<Option<(u64, Arc<T>)>>);

impl<T> Default for PerRevision<T> {
    fn default() -> Self {
        PerRevision(Mutex::new(None))
    }
}

impl<T> PerRevision<T> {
    fn get(&self, validated: u64, make: impl FnOnce() -> T) -> Arc<T> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((id, value)) = kept.as_ref()
            && *id == validated
            && validated != 0
        {
            return value.clone();
        }
        let value = Arc::new(make());
        if validated != 0 {
            *kept = Some((validated, value.clone()));
        }
        value
    }
}

#[derive(Default)]
pub struct SyncMemo {
    apps: Mutex<HashMap<String, Remembered>>,
    /// Write-backs done and not yet recorded in their Rollouts' statuses.
    written_back: Mutex<WrittenBacks>,
    /// Every object of the last revision synced, under its validation id.
    revision_keys: PerRevision<RevisionKeys>,
    /// Every (apiVersion, kind) of the last revision synced, under its validation id.
    revision_kinds: PerRevision<Kinds>,
    /// Where the last revision synced releases which workloads.
    released: PerRevision<crate::rollout::overlay::Released>,
    /// The last sync, when it recalled every app it synced.
    whole: Mutex<Option<(SyncInputs, SyncReport)>>,
}

/// What a whole sync's answer was read from: the revision (as validated),
/// discovery, every watch cache, and the apps in scope. When none of it
/// moved since a sync that recalled every app, each app would be recalled
/// again: the sync is that answer, without a look at each app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncInputs {
    commit: String,
    validated: u64,
    discovery: u64,
    changes: u64,
    scope: Option<BTreeSet<String>>,
}

impl SyncInputs {
    /// Read before anything else of the sync, so that a change meanwhile
    /// makes the next sync look again. `None` for a revision not validated,
    /// or while a watch lists again, is broken, or the app statuses' watch
    /// is not kept yet: a read then goes to the API server and moves no count.
    pub fn of(
        cluster: &Cluster,
        revision: &crate::source::Revision,
        scope: Option<&BTreeSet<String>>,
        options: &SyncOptions,
    ) -> Option<SyncInputs> {
        let statuses = crate::cluster::status_selector(&options.instance);
        let cached = cluster
            .watch_cache
            .all_current_with("v1", "ConfigMap", Some(&options.state_namespace), &statuses);
        (cached && revision.validated() != 0).then(|| SyncInputs {
            commit: revision.commit.clone(),
            validated: revision.validated(),
            discovery: cluster.discovery_generation(),
            changes: cluster.watch_cache.changes(),
            scope: scope.cloned(),
        })
    }
}

impl SyncMemo {
    /// The last sync's answer, when it recalled every app and nothing it
    /// was read from moved since.
    pub fn recall_sync(&self, inputs: Option<&SyncInputs>) -> Option<SyncReport> {
        let kept = self.whole.lock().unwrap_or_else(|e| e.into_inner());
        let (_, report) = kept.as_ref().filter(|(was, _)| Some(was) == inputs)?;
        tracing::debug!("nothing the sync reads changed since the last one, which recalled every app");
        Some(SyncReport {
            recalled: true,
            ..report.clone()
        })
    }

    /// Keeps the sync's answer for [`SyncMemo::recall_sync`] when it
    /// recalled every app in scope; forgets the last one otherwise.
    pub fn remember_sync(&self, inputs: Option<SyncInputs>, report: &SyncReport, apps_in_scope: usize) {
        let all_recalled = report.apps.len() == apps_in_scope && report.apps.iter().all(|app| app.recalled);
        *self.whole.lock().unwrap_or_else(|e| e.into_inner()) =
            inputs.filter(|_| all_recalled).map(|inputs| (inputs, report.clone()));
    }

    /// The report of the last sync of the app, if it found nothing to do
    /// and the inputs are the same now.
    pub fn recall(&self, app: &str, inputs: &Inputs, status: Option<&AppStatus>) -> Option<AppReport> {
        let apps = self.apps.lock().unwrap_or_else(|e| e.into_inner());
        let remembered = apps.get(app)?;
        let same = remembered.inputs == *inputs && status == Some(&remembered.status);
        same.then(|| AppReport {
            recalled: true,
            duration: std::time::Duration::ZERO,
            ..remembered.report.clone()
        })
    }

    /// Remembers an app the sync left as it found it: nothing written,
    /// nothing to wait for, and the status it recorded already in place.
    pub fn remember(&self, inputs: Inputs, status: AppStatus, report: &AppReport) {
        let quiet = report.result == AppResult::Synced
            && report.problems.is_empty()
            && report.applied.is_empty()
            && report.pruned.is_empty()
            && report.released.is_empty()
            && report.canary_applied.is_empty()
            && report.canary_deleted.is_empty()
            && report.drifted.is_empty()
            && report.requeue.is_none()
            && report.writebacks.is_empty()
            // A Rollout whose status moved, or that waits on a clock (the
            // requeue above), is planned again; one at rest is not.
            && report.rollouts.iter().all(|r| !r.changed);
        let mut apps = self.apps.lock().unwrap_or_else(|e| e.into_inner());
        if quiet {
            apps.insert(
                report.app.clone(),
                Remembered {
                    inputs,
                    status,
                    report: report.clone(),
                },
            );
        } else {
            apps.remove(&report.app);
        }
    }

    /// The keys of every object of the revision validated as `validated`,
    /// made once per revision rather than once per sync (a drift's sync of
    /// one app needs them too). A revision not validated is not remembered.
    pub fn revision_keys(&self, validated: u64, make: impl FnOnce() -> RevisionKeys) -> Arc<RevisionKeys> {
        self.revision_keys.get(validated, make)
    }

    /// Every (apiVersion, kind) of the revision validated as `validated`,
    /// made once per revision (as [`SyncMemo::revision_keys`]).
    pub fn revision_kinds(&self, validated: u64, make: impl FnOnce() -> Kinds) -> Arc<Kinds> {
        self.revision_kinds.get(validated, make)
    }

    /// Where the Rollouts of the revision validated as `validated` release
    /// which kind of workload, made once per revision.
    pub fn released(
        &self,
        validated: u64,
        make: impl FnOnce() -> crate::rollout::overlay::Released,
    ) -> Arc<crate::rollout::overlay::Released> {
        self.released.get(validated, make)
    }

    /// Hands a write-back done to Git to the next plan of its Rollout.
    pub fn record_written(&self, namespace: &str, name: &str, written: WrittenBack) {
        *self.whole.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let mut all = self.written_back.lock().unwrap_or_else(|e| e.into_inner());
        all.insert((namespace.to_string(), name.to_string()), written);
    }

    /// Whether a write-back waits to be recorded in its Rollout's status.
    pub fn writing_back(&self) -> bool {
        !self.written_back.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    pub fn written_back(&self) -> WrittenBacks {
        self.written_back.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Drops the write-backs a sync recorded, or that no longer match what
    /// their Rollout waits to write (another release's, or none).
    pub fn settle_written(&self, reports: &[AppReport]) {
        let mut all = self.written_back.lock().unwrap_or_else(|e| e.into_inner());
        for rollout in reports.iter().flat_map(|r| r.rollouts.iter()) {
            let key = (rollout.namespace.clone(), rollout.name.clone());
            let waits = |w: &WrittenBack| {
                rollout
                    .status
                    .pending_writeback
                    .as_ref()
                    .is_some_and(|p| w.is_done_of(p))
            };
            if all.get(&key).is_some_and(|w| !waits(w)) {
                all.remove(&key);
            }
        }
    }

    pub fn forget(&self, app: &str) {
        *self.whole.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.apps.lock().unwrap_or_else(|e| e.into_inner()).remove(app);
    }

    /// Drops the apps the revision no longer holds.
    pub fn keep_only<'a>(&self, apps: impl Iterator<Item = &'a str>) {
        let keep: BTreeSet<&str> = apps.collect();
        self.apps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|app, _| keep.contains(app.as_str()));
    }
}

/// The inputs of the app's reconcile, when every one of them can be known
/// without a request, with the keys of the objects it holds: `None` for an
/// app with problems, or with a kind the watch caches do not keep current.
/// A Rollout's inputs are its object (status and signals included) and
/// its workload, both among the app's objects, and its canary objects.
pub async fn inputs_of(
    cluster: &Cluster,
    app: &App,
    commit: &str,
    options: &SyncOptions,
) -> Option<(Inputs, Vec<(String, ObjectKey)>)> {
    if !app.problems.is_empty() {
        return None;
    }
    let mut hasher = Sha256::new();
    hasher.update(app.digest());
    hasher.update(commit.as_bytes());
    hasher.update(cluster.discovery_generation().to_le_bytes());
    let mut keys = Vec::with_capacity(app.manifests.len());
    let mut versions = Versions {
        cluster,
        options,
        selector: format!("{MANAGED_BY_LABEL}={}", options.instance),
        caches: Vec::new(),
    };
    for manifest in app.manifests.iter() {
        let api_version = manifest.api_version();
        let key = versions
            .hash(&mut hasher, api_version, manifest.key(), manifest.namespace())
            .await?;
        keys.push((api_version.to_string(), key));
        if rollout::api::is_rollout(manifest) {
            let spec: rollout::api::RolloutSpec = serde_json::from_value(manifest.object["spec"].clone()).ok()?;
            let namespace = manifest.namespace().unwrap_or(&options.allowed.default_namespace);
            for (api_version, kind, name) in rollout::model::canary_object_names(&spec)? {
                let key = ObjectKey {
                    group: api_version.rsplit_once('/').map_or("", |(group, _)| group).to_string(),
                    kind: kind.to_string(),
                    namespace: Some(namespace.to_string()),
                    name,
                };
                versions.hash(&mut hasher, api_version, key, Some(namespace)).await?;
            }
        }
    }
    Some((hasher.finalize().into(), keys))
}

/// resourceVersions from the watch caches, each of the app's few kinds
/// looked up once, not once per object.
struct Versions<'a> {
    cluster: &'a Cluster,
    options: &'a SyncOptions,
    selector: String,
    caches: Vec<(String, String, Option<String>, Arc<KindCache>)>,
}

impl Versions<'_> {
    /// Hashes the object's key and resourceVersion ("absent" when it does
    /// not exist); returns the key with its namespace, `None` when no cache
    /// keeps the kind current there.
    async fn hash(
        &mut self,
        hasher: &mut Sha256,
        api_version: &str,
        key: ObjectKey,
        namespace: Option<&str>,
    ) -> Option<ObjectKey> {
        let resolved = self.cluster.resolve(api_version, &key.kind).await?;
        let namespace = resolved
            .namespaced
            .then(|| namespace.unwrap_or(&self.options.allowed.default_namespace).to_string());
        let scope = match self.options.scopes(resolved.namespaced)[..] {
            [None] => None,
            ref scopes => Some(
                scopes
                    .iter()
                    .flatten()
                    .find(|s| Some(**s) == namespace.as_deref())?
                    .to_string(),
            ),
        };
        let known = self
            .caches
            .iter()
            .find(|(a, k, s, _)| a == api_version && *k == key.kind && *s == scope)
            .map(|(_, _, _, cache)| cache.clone());
        let cache = match known {
            Some(cache) => cache,
            None => {
                let cache = self
                    .cluster
                    .watch_cache
                    .kind(&resolved, scope.as_deref(), &self.selector)?;
                let entry = (api_version.to_string(), key.kind.clone(), scope, cache.clone());
                self.caches.push(entry);
                cache
            }
        };
        let key = ObjectKey { namespace, ..key };
        let version = cache.version(&key)?;
        for part in [&key.group, &key.kind, key.namespace.as_deref().unwrap_or(""), &key.name] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hasher.update(version.as_deref().unwrap_or("absent").as_bytes());
        hasher.update([0]);
        Some(key)
    }
}

/// Whether the recorded inventory is exactly these objects: objects that
/// left Git are pruned or kept by rules that read other apps, so such an
/// app is not remembered. (A recalled app needs no such check: its status
/// and objects are the ones checked when it was remembered.)
pub fn holds_exactly(previous: Option<&AppStatus>, mut keys: Vec<(String, ObjectKey)>) -> bool {
    let Some(previous) = previous.filter(|p| p.unreadable_inventory.is_none()) else {
        return false;
    };
    let mut recorded: Vec<(String, ObjectKey)> = previous
        .inventory
        .iter()
        .map(|entry| (entry.api_version.clone(), entry.key()))
        .collect();
    recorded.sort();
    keys.sort();
    recorded.dedup();
    keys.dedup();
    recorded == keys
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{SyncInputs, SyncMemo};
    use crate::plan::RevisionKeys;

    #[test]
    fn a_revisions_keys_are_made_once_per_validation_and_never_for_one_not_validated() {
        let memo = SyncMemo::default();
        let mut made = 0;
        let mut keys = |validated| {
            memo.revision_keys(validated, || {
                made += 1;
                RevisionKeys::default()
            })
        };
        let first = keys(7);
        assert!(Arc::ptr_eq(&first, &keys(7)), "the same revision");
        keys(8);
        keys(0);
        keys(0);
        assert!(!Arc::ptr_eq(&first, &keys(7)), "another revision came in between");
        assert_eq!(made, 5);
    }

    #[test]
    fn a_revisions_kinds_are_made_once_per_validation() {
        let memo = SyncMemo::default();
        let mut made = 0;
        let mut kinds = |validated, kind: &str| {
            memo.revision_kinds(validated, || {
                made += 1;
                [("v1".to_string(), kind.to_string())].into()
            })
        };
        assert!(kinds(7, "ConfigMap").contains(&("v1".into(), "ConfigMap".into())));
        assert!(
            kinds(7, "Secret").contains(&("v1".into(), "ConfigMap".into())),
            "the same revision"
        );
        assert!(
            kinds(8, "Secret").contains(&("v1".into(), "Secret".into())),
            "another revision"
        );
        kinds(0, "Secret");
        kinds(0, "Secret");
        assert_eq!(made, 4);
    }

    fn report(recalled: &[bool]) -> crate::sync::SyncReport {
        crate::sync::SyncReport {
            commit: "c1".into(),
            apps: recalled
                .iter()
                .enumerate()
                .map(|(index, recalled)| crate::sync::AppReport {
                    recalled: *recalled,
                    ..crate::sync::AppReport::new(&format!("app-{index}"), crate::sync::AppResult::Synced)
                })
                .collect::<Vec<_>>()
                .into(),
            kinds: Default::default(),
            released: Default::default(),
            scoped: false,
            recalled: false,
        }
    }

    fn inputs(changes: u64) -> SyncInputs {
        SyncInputs {
            commit: "c1".into(),
            validated: 3,
            discovery: 1,
            changes,
            scope: None,
        }
    }

    #[test]
    fn a_whole_sync_is_recalled_only_after_one_that_recalled_every_app_and_while_nothing_it_read_moved() {
        let memo = SyncMemo::default();
        memo.remember_sync(Some(inputs(5)), &report(&[true, false]), 2);
        assert!(memo.recall_sync(Some(&inputs(5))).is_none(), "an app was planned");
        memo.remember_sync(Some(inputs(5)), &report(&[true]), 2);
        assert!(
            memo.recall_sync(Some(&inputs(5))).is_none(),
            "an app was not synced at all"
        );
        memo.remember_sync(Some(inputs(5)), &report(&[true, true]), 2);
        assert_eq!(memo.recall_sync(Some(&inputs(5))).map(|r| r.apps.len()), Some(2));
        assert!(memo.recall_sync(Some(&inputs(6))).is_none(), "a cache changed");
        let scoped = SyncInputs {
            scope: Some(["app-0".to_string()].into()),
            ..inputs(5)
        };
        assert!(memo.recall_sync(Some(&scoped)).is_none(), "another scope");
        memo.forget("app-1");
        assert!(memo.recall_sync(Some(&inputs(5))).is_none(), "an app forgotten");
        memo.remember_sync(Some(inputs(5)), &report(&[true, true]), 2);
        let done = crate::rollout::api::WrittenBack::default();
        memo.record_written("web", "echo", done);
        assert!(memo.recall_sync(Some(&inputs(5))).is_none(), "a write-back done since");
        memo.remember_sync(None, &report(&[true, true]), 2);
        assert!(memo.recall_sync(Some(&inputs(5))).is_none(), "a revision not validated");
    }
}
