//! What the cluster serves, as charts read it from `.Capabilities`.

/// What the cluster serves, for charts that branch on `.Capabilities`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// `v1.36.3`
    pub kube_version: String,
    /// `apps/v1`, `apps/v1/Deployment`, ...
    pub api_versions: Vec<String>,
}

/// The Kubernetes version gitcanary is built and tested against (the test
/// control plane's, `tests/testenv/versions.env`): what `validate` renders
/// Helm charts for when no cluster is there to ask.
pub const SUPPORTED_KUBE_VERSION: &str = "v1.36.3";

/// gitcanary's own API, served wherever it runs, beyond the built-in ones
/// Helm knows. Gateway API and Knative are not everywhere: `--api-versions`
/// names them for a chart that branches on them.
const OWN_API_VERSIONS: &[&str] = &["gitcanary.io/v1alpha1", "gitcanary.io/v1alpha1/Rollout"];

impl Capabilities {
    /// What a chart sees offline: `kube_version` (default the supported
    /// one), and Helm's built-in API versions plus gitcanary's and `extra`.
    pub fn offline(kube_version: Option<&str>, extra: &[String]) -> Result<Capabilities, String> {
        let kube_version = kube_version.unwrap_or(SUPPORTED_KUBE_VERSION);
        if !is_kube_version(kube_version) {
            return Err(format!(
                "--kube-version {kube_version:?}: expected a version such as {SUPPORTED_KUBE_VERSION}"
            ));
        }
        if let Some(bad) = extra.iter().find(|v| !is_api_version(v)) {
            return Err(format!(
                "--api-versions {bad:?}: expected group/version or group/version/Kind"
            ));
        }
        let mut api_versions: Vec<String> = OWN_API_VERSIONS.iter().map(ToString::to_string).collect();
        api_versions.extend(extra.iter().cloned());
        Ok(Capabilities {
            kube_version: kube_version.to_string(),
            api_versions,
        })
    }
}

/// `v1.36`, `1.36.3`, `v1.36.3-rc.1`: what `helm --kube-version` reads.
fn is_kube_version(text: &str) -> bool {
    let text = text.strip_prefix('v').unwrap_or(text);
    let (core, pre) = text.split_once(['-', '+']).unwrap_or((text, ""));
    let parts: Vec<&str> = core.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
        && pre.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

/// `apps/v1`, `v1`, `example.com/v1/Widget`: nothing a comma list could split.
fn is_api_version(text: &str) -> bool {
    let parts = text.split('/').count();
    !text.is_empty()
        && (1..=3).contains(&parts)
        && !text.split('/').any(str::is_empty)
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'/')
}
