//! The canary comparison: the same three-step 20/50/100 canary of a
//! four-replica Deployment behind an nginx Ingress, run by gitcanary, Argo
//! Rollouts and Flagger, each on a control plane of its own. Weights are
//! read back from the canary Ingress's `canary-weight` annotation.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::*;
use super::{Peers, Process, peak_rss_mib};

pub const RELEASES: usize = 5;
/// Aborted releases, each timed from the command to all traffic on stable.
pub const ABORTS: usize = 3;
/// Each tool's wait between steps: gitcanary's and Argo Rollouts' timed
/// pause, Flagger's analysis interval.
pub const STEP_WAIT: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Tool {
    Gitcanary,
    ArgoRollouts,
    Flagger,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Gitcanary => "gitcanary",
            Tool::ArgoRollouts => "Argo Rollouts",
            Tool::Flagger => "Flagger",
        }
    }

    /// Its name in `GITCANARY_PEERS_TOOLS`.
    pub fn key(self) -> &'static str {
        match self {
            Tool::Gitcanary => "gitcanary",
            Tool::ArgoRollouts => "argo-rollouts",
            Tool::Flagger => "flagger",
        }
    }

    /// What `build.sh` builds for it.
    pub fn peer(self) -> Option<&'static str> {
        match self {
            Tool::Gitcanary => None,
            tool => Some(tool.key()),
        }
    }
}

/// Reads and writes of the API server from this process, as a controller
/// sends them: no CLI's start-up in any tool's figures.
pub struct Reader {
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    /// Resolved kinds, so that a timed apply sends only its writes.
    kinds: std::sync::Mutex<std::collections::HashMap<String, kube::api::ApiResource>>,
}

impl Reader {
    pub fn of(cluster: &ControlPlane) -> Reader {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let client = runtime.block_on(client_of(&cluster.kubeconfig));
        Reader {
            runtime,
            client,
            kinds: Default::default(),
        }
    }

    /// Server-side applies every document of `yaml`, as Argo CD or Flux
    /// would apply a new template.
    pub fn apply(&self, yaml: &str) {
        use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
        let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("the bench's YAML");
        self.runtime.block_on(async {
            for document in documents {
                let object: DynamicObject = serde_json::from_value(document).expect("an object");
                let types = object.types.clone().expect("apiVersion and kind");
                let resource = self.kind(&GroupVersionKind::try_from(&types).expect("a kind")).await;
                let name = object.metadata.name.clone().expect("a name");
                let api: Api<DynamicObject> = match &object.metadata.namespace {
                    Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                    None => Api::all_with(self.client.clone(), &resource),
                };
                api.patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(&object))
                    .await
                    .unwrap_or_else(|e| panic!("{} {name} applied: {e}", types.kind));
            }
        });
    }

    async fn kind(&self, gvk: &kube::api::GroupVersionKind) -> kube::api::ApiResource {
        let key = format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind);
        if let Some(resource) = self.kinds.lock().expect("kinds").get(&key) {
            return resource.clone();
        }
        let (resource, _) = kube::discovery::pinned_kind(&self.client, gvk)
            .await
            .unwrap_or_else(|e| panic!("{key} is served: {e}"));
        self.kinds.lock().expect("kinds").insert(key, resource.clone());
        resource
    }

    /// A merge patch of an object's status.
    pub fn patch_status(&self, gvk: &kube::api::GroupVersionKind, ns: &str, name: &str, patch: &Value) {
        use kube::api::{Api, DynamicObject, Patch, PatchParams};
        self.runtime.block_on(async {
            let resource = self.kind(gvk).await;
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &resource);
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap_or_else(|e| panic!("{name}'s status patched: {e}"));
        });
    }

    /// What `gitcanary abort` sends, from this process.
    pub fn gitcanary_abort(&self, ns: &str, name: &str) {
        self.runtime.block_on(async {
            let cluster = gitcanary::cluster::Cluster::from_client(self.client.clone())
                .await
                .expect("a cluster");
            gitcanary::rollout::cli::send_signal(&cluster, ns, name, gitcanary::rollout::api::Signal::Abort)
                .await
                .expect("the abort sent");
        });
    }

    pub fn get(&self, path: &str) -> Value {
        self.runtime.block_on(async {
            let request = http::Request::get(path).body(Vec::new()).expect("a request");
            match self.client.request_text(request).await {
                Ok(text) => serde_json::from_str(&text).unwrap_or(Value::Null),
                Err(_) => Value::Null,
            }
        })
    }

    /// The canary weight of the namespace's nginx canary Ingress; 0 without one.
    pub fn canary_weight(&self, ns: &str) -> u32 {
        let list = self.get(&format!("/apis/networking.k8s.io/v1/namespaces/{ns}/ingresses"));
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(canary_weight_of)
            .unwrap_or(0)
    }

    /// Whether a pod of `image` exists in the namespace.
    pub fn pod_of(&self, ns: &str, image: &str) -> bool {
        let list = self.get(&format!("/api/v1/namespaces/{ns}/pods"));
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["spec"]["containers"][0]["image"] == image && p["metadata"]["deletionTimestamp"].is_null())
    }
}

