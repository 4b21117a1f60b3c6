use super::*;

const OWN: &str = "gitcanary[bot]";
const GATE_FILE: &str = ".gitcanary/gates/ns/web.yaml";

fn sha(c: char) -> String {
    c.to_string().repeat(40)
}

fn authors() -> Vec<String> {
    vec!["carol".to_string(), "Dave".to_string()]
}

/// The gate of release `steady` at step 1, canary commit `b…`.
fn gate<'a>(authors: &'a [String], policy: &'a GatePolicy) -> Gate<'a> {
    Gate {
        own: OWN,
        rollout_id: "steady",
        step: 1,
        canary_commit: CANARY,
        gate_path: GATE_FILE,
        authors,
        policy,
    }
}

const CANARY: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn gate_message() -> String {
    format!("gate(ns/web): promote\n\nGitcanary-Rollout: ns/web\nGitcanary-Gate: steady-1 {CANARY}\n")
}

fn file(name: &str) -> PullFile {
    PullFile {
        filename: name.into(),
        previous_filename: None,
    }
}

fn approval(user: &str, commit: &str) -> Approval {
    Approval {
        user: user.into(),
        commit: commit.into(),
        bot: is_bot(user),
    }
}

/// An open gate pull request exactly as gitcanary pushed it: head `a…`,
/// the gate file only, its commit naming the release.
fn open_gate() -> Evidence {
    let head = sha('a');
    Evidence {
        pull: Some(PullRequest {
            number: 3,
            open: true,
            merged: false,
            head_ref: "gitcanary/promote/ns/web/steady-1".into(),
            head_sha: head.clone(),
            head_repo: "acme/apps".into(),
            base_ref: "main".into(),
            author: OWN.into(),
            body: format!("Release waits.\n{GATE_COMMIT_MARKER}{head} -->\n"),
            merged_by: None,
        }),
        head_message: gate_message(),
        files: vec![file(GATE_FILE)],
        ..Evidence::default()
    }
}

fn approved_by(mut evidence: Evidence, user: &str, writer: bool) -> Evidence {
    let head = evidence.pull.as_ref().expect("pull").head_sha.clone();
    evidence.approvals.push(approval(user, &head));
    if writer {
        evidence.writers.insert(user.to_string());
    }
    evidence
}

fn merged_by(mut evidence: Evidence, user: &str, writer: bool) -> Evidence {
    let pull = evidence.pull.as_mut().expect("pull");
    pull.open = false;
    pull.merged = true;
    evidence.merged_by = Some(user.to_string());
    if writer {
        evidence.writers.insert(user.to_string());
    }
    evidence
}

fn closed_by(mut evidence: Evidence, user: &str, writer: bool) -> Evidence {
    evidence.pull.as_mut().expect("pull").open = false;
    evidence.closed_by = Some(user.to_string());
    if writer {
        evidence.writers.insert(user.to_string());
    }
    evidence
}

fn judged(evidence: &Evidence) -> Judgement {
    let (authors, policy) = (authors(), GatePolicy::default());
    judge(evidence, &gate(&authors, &policy))
}

fn merge_by(user: &str) -> Judgement {
    Judgement::Merge { approver: user.into() }
}

#[test]
fn a_writers_approval_on_the_pushed_commit_merges_the_gate() {
    assert_eq!(judged(&approved_by(open_gate(), "alice", true)), merge_by("alice"));
    assert_eq!(judged(&open_gate()), Judgement::Wait(Why::Undecided), "no approval");
}

#[test]
fn an_approval_counts_only_on_the_head_it_was_given_on() {
    let mut evidence = approved_by(open_gate(), "alice", true);
    evidence.approvals[0].commit = sha('c');
    assert_eq!(judged(&evidence), Judgement::Wait(Why::Undecided));
}

#[test]
fn an_approval_from_someone_without_write_access_does_not_count() {
    assert_eq!(
        judged(&approved_by(open_gate(), "mallory", false)),
        Judgement::Wait(Why::Undecided)
    );
}

#[test]
fn the_releases_author_cannot_approve_their_own_gate() {
    let evidence = approved_by(open_gate(), "carol", true);
    assert_eq!(judged(&evidence), Judgement::Wait(Why::Undecided));
    let evidence = approved_by(evidence, "alice", true);
    assert_eq!(
        judged(&evidence),
        merge_by("alice"),
        "another writer's approval still counts"
    );
    let (authors, lifted) = (
        authors(),
        GatePolicy {
            allow_self_approval: true,
            bots: vec![],
        },
    );
    let evidence = approved_by(open_gate(), "carol", true);
    assert_eq!(judge(&evidence, &gate(&authors, &lifted)), merge_by("carol"));
}

