#!/usr/bin/env bash
# The gitcanary story on a local control plane: a Git repository made from
# examples/quickstart, the agent following it, changes carried by pull
# requests on a GitHub API fake (GitHub cannot run here), a canary whose gate
# is a promotion pull request approved by a writer, a failed release reverted
# in Git, drift healed, a broken manifest refused with its file and line.
# Real requests go through a real gateway (Traefik) all along, and each
# step shows how many of them each version answered.
# Leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bold() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { printf '   %s\n' "$*"; }

bold "Preparing (the first run builds the control plane from Go modules: 15-20 minutes)"
scripts/setup.sh
cache=$(tests/testenv/build.sh | tail -1)
renderers=$(scripts/renderers.sh | tail -n 1)
export PATH="$renderers:$PATH"
tests/testenv/gateway.sh >/dev/null # Traefik, the gateway requests go through (first run: about 10 minutes)
kubectl_bin="$cache/bin/kubectl"
# The build artefacts the test command keeps, so that a clone it ran in builds only what changed.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gitcanary/target}"
cargo build --locked --quiet --bin gitcanary --example github_fake
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
gitcanary="$target_dir/debug/gitcanary"

work=$(mktemp -d "${TMPDIR:-/tmp}/gitcanary-demo.XXXXXX")
agent_pid=""
github_pid=""
chat_pid=""
cleanup() {
  [ -n "${GITCANARY_DEMO_LOG:-}" ] && cp "$work/agent.log" "$GITCANARY_DEMO_LOG" 2>/dev/null
  if [ -n "$agent_pid" ]; then kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null || true; fi
  if [ -n "$github_pid" ]; then kill "$github_pid" 2>/dev/null; wait "$github_pid" 2>/dev/null || true; fi
  if [ -n "$chat_pid" ]; then kill "$chat_pid" 2>/dev/null; wait "$chat_pid" 2>/dev/null || true; fi
  tests/testenv/down.sh "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

bold "Starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes) and a gateway (Traefik)"
GITCANARY_TESTENV_PARENT=$$ GITCANARY_TESTENV_GATEWAY=1 tests/testenv/up.sh "$work/cluster" 2>/dev/null >"$work/up.out"
kubeconfig=$(sed -n 's/^KUBECONFIG=//p' "$work/up.out")
gateway_url=$(sed -n 's/^GATEWAY_URL=//p' "$work/up.out")
export KUBECONFIG="$kubeconfig"
k() { "$kubectl_bin" "$@"; }
requests() { # N requests for echo.example through the gateway, counted by the image that answered
  python3 - "$gateway_url" "$1" <<'PY'
import collections, http.client, json, sys, urllib.parse
url, count = urllib.parse.urlsplit(sys.argv[1]), int(sys.argv[2])
answers = collections.Counter()
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
for _ in range(count):
    try:
        connection.request("GET", "/", headers={"Host": "echo.example"})
        response = connection.getresponse()
        body = response.read()
        who = json.loads(body)["image"].rsplit(":", 1)[-1] if response.status == 200 else f"HTTP {response.status}"
    except Exception:
        connection.close()
        who = "no answer"
    answers[who] += 1
print(", ".join(f"{n} by {who}" for who, n in sorted(answers.items())))
PY
}
k get nodes

bold "Creating a Git repository from examples/quickstart"
git init -q --bare --initial-branch=main "$work/apps.git"
git clone -q "$work/apps.git" "$work/clone" 2>/dev/null
cp -r examples/quickstart/. "$work/clone/"
# The route attaches to the local gateway rather than the quickstart's `public`.
sed -i 's/- name: public/- {name: gateway, namespace: gitcanary-test}/' "$work/clone/echoserver/httproute.yaml"
git -C "$work/clone" add -A
git -C "$work/clone" -c user.name=Alice -c user.email=alice@example.test commit -qm "echoserver 1.0.0"
git -C "$work/clone" push -q origin HEAD:main
(cd "$work/clone" && find . -name '*.yaml' -not -path './.git/*' | sort | sed 's/^/   /')
"$gitcanary" validate "$work/clone" && say "gitcanary validate: every manifest is valid"

"$gitcanary" crd | k apply --server-side -f - >/dev/null
say "installed the Rollout CRD (gitcanary crd | kubectl apply -f -)"

bold "Starting a GitHub API fake for acme/apps: alice and carol may write, bob may only read; alice's commits are hers"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
secret="demo-webhook-secret"
# The repository's webhook: GitHub's events, signed, to the agent's /webhook.
GITHUB_FAKE_WEBHOOK_URL="http://127.0.0.1:$port/webhook" GITHUB_FAKE_WEBHOOK_SECRET="$secret" \
  "$target_dir/debug/examples/github_fake" "$work/apps.git" alice=alice-token:write bob=bob-token:read carol=carol-token:write \
  alice@example.test=alice >"$work/github.out" 2>&1 &
github_pid=$!
for _ in $(seq 1 100); do grep -q '^GITHUB_URL=' "$work/github.out" 2>/dev/null && break; sleep 0.1; done
github_url=$(sed -n 's/^GITHUB_URL=//p' "$work/github.out")
say "GitHub's REST API as octocrab sees it, at $github_url; its pull requests merge into the demo repository, and its events (comments, reviews, merges, pushes) are delivered to the agent's webhook"
api() { # TOKEN METHOD PATH [JSON]: a call to the GitHub API as a user would make it
  curl -s -X "$2" -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
    "$github_url/repos/acme/apps$3" ${4:+-d "$4"}
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

bold "Starting the team's chat: a Slack-format incoming webhook on loopback that keeps each message's text"
chat_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 - "$work/chat.log" "$chat_port" <<'PY' >/dev/null 2>&1 &
import http.server, json, sys
log, port = sys.argv[1], int(sys.argv[2])
class Chat(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        with open(log, "a") as f:
            f.write(body.get("text", "") + "\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Chat).serve_forever()
PY
chat_pid=$!
# Ready once it answers (a GET gets 501 from it, which is an answer).
for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$chat_port/" && break; sleep 0.1; done

bold "Starting the agent (webhook on 127.0.0.1, polling every 5 minutes as a fallback; release events to the team's chat)"
dashboard_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
GITCANARY_WEBHOOK_SECRET="$secret" GITCANARY_GITHUB_TOKEN="gitcanary-token" "$gitcanary" run \
  --repo "file://$work/apps.git" --prune --listen "127.0.0.1:$port" --poll-interval 300 \
  --cache-dir "$work/cache" --github-url "$github_url" --github-repo acme/apps \
  --notify "team=slack:http://127.0.0.1:$chat_port/" --dashboard-listen "127.0.0.1:$dashboard_port" >"$work/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
say "first sync done:"
k -n demo get deployment,service,httproute
k -n demo rollout status deployment/echoserver --timeout=60s | sed 's/^/   /'
for _ in $(seq 1 50); do [ "$(requests 10)" = "10 by 1.0.0" ] && break; sleep 0.2; done
say "200 requests for echo.example through the gateway at $gateway_url: $(requests 200)"

webhook() { # the signed push GitHub would send
  local body sig
  body=$(printf '{"ref":"refs/heads/main","after":"%s"}' "$(git -C "$work/clone" rev-parse HEAD)")
  sig=$(printf '%s' "$body" | openssl dgst -sha256 -hmac "$secret" | sed 's/^.*= //')
  curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$port/webhook" \
    -H 'X-GitHub-Event: push' -H "X-Hub-Signature-256: sha256=$sig" -d "$body"
}
image() { k -n demo get deployment echoserver -o jsonpath='{.spec.template.spec.containers[0].image}'; }

weights() {
  k -n demo get httproute echoserver -o jsonpath='{range .spec.rules[0].backendRefs[*]}{.name}={.weight} {end}'
}
rollout_line() {
  k -n demo get rollout echoserver -o jsonpath='{.status.phase} step {.status.canaryStatus.currentStepIndex} {.status.canaryStatus.currentStepState} traffic {.status.canaryStatus.traffic}'
}
# Prints each new state of the rollout with the route weights read from the
# cluster and who answered 200 real requests sent through the gateway.
follow_until() { # phases to stop at, e.g. Paused or "Failed|Healthy"
  local last="" line phase
  for _ in $(seq 1 300); do
    phase=$(k -n demo get rollout echoserver -o jsonpath='{.status.phase}')
    line="$(rollout_line) | route: $(weights)| canary pods ready: $(k -n demo get deployment echoserver-canary -o jsonpath='{.status.readyReplicas}' 2>/dev/null || echo -)"
    [ "$line" != "$last" ] && say "$line" && say "    200 requests through the gateway: $(requests 200)" && last="$line"
    [[ "$phase" =~ ^($1)$ ]] && return 0
    sleep 0.3
  done
  say "(still not $1 after 90 s; see the agent log)"
}
push() { # message; gitcanary writes to the branch too, so pull first as anyone would
  git -C "$work/clone" add -A
  git -C "$work/clone" -c user.name=Alice -c user.email=alice@example.test commit -qm "$1"
  git -C "$work/clone" -c user.name=Alice -c user.email=alice@example.test pull -q --rebase origin main
  git -C "$work/clone" push -q origin HEAD:main
}

through_pull_request() { # BRANCH MESSAGE: alice pushes a branch, opens a pull request and merges it
  git -C "$work/clone" checkout -q -b "$1"
  git -C "$work/clone" add -A
  git -C "$work/clone" -c user.name=Alice -c user.email=alice@example.test commit -qm "$2"
  git -C "$work/clone" push -q origin "$1"
  pr=$(api alice-token POST /pulls "{\"title\": \"$2\", \"head\": \"$1\", \"base\": \"main\"}" | json 'd["number"]')
  merged=$(api alice-token PUT "/pulls/$pr/merge" '{"merge_method": "merge"}' | json 'd["sha"]')
  git -C "$work/clone" checkout -q main
  git -C "$work/clone" pull -q --rebase origin main
  say "alice opened pull request #$pr ($2) and merged it: ${merged:0:7}"
}
release_comment() { # PR: the markdown gitcanary keeps on the pull request
  api alice-token GET "/issues/$1/comments" |
    json '"\n".join(c["body"] for c in d if "gitcanary:release" in c["body"]).split("\n",1)[-1]' |
    sed 's/^/     | /'
}

bold "Changing the image to 1.1.0 through a pull request; the webhook tells the agent at once"
sed -i 's/echoserver:1.0.0/echoserver:1.1.0/' "$work/clone/echoserver/deployment.yaml"
through_pull_request bump-1.1.0 "echoserver 1.1.0"
carrier=$pr
say "a forged webhook is refused: HTTP $(secret=wrong webhook)"
say "the signed webhook is accepted: HTTP $(webhook)"
follow_until Paused
say "stable still runs: $(image); the canary runs: $(k -n demo get deployment echoserver-canary -o jsonpath='{.spec.template.spec.containers[0].image}')"
say "canary pods carry their release and batch:"
k -n demo get pods -l gitcanary.io/rollout-id -L gitcanary.io/rollout-id,gitcanary.io/rollout-batch-id,version | sed 's/^/     /'
"$gitcanary" status echoserver -n demo | sed 's/^/   /'
release_page="http://127.0.0.1:$dashboard_port/rollouts/demo/echoserver"
say "the release page, live while it waits (gitcanary dashboard; the agent serves it with --dashboard-listen): $release_page"
say "  it reads: $(curl -s "$release_page" | python3 -c 'import html, re, sys; m = re.search(r"<p id=summary>(.*?)</p>", sys.stdin.read()); print(html.unescape(re.sub("<[^>]+>", "", m.group(1))) if m else "(no summary)")')"

bold "The gate: gitcanary opened a promotion pull request"
for _ in $(seq 1 50); do
  gate=$(api alice-token GET '/pulls?state=open' | json '" ".join(str(p["number"]) + " " + p["head"]["ref"] for p in d if p["head"]["ref"].startswith("gitcanary/promote/"))')
  [ -n "$gate" ] && break; sleep 0.2
done
gate_branch=${gate#* }; gate=${gate%% *}
say "#$gate from $gate_branch; it writes:"
git -C "$work/apps.git" show "$gate_branch:.gitcanary/gates/demo/echoserver.yaml" | head -6 | sed 's/^/     /'
api bob-token POST "/issues/$gate/comments" '{"body": "/gitcanary promote"}' >/dev/null
say "bob (read access) comments /gitcanary promote; gitcanary answers:"
for _ in $(seq 1 50); do
  reply=$(api alice-token GET "/issues/$gate/comments" | json '"".join(c["body"] for c in d if c["body"].startswith("@bob"))')
  [ -n "$reply" ] && break; sleep 0.2
done
say "  \"$reply\""
say "and the release still waits: $(rollout_line)"
api alice-token POST "/pulls/$gate/reviews" '{"event": "APPROVE"}' >/dev/null
say "alice approves #$gate too, but she wrote the change: her approval does not count, and the release still waits"
sleep 4
say "$(rollout_line)"
api carol-token POST "/pulls/$gate/reviews" '{"event": "APPROVE"}' >/dev/null
say "carol (write access, who wrote none of the change) approves #$gate: gitcanary merges it and goes on"
follow_until Healthy
say "#$gate merged by: $(api alice-token GET "/pulls/$gate" | json 'd["merged_by"]["login"]')"
for _ in $(seq 1 50); do git -C "$work/clone" pull -q --rebase origin main; [ -f "$work/clone/.gitcanary/status/demo/echoserver.yaml" ] && break; sleep 0.2; done
say "gitcanary recorded the promotion in Git ($(git -C "$work/clone" log -1 --format=%s)):"
sed 's/^/     /' "$work/clone/.gitcanary/status/demo/echoserver.yaml" | head -12
for _ in $(seq 1 50); do k -n demo get deployment echoserver-canary >/dev/null 2>&1 || break; sleep 0.2; done
say "stable now runs: $(image); route: $(weights); canary Deployment: $(k -n demo get deployment echoserver-canary -o name 2>/dev/null || echo removed)"
say "200 requests through the gateway: $(requests 200)"
say "commit status on the change: $(api alice-token GET "/commits/$merged/statuses" | json 'd[0]["context"] + " " + d[0]["state"] + ": " + d[0]["description"]')"
say "the comment gitcanary keeps on pull request #$carrier (edited in place at every step):"
release_comment "$carrier"

bold "Changing the image to a broken 1.2.0 whose pods never become ready"
sed -i 's/echoserver:1.1.0/echoserver:1.2.0-broken/; s/version: base/version: base\n        gitcanary.test\/never-ready: "true"/' "$work/clone/echoserver/deployment.yaml"
through_pull_request bump-1.2.0 "echoserver 1.2.0 (broken)"
broken=$pr
webhook >/dev/null
follow_until Progressing
# Failed lasts only until the revert commit is synced.
follow_until "Failed|Healthy"
say "$(k -n demo get rollout echoserver -o jsonpath='{.status.canaryStatus.message}')"
for _ in $(seq 1 50); do k -n demo get deployment echoserver-canary >/dev/null 2>&1 || break; sleep 0.2; done
say "stable still runs: $(image); route: $(weights); 200 requests through the gateway: $(requests 200)"
say "gitcanary now reverts the change in Git, so the repository never asks for the failed version:"
follow_until Healthy
git -C "$work/clone" pull -q --rebase origin main
git -C "$work/clone" log -1 --format='%an: %B' | sed 's/^/     /'
git -C "$work/clone" show --stat --format= HEAD | sed 's/^/     /'
say "commit status on the change: $(api alice-token GET "/commits/$merged/statuses" | json 'd[0]["state"] + ": " + d[0]["description"]')"
say "and on pull request #$broken:"
release_comment "$broken" | head -8

bold "Someone scales the Deployment by hand; the agent puts Git's value back"
k -n demo scale deployment echoserver --replicas=7 >/dev/null
say "replicas after kubectl scale: 7"
for _ in $(seq 1 50); do [ "$(k -n demo get deployment echoserver -o jsonpath='{.spec.replicas}')" = 3 ] && break; sleep 0.2; done
say "replicas a moment later: $(k -n demo get deployment echoserver -o jsonpath='{.spec.replicas}')"

bold "Pushing a broken manifest: refused with its file and line, the cluster keeps what it had"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: demo\ndata: [unclosed\n' >"$work/clone/echoserver/settings.yaml"
sed -i 's/replicas: 3/replicas: 4/' "$work/clone/echoserver/deployment.yaml"
push "settings (broken) and 4 replicas"
"$gitcanary" validate "$work/clone" | sed 's/^/   gitcanary validate: /' || true
webhook >/dev/null
sleep 2
say "live replicas are still: $(k -n demo get deployment echoserver -o jsonpath='{.spec.replicas}')"
say "the app's status in the cluster:"
k -n gitcanary-system get configmap gitcanary-app-echoserver -o jsonpath='{.data.result}: {.data.message}{"\n"}' | sed 's/^/   /'

bold "Fixing it; gitcanary diff shows what the next sync will do"
git -C "$work/clone" rm -q echoserver/settings.yaml
push "drop the broken settings"
"$gitcanary" diff --repo "file://$work/apps.git" --cache-dir "$work/cache-diff" --color always | sed 's/^/   /' || true
webhook >/dev/null
for _ in $(seq 1 50); do [ "$(k -n demo get deployment echoserver -o jsonpath='{.spec.replicas}')" = 4 ] && break; sleep 0.2; done
say "live replicas: $(k -n demo get deployment echoserver -o jsonpath='{.spec.replicas}') (not a template change: applied directly, no canary)"
if "$gitcanary" diff --repo "file://$work/apps.git" --cache-dir "$work/cache-diff" >/dev/null; then
  say "gitcanary diff: the cluster matches Git (exit 0)"
fi

bold "Adding a Kustomize app (base + production overlay) and a Helm chart: rendered, then synced"
cp -r examples/kustomize/shop "$work/clone/shop"
cp -r examples/helm/web "$work/clone/web"
k create namespace web >/dev/null
push "shop (Kustomize) and web (Helm)"
webhook >/dev/null
for _ in $(seq 1 100); do
  k -n shop get deployment shop >/dev/null 2>&1 && k -n web get deployment web >/dev/null 2>&1 && break
  sleep 0.2
done
say "shop/shop: image $(k -n shop get deployment shop -o jsonpath='{.spec.template.spec.containers[0].image}'), replicas $(k -n shop get deployment shop -o jsonpath='{.spec.replicas}') (the overlay's newTag and patch), from $(k -n shop get deployment shop -o jsonpath='{.metadata.annotations.gitcanary\.io/source}')"
say "generated ConfigMap: $(k -n shop get configmap -o name | grep shop-config), from $(k -n shop get configmap -o jsonpath='{.items[?(@.metadata.name!="kube-root-ca.crt")].metadata.annotations.gitcanary\.io/source}')"
say "web/web: replicas $(k -n web get deployment web -o jsonpath='{.spec.replicas}') (values-production.yaml), from $(k -n web get deployment web -o jsonpath='{.metadata.annotations.gitcanary\.io/source}')"
say "web's HTTPRoute, rendered because the cluster serves the Gateway API: $(k -n web get httproute -o name)"

bold "Summary"
say "git log of the repository:"
git -C "$work/clone" log --oneline | sed 's/^/     /'
# The failure is told once its revert is in Git; give the delivery a moment.
for _ in $(seq 1 50); do grep -q ' failed' "$work/chat.log" 2>/dev/null && break; sleep 0.2; done
say "the team's chat (release events, each once):"
sed 's/^/     /' "$work/chat.log" 2>/dev/null || true
say "agent log (last lines):"
tail -5 "$work/agent.log" | sed 's/^/     /'
say "Everything started by this demo is now stopped."
