//! The `Rollout` API (`gitcanary.io/v1alpha1`). Field names follow Kruise
//! Rollout where the two overlap.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod hooks;
mod strategy;
pub use hooks::*;
pub use strategy::*;

pub const GROUP: &str = crate::API_GROUP;
pub const API_VERSION: &str = "gitcanary.io/v1alpha1";
pub const KIND: &str = "Rollout";

/// A canary release policy for one Deployment, StatefulSet or Knative Service.
// Printer columns repeat `type_`, which this lint mistakes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "gitcanary.io",
    version = "v1alpha1",
    kind = "Rollout",
    namespaced,
    status = "RolloutStatus",
    derive = "PartialEq",
    printcolumn(name = "STATUS", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "STEP",
        type_ = "integer",
        json_path = ".status.canaryStatus.currentStepIndex"
    ),
    printcolumn(
        name = "STATE",
        type_ = "string",
        json_path = ".status.canaryStatus.currentStepState"
    ),
    printcolumn(name = "TRAFFIC", type_ = "string", json_path = ".status.canaryStatus.traffic"),
    printcolumn(name = "MESSAGE", type_ = "string", json_path = ".status.canaryStatus.message"),
    printcolumn(name = "AGE", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    pub workload_ref: WorkloadRef,
    /// Names the release; default: the short id of the commit that brought the change.
    #[serde(default, rename = "rolloutID", skip_serializing_if = "Option::is_none")]
    pub rollout_id: Option<String>,
    pub strategy: Strategy,
    /// Metric checks that steps (`analysis: {templateRef}`) and the whole
    /// release (`strategy.canary.analysis`) run against Prometheus.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis_templates: Vec<AnalysisTemplate>,
    /// Signed calls to the operator's endpoints at points of a release.
    #[serde(default, skip_serializing_if = "Hooks::is_empty")]
    pub hooks: Hooks,
    /// Receivers (NAMEs of the agent's `--notify`) told of this Rollout's
    /// releases besides those told of every Rollout (`--notify-default`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisTemplate {
    pub name: String,
    /// Prometheus to ask, by the name the agent was given it under; default
    /// the agent's `--prometheus-url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusRef>,
    /// Time between measurements (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// Successful measurements that pass a step without a pause (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub count: Option<u32>,
    /// Failed measurements tolerated; one more fails the release (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub failure_limit: Option<u32>,
    /// Inconclusive measurements (no data, NaN, Prometheus unreachable)
    /// tolerated; one more pauses the release (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub inconclusive_limit: Option<u32>,
    pub metrics: Vec<AnalysisMetric>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusRef {
    /// A Prometheus the agent was started with (`--prometheus NAME=URL`):
    /// the operator chooses the servers the agent asks, never a repository.
    #[serde(default)]
    pub name: String,
    /// No longer accepted: validation refuses it and says to use `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisMetric {
    pub name: String,
    /// PromQL returning one number; may use {{namespace}}, {{canaryService}},
    /// {{stableService}}, {{canaryRevision}}, {{stableRevision}}, {{rolloutID}}.
    /// Absent when the metric is a web check.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub query: String,
    /// The metric read from a web endpoint instead of Prometheus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<WebCheck>,
    /// A Job run at the step instead: its success passes, its failure fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobCheck>,
    /// `< 0.01`, `>= 0.99`, or against the same query on stable:
    /// `canary <= stable * 1.1`. None for a job.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub success_condition: String,
}

/// A Job gitcanary creates at the step (as the app's identity, owned by
/// the Rollout, one per release and step) and whose outcome is the verdict.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobCheck {
    /// A `batch/v1` JobSpec; its strings may use the query variables.
    #[schemars(schema_with = "any_object")]
    pub spec: serde_json::Value,
}

fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// A number read from a web endpoint the agent was started with
/// (`--web-check NAME=URL`): the operator chooses where the agent asks.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebCheck {
    /// The NAME of one of the agent's `--web-check NAME=URL`.
    pub name: String,
    /// Appended to the endpoint's URL (`/score/{{rolloutID}}`); may use the
    /// query variables.
    #[serde(default)]
    pub path: String,
    /// `GET` (default) or `POST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// A POST's JSON body; may use the query variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Where the number (or boolean: true is 1) is in the answer: `$.score`,
    /// `$.checks[0].ok`.
    pub json_path: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    #[serde(default = "default_workload_api_version")]
    pub api_version: String,
    /// `Deployment` or `StatefulSet` (apps/v1), or `Service` (serving.knative.dev/v1).
    pub kind: String,
    pub name: String,
}

