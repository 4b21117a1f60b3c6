//! Live objects kept current by watches, so a resync in the steady state
//! reads memory instead of listing every kind. Each watched kind and scope
//! has one cache; it answers only while its watch is unbroken since its last
//! full list (a gap makes the next sync list once, as before).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use kube::api::DynamicObject;

use crate::manifest::ObjectKey;
use crate::model::Resolved;
use crate::plan::RevisionKeys;

/// apiVersion, kind, the namespace watched (`None`: all), and the label
/// selector (`key=value`).
pub type CacheId = (String, String, Option<String>, String);

#[derive(Default)]
pub struct KindCache {
    objects: RwLock<HashMap<ObjectKey, Cached>>,
    /// Objects of the list in progress after a (re)start of the watch.
    listing: Mutex<HashMap<ObjectKey, Cached>>,
    synced: AtomicBool,
    /// Counts every change of any cache of the agent's (see [`WatchCache::changes`]).
    changes: Arc<AtomicU64>,
}

/// One object as kept: its resourceVersion apart, so that "did it change"
/// needs no parsing.
struct Cached {
    version: Box<str>,
    text: Box<str>,
}

fn cached(resource: &kube::discovery::ApiResource, object: DynamicObject) -> (ObjectKey, Cached) {
    let version = object
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default()
        .into_boxed_str();
    let (key, text) = entry(resource, object);
    (key, Cached { version, text })
}

impl KindCache {
    /// A (re)list started: what the cache holds may be stale until it ends.
    pub fn list_started(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.synced.store(false, Ordering::SeqCst);
        self.listing.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub fn listed(&self, resource: &kube::discovery::ApiResource, object: DynamicObject) {
        let (key, object) = cached(resource, object);
        self.listing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, object);
    }

