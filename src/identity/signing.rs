//! SSH signatures on gitcanary's own commits, as Git makes them
//! (`gpg.format=ssh`: `ssh-keygen -Y sign` in the `git` namespace, the
//! armored signature in the commit's `gpgsig` header), so `git verify-commit`
//! with an allowed-signers file checks them too. A Git identity can be
//! forged by anyone who may push; a signature cannot.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The namespace Git signs commits in.
const NAMESPACE: &str = "git";

/// Signs commits with an SSH private key (`--sign-status-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    pub key: PathBuf,
}

/// Checks commits against an allowed-signers file (`--verify-status-signers`),
/// for the identity gitcanary commits as (its email).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verifier {
    pub allowed_signers: PathBuf,
}

/// Runs ssh-keygen with `input` on its standard input.
fn ssh_keygen(args: &[&std::ffi::OsStr], input: &[u8]) -> Result<Vec<u8>, String> {
    let mut child = Command::new("ssh-keygen")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ssh-keygen: {e}"))?;
    // Written from another thread: a large input must not deadlock on a full pipe.
    let mut stdin = child.stdin.take().ok_or("ssh-keygen has no standard input")?;
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child
        .wait_with_output()
        .map_err(|e| format!("ssh-keygen failed: {e}"))?;
    let _ = writer.join();
    if output.status.success() {
        Ok(output.stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(crate::rollout::api::bounded_line(&stderr, 200))
    }
}

impl Signer {
    /// The armored signature of a commit's content.
    pub fn sign(&self, content: &[u8]) -> Result<String, String> {
        let key = self.key.as_os_str();
        let signature = ssh_keygen(
            &[
                "-Y".as_ref(),
                "sign".as_ref(),
                "-n".as_ref(),
                NAMESPACE.as_ref(),
                "-f".as_ref(),
                key,
            ],
            content,
        )
        .map_err(|e| format!("signing with {}: {e}", self.key.display()))?;
        String::from_utf8(signature).map_err(|_| "ssh-keygen wrote a signature that is not text".to_string())
    }
}

impl Verifier {
    /// Whether `signature` is a valid signature of `content` by a key the
    /// allowed-signers file lists for `identity`.
    pub fn verify(&self, content: &[u8], signature: &str, identity: &str) -> Result<(), String> {
        let mut file = tempfile::NamedTempFile::new().map_err(|e| format!("a scratch file: {e}"))?;
        file.write_all(signature.as_bytes())
            .map_err(|e| format!("a scratch file: {e}"))?;
        let args: [&std::ffi::OsStr; 10] = [
            "-Y".as_ref(),
            "verify".as_ref(),
            "-n".as_ref(),
            NAMESPACE.as_ref(),
            "-f".as_ref(),
            self.allowed_signers.as_os_str(),
            "-I".as_ref(),
            identity.as_ref(),
            "-s".as_ref(),
            file.path().as_os_str(),
        ];
        ssh_keygen(&args, content).map(|_| ())
    }

    /// Why `commit` is not signed by an allowed key for `identity`, if it is not.
    pub fn problem(&self, repo: &git2::Repository, commit: git2::Oid, identity: &str) -> Option<String> {
        let Ok((signature, content)) = repo.extract_signature(&commit, None) else {
            return Some("it is not signed".to_string());
        };
        let Ok(signature) = std::str::from_utf8(&signature) else {
            return Some("its signature is not text".to_string());
        };
        self.verify(&content, signature, identity)
            .err()
            .map(|why| format!("its signature is not one of {}: {why}", self.allowed_signers.display()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh ed25519 key and an allowed-signers file naming it for `identity`.
    pub(crate) fn key_pair(dir: &std::path::Path, name: &str, identity: &str) -> (Signer, Verifier) {
        let key = dir.join(name);
        let status = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", identity, "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen runs");
        assert!(status.success());
        let public = std::fs::read_to_string(key.with_extension("pub")).expect("public key");
        let allowed = dir.join(format!("{name}.allowed"));
        std::fs::write(&allowed, format!("{identity} {public}")).expect("allowed signers");
        (
            Signer { key },
            Verifier {
                allowed_signers: allowed,
            },
        )
    }

    #[test]
    fn a_signature_verifies_only_for_its_content_and_an_allowed_key() {
        let dir = tempfile::tempdir().expect("dir");
        let (signer, verifier) = key_pair(dir.path(), "agent", "gitcanary@localhost");
        let (other, _) = key_pair(dir.path(), "mallory", "gitcanary@localhost");
        let signature = signer.sign(b"tree abc\n\npromote\n").expect("signed");
        assert!(signature.starts_with("-----BEGIN SSH SIGNATURE-----"), "{signature}");
        assert_eq!(
            verifier.verify(b"tree abc\n\npromote\n", &signature, "gitcanary@localhost"),
            Ok(())
        );
        assert!(
            verifier
                .verify(b"tree abd\n\npromote\n", &signature, "gitcanary@localhost")
                .is_err(),
            "another content"
        );
        assert!(
            verifier
                .verify(b"tree abc\n\npromote\n", &signature, "someone@else")
                .is_err(),
            "another identity"
        );
        let forged = other.sign(b"tree abc\n\npromote\n").expect("signed");
        assert!(
            verifier
                .verify(b"tree abc\n\npromote\n", &forged, "gitcanary@localhost")
                .is_err(),
            "a key not allowed"
        );
    }
}
