#!/usr/bin/env bash
# Stops or starts again one component of a control plane that up.sh started,
# with the command line up.sh used: a fault for the reliability tests.
#   tests/testenv/restart.sh STATE_DIR stop|start NAME     (NAME: kube-apiserver, etcd, ...)
set -euo pipefail

state="${1:?usage: restart.sh STATE_DIR stop|start NAME}"
action="${2:?stop or start}"
name="${3:?a component name}"
pidfile="$state/pids/$name.pid"

case "$action" in
stop)
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  ;;
start)
  cmd=$(cat "$state/cmds/$name")
  # exec: the pid recorded is the component's own, so down.sh stops it.
  eval "exec $cmd" >>"$state/logs/$name.log" 2>&1 &
  echo $! >"$pidfile"
  ;;
*)
  echo "restart.sh: stop or start, not $action" >&2
  exit 2
  ;;
esac