    pub fn list_done(&self) {
        let mut listed = std::mem::take(&mut *self.listing.lock().unwrap_or_else(|e| e.into_inner()));
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        // A write of the agent's that landed while the list was read is newer
        // than the list's copy of the object: it stays.
        for (key, kept) in objects.drain() {
            if let Some(listed_copy) = listed.get_mut(&key)
                && is_older(&listed_copy.version, &kept.version)
            {
                *listed_copy = kept;
            }
        }
        *objects = listed;
        self.synced.store(true, Ordering::SeqCst);
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    pub fn changed(&self, resource: &kube::discovery::ApiResource, object: DynamicObject) {
        let (key, object) = cached(resource, object);
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        // The agent's own write is kept at once; an event older than it, still
        // on its way, must not put the object back as it was before.
        if objects
            .get(&key)
            .is_some_and(|kept| is_older(&object.version, &kept.version))
        {
            return;
        }
        objects.insert(key, object);
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The object's JSON as kept (`None` inside: not in the cache); `None`
    /// outside when the cache is not current.
    pub fn get(&self, key: &ObjectKey) -> Option<Option<Box<str>>> {
        if !self.synced.load(Ordering::SeqCst) {
            return None;
        }
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        Some(objects.get(key).map(|object| object.text.clone()))
    }

    pub fn deleted(&self, key: &ObjectKey) {
        self.objects.write().unwrap_or_else(|e| e.into_inner()).remove(key);
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The watch broke: events may be missed until it has listed again.
    pub fn interrupted(&self) {
        self.synced.store(false, Ordering::SeqCst);
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Calls `visit` with each object's key, resourceVersion and JSON;
    /// `false` (and no call) when the cache is not current.
    pub fn visit(&self, mut visit: impl FnMut(&ObjectKey, &str, &str)) -> bool {
        if !self.synced.load(Ordering::SeqCst) {
            return false;
        }
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        for (key, object) in objects.iter() {
            visit(key, &object.version, &object.text);
        }
        true
    }

    /// The objects of `keys` the cache holds, with their JSON; `None` when
    /// the cache is not current.
    pub fn get_each<'k>(&self, keys: impl Iterator<Item = &'k ObjectKey>) -> Option<Vec<(ObjectKey, Box<str>)>> {
        if !self.synced.load(Ordering::SeqCst) {
            return None;
        }
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let held = keys.filter_map(|key| Some((key.clone(), objects.get(key)?.text.clone())));
        Some(held.collect())
    }

    /// How many objects the cache holds.
    pub fn held(&self) -> usize {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The object's resourceVersion (`None`: not in the cache); `None` outside
    /// when the cache is not current.
    pub fn version(&self, key: &ObjectKey) -> Option<Option<Box<str>>> {
        if !self.synced.load(Ordering::SeqCst) {
            return None;
        }
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        Some(objects.get(key).map(|object| object.version.clone()))
    }
}

/// Whether resourceVersion `version` is older than `kept`. The versions are
/// opaque to clients, but etcd's are its revision counter; one that is not
/// a number is never taken as older.
fn is_older(version: &str, kept: &str) -> bool {
    match (version.parse::<u64>(), kept.parse::<u64>()) {
        (Ok(version), Ok(kept)) => version < kept,
        _ => false,
    }
}

/// The key and compact JSON an object is kept as (typed, without managedFields).
pub fn entry(resource: &kube::discovery::ApiResource, mut object: DynamicObject) -> (ObjectKey, Box<str>) {
    object.metadata.managed_fields = None;
    let key = ObjectKey {
        group: resource.group.clone(),
        kind: resource.kind.clone(),
        namespace: object.metadata.namespace.clone(),
        name: object.metadata.name.clone().unwrap_or_default(),
    };
    // List and watch items carry no type; the desired objects do.
    object.types = Some(kube::api::TypeMeta {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
    });
    let text = serde_json::to_string(&object).unwrap_or_default();
    (key, text.into_boxed_str())
}

#[derive(Default)]
pub struct WatchCache {
    kinds: Mutex<HashMap<CacheId, Arc<KindCache>>>,
    changes: Arc<AtomicU64>,
}

fn id(resolved: &Resolved, scope: Option<&str>, selector: &str) -> CacheId {
    id_of(&resolved.resource.api_version, &resolved.resource.kind, scope, selector)
}

fn id_of(api_version: &str, kind: &str, scope: Option<&str>, selector: &str) -> CacheId {
    (
        api_version.to_string(),
        kind.to_string(),
        scope.map(str::to_string),
        selector.to_string(),
    )
}

/// Whether the object's labels hold the `key=value` selector.
fn selects(selector: &str, object: &DynamicObject) -> bool {
    let Some((key, value)) = selector.split_once('=') else {
        return false;
    };
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(key))
        .is_some_and(|v| v == value)
}

impl WatchCache {
    /// The cache a watch of this kind and scope keeps (made on first use).
    pub fn register(&self, resolved: &Resolved, scope: Option<&str>, selector: &str) -> Arc<KindCache> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        let changes = &self.changes;
        let cache = kinds.entry(id(resolved, scope, selector)).or_insert_with(|| {
            changes.fetch_add(1, Ordering::SeqCst);
            Arc::new(KindCache {
                changes: changes.clone(),
                ..KindCache::default()
            })
        });
        cache.clone()
    }

    /// Whether a cache of `(api_version, kind, scope, selector)` is kept and
    /// every cache is current: none is listing again or broken, when a read
    /// may have gone to the API server instead and moved no count.
    pub fn all_current_with(&self, api_version: &str, kind: &str, scope: Option<&str>, selector: &str) -> bool {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        kinds.contains_key(&id_of(api_version, kind, scope, selector))
            && kinds.values().all(|cache| cache.synced.load(Ordering::SeqCst))
    }

    /// A count that moves with every change of any cache (a watch event, a
    /// list, a break, an own write): the same count means the caches answer
    /// as they did.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// The objects of the kind in the scope that the selector selects and
    /// whose key `wanted` keeps, when a watch keeps them current: a sync of
    /// one app copies its objects, not every object of their kinds.
    pub fn objects_where(
        &self,
        resolved: &Resolved,
        scope: Option<&str>,
        selector: &str,
        wanted: Option<&RevisionKeys>,
    ) -> Option<Vec<(ObjectKey, Box<str>)>> {
        let cache = self.kind(resolved, scope, selector)?;
        let resource = &resolved.resource;
        if let Some(wanted) = wanted
            && wanted.len() < cache.held()
        {
            // A sync of a few apps of thousands: each object looked up, not
            // every object of the kind visited.
            let of_kind = wanted
                .iter()
                .filter(|key| key.kind == resource.kind && key.group == resource.group);
            return cache.get_each(of_kind);
        }
        let wanted = |key: &ObjectKey| wanted.is_none_or(|wanted| wanted.holds(key));
        let mut kept = Vec::new();
        let current = cache.visit(|key, _, text| {
            if wanted(key) {
                kept.push((key.clone(), Box::from(text)));
            }
        });
        current.then_some(kept)
    }

    /// What gitcanary's own write returned, at once: the next sync must not
    /// find the state before it because the watch event is still on its way.
    pub fn wrote(&self, resolved: &Resolved, object: &DynamicObject) {
        let key = entry(&resolved.resource, object.clone()).0;
        for (selector, cache) in self.covering(resolved, object.metadata.namespace.as_deref()) {
            if selects(&selector, object) {
                cache.changed(&resolved.resource, object.clone());
            } else {
                // An object gitcanary let go of (its label removed) leaves the cache.
                cache.deleted(&key);
            }
        }
    }

    /// The cache of the kind in the scope for the selector, if a watch keeps one.
    pub fn kind(&self, resolved: &Resolved, scope: Option<&str>, selector: &str) -> Option<Arc<KindCache>> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        kinds.get(&id(resolved, scope, selector)).cloned()
    }

    pub fn removed(&self, resolved: &Resolved, key: &ObjectKey) {
        for (_, cache) in self.covering(resolved, key.namespace.as_deref()) {
            cache.deleted(key);
        }
    }

    /// Whether a watch delivers changes of the kind in `namespace`.
    pub fn watches(&self, resolved: &Resolved, namespace: Option<&str>) -> bool {
        !self.covering(resolved, namespace).is_empty()
    }

    /// Caches of the kind whose scope holds `namespace`, with their selectors.
    fn covering(&self, resolved: &Resolved, namespace: Option<&str>) -> Vec<(String, Arc<KindCache>)> {
        let kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        kinds
            .iter()
            .filter(|((api_version, kind, scope, _), _)| {
                *api_version == resolved.resource.api_version
                    && *kind == resolved.resource.kind
                    && (scope.is_none() || scope.as_deref() == namespace)
            })
            .map(|((_, _, _, selector), cache)| (selector.clone(), cache.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::discovery::ApiResource;

    fn rollout(version: &str, step: i64) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gitcanary.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "echo", "namespace": "web", "resourceVersion": version},
            "status": {"canaryStatus": {"currentStepIndex": step}},
        }))
        .expect("a Rollout")
    }

    fn key() -> ObjectKey {
        ObjectKey {
            group: "gitcanary.io".into(),
            kind: "Rollout".into(),
            namespace: Some("web".into()),
            name: "echo".into(),
        }
    }

    #[test]
    fn an_event_older_than_the_agents_own_write_does_not_undo_it() {
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let resource = ApiResource {
            group: "gitcanary.io".into(),
            kind: "Rollout".into(),
            ..resource
        };
        let cache = KindCache::default();
        assert_eq!(cache.get(&key()), None, "not current before its first list");
        cache.list_started();
        cache.listed(&resource, rollout("10", 0));
        cache.list_done();
        // The agent wrote step 2 (version 12); the event of version 11 arrives after.
        cache.changed(&resource, rollout("12", 2));
        cache.changed(&resource, rollout("11", 1));
        let kept = cache.get(&key()).flatten().expect("kept");
        assert!(kept.contains("\"currentStepIndex\":2"), "{kept}");
        cache.changed(&resource, rollout("13", 3));
        assert!(
            cache
                .get(&key())
                .flatten()
                .expect("kept")
                .contains("\"currentStepIndex\":3")
        );
        cache.interrupted();
        assert_eq!(cache.get(&key()), None, "not current while the watch is broken");
        // A relist read before the agent's write of version 14 does not undo it.
        cache.list_started();
        cache.listed(&resource, rollout("13", 3));
        cache.changed(&resource, rollout("14", 4));
        cache.list_done();
        assert!(
            cache
                .get(&key())
                .flatten()
                .expect("kept")
                .contains("\"currentStepIndex\":4")
        );
    }

    #[test]
    fn the_objects_a_sync_wants_are_the_ones_it_names_whether_looked_up_or_visited() {
        let resource = ApiResource {
            group: "gitcanary.io".into(),
            kind: "Rollout".into(),
            ..ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&())
        };
        let resolved = Resolved {
            resource: resource.clone(),
            namespaced: true,
        };
        let caches = WatchCache::default();
        let cache = caches.register(&resolved, Some("web"), "a=b");
        let named = |name: &str| ObjectKey {
            name: name.into(),
            ..key()
        };
        let wanted_of = |names: &[&str]| {
            let mut wanted = RevisionKeys::default();
            wanted.extend(names.iter().map(|name| named(name)));
            // Another kind's object of the same name, which no Rollout cache holds.
            wanted.extend([ObjectKey {
                kind: "ConfigMap".into(),
                group: String::new(),
                ..named("a")
            }]);
            wanted
        };
        let names = |objects: Option<Vec<(ObjectKey, Box<str>)>>| {
            let mut names: Vec<String> = objects.expect("current").into_iter().map(|(key, _)| key.name).collect();
            names.sort();
            names
        };
        assert!(
            caches
                .objects_where(&resolved, Some("web"), "a=b", Some(&wanted_of(&["a"])))
                .is_none(),
            "not listed yet"
        );
        cache.list_started();
        for name in ["a", "b", "c", "d"] {
            let mut object = rollout("10", 0);
            object.metadata.name = Some(name.into());
            cache.listed(&resource, object);
        }
        cache.list_done();
        // Fewer wanted than held: looked up; as many or more: visited.
        for wanted in [&["a", "gone"][..], &["a", "b", "c", "gone", "also-gone"]] {
            let found = caches.objects_where(&resolved, Some("web"), "a=b", Some(&wanted_of(wanted)));
            let expected: Vec<&str> = wanted.iter().copied().filter(|name| !name.contains("gone")).collect();
            assert_eq!(names(found), expected, "{wanted:?}");
        }
        let everything = caches.objects_where(&resolved, Some("web"), "a=b", None);
        assert_eq!(names(everything), ["a", "b", "c", "d"]);
    }

    #[test]
    fn the_change_count_moves_with_every_change_of_any_cache_and_only_then() {
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let resource = ApiResource {
            group: "gitcanary.io".into(),
            kind: "Rollout".into(),
            ..resource
        };
        let resolved = Resolved {
            resource: resource.clone(),
            namespaced: true,
        };
        let caches = WatchCache::default();
        let mut seen = caches.changes();
        let mut moved = |what: &str, caches: &WatchCache| {
            let now = caches.changes();
            assert_ne!(now, seen, "{what} moves the count");
            seen = now;
        };
        let cache = caches.register(&resolved, Some("web"), "a=b");
        moved("a new cache", &caches);
        cache.list_started();
        moved("a list started", &caches);
        cache.listed(&resource, rollout("10", 0));
        cache.list_done();
        moved("a list done", &caches);
        cache.changed(&resource, rollout("12", 2));
        moved("a watch event", &caches);
        let before = caches.changes();
        cache.changed(&resource, rollout("11", 1));
        caches.register(&resolved, Some("web"), "a=b");
        assert_eq!(
            caches.changes(),
            before,
            "an event older than what is kept, a cache already there"
        );
        cache.deleted(&key());
        moved("a deletion", &caches);
        cache.interrupted();
        moved("a broken watch", &caches);
    }
}