const NS: &str = "bench-canary";

/// The weight of an nginx canary Ingress; `None` for any other Ingress.
fn canary_weight_of(ingress: &Value) -> Option<u32> {
    let annotations = &ingress["metadata"]["annotations"];
    if annotations["nginx.ingress.kubernetes.io/canary"] != "true" {
        return None;
    }
    Some(
        annotations["nginx.ingress.kubernetes.io/canary-weight"]
            .as_str()
            .and_then(|w| w.parse().ok())
            .unwrap_or(0),
    )
}

/// An Observer's event of an Ingress that leaves every request on stable:
/// the canary Ingress at weight 0, or deleted.
fn all_on_stable(event: &Value) -> bool {
    canary_weight_of(event) == Some(0) || canary_weight_of(&event["deleted"]).is_some()
}

fn image(tag: usize) -> String {
    format!("registry.test/echo:{tag}")
}

fn deployment(name: &str, tag: usize, kind: &str) -> String {
    let api = if kind == "Rollout" {
        "argoproj.io/v1alpha1"
    } else {
        "apps/v1"
    };
    format!(
        "apiVersion: {api}\nkind: {kind}\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  replicas: 4\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      containers: [{{name: echo, image: {}}}]\n",
        image(tag)
    )
}

fn service(name: &str, app: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  selector: {{app: {app}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
    )
}

fn ingress(name: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  ingressClassName: nginx\n  rules:\n  - host: {name}.example\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: {name}, port: {{number: 80}}}}}}}}\n"
    )
}

const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: bench-canary}\n";

/// One workload and what its tool needs for the canary, as YAML documents,
/// the workload first.
fn manifests(tool: Tool, name: &str, tag: usize, rollback_url: &str) -> Vec<String> {
    let pause = STEP_WAIT.as_secs();
    match tool {
        Tool::Gitcanary => vec![
            deployment(name, tag, "Deployment"),
            service(name, name),
            ingress(name),
            format!(
                "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  workloadRef: {{apiVersion: apps/v1, kind: Deployment, name: {name}}}\n  strategy:\n    canary:\n      steps:\n      - {{traffic: 20%, pause: {{duration: {pause}}}}}\n      - {{traffic: 50%, pause: {{duration: {pause}}}}}\n      - {{traffic: 100%}}\n      trafficRoutings:\n      - service: {name}\n        ingress: {{name: {name}, classType: nginx}}\n"
            ),
        ],
        Tool::ArgoRollouts => vec![
            deployment(name, tag, "Rollout").replace(
                "  template:",
                &format!("  strategy:\n    canary:\n      stableService: {name}\n      canaryService: {name}-canary\n      trafficRouting: {{nginx: {{stableIngress: {name}}}}}\n      steps:\n      - setWeight: 20\n      - pause: {{duration: {pause}s}}\n      - setWeight: 50\n      - pause: {{duration: {pause}s}}\n      - setWeight: 100\n  template:"),
            ),
            service(name, name),
            service(&format!("{name}-canary"), name),
            ingress(name),
        ],
        Tool::Flagger => vec![
            // Flagger scales the target to zero and owns its replicas from then on.
            if tag == 1 {
                deployment(name, tag, "Deployment")
            } else {
                deployment(name, tag, "Deployment").replace("  replicas: 4\n", "")
            },
            ingress(name),
            format!(
                "apiVersion: flagger.app/v1beta1\nkind: Canary\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  provider: nginx\n  targetRef: {{apiVersion: apps/v1, kind: Deployment, name: {name}}}\n  ingressRef: {{apiVersion: networking.k8s.io/v1, kind: Ingress, name: {name}}}\n  progressDeadlineSeconds: 60\n  service: {{port: 80, targetPort: 8080}}\n  analysis:\n    interval: {pause}s\n    threshold: 1\n    stepWeights: [20, 50, 100]\n    webhooks:\n    - {{name: abort, type: rollback, url: \"{rollback_url}\"}}\n"
            ),
        ],
    }
}

