//! `spec.hooks`: calls out at points of a release, in Flagger's model. Each
//! is a signed POST to an endpoint the operator named at agent start
//! (`--hook NAME=URL`), never an address from Git.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hooks {
    /// Called once the first step's canary pods are ready, before any
    /// traffic reaches them; the release goes on only after a 2xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_release: Option<Hook>,
    /// Called at each step once its traffic is in force; the step ends
    /// only after a 2xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Hook>,
    /// Called after the last step, before the stable workload takes the
    /// new version; promotion goes on only after a 2xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_promote: Option<Hook>,
    /// Told the outcome once the release has ended and Git holds it;
    /// informational: its answer changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_release: Option<Hook>,
}

impl Hooks {
    pub fn is_empty(&self) -> bool {
        *self == Hooks::default()
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// The NAME of one of the agent's `--hook NAME=URL`.
    pub name: String,
    /// Appended to the endpoint's URL (`/smoke/{{rolloutID}}`); may use
    /// the query variables.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
}
