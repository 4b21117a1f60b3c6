//! Leader election with a `coordination.k8s.io` Lease, so that two agents
//! never act at once. As in client-go, expiry is judged by this agent's own
//! clock (how long the record has stayed unchanged), never by comparing
//! another host's timestamps, so clock skew cannot hand the lease out early.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use tracing::{debug, info, warn};

use crate::cluster::Cluster;
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Who holds it: the pod name in a cluster.
    pub identity: String,
    pub duration: Duration,
    /// Annotations the holder keeps on the Lease (a shard Lease says the
    /// holder's shard count).
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl LeaseConfig {
    /// How often the holder renews, and a follower looks.
    pub fn retry_period(&self) -> Duration {
        self.duration / 5
    }

    /// A holder that could not renew for this long stops acting: by the
    /// time the lease expires for the others, it has stopped.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
}

pub struct Leadership {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The record last seen (holder and renew time) and when this agent first saw it.
    observed: std::sync::Mutex<Option<(String, Instant)>>,
    /// The Lease as this agent last wrote it, holding it: a renewal is then
    /// one write, a compare-and-swap on that resourceVersion (client-go's
    /// way), instead of a read and a write. Another agent's write since
    /// makes the swap conflict, and the renewal reads the Lease again.
    held: std::sync::Mutex<Option<Lease>>,
}

fn lease_error(context: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
    move |source| Error::Kube {
        context: context.to_string(),
        source: Box::new(source),
    }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

impl Leadership {
    pub fn new(cluster: &Cluster, config: LeaseConfig) -> Leadership {
        Leadership {
            api: Api::namespaced(cluster.client.clone(), &config.namespace),
            config,
            observed: std::sync::Mutex::new(None),
            held: std::sync::Mutex::new(None),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Lease>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews the Lease as last written, in one request; `None` when there
    /// is none held or another agent wrote it since (then read it again).
    async fn renew_held(&self) -> Result<Option<(bool, String)>> {
        let Some(mut lease) = self.held().take() else {
            return Ok(None);
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        }
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                *self.held() = Some(written);
                Ok(Some((true, self.config.identity.clone())))
            }
            Err(e) if is_conflict(&e) => Ok(None),
            Err(e) => Err(lease_error("renewing the lease")(e)),
        }
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// One attempt to take or renew the lease. Returns whether this agent
    /// holds it, and who does otherwise.
    pub async fn try_acquire_or_renew(&self) -> Result<(bool, String)> {
        if let Some(renewed) = self.renew_held().await? {
            return Ok(renewed);
        }
        let me = &self.config.identity;
        let now = MicroTime(jiff::Timestamp::now());
        let duration_seconds = self.config.duration.as_secs().max(1) as i32;
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(lease_error("reading the lease"))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    annotations: Some(self.config.annotations.clone()).filter(|a| !a.is_empty()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration_seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => {
                    *self.held() = Some(written);
                    Ok((true, me.clone()))
                }
                Err(e) if is_conflict(&e) => Ok((false, String::new())),
                Err(e) => Err(lease_error("creating the lease")(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let (holder, free) = self.judge(&spec);
        if holder != *me && !free {
            return Ok((false, holder));
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(holder != *me);
        if !self.config.annotations.is_empty() {
            let annotations = lease.metadata.annotations.get_or_insert_with(Default::default);
            annotations.extend(self.config.annotations.clone());
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(me.clone()),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: if holder == *me {
                spec.acquire_time
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..spec
        });
        // The resourceVersion makes this a compare-and-swap: a racing agent gets a conflict.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                if holder != *me {
                    info!(lease = %self.config.name, previous = %holder, "lease acquired");
                }
                *self.held() = Some(written);
                Ok((true, me.clone()))
            }
            Err(e) if is_conflict(&e) => Ok((false, holder)),
            Err(e) => Err(lease_error("renewing the lease")(e)),
        }
    }

    /// Whether the lease is free for this agent to take (no holder, or a
    /// record unchanged for a whole lease duration by this agent's clock),
    /// without writing anything; the look counts towards that duration.
    pub async fn observe(&self) -> Result<bool> {
        let Some(lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(lease_error("reading the lease"))?
        else {
            return Ok(true);
        };
        let (holder, free) = self.judge(&lease.spec.unwrap_or_default());
        Ok(free || holder == self.config.identity)
    }

    /// Who holds the lease, and whether it is free: no holder, or a record
    /// (holder and renew time) this agent has seen unchanged for a whole
    /// lease duration by its own clock. Each call counts as a look.
    fn judge(&self, spec: &LeaseSpec) -> (String, bool) {
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = format!(
            "{holder}@{}",
            spec.renew_time.as_ref().map(|t| t.0.to_string()).unwrap_or_default()
        );
        let held_for = {
            let mut observed = self.observed.lock().unwrap_or_else(|e| e.into_inner());
            match observed.as_ref() {
                Some((seen, since)) if *seen == record => since.elapsed(),
                _ => {
                    *observed = Some((record, Instant::now()));
                    Duration::ZERO
                }
            }
        };
        let default = self.config.duration.as_secs().max(1) as i32;
        let lease_duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(default).max(1) as u64);
        let free = holder.is_empty() || held_for >= lease_duration;
        (holder, free)
    }

    /// Waits until this agent holds the lease; `false` when asked to stop first.
    pub async fn acquire(&self, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        let mut last_holder = String::new();
        loop {
            match self.try_acquire_or_renew().await {
                Ok((true, _)) => return true,
                Ok((false, holder)) => {
                    if holder != last_holder {
                        info!(lease = %self.config.name, %holder, "another agent leads; waiting for the lease");
                        last_holder = holder;
                    }
                }
                Err(error) => warn!(%error, "cannot reach the lease; trying again"),
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return false,
                _ = tokio::time::sleep(self.config.retry_period()) => {}
            }
        }
    }

    /// Renews the lease until it cannot for `renew_deadline`; returns then
    /// (leadership lost: the caller must stop acting).
    pub async fn keep(&self) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period()).await;
            // Counted from before the request: an answer read late must not
            // stretch the deadline past what a successor allows.
            let asked = Instant::now();
            // Nor may a request that hangs: it is given up at the deadline.
            let left = self.config.renew_deadline().saturating_sub(last_renewed.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok((true, _))) => last_renewed = asked,
                Ok(Ok((false, holder))) => {
                    warn!(%holder, "the lease was taken by another agent");
                    return;
                }
                Ok(Err(error)) => debug!(%error, "lease renewal failed; retrying"),
                Err(_) => debug!("lease renewal still unanswered at the renew deadline"),
            }
            if last_renewed.elapsed() >= self.config.renew_deadline() {
                warn!("the lease could not be renewed in time");
                return;
            }
        }
    }

    /// Gives the lease up, so a successor need not wait for it to expire.
    pub async fn release(&self) {
        self.held().take();
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.config.name, "lease released"),
            Err(error) => warn!(%error, "cannot release the lease; it expires on its own"),
        }
    }
}