/// A rollback gate for Flagger: 200 once `abort` is set, 403 before.
struct RollbackGate {
    abort: Arc<AtomicBool>,
    url: String,
}

impl RollbackGate {
    fn start() -> RollbackGate {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/rollback", listener.local_addr().expect("addr"));
        let abort = Arc::new(AtomicBool::new(false));
        let flag = abort.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer);
                let status = if flag.load(Ordering::Relaxed) {
                    "200 OK"
                } else {
                    "403 Forbidden"
                };
                let _ = stream.write_all(
                    format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
                );
            }
        });
        RollbackGate { abort, url }
    }
}

/// A tool running against its own control plane, able to release a new tag.
struct Runner {
    tool: Tool,
    reader: Reader,
    work: std::path::PathBuf,
    process: Option<Process>,
    agent: Option<Agent>,
    repo: Option<Repo>,
    gate: RollbackGate,
}

impl Runner {
    fn start(tool: Tool, cluster: &ControlPlane, peers: &Peers) -> Runner {
        let work = cluster.dir.path().join("canary");
        std::fs::create_dir_all(&work).expect("mkdir");
        let gate = RollbackGate::start();
        let mut runner = Runner {
            tool,
            reader: Reader::of(cluster),
            work: work.clone(),
            process: None,
            agent: None,
            repo: None,
            gate,
        };
        let log = work.join(format!("{tool:?}.log"));
        match tool {
            Tool::Gitcanary => {
                let crd = work.join("crd.yaml");
                std::fs::write(&crd, run(&work, GITCANARY, &["crd"])).expect("crd");
                cluster.kubectl(&["apply", "--server-side", "-f", &crd.display().to_string()]);
                let repo = Repo::create(&work, "canary");
                std::fs::write(repo.work.join("keep"), "").expect("write");
                repo.commit_and_push("empty");
                runner.agent = Some(Agent::start_as_installed(
                    cluster,
                    &repo.url(),
                    "bench-canary",
                    &work.join("cache"),
                    &log,
                ));
                runner.repo = Some(repo);
            }
            Tool::ArgoRollouts => {
                let dir = peers.dir("argo-rollouts");
                cluster.kubectl(&["apply", "--server-side", "-f", &dir.join("crds").display().to_string()]);
                cluster.kubectl(&["create", "namespace", "argo-rollouts"]);
                let args = [
                    format!("--kubeconfig={}", cluster.kubeconfig),
                    format!("--metricsPort={}", free_port()),
                    format!("--healthzPort={}", free_port()),
                ];
                runner.process = Some(Process::start(
                    &dir.join("bin/argo-rollouts"),
                    &args,
                    &cluster.kubeconfig,
                    &log,
                ));
            }
            Tool::Flagger => {
                let dir = peers.dir("flagger");
                cluster.kubectl(&["apply", "--server-side", "-f", &dir.join("crds").display().to_string()]);
                let args = [
                    format!("-kubeconfig={}", cluster.kubeconfig),
                    "-mesh-provider=nginx".to_string(),
                    // No Prometheus: the canary names no metric.
                    format!("-metrics-server=http://127.0.0.1:{}", free_port()),
                    format!("-port={}", free_port()),
                    "-log-level=info".to_string(),
                    // Off by default in Flagger and its chart; on here as for every tool.
                    "-enable-leader-election=true".to_string(),
                ];
                runner.process = Some(Process::start(
                    &dir.join("bin/flagger"),
                    &args,
                    &cluster.kubeconfig,
                    &log,
                ));
            }
        }
        cluster.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"]);
        runner
    }

