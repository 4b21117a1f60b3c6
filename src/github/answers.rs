//! What GitHub's answers mean for gitcanary: who wrote a release, whether
//! a comment was edited, whether an account may write.

use serde_json::Value;

use crate::{Error, Result};

/// The GitHub logins of whoever wrote or committed `commits`. Unknown is an
/// error, never an empty answer: a commit GitHub ties to no account (an
/// email linked to nobody), or a compare that did not list every commit
/// (`total`), would let its author pass as someone who wrote none of it.
/// gitcanary's own commits (`own_email`, its status and gate records) are
/// tied to no account and name nobody.
pub fn release_people(commits: &[Value], total: Option<u64>, own_email: &str) -> Result<Vec<String>> {
    let unknown = |message: String| Error::GitHub {
        context: "the release's commits".into(),
        status: None,
        message,
    };
    if let Some(total) = total
        && total > commits.len() as u64
    {
        return Err(unknown(format!(
            "GitHub listed {} of its {total} commits",
            commits.len()
        )));
    }
    let mut people = Vec::new();
    for commit in commits {
        // A wave carries a release made elsewhere: its people count here too,
        // from any commit (a squash or rebase merge rewrites the wave's), as
        // the trailer can only add people who may not pass a gate.
        for login in wave_authors(commit["commit"]["message"].as_str().unwrap_or_default()) {
            if !people.contains(&login) {
                people.push(login);
            }
        }
        let email = |role: &str| commit["commit"][role]["email"].as_str().unwrap_or_default().to_string();
        if !own_email.is_empty() && email("author") == own_email && email("committer") == own_email {
            continue;
        }
        for role in ["author", "committer"] {
            let Some(login) = commit[role]["login"].as_str() else {
                return Err(unknown(format!(
                    "the {role} of commit {} is tied to no GitHub account",
                    crate::short_commit(commit["sha"].as_str().unwrap_or_default())
                )));
            };
            if !people.iter().any(|p: &String| p == login) {
                people.push(login.to_string());
            }
        }
    }
    Ok(people)
}

/// The logins a wave commit names as the people of the release it carries.
fn wave_authors(message: &str) -> Vec<String> {
    let prefix = format!("{}: ", crate::identity::WAVE_AUTHORS_TRAILER);
    message
        .lines()
        .filter_map(|line| line.trim().strip_prefix(&prefix))
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .filter(|login| !login.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether a comment was edited after it was written.
pub fn is_edited(comment: &Value) -> bool {
    let at = |field: &str| comment[field].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
    match (at("created_at"), at("updated_at")) {
        (Some(created), Some(updated)) => updated.as_second() > created.as_second(),
        _ => false,
    }
}

/// Whether a collaborator-permission answer grants write: `permission` is
/// the base level (admin, write, read, none) even under a custom role, whose
/// name `role_name` carries and which may be anything.
pub fn is_writer(answer: &Value) -> bool {
    matches!(answer["permission"].as_str(), Some("write" | "maintain" | "admin"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_release_whose_authors_github_cannot_name_has_no_known_authors() {
        let commit = |sha: &str, author: Value, committer: Value| {
            json!({"sha": sha, "author": author, "committer": committer,
                "commit": {"author": {"email": "someone@example.test"}, "committer": {"email": "someone@example.test"}}})
        };
        let carol = json!({"login": "carol"});
        let web = json!({"login": "web-flow"});
        let known = [
            commit("a1", carol.clone(), web.clone()),
            commit("b2", carol.clone(), carol.clone()),
        ];
        assert_eq!(
            release_people(&known, Some(2), "gitcanary@localhost").expect("known"),
            ["carol", "web-flow"]
        );
        let unlinked = [
            commit("a1", carol.clone(), web.clone()),
            commit("c3", Value::Null, web.clone()),
        ];
        let error = release_people(&unlinked, None, "gitcanary@localhost").expect_err("an unlinked author");
        assert!(
            error
                .to_string()
                .contains("the author of commit c3 is tied to no GitHub account"),
            "{error}"
        );
        // gitcanary's own records are tied to no account and name nobody.
        let own = json!({"sha": "d4", "author": null, "committer": null,
            "commit": {"author": {"email": "gitcanary@localhost"}, "committer": {"email": "gitcanary@localhost"}}});
        let with_own = [known[0].clone(), own];
        assert_eq!(
            release_people(&with_own, None, "gitcanary@localhost").expect("known"),
            ["carol", "web-flow"]
        );
        let error = release_people(&known, Some(300), "gitcanary@localhost").expect_err("a truncated compare");
        assert!(error.to_string().contains("listed 2 of its 300 commits"), "{error}");
    }

    #[test]
    fn a_wave_brings_the_people_of_the_release_it_carries() {
        let wave = json!({"sha": "e5", "author": null, "committer": null,
            "commit": {"author": {"email": "gitcanary@localhost"}, "committer": {"email": "gitcanary@localhost"},
                "message": "wave(staging/shop/web): carry release abc1234 into production\n\nGitcanary-Rollout: staging/shop/web\nGitcanary-Wave: production abc\nGitcanary-Wave-Authors: carol, erin\n"}});
        let merge = json!({"sha": "f6", "author": {"login": "dave"}, "committer": {"login": "web-flow"},
            "commit": {"author": {"email": "dave@example.test"}, "committer": {"email": "noreply@github.example.test"}}});
        assert_eq!(
            release_people(&[wave, merge], Some(2), "gitcanary@localhost").expect("known"),
            ["carol", "erin", "dave", "web-flow"]
        );
    }

    #[test]
    fn an_edited_comment_is_known_as_edited() {
        assert!(!is_edited(
            &json!({"created_at": "2026-12-01T10:00:00Z", "updated_at": "2026-12-01T10:00:00Z"})
        ));
        assert!(is_edited(
            &json!({"created_at": "2026-12-01T10:00:00Z", "updated_at": "2026-12-01T10:05:00Z"})
        ));
        assert!(!is_edited(&json!({"created_at": "2026-12-01T10:00:00Z"})));
    }

    #[test]
    fn write_access_is_the_base_permission_whatever_the_role_is_called() {
        assert!(
            is_writer(&json!({"permission": "write", "role_name": "deployer"})),
            "a custom role on write"
        );
        assert!(is_writer(&json!({"permission": "write", "role_name": "maintain"})));
        assert!(is_writer(&json!({"permission": "admin", "role_name": "admin"})));
        assert!(
            !is_writer(&json!({"permission": "read", "role_name": "write"})),
            "a role name grants nothing by itself"
        );
        assert!(!is_writer(&json!({"permission": "read", "role_name": "triage"})));
        assert!(!is_writer(&json!({"permission": "none", "role_name": "admin"})));
        assert!(!is_writer(&json!({})));
    }
}
