//! `spec.strategy`: the steps, routings and settings of a release, as
//! Kruise Rollout's v1beta1 names them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a release runs, as Kruise Rollout's v1beta1 writes it: `canary` or
/// `blueGreen`, one of them. Both hold the same steps, routings and
/// settings, kept here as `canary`; `style` says which the file named.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(try_from = "StrategyFields", into = "StrategyFields")]
pub struct Strategy {
    pub canary: CanaryStrategy,
    pub style: Style,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Style {
    /// The new version beside the old at each step's size, sharing traffic.
    #[default]
    Canary,
    /// The new version at full size beside the old one, previewed, then
    /// switched to by the traffic steps; the old one goes only after the
    /// switch holds, so a failure switches back at once.
    BlueGreen,
}

impl Style {
    /// How `gitcanary status` and the pull-request comment name a release
    /// of this style after its id: nothing for a canary.
    pub fn label(self) -> &'static str {
        match self {
            Style::Canary => "",
            Style::BlueGreen => " (blue-green)",
        }
    }

    /// The field a Rollout names it by.
    pub fn field(self) -> &'static str {
        match self {
            Style::Canary => "canary",
            Style::BlueGreen => "blueGreen",
        }
    }
}

/// How a release runs: `canary` or `blueGreen`, one of them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Strategy")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.canary) != has(self.blueGreen)",
    "message": "set canary or blueGreen, one of them"
}]))]
pub struct StrategyFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStrategy>,
    /// The new version at full size beside the old, previewed, then
    /// switched by the traffic steps (same fields as `canary`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blue_green: Option<CanaryStrategy>,
}

impl TryFrom<StrategyFields> for Strategy {
    type Error = &'static str;

    fn try_from(fields: StrategyFields) -> Result<Strategy, &'static str> {
        let mut strategy = match (fields.canary, fields.blue_green) {
            (Some(canary), None) => Ok::<_, &'static str>(Strategy {
                canary,
                style: Style::Canary,
            }),
            (None, Some(canary)) => Ok(Strategy {
                canary,
                style: Style::BlueGreen,
            }),
            (Some(_), Some(_)) => Err("spec.strategy: set canary or blueGreen, not both"),
            (None, None) => Err("spec.strategy: set canary or blueGreen"),
        }?;
        // Kruise's name for no canary Service: one setting, read in one place.
        if strategy.canary.disable_generate_canary_service == Some(true) {
            strategy
                .canary
                .canary_service
                .get_or_insert_with(CanaryService::default)
                .disabled = true;
        }
        Ok(strategy)
    }
}

impl From<Strategy> for StrategyFields {
    fn from(strategy: Strategy) -> StrategyFields {
        match strategy.style {
            Style::Canary => StrategyFields {
                canary: Some(strategy.canary),
                blue_green: None,
            },
            Style::BlueGreen => StrategyFields {
                canary: None,
                blue_green: Some(strategy.canary),
            },
        }
    }
}

impl JsonSchema for Strategy {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        StrategyFields::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        StrategyFields::json_schema(generator)
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStrategy {
    pub steps: Vec<CanaryStep>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic_routings: Vec<TrafficRouting>,
    /// Analysis that runs from the first step until promote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<StepAnalysis>,
    /// Labels and annotations put on canary pods only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_pod_template_metadata: Option<PodTemplateMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_service: Option<CanaryService>,
    /// Seconds to wait after each route change before the step counts as done (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub grace_period_seconds: Option<u32>,
    /// Canary pods must be ready within this (seconds, or "90s", "10m"; default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline: Option<Duration>,
    /// `revert` (default) or `hold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// Knative Service only: the canary Revision keeps at least this many
    /// pods while the release runs, so that a small share cannot scale it
    /// to zero between requests and bias analysis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub canary_min_scale: Option<u32>,
    /// Appended to the workload's, Services' and Ingresses' names to name
    /// their canaries (default `-canary`); change it when a name is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_suffix: Option<String>,
    /// Kruise's: `true` is what gitcanary does with a Deployment (a second
    /// workload for the canary); `false` (Kruise's in-place partition of a
    /// Deployment) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_extra_workload_for_canary: Option<bool>,
    /// Kruise's: canary pods that may stay unready while a step counts as
    /// ready (a count, or a share of the step's canary pods, rounded up);
    /// at least one must be ready. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<IntOrPercent>,
    /// Kruise's: `true` is `canaryService: {disabled: true}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_generate_canary_service: Option<bool>,
}

pub const DEFAULT_CANARY_SUFFIX: &str = "-canary";

impl CanaryStrategy {
    /// The routings through an HTTPRoute, with the Service each splits:
    /// `(service, httpRouteName)`.
    pub fn gateway_routes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.traffic_routings
            .iter()
            .filter_map(|r| Some((r.service.as_str(), r.gateway.as_ref()?.http_route_name.as_str())))
    }

