//! The whole offline pipeline on an arbitrary repository: load, validate,
//! plan each app, and walk each Rollout's release with its overlays. The
//! input is the repository's files, separated by NUL bytes, spread over
//! three apps. Two more shapes steer the fuzzer where a whole repository
//! rarely goes: the first part's text is put into a Rollout's durations,
//! percents and analysis fields, and the second part is an app's
//! `gitcanary.yaml` (Helm and Kustomize settings), read as the renderers
//! would before any of them runs. Any panic is a finding.
#![no_main]

use std::collections::BTreeMap;

use gitcanary::render::tree::{Entry, SourceTree};
use libfuzzer_sys::fuzz_target;

const WORKLOAD: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: echo, namespace: demo}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: echo}}\n  template:\n    metadata: {labels: {app: echo}}\n    spec: {containers: [{name: echo, image: echo:2}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: demo}\nspec: {selector: {app: echo}, ports: [{port: 80}]}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: echo, namespace: demo}\nspec:\n  rules:\n  - backendRefs: [{name: echo, port: 80}]\n";

/// A Rollout whose free-text fields are pieces of `text`.
fn rollout(text: &str) -> String {
    let mut pieces = text.split('|').map(|p| serde_json::to_string(p).unwrap_or_default());
    let mut next = || pieces.next().unwrap_or_else(|| "\"1\"".to_string());
    format!(
        "apiVersion: gitcanary.io/v1alpha1\nkind: Rollout\nmetadata: {{name: echo, namespace: demo}}\nspec:\n  rolloutID: {}\n  workloadRef: {{kind: Deployment, name: echo}}\n  strategy:\n    canary:\n      progressDeadline: {}\n      trafficRoutings: [{{service: echo, gateway: {{httpRouteName: echo}}}}]\n      steps:\n      - {{traffic: {}, replicas: {}, pause: {{duration: {}}}}}\n      - {{traffic: {}, pause: {{}}}}\n  analysisTemplates:\n  - name: t\n    interval: {}\n    prometheus: {{name: {}}}\n    metrics: [{{name: m, query: up, successCondition: {}}}]\n",
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
    )
}

/// One app directory held in memory.
struct OneApp {
    files: BTreeMap<String, Vec<u8>>,
}

impl SourceTree for OneApp {
    fn list(&self, dir: &str) -> Option<BTreeMap<String, Entry>> {
        let prefix = format!("{dir}/");
        let entries: BTreeMap<String, Entry> = self
            .files
            .keys()
            .filter_map(|path| path.strip_prefix(&prefix))
            .map(|rest| match rest.split_once('/') {
                Some((sub, _)) => (sub.to_string(), Entry::Dir),
                None => (rest.to_string(), Entry::File),
            })
            .collect();
        (!entries.is_empty()).then_some(entries)
    }

    fn read(&self, file: &str) -> Result<Vec<u8>, String> {
        self.files.get(file).cloned().ok_or_else(|| format!("{file} does not exist"))
    }

    fn id(&self, dir: &str) -> Option<String> {
        Some(format!("{dir}:{}", self.files.len()))
    }
}

fuzz_target!(|data: &[u8]| {
    let options = gitcanary::sync::SyncOptions::default();
    let files = data
        .split(|&b| b == 0)
        .enumerate()
        .map(|(i, content)| (format!("app{}/file{i}.yaml", i % 3), content.to_vec()));
    let mut set = gitcanary::manifest::load_files(files);
    gitcanary::rollout::validate::validate(&mut set, &options.allowed);
    for problem in gitcanary::sync::offline::plan_problems(&set, &options) {
        let _ = problem.to_string();
    }

    let mut parts = data.splitn(2, |&b| b == 0);
    let fields = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let spec = rollout(&fields);
    let mut set = gitcanary::manifest::load_files(
        [
            ("echo/app.yaml".to_string(), WORKLOAD.as_bytes().to_vec()),
            ("echo/rollout.yaml".to_string(), spec.into_bytes()),
        ]
        .into_iter(),
    );
    gitcanary::rollout::validate::validate(&mut set, &options.allowed);
    for problem in gitcanary::sync::offline::plan_problems(&set, &options) {
        let _ = problem.to_string();
    }

    let settings = parts.next().unwrap_or_default().to_vec();
    let tree = OneApp {
        files: BTreeMap::from([
            ("web/gitcanary.yaml".to_string(), settings),
            ("web/Chart.yaml".to_string(), b"apiVersion: v2\nname: web\nversion: 0.1.0\n".to_vec()),
            ("web/values.yaml".to_string(), b"a: 1\n".to_vec()),
            ("web/kustomization.yaml".to_string(), b"resources: []\n".to_vec()),
        ]),
    };
    if let Err(problem) = gitcanary::render::detect(&tree, "web") {
        let _ = problem.to_string();
    }
});
