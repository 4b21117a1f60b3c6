//! Two agents, one Lease: only the leader acts; when it dies the other takes
//! over within the lease duration and finishes the release it started; a
//! leader stopped with SIGTERM hands the Lease over at once.

mod support;

use std::time::{Duration, Instant};

use gitcanary::rollout::api::{Phase, Rollout};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use support::agent::{AgentProcess, Scenario};
use support::eventually;

const WAIT: Duration = Duration::from_secs(90);
const LEASE_SECONDS: u64 = 4;

fn write_app(scenario: &Scenario, image: &str) {
    let spec = "  strategy:\n    canary:\n      steps:\n      - {replicas: 1, pause: {duration: 6}}\n      - {replicas: 2, pause: {duration: 2}}\n";
    support::agent::write_echo_app(&scenario.repo, &scenario.ns, image, spec);
}

fn agent(scenario: &Scenario, identity: &str) -> AgentProcess {
    AgentProcess::start_with(
        &scenario.repo,
        &scenario.ns,
        &scenario.cache.path().join(identity),
        &[
            "--leader-identity",
            identity,
            "--lease-duration",
            &LEASE_SECONDS.to_string(),
        ],
        &[],
    )
}

async fn status(scenario: &Scenario) -> Option<gitcanary::rollout::api::RolloutStatus> {
    let rollouts: Api<Rollout> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    rollouts.get_opt("echo").await.ok().flatten()?.status
}

async fn holder(scenario: &Scenario) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let lease = leases
        .get_opt(&format!("e2e-{}-leader", scenario.ns))
        .await
        .ok()
        .flatten()?;
    lease.spec?.holder_identity
}

#[tokio::test]
async fn only_the_leader_acts_and_a_killed_leader_is_replaced_within_the_lease() {
    let scenario = Scenario::new("leader").await;
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    for identity in ["agent-a", "agent-b"] {
        std::fs::create_dir_all(scenario.cache.path().join(identity)).expect("cache");
    }
    let mut a = agent(&scenario, "agent-a");
    let mut b = agent(&scenario, "agent-b");
    eventually("healthy on 1.0", WAIT, || async {
        (status(&scenario).await?.phase == Phase::Healthy).then_some(())
    })
    .await;
    let leader_name = holder(&scenario).await.expect("a holder");
    let (leader, follower, follower_name) = if leader_name == "agent-a" {
        (&mut a, &mut b, "agent-b")
    } else {
        (&mut b, &mut a, "agent-a")
    };
    // The status is written before the sync's log line: wait for the line.
    let leader_log = eventually("the leader logs its sync", WAIT, || async {
        Some(leader.log_text()).filter(|log| log.contains("app synced"))
    })
    .await;
    assert!(leader_log.contains("app synced"));
    let writers = [leader_log, follower.log_text()]
        .iter()
        .filter(|log| log.contains("app synced"))
        .count();
    assert_eq!(writers, 1, "exactly one agent syncs");
    let follower_log = eventually("the follower waits", WAIT, || async {
        Some(follower.log_text()).filter(|log| log.contains("another agent leads"))
    })
    .await;
    assert!(!follower_log.contains("app synced"), "{follower_log}");

    write_app(&scenario, "2.0");
    let released = scenario.repo.commit_and_push("echo 2.0");
    eventually("the release runs", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Progressing && status.canary_status?.current_step_index == 1).then_some(())
    })
    .await;
    leader.kill();
    let killed = Instant::now();
    eventually("the follower takes the lease", WAIT, || async {
        (holder(&scenario).await.as_deref() == Some(follower_name)).then_some(())
    })
    .await;
    let takeover = killed.elapsed();
    assert!(
        takeover <= Duration::from_secs(LEASE_SECONDS * 2),
        "took {takeover:?} for a {LEASE_SECONDS} s lease"
    );
    let finished = eventually("the new leader promotes 2.0", WAIT, || async {
        let status = status(&scenario).await?;
        (status.phase == Phase::Healthy && status.stable_commit == released).then_some(status)
    })
    .await;
    assert_eq!(finished.step_history.len(), 2, "{:?}", finished.step_history);
    assert!(follower.log_text().contains("leading: this agent acts"));
}

