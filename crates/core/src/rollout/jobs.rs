//! Job checks, the pure part: a step's analysis whose metric is a Job.
//! The Job is one of the release's canary objects: wanted while its run is
//! active, written as the app's identity and owned by the Rollout, one per
//! release and step (its release in an annotation; another release's is
//! deleted first), deleted once the step is passed. A failed release keeps
//! its failed Job for inspection until the next release. Its verdict is
//! read from the Job's conditions.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::analysis::{self, Bindings, Measurement, Outcome};
use super::api::{AnalysisTemplate, JobCheck, Phase, RolloutSpec, RolloutStatus, bounded_line};

/// The release a check's Job was made for, as a person reads it.
pub const ROLLOUT_ID_ANNOTATION: &str = "gitcanary.io/rollout-id";
/// What a check's Job is: its release (id and commit) and a hash of its
/// spec. A Job that differs is another release's, or of a JobSpec changed
/// in Git since: deleted, then made anew (a Job's template is immutable).
pub const CHECK_ANNOTATION: &str = "gitcanary.io/check";

/// A template's Job, when its metric is one.
pub fn job_of(template: &AnalysisTemplate) -> Option<&JobCheck> {
    template.metrics.iter().find_map(|m| m.job.as_ref())
}

/// The runs a Job may check: each step whose analysis is a job template.
pub fn job_runs(spec: &RolloutSpec) -> Vec<(String, &AnalysisTemplate)> {
    let steps = spec.strategy.canary.steps.iter().enumerate();
    steps
        .filter_map(|(i, step)| {
            let template = analysis::template(spec, &step.analysis.as_ref()?.template_ref)?;
            job_of(template)?;
            Some((analysis::step_run(i as u32 + 1), template))
        })
        .collect()
}

/// The name of a run's Job: the canary workload's name and the run's.
pub fn job_name(spec: &RolloutSpec, run: &str) -> String {
    format!("{}-{run}", spec.strategy.canary.canary_name(&spec.workload_ref.name))
}

/// What a Job's conditions say: completed, failed (with why), or nothing yet.
pub fn verdict(job: &Value) -> Option<(Outcome, String)> {
    let name = job["metadata"]["name"].as_str().unwrap_or_default();
    let conditions = job["status"]["conditions"].as_array()?;
    let holds = |kind: &str| conditions.iter().find(|c| c["type"] == kind && c["status"] == "True");
    if holds("Complete").is_some() {
        return Some((Outcome::Successful, format!("Job {name} completed")));
    }
    let failed = holds("Failed")?;
    let reason = failed["reason"].as_str().unwrap_or("Failed");
    let message = bounded_line(failed["message"].as_str().unwrap_or_default(), 200);
    Some((Outcome::Failed, format!("Job {name} failed: {reason}: {message}")))
}

fn check_of(job: &Value) -> Option<&str> {
    job["metadata"]["annotations"][CHECK_ANNOTATION].as_str()
}

/// The check Jobs wanted for the release in `status` and the ones to
/// delete, from those that exist (`live`, by kind and name).
pub fn planned(
    spec: &RolloutSpec,
    status: &RolloutStatus,
    live: &BTreeMap<(&'static str, String), Value>,
    bindings: &Bindings,
) -> (Vec<Value>, Vec<(&'static str, &'static str, String)>) {
    let active: Vec<String> = analysis::active_runs(spec, status)
        .into_iter()
        .map(|(run, _)| run)
        .collect();
    let releasing = matches!(status.phase, Phase::Progressing | Phase::Paused | Phase::Promoting);
    let release = analysis::release(status);
    let (mut wanted, mut unwanted) = (Vec::new(), Vec::new());
    for (run, template) in job_runs(spec) {
        let name = job_name(spec, &run);
        let existing = live.get(&("Job", name.clone()));
        let made = job(&name, template, bindings, &release);
        let same = existing.and_then(check_of) == Some(identity(template, &release).as_str());
        if active.contains(&run) && (existing.is_none() || same) {
            match made {
                Ok(job) => wanted.push(job),
                Err(problem) => tracing::warn!(job = %name, %problem, "the check Job is not made"),
            }
            continue;
        }
        let this_release = existing
            .and_then(check_of)
            .is_some_and(|check| check.starts_with(&format!("{release}/")));
        let failed = existing
            .and_then(verdict)
            .is_some_and(|(outcome, _)| outcome == Outcome::Failed);
        let kept = this_release && !releasing && failed;
        if existing.is_some() && !kept {
            unwanted.push(("batch/v1", "Job", name));
        }
    }
    (wanted, unwanted)
}

/// A run's Job: the template's JobSpec with its variables filled in.
fn job(name: &str, template: &AnalysisTemplate, bindings: &Bindings, release: &str) -> Result<Value, String> {
    let check = job_of(template).ok_or("not a job template")?;
    let mut job_spec = check.spec.clone();
    fill(&mut job_spec, bindings)?;
    let identity = identity(template, release);
    Ok(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": bindings.namespace,
            "annotations": {ROLLOUT_ID_ANNOTATION: bindings.rollout_id, CHECK_ANNOTATION: identity},
        },
        "spec": job_spec,
    }))
}

