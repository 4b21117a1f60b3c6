//! Metric analysis, the pure part: the condition language, query templates,
//! which runs are active and due, and checks for `gitcanary validate`.
//! Prometheus is asked by `super::prometheus`; the planner decides.

use std::time::Duration;

use jiff::Timestamp;

use super::api::{AnalysisTemplate, BACKGROUND_RUN, Phase, PrometheusRef, RolloutSpec, RolloutStatus, StepState};

/// Default time between measurements.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// Default successful measurements that pass a step without a pause.
pub const DEFAULT_COUNT: u32 = 3;

/// The variables a query may use.
pub const VARIABLES: [&str; 6] = [
    "namespace",
    "canaryService",
    "stableService",
    "canaryRevision",
    "stableRevision",
    "rolloutID",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Successful,
    Failed,
    /// No data, NaN, or Prometheus did not answer: never a success.
    Inconclusive,
}

/// One measurement round of a run (every metric of its template once).
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The release it was taken for ([`release`]): a newer commit seen in
    /// the same sync starts a release these answers are not for.
    pub release: String,
    pub run: String,
    pub template: String,
    pub outcome: Outcome,
    /// Each metric: its value(s), the condition, and the query.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Rhs {
    Number(f64),
    /// The same query on stable, times `factor` plus `offset`.
    Stable {
        factor: f64,
        offset: f64,
    },
}

/// A parsed success condition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Condition {
    op: Op,
    rhs: Rhs,
}

fn number(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
        .ok_or_else(|| format!("{:?} is not a number", text.trim()))
}

/// Parses `< 0.01`, `canary >= 0.99`, `canary <= stable * 1.1`,
/// `canary < stable + 0.05`, `result == 0`.
pub fn parse_condition(text: &str) -> Result<Condition, String> {
    let trimmed = text.trim();
    let rest = trimmed
        .strip_prefix("canary")
        .or_else(|| trimmed.strip_prefix("result"))
        .unwrap_or(trimmed)
        .trim_start();
    let (op, rhs) = [
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<", Op::Lt),
        (">", Op::Gt),
    ]
    .iter()
    .find_map(|(token, op)| rest.strip_prefix(token).map(|r| (*op, r.trim())))
    .ok_or_else(|| {
        format!("condition {text:?}: expected a comparison such as \"< 0.01\" or \"canary <= stable * 1.1\"")
    })?;
    if rhs.is_empty() {
        return Err(format!("condition {text:?}: nothing to compare with"));
    }
    let rhs = match rhs.strip_prefix("stable") {
        None => Rhs::Number(number(rhs).map_err(|e| format!("condition {text:?}: {e}"))?),
        Some(arith) => {
            let arith = arith.trim();
            let (factor, offset) = if arith.is_empty() {
                (1.0, 0.0)
            } else if let Some(n) = arith.strip_prefix('*') {
                (number(n).map_err(|e| format!("condition {text:?}: {e}"))?, 0.0)
            } else if let Some(n) = arith.strip_prefix('+') {
                (1.0, number(n).map_err(|e| format!("condition {text:?}: {e}"))?)
            } else if let Some(n) = arith.strip_prefix('-') {
                (1.0, -number(n).map_err(|e| format!("condition {text:?}: {e}"))?)
            } else {
                return Err(format!("condition {text:?}: after `stable` only `* N`, `+ N` or `- N`"));
            };
            Rhs::Stable { factor, offset }
        }
    };
    Ok(Condition { op, rhs })
}

impl Condition {
    /// Whether the condition compares with the same query on stable.
    pub fn needs_stable(&self) -> bool {
        matches!(self.rhs, Rhs::Stable { .. })
    }

