//! Shards on Kubernetes Leases: with `--shards N`, replicas of one agent
//! share its apps. Each app belongs to shard `fnv1a64(app name) mod N`; a
//! replica syncs the apps of the shards whose Lease (`<instance>-shard-K`
//! in the state namespace) it holds. Each replica also renews a member
//! Lease (`<instance>-member-<identity>`) so the others know how many share
//! the work: a replica takes free or expired shards, one a round, up to its
//! fair share (⌈N / replicas⌉), and stops renewing what it holds beyond it.
//!
//! Safety is the Lease's, as for the leader: another replica takes a shard
//! only after seeing its record unchanged for a whole lease duration by its
//! own clock, while the holder stops acting for the shard once it has not
//! renewed for two thirds of one, counted from before its last renewal was
//! sent (`holds`, asked before each app's sync and again before its status
//! is recorded). A replica that was stopped wakes with its shards out of
//! date and starts nothing for their apps; a request it had already sent
//! when it was stopped cannot be called back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::ListParams;
use tracing::{debug, info, warn};

use crate::cluster::Cluster;
use crate::lease::{Leadership, LeaseConfig};

/// The shard an app belongs to: FNV-1a (64 bits) of its name, modulo the
/// number of shards. Stable across versions and replicas: documented.
pub fn shard_of(app: &str, shards: u32) -> u32 {
    let hash = app.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, b| {
        (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash % u64::from(shards.max(1))) as u32
}

/// The most shards one of `replicas` replicas holds: ⌈shards / replicas⌉.
pub fn fair_share(shards: u32, replicas: usize) -> usize {
    (shards as usize).div_ceil(replicas.max(1))
}

/// Which shards to try to take (in order) and which to give back, for a
/// replica holding `held` of `shards` when its fair share is `fair`. It
/// starts looking at `start` (its own offset), so that replicas starting
/// together do not all race for shard 0.
pub fn rebalance(held: &BTreeSet<u32>, shards: u32, fair: usize, start: u32) -> (Vec<u32>, Vec<u32>) {
    if held.len() > fair {
        let give_back = held.iter().rev().take(held.len() - fair).copied().collect();
        return (Vec::new(), give_back);
    }
    let take = (0..shards)
        .map(|i| (start + i) % shards.max(1))
        .filter(|shard| !held.contains(shard))
        .collect();
    (take, Vec::new())
}

pub struct Shards {
    pub count: u32,
    pub identity: String,
    duration: Duration,
    leases: Vec<Leadership>,
    member: Leadership,
    members: Api<Lease>,
    /// `<instance>-member-`: the member Leases of this agent's replicas.
    member_prefix: String,
    /// For each shard: until when this replica may act for it.
    acting_until: std::sync::Mutex<Vec<Option<Instant>>>,
    /// Each member Lease's record (holder and renew time) and when this
    /// replica saw it change: liveness by its own clock, not the writer's.
    members_seen: std::sync::Mutex<std::collections::HashMap<String, (String, Instant)>>,
    /// The replicas counted last (kept when the list fails).
    replicas: std::sync::atomic::AtomicUsize,
}

/// The Lease of shard `k` of agent `instance`.
pub fn shard_lease(instance: &str, k: u32) -> String {
    format!("{instance}-shard-{k}")
}

impl Shards {
    /// `template` names the namespace, identity and duration of every Lease.
    pub fn new(cluster: &Cluster, instance: &str, count: u32, template: &LeaseConfig) -> Shards {
        let lease = |name: String| {
            Leadership::new(
                cluster,
                LeaseConfig {
                    name,
                    ..template.clone()
                },
            )
        };
        let count = count.max(1);
        let member_prefix = format!("{instance}-member-");
        Shards {
            count,
            identity: template.identity.clone(),
            duration: template.duration,
            leases: (0..count).map(|k| lease(shard_lease(instance, k))).collect(),
            member: lease(format!("{member_prefix}{}", template.identity)),
            members: Api::namespaced(cluster.client.clone(), &template.namespace),
            member_prefix,
            acting_until: std::sync::Mutex::new(vec![None; count as usize]),
            members_seen: std::sync::Mutex::default(),
            replicas: std::sync::atomic::AtomicUsize::new(1),
        }
    }

    /// Whether this replica may act for `app` now.
    pub fn holds_app(&self, app: &str) -> bool {
        self.holds(shard_of(app, self.count))
    }

    pub fn holds(&self, shard: u32) -> bool {
        let acting = self.acting_until.lock().unwrap_or_else(|e| e.into_inner());
        acting
            .get(shard as usize)
            .copied()
            .flatten()
            .is_some_and(|until| Instant::now() < until)
    }

    /// The shards this replica may act for now.
    pub fn held(&self) -> BTreeSet<u32> {
        (0..self.count).filter(|&shard| self.holds(shard)).collect()
    }

    /// Shards not renewed in time (this replica was stopped, or the API
    /// server unreachable): acting for them has stopped; say so once.
    fn forget_expired(&self) {
        let mut acting = self.acting_until.lock().unwrap_or_else(|e| e.into_inner());
        for (shard, until) in acting.iter_mut().enumerate() {
            if until.is_some_and(|until| Instant::now() >= until) {
                warn!(
                    shard,
                    "shards: this shard's Lease was not renewed in time; nothing is written for its apps until it is held again"
                );
                *until = None;
            }
        }
    }

    fn set(&self, shard: u32, until: Option<Instant>) {
        let mut acting = self.acting_until.lock().unwrap_or_else(|e| e.into_inner());
        acting[shard as usize] = until;
    }

    /// This agent's replicas that hold their member Lease and renewed it
    /// within a lease duration, as this replica's clock saw the records
    /// change (itself included).
    async fn replicas(&self) -> usize {
        use std::sync::atomic::Ordering;
        let Ok(leases) = self.members.list(&ListParams::default()).await else {
            return self.replicas.load(Ordering::Relaxed);
        };
        let mut seen = self.members_seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut live = 1;
        for lease in &leases.items {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let spec = lease.spec.clone().unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_default();
            if !name.starts_with(&self.member_prefix) || holder.is_empty() || holder == self.identity {
                continue;
            }
            let record = format!("{holder}@{:?}", spec.renew_time.map(|t| t.0));
            let entry = seen.entry(name).or_insert_with(|| (record.clone(), Instant::now()));
            if entry.0 != record {
                *entry = (record, Instant::now());
            }
            if entry.1.elapsed() < self.duration {
                live += 1;
            }
        }
        self.replicas.store(live, Ordering::Relaxed);
        live
    }

    /// One round: renew the member Lease and the shards held; stop renewing
    /// what is beyond the fair share (it expires for another replica to
    /// take, so syncs already under way end first); take at most one free
    /// shard while under the share. Returns whether the shards held changed.
    pub async fn tick(&self) -> bool {
        self.forget_expired();
        let before = self.held();
        if let Err(error) = self.member.try_acquire_or_renew().await {
            debug!(%error, "shards: cannot renew this replica's member Lease");
        }
        let deadline = self.member.config().renew_deadline();
        for shard in before.iter().copied() {
            // The deadline counts from before the request: an answer read
            // late must not stretch it past what the others allow.
            let asked = Instant::now();
            match self.leases[shard as usize].try_acquire_or_renew().await {
                Ok((true, _)) => self.set(shard, Some(asked + deadline)),
                Ok((false, holder)) => {
                    warn!(shard, %holder, "shards: another replica took this shard; its apps are left to it");
                    self.set(shard, None);
                }
                // Not renewed: acting stops when the deadline passes.
                Err(error) => warn!(shard, %error, "shards: cannot renew a shard's Lease"),
            }
        }
        let fair = fair_share(self.count, self.replicas().await);
        let start = shard_of(&self.identity, self.count);
        let (take, give_back) = rebalance(&self.held(), self.count, fair, start);
        for shard in give_back {
            self.set(shard, None);
            info!(
                shard,
                fair, "shards: over this replica's share; no longer renewed, it expires for another to take"
            );
        }
        // Every other shard is looked at each round, so a dead replica's
        // shards are known free a lease duration after its last renewal.
        let mut took = false;
        for shard in take {
            let free = self.leases[shard as usize].observe().await.unwrap_or(false);
            if !free || took || self.held().len() >= fair {
                continue;
            }
            let asked = Instant::now();
            if let Ok((true, _)) = self.leases[shard as usize].try_acquire_or_renew().await {
                self.set(shard, Some(asked + deadline));
                info!(shard, "shards: took a shard");
                took = true;
            }
        }
        self.held() != before
    }

    /// Keeps the shards until `stop`; calls `changed` after a round that
    /// changed what is held (and when a held shard's deadline passes).
    pub async fn run(&self, changed: impl Fn(), stop: &mut tokio::sync::watch::Receiver<bool>) {
        loop {
            let held = self.held();
            if self.tick().await || self.held() != held {
                changed();
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(self.member.config().retry_period()) => {}
            }
        }
    }

    /// Gives every shard and the member Lease back (a clean shutdown, once
    /// the agent's last sync has ended).
    pub async fn release_all(&self) {
        for shard in self.held() {
            self.set(shard, None);
            self.leases[shard as usize].release().await;
        }
        self.member.release().await;
    }
}

/// Who holds the shards of the agent whose state is in `namespace`, for
/// `gitcanary status`: `None` when no shard Lease is there (or it cannot be
/// read). `rollouts` (`namespace/name`) are each named with their app.
pub async fn describe(cluster: &Cluster, namespace: &str, instance: &str, rollouts: &[String]) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), namespace);
    let listed = leases.list(&ListParams::default()).await.ok()?;
    let mut holders = BTreeMap::new();
    for lease in &listed.items {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        let prefix = format!("{instance}-shard-");
        let Some(index) = name.strip_prefix(&prefix).and_then(|k| k.parse::<u32>().ok()) else {
            continue;
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        holders.insert(index, holder);
    }
    let count = holders.keys().max()? + 1;
    let statuses = crate::cluster::AppStatus::load_all(cluster, namespace, instance)
        .await
        .unwrap_or_default();
    let governed: Vec<(String, String)> = statuses
        .values()
        .flat_map(|status| {
            status
                .inventory
                .iter()
                .filter(|entry| entry.kind == crate::rollout::api::KIND)
                .map(|entry| {
                    let key = format!("{}/{}", entry.namespace.as_deref().unwrap_or_default(), entry.name);
                    (key, status.app.clone())
                })
        })
        .filter(|(key, _)| rollouts.contains(key))
        .collect();
    let apps: Vec<&String> = statuses.keys().collect();
    Some(render(namespace, count, &holders, &apps, &governed))
}

