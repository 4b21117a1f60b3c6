//! How gitcanary signs in to GitHub: a token, or a GitHub App whose
//! installation tokens octocrab mints from the App's key and renews before
//! they expire. The installation, when not given, and the App's own login
//! are asked once, the first time they are needed, so a GitHub that does
//! not answer delays only GitHub's work.

use octocrab::Octocrab;
use octocrab::models::{AppId, InstallationId};
use serde_json::Value;

use crate::telemetry::Metrics;
use crate::{Error, Result};

/// What `--github-app-*` or the token give.
pub enum Credentials {
    Token(String),
    /// A GitHub App: its id, its private key (PEM), and its installation
    /// on the repository's account, when known.
    App {
        id: u64,
        key_pem: Vec<u8>,
        installation: Option<u64>,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Token(_) => f.write_str("Token(..)"),
            Credentials::App { id, installation, .. } => {
                write!(f, "App {{ id: {id}, installation: {installation:?} }}")
            }
        }
    }
}

// One per process: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Session {
    Token(Octocrab),
    App {
        /// Signed in as the App itself (a JWT per request): only for
        /// `/app` and the installation's endpoints.
        app: Octocrab,
        /// Signed in as the installation, once its id is known.
        client: tokio::sync::OnceCell<Octocrab>,
    },
}

/// The GitHub error of a sign-in step.
fn failed(context: &str, status: Option<u16>, message: String) -> Error {
    Error::GitHub {
        context: context.to_string(),
        status,
        message,
    }
}

impl Session {
    /// `repo` is the one repository an installation's tokens are minted for.
    pub(super) fn new(
        builder: octocrab::OctocrabBuilder<
            octocrab::NoSvc,
            octocrab::DefaultOctocrabBuilderConfig,
            octocrab::NoAuth,
            octocrab::NotLayerReady,
        >,
        credentials: Credentials,
        repo: &str,
    ) -> Result<Session> {
        let setup = |e: octocrab::Error| failed("client", None, e.to_string());
        match credentials {
            Credentials::Token(token) => Ok(Session::Token(builder.personal_token(token).build().map_err(setup)?)),
            Credentials::App {
                id,
                key_pem,
                installation,
            } => {
                let key = jsonwebtoken::EncodingKey::from_rsa_pem(&key_pem)
                    .map_err(|e| Error::Usage(format!("--github-app-key-file: not an RSA private key in PEM ({e})")))?;
                let app = builder.app(AppId(id), key).build().map_err(setup)?;
                let client = tokio::sync::OnceCell::new();
                if let Some(installation) = installation {
                    let _ = client.set(installation_client(&app, installation, repo)?);
                }
                Ok(Session::App { app, client })
            }
        }
    }
}

/// The client of the App's installation, its tokens good for `repo` alone
/// (an installation may cover more repositories than gitcanary needs).
fn installation_client(app: &Octocrab, id: u64, repo: &str) -> Result<Octocrab> {
    app.installation_builder(InstallationId(id))
        .repositories(vec![repo.to_string()])
        .build()
        .map_err(|e| failed("the GitHub App's installation", None, e.to_string()))
}

/// A `GET` signed as the App itself, its JSON answer: bounded in time and
/// counted as every GitHub call is.
async fn app_get(app: &Octocrab, path: &str, context: &str, metrics: &Metrics) -> Result<Value> {
    let endpoint = if path.ends_with("/installation") {
        "GET /repos/{owner}/{repo}/installation"
    } else {
        "GET /app"
    };
    let exchange = async {
        let response = app._get(path).await.map_err(|e| failed(context, None, e.to_string()))?;
        let status = response.status().as_u16();
        let text = app
            .body_to_string(response)
            .await
            .map_err(|e| failed(context, Some(status), e.to_string()))?;
        Ok::<_, Error>((status, text))
    };
    let answer = tokio::time::timeout(APP_CALL_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(failed(
                context,
                None,
                format!("no answer within {} s", APP_CALL_TIMEOUT.as_secs()),
            ))
        });
    let (status, text) = answer.inspect_err(|_| metrics.github_calls.add(endpoint, "error"))?;
    metrics.github_calls.add(endpoint, &status.to_string());
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let message = value["message"].as_str().unwrap_or("no message").to_string();
        return Err(failed(context, Some(status), message));
    }
    Ok(value)
}

/// How long a call signed as the App may take in all (as any GitHub call).
const APP_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

impl Session {
    /// The client repository calls go through: the token's, or the App's
    /// installation on `owner`'s account (found once, when not given).
    pub(super) async fn client(&self, owner: &str, repo: &str, metrics: &Metrics) -> Result<&Octocrab> {
        match self {
            Session::Token(client) => Ok(client),
            Session::App { app, client, .. } => {
                client
                    .get_or_try_init(|| async {
                        let context = "the GitHub App's installation";
                        let path = format!("/repos/{owner}/{repo}/installation");
                        let found = app_get(app, &path, context, metrics).await?;
                        let id = found["id"]
                            .as_u64()
                            .ok_or_else(|| failed(context, None, "the answer names no installation id".into()))?;
                        tracing::info!(installation = id, "GitHub: signed in as the App's installation");
                        installation_client(app, id, repo)
                    })
                    .await
            }
        }
    }

    /// The App's own account (`slug[bot]`), when signed in as an App; its
    /// comments and commits are gitcanary's.
    pub(super) async fn app_login(&self, metrics: &Metrics) -> Option<Result<String>> {
        let Session::App { app, .. } = self else { return None };
        let context = "the GitHub App";
        Some(app_get(app, "/app", context, metrics).await.and_then(|found| {
            found["slug"]
                .as_str()
                .map(|slug| format!("{slug}[bot]"))
                .ok_or_else(|| failed(context, None, "the answer names no slug".into()))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_is_not_an_rsa_key_in_pem_is_refused_at_start_naming_the_flag() {
        let builder = Octocrab::builder().base_uri("http://127.0.0.1:1").expect("a URI");
        let credentials = Credentials::App {
            id: 1,
            key_pem: b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n".to_vec(),
            installation: Some(2),
        };
        match Session::new(builder, credentials, "apps") {
            Err(Error::Usage(message)) => assert!(message.contains("--github-app-key-file"), "{message}"),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a bad key was taken"),
        }
    }

    #[test]
    fn credentials_debug_shows_no_secret() {
        let token = format!("{:?}", Credentials::Token("ghp_secret".into()));
        let app = format!(
            "{:?}",
            Credentials::App {
                id: 3,
                key_pem: b"KEY".to_vec(),
                installation: None
            }
        );
        assert!(!token.contains("ghp_secret") && !app.contains("KEY"), "{token} {app}");
    }
}