#[test]
fn only_a_listed_bot_approves() {
    let evidence = approved_by(open_gate(), "release[bot]", true);
    assert_eq!(judged(&evidence), Judgement::Wait(Why::Undecided), "not listed");
    let (authors, policy) = (
        authors(),
        GatePolicy {
            allow_self_approval: false,
            bots: vec!["release[bot]".into()],
        },
    );
    assert_eq!(judge(&evidence, &gate(&authors, &policy)), merge_by("release[bot]"));
}

#[test]
fn a_head_other_than_the_pushed_commit_keeps_the_gate_closed() {
    let mut evidence = approved_by(open_gate(), "alice", true);
    let pull = evidence.pull.as_mut().expect("pull");
    pull.head_sha = sha('d');
    evidence.approvals[0].commit = sha('d');
    assert_eq!(
        judged(&evidence),
        Judgement::Wait(Why::Head {
            head: sha('d'),
            pushed: Some(sha('a'))
        })
    );
}

#[test]
fn a_gate_that_changes_another_file_stays_closed() {
    let mut evidence = approved_by(open_gate(), "alice", true);
    evidence.files.push(file("web/deployment.yaml"));
    assert_eq!(
        judged(&evidence),
        Judgement::Wait(Why::Files(vec!["web/deployment.yaml".into()]))
    );
}

#[test]
fn a_commit_that_does_not_name_this_release_and_step_is_not_its_gate() {
    for message in [
        gate_message().replace("steady-1", "steady-2"),
        gate_message().replace(CANARY, &sha('c')),
        "gate(ns/web): promote\n".to_string(),
    ] {
        let mut evidence = approved_by(open_gate(), "alice", true);
        evidence.head_message = message.clone();
        assert_eq!(judged(&evidence), Judgement::Wait(Why::NotThisRelease), "{message}");
        assert_eq!(
            judged(&merged_by(evidence, "alice", true)),
            Judgement::Wait(Why::NotThisRelease),
            "merged: {message}"
        );
    }
}

#[test]
fn a_merge_passes_only_from_gitcanary_or_a_writer_who_is_no_author() {
    let passed = |by: &str| Judgement::Passed {
        merged_by: Some(by.into()),
    };
    let ignored = |by: &str| {
        Judgement::Wait(Why::MergeIgnored {
            merged_by: Some(by.into()),
        })
    };
    assert_eq!(judged(&merged_by(open_gate(), OWN, false)), passed(OWN));
    assert_eq!(judged(&merged_by(open_gate(), "alice", true)), passed("alice"));
    assert_eq!(
        judged(&merged_by(open_gate(), "alice", false)),
        ignored("alice"),
        "no write access"
    );
    assert_eq!(
        judged(&merged_by(open_gate(), "carol", true)),
        ignored("carol"),
        "the author"
    );
    assert_eq!(
        judged(&merged_by(open_gate(), "ci[bot]", true)),
        ignored("ci[bot]"),
        "an unlisted bot"
    );
    let mut extra = merged_by(open_gate(), "alice", true);
    extra.files.push(file("web/deployment.yaml"));
    assert_eq!(judged(&extra), ignored("alice"), "more than the gate file");
    let mut moved = merged_by(open_gate(), "alice", true);
    moved.pull.as_mut().expect("pull").head_sha = sha('d');
    moved.head_message = gate_message();
    assert_eq!(judged(&moved), ignored("alice"), "not the pushed commit");
}

#[test]
fn a_writers_close_aborts_and_anyone_elses_is_undone() {
    assert_eq!(judged(&closed_by(open_gate(), "alice", true)), Judgement::Abort);
    assert_eq!(
        judged(&closed_by(open_gate(), "mallory", false)),
        Judgement::Reopen {
            closer: Some("mallory".into())
        }
    );
}

#[test]
fn write_access_is_asked_only_of_who_could_decide() {
    let (authors, policy) = (authors(), GatePolicy::default());
    let gate = gate(&authors, &policy);
    let mut evidence = open_gate();
    let head = sha('a');
    evidence.approvals = vec![
        approval("alice", &head),
        approval("carol", &head),
        approval("bob", &sha('c')),
        approval("ci[bot]", &head),
    ];
    assert_eq!(asks_permission(&evidence, &gate), vec!["alice".to_string()]);
    assert_eq!(
        asks_permission(&merged_by(open_gate(), "alice", false), &gate),
        vec!["alice".to_string()]
    );
    assert!(asks_permission(&merged_by(open_gate(), OWN, false), &gate).is_empty());
    assert_eq!(
        asks_permission(&closed_by(open_gate(), "mallory", false), &gate),
        vec!["mallory".to_string()]
    );
}

