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
    /// `<instance>-shard-` and `<instance>-leader`: Leases a replica of
    /// another configuration may hold.
    others: (String, String),
    /// Why this replica holds no shard now, once said.
    refused: std::sync::Mutex<Option<String>>,
    /// For each shard: until when this replica may act for it.
    acting_until: std::sync::Mutex<Vec<Option<Instant>>>,
    /// For each shard: how many times this replica began to act for it
    /// (another may have acted for it in between).
    terms: std::sync::Mutex<Vec<u64>>,
    /// Each member Lease's record (holder and renew time) and when this
    /// replica saw it change: liveness by its own clock, not the writer's.
    members_seen: std::sync::Mutex<Seen>,
    /// The replicas counted last (kept when the list fails).
    replicas: std::sync::atomic::AtomicUsize,
    /// The task that keeps the Leases: stopped before they are released, so
    /// that a round in flight cannot renew or retake one after its release.
    keeper: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// On each shard Lease: its holder's `--shards`, so that replicas started
/// with another count, which would map apps to shards otherwise, see it.
pub const SHARDS_ANNOTATION: &str = "gitcanary.io/shards";

/// A Lease of this agent's instance as a look saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenLease {
    pub name: String,
    pub holder: String,
    /// Renewed within a lease duration, by this replica's clock.
    pub live: bool,
    /// The holder's shard count (shard Leases).
    pub shards: Option<u32>,
    pub acquired: Option<jiff::Timestamp>,
    /// A shard this process holds now (a Lease naming this identity from
    /// before a restart is not).
    pub held_here: bool,
}

/// The shard a Lease of `prefix` (`<instance>-shard-`) is for, if it is one:
/// `<instance>-shard-<digits>`, not another instance's `<instance>-shard-x-…`.
pub fn shard_of_lease(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?;
    rest.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| rest.parse().ok())
        .flatten()
}

/// Why this replica (`count` shards, `identity`) must hold no shard now:
/// a live leader of the same instance without `--shards`, or a live shard
/// Lease held with another count (or none said), taken before this
/// replica's first shard, so replicas of two configurations never act for
/// the same app. The configuration that held first keeps the work (a
/// leader that came later waits, `wait_for_sharded_replicas`); of two that
/// took theirs at the same moment, the smaller identity's.
pub fn refusal(
    (count, identity): (u32, &str),
    (shard_prefix, leader): (&str, &str),
    seen: &[SeenLease],
) -> Option<String> {
    let own_first = seen.iter().filter(|l| l.held_here).filter_map(|l| l.acquired).min();
    let foreign = seen
        .iter()
        .filter(|l| l.live && !l.holder.is_empty() && l.holder != identity);
    for lease in foreign {
        let earlier = match (lease.acquired, own_first) {
            (_, None) | (None, Some(_)) => true,
            (Some(theirs), Some(mine)) => theirs < mine || (theirs == mine && lease.holder.as_str() < identity),
        };
        if lease.name == leader && earlier {
            return Some(format!(
                "{} leads this instance without --shards (Lease {}); shards wait until it is gone",
                lease.holder, lease.name
            ));
        }
        if shard_of_lease(&lease.name, shard_prefix).is_none() || lease.shards == Some(count) {
            continue;
        }
        if earlier {
            let theirs = lease.shards.map_or("an unknown count".to_string(), |n| n.to_string());
            return Some(format!(
                "{} holds {} with --shards {theirs}, this replica has --shards {count}; it waits until no replica of the other count holds a shard",
                lease.holder, lease.name
            ));
        }
    }
    None
}

/// Records last seen of Leases by name (holder and renew time), and when
/// this agent saw each change.
type Seen = std::collections::HashMap<String, (String, Instant)>;

/// Whether the Lease `name`'s record (holder, renew time) changed within
/// `duration` by this agent's clock: liveness without comparing another
/// host's timestamps. The first look counts as a change.
fn renewed_within(
    seen: &mut Seen,
    name: &str,
    (holder, renewed): (&str, Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>),
    duration: Duration,
) -> bool {
    let record = format!("{holder}@{:?}", renewed.map(|t| t.0));
    let entry = seen
        .entry(name.to_string())
        .or_insert_with(|| (record.clone(), Instant::now()));
    if entry.0 != record {
        *entry = (record, Instant::now());
    }
    entry.1.elapsed() < duration
}

