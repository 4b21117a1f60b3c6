//! Reading the source's head (fetch, parse, render) beside the reconcile
//! loop, not in it: a commit whose render takes its whole deadline delays
//! that commit only. A promote, an abort, a deadline or a drift meanwhile
//! is acted on at once, with the revision already loaded.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;
use tracing::error;

use super::scope::Owners;
use super::{Agent, Trigger};
use crate::Result;
use crate::source::{AppFiles, Revision, Source};
use crate::sync::{SyncOptions, validate_revision};

/// A revision as loaded, with what the next load can take over from it.
#[derive(Clone)]
pub(crate) struct Loaded {
    revision: Arc<Revision>,
    /// Which app holds each object of the revision (see `scope`).
    owners: Arc<Owners>,
    /// What the next load takes unchanged apps from; moved to the loader
    /// (the reconcile loop never reads it), so that it is never copied.
    files: Arc<AppFiles>,
    capabilities: Arc<crate::render::Capabilities>,
}

impl Agent {
    /// The revision last loaded, validated, and which app holds each of its
    /// objects; none before the first load.
    pub(super) fn revision(&self) -> Option<(Arc<Revision>, Arc<Owners>)> {
        let loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        loaded
            .as_ref()
            .map(|loaded| (loaded.revision.clone(), loaded.owners.clone()))
    }

    /// Loads the head each time `wanted` is notified (a request during a
    /// load makes one more load after it), then asks for a sync of it.
    pub(super) async fn follow_source(&self, wanted: &Notify, triggers: &crate::agent::Triggers) {
        loop {
            wanted.notified().await;
            match self.load_head().await {
                Ok(()) => {
                    if triggers.send(Trigger::Loaded).await.is_err() {
                        return;
                    }
                }
                Err(error) => {
                    // The next poll loads again, whatever the head.
                    self.at_rest.set(None);
                    self.metrics.syncs_failed.fetch_add(1, Ordering::Relaxed);
                    error!(%error, kind = error.metric_label(), "sync failed; the cluster keeps what it had");
                }
            }
        }
    }

    /// Fetches and loads the head, reusing what the last load holds where it
    /// is still the same; the loaded revision replaces it.
    async fn load_head(&self) -> Result<()> {
        let capabilities = self.cluster.capabilities().await;
        self.source.renderers().set_capabilities(capabilities.clone());
        let timer = self.metrics.fetch_duration.start_timer();
        let loaded = self.fetch_and_load(capabilities).await;
        drop(timer);
        self.metrics
            .renders
            .store(self.source.renderers().renders(), Ordering::Relaxed);
        if loaded.is_err() {
            self.metrics.fetch_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics
            .source_up
            .store(u64::from(loaded.is_ok()), Ordering::Relaxed);
        if let Some(loaded) = loaded? {
            *self.loaded.lock().unwrap_or_else(|e| e.into_inner()) = Some(loaded);
        }
        Ok(())
    }

    /// The newly loaded revision, or none when the head is the one loaded
    /// (same commit and cluster, no problem to read again).
    async fn fetch_and_load(&self, capabilities: Arc<crate::render::Capabilities>) -> Result<Option<Loaded>> {
        let source = self.source.clone();
        let head = crate::blocking("fetching", move || source.git().map(|git| git.fetch_head()).transpose()).await??;
        // The reconcile loop keeps syncing the current revision meanwhile: it
        // is shared (a new commit copies the manifests the load reuses); the
        // files, which only a load reads, are moved.
        let previous = {
            let mut slot = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            if let (Some(loaded), Some(head)) = (slot.as_ref(), &head)
                && loaded.revision.commit == *head
                && loaded.capabilities == capabilities
                && loaded.revision.manifests.problems().next().is_none()
            {
                return Ok(None);
            }
            slot.as_mut().map(|loaded| Loaded {
                files: std::mem::take(&mut loaded.files),
                ..loaded.clone()
            })
        };
        let (source, options) = (self.source.clone(), self.options.clone());
        let loaded =
            crate::blocking("loading", move || load(&source, head, previous, capabilities, &options)).await??;
        Ok(Some(loaded))
    }
}

/// Loads `head` (a plain directory: reads it), reusing the plain apps of
/// `previous` whose files did not change.
fn load(
    source: &Source,
    head: Option<String>,
    previous: Option<Loaded>,
    capabilities: Arc<crate::render::Capabilities>,
    options: &SyncOptions,
) -> Result<Loaded> {
    let (Some(git), Some(head)) = (source.git(), head) else {
        let mut revision = source.fetch()?;
        validate_revision(&mut revision, options);
        return Ok(Loaded::new(revision, AppFiles::default(), capabilities, options));
    };
    let reuse = previous.map(|previous| {
        let manifests = Arc::try_unwrap(previous.revision)
            .map(|revision| revision.manifests)
            .unwrap_or_else(|shared| shared.manifests.clone());
        let files = Arc::try_unwrap(previous.files).unwrap_or_else(|shared| (*shared).clone());
        (manifests, files)
    });
    let (mut revision, files) = git.load(&head, reuse)?;
    validate_revision(&mut revision, options);
    Ok(Loaded::new(revision, files, capabilities, options))
}

impl Loaded {
    fn new(
        revision: Revision,
        files: AppFiles,
        capabilities: Arc<crate::render::Capabilities>,
        options: &SyncOptions,
    ) -> Loaded {
        let owners = super::scope::owners(&revision.manifests, &options.allowed.default_namespace);
        Loaded {
            revision: Arc::new(revision),
            owners: Arc::new(owners),
            files: Arc::new(files),
            capabilities,
        }
    }
}
