//! A canary on real requests: the echo app behind the test gateway
//! (Traefik, from tests/testenv/gateway-up.sh), released to 20% and aborted
//! under steady load, five times, then released and promoted under load.
//! Prints, for the aborts, the time from `gitcanary abort` to the route's
//! canary weight read back as 0 and to the last answer from a canary pod;
//! for the promote, the requests sent and how many failed.
//!
//!   cargo bench --bench traffic
//!
//! Not a test: it asserts nothing and is not run by CI.

mod common;
#[path = "../tests/support/traffic.rs"]
#[allow(dead_code)]
mod traffic;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use traffic::{Counts, Load, burst};

const ABORTS: usize = 5;
const HOST: &str = "bench.test";

static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();

/// The kubeconfig of the control plane, beside whose state the gateway's
/// address is kept (read by `traffic`).
fn kubeconfig() -> &'static PathBuf {
    KUBECONFIG.get().expect("the control plane started")
}

fn app(tag: usize) -> String {
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: bench}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: bench}}
spec:
  replicas: 4
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      containers: [{{name: echo, image: registry.test/echo:{tag}, ports: [{{containerPort: 8080}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: bench}}
spec:
  selector: {{app: echo}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: echo, namespace: bench}}
spec:
  parentRefs: [{{name: gateway, namespace: gitcanary-test}}]
  hostnames: [{HOST}]
  rules:
  - backendRefs: [{{name: echo, port: 80}}]
---
apiVersion: gitcanary.io/v1alpha1
kind: Rollout
metadata: {{name: echo, namespace: bench}}
spec:
  workloadRef: {{kind: Deployment, name: echo}}
  strategy:
    canary:
      steps:
      - {{traffic: 20%, replicas: 1, pause: {{}}}}
      trafficRoutings:
      - service: echo
        gateway: {{httpRouteName: echo}}
      gracePeriodSeconds: 1
"
    )
}

fn image(tag: usize) -> String {
    format!("registry.test/echo:{tag}")
}

