//! The status file, `.gitcanary/status/[<cluster>/]<namespace>/<name>.yaml`: the state
//! of record of a Rollout's releases. Written on promote and on a held
//! failure, read back when a Rollout has no status (a rebuilt cluster, a
//! re-created Rollout), with the same type.

use serde::{Deserialize, Serialize};

use crate::rollout::api::StepRecord;

/// The format written; files without `formatVersion` are version 1.
pub const FORMAT_VERSION: u32 = 1;

fn version_one() -> u32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// `stableCommit` passed every step.
    Promoted,
    /// The release of `failedCommit` failed and is held (`onFailure: hold`);
    /// `stableCommit` is still the one that runs.
    Failed,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusRecord {
    #[serde(default = "version_one")]
    pub format_version: u32,
    /// `namespace/name`.
    pub rollout: String,
    pub outcome: Outcome,
    #[serde(rename = "rolloutID")]
    pub rollout_id: String,
    /// The commit whose template runs as stable.
    pub stable_commit: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub previous_stable_commit: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stable_revision: String,
    /// Container images of the stable template (promoted) or of the failed one.
    #[serde(default)]
    pub images: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub promoted_at: String,
    /// The commit whose release failed (outcome `failed`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failed_commit: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub failed_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cause: String,
    #[serde(default)]
    pub steps: Vec<StepRecord>,
}

/// Whether `branch` lies right under `prefix` (no further `/`): a branch of
/// this Rollout, not of one whose key begins with its own.
pub fn right_under(branch: &str, prefix: &str) -> bool {
    branch
        .strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
}

/// Where one agent keeps its records of a Rollout in Git and on GitHub.
/// Agents of several clusters on one repository each name their cluster
/// (`--cluster-name`), and every status file, gate file, gate branch, commit
/// status and trailer then carries it: no agent writes, finds or closes
/// another's. Without a name, the layout of a single cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    cluster: Option<String>,
}

impl Records {
    /// Records of the named cluster; the name must be a DNS label, so that it
    /// reads as one segment of every path and branch.
    pub fn of_cluster(name: &str) -> Result<Records, String> {
        let label = name.len() <= 63
            && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !label {
            return Err(format!(
                "cluster name {name:?} is not a DNS label (lower-case letters, digits and '-', at most 63)"
            ));
        }
        Ok(Records {
            cluster: Some(name.to_string()),
        })
    }

    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// `namespace/name`, or `cluster/namespace/name`: the value of the
    /// `Gitcanary-Rollout` trailer, and the tail of every path and branch.
    /// Namespaces and names hold no `/`, so the two forms never meet.
    pub fn rollout_key(&self, namespace: &str, name: &str) -> String {
        match &self.cluster {
            Some(cluster) => format!("{cluster}/{namespace}/{name}"),
            None => format!("{namespace}/{name}"),
        }
    }

    /// The status file: `.gitcanary/status/[<cluster>/]<namespace>/<name>.yaml`.
    pub fn status_path(&self, namespace: &str, name: &str) -> String {
        format!(".gitcanary/status/{}.yaml", self.rollout_key(namespace, name))
    }

    /// The file a promotion pull request's commit writes.
    pub fn gate_path(&self, namespace: &str, name: &str) -> String {
        format!(".gitcanary/gates/{}.yaml", self.rollout_key(namespace, name))
    }

    /// Prefix of every promotion branch of one Rollout.
    pub fn gate_branch_prefix(&self, namespace: &str, name: &str) -> String {
        format!("gitcanary/promote/{}/", self.rollout_key(namespace, name))
    }

    /// The branch of a promotion pull request: one per release and step.
    pub fn gate_branch(&self, namespace: &str, name: &str, rollout_id: &str, step: u32) -> String {
        format!("{}{rollout_id}-{step}", self.gate_branch_prefix(namespace, name))
    }

