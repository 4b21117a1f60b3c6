//! Reading the source's head (fetch, parse, render) beside the reconcile
//! loop, not in it: a commit whose render takes its whole deadline delays
//! that commit only. A promote, an abort, a deadline or a drift meanwhile
//! is acted on at once, with the revision already loaded.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{Notify, mpsc};
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
    capabilities: crate::render::Capabilities,
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
    pub(super) async fn follow_source(&self, wanted: &Notify, triggers: &mpsc::Sender<Trigger>) {
        loop {
            wanted.notified().await;
            match self.load_head().await {
                Ok(()) => {
                    if triggers.send(Trigger::Loaded).await.is_err() {
                        return;
                    }
                }
                Err(error) => {
                    self.metrics.syncs_failed.fetch_add(1, Ordering::Relaxed);
                    error!(%error, kind = error.metric_label(), "sync failed; the cluster keeps what it had");
                }
            }
        }
    }

    /// Fetches and loads the head, reusing what the last load holds where it
    /// is still the same; the loaded revision replaces it.
    async fn load_head(&self) -> Result<()> {
        let source = self.source.clone();
        let capabilities = self.cluster.capabilities().await;
        source.renderers().set_capabilities(capabilities.clone());
        let timer = self.metrics.fetch_duration.start_timer();
        // The reconcile loop keeps syncing the current revision meanwhile: it
        // is shared (a new commit copies the manifests the load reuses); the
        // files are taken.
        let previous = self
            .loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .map(|loaded| Loaded {
                files: std::mem::take(&mut loaded.files),
                ..loaded.clone()
            });
        let options = self.options.clone();
        let fetched = crate::blocking("fetching", move || load(&source, previous, capabilities, &options))
            .await
            .and_then(|fetched| fetched);
        drop(timer);
        self.metrics
            .renders
            .store(self.source.renderers().renders(), Ordering::Relaxed);
        if fetched.is_err() {
            self.metrics.fetch_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics
            .source_up
            .store(u64::from(fetched.is_ok()), Ordering::Relaxed);
        *self.loaded.lock().unwrap_or_else(|e| e.into_inner()) = Some(fetched?);
        Ok(())
    }
}

/// Fetches and loads the head, reusing what `previous` holds where it is
/// still the same: all of it for the same commit and cluster, else the
/// plain apps whose files did not change.
fn load(
    source: &Source,
    previous: Option<Loaded>,
    capabilities: crate::render::Capabilities,
    options: &SyncOptions,
) -> Result<Loaded> {
    let Some(git) = source.git() else {
        let mut revision = source.fetch()?;
        validate_revision(&mut revision, options);
        return Ok(Loaded::new(revision, AppFiles::default(), capabilities, options));
    };
    let head = git.fetch_head()?;
    let reuse = match previous {
        // An app with problems is read again: a render may have failed for a while only.
        Some(previous)
            if previous.revision.commit == head
                && previous.capabilities == capabilities
                && previous.revision.manifests.problems().next().is_none() =>
        {
            return Ok(previous);
        }
        Some(previous) => {
            let manifests = Arc::try_unwrap(previous.revision)
                .map(|revision| revision.manifests)
                .unwrap_or_else(|shared| shared.manifests.clone());
            let files = Arc::try_unwrap(previous.files).unwrap_or_else(|shared| (*shared).clone());
            Some((manifests, files))
        }
        None => None,
    };
    let (mut revision, files) = git.load(&head, reuse)?;
    validate_revision(&mut revision, options);
    Ok(Loaded::new(revision, files, capabilities, options))
}

impl Loaded {
    fn new(
        revision: Revision,
        files: AppFiles,
        capabilities: crate::render::Capabilities,
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