fn default_workload_api_version() -> String {
    "apps/v1".to_string()
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    #[default]
    Healthy,
    Progressing,
    Paused,
    Promoting,
    Reverting,
    Failed,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepState {
    #[default]
    StepUpgrade,
    StepTrafficRouting,
    /// Kruise Rollout's name for it; gitcanary's earlier one is still read.
    #[serde(rename = "StepMetricsAnalysis", alias = "StepAnalysis")]
    StepAnalysis,
    StepPaused,
    StepReady,
    Completed,
}

impl StepState {
    /// The name a status holds, as `kubectl get` shows it.
    pub fn name(self) -> &'static str {
        match self {
            StepState::StepUpgrade => "StepUpgrade",
            StepState::StepTrafficRouting => "StepTrafficRouting",
            StepState::StepAnalysis => "StepMetricsAnalysis",
            StepState::StepPaused => "StepPaused",
            StepState::StepReady => "StepReady",
            StepState::Completed => "Completed",
        }
    }
}

impl JsonSchema for StepState {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StepState".into()
    }

    // The earlier name stays valid: a status written before, and not
    // rewritten since, is still accepted by the API server.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "enum": ["StepUpgrade", "StepTrafficRouting", "StepMetricsAnalysis", "StepAnalysis", "StepPaused", "StepReady", "Completed"]
        })
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stable_revision: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub canary_revision: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stable_commit: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub canary_commit: String,
    /// The release being run (spec.rolloutID or the short canary commit).
    #[serde(default, rename = "rolloutID", skip_serializing_if = "String::is_empty")]
    pub rollout_id: String,
    /// Hash of the Git pod template that is stable.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stable_template_hash: String,
    /// Hash of the Git pod template being released.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub canary_template_hash: String,
    /// Hash of a template whose release failed; it is not released again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failed_template_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_status: Option<CanaryStatus>,
    /// Releases replaced by a newer commit before they finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub superseded: Vec<SupersededRelease>,
    /// The last promote and abort signals acted on, so each counts once.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_promote_signal: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_abort_signal: String,
    /// The last promote or abort ignored: for another release, or sent while
    /// nothing waited for it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ignored_signal: String,
    /// Each step of the current (or last) release: when it ran and what passed it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_history: Vec<StepRecord>,
    /// A promote or revert that must still be written to Git; cleared once pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_writeback: Option<PendingWriteback>,
    /// The last promote or revert pushed to Git.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_back: Option<WrittenBack>,
    /// Analysis of the current release: the step's and the background run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub analysis_runs: Vec<AnalysisRun>,
    /// Set when this status began from the status file in Git (a rebuilt
    /// cluster, a re-created Rollout): the file and the commit it was read at.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resumed_from_git: String,
    /// The commit whose release was refused before it started (the
    /// message says why); cleared when a release starts or Git is stable.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub refused_commit: String,
}

/// Which analysis a run is.
/// Whether a manifest is a gitcanary Rollout.
pub fn is_rollout(manifest: &crate::manifest::Manifest) -> bool {
    manifest.group() == GROUP && manifest.kind() == KIND
}

/// A decision given out of band (CLI, pull-request comment, gate), never from Git.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Promote,
    Abort,
}

impl Signal {
    /// The word a person types: `gitcanary promote`, `/gitcanary abort`.
    pub fn verb(self) -> &'static str {
        match self {
            Signal::Promote => "promote",
            Signal::Abort => "abort",
        }
    }
}

