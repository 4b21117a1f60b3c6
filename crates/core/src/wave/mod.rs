//! Environments in waves: the repository's root `gitcanary.yaml` lists
//! environments in order, each a directory of apps that one agent syncs.
//! When a release promotes in one, its agent opens the pull request that
//! carries the release's images into the same app of the next, with what
//! the release proved; merging that pull request starts the next
//! environment's own release. The configuration and the rewriting of
//! manifests are pure; `push` commits, `report::wave` opens the pull request.

pub mod carry;

use serde::Deserialize;

/// The repository's wave settings, at its root (never applied).
pub const WAVES_FILE: &str = "gitcanary.yaml";

/// `gitcanary.yaml` at the repository's root.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Waves {
    /// In the order a release travels.
    #[serde(default)]
    pub environments: Vec<Environment>,
    #[serde(default)]
    pub carry: Carry,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Environment {
    /// A DNS label: it names the environment's wave branches.
    pub name: String,
    /// The directory of apps the environment's agent syncs (its `--path`).
    pub path: String,
    /// The `--cluster-name` of the agent that syncs it, when named.
    #[serde(default)]
    pub cluster: Option<String>,
}

/// What a release carries into the next environment besides container
/// images written in plain manifests and kustomizations' `images:`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Carry {
    /// Helm values keys that hold an image, for Helm apps.
    #[serde(default)]
    pub helm_values: Vec<HelmImageKeys>,
}

/// Where a chart's values hold one image: dotted keys (`image.tag`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HelmImageKeys {
    /// The key holding the image's name (`image.repository`); the entry
    /// applies to the released image of that name. Without it, the entry
    /// applies when the release has one image.
    #[serde(default)]
    pub repository: Option<String>,
    /// The key set to the released tag.
    pub tag: String,
}

impl Waves {
    /// Reads and checks the file; a message naming the line otherwise.
    pub fn parse(text: &str) -> Result<Waves, String> {
        let waves: Waves = serde_saphyr::from_str(text).map_err(|e| {
            let message = e.to_string();
            message
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("not YAML")
                .to_string()
        })?;
        waves.problem().map_or(Ok(waves), Err)
    }

    fn problem(&self) -> Option<String> {
        let mut names = std::collections::BTreeSet::new();
        let paths: Vec<String> = self.environments.iter().map(|e| normal_path(&e.path)).collect();
        for (env, path) in self.environments.iter().zip(&paths) {
            if crate::rollout::record::Records::of_cluster(&env.name).is_err() {
                return Some(format!("environment name {:?} is not a DNS label", env.name));
            }
            if !names.insert(env.name.as_str()) {
                return Some(format!("environment {} is listed twice", env.name));
            }
            if path.is_empty() || path.split('/').any(|part| part == ".." || part == ".") {
                return Some(format!(
                    "environment {}: path {:?} must name a directory below the repository's root",
                    env.name, env.path
                ));
            }
            if let Some(other) = paths.iter().find(|p| *p != path && path.starts_with(&format!("{p}/"))) {
                return Some(format!(
                    "environment {}: path {path} lies inside {other}, another environment's",
                    env.name
                ));
            }
            if let Some(cluster) = &env.cluster
                && let Err(why) = crate::rollout::record::Records::of_cluster(cluster)
            {
                return Some(format!("environment {}: {why}", env.name));
            }
        }
        let keys = self
            .carry
            .helm_values
            .iter()
            .flat_map(|h| h.repository.iter().chain([&h.tag]));
        keys.filter(|key| !is_values_key(key))
            .map(|key| format!("carry.helmValues: {key:?} is not a dotted values key"))
            .next()
    }

    /// The environment an agent syncing `path` (as `cluster`) is, and the
    /// one after it: `None` when it is the last, or not listed.
    pub fn next_after(&self, path: &str, cluster: Option<&str>) -> Option<(&Environment, &Environment)> {
        let path = normal_path(path);
        let at = self.environments.iter().position(|env| {
            normal_path(&env.path) == path && env.cluster.as_deref().is_none_or(|c| Some(c) == cluster)
        })?;
        Some((&self.environments[at], self.environments.get(at + 1)?))
    }
}

fn normal_path(path: &str) -> String {
    path.trim_matches('/').to_string()
}

fn is_values_key(key: &str) -> bool {
    !key.is_empty()
        && key.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// The branch of a wave pull request: one per release of a Rollout into
/// an environment.
pub fn wave_branch(to: &str, rollout_key: &str, rollout_id: &str) -> String {
    format!("{}{rollout_id}", wave_branch_prefix(to, rollout_key))
}

/// Prefix of every wave branch of one Rollout into an environment: an open
/// pull request of an older release under it is superseded.
pub fn wave_branch_prefix(to: &str, rollout_key: &str) -> String {
    format!("gitcanary/wave/{to}/{rollout_key}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "environments:\n- name: staging\n  path: envs/staging\n  cluster: staging\n- name: production\n  path: envs/production/\n  cluster: production\ncarry:\n  helmValues:\n  - repository: image.repository\n    tag: image.tag\n";

    #[test]
    fn a_release_travels_from_each_environment_to_the_next_one() {
        let waves = Waves::parse(TWO).expect("valid");
        let (from, to) = waves
            .next_after("envs/staging", Some("staging"))
            .expect("staging has a next");
        assert_eq!((from.name.as_str(), to.name.as_str()), ("staging", "production"));
        assert_eq!(
            waves.next_after("envs/production", Some("production")),
            None,
            "the last"
        );
        assert_eq!(
            waves.next_after("envs/staging", Some("production")),
            None,
            "another cluster syncing the same path is not staging's agent"
        );
        assert_eq!(waves.next_after("apps", None), None, "not listed");
        assert_eq!(waves.carry.helm_values[0].tag, "image.tag");
    }

    #[test]
    fn a_wrong_wave_file_says_what_is_wrong() {
        let problem = |text: &str| Waves::parse(text).expect_err("refused");
        assert!(problem("environments:\n- name: Staging\n  path: a\n").contains("DNS label"));
        assert!(problem("environments:\n- name: a\n  path: ../x\n").contains("below the repository"));
        assert!(problem("environments:\n- name: a\n  path: x\n- name: a\n  path: y\n").contains("twice"));
        assert!(problem("environments:\n- name: a\n  path: x\n- name: b\n  path: x/y\n").contains("inside x"));
        assert!(problem("environments:\n- name: a\n  path: x\n  color: blue\n").contains("color"));
        assert!(problem("carry:\n  helmValues:\n  - tag: 'image tag'\n").contains("dotted"));
    }

    #[test]
    fn a_wave_branch_belongs_to_one_rollout_and_environment() {
        let branch = wave_branch("production", "staging/shop/web", "abc1234");
        assert_eq!(branch, "gitcanary/wave/production/staging/shop/web/abc1234");
        assert!(branch.starts_with(&wave_branch_prefix("production", "staging/shop/web")));
        assert!(!branch.starts_with(&wave_branch_prefix("production", "staging/shop/we")));
    }
}
