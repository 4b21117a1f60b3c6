//! What a watch keeps of the objects a Rollout's release step reads besides
//! its own (ReplicaSets, canary pods, Knative Revisions), by the scope of
//! the watch: all namespaces (`None`) or one. A lookup is answered only
//! while a watch covering the namespace has listed and holds; otherwise the
//! caller lists as before.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::watcher;

/// What one watch keeps.
struct Watched<H> {
    /// The watch's list is done and nothing broke it since.
    listed: bool,
    /// By namespace, then name: a lookup reads one namespace's.
    held: HashMap<String, HashMap<String, H>>,
    /// What a list in progress has found so far.
    listing: HashMap<String, HashMap<String, H>>,
}

impl<H> Default for Watched<H> {
    fn default() -> Self {
        Watched {
            listed: false,
            held: HashMap::new(),
            listing: HashMap::new(),
        }
    }
}

/// One kind's objects, as much of each as `H` keeps, by the watch's scope.
pub struct Kept<H> {
    scopes: Mutex<HashMap<Option<String>, Watched<H>>>,
}

impl<H> Default for Kept<H> {
    fn default() -> Self {
        Kept {
            scopes: Mutex::new(HashMap::new()),
        }
    }
}

/// An object's place: its namespace and name.
pub type Place = (String, String);

impl<H> Kept<H> {
    /// `read` of what the watch covering `namespace` holds there (nothing
    /// held is an empty map), or `None` when no such watch has listed.
    pub fn read<R>(&self, namespace: &str, read: impl FnOnce(&HashMap<String, H>) -> R) -> Option<R> {
        let scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        let watched = [Some(namespace.to_string()), None]
            .iter()
            .find_map(|scope| scopes.get(scope).filter(|w| w.listed))?;
        let empty = HashMap::new();
        Some(read(watched.held.get(namespace).unwrap_or(&empty)))
    }

    fn with(&self, scope: &Option<String>, change: impl FnOnce(&mut Watched<H>)) {
        let mut scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        change(scopes.entry(scope.clone()).or_default());
    }

    pub fn list_started(&self, scope: &Option<String>) {
        self.with(scope, |watched| {
            watched.listed = false;
            watched.listing.clear();
        });
    }

    pub fn listed(&self, scope: &Option<String>, (namespace, name): Place, held: H) {
        self.with(scope, |watched| {
            watched.listing.entry(namespace).or_default().insert(name, held);
        });
    }

    pub fn list_done(&self, scope: &Option<String>) {
        self.with(scope, |watched| {
            watched.held = std::mem::take(&mut watched.listing);
            watched.listed = true;
        });
    }

    pub fn changed(&self, scope: &Option<String>, (namespace, name): Place, held: H) {
        self.with(scope, |watched| {
            watched.held.entry(namespace).or_default().insert(name, held);
        });
    }

    pub fn deleted(&self, scope: &Option<String>, (namespace, name): &Place) {
        self.with(scope, |watched| {
            if let Some(in_namespace) = watched.held.get_mut(namespace) {
                in_namespace.remove(name);
                if in_namespace.is_empty() {
                    watched.held.remove(namespace);
                }
            }
        });
    }

    /// The watch broke: nothing is answered until it has listed again.
    pub fn interrupted(&self, scope: &Option<String>) {
        self.with(scope, |watched| watched.listed = false);
    }

    /// Changes what every watch holding `namespace`'s `name` keeps of it: a
    /// write of the agent's own, seen before its event arrives.
    pub fn amend(&self, namespace: &str, name: &str, change: impl Fn(&mut H)) {
        let mut scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        for watched in scopes.values_mut() {
            if let Some(held) = watched.held.get_mut(namespace).and_then(|n| n.get_mut(name)) {
                change(held);
            }
        }
    }

    /// Takes in one event of the watch of `scope` (`None`: the watch broke),
    /// keeping what `hold` makes of each object.
    pub fn take<K: kube::Resource>(
        &self,
        scope: &Option<String>,
        event: Option<watcher::Event<K>>,
        hold: impl Fn(&K) -> H,
    ) {
        match event {
            None => self.interrupted(scope),
            Some(watcher::Event::Init) => self.list_started(scope),
            Some(watcher::Event::InitApply(object)) => self.listed(scope, place_of(object.meta()), hold(&object)),
            Some(watcher::Event::InitDone) => self.list_done(scope),
            Some(watcher::Event::Apply(object)) => self.changed(scope, place_of(object.meta()), hold(&object)),
            Some(watcher::Event::Delete(object)) => self.deleted(scope, &place_of(object.meta())),
        }
    }

    /// The watch was stopped (no Rollout reads its scope any more): what it
    /// kept is dropped.
    pub fn forget(&self, scope: &Option<String>) {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner()).remove(scope);
    }
}

/// An object's namespace and name, as a watch event gives its metadata.
pub fn place_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Place {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(name: &str) -> Place {
        ("shop".to_string(), name.to_string())
    }

    fn names(kept: &Kept<u32>, namespace: &str) -> Option<Vec<(String, u32)>> {
        kept.read(namespace, |held| {
            let mut all: Vec<_> = held.iter().map(|(name, n)| (name.clone(), *n)).collect();
            all.sort();
            all
        })
    }

    #[test]
    fn a_namespace_is_answered_only_once_a_watch_covering_it_has_listed_and_while_it_holds() {
        for scope in [None, Some("shop".to_string())] {
            let kept = Kept::<u32>::default();
            assert_eq!(names(&kept, "shop"), None, "no watch");
            kept.list_started(&scope);
            kept.listed(&scope, place("a"), 1);
            assert_eq!(names(&kept, "shop"), None, "not listed yet");
            kept.list_done(&scope);
            assert_eq!(names(&kept, "shop"), Some(vec![("a".into(), 1)]));
            let other = if scope.is_none() { Some(vec![]) } else { None };
            assert_eq!(
                names(&kept, "other"),
                other,
                "another namespace: held by the all-namespaces watch only"
            );
            kept.changed(&scope, place("b"), 2);
            kept.changed(&scope, place("a"), 3);
            assert_eq!(names(&kept, "shop"), Some(vec![("a".into(), 3), ("b".into(), 2)]));
            kept.deleted(&scope, &place("a"));
            assert_eq!(names(&kept, "shop"), Some(vec![("b".into(), 2)]));
            kept.interrupted(&scope);
            assert_eq!(names(&kept, "shop"), None, "a broken watch answers nothing");
            // A list again replaces what the watch held: an object deleted meanwhile is gone.
            kept.list_started(&scope);
            kept.listed(&scope, place("c"), 4);
            assert_eq!(names(&kept, "shop"), None, "a list in progress answers nothing");
            kept.list_done(&scope);
            assert_eq!(names(&kept, "shop"), Some(vec![("c".into(), 4)]));
            kept.forget(&scope);
            assert_eq!(names(&kept, "shop"), None, "a stopped watch answers nothing");
        }
    }

    #[test]
    fn a_namespace_watch_answers_for_its_namespace_before_the_all_namespaces_one() {
        let (all, shop) = (None, Some("shop".to_string()));
        let kept = Kept::<u32>::default();
        kept.list_started(&all);
        kept.listed(&all, place("a"), 1);
        kept.list_done(&all);
        kept.list_started(&shop);
        kept.listed(&shop, place("a"), 2);
        kept.list_done(&shop);
        assert_eq!(names(&kept, "shop"), Some(vec![("a".into(), 2)]));
        kept.forget(&shop);
        assert_eq!(names(&kept, "shop"), Some(vec![("a".into(), 1)]));
    }
}
