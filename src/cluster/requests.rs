//! Counts the requests the agent sends to the API server, by reads and
//! writes, at the client itself: the figure behind "a no-op resync sends no
//! write" and the `gitcanary_kube_requests_total` metric.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::{Method, Request};

#[derive(Debug, Clone, Default)]
pub struct RequestCounts {
    reads: Arc<AtomicU64>,
    /// Of the reads: lists (a selector or a page size) and watches.
    lists: Arc<AtomicU64>,
    watches: Arc<AtomicU64>,
    /// Of all requests: the leader Lease's reads and renewals, which go on
    /// whatever the syncs do.
    leases: Arc<AtomicU64>,
    writes: Arc<AtomicU64>,
    dry_runs: Arc<AtomicU64>,
}

impl RequestCounts {
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }
    pub fn watches(&self) -> u64 {
        self.watches.load(Ordering::Relaxed)
    }
    pub fn leases(&self) -> u64 {
        self.leases.load(Ordering::Relaxed)
    }
    /// Requests that may change something (dry runs excluded).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }
    pub fn dry_runs(&self) -> u64 {
        self.dry_runs.load(Ordering::Relaxed)
    }

    fn count<B>(&self, request: &Request<B>) {
        tracing::trace!(method = %request.method(), uri = %request.uri(), "request");
        if request.uri().path().starts_with("/apis/coordination.k8s.io/") {
            self.leases.fetch_add(1, Ordering::Relaxed);
        }
        if *request.method() == Method::GET {
            let query = request.uri().query().unwrap_or_default();
            if query.contains("watch=true") {
                self.watches.fetch_add(1, Ordering::Relaxed);
            } else if ["labelSelector=", "fieldSelector=", "limit="]
                .iter()
                .any(|p| query.contains(p))
            {
                self.lists.fetch_add(1, Ordering::Relaxed);
            }
        }
        let counter = match *request.method() {
            Method::GET | Method::HEAD | Method::OPTIONS => &self.reads,
            _ if request.uri().query().is_some_and(|q| q.contains("dryRun=")) => &self.dry_runs,
            _ => &self.writes,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A tower layer that counts every request passing through.
pub struct CountLayer(pub RequestCounts);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counts: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    counts: RequestCounts,
}

impl<S, B> tower::Service<Request<B>> for Counted<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.counts.count(&request);
        self.inner.call(request)
    }
}
