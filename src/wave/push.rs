//! The wave's commit: the next environment's manifests of the promoted
//! app, carrying the release's images, pushed to a branch of its own.
//! What the release was (its images, the wave settings) is read at the
//! promote commit, gitcanary's own record; the manifests at the head.

use std::path::Path;

use git2::{Commit, Repository};

use super::carry::{carry_kustomization, carry_plain, carry_values};
use super::{Environment, WAVES_FILE, Waves, wave_branch};
use crate::identity::{ROLLOUT_TRAILER, WAVE_TRAILER};
use crate::render::settings::{KUSTOMIZATION_FILES, Settings};
use crate::rollout::record::StatusRecord;
use crate::writeback::{Outcome, Writer, message_text};
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

impl Writer<'_> {
    /// Pushes the wave branch of a promote into the next environment.
    pub fn push_wave(&self, request: &WaveRequest) -> Result<std::result::Result<WaveCommit, NoWave>> {
        let repo = self.git.open_mirror()?;
        let promoted = self.git.find_commit(&repo, &request.promote_commit)?;
        let Some(waves) = read_waves(&repo, &promoted)? else {
            return Ok(Err(NoWave::NotInAWave));
        };
        let records = self.git.records();
        let Some((from, to)) = waves.next_after(self.git.path(), records.cluster()) else {
            return Ok(Err(NoWave::NotInAWave));
        };
        let record_path = records.status_path(&request.namespace, &request.name);
        let images = read_file(&repo, &promoted, &record_path)?
            .and_then(|text| StatusRecord::parse(&text, &request.namespace, &request.name).ok())
            .map(|record| record.images)
            .unwrap_or_default();
        let dir = format!("{}/{}", to.path.trim_matches('/'), request.app);
        if promoted
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
        let key = records.rollout_key(&request.namespace, &request.name);
        let branch = wave_branch(&to.name, &key, &request.rollout_id);
        let wave_id = format!("{} {}", to.name, request.canary_commit);
        let message = format!(
            "wave({key}): carry release {} into {}\n\nPromoted in {} ({}); merging this starts {}'s own release of {}.\n\n{ROLLOUT_TRAILER}: {key}\n{WAVE_TRAILER}: {wave_id}\n",
            message_text(&request.rollout_id),
            to.name,
            from.name,
            crate::short_commit(&request.promote_commit),
            to.name,
            message_text(&images.join(", ")),
        );
        let trailers = [(ROLLOUT_TRAILER, key.clone()), (WAVE_TRAILER, wave_id)];
        let carry = &waves.carry;
        let outcome = self.commit_with_retry(&branch, &trailers, |repo, head| {
            Ok((message.clone(), carried_files(repo, head, &dir, carry, &images)?))
        })?;
        let commit = match outcome {
            Outcome::Committed { commit, .. } | Outcome::AlreadyInGit { commit } => commit,
            Outcome::NothingToChange => {
                return Ok(Err(NoWave::NothingToCarry {
                    to: to.name.clone(),
                    dir,
                }));
            }
        };
        let files = changed_files(&repo, &commit)?;
        Ok(Ok(WaveCommit {
            from: from.clone(),
            to: to.clone(),
            branch,
            commit,
            images,
            files,
        }))
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
            && crate::manifest::load::is_yaml(&path)
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

/// `a/b/../c` → `a/c`; `None` when it climbs out of the repository.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// The app's files of the next environment with the images carried in, as
/// the app expresses them: a kustomization's `images:` (of the directory it
/// builds), the Helm values files it names, or its plain manifests.
fn carried_files(
    repo: &Repository,
    head: &Commit<'_>,
    dir: &str,
    carry: &super::Carry,
    images: &[String],
) -> Result<Vec<(String, Option<Vec<u8>>)>> {
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
        .and_then(|path| normalize(&format!("{dir}/{path}")))
        .unwrap_or_else(|| dir.to_string());
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
        for (path, text) in &files {
            if path != &settings_path {
                changed.extend(carry_plain(text, images).map(|text| (path.clone(), text)));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlay_path_stays_inside_the_repository() {
        assert_eq!(
            normalize("envs/prod/shop/../../../bases/shop").as_deref(),
            Some("bases/shop")
        );
        assert_eq!(
            normalize("envs/prod/shop/./overlay").as_deref(),
            Some("envs/prod/shop/overlay")
        );
        assert_eq!(normalize("envs/../../x"), None);
    }
}
