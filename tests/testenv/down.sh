#!/usr/bin/env bash
# Stops exactly the processes that up.sh started for STATE_DIR (by pid file),
# then removes STATE_DIR.   tests/testenv/down.sh STATE_DIR
set -uo pipefail

state="${1:?usage: down.sh STATE_DIR (the directory up.sh printed the kubeconfig in)}"
[ -d "$state/pids" ] || { echo "testenv: $state has no pids/: nothing to stop" >&2; exit 0; }

# Reverse start order, so nothing writes to an API server that is gone
# (the gateway's and Knative's, from gateway-up.sh and knative-up.sh, first).
for name in gateway-metrics-forward gateway-url-forward gateway-traefik gateway-pod-player gateway-kube-proxy gateway-forward knative-autoscaler knative-forward knative-controller knative-webhook knative-webhook-forward kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
  f="$state/pids/$name.pid"
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
done
for netns_file in "$state/gateway-netns" "$state/knative-netns" "$state/knative-webhook-netns"; do
  [ -f "$netns_file" ] || continue
  ip netns del "$(cat "$netns_file")" 2>/dev/null || true
  rm -f "$netns_file"
done
[ -n "${GITCANARY_TESTENV_KEEP:-}" ] || rm -rf "$state"