    /// Whether `branch` is a promotion branch of this Rollout: right under
    /// its prefix. An unnamed agent's Rollout `eu/shop` has the prefix of
    /// cluster `eu`'s Rollout `shop/<name>`; the rest tells them apart.
    pub fn is_gate_branch_of(&self, branch: &str, namespace: &str, name: &str) -> bool {
        right_under(branch, &self.gate_branch_prefix(namespace, name))
    }

    /// The context of the Rollout's commit status.
    pub fn status_context(&self, namespace: &str, name: &str) -> String {
        format!("gitcanary/{}", self.rollout_key(namespace, name))
    }
}

impl StatusRecord {
    /// Reads a status file; a message saying what is wrong with it otherwise.
    pub fn parse(text: &str, namespace: &str, name: &str) -> Result<StatusRecord, String> {
        let record: StatusRecord = serde_saphyr::from_str(text).map_err(|e| {
            let message = e.to_string();
            message
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or(&message)
                .trim()
                .to_string()
        })?;
        if record.format_version != FORMAT_VERSION {
            return Err(format!(
                "formatVersion {} is not one this gitcanary reads ({FORMAT_VERSION})",
                record.format_version
            ));
        }
        if record.rollout != format!("{namespace}/{name}") {
            return Err(format!(
                "it is the record of {}, not of {namespace}/{name}",
                record.rollout
            ));
        }
        let is_commit = |c: &str| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_commit(&record.stable_commit) {
            return Err(format!("stableCommit {:?} is not a commit id", record.stable_commit));
        }
        if record.outcome == Outcome::Failed && !is_commit(&record.failed_commit) {
            return Err(format!("failedCommit {:?} is not a commit id", record.failed_commit));
        }
        Ok(record)
    }

    pub fn to_yaml(&self) -> Result<String, String> {
        serde_saphyr::to_string(self).map_err(|e| e.to_string())
    }
}

/// Git as the engine reads it back: the status files of the revision being
/// synced and the manifests of earlier commits. Blocking (Git objects).
pub trait History: Send + Sync + std::fmt::Debug {
    /// The Rollout's status file at the revision's head; `None` when there is none.
    fn record(&self, namespace: &str, name: &str) -> Result<Option<StatusRecord>, String>;
    /// Where that file is.
    fn record_path(&self, namespace: &str, name: &str) -> String;
    /// The object `key` of `app` as the app had it at `commit` (rendered, as
    /// the app is), for objects whose manifest names no namespace in
    /// `default_namespace`.
    fn object_at(
        &self,
        commit: &str,
        app: &str,
        key: &crate::manifest::ObjectKey,
        default_namespace: &str,
    ) -> Result<Option<serde_json::Value>, String>;
}

// The trailers of gitcanary's commits: what each records.
pub const ROLLOUT_TRAILER: &str = "Gitcanary-Rollout";
pub const REVERTS_TRAILER: &str = "Gitcanary-Reverts";
pub const PROMOTES_TRAILER: &str = "Gitcanary-Promotes";
pub const GATE_TRAILER: &str = "Gitcanary-Gate";
pub const HOLDS_TRAILER: &str = "Gitcanary-Holds";
/// On a wave commit: the environment it carries a release into, and the release's commit.
pub const WAVE_TRAILER: &str = "Gitcanary-Wave";
/// On a wave commit: who wrote or committed the release it carries. They
/// may not pass the next environment's gates, which see only the wave.
pub const WAVE_AUTHORS_TRAILER: &str = "Gitcanary-Wave-Authors";

/// The `Gitcanary-Gate` trailer's value on a gate commit: the release's
/// rollout ID, the step and the full canary commit.
pub fn gate_id(rollout_id: &str, step: u32, canary_commit: &str) -> String {
    format!("{}-{step} {canary_commit}", message_text(rollout_id))
}

/// Text from a Rollout, Prometheus or file names, fit for a commit message:
/// one line, so nothing in it can stand as a trailer of its own.
pub fn message_text(text: &str) -> String {
    crate::rollout::api::bounded_line(text, MAX_MESSAGE_TEXT)
}

