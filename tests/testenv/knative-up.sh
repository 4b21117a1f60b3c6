#!/usr/bin/env bash
# Starts Knative Serving (controller, autoscaler and webhook, built by knative.sh)
# against the control plane that up.sh started in STATE_DIR. down.sh stops
# them with the rest.   tests/testenv/knative-up.sh STATE_DIR
#
# Its ingress is Traefik (traefik.ingress.networking.knative.dev), which
# gateway-up.sh starts after this with Knative's provider on: up.sh runs
# both. target-burst-capacity 0 keeps the activator (not run here) out of
# the data path, so a Revision's Service has its pods as endpoints; the
# autoscaler scrapes the pods' queue-proxy (played by the pod player,
# through a link gateway-up.sh makes), and never scales a Revision to zero
# (which needs the activator).
# The webhook (defaulting and validation) runs in a network namespace of its
# own; its Service has no selector and an EndpointSlice naming that
# namespace's address, which the API server dials itself
# (--enable-aggregator-routing: kube-proxy runs in the gateway's namespace only).
# The controller's health probes and the autoscaler's stats server both bind
# :8080, so the autoscaler runs in a network namespace of its own too (needs
# root and iproute2); each reaches the API server through a forwarder.
#
# up.sh runs this when GITCANARY_TESTENV_KNATIVE=1 (scripts/test.sh sets it).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
state=$(cd "${1:?usage: knative-up.sh STATE_DIR}" && pwd)
say() { echo "knative: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root (the autoscaler gets a network namespace of its own)"; exit 1; }
command -v ip >/dev/null || { say "needs iproute2 (ip): run scripts/setup.sh"; exit 1; }
# Its ingress, the gateway, must start after it, with Knative's provider on.
[ ! -f "$state/gateway-netns" ] || { say "the gateway already runs on $state: start Knative with GITCANARY_TESTENV_KNATIVE=1 tests/testenv/up.sh, which starts the gateway after it"; exit 1; }
cache=$("$here/knative.sh" | tail -1)
kubeconfig="$state/kubeconfig"
kubectl() { "$state/kubectl" --kubeconfig "$kubeconfig" "$@"; }
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

kubectl apply --server-side -f "$cache/crds/" >/dev/null
kubectl wait --for condition=established --timeout=60s -f "$cache/crds/" >/dev/null
kubectl create namespace knative-serving --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply --server-side -f "$cache/config/" >/dev/null
# No registry to resolve tags against; the queue-proxy image is never pulled.
kubectl -n knative-serving patch configmap config-deployment --type merge \
  -p '{"data":{"queue-sidecar-image":"registry.test/queue-proxy:test","registries-skipping-tag-resolving":"registry.test"}}' >/dev/null
kubectl -n knative-serving patch configmap config-network --type merge \
  -p '{"data":{"ingress-class":"traefik.ingress.networking.knative.dev"}}' >/dev/null
kubectl -n knative-serving patch configmap config-autoscaler --type merge \
  -p '{"data":{"target-burst-capacity":"0","enable-scale-to-zero":"false"}}' >/dev/null

# The activator is not run; its Service, selecting no pod, is what the
# ServerlessService reconciler reads its (empty) endpoints from.
kubectl apply --server-side -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: activator-service, namespace: knative-serving, labels: {app: activator}}
spec:
  selector: {app: activator}
  ports: [{name: http, port: 80, targetPort: 8012}, {name: http2, port: 81, targetPort: 8013}]
EOF

# shellcheck source=netns.sh
source "$here/netns.sh"

# The webhook first: with it registered, nothing Knative is written without it.
webhook_netns="gitcanary-knw-$$"
make_netns "$webhook_netns" 10.202 "$state/knative-webhook-netns"
forward_api "$state" knative-webhook
kubectl apply --server-side -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: webhook, namespace: knative-serving}
spec:
  ports: [{name: https-webhook, port: 443, targetPort: 8443}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: webhook-testenv
  namespace: knative-serving
  labels: {kubernetes.io/service-name: webhook, endpointslice.kubernetes.io/managed-by: gitcanary-testenv}
addressType: IPv4
endpoints: [{addresses: ["$ns_ip"], conditions: {ready: true}}]
ports: [{name: https-webhook, port: 8443, protocol: TCP}]
EOF
kubectl apply --server-side -f "$cache/webhooks/" >/dev/null

common=(SYSTEM_NAMESPACE=knative-serving METRICS_DOMAIN=knative.dev/internal/serving
  CONFIG_LOGGING_NAME=config-logging CONFIG_OBSERVABILITY_NAME=config-observability)

ip netns exec "$webhook_netns" env "${common[@]}" POD_NAME=webhook WEBHOOK_NAME=webhook \
  "$cache/bin/webhook" --kubeconfig="$state/kubeconfig-knative-webhook" \
  >"$state/logs/knative-webhook.log" 2>&1 &
echo $! >"$state/pids/knative-webhook.pid"

env "${common[@]}" POD_NAME=controller METRICS_PROMETHEUS_PORT="$(free_port)" PROFILING_PORT="$(free_port)" \
  "$cache/bin/controller" --kubeconfig="$kubeconfig" >"$state/logs/knative-controller.log" 2>&1 &
echo $! >"$state/pids/knative-controller.pid"

# The autoscaler's network namespace: a veth pair on a /30 of 10.201.0.0/16.
netns="gitcanary-kn-$$"
make_netns "$netns" 10.201 "$state/knative-netns"

forward_api "$state" knative
ip netns exec "$netns" env "${common[@]}" POD_NAME=autoscaler POD_IP="$ns_ip" \
  "$cache/bin/autoscaler" --kubeconfig="$state/kubeconfig-knative" \
  >"$state/logs/knative-autoscaler.log" 2>&1 &
echo $! >"$state/pids/knative-autoscaler.pid"

# Ready once the webhook has made its certificate and answers the API
# server: a Service as users write it is defaulted in a dry run.
probe() {
  kubectl apply --dry-run=server -o jsonpath='{.spec.template.spec.timeoutSeconds}' -f - 2>/dev/null <<EOF
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: webhook-probe, namespace: default}
spec:
  template:
    spec:
      containers: [{image: registry.test/probe:1}]
EOF
}
for _ in $(seq 1 120); do
  [ -n "$(probe)" ] && break
  kill -0 "$(cat "$state/pids/knative-webhook.pid")" 2>/dev/null || { say "the webhook exited: $(tail -5 "$state/logs/knative-webhook.log")"; exit 1; }
  sleep 0.5
done
[ -n "$(probe)" ] || { say "the webhook did not answer in 60 s: $(tail -5 "$state/logs/knative-webhook.log")"; exit 1; }
say "webhook (namespace $webhook_netns), controller and autoscaler (namespace $netns) started"
