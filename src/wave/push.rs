//! The wave's commit: the next environment's manifests of the promoted
//! app, carrying the release's images, pushed to a branch of its own.
//! What the release was (its images, the wave settings) is read at the
//! promote commit, gitcanary's own record; the manifests at the head.

use std::path::Path;

use git2::{Commit, Repository};

use super::carry::{carry_kustomization, carry_plain, carry_values, is_image_reference, rollout_workload};
use super::{Environment, WAVES_FILE, Waves, wave_branch};
use crate::identity::{ROLLOUT_TRAILER, WAVE_AUTHORS_TRAILER, WAVE_TRAILER, carries_trailers, signature_problem};
use crate::render::settings::{KUSTOMIZATION_FILES, Settings};
use crate::rollout::record::StatusRecord;
use crate::writeback::{MAX_ATTEMPTS, Writer, backoff, message_text, updated_tree};
use crate::{Error, Result};

/// A promote a wave may follow.
#[derive(Debug, Clone)]
pub struct WaveRequest {
    pub namespace: String,
    pub name: String,
    pub app: String,
    pub rollout_id: String,
    pub canary_commit: String,
    /// gitcanary's promote commit: it holds the status file with the images.
    pub promote_commit: String,
}

/// What a wave carries where, read before anything is pushed: the wave
/// settings and the next environment at the tracked branch's head, the
/// images from the status file at the promote commit.
#[derive(Debug, Clone)]
pub struct WavePlan {
    pub from: Environment,
    pub to: Environment,
    pub images: Vec<String>,
    /// The commit that was stable before the release: its commits since
    /// are the release's, and their people may not pass the next gates.
    pub previous_stable: String,
    dir: String,
    carry: super::Carry,
}

/// A wave branch pushed (or found pushed before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveCommit {
    pub from: Environment,
    pub to: Environment,
    pub branch: String,
    pub commit: String,
    pub images: Vec<String>,
    /// The files it changes, relative to the repository.
    pub files: Vec<String>,
}

/// Why no wave follows a promote, when none does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoWave {
    /// No wave settings, or this environment is the last or not listed.
    NotInAWave,
    /// The next environment holds no app of this name.
    NoApp { to: String, dir: String },
    /// The next environment's manifests already ask for these images, or
    /// express none of them.
    NothingToCarry { to: String, dir: String },
}

/// Wave branch names tried in turn: a branch of the release's name that is
/// not gitcanary's wave commit of this release is never built on.
const MAX_BRANCH_TRIES: u32 = 5;