/// Characters of outside text one place in a commit message may hold.
const MAX_MESSAGE_TEXT: usize = 300;

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> StatusRecord {
        StatusRecord {
            format_version: FORMAT_VERSION,
            rollout: "shop/web".into(),
            outcome: Outcome::Promoted,
            rollout_id: "abc1234".into(),
            stable_commit: "a".repeat(40),
            previous_stable_commit: "b".repeat(40),
            stable_revision: "5d4f".into(),
            images: vec!["registry.test/web:2".into()],
            promoted_at: "2026-12-01T10:00:00Z".into(),
            failed_commit: String::new(),
            failed_at: String::new(),
            cause: String::new(),
            steps: Vec::new(),
        }
    }

    #[test]
    fn a_record_reads_back_as_it_was_written() {
        let yaml = record().to_yaml().expect("yaml");
        assert_eq!(StatusRecord::parse(&yaml, "shop", "web"), Ok(record()));
        // Files written before formatVersion existed are version 1.
        let old = yaml.replace("formatVersion: 1\n", "");
        assert_eq!(StatusRecord::parse(&old, "shop", "web"), Ok(record()));
    }

    #[test]
    fn a_corrupt_or_foreign_file_says_what_is_wrong() {
        let problem = |text: &str| StatusRecord::parse(text, "shop", "web").expect_err("refused");
        assert!(problem("rollout: [unclosed").contains("line") || !problem("rollout: [unclosed").is_empty());
        let yaml = record().to_yaml().expect("yaml");
        assert!(problem(&yaml.replace("formatVersion: 1", "formatVersion: 7")).contains("formatVersion 7"));
        assert!(problem(&yaml.replace("shop/web", "shop/other")).contains("shop/other"));
        assert!(problem(&format!("{yaml}color: blue\n")).contains("color"));
        assert!(problem(&yaml.replace(&"a".repeat(40), "main")).contains("stableCommit"));
    }

    #[test]
    fn a_named_cluster_has_records_of_its_own() {
        let single = Records::default();
        let staging = Records::of_cluster("staging").expect("a DNS label");
        let production = Records::of_cluster("production").expect("a DNS label");
        assert_eq!(single.status_path("shop", "web"), ".gitcanary/status/shop/web.yaml");
        assert_eq!(
            staging.status_path("shop", "web"),
            ".gitcanary/status/staging/shop/web.yaml"
        );
        assert_eq!(
            staging.gate_path("shop", "web"),
            ".gitcanary/gates/staging/shop/web.yaml"
        );
        assert_eq!(
            staging.gate_branch("shop", "web", "abc1234", 2),
            "gitcanary/promote/staging/shop/web/abc1234-2"
        );
        assert_eq!(staging.status_context("shop", "web"), "gitcanary/staging/shop/web");
        assert_eq!(staging.rollout_key("shop", "web"), "staging/shop/web");
        // No agent takes another's branch for its own.
        let branch = staging.gate_branch("shop", "web", "abc1234", 2);
        assert!(staging.is_gate_branch_of(&branch, "shop", "web"));
        assert!(staging.is_gate_branch_of(&format!("{branch}-v2"), "shop", "web"));
        assert!(!production.is_gate_branch_of(&branch, "shop", "web"));
        assert!(!single.is_gate_branch_of(&branch, "shop", "web"));
        // An unnamed agent's Rollout staging/shop shares the prefix of staging's shop/web.
        assert!(branch.starts_with(&single.gate_branch_prefix("staging", "shop")));
        assert!(!single.is_gate_branch_of(&branch, "staging", "shop"));
        for bad in ["", "Staging", "a/b", "-a", "a-", &"a".repeat(64), "a.b"] {
            assert!(Records::of_cluster(bad).is_err(), "{bad:?} accepted");
        }
    }
}