    /// The outcome for a canary value (and the stable one when compared).
    /// A missing or NaN value is inconclusive, never a success.
    pub fn judge(&self, canary: Option<f64>, stable: Option<f64>) -> Outcome {
        let Some(canary) = canary.filter(|v| !v.is_nan()) else {
            return Outcome::Inconclusive;
        };
        let bound = match self.rhs {
            Rhs::Number(n) => n,
            Rhs::Stable { factor, offset } => match stable.filter(|v| !v.is_nan()) {
                Some(stable) => stable * factor + offset,
                None => return Outcome::Inconclusive,
            },
        };
        let holds = match self.op {
            Op::Lt => canary < bound,
            Op::Le => canary <= bound,
            Op::Gt => canary > bound,
            Op::Ge => canary >= bound,
            Op::Eq => canary == bound,
            Op::Ne => canary != bound,
        };
        if holds { Outcome::Successful } else { Outcome::Failed }
    }
}

/// Values of the query variables for one release.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    pub namespace: String,
    pub canary_service: String,
    pub stable_service: String,
    pub canary_revision: String,
    pub stable_revision: String,
    pub rollout_id: String,
}

impl Bindings {
    /// The names a release's queries and hooks stand for.
    pub fn of_release(namespace: &str, spec: &RolloutSpec, rollout_id: &str, canary: &str, stable: &str) -> Bindings {
        let routing = spec.strategy.canary.traffic_routings.first();
        Bindings {
            namespace: namespace.to_string(),
            canary_service: routing
                .map(|r| spec.strategy.canary.canary_name(&r.service))
                .unwrap_or_default(),
            stable_service: routing.map(|r| r.service.clone()).unwrap_or_default(),
            canary_revision: canary.to_string(),
            stable_revision: stable.to_string(),
            rollout_id: rollout_id.to_string(),
        }
    }

    /// The same query asked of stable: the canary names become the stable ones.
    pub fn for_stable(&self) -> Bindings {
        Bindings {
            canary_service: self.stable_service.clone(),
            canary_revision: self.stable_revision.clone(),
            ..self.clone()
        }
    }

    fn value(&self, variable: &str) -> Option<&str> {
        Some(match variable {
            "namespace" => &self.namespace,
            "canaryService" => &self.canary_service,
            "stableService" => &self.stable_service,
            "canaryRevision" => &self.canary_revision,
            "stableRevision" => &self.stable_revision,
            "rolloutID" => &self.rollout_id,
            _ => return None,
        })
    }
}

/// Each `{{variable}}` of a query, in order.
pub fn variables(query: &str) -> impl Iterator<Item = &str> {
    query
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}"))
        .map(|(name, _)| name.trim())
}

/// The query with its variables filled in.
pub fn render(query: &str, bindings: &Bindings) -> Result<String, String> {
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("query {query:?}: `{{{{` is not closed"))?;
        let name = after[..end].trim();
        let value = bindings
            .value(name)
            .ok_or_else(|| format!("query uses unknown variable {{{{{name}}}}}"))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// What can be told of a query without Prometheus: unknown variables and
