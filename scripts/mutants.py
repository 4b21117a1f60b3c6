#!/usr/bin/env python3
"""Hand mutants of the rules that keep insiders out: the GitHub gate's judge,
ownership (adoption, prune), signals and the status records in Git. Each
mutant removes or weakens one guard in a scratch worktree of HEAD; the pure
core's unit tests must then fail. Prints one table row per mutant and exits 1
when one survives (but for the equivalent ones named below).

    python3 scripts/mutants.py            # all of them (a few minutes warm)
    python3 scripts/mutants.py judge      # those whose name holds "judge"

Not part of the test command: it builds the core in its own target directory
($TMPDIR/gitcanary-mutants-target), which takes a few minutes the first time.
"""

import os
import subprocess
import sys
import tempfile

# (file under crates/core/src, text, replacement, what the mutant lets through)
MUTANTS = [
 ("github/judge.rs", "if user.is_empty() || user == own {", "if user.is_empty() {", "may_decide: gitcanary's own account decides"),
 ("github/judge.rs", "(!policy.bots.iter().any(|b| b == user) || authored)", "!policy.bots.iter().any(|b| b == user)", "may_decide: a listed bot decides on its own commits"),
 ("github/judge.rs", "if (bot || is_bot(user)) &&", "if bot &&", "may_decide: a [bot] login not flagged as bot passes"),
 ("github/judge.rs", "policy.allow_self_approval || !authored", "true", "may_decide: an author approves their own release"),
 ("github/judge.rs", "Some(by) if by == own => true,", "Some(by) if by == own || by.is_empty() => true,", "merge_counts: an empty merger counts as gitcanary"),
 ("github/judge.rs", "        None => false,\n    }\n}", "        None => true,\n    }\n}", "merge_counts: an unknown merger counts"),
 ("github/judge.rs", "approval.commit == head_sha && may_decide", "may_decide", "approval: one on an older commit counts"),
 ("github/judge.rs", "pushed.is_some_and(|pushed| !pushed.is_empty() && pushed == head_sha)", "pushed.is_some_and(|pushed| pushed == head_sha)", "is_pushed_head: an empty pushed id matches an empty head"),
 ("github/judge.rs", "!canary_commit.is_empty() && message", "message", "commit_names_release: an empty canary commit names any release"),
 ("github/judge.rs", "            if path != gate_path && !others.contains(path) {", "            if path != gate_path && !path.is_empty() && false {", "files_besides_gate: other files ignored"),
 ("github/judge.rs", "        if !of_release {\n            return Judgement::Wait(Why::NotThisRelease);\n        }\n        let merger", "        let merger", "judge: a merged gate of another release passes"),
 ("github/judge.rs", "let writer = merger.is_none_or(|by| by == gate.own || is_writer(by));", "let writer = true;", "judge: a merge by a non-writer passes"),
 ("github/judge.rs", "            Some(closer) if is_writer(closer) => Judgement::Abort,", "            Some(_) => Judgement::Abort,", "judge: anyone's close aborts"),
 ("github/judge.rs", "    if !of_release {\n        return Judgement::Wait(Why::NotThisRelease);\n    }\n    evidence", "    evidence", "judge: an open gate of another release merges"),
 ("github/judge.rs", ".find(|a| counts_but_for_access(a, &pull.head_sha, gate) && is_writer(&a.user))", ".find(|a| counts_but_for_access(a, &pull.head_sha, gate))", "judge: an approval without write access merges"),
 ("plan/mod.rs", "(created_before || !managers.is_empty()).then_some(managers)", "created_before.then_some(managers)", "existed_before: another manager's object created this second is ours"),
 ("plan/mod.rs", ".is_some_and(|t| t.as_second() < started.as_second());", ".is_some_and(|t| t.as_second() < started.as_second() - 60);", "existed_before: an object made a second before the sync is new"),
 ("plan/mod.rs", "fields.len() == 1 && fields[0]", "fields[0]", "made_by_this_sync: a second manager is ignored"),
 ("plan/mod.rs", ".is_some_and(|t| t.as_second() >= started.as_second());\n    only_ours", ".is_none_or(|t| t.as_second() >= started.as_second());\n    only_ours", "made_by_this_sync: no timestamp counts as made now"),
 ("plan/mod.rs", "    if adopt_all || item.asks_adoption() {\n        return Creation::Adopted;", "    if true {\n        return Creation::Adopted;", "creation: an existing object is adopted unasked"),
 ("plan/mod.rs", "        return if entry.adopted {\n            Creation::Adopted\n        } else {\n            Creation::Created\n        };", "        return Creation::Created;", "creation: a re-taken adopted object counts as created"),
 ("plan/mod.rs", "                } else if ours && !moved {", "                } else if !moved {", "prune: another owner's object is pruned"),
 ("plan/mod.rs", "                let moved =\n                    revision.holds(&entry.key()) || meta", "                let moved =\n                    meta", "prune: an object still in Git (moved) is pruned"),
 ("plan/mod.rs", "if ours && !moved && entry.adopted && entry.kind == \"Namespace\" {", "if ours && !moved && entry.kind == \"Namespace\" && false {", "prune: an adopted Namespace is deleted"),
 ("rollout/signal.rs", "token.filter(|token| token.as_str() != acted_on)", "token", "unspent: an acted-on token counts again"),
 ("rollout/signal.rs", "Signal::Promote if status.phase == Phase::Paused => Ok(()),", "Signal::Promote if releasing => Ok(()),", "awaited: a promote passes a timed pause"),
 ("rollout/signal.rs", "        Some(release) if release == *running => None,", "        Some(_) => None,", "mismatch: a promote of another release counts"),
 ("rollout/record.rs", "if record.rollout != format!(\"{namespace}/{name}\") {", "if false {", "record: another Rollout's status file is read"),
 ("rollout/record.rs", "if !is_commit(&record.stable_commit) {", "if false {", "record: a stableCommit not a commit id is read"),
 ("rollout/record.rs", ".is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))", ".is_some_and(|rest| !rest.is_empty())", "right_under: another Rollout's deeper branch is ours"),
 ("rollout/desired.rs", "        if owner.owns(object) {\n            return None;\n        }", "        if true {\n            return None;\n        }", "taken_canary_name: a canary name held by another object is taken"),
]