impl Writer<'_> {
    /// Where a promote's wave goes and what it carries.
    pub fn plan_wave(&self, request: &WaveRequest) -> Result<std::result::Result<WavePlan, NoWave>> {
        let repo = self.git.open_mirror()?;
        // Without wave settings in what the agent synced, no fetch at all.
        let tracking = format!("refs/remotes/origin/{}", self.git.branch());
        if let Ok(synced) = repo.find_reference(&tracking).and_then(|r| r.peel_to_commit())
            && read_file(&repo, &synced, WAVES_FILE)?.is_none()
        {
            return Ok(Err(NoWave::NotInAWave));
        }
        let base = self.base_head(&repo)?;
        let Some(waves) = read_waves(&repo, &base)? else {
            return Ok(Err(NoWave::NotInAWave));
        };
        let records = self.git.records();
        let next = waves.next_after(self.git.path(), records.cluster());
        let (Some((from, to)), false) = (next, request.app == crate::manifest::ROOT_APP) else {
            return Ok(Err(NoWave::NotInAWave));
        };
        let dir = format!("{}/{}", to.path.trim_matches('/'), request.app);
        if base
            .tree()
            .ok()
            .and_then(|t| t.get_path(Path::new(&dir)).ok())
            .is_none()
        {
            return Ok(Err(NoWave::NoApp {
                to: to.name.clone(),
                dir,
            }));
        }
        let promoted = self.git.find_commit(&repo, &request.promote_commit)?;
        let record_path = records.status_path(&request.namespace, &request.name);
        let record = read_file(&repo, &promoted, &record_path)?
            .and_then(|text| StatusRecord::parse(&text, &request.namespace, &request.name).ok());
        let (images, previous_stable) = record.map(|r| (r.images, r.previous_stable_commit)).unwrap_or_default();
        // Only what reads as an image reference is written into manifests.
        let (images, odd): (Vec<String>, Vec<String>) = images.into_iter().partition(|i| is_image_reference(i));
        if !odd.is_empty() {
            tracing::warn!(?odd, "images that are not plain references are not carried");
        }
        Ok(Ok(WavePlan {
            from: from.clone(),
            to: to.clone(),
            images,
            previous_stable,
            dir,
            carry: waves.carry.clone(),
        }))
    }

    /// Pushes the wave commit, built on the tracked branch's head, to the
    /// first wave branch name that is free or already holds this release's
    /// wave commit; `authors` are the release's people (a trailer).
    pub fn push_wave(
        &self,
        request: &WaveRequest,
        plan: &WavePlan,
        authors: &[String],
    ) -> Result<std::result::Result<WaveCommit, NoWave>> {
        let key = self.git.records().rollout_key(&request.namespace, &request.name);
        let first = wave_branch(&plan.to.name, &key, &request.rollout_id);
        let wave_id = format!("{} {}", plan.to.name, request.canary_commit);
        let trailers = [(ROLLOUT_TRAILER, key.clone()), (WAVE_TRAILER, wave_id.clone())];
        let mut message = format!(
            "wave({key}): carry release {} into {}\n\nPromoted in {} ({}); merging this starts {}'s own release of {}.\n\n{ROLLOUT_TRAILER}: {key}\n{WAVE_TRAILER}: {wave_id}\n",
            message_text(&request.rollout_id),
            plan.to.name,
            plan.from.name,
            crate::short_commit(&request.promote_commit),
            plan.to.name,
            message_text(&plan.images.join(", ")),
        );
        if !authors.is_empty() {
            message.push_str(&format!(
                "{WAVE_AUTHORS_TRAILER}: {}\n",
                message_text(&authors.join(", "))
            ));
        }
        let repo = self.git.open_mirror()?;
        for attempt in 1..=MAX_ATTEMPTS {
            let base = self.base_head(&repo)?;
            let mut free = None;
            for n in 1..=MAX_BRANCH_TRIES {
                let branch = if n == 1 { first.clone() } else { format!("{first}-v{n}") };
                match self.branch_tip(&repo, &branch) {
                    None => {
                        free = Some(branch);
                        break;
                    }
                    Some(tip) if self.is_wave_commit(&repo, &tip, &base, &trailers) => {
                        return self.pushed(&repo, plan, branch, tip.id().to_string()).map(Ok);
                    }
                    Some(_) => {
                        tracing::warn!(%branch, "a wave branch gitcanary did not push for this release; not used")
                    }
                }
            }
            let Some(branch) = free else {
                return Err(Error::PushRejected {
                    target: format!(
                        "every wave branch name from {first} on (taken by branches gitcanary did not push)"
                    ),
                    attempts: attempt,
                });
            };
            let env_dir = plan.to.path.trim_matches('/');
            let files = carried_files(&repo, &base, (env_dir, &plan.dir), &request.name, plan)?;
            let tree = updated_tree(&repo, &base, &files)?;
            if files.is_empty() || tree == base.tree_id() {
                return Ok(Err(NoWave::NothingToCarry {
                    to: plan.to.name.clone(),
                    dir: plan.dir.clone(),
                }));
            }
            let tree = repo.find_tree(tree).map_err(Error::git("reading the new tree"))?;
            let signature =
                git2::Signature::now(&self.author.name, &self.author.email).map_err(Error::git("the commit author"))?;
            let commit = self.create_commit(&repo, &signature, &message, &tree, &base)?;
            // A branch made meanwhile by someone else rejects this push: never forced.
            match self.push(&repo, commit, &branch) {
                Ok(()) => return self.pushed(&repo, plan, branch, commit.to_string()).map(Ok),
                Err(rejection) => {
                    tracing::info!(attempt, %branch, reason = %rejection, "wave push rejected; looking again");
                    std::thread::sleep(backoff(attempt));
                }
            }
        }
        Err(Error::PushRejected {
            target: format!("wave branch {first}"),
            attempts: MAX_ATTEMPTS,
        })
    }

    fn pushed(&self, repo: &Repository, plan: &WavePlan, branch: String, commit: String) -> Result<WaveCommit> {
        Ok(WaveCommit {
            from: plan.from.clone(),
            to: plan.to.clone(),
            files: changed_files(repo, &commit)?,
            branch,
            commit,
            images: plan.images.clone(),
        })
    }

    /// The tracked branch's head, fetched now.
    fn base_head<'r>(&self, repo: &'r Repository) -> Result<Commit<'r>> {
        let tracking = format!("refs/remotes/origin/{}", self.git.branch());
        let refspec = format!("+refs/heads/{}:{tracking}", self.git.branch());
        self.git.fetch_refs(repo, &[&refspec])?;
        repo.find_reference(&tracking)
            .and_then(|r| r.peel_to_commit())
            .map_err(Error::git(format!("branch {} not found", self.git.branch())))
    }

    /// The remote branch's tip, fetched now; `None` when there is no such branch.
    fn branch_tip<'r>(&self, repo: &'r Repository, branch: &str) -> Option<Commit<'r>> {
        let tracking = format!("refs/gitcanary/waves/{branch}");
        if let Ok(mut stale) = repo.find_reference(&tracking) {
            let _ = stale.delete();
        }
        let refspec = format!("+refs/heads/{branch}:{tracking}");
        self.git.fetch_refs(repo, &[&refspec]).ok()?;
        repo.find_reference(&tracking).and_then(|r| r.peel_to_commit()).ok()
    }

    /// Whether `tip` is this release's wave commit: gitcanary's own, with
    /// its trailers, on top of a commit of the tracked branch.
    fn is_wave_commit(
        &self,
        repo: &Repository,
        tip: &Commit<'_>,
        base: &Commit<'_>,
        trailers: &[(&str, String)],
    ) -> bool {
        let on_base = tip
            .parent_id(0)
            .is_ok_and(|parent| parent == base.id() || repo.graph_descendant_of(base.id(), parent).unwrap_or(false));
        tip.parent_count() == 1
            && on_base
            && carries_trailers(tip, trailers, &self.author)
            && signature_problem(repo, tip, &self.author).is_none()
    }
}