/// unbalanced brackets or quotes.
pub fn query_problems(query: &str) -> Vec<String> {
    let mut problems: Vec<String> = variables(query)
        .filter(|v| !VARIABLES.contains(v))
        .map(|v| format!("unknown variable {{{{{v}}}}} (known: {})", VARIABLES.join(", ")))
        .collect();
    if query.matches("{{").count() != query.matches("}}").count() {
        problems.push("a `{{` without its `}}`".into());
    }
    // Each variable stands for a plain value, known or not.
    let mut without_variables = String::new();
    let mut rest = query;
    while let Some((before, after)) = rest.split_once("{{") {
        without_variables.push_str(before);
        without_variables.push('x');
        rest = after.split_once("}}").map_or("", |(_, tail)| tail);
    }
    without_variables.push_str(rest);
    let mut stack = Vec::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in without_variables.chars() {
        if let Some(q) = quote {
            match c {
                '\\' if !escaped => escaped = true,
                c if c == q && !escaped => quote = None,
                _ => escaped = false,
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' | '[' | '{' => stack.push(c),
            ')' | ']' | '}' => {
                let open = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if stack.pop() != Some(open) {
                    problems.push(format!("PromQL: unbalanced {c:?}"));
                    return problems;
                }
            }
            _ => {}
        }
    }
    if quote.is_some() {
        problems.push("PromQL: a string is not closed".into());
    }
    if let Some(open) = stack.pop() {
        problems.push(format!("PromQL: {open:?} is not closed"));
    }
    if without_variables.trim().is_empty() {
        problems.push("the query is empty".into());
    }
    problems
}

/// Problems of a Rollout's analysis, for validation.
pub fn problems(spec: &RolloutSpec) -> Vec<String> {
    let mut out = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for template in &spec.analysis_templates {
        if !names.insert(template.name.as_str()) {
            out.push(format!("analysis template {:?} is defined twice", template.name));
        }
        if template.metrics.is_empty() {
            out.push(format!("analysis template {:?} has no metrics", template.name));
        }
        if let Some(problem) = template.prometheus.as_ref().and_then(prometheus_ref_problem) {
            out.push(format!("analysis template {:?}: {problem}", template.name));
        }
        if let Some(interval) = &template.interval
            && let Err(e) = interval.to_std()
        {
            out.push(format!("analysis template {:?}: interval: {e}", template.name));
        }
        for metric in &template.metrics {
            let at = format!("analysis template {:?}, metric {:?}", template.name, metric.name);
            if metric.job.is_some() {
                continue; // checked by `jobs::problems`
            }
            let problems = match &metric.web {
                Some(_) if !metric.query.is_empty() => vec!["give a query or web, not both".to_string()],
                Some(web) => web_problems(web),
                None => query_problems(&metric.query),
            };
            for problem in problems {
                out.push(format!("{at}: {problem}"));
            }
            if let Err(e) = parse_condition(&metric.success_condition) {
                out.push(format!("{at}: {e}"));
            }
        }
    }
    let canary = &spec.strategy.canary;
    let references = canary
        .analysis
        .iter()
        .map(|a| {
            (
                format!("strategy.{}.analysis", spec.strategy.style.field()),
                &a.template_ref,
            )
        })
        .chain(canary.steps.iter().enumerate().filter_map(|(i, s)| {
            s.analysis
                .as_ref()
                .map(|a| (format!("step {}", i + 1), &a.template_ref))
        }));
    for (at, name) in references {
        if !names.contains(name.as_str()) {
            out.push(format!(
                "{at}: analysis template {name:?} is not in spec.analysisTemplates"
            ));
        }
    }
    out
}

/// What a web check may say: an endpoint by the operator's name, a path
/// under it, a method, a body only with POST, a JSON path.
fn web_problems(web: &super::api::WebCheck) -> Vec<String> {
    let mut problems = Vec::new();
    if !is_server_name(&web.name) {
        problems.push(format!(
            "web.name {:?} must be the NAME of one of the agent's --web-check NAME=URL (lowercase letters, digits and '-')",
            super::api::bounded_line(&web.name, 80)
        ));
    }
    problems.extend(super::web_paths::path_problem(&web.path));
    let texts = std::iter::once(web.path.as_str()).chain(web.body.as_deref());
    for text in texts {
        if text.matches("{{").count() != text.matches("}}").count() {
            problems.push("a `{{` without its `}}`".into());
        }
        problems.extend(
            variables(text)
                .filter(|v| !VARIABLES.contains(v))
                .map(|v| format!("unknown variable {{{{{v}}}}} (known: {})", VARIABLES.join(", "))),
        );
    }
    match web.method.as_deref() {
        None | Some("GET") if web.body.is_some() => problems.push("web.body is sent only with method POST".into()),
        None | Some("GET" | "POST") => {}
        Some(other) => problems.push(format!(
            "web.method {:?} is not GET or POST",
            super::api::bounded_line(other, 20)
        )),
    }
    if let Err(e) = super::web_paths::parse_json_path(&web.json_path) {
        problems.push(e);
    }
    problems
}

/// A template may name a Prometheus only by the name the operator gave it
/// (`--prometheus NAME=URL`): an address from Git would let a tenant point
/// the agent at any server, inside the cluster or out.
pub fn prometheus_ref_problem(prometheus: &PrometheusRef) -> Option<String> {
    if let Some(address) = &prometheus.address {
        return Some(format!(
            "prometheus.address {:?} is not accepted: the agent asks only the Prometheus servers it was started with; name one with prometheus.name (the NAME of the agent's --prometheus NAME=URL), or leave prometheus out for the default",
            super::api::bounded_line(address, 80)
        ));
    }
    if !is_server_name(&prometheus.name) {
        return Some(format!(
            "prometheus.name {:?} must be the NAME of one of the agent's --prometheus NAME=URL (lowercase letters, digits and '-')",
            super::api::bounded_line(&prometheus.name, 80)
        ));
    }
    None
}

/// A name an operator gives a Prometheus server: a DNS label.
pub fn is_server_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Names one release of a Rollout: its id and commit (a Rollout may keep
/// one `rolloutID` across releases).
pub fn release(status: &RolloutStatus) -> String {
    format!("{}@{}", status.rollout_id, status.canary_commit)
}

pub fn step_run(step: u32) -> String {
    format!("step-{step}")
}

pub fn template<'a>(spec: &'a RolloutSpec, name: &str) -> Option<&'a AnalysisTemplate> {
    spec.analysis_templates.iter().find(|t| t.name == name)
}

pub fn interval(template: &AnalysisTemplate) -> Duration {
    template
        .interval
        .as_ref()
        .and_then(|d| d.to_std().ok())
        .unwrap_or(DEFAULT_INTERVAL)
        .max(Duration::from_millis(500))
}

/// The runs that measure in the release's current state: (run, template).
/// The background run goes from the first step's traffic to promote; a
/// step's run while that step's traffic is in force.
pub fn active_runs(spec: &RolloutSpec, status: &RolloutStatus) -> Vec<(String, String)> {
    let mut runs = Vec::new();
    let in_release =
        matches!(status.phase, Phase::Progressing | Phase::Paused) && !status.canary_template_hash.is_empty();
    let Some(canary) = status.canary_status.as_ref().filter(|_| in_release) else {
        return runs;
    };
    let serving = matches!(
        canary.current_step_state,
        StepState::StepPaused | StepState::StepAnalysis | StepState::StepReady
    );
    if let Some(background) = &spec.strategy.canary.analysis
        && (canary.current_step_index > 1 || serving)
    {
        runs.push((BACKGROUND_RUN.to_string(), background.template_ref.clone()));
    }
    let step = canary
        .current_step_index
        .checked_sub(1)
        .and_then(|i| spec.strategy.canary.steps.get(i as usize));
    if let Some(analysis) = step.and_then(|s| s.analysis.as_ref())
        && matches!(
            canary.current_step_state,
            StepState::StepPaused | StepState::StepAnalysis
        )
    {
        runs.push((step_run(canary.current_step_index), analysis.template_ref.clone()));
    }
    runs
}

/// Active runs whose next measurement is due at `now`.
pub fn due_runs<'a>(
    spec: &'a RolloutSpec,
    status: &RolloutStatus,
    now: Timestamp,
) -> Vec<(String, &'a AnalysisTemplate)> {
    active_runs(spec, status)
        .into_iter()
        .filter_map(|(run, name)| {
            let template = template(spec, &name)?;
            let due = until_due(status, &run, template, now).is_none_or(|wait| wait.is_zero());
            due.then_some((run, template))
        })
        .collect()
}

/// How long until run `run` of this release is measured again: zero once
/// its interval has passed since its last measurement; `None` when it was
/// never measured (or its time cannot be read). The one rule behind which
/// runs observe measures (`due_runs`) and when the planner wakes for them.
pub fn until_due(status: &RolloutStatus, run: &str, template: &AnalysisTemplate, now: Timestamp) -> Option<Duration> {
    let last = status
        .analysis_runs
        .iter()
        .find(|r| r.name == run && r.rollout_id == status.rollout_id)
        .and_then(|r| r.last_measured_at.parse::<Timestamp>().ok())?;
    let since = Duration::try_from(now.duration_since(last)).unwrap_or(Duration::ZERO);
    Some(interval(template).saturating_sub(since))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_compare_with_numbers_and_with_stable() {
        let lt = parse_condition("< 0.01").expect("parses");
        assert_eq!(lt.judge(Some(0.005), None), Outcome::Successful);
        assert_eq!(lt.judge(Some(0.02), None), Outcome::Failed);
        assert_eq!(lt.judge(None, None), Outcome::Inconclusive, "no data");
        assert_eq!(lt.judge(Some(f64::NAN), None), Outcome::Inconclusive);
        let ge = parse_condition("result >= 0.99").expect("parses");
        assert_eq!(ge.judge(Some(0.99), None), Outcome::Successful);
        let relative = parse_condition("canary <= stable * 1.1").expect("parses");
        assert!(relative.needs_stable());
        assert_eq!(relative.judge(Some(1.05), Some(1.0)), Outcome::Successful);
        assert_eq!(relative.judge(Some(1.2), Some(1.0)), Outcome::Failed);
        assert_eq!(
            relative.judge(Some(1.0), None),
            Outcome::Inconclusive,
            "stable has no data"
        );
        let offset = parse_condition("canary < stable + 0.05").expect("parses");
        assert_eq!(offset.judge(Some(0.06), Some(0.02)), Outcome::Successful);
        for bad in ["", "0.01", "<", "< a lot", "canary <= stable ^ 2", "~ 3"] {
            assert!(parse_condition(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn a_template_names_a_prometheus_the_operator_gave_never_an_address() {
        let by_address = PrometheusRef {
            address: Some("http://169.254.169.254".into()),
            ..PrometheusRef::default()
        };
        let problem = prometheus_ref_problem(&by_address).expect("an address is refused");
        assert!(
            problem.contains("prometheus.address \"http://169.254.169.254\" is not accepted"),
            "{problem}"
        );
        let both = PrometheusRef {
            name: "metrics".into(),
            address: Some("http://evil".into()),
        };
        assert!(
            prometheus_ref_problem(&both).is_some(),
            "a name does not excuse an address"
        );
        for bad in ["", "http://prometheus:9090", "Metrics", "-x", "a b"] {
            let named = PrometheusRef {
                name: bad.into(),
                address: None,
            };
            assert!(prometheus_ref_problem(&named).is_some(), "{bad:?}");
        }
        let named = PrometheusRef {
            name: "metrics-eu".into(),
            address: None,
        };
        assert_eq!(prometheus_ref_problem(&named), None);
    }

    #[test]
    fn queries_are_templated_and_checked() {
        let bindings = Bindings {
            namespace: "shop".into(),
            canary_service: "web-canary".into(),
            stable_service: "web".into(),
            canary_revision: "abc".into(),
            stable_revision: "def".into(),
            rollout_id: "r1".into(),
        };
        let query = r#"sum(rate(errors{namespace="{{namespace}}", service="{{ canaryService }}"}[1m]))"#;
        assert_eq!(
            render(query, &bindings).expect("renders"),
            r#"sum(rate(errors{namespace="shop", service="web-canary"}[1m]))"#
        );
        assert_eq!(
            render(query, &bindings.for_stable()).expect("renders"),
            r#"sum(rate(errors{namespace="shop", service="web"}[1m]))"#
        );
        assert!(render("up{x=\"{{canary}}\"}", &bindings).is_err());
        assert!(query_problems(query).is_empty(), "{:?}", query_problems(query));
        assert!(query_problems("up{job=\"{{podName}}\"}")[0].contains("unknown variable {{podName}}"));
        assert!(query_problems("sum(rate(x[1m])")[0].contains("not closed"));
        assert!(query_problems("sum(x))")[0].contains("unbalanced"));
        assert!(query_problems("up{job=\"a}")[0].contains("string is not closed"));
        assert!(
            query_problems("max(x{le=\")\"})").is_empty(),
            "brackets in strings count for nothing"
        );
    }
}
