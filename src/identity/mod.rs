//! gitcanary's own commits as others see them: the identity they are made
//! with, the trailers that say what they record, and (optionally) the SSH
//! key that signs them. Both the write-back, which makes these commits, and
//! the source, which reads status files back, decide by these rules.

use git2::{Commit, Repository};

pub mod signing;

pub use crate::rollout::record::{
    GATE_TRAILER, HOLDS_TRAILER, PROMOTES_TRAILER, REVERTS_TRAILER, ROLLOUT_TRAILER, WAVE_AUTHORS_TRAILER, WAVE_TRAILER,
};

/// Who gitcanary's commits are by (`--git-author`), and how they are signed
/// and checked.
#[derive(Debug, Clone)]
pub struct Author {
    pub name: String,
    pub email: String,
    /// Signs gitcanary's commits (`--sign-status-key`).
    pub signer: Option<signing::Signer>,
    /// Accepts gitcanary's commits only when signed by an allowed key for
    /// `email` (`--verify-status-signers`).
    pub verifier: Option<signing::Verifier>,
}

impl Author {
    /// Parses `Name <email>`.
    pub fn parse(text: &str) -> std::result::Result<Author, String> {
        let (name, rest) = text
            .split_once('<')
            .ok_or_else(|| format!("author {text:?} is not `Name <email>`"))?;
        let email = rest
            .strip_suffix('>')
            .ok_or_else(|| format!("author {text:?} is not `Name <email>`"))?;
        Ok(Author {
            name: name.trim().to_string(),
            email: email.trim().to_string(),
            signer: None,
            verifier: None,
        })
    }
}

impl Default for Author {
    fn default() -> Self {
        Author {
            name: "gitcanary".into(),
            email: "gitcanary@localhost".into(),
            signer: None,
            verifier: None,
        }
    }
}

/// Why gitcanary's commit does not count under `--verify-status-signers`
/// (unsigned, or not by an allowed key), if it does not; always counts
/// without it.
pub fn signature_problem(repo: &Repository, commit: &Commit<'_>, author: &Author) -> Option<String> {
    let verifier = author.verifier.as_ref()?;
    verifier.problem(repo, commit.id(), &author.email)
}

/// Whether gitcanary made this commit (author and committer are its
/// identity) and it carries every one of these trailers. Trailers on anyone
/// else's commit count for nothing: a hand-made commit must not pass as a
/// revert, promote or gate already written.
pub fn carries_trailers(commit: &Commit<'_>, trailers: &[(&str, String)], author: &Author) -> bool {
    let is_own = |signature: git2::Signature<'_>| {
        signature.email() == Some(author.email.as_str()) && signature.name() == Some(author.name.as_str())
    };
    if !is_own(commit.author()) || !is_own(commit.committer()) {
        return false;
    }
    let message = commit.message().unwrap_or_default();
    trailers
        .iter()
        .all(|(key, value)| message.lines().any(|l| l.trim() == format!("{key}: {value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authors_parse_from_name_and_email() {
        let author = Author::parse("Release Bot <bot@example.test>").expect("valid");
        assert_eq!(
            (author.name.as_str(), author.email.as_str()),
            ("Release Bot", "bot@example.test")
        );
        assert!(Author::parse("no email").is_err());
    }
}