    /// No canary Service is made (`canaryService.disabled`, or Kruise's
    /// `disableGenerateCanaryService`): traffic follows replicas.
    pub fn canary_service_disabled(&self) -> bool {
        self.canary_service.as_ref().is_some_and(|c| c.disabled)
    }

    /// The name of the canary of the object called `name`.
    pub fn canary_name(&self, name: &str) -> String {
        format!(
            "{name}{}",
            self.canary_suffix.as_deref().unwrap_or(DEFAULT_CANARY_SUFFIX)
        )
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStep {
    /// Share of requests sent to the canary, as a percentage ("10%").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<String>,
    /// Canary pods: a count or a percentage of the workload's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<IntOrPercent>,
    /// `{duration: 60}` waits; `{}` waits for promote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Pause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<StepAnalysis>,
    /// Requests sent to the canary whatever `traffic` says (A/B testing, as
    /// Kruise Rollout's `matches`): matches are OR'd, the fields of one
    /// match AND'd. Without `traffic`, no other request goes to the canary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<RequestMatch>,
    /// Kruise's: headers set, added or removed on the requests the step's
    /// `matches` send to the canary (an HTTPRoute's `RequestHeaderModifier`
    /// filter on their rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HeaderModifier>,
    /// A copy of this share of the requests the stable answers sent to the
    /// canary too, its answers thrown away (an HTTPRoute's `RequestMirror`
    /// filter), where the route's gateway says it can mirror.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Mirror>,
}

/// A Gateway API `HTTPHeaderFilter`: `set` replaces a header, `add` appends
/// to it, `remove` drops it by name.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct HeaderModifier {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<HeaderValue>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<HeaderValue>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct HeaderValue {
    pub name: String,
    pub value: String,
}

/// Requests copied to the canary: `percent` of them (1 to 100).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct Mirror {
    #[schemars(with = "i32")]
    pub percent: u32,
}

/// One match of a step, in the shape of a Gateway API HTTPRoute match.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<NamedMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<NamedMatch>,
}

/// A header match of this name is, for an nginx Ingress, the name of a
/// cookie (`canary-by-cookie`), as Kruise Rollout's nginx routing reads it.
pub const NGINX_COOKIE: &str = "canary-by-cookie";

/// The requests a step's matches send to the canary, as a person reads
/// them: `header x-preview = yes or query beta ~ ^on$` (`~` a regular
/// expression; the fields of one match joined by "and"), on one line with
/// no control character, at most [`MATCHES_SHOWN`] characters.
pub fn describe_matches(matches: &[RequestMatch]) -> String {
    let named = |what: &str, m: &NamedMatch| {
        if what == "header" && m.name == NGINX_COOKIE {
            return format!("cookie {} = always", m.value);
        }
        let op = if m.kind.as_deref() == Some("RegularExpression") {
            "~"
        } else {
            "="
        };
        format!("{what} {} {op} {}", m.name, m.value)
    };
    let describe = |m: &RequestMatch| {
        let path = m.path.iter().map(|p| {
            let op = match p.kind.as_deref() {
                Some("Exact") => "=",
                Some("RegularExpression") => "~",
                _ => "under",
            };
            format!("path {op} {}", p.value.as_deref().unwrap_or("/"))
        });
        let headers = m.headers.iter().map(|h| named("header", h));
        let query = m.query_params.iter().map(|q| named("query", q));
        path.chain(headers).chain(query).collect::<Vec<_>>().join(" and ")
    };
    // Git's text, shown to people: one line, no control characters.
    let described = matches.iter().map(describe).collect::<Vec<_>>().join(" or ");
    bounded_line(&described, MATCHES_SHOWN)
}

/// Characters of a step's matches shown at most.
const MATCHES_SHOWN: usize = 200;

/// A header or query parameter: `type` is `Exact` (the default) or `RegularExpression`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NamedMatch {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    pub value: String,
}

