//! The status file, `.gitcanary/status/<namespace>/<name>.yaml`: the state
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

pub fn record_path(namespace: &str, name: &str) -> String {
    format!(".gitcanary/status/{namespace}/{name}.yaml")
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
}