pub const BACKGROUND_RUN: &str = "background";

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisRun {
    /// `background`, `step-N`, or a hook's calls (`hook-preRelease`,
    /// `hook-step-N`, `hook-prePromote`).
    pub name: String,
    pub template: String,
    #[serde(rename = "rolloutID")]
    pub rollout_id: String,
    #[schemars(with = "i32")]
    pub successful: u32,
    #[schemars(with = "i32")]
    pub failed: u32,
    #[schemars(with = "i32")]
    pub inconclusive: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_measured_at: String,
    /// The last measurement: each metric's value against its condition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// A hook that stopped answering, passed over by this promote.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub skipped_by: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WrittenBack {
    pub action: WritebackAction,
    #[serde(rename = "rolloutID")]
    pub rollout_id: String,
    /// The commit in Git (gitcanary's own, or an earlier identical one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
    /// What a reader should know, such as later commits the revert also reset.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl WrittenBack {
    /// Whether this is what `pending` waited to write: the same release's
    /// same action.
    pub fn is_done_of(&self, pending: &PendingWriteback) -> bool {
        pending.action == self.action && pending.rollout_id == self.rollout_id
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    #[schemars(with = "i32")]
    pub step: u32,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub finished_at: String,
    /// What ended its pause: a timer, or who promoted it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub passed_by: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingWriteback {
    pub action: WritebackAction,
    #[serde(rename = "rolloutID")]
    pub rollout_id: String,
    /// The commit that was stable when the release began.
    pub stable_commit: String,
    /// The commit the release was for.
    pub canary_commit: String,
    /// Why it failed (revert only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cause: String,
    pub at: String,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum WritebackAction {
    #[default]
    Promote,
    Revert,
    /// A held failure, recorded in the status file.
    Hold,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    /// From 1; 0 before the first step.
    #[schemars(with = "i32")]
    pub current_step_index: u32,
    pub current_step_state: StepState,
    pub canary_ready_replicas: i32,
    /// Share of requests the canary receives now, e.g. "10%".
    #[serde(default)]
    pub traffic: String,
    #[serde(default)]
    pub message: String,
    /// When the current step state began (RFC 3339).
    #[serde(default)]
    pub state_started_at: String,
    #[serde(default)]
    pub last_update_time: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SupersededRelease {
    pub commit: String,
    pub rollout_id: String,
    pub reason: String,
    pub at: String,
}

/// The CustomResourceDefinition as YAML, as `gitcanary crd` prints it.
pub fn crd_yaml() -> String {
    use kube_core::CustomResourceExt;
    let crd = Rollout::crd();
    serde_saphyr::to_string(&crd).expect("the CRD serialises")
}

/// Annotations that carry a signal; each value is acted on once.
pub const PROMOTE_ANNOTATION: &str = "gitcanary.io/promote";
pub const ABORT_ANNOTATION: &str = "gitcanary.io/abort";

/// The annotation a signal is given by.
pub fn annotation_of(signal: crate::rollout::api::Signal) -> &'static str {
    match signal {
        crate::rollout::api::Signal::Promote => PROMOTE_ANNOTATION,
        crate::rollout::api::Signal::Abort => ABORT_ANNOTATION,
    }
}
/// The last pull-request comment whose `/gitcanary` command was handled.
pub const LAST_COMMENT_ANNOTATION: &str = "gitcanary.io/github-last-comment";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_analysis_state_is_written_as_kruise_names_it_and_read_by_either_name() {
        let state = |name: &str| serde_json::from_value::<StepState>(serde_json::json!(name)).unwrap();
        assert_eq!(state("StepMetricsAnalysis"), StepState::StepAnalysis);
        assert_eq!(
            state("StepAnalysis"),
            StepState::StepAnalysis,
            "a status written before"
        );
        assert_eq!(
            serde_json::to_value(StepState::StepAnalysis).unwrap(),
            "StepMetricsAnalysis"
        );
        for state in [StepState::StepUpgrade, StepState::StepAnalysis, StepState::Completed] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.name());
        }
    }

    #[test]
    fn matches_read_as_a_person_would_say_them() {
        let step: CanaryStep = serde_json::from_value(serde_json::json!({"matches": [
            {"headers": [{"name": "x-preview", "value": "yes"}], "path": {"value": "/api"}},
            {"queryParams": [{"type": "RegularExpression", "name": "beta", "value": "^on$"}]},
        ]}))
        .unwrap();
        assert_eq!(
            describe_matches(&step.matches),
            "path under /api and header x-preview = yes or query beta ~ ^on$"
        );
    }

    #[test]
    fn a_strategy_reads_back_as_the_style_it_was_written_in() {
        for field in ["canary", "blueGreen"] {
            let written = serde_json::json!({field: {"steps": [{"traffic": "0%", "replicas": "100%"}]}});
            let strategy: Strategy = serde_json::from_value(written.clone()).unwrap();
            assert_eq!(strategy.style.field(), field);
            assert_eq!(serde_json::to_value(&strategy).unwrap(), written);
        }
    }

    #[test]
    fn durations_accept_seconds_and_units() {
        assert_eq!(parse_duration("90").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5400);
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn text_from_outside_is_one_short_line() {
        assert_eq!(bounded_line("  a\n\tb\r\u{1b}[31mc  ", 80), "a b [31mc");
        let long = "é".repeat(1000);
        let cut = bounded_line(&long, 200);
        assert_eq!(cut.chars().count(), 201);
        assert!(cut.ends_with('…'));
        assert_eq!(bounded_line("short", 5), "short");
        assert_eq!(bounded_line("", 5), "");
    }

    #[test]
    fn durations_that_overflow_are_errors_not_panics() {
        for text in [
            "18446744073709551615s1s",
            "18446744073709551615h",
            "99999999999999999999999s",
            "18446744073709551615m",
            "18446744073709551615s18446744073709551615ms",
        ] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }

    #[test]
    fn durations_over_thirty_days_are_refused() {
        let max = MAX_DURATION.as_secs();
        assert_eq!(Duration::Seconds(max).to_std(), Ok(MAX_DURATION));
        let over = Duration::Seconds(max + 1).to_std().expect_err("over 30 days");
        assert!(over.contains("longer than the maximum of 30 days"), "{over}");
        assert!(Duration::Text("720h".into()).to_std().is_ok());
        assert!(Duration::Text("720h1s".into()).to_std().is_err());
        assert!(Duration::Seconds(u64::MAX).to_std().is_err());
        // Git's text is cut short in the message.
        let long = format!("{}s", "9".repeat(500));
        assert!(Duration::Text(long).to_std().expect_err("too long").len() < 120);
    }

    #[test]
    fn the_design_example_parses() {
        let yaml = r#"
apiVersion: gitcanary.io/v1alpha1
kind: Rollout
metadata: {name: echoserver, namespace: demo}
spec:
  workloadRef: {apiVersion: apps/v1, kind: Deployment, name: echoserver}
  strategy:
    canary:
      steps:
      - traffic: 10%
        replicas: 1
        pause: {duration: 60}
      - traffic: 50%
        replicas: 50%
        pause: {duration: 90s}
      - traffic: 100%
        pause: {}
      trafficRoutings:
      - service: echoserver
        gateway: {httpRouteName: echoserver}
      patchPodTemplateMetadata: {labels: {version: canary}}
      canaryService:
        selector: {remove: [version]}
      gracePeriodSeconds: 3
      progressDeadline: 10m
      onFailure: hold
"#;
        let rollout: Rollout = serde_saphyr::from_str(yaml).expect("parses");
        let canary = &rollout.spec.strategy.canary;
        assert_eq!(canary.steps.len(), 3);
        assert_eq!(canary.steps[1].replicas, Some(IntOrPercent::Percent("50%".into())));
        assert_eq!(
            canary.steps[0].pause.as_ref().unwrap().duration,
            Some(Duration::Seconds(60))
        );
        assert_eq!(canary.steps[2].pause, Some(Pause { duration: None }));
        assert_eq!(canary.on_failure, Some(OnFailure::Hold));
        assert_eq!(
            canary.progress_deadline.as_ref().unwrap().to_std().unwrap().as_secs(),
            600
        );
    }

    #[test]
    fn deploy_holds_the_crd_the_rust_types_generate() {
        let shipped = include_str!("../../../../deploy/base/crd.yaml");
        assert!(
            shipped == crd_yaml(),
            "deploy/base/crd.yaml is out of date: run `cargo run -- crd > deploy/base/crd.yaml`"
        );
    }

    #[test]
    fn the_crd_has_status_and_printer_columns() {
        let yaml = crd_yaml();
        assert!(yaml.contains("subresources"), "{yaml}");
        for column in ["STATUS", "STEP", "STATE", "TRAFFIC", "MESSAGE", "AGE"] {
            assert!(yaml.contains(&format!("name: {column}")), "missing column {column}");
        }
    }
}