    fn pid(&self) -> u32 {
        match (&self.agent, &self.process) {
            (Some(agent), _) => agent.child.id(),
            (_, Some(process)) => process.pid(),
            _ => 0,
        }
    }

    /// Asks for `tag` of the workloads named: gitcanary through a push and
    /// its webhook, the others as Argo CD or Flux would, by applying.
    /// `first`: the workloads are new, and everything they need is applied;
    /// otherwise only the workload changes.
    fn apply(&self, names: &[String], tag: usize, first: bool) {
        let documents: Vec<Vec<String>> = names
            .iter()
            .map(|name| manifests(self.tool, name, tag, &self.gate.url))
            .collect();
        self.gate.abort.store(false, Ordering::Relaxed);
        match (&self.repo, &self.agent) {
            (Some(repo), Some(agent)) => {
                // The agent's revert commits of aborted releases come first.
                run(&repo.work, "git", &["pull", "-q", "--rebase", "origin", "main"]);
                let dir = repo.work.join("00-namespace");
                std::fs::create_dir_all(&dir).expect("mkdir");
                std::fs::write(dir.join("namespace.yaml"), NAMESPACE).expect("write");
                for (name, documents) in names.iter().zip(&documents) {
                    let dir = repo.work.join(name);
                    std::fs::create_dir_all(&dir).expect("mkdir");
                    std::fs::write(dir.join("app.yaml"), documents.join("---\n")).expect("write");
                }
                let commit = repo.commit_and_push(&format!("tag {tag}"));
                agent.push(&commit);
            }
            _ => {
                let mut yaml = vec![NAMESPACE.to_string()];
                for documents in documents {
                    if first {
                        yaml.extend(documents);
                    } else {
                        yaml.extend(documents.into_iter().take(1));
                    }
                }
                self.reader.apply(&yaml.join("---\n"));
            }
        }
    }

    /// Whether the release of `name` is over (promoted, or back on stable).
    fn settled(&self, name: &str) -> bool {
        match self.tool {
            Tool::Gitcanary => {
                let rollout = self
                    .reader
                    .get(&format!("/apis/gitcanary.io/v1alpha1/namespaces/{NS}/rollouts/{name}"));
                matches!(rollout["status"]["phase"].as_str(), Some("Healthy" | "Failed"))
                    && self.reader.canary_weight(NS) == 0
            }
            Tool::ArgoRollouts => {
                let rollout = self
                    .reader
                    .get(&format!("/apis/argoproj.io/v1alpha1/namespaces/{NS}/rollouts/{name}"));
                matches!(rollout["status"]["phase"].as_str(), Some("Healthy" | "Degraded"))
                    && rollout["status"]["observedGeneration"].as_str().map(str::to_string)
                        == rollout["metadata"]["generation"].as_i64().map(|g| g.to_string())
            }
            Tool::Flagger => {
                let canary = self
                    .reader
                    .get(&format!("/apis/flagger.app/v1beta1/namespaces/{NS}/canaries/{name}"));
                matches!(
                    canary["status"]["phase"].as_str(),
                    Some("Initialized" | "Succeeded" | "Failed")
                )
            }
        }
    }

    fn abort(&self, name: &str) {
        match self.tool {
            Tool::Gitcanary => self.reader.gitcanary_abort(NS, name),
            Tool::ArgoRollouts => {
                // What `kubectl argo rollouts abort` sends.
                let rollout = kube::api::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout");
                self.reader
                    .patch_status(&rollout, NS, name, &serde_json::json!({"status": {"abort": true}}));
            }
            Tool::Flagger => self.gate.abort.store(true, Ordering::Relaxed),
        }
    }
}