fn main() {
    eprintln!("bench: starting the control plane and the gateway");
    // SAFETY: set before any thread is started.
    unsafe { std::env::set_var("GITCANARY_TESTENV_GATEWAY", "1") };
    let cluster = ControlPlane::start();
    KUBECONFIG.set(PathBuf::from(&cluster.kubeconfig)).expect("set once");
    cluster.install_rollout_crd();
    let work = cluster.dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let repo = Repo::create(&work, "traffic");
    let release = |tag: usize| {
        // The agent's revert commits come first (none before the first push).
        let _ = std::process::Command::new("git")
            .args(["pull", "-q", "--rebase", "origin", "main"])
            .current_dir(&repo.work)
            .output();
        std::fs::create_dir_all(repo.work.join("echo")).expect("mkdir");
        std::fs::write(repo.work.join("echo/app.yaml"), app(tag)).expect("write");
        repo.commit_and_push(&format!("echo {tag}"))
    };
    let first = release(1);
    let agent = Agent::start(
        &cluster,
        &repo.url(),
        "bench-traffic",
        &work.join("cache"),
        &std::env::temp_dir().join("gitcanary-bench-traffic.log"),
    );
    agent.push(&first);
    let rollout = |path: &str| {
        cluster.kubectl(&[
            "get",
            "rollout",
            "echo",
            "-n",
            "bench",
            "-o",
            &format!("jsonpath={path}"),
        ])
    };
    let canary_weight = || {
        cluster
            .kubectl(&[
                "get",
                "httproute",
                "echo",
                "-n",
                "bench",
                "-o",
                "jsonpath={.spec.rules[0].backendRefs[?(@.name==\"echo-canary\")].weight}",
            ])
            .parse::<u32>()
            .unwrap_or(0)
    };
    let answered_by = |tag: usize| burst(HOST, 40, Duration::from_secs(10)).share(&image(tag)) == 1.0;
    wait_until("1 answering", Duration::from_secs(300), || {
        rollout("{.status.phase}") == "Healthy" && answered_by(1)
    });

    // On a quiet machine, `tag` released and paused at its 20% step.
    let paused_at_20 = |tag: usize| {
        wait_quiet();
        agent.push(&release(tag));
        wait_until("paused at 20%", Duration::from_secs(300), || {
            rollout("{.status.phase}") == "Paused" && canary_weight() == 20
        });
    };
    let mut to_weight_zero = Vec::new();
    let mut to_last_answer = Vec::new();
    let (mut failed_in_aborts, mut sent_in_aborts) = (0, 0);
    for sample in 0..ABORTS {
        let tag = sample + 2;
        paused_at_20(tag);
        let load = Load::start(HOST);
        wait_until("the canary answers", Duration::from_secs(60), || {
            load.answers().iter().any(|a| a.image == image(tag))
        });
        let asked = Instant::now();
        run(
            &work,
            GITCANARY,
            &["abort", "echo", "-n", "bench", "--kubeconfig", &cluster.kubeconfig],
        );
        let weight_zero = wait_until("weight 0", Duration::from_secs(60), || canary_weight() == 0);
        // The gateway has stopped sending the canary anything once 40
        // requests in a row reach stable.
        wait_until("the canary quiet", Duration::from_secs(60), || answered_by(1));
        let answers = load.stop();
        let last = answers
            .iter()
            .filter(|a| a.image == image(tag))
            .map(|a| a.at)
            .max()
            .expect("the canary answered");
        to_weight_zero.push(weight_zero - asked);
        to_last_answer.push(last.saturating_duration_since(asked));
        let counts = Counts::of(&answers);
        eprintln!(
            "bench:   abort {}: weight 0 after {:?}, last canary answer after {:?}, {} failed of {} (statuses {:?}, {} without an answer)",
            sample + 1,
            to_weight_zero[sample],
            to_last_answer[sample],
            counts.failures(),
            answers.len(),
            counts.by_status,
            counts.failed
        );
        failed_in_aborts += counts.failures();
        sent_in_aborts += answers.len();
        wait_until("back on 1, the revert synced", Duration::from_secs(300), || {
            rollout("{.status.phase}") == "Healthy" && rollout("{.status.writtenBack.action}") == "Revert"
        });
    }

    // A release promoted under load: the step, the promote, the stable
    // roll-out and the canary's removal.
    let tag = ABORTS + 2;
    paused_at_20(tag);
    let load = Load::start(HOST);
    run(
        &work,
        GITCANARY,
        &["promote", "echo", "-n", "bench", "--kubeconfig", &cluster.kubeconfig],
    );
    wait_until(
        "promoted, only the new version answering",
        Duration::from_secs(300),
        || rollout("{.status.phase}") == "Healthy" && answered_by(tag),
    );
    let promoted = Counts::of(&load.stop());

    to_weight_zero.sort();
    to_last_answer.sort();
    let each = |all: &[Duration]| all.iter().map(|d| millis(*d)).collect::<Vec<_>>().join(", ");
    println!("| the echo app through Traefik v3.6.12, 2 keep-alive clients | measured |");
    println!("| --- | --- |");
    println!(
        "| abort → route weight read back as 0 (p50 of {ABORTS}) | {} ({}) |",
        millis(percentile(&to_weight_zero, 0.5)),
        each(&to_weight_zero)
    );
    println!(
        "| abort → last answer from a canary pod (p50 of {ABORTS}) | {} ({}) |",
        millis(percentile(&to_last_answer, 0.5)),
        each(&to_last_answer)
    );
    println!("| aborts under load: requests failed / sent | {failed_in_aborts} / {sent_in_aborts} |");
    println!(
        "| promote under load: requests failed / sent | {} / {} |",
        promoted.failures(),
        promoted.answered() + promoted.failed
    );
}