fn read_waves(repo: &Repository, commit: &Commit<'_>) -> Result<Option<Waves>> {
    let Some(text) = read_file(repo, commit, WAVES_FILE)? else {
        return Ok(None);
    };
    Waves::parse(&text).map(Some).map_err(|message| Error::Serialize {
        what: WAVES_FILE.into(),
        message,
    })
}

/// A file's text at a commit; `None` when it has none there.
fn read_file(repo: &Repository, commit: &Commit<'_>, path: &str) -> Result<Option<String>> {
    let tree = commit.tree().map_err(Error::git("reading a tree"))?;
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return Ok(None);
    };
    let Ok(blob) = repo.find_blob(entry.id()) else {
        return Ok(None);
    };
    Ok(std::str::from_utf8(blob.content()).ok().map(str::to_string))
}

/// The YAML files under `dir` at a commit, by path.
fn yaml_files(repo: &Repository, commit: &Commit<'_>, dir: &str) -> Result<Vec<(String, String)>> {
    let tree = commit.tree().map_err(Error::git("reading a tree"))?;
    let Ok(entry) = tree.get_path(Path::new(dir)) else {
        return Ok(Vec::new());
    };
    let Ok(sub) = repo.find_tree(entry.id()) else {
        return Ok(Vec::new());
    };
    let mut files = Vec::new();
    sub.walk(git2::TreeWalkMode::PreOrder, |parent, entry| {
        let path = format!("{dir}/{parent}{}", entry.name().unwrap_or_default());
        if entry.kind() == Some(git2::ObjectType::Blob)
            && crate::manifest::parse::is_yaml(&path)
            && let Ok(blob) = repo.find_blob(entry.id())
            && let Ok(text) = std::str::from_utf8(blob.content())
        {
            files.push((path, text.to_string()));
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(Error::git("walking a tree"))?;
    Ok(files)
}

/// The app's files of the next environment with the images carried in, as
/// the app expresses them: a kustomization's `images:` (of the directory it
/// builds), the Helm values files it names, or its plain manifests.
fn carried_files(
    repo: &Repository,
    head: &Commit<'_>,
    (env_dir, dir): (&str, &str),
    rollout: &str,
    plan: &WavePlan,
) -> Result<Vec<(String, Option<Vec<u8>>)>> {
    let (carry, images) = (&plan.carry, plan.images.as_slice());
    let settings_path = format!("{dir}/{}", crate::manifest::SETTINGS_FILE);
    let settings: Settings = read_file(repo, head, &settings_path)?
        .and_then(|text| serde_saphyr::from_str(&text).ok())
        .unwrap_or_default();
    let files = yaml_files(repo, head, dir)?;
    let mut changed = Vec::new();
    let is_chart = files.iter().any(|(p, _)| p == &format!("{dir}/Chart.yaml"));
    let build_dir = settings
        .kustomize
        .as_ref()
        .and_then(|k| k.path.as_deref())
        .and_then(|path| crate::render::tree::resolve(dir, path))
        .unwrap_or_else(|| dir.to_string());
    // What the app builds from another environment's directory is not this one's to change.
    if !build_dir.starts_with(&format!("{env_dir}/")) {
        tracing::warn!(%build_dir, env_dir, "the app builds outside its environment's directory; nothing is carried");
        return Ok(Vec::new());
    }
    let kustomization: Option<(String, String)> = KUSTOMIZATION_FILES.iter().find_map(|name| {
        let path = format!("{build_dir}/{name}");
        read_file(repo, head, &path).ok().flatten().map(|text| (path, text))
    });
    if let Some((path, text)) = kustomization {
        changed.extend(carry_kustomization(&text, images).map(|text| (path, text)));
    } else if is_chart {
        let helm = settings.helm.unwrap_or_default();
        let values: Vec<String> = match helm.values_files.is_empty() {
            true => vec!["values.yaml".into()],
            false => helm.values_files,
        };
        for name in values {
            let path = format!("{dir}/{name}");
            if let Some((_, text)) = files.iter().find(|(p, _)| *p == path) {
                changed.extend(carry_values(text, &carry.helm_values, images).map(|text| (path, text)));
            }
        }
    } else {
        // The Rollout's own workload there; without that Rollout, every
        // container of the image, as a kustomization's `images:` would.
        let workload = rollout_workload(&files, rollout);
        let mut elsewhere = false;
        for (path, text) in files.iter().filter(|(path, _)| path != &settings_path) {
            match carry_plain(text, images, workload.as_ref()) {
                Some(text) => changed.push((path.clone(), text)),
                None => elsewhere |= workload.is_some() && carry_plain(text, images, None).is_some(),
            }
        }
        if changed.is_empty() && elsewhere {
            tracing::warn!(
                ?workload,
                rollout,
                "the Rollout's workload needs no change; other workloads of the app that run the released images are left as they are"
            );
        }
    }
    Ok(changed
        .into_iter()
        .map(|(path, text)| (path, Some(text.into_bytes())))
        .collect())
}

/// The files a commit changes against its first parent.
fn changed_files(repo: &Repository, commit: &str) -> Result<Vec<String>> {
    let commit = git2::Oid::from_str(commit)
        .and_then(|oid| repo.find_commit(oid))
        .map_err(Error::git("reading the wave commit"))?;
    let tree = commit.tree().map_err(Error::git("reading a tree"))?;
    let parent = commit.parent(0).and_then(|p| p.tree()).ok();
    let diff = repo
        .diff_tree_to_tree(parent.as_ref(), Some(&tree), None)
        .map_err(Error::git("comparing trees"))?;
    Ok(diff
        .deltas()
        .filter_map(|d| d.new_file().path().map(|p| p.to_string_lossy().into_owned()))
        .collect())
}