#[tokio::test]
async fn a_leader_stopped_with_sigterm_hands_the_lease_over_at_once() {
    let scenario = Scenario::new("leader-term").await;
    write_app(&scenario, "1.0");
    scenario.repo.commit_and_push("echo 1.0");
    for identity in ["agent-a", "agent-b"] {
        std::fs::create_dir_all(scenario.cache.path().join(identity)).expect("cache");
    }
    // A long lease: waiting it out would take 60 s.
    let long = |identity: &str| {
        AgentProcess::start_with(
            &scenario.repo,
            &scenario.ns,
            &scenario.cache.path().join(identity),
            &["--leader-identity", identity, "--lease-duration", "60"],
            &[],
        )
    };
    let mut a = long("agent-a");
    eventually("a leads", WAIT, || async {
        (holder(&scenario).await.as_deref() == Some("agent-a")).then_some(())
    })
    .await;
    let b = long("agent-b");
    // b looked at the Lease, found a leading, and waits.
    eventually("b waits for the lease", WAIT, || async {
        b.log_text()
            .contains("another agent leads; waiting for the lease")
            .then_some(())
    })
    .await;
    assert_eq!(holder(&scenario).await.as_deref(), Some("agent-a"));
    assert!(a.terminate(), "a exits cleanly");
    let stopped = Instant::now();
    eventually("b leads", Duration::from_secs(30), || async {
        (holder(&scenario).await.as_deref() == Some("agent-b")).then_some(())
    })
    .await;
    assert!(stopped.elapsed() < Duration::from_secs(20), "{:?}", stopped.elapsed());
    assert!(a.log_text().contains("lease released"), "{}", a.log_text());
}

/// A holder renews its Lease in one request (a compare-and-swap on the
/// version it wrote), not a read and a write; and a Lease another agent
/// took since is noticed at the next renewal, which then reads it.
#[tokio::test]
async fn a_renewal_is_one_request_and_a_taken_lease_is_noticed_at_the_next() {
    use gitcanary::cluster::Cluster;
    use gitcanary::lease::{Leadership, LeaseConfig};

    let client = support::client().await;
    let ns = support::namespace(&client, "lease").await;
    let connect = || Cluster::connect(Some(support::kubeconfig()), None);
    let (first_cluster, second_cluster) = (connect().await.expect("a cluster"), connect().await.expect("a cluster"));
    let config = |identity: &str| LeaseConfig {
        namespace: ns.clone(),
        name: "leader".into(),
        identity: identity.into(),
        duration: Duration::from_secs(1),
        annotations: Default::default(),
    };
    let first = Leadership::new(&first_cluster, config("first"));
    assert_eq!(
        first.try_acquire_or_renew().await.expect("acquired"),
        (true, "first".into())
    );

    let before = first_cluster.requests.leases();
    for _ in 0..5 {
        assert!(first.try_acquire_or_renew().await.expect("renewed").0);
    }
    assert_eq!(first_cluster.requests.leases() - before, 5, "one request a renewal");
    let renewed = holder_and_renewal(&client, &ns).await;

    // The second agent takes it once it has seen the record unchanged for a
    // whole lease duration (the first stopped renewing meanwhile).
    let second = Leadership::new(&second_cluster, config("second"));
    let deadline = Instant::now() + WAIT;
    while !second.try_acquire_or_renew().await.expect("a look").0 {
        assert!(Instant::now() < deadline, "the second agent never took the lease");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_ne!(holder_and_renewal(&client, &ns).await, renewed);

    let before = first_cluster.requests.leases();
    assert_eq!(
        first.try_acquire_or_renew().await.expect("a renewal"),
        (false, "second".into()),
        "the first agent's stale renewal must conflict, not win"
    );
    assert_eq!(
        first_cluster.requests.leases() - before,
        2,
        "the conflicting write, then a read"
    );
    assert_eq!(holder_and_renewal(&client, &ns).await.0, "second");
}

async fn holder_and_renewal(client: &kube::Client, ns: &str) -> (String, String) {
    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get("leader")
        .await
        .expect("the lease");
    let spec = lease.spec.unwrap_or_default();
    (
        spec.holder_identity.unwrap_or_default(),
        spec.renew_time.map(|t| t.0.to_string()).unwrap_or_default(),
    )
}