# A guard no test can catch because another one already holds: the trailer
# line is trimmed, so "…-1 " (no commit) never equals a line of a message.
EQUIVALENT = {"commit_names_release: an empty canary commit names any release"}

# The tests that judge a file's rules: run first, the whole suite only if they pass.
FILTER = {
    "github/judge.rs": "github::judge",
    "plan/mod.rs": "plan::",
    "rollout/signal.rs": "rollout::signal",
    "rollout/record.rs": "rollout::record",
    "rollout/desired.rs": "rollout::desired",
}


def main():
    only = sys.argv[1:]
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
    target = os.path.join(tempfile.gettempdir(), "gitcanary-mutants-target")
    env = dict(os.environ, CARGO_TARGET_DIR=target)
    survived = []
    with tempfile.TemporaryDirectory(prefix="gitcanary-mutants-") as scratch:
        tree = os.path.join(scratch, "tree")
        subprocess.run(["git", "-C", root, "worktree", "add", "--detach", "-q", tree, "HEAD"], check=True)
        try:
            def test(*filters):
                command = ["cargo", "test", "--locked", "-q", "-p", "gitcanary-core", "--lib", "--", *filters]
                return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)

            base = test()
            if base.returncode != 0:
                sys.exit("the core's tests fail without any mutant:\n" + base.stdout + base.stderr)
            print("| mutant | verdict |\n| --- | --- |")
            for file, text, replacement, name in MUTANTS:
                if only and not any(o in name for o in only):
                    continue
                path = os.path.join(tree, "crates/core/src", file)
                source = open(path).read()
                if source.count(text) != 1:
                    print(f"| {name} | its text is not found once in {file}: update the mutant |")
                    survived.append(name)
                    continue
                open(path, "w").write(source.replace(text, replacement))
                try:
                    run = test(FILTER[file])
                    if run.returncode == 0:
                        run = test()
                finally:
                    open(path, "w").write(source)
                output = run.stdout + run.stderr
                if run.returncode == 0:
                    verdict = "equivalent (see EQUIVALENT)" if name in EQUIVALENT else "**survived**"
                    if name not in EQUIVALENT:
                        survived.append(name)
                elif "could not compile" in output:
                    verdict = "does not compile: update the mutant"
                    survived.append(name)
                else:
                    failed = [line.split()[1] for line in output.splitlines() if line.startswith("---- ")]
                    verdict = "killed by " + ", ".join(f"`{t}`" for t in failed[:2])
                    if len(failed) > 2:
                        verdict += f" and {len(failed) - 2} more"
                print(f"| {name} | {verdict} |", flush=True)
        finally:
            subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