#[test]
fn only_the_commit_gitcanary_made_for_the_release_and_step_names_it() {
    let message = gate_message();
    assert!(commit_names_release(&message, "steady", 1, CANARY));
    assert!(!commit_names_release(&message, "steady", 2, CANARY), "another step");
    assert!(
        !commit_names_release(&message, "steady", 1, &sha('c')),
        "another release"
    );
    let old = "gate(ns/web): promote\n\nGitcanary-Gate: steady-1\n";
    assert!(
        !commit_names_release(old, "steady", 1, CANARY),
        "a gate of before release identity"
    );
    assert!(!commit_names_release(&message, "steady", 1, ""));
}

#[test]
fn only_the_pushed_commit_by_full_sha_counts() {
    let sha = sha('a');
    assert!(is_pushed_head(&sha, Some(&sha)));
    assert!(!is_pushed_head(&sha, Some(&sha[..7])), "a short sha is not the commit");
    assert!(!is_pushed_head(&sha, None));
    assert!(!is_pushed_head("", Some("")));
}

#[test]
fn a_rename_out_of_another_file_is_more_than_the_gate_file() {
    let renamed = PullFile {
        filename: GATE_FILE.into(),
        previous_filename: Some("web/deployment.yaml".into()),
    };
    assert!(files_besides_gate(&[file(GATE_FILE)], GATE_FILE).is_empty());
    assert_eq!(
        files_besides_gate(&[renamed], GATE_FILE),
        vec!["web/deployment.yaml".to_string()],
        "the old path of a rename counts"
    );
    assert_eq!(
        files_besides_gate(&[file(GATE_FILE), file("x")], GATE_FILE),
        vec!["x".to_string()]
    );
}

#[test]
fn no_author_or_committer_of_the_release_decides_it() {
    let authors = authors();
    let policy = GatePolicy::default();
    assert!(may_decide("alice", false, OWN, &authors, &policy));
    assert!(!may_decide("carol", false, OWN, &authors, &policy), "the author");
    assert!(
        !may_decide("dave", false, OWN, &authors, &policy),
        "a committer, any case"
    );
    assert!(!may_decide(OWN, false, OWN, &authors, &policy), "gitcanary itself");
    // gitcanary on a person's token (no [bot] login) decides nothing by itself either.
    assert!(!may_decide("release-robot", false, "release-robot", &authors, &policy));
    assert!(!may_decide("", false, OWN, &authors, &policy));
    let lifted = GatePolicy {
        allow_self_approval: true,
        bots: vec![],
    };
    assert!(may_decide("carol", false, OWN, &authors, &lifted));
}

#[test]
fn a_bot_decides_only_when_listed_and_never_for_its_own_commits() {
    let policy = GatePolicy {
        allow_self_approval: true,
        bots: vec!["release[bot]".into()],
    };
    assert!(!may_decide("other[bot]", true, OWN, &[], &policy), "not listed");
    assert!(!may_decide("sneaky", true, OWN, &[], &policy), "type Bot, not listed");
    assert!(may_decide("release[bot]", true, OWN, &[], &policy));
    assert!(
        !may_decide("release[bot]", true, OWN, &["release[bot]".into()], &policy),
        "its own commits, self-approval or not"
    );
}

#[test]
fn a_merge_counts_from_gitcanary_or_someone_who_may_decide() {
    let authors = vec!["carol".to_string()];
    let policy = GatePolicy::default();
    assert!(merge_counts(Some(OWN), OWN, &authors, &policy));
    assert!(merge_counts(Some("alice"), OWN, &authors, &policy));
    assert!(
        !merge_counts(Some("carol"), OWN, &authors, &policy),
        "the author merged it"
    );
    assert!(
        !merge_counts(Some("ci[bot]"), OWN, &authors, &policy),
        "an unlisted bot"
    );
    assert!(!merge_counts(None, OWN, &authors, &policy), "nobody known");
    assert!(
        !merge_counts(Some(""), OWN, &authors, &policy),
        "a merger GitHub names as nobody"
    );
}