/// What a run's Job is: its release, and Git's JobSpec (not the filled
/// one: a revision read empty for a moment must not make the running Job
/// another's).
fn identity(template: &AnalysisTemplate, release: &str) -> String {
    let spec = job_of(template).map_or(String::new(), |check| check.spec.to_string());
    let digest = <sha2::Sha256 as sha2::Digest>::digest(spec.as_bytes());
    format!("{release}/{}", hex::encode(&digest[..8]))
}

/// Fills the variables of every string of a JobSpec.
fn fill(value: &mut Value, bindings: &Bindings) -> Result<(), String> {
    match value {
        Value::String(text) if text.contains("{{") => *text = analysis::render(text, bindings)?,
        Value::Array(items) => items.iter_mut().try_for_each(|v| fill(v, bindings))?,
        Value::Object(fields) => fields.values_mut().try_for_each(|v| fill(v, bindings))?,
        _ => {}
    }
    Ok(())
}

/// The measurement of a due job run: once, when the Job made for this
/// release and this JobSpec has ended; nothing while it runs.
pub fn measurement(
    spec: &RolloutSpec,
    status: &RolloutStatus,
    (run, template): (&str, &AnalysisTemplate),
    live: &BTreeMap<(&'static str, String), Value>,
) -> Option<Measurement> {
    let measured = status
        .analysis_runs
        .iter()
        .any(|r| r.name == run && r.rollout_id == status.rollout_id && r.successful + r.failed > 0);
    let name = job_name(spec, run);
    let job = live.get(&("Job", name.clone()))?;
    if measured || check_of(job) != Some(identity(template, &analysis::release(status)).as_str()) {
        return None;
    }
    let (outcome, message) = verdict(job)?;
    Some(Measurement {
        release: analysis::release(status),
        run: run.to_string(),
        template: template.name.clone(),
        outcome,
        message,
    })
}

/// Problems of a Rollout's job checks, for validation.
pub fn problems(spec: &RolloutSpec) -> Vec<String> {
    let mut out = Vec::new();
    for template in &spec.analysis_templates {
        let Some(check) = job_of(template) else {
            continue;
        };
        let at = format!("analysis template {:?}", template.name);
        if template.metrics.len() > 1 {
            out.push(format!("{at}: a job check is the template's only metric"));
        }
        for metric in template.metrics.iter().filter(|m| m.job.is_some()) {
            if !metric.query.is_empty() || metric.web.is_some() || !metric.success_condition.is_empty() {
                out.push(format!(
                    "{at}, metric {:?}: a job takes no query, web or successCondition: its outcome is the verdict",
                    metric.name
                ));
            }
        }
        if !check.spec.is_object() || !check.spec["template"].is_object() {
            out.push(format!("{at}: job.spec is a JobSpec, with a template"));
        }
        // A Job is judged once: a tolerated failure would hold the step for ever.
        if template.failure_limit.is_some_and(|n| n > 0) || template.inconclusive_limit.is_some_and(|n| n > 0) {
            out.push(format!(
                "{at}: a job check takes no failureLimit or inconclusiveLimit: the Job's own backoffLimit retries it"
            ));
        }
        if !check.spec["ttlSecondsAfterFinished"].is_null() {
            out.push(format!(
                "{at}: a check's Job takes no ttlSecondsAfterFinished: gitcanary deletes it, and reads it first"
            ));
        }
        let restart = check.spec["template"]["spec"]["restartPolicy"].as_str();
        if !matches!(restart, Some("Never" | "OnFailure")) {
            out.push(format!("{at}: a Job's pods need restartPolicy Never or OnFailure"));
        }
        let mut unknown = Vec::new();
        strings(&check.spec, &mut |text| {
            unknown.extend(
                analysis::variables(text)
                    .filter(|v| !analysis::VARIABLES.contains(v))
                    .map(str::to_string),
            );
        });
        for variable in unknown {
            out.push(format!(
                "{at}: unknown variable {{{{{variable}}}}} (known: {})",
                analysis::VARIABLES.join(", ")
            ));
        }
        if spec
            .strategy
            .canary
            .analysis
            .as_ref()
            .is_some_and(|a| a.template_ref == template.name)
        {
            out.push(format!(
                "{at}: a job check runs at a step, not through the whole release"
            ));
        }
    }
    for (run, _) in job_runs(spec) {
        let name = job_name(spec, &run);
        if name.len() > 63 {
            out.push(format!("the check Job's name {name:?} is over 63 characters"));
        }
    }
    out
}

fn strings(value: &Value, each: &mut impl FnMut(&str)) {
    match value {
        Value::String(text) => each(text),
        Value::Array(items) => items.iter().for_each(|v| strings(v, each)),
        Value::Object(fields) => fields.values().for_each(|v| strings(v, each)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::api::{AnalysisRun, CanaryStatus, CanaryStep, StepAnalysis, StepState};

    fn spec() -> RolloutSpec {
        let mut spec = RolloutSpec::default();
        spec.workload_ref.name = "echo".into();
        spec.analysis_templates = vec![
            serde_json::from_value(json!({"name": "smoke", "metrics": [{"name": "smoke", "job": {"spec": {
                "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "t", "image": "curl", "args": ["http://{{canaryService}}/health"]}]}}
            }}}]}))
            .unwrap(),
        ];
        spec.strategy.canary.steps = vec![CanaryStep {
            analysis: Some(StepAnalysis {
                template_ref: "smoke".into(),
            }),
            ..CanaryStep::default()
        }];
        spec
    }

    fn at_step(rollout_id: &str, phase: Phase) -> RolloutStatus {
        RolloutStatus {
            phase,
            rollout_id: rollout_id.into(),
            canary_template_hash: "h".into(),
            canary_status: Some(CanaryStatus {
                current_step_index: 1,
                current_step_state: StepState::StepPaused,
                ..CanaryStatus::default()
            }),
            ..RolloutStatus::default()
        }
    }

    /// The Job made for release `rollout_id` of `spec()` at step 1, with a
    /// condition when it has ended.
    fn live_job(rollout_id: &str, condition: Option<&str>) -> BTreeMap<(&'static str, String), Value> {
        let status = at_step(rollout_id, Phase::Progressing);
        let (mut made, _) = planned(&spec(), &status, &BTreeMap::new(), &bindings(rollout_id));
        let mut job = made.remove(0);
        let conditions: Vec<Value> = condition
            .map(|c| json!({"type": c, "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}))
            .into_iter()
            .collect();
        job["status"] = json!({"conditions": conditions});
        BTreeMap::from([(("Job", "echo-canary-step-1".to_string()), job)])
    }

    fn bindings(rollout_id: &str) -> Bindings {
        Bindings {
            namespace: "shop".into(),
            canary_service: "echo-canary".into(),
            rollout_id: rollout_id.into(),
            ..Bindings::default()
        }
    }

    #[test]
    fn a_steps_job_is_wanted_while_its_run_is_active_with_its_variables_filled_in() {
        let (wanted, unwanted) = planned(
            &spec(),
            &at_step("r2", Phase::Progressing),
            &BTreeMap::new(),
            &bindings("r2"),
        );
        assert!(unwanted.is_empty());
        assert_eq!(wanted.len(), 1);
        assert_eq!(wanted[0]["metadata"]["name"], "echo-canary-step-1");
        assert_eq!(wanted[0]["metadata"]["annotations"][ROLLOUT_ID_ANNOTATION], "r2");
        assert_eq!(
            wanted[0]["spec"]["template"]["spec"]["containers"][0]["args"][0],
            "http://echo-canary/health"
        );
    }

    #[test]
    fn another_releases_job_is_deleted_and_a_failed_one_is_kept_after_its_release() {
        let spec = spec();
        let (wanted, unwanted) = planned(
            &spec,
            &at_step("r2", Phase::Progressing),
            &live_job("r1", None),
            &bindings("r2"),
        );
        assert!(wanted.is_empty(), "made once the earlier release's Job is gone");
        assert_eq!(unwanted, [("batch/v1", "Job", "echo-canary-step-1".to_string())]);
        let mut ended = at_step("r2", Phase::Failed);
        ended.canary_status = None;
        let (_, unwanted) = planned(&spec, &ended, &live_job("r2", Some("Failed")), &bindings("r2"));
        assert!(
            unwanted.is_empty(),
            "the failed release's failed Job stays for inspection"
        );
        let (_, unwanted) = planned(&spec, &ended, &live_job("r2", Some("Complete")), &bindings("r2"));
        assert_eq!(unwanted.len(), 1, "a passed step's Job goes");
        // The JobSpec changed in Git mid-step: the Job made of the old one goes first.
        let mut changed = spec.clone();
        changed.analysis_templates[0].metrics[0].job.as_mut().unwrap().spec["backoffLimit"] = json!(2);
        let (wanted, unwanted) = planned(
            &changed,
            &at_step("r2", Phase::Progressing),
            &live_job("r2", None),
            &bindings("r2"),
        );
        assert!(wanted.is_empty() && unwanted.len() == 1, "{wanted:?} {unwanted:?}");
    }

    #[test]
    fn a_job_run_is_measured_once_when_its_job_has_ended() {
        let spec = spec();
        let template = &spec.analysis_templates[0];
        let mut status = at_step("r2", Phase::Progressing);
        assert_eq!(
            measurement(&spec, &status, ("step-1", template), &live_job("r2", None)),
            None,
            "running"
        );
        assert_eq!(
            measurement(&spec, &status, ("step-1", template), &live_job("r1", Some("Complete"))),
            None,
            "another release's"
        );
        let failed = measurement(&spec, &status, ("step-1", template), &live_job("r2", Some("Failed"))).expect("ended");
        assert_eq!(failed.outcome, Outcome::Failed);
        assert!(failed.message.contains("BackoffLimitExceeded"), "{}", failed.message);
        status.analysis_runs = vec![AnalysisRun {
            name: "step-1".into(),
            rollout_id: "r2".into(),
            failed: 1,
            ..AnalysisRun::default()
        }];
        assert_eq!(
            measurement(&spec, &status, ("step-1", template), &live_job("r2", Some("Failed"))),
            None,
            "once"
        );
    }

    #[test]
    fn a_job_check_is_a_steps_only_metric_with_known_variables() {
        let mut spec = spec();
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        spec.analysis_templates[0].metrics[0].success_condition = "> 1".into();
        spec.analysis_templates[0].metrics[0].job.as_mut().unwrap().spec["template"]["spec"]["containers"][0]["args"]
            [0] = json!("{{secret}}");
        spec.strategy.canary.analysis = Some(StepAnalysis {
            template_ref: "smoke".into(),
        });
        spec.analysis_templates[0].failure_limit = Some(1);
        let job = &mut spec.analysis_templates[0].metrics[0].job.as_mut().unwrap().spec;
        job["ttlSecondsAfterFinished"] = json!(0);
        job["template"]["spec"]["restartPolicy"] = json!("Always");
        let problems = problems(&spec).join("\n");
        assert!(problems.contains("no failureLimit"), "{problems}");
        assert!(problems.contains("no ttlSecondsAfterFinished"), "{problems}");
        assert!(problems.contains("restartPolicy Never or OnFailure"), "{problems}");
        assert!(
            problems.contains("takes no query, web or successCondition"),
            "{problems}"
        );
        assert!(problems.contains("unknown variable {{secret}}"), "{problems}");
        assert!(problems.contains("not through the whole release"), "{problems}");
    }
}
