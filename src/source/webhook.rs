//! GitHub webhook deliveries: signature check and the parts of a `push`
//! event that decide whether to sync.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Largest webhook body accepted; GitHub caps payloads at 25 MB, pushes are far smaller.
pub const MAX_BODY_BYTES: usize = 5 * 1024 * 1024;

/// Checks `X-Hub-Signature-256` (`sha256=<hex>`) against the body, in constant time.
pub fn signature_is_valid(secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
    let Some(hex_signature) = header.and_then(|h| h.strip_prefix("sha256=")) else {
        return false;
    };
    let Ok(signature) = hex::decode(hex_signature.trim()) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&signature).is_ok()
}

/// The signature GitHub would send for `body`; used by tests and the demo.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[derive(Debug, serde::Deserialize)]
pub struct PushEvent {
    #[serde(rename = "ref")]
    pub git_ref: String,
    #[serde(default)]
    pub after: Option<String>,
}

impl PushEvent {
    pub fn parse(body: &[u8]) -> Result<PushEvent, String> {
        serde_json::from_slice(body).map_err(|e| format!("malformed push event: {e}"))
    }

    pub fn is_for_branch(&self, branch: &str) -> bool {
        self.git_ref.strip_prefix("refs/heads/") == Some(branch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_made_with_the_secret_is_accepted() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let header = sign(b"topsecret", body);
        assert!(signature_is_valid(b"topsecret", body, Some(&header)));
    }

    #[test]
    fn wrong_missing_or_malformed_signatures_are_refused() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        assert!(!signature_is_valid(b"topsecret", body, Some(&sign(b"other", body))));
        assert!(!signature_is_valid(b"topsecret", body, None));
        assert!(!signature_is_valid(b"topsecret", body, Some("sha1=abc")));
        assert!(!signature_is_valid(b"topsecret", body, Some("sha256=zz")));
        let tampered = br#"{"ref":"refs/heads/prod"}"#;
        assert!(!signature_is_valid(
            b"topsecret",
            tampered,
            Some(&sign(b"topsecret", body))
        ));
    }

    #[test]
    fn push_events_name_their_branch() {
        let event = PushEvent::parse(br#"{"ref":"refs/heads/main","after":"abc"}"#).expect("valid");
        assert!(event.is_for_branch("main"));
        assert!(!event.is_for_branch("dev"));
        assert!(PushEvent::parse(b"{not json").is_err());
    }
}
