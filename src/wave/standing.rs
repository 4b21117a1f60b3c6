//! Where a Rollout's releases stand in every environment of the waves, as
//! Git records them: each environment's status file at the branch's head,
//! trusted as the agent trusts it (gitcanary's own write-back, carrying
//! that cluster's trailer). `gitcanary status --repo` and the release page
//! show it; a cluster sees only itself, Git sees them all.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{WAVES_FILE, Waves};
use crate::rollout::record::{Outcome, Records, StatusRecord};
use crate::source::GitSource;
use crate::{Error, Result};

/// One environment's record of a Rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    pub environment: String,
    /// This cluster's environment.
    pub here: bool,
    /// The record; `None` when the environment has released nothing yet,
    /// a message when the file is not gitcanary's or cannot be read.
    pub record: std::result::Result<Option<StatusRecord>, String>,
}

impl Standing {
    /// `promoted abc1234 (registry.test/web:1.1) at …`, one line.
    pub fn describe(&self) -> String {
        match &self.record {
            Ok(None) => "no release recorded".into(),
            Ok(Some(record)) if record.outcome == Outcome::Promoted => format!(
                "promoted {} ({}) at {}",
                crate::writeback::message_text(&record.rollout_id),
                record.images.join(", "),
                record.promoted_at
            ),
            Ok(Some(record)) => format!(
                "{} failed and is held: {}",
                crate::short_commit(&record.failed_commit),
                crate::writeback::message_text(&record.cause)
            ),
            Err(problem) => format!("record not trusted: {problem}"),
        }
    }
}

/// Every environment in order on one line, this cluster's starred.
pub fn describe_all(standings: &[Standing]) -> String {
    standings
        .iter()
        .map(|s| format!("{}{}: {}", s.environment, if s.here { "*" } else { "" }, s.describe()))
        .collect::<Vec<_>>()
        .join(" → ")
}

/// How often a reader that fetches asks the Git server again.
const REFETCH: Duration = Duration::from_secs(10);

/// Reads standings from a repository: fetched by the reader itself (the
/// CLI), at most every ten seconds, or as the agent's loader last fetched it.
pub struct StandingReader {
    git: GitSource,
    here: Records,
    fetches: bool,
    fetched: Mutex<Option<Instant>>,
}

impl StandingReader {
    pub fn new(git: GitSource, here: Records, fetches: bool) -> StandingReader {
        StandingReader {
            git,
            here,
            fetches,
            fetched: Mutex::new(None),
        }
    }

    /// The Rollout's standing in each environment; empty without waves.
    /// Blocking (Git).
    pub fn read(&self, namespace: &str, name: &str) -> Result<Vec<Standing>> {
        self.refresh()?;
        let repo = self.git.open_mirror()?;
        let reference = format!("refs/remotes/origin/{}", self.git.branch());
        let head = repo
            .find_reference(&reference)
            .and_then(|r| r.peel_to_commit())
            .map_err(Error::git(format!("branch {} not found", self.git.branch())))?;
        let waves = head
            .tree()
            .ok()
            .and_then(|tree| tree.get_path(Path::new(WAVES_FILE)).ok())
            .and_then(|entry| repo.find_blob(entry.id()).ok())
            .map(|blob| String::from_utf8_lossy(blob.content()).into_owned());
        let Some(waves) = waves else {
            return Ok(Vec::new());
        };
        let waves = Waves::parse(&waves).map_err(|message| Error::Serialize {
            what: WAVES_FILE.into(),
            message,
        })?;
        let standings = waves.environments.iter().map(|env| {
            let records = env
                .cluster
                .as_deref()
                .and_then(|c| Records::of_cluster(c).ok())
                .unwrap_or_default();
            let writer = &self.git.record_writer;
            Standing {
                environment: env.name.clone(),
                here: env.cluster.is_some() && env.cluster.as_deref() == self.here.cluster(),
                record: crate::source::history::read_record(&repo, &head, (&records, namespace, name), writer),
            }
        });
        Ok(standings.collect())
    }

    fn refresh(&self) -> Result<()> {
        if !self.fetches {
            return Ok(());
        }
        let mut fetched = self.fetched.lock().unwrap_or_else(|e| e.into_inner());
        if fetched.is_none_or(|at| at.elapsed() >= REFETCH) {
            self.git.fetch_head()?;
            *fetched = Some(Instant::now());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promoted(id: &str, image: &str) -> StatusRecord {
        StatusRecord {
            format_version: 1,
            rollout: "shop/web".into(),
            outcome: Outcome::Promoted,
            rollout_id: id.into(),
            stable_commit: "a".repeat(40),
            previous_stable_commit: String::new(),
            stable_revision: String::new(),
            images: vec![image.into()],
            promoted_at: "2026-12-04T10:00:00Z".into(),
            failed_commit: String::new(),
            failed_at: String::new(),
            cause: String::new(),
            steps: Vec::new(),
        }
    }

    #[test]
    fn every_environment_is_told_in_order_with_this_cluster_starred() {
        let standings = [
            Standing {
                environment: "staging".into(),
                here: true,
                record: Ok(Some(promoted("c98a4ed", "registry.test/web:1.1"))),
            },
            Standing {
                environment: "production".into(),
                here: false,
                record: Ok(Some(promoted("4b1e2a0", "registry.test/web:1.0"))),
            },
            Standing {
                environment: "edge".into(),
                here: false,
                record: Ok(None),
            },
            Standing {
                environment: "lab".into(),
                here: false,
                record: Err("commit 1234567 that last changed it is not gitcanary's write-back".into()),
            },
        ];
        assert_eq!(
            describe_all(&standings),
            "staging*: promoted c98a4ed (registry.test/web:1.1) at 2026-12-04T10:00:00Z → production: promoted 4b1e2a0 (registry.test/web:1.0) at 2026-12-04T10:00:00Z → edge: no release recorded → lab: record not trusted: commit 1234567 that last changed it is not gitcanary's write-back"
        );
    }
}