/// The shards by replica (with how many of `apps` each syncs), then each
/// governed Rollout with its app, shard and replica. Pure.
fn render(
    namespace: &str,
    count: u32,
    holders: &BTreeMap<u32, String>,
    apps: &[&String],
    governed: &[(String, String)],
) -> String {
    use std::fmt::Write;
    let holder = |shard: u32| {
        holders
            .get(&shard)
            .filter(|h| !h.is_empty())
            .cloned()
            .unwrap_or_else(|| "(nobody)".to_string())
    };
    let mut by_replica: BTreeMap<String, (Vec<u32>, usize)> = BTreeMap::new();
    for shard in 0..count {
        by_replica.entry(holder(shard)).or_default().0.push(shard);
    }
    for app in apps {
        by_replica.entry(holder(shard_of(app, count))).or_default().1 += 1;
    }
    let mut out = format!("\nShards: {count}, Leases in {namespace}\n");
    for (replica, (shards, apps)) in &by_replica {
        let shards: Vec<String> = shards.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "  {replica:<24} shards {:<12} apps {apps}", shards.join(","));
    }
    for (rollout, app) in governed {
        let shard = shard_of(app, count);
        let _ = writeln!(out, "  {rollout}: app {app}, shard {shard}, held by {}", holder(shard));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apps_shard_is_stable_and_spreads_apps() {
        // Documented values: a change of hash would move every app.
        assert_eq!(shard_of("web", 6), shard_of("web", 6));
        assert_eq!(shard_of("", 6), (0xcbf2_9ce4_8422_2325_u64 % 6) as u32);
        let mut per_shard = [0; 6];
        for i in 0..600 {
            per_shard[shard_of(&format!("app-{i}"), 6) as usize] += 1;
        }
        assert!(per_shard.iter().all(|&n| (60..=140).contains(&n)), "{per_shard:?}");
        assert_eq!(shard_of("anything", 1), 0);
        assert_eq!(shard_of("anything", 0), 0, "no shards is one shard");
    }

    #[test]
    fn status_names_each_replicas_shards_and_apps_and_each_rollouts_holder() {
        let holders = BTreeMap::from([(0, "a".to_string()), (1, "b".to_string()), (2, String::new())]);
        let (web, shop) = ("web".to_string(), "shop".to_string());
        let text = render(
            "gitcanary-system",
            3,
            &holders,
            &[&web, &shop],
            &[("demo/echo".into(), "web".into())],
        );
        let web_shard = shard_of("web", 3);
        let web_holder = ["a", "b", "(nobody)"][web_shard as usize];
        assert!(text.contains("Shards: 3, Leases in gitcanary-system"), "{text}");
        assert!(
            text.contains(&format!("demo/echo: app web, shard {web_shard}, held by {web_holder}")),
            "{text}"
        );
        for replica in ["a ", "b ", "(nobody) "] {
            assert!(
                text.lines().any(|l| l.trim_start().starts_with(replica)),
                "{replica} in {text}"
            );
        }
        let apps: usize = text
            .lines()
            .filter_map(|l| l.split("apps ").nth(1)?.trim().parse::<usize>().ok())
            .sum();
        assert_eq!(apps, 2, "{text}");
    }

    #[test]
    fn the_fair_share_rounds_up_so_every_shard_has_room() {
        assert_eq!(fair_share(6, 3), 2);
        assert_eq!(fair_share(6, 4), 2);
        assert_eq!(fair_share(6, 1), 6);
        assert_eq!(fair_share(6, 0), 6);
        assert_eq!(fair_share(1, 3), 1);
    }

    #[test]
    fn a_replica_over_its_share_gives_back_its_highest_shards_and_one_under_it_looks_from_its_offset() {
        let held: BTreeSet<u32> = [0, 2, 4, 5].into();
        assert_eq!(rebalance(&held, 6, 2, 0), (vec![], vec![5, 4]));
        assert_eq!(rebalance(&held, 6, 4, 0), (vec![1, 3], vec![]));
        let none = BTreeSet::new();
        assert_eq!(rebalance(&none, 6, 2, 4).0, vec![4, 5, 0, 1, 2, 3]);
    }
}