/// Whether acting `until` a time, where the replica acted until `before`,
/// begins a new term: it acts from now on (a renewal answered past its own
/// deadline does not), and was not acting (never, or past its time, when
/// another replica may have taken the shard).
fn begins_term(before: Option<Instant>, until: Option<Instant>, now: Instant) -> bool {
    until.is_some_and(|until| now < until) && before.is_none_or(|before| now >= before)
}

/// The Lease of shard `k` of agent `instance`.
pub fn shard_lease(instance: &str, k: u32) -> String {
    format!("{instance}-shard-{k}")
}

impl Shards {
    /// The fence every write for an app asks: whether this replica holds the app's shard.
    pub fn fence(self: &std::sync::Arc<Self>) -> crate::model::Fence {
        let shards = self.clone();
        crate::model::Fence(std::sync::Arc::new(move |app: &str| shards.holds_app(app)))
    }

    /// `template` names the namespace, identity and duration of every Lease.
    pub fn new(cluster: &Cluster, instance: &str, count: u32, template: &LeaseConfig) -> Shards {
        let count = count.max(1);
        let lease = |name: String| {
            Leadership::new(
                cluster,
                LeaseConfig {
                    name,
                    annotations: std::collections::BTreeMap::from([(SHARDS_ANNOTATION.to_string(), count.to_string())]),
                    ..template.clone()
                },
            )
        };
        let member_prefix = format!("{instance}-member-");
        Shards {
            count,
            identity: template.identity.clone(),
            duration: template.duration,
            leases: (0..count).map(|k| lease(shard_lease(instance, k))).collect(),
            member: lease(format!("{member_prefix}{}", template.identity)),
            members: Api::namespaced(cluster.client.clone(), &template.namespace),
            member_prefix,
            others: (format!("{instance}-shard-"), format!("{instance}-leader")),
            refused: std::sync::Mutex::default(),
            acting_until: std::sync::Mutex::new(vec![None; count as usize]),
            terms: std::sync::Mutex::new(vec![0; count as usize]),
            members_seen: std::sync::Mutex::default(),
            replicas: std::sync::atomic::AtomicUsize::new(1),
            keeper: std::sync::Mutex::default(),
        }
    }