/// A path: `type` is `PathPrefix` (the default), `Exact` or `RegularExpression`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PathMatch {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum IntOrPercent {
    Int(i32),
    Percent(String),
}

/// Seconds as an integer (as Kruise Rollout) or a string such as "90s", "5m", "1h".
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Duration {
    Seconds(u64),
    Text(String),
}

/// Both are int-or-string in the CRD schema, as Kubernetes' own IntOrString.
fn int_or_string_schema() -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-int-or-string": true,
        "anyOf": [{"type": "integer"}, {"type": "string"}]
    })
}

impl JsonSchema for IntOrPercent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IntOrPercent".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        int_or_string_schema()
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        int_or_string_schema()
    }
}

/// Text from outside (Git, a server's answer) fit for one line of a status
/// message or comment: control characters become spaces, whitespace runs
/// collapse, and it is cut at `max` characters (on a char boundary) with `…`.
pub fn bounded_line(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    for word in text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
    {
        for c in (count > 0).then_some(' ').into_iter().chain(word.chars()) {
            if count == max {
                out.push('…');
                return out;
            }
            out.push(c);
            count += 1;
        }
    }
    out
}

/// The longest pause, progress deadline or analysis interval a Rollout may
/// give: longer is a mistake (and near `u64::MAX` seconds it would overflow
/// every timer that adds it to a clock).
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

impl Duration {
    /// The duration, refused when it does not parse or is over [`MAX_DURATION`].
    pub fn to_std(&self) -> Result<std::time::Duration, String> {
        let duration = match self {
            Duration::Seconds(s) => std::time::Duration::from_secs(*s),
            Duration::Text(text) => parse_duration(text)?,
        };
        if duration > MAX_DURATION {
            return Err(format!(
                "duration {} is longer than the maximum of 30 days ({}s)",
                self.shown(),
                MAX_DURATION.as_secs()
            ));
        }
        Ok(duration)
    }

    /// As Git wrote it, cut short so a hostile value cannot flood a message.
    fn shown(&self) -> String {
        match self {
            Duration::Seconds(s) => s.to_string(),
            Duration::Text(text) => format!("{:?}", bounded_line(text, 40)),
        }
    }
}

/// Parses "90", "90s", "5m", "1h30m", "500ms". Every step is checked: a
/// value from Git that overflows is an error, never a panic.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let shown = bounded_line(text, 40);
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(seconds));
    }
    let too_long = || format!("invalid duration {shown:?}: too long");
    let mut total = std::time::Duration::ZERO;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            "ms"
        } else {
            match c {
                'h' => "h",
                'm' => "m",
                's' => "s",
                _ => return Err(format!("invalid duration {shown:?}: unexpected {c:?}")),
            }
        };
        if number.is_empty() {
            return Err(format!(
                "invalid duration {shown:?}: a number must come before {unit:?}"
            ));
        }
        let value: u64 = number.parse().map_err(|_| too_long())?;
        number.clear();
        any = true;
        let part = match unit {
            "h" => value.checked_mul(3600).map(std::time::Duration::from_secs),
            "m" => value.checked_mul(60).map(std::time::Duration::from_secs),
            "s" => Some(std::time::Duration::from_secs(value)),
            _ => Some(std::time::Duration::from_millis(value)),
        };
        total = part.and_then(|part| total.checked_add(part)).ok_or_else(too_long)?;
    }
    if !number.is_empty() || !any {
        return Err(format!(
            "invalid duration {shown:?}: use seconds or a unit (90s, 5m, 1h)"
        ));
    }
    Ok(total)
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pause {
    /// Absent: wait for a promote signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<Duration>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepAnalysis {
    pub template_ref: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficRouting {
    /// The stable Service; its canary twin is `<service>-canary`.
    pub service: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<IngressRouting>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRouting {
    pub http_route_name: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IngressRouting {
    pub name: String,
    /// Only `nginx` is supported.
    #[serde(default = "default_ingress_class")]
    pub class_type: String,
}

fn default_ingress_class() -> String {
    "nginx".to_string()
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CanaryService {
    /// No canary Service: traffic is split by replicas through the stable Service.
    #[serde(default)]
    pub disabled: bool,
    #[serde(default)]
    pub selector: SelectorChange,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectorChange {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    #[default]
    Revert,
    Hold,
}
