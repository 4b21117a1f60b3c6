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

/// A leader whose renewal hangs (an API server that takes the request and
/// never answers) stops leading at its renew deadline, while the Lease it
/// last renewed still holds it, instead of waiting on the request.
#[tokio::test]
async fn a_leader_whose_renewal_hangs_steps_down_before_its_lease_expires() {
    use gitcanary::cluster::Cluster;
    use gitcanary::lease::{Leadership, LeaseConfig};

    let direct = support::client().await;
    let ns = support::namespace(&direct, "lease-hang").await;
    let (proxy, proxied) = StallingProxy::start().await;
    let cluster = Cluster::from_client(proxied)
        .await
        .expect("a cluster through the proxy");
    let config = LeaseConfig {
        namespace: ns.clone(),
        name: "leader".into(),
        identity: "hung-leader".into(),
        duration: Duration::from_secs(6),
        annotations: Default::default(),
    };
    let (lease_duration, renew_deadline) = (config.duration, config.renew_deadline());
    let leadership = std::sync::Arc::new(Leadership::new(&cluster, config));
    assert!(leadership.try_acquire_or_renew().await.expect("acquired").0);
    let acquired = holder_and_renewal(&direct, &ns).await;
    let keeping = tokio::spawn({
        let leadership = leadership.clone();
        async move {
            leadership.keep().await;
            (Instant::now(), jiff::Timestamp::now())
        }
    });
    // A renewal by keep() went through the proxy: its connection is the one that hangs.
    eventually("keep() renews the lease", WAIT, || async {
        (holder_and_renewal(&direct, &ns).await != acquired).then_some(())
    })
    .await;
    proxy.stall();
    let stalled = Instant::now();
    let give_up = lease_duration + Duration::from_secs(3);
    let (returned, returned_at) = tokio::time::timeout(give_up, keeping)
        .await
        .unwrap_or_else(|_| {
            panic!("keep() still waited on a hung renewal {give_up:?} after the stall (lease {lease_duration:?})")
        })
        .expect("keep() does not panic");

    // Its last renewal was before the stall, so keep() must give up by the renew deadline after it
    // (1 s of slack for scheduling).
    let after_stall = returned - stalled;
    assert!(
        after_stall <= renew_deadline + Duration::from_secs(1),
        "keep() returned {after_stall:?} after the stall; its renew deadline is {renew_deadline:?}"
    );
    // Read directly (the proxy hangs): nothing could change the Lease since the leader's last write.
    let (holder, renewed) = holder_and_renewal(&direct, &ns).await;
    assert_eq!(
        holder, "hung-leader",
        "the Lease still named the leader when it stepped down"
    );
    let expires = renewed.parse::<jiff::Timestamp>().expect("a renew time") + lease_duration;
    assert!(
        returned_at < expires,
        "keep() returned at {returned_at}, but the Lease, last renewed at {renewed}, expired for the others at {expires}"
    );
}

/// A TCP proxy to the test API server that can be made to hang: once
/// stalled it passes no byte either way, on open or new connections, yet
/// keeps them all open. TLS passes through untouched.
struct StallingProxy {
    stalled: tokio::sync::watch::Sender<bool>,
}

impl StallingProxy {
    /// The proxy, and a client of the test control plane that connects through it.
    async fn start() -> (StallingProxy, kube::Client) {
        use kube::config::{Config, KubeConfigOptions, Kubeconfig};

        let file = Kubeconfig::read_from(support::kubeconfig()).expect("the test kubeconfig is readable");
        let mut config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
            .await
            .expect("the test kubeconfig is valid");
        let host = config.cluster_url.host().expect("an API server host").to_string();
        let upstream = format!("{host}:{}", config.cluster_url.port_u16().unwrap_or(443));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("an address");
        let (stalled, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, upstream.clone(), watch.clone()));
            }
        });
        config.cluster_url = format!("https://{addr}").parse().expect("the proxy's URL");
        // The certificate names the API server's host, not the proxy's address.
        config
            .tls_server_name
            .get_or_insert_with(|| host.trim_matches(['[', ']']).to_string());
        let client = kube::Client::try_from(config).expect("a client through the proxy");
        (StallingProxy { stalled }, client)
    }

    fn stall(&self) {
        self.stalled.send_replace(true);
    }
}

async fn forward(client: tokio::net::TcpStream, upstream: String, stalled: tokio::sync::watch::Receiver<bool>) {
    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, stalled.clone()),
        pump(server_read, client_write, stalled),
    );
}

/// Copies bytes until the proxy stalls, then holds both ends open forever.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = tokio::select! {
            biased;
            _ = stalled.wait_for(|stalled| *stalled) => break,
            read = from.read(&mut buffer) => read,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) if to.write_all(&buffer[..n]).await.is_err() => return,
            Ok(_) => {}
        }
    }
    std::future::pending::<()>().await
}