    /// Records the task that keeps the Leases (see [`Shards::release_all`]).
    pub fn kept_by(&self, task: tokio::task::JoinHandle<()>) {
        *self.keeper.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
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

    /// Which term of this replica's hold on the app's shard is current;
    /// none while it does not hold the shard. A new term means another
    /// replica may have acted for the app since this one last did.
    pub fn term_of_app(&self, app: &str) -> Option<u64> {
        let shard = shard_of(app, self.count);
        // `set` locks the terms inside `acting_until`: never the other way round.
        let held = self.holds(shard);
        held.then(|| self.terms.lock().unwrap_or_else(|e| e.into_inner())[shard as usize])
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
        if begins_term(acting[shard as usize], until, Instant::now()) {
            self.terms.lock().unwrap_or_else(|e| e.into_inner())[shard as usize] += 1;
        }
        acting[shard as usize] = until;
    }

    /// This agent's replicas that hold their member Lease and renewed it
    /// within a lease duration, as this replica's clock saw the records
    /// change (itself included), and why this replica must hold no shard
    /// now, if it must not (`refusal`), holding `mine`.
    async fn look(&self, mine: &BTreeSet<u32>) -> (usize, Option<String>) {
        use std::sync::atomic::Ordering;
        let Ok(leases) = self.members.list(&ListParams::default()).await else {
            let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone();
            return (self.replicas.load(Ordering::Relaxed), refused);
        };
        let mut seen = self.members_seen.lock().unwrap_or_else(|e| e.into_inner());
        let (shard_prefix, leader) = (&self.others.0, &self.others.1);
        let mut live = 1;
        let mut looked = Vec::new();
        for lease in &leases.items {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let shard = shard_of_lease(&name, shard_prefix);
            let ours = name.starts_with(&self.member_prefix) || shard.is_some() || name == *leader;
            let spec = lease.spec.clone().unwrap_or_default();
            let holder = spec.holder_identity.clone().unwrap_or_default();
            if !ours || holder.is_empty() {
                continue;
            }
            let fresh = renewed_within(&mut seen, &name, (&holder, spec.renew_time.as_ref()), self.duration);
            if name.starts_with(&self.member_prefix) {
                live += usize::from(fresh && holder != self.identity);
                continue;
            }
            let annotations = lease.metadata.annotations.clone().unwrap_or_default();
            looked.push(SeenLease {
                name,
                held_here: holder == self.identity && shard.is_some_and(|k| mine.contains(&k)),
                holder,
                live: fresh,
                shards: annotations.get(SHARDS_ANNOTATION).and_then(|n| n.parse().ok()),
                acquired: spec.acquire_time.map(|t| t.0),
            });
        }
        self.replicas.store(live, Ordering::Relaxed);
        let refused = refusal((self.count, &self.identity), (shard_prefix, leader), &looked);
        let mut said = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused != *said {
            match &refused {
                Some(why) => warn!(%why, "shards: this replica holds no shard"),
                None => info!("shards: no replica of another configuration holds a shard any more"),
            }
            said.clone_from(&refused);
        }
        (live, refused)
    }

    /// One round: renew the member Lease and the shards held; stop renewing
    /// what is beyond the fair share (it expires for another replica to
    /// take, so syncs already under way end first); take at most one free
    /// shard while under the share. Returns whether the shards held changed.
    pub async fn tick(&self) -> bool {
        self.forget_expired();
        let before = self.held();
        let (replicas, refused) = self.look(&before).await;
        if refused.is_some() {
            // Acting stops now; the Leases are not renewed and expire. Not a
            // member meanwhile, so the others' share does not leave room for it.
            for shard in before.iter().copied() {
                self.set(shard, None);
            }
            self.member.release().await;
            return !before.is_empty();
        }
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
        let fair = fair_share(self.count, replicas);
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
        let mut taken = None;
        for shard in take {
            let free = self.leases[shard as usize].observe().await.unwrap_or(false);
            if !free || taken.is_some() || self.held().len() >= fair {
                continue;
            }
            let asked = Instant::now();
            if let Ok((true, _)) = self.leases[shard as usize].try_acquire_or_renew().await {
                taken = Some((shard, asked));
            }
        }
        // Acting for a shard taken starts only once a look after the take
        // finds no other configuration that held first (one may have taken
        // its own meanwhile).
        if let Some((shard, asked)) = taken {
            let mut mine = self.held();
            mine.insert(shard);
            match self.look(&mine).await {
                (_, None) => {
                    self.set(shard, Some(asked + deadline));
                    info!(shard, "shards: took a shard");
                }
                (_, Some(_)) => self.leases[shard as usize].release().await,
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
        let keeper = self.keeper.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(keeper) = keeper {
            keeper.abort();
            let _ = keeper.await;
        }
        for shard in self.held() {
            self.set(shard, None);
            self.leases[shard as usize].release().await;
        }
        self.member.release().await;
    }
}

/// What an agent without `--shards` knows of the shard Leases of its
/// instance: which a replica with `--shards` renewed within a lease
/// duration, by this agent's clock. It waits for none before it takes the
/// leader Lease, and looks once more after, so the two never act at once;
/// sharded replicas stop at once when they see a leader that came first.
pub struct ShardWatch {
    leases: Api<Lease>,
    prefix: String,
    duration: Duration,
    seen: Seen,
}

impl ShardWatch {
    pub fn new(cluster: &Cluster, instance: &str, leader: &LeaseConfig) -> ShardWatch {
        ShardWatch {
            leases: Api::namespaced(cluster.client.clone(), &leader.namespace),
            prefix: format!("{instance}-shard-"),
            duration: leader.duration,
            seen: Default::default(),
        }
    }

    /// The shard Leases renewed within a lease duration. Without the right
    /// to list Leases (an agent deployed without shards), the first shard's
    /// Lease stands for them, which every sharded replica set holds.
    pub async fn live(&mut self) -> usize {
        let leases = match self.leases.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(error) => {
                debug!(%error, "cannot list Leases; looking at the first shard's alone");
                let first = format!("{}0", self.prefix);
                self.leases.get_opt(&first).await.ok().flatten().into_iter().collect()
            }
        };
        let mut live = 0;
        for lease in leases {
            let name = lease.metadata.name.unwrap_or_default();
            let spec = lease.spec.unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_default();
            if shard_of_lease(&name, &self.prefix).is_none() || holder.is_empty() {
                continue;
            }
            let renew = spec.renew_time.as_ref();
            live += usize::from(renewed_within(&mut self.seen, &name, (&holder, renew), self.duration));
        }
        live
    }

    /// Waits until no shard Lease is live; `false` when asked to stop first.
    pub async fn wait_for_none(&mut self, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        let mut said = false;
        loop {
            let held = self.live().await;
            if held == 0 {
                return true;
            }
            if !said {
                warn!(
                    held,
                    "replicas of this instance with --shards hold shards; this agent leads only once they expire"
                );
                said = true;
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return false,
                () = tokio::time::sleep(self.duration / 5) => {}
            }
        }
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
    fn a_term_begins_when_a_replica_acts_again_after_it_could_not() {
        let now = Instant::now();
        let later = now + Duration::from_secs(10);
        assert!(begins_term(None, Some(later), now), "taken");
        assert!(
            !begins_term(Some(later), Some(later + Duration::from_secs(5)), now),
            "renewed in time"
        );
        assert!(
            begins_term(Some(now), Some(later), now),
            "renewed after its time ran out"
        );
        assert!(!begins_term(Some(later), None, now), "given up");
        assert!(
            !begins_term(None, Some(now), now),
            "renewed past its own deadline: not acting"
        );
    }

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

    #[test]
    fn replicas_of_two_shard_counts_never_act_at_once_and_the_first_to_hold_keeps_its_shards() {
        let at = |second: i64| Some(jiff::Timestamp::from_second(1_800_000_000 + second).expect("a time"));
        let lease = |name: &str, holder: &str, shards: Option<u32>, acquired| SeenLease {
            name: name.into(),
            holder: holder.into(),
            live: true,
            shards,
            acquired,
            held_here: false,
        };
        let here = |lease: SeenLease| SeenLease {
            held_here: true,
            ..lease
        };
        let names = ("gc-shard-", "gc-leader");
        let refused = |count, me: &str, seen: &[SeenLease]| refusal((count, me), names, seen);
        // Alone, or beside replicas of the same count: nothing to refuse.
        assert_eq!(refused(6, "b", &[lease("gc-shard-0", "a", Some(6), at(0))]), None);
        // A replica of another count held first: this one waits, whatever it holds since.
        let older = lease("gc-shard-0", "a", Some(4), at(0));
        let why = refused(6, "b", std::slice::from_ref(&older)).expect("refused");
        assert!(
            why.contains("a holds gc-shard-0 with --shards 4, this replica has --shards 6"),
            "{why}"
        );
        let later = lease("gc-shard-5", "b", Some(6), at(9));
        assert!(refused(6, "b", &[older.clone(), here(later.clone())]).is_some());
        // ...and that one, seeing this replica's later Lease, goes on.
        assert_eq!(refused(4, "a", &[here(older.clone()), later]), None);
        // Taken at the same moment: the smaller identity keeps them.
        let (a, b) = (
            lease("gc-shard-0", "a", Some(4), at(0)),
            lease("gc-shard-1", "b", Some(6), at(0)),
        );
        assert_eq!(refused(4, "a", &[here(a.clone()), b.clone()]), None);
        assert!(refused(6, "b", &[a, here(b)]).is_some());
        // A count not said (an older agent's Lease) is another count.
        assert!(refused(6, "b", &[lease("gc-shard-0", "a", None, at(0))]).is_some());
        // A Lease not renewed for a duration, another instance's, or a member's decides nothing.
        let stale = SeenLease {
            live: false,
            ..older.clone()
        };
        assert_eq!(
            refused(6, "b", &[stale, lease("other-shard-0", "a", Some(4), at(0))]),
            None
        );
        // A live leader without --shards that led first: every sharded replica waits.
        let leader = lease("gc-leader", "c", None, at(0));
        let why = refused(6, "b", std::slice::from_ref(&leader)).expect("refused");
        assert!(why.contains("c leads this instance without --shards"), "{why}");
        // One that came after this replica's shards waits itself.
        let own = lease("gc-shard-2", "b", Some(6), at(-5));
        assert_eq!(refused(6, "b", &[leader.clone(), here(own.clone())]), None);
        // A Lease naming this identity from before a restart is not held here:
        // the restarted replica does not claim its age.
        assert!(refused(6, "b", &[leader, own]).is_some());
        // Another instance whose name begins with this one's is not this one.
        assert_eq!(shard_of_lease("gc-shard-12", "gc-shard-"), Some(12));
        assert_eq!(shard_of_lease("gc-shard-x-shard-0", "gc-shard-"), None);
    }
}
