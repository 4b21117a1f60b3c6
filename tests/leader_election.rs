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