pub struct CanaryFigures {
    /// Push (or apply) → the first canary pod exists, p50.
    pub to_canary: Duration,
    /// 20% applied → 50% applied, p50 (the configured wait included).
    pub step_gap: Duration,
    pub abort: Duration,
    pub rss: f64,
}

pub fn bench_canary(tool: Tool, peers: &Peers, workloads: usize) -> CanaryFigures {
    eprintln!("bench: canary with {}", tool.name());
    let cluster = ControlPlane::start();
    let runner = Runner::start(tool, &cluster, peers);
    let echo = vec!["echo".to_string()];
    runner.apply(&echo, 1, true);
    wait_until("the first version, settled", Duration::from_secs(300), || {
        runner.reader.pod_of(NS, &image(1)) && runner.settled("echo")
    });
    // Every moment below is when a watch from this process saw the change.
    let pods = cluster.observe("v1", "Pod", "pods", NS);
    let ingresses = cluster.observe("networking.k8s.io/v1", "Ingress", "ingresses", NS);
    let long = Duration::from_secs(300);
    let mut to_canary = Vec::new();
    let mut gaps = Vec::new();
    for release in 0..RELEASES {
        let tag = release + 2;
        wait_quiet();
        let started = Instant::now();
        runner.apply(&echo, tag, false);
        let (created, _) = pods.first_after("a canary pod", started, long, |pod| {
            pod["spec"]["containers"][0]["image"] == image(tag) && pod["metadata"]["deletionTimestamp"].is_null()
        });
        to_canary.push(created - started);
        let weight_at_least = |least: u32| move |ingress: &Value| canary_weight_of(ingress).is_some_and(|w| w >= least);
        let (at_20, _) = ingresses.first_after("20%", started, long, weight_at_least(20));
        let (at_50, _) = ingresses.first_after("50%", at_20, long, weight_at_least(50));
        gaps.push(at_50 - at_20);
        wait_until("the release over", long, || {
            runner.reader.canary_weight(NS) == 0 && runner.settled("echo")
        });
        eprintln!(
            "bench:   release {tag}: canary pod after {:?}, 20% → 50% after {:?}",
            to_canary[release], gaps[release]
        );
        pods.forget_before(at_50);
        ingresses.forget_before(at_50);
    }
    // Abort mid-release: from the command to every request on stable.
    let mut aborts = Vec::new();
    for sample in 0..ABORTS {
        let tag = RELEASES + 2 + sample;
        wait_quiet();
        let started = Instant::now();
        runner.apply(&echo, tag, false);
        ingresses.first_after("20% before the abort", started, long, |ingress| {
            canary_weight_of(ingress).is_some_and(|w| w >= 20)
        });
        let started = Instant::now();
        runner.abort("echo");
        let (done, _) = ingresses.first_after("all on stable", started, long, all_on_stable);
        aborts.push(done - started);
        eprintln!("bench:   abort {tag}: all on stable after {:?}", aborts[sample]);
        wait_until("the aborted release over", long, || runner.settled("echo"));
    }
    drop((pods, ingresses));

    // Memory with many governed workloads, each initialised by its tool.
    let names: Vec<String> = (0..workloads).map(|i| format!("w{i:03}")).collect();
    runner.apply(&names, 1, true);
    wait_until("every workload initialised", Duration::from_secs(900), || {
        names.iter().all(|name| runner.settled(name))
    });
    wait_quiet();
    let rss = peak_rss_mib(runner.pid());
    let kept = std::env::temp_dir().join(format!("gitcanary-peers-{tool:?}.log"));
    if std::fs::copy(runner.work.join(format!("{tool:?}.log")), &kept).is_ok() {
        eprintln!("bench:   {}'s log: {}", tool.name(), kept.display());
    }
    to_canary.sort();
    gaps.sort();
    CanaryFigures {
        to_canary: percentile(&to_canary, 0.5),
        step_gap: percentile(&gaps, 0.5),
        abort: {
            aborts.sort();
            percentile(&aborts, 0.5)
        },
        rss,
    }
}
