#!/usr/bin/env bash
# Starts the test gateway and the pods' network on the control plane that
# up.sh started in STATE_DIR; down.sh stops them with the rest. Prints
# GATEWAY_URL=http://127.0.0.1:PORT.   tests/testenv/gateway-up.sh STATE_DIR
#
# The pod network is a network namespace of the plane's own (needs root and
# iproute2), so that planes side by side never share a route: there every
# address of kwok's pod network (10.0.0.0/16) is local, the pod player
# (pod-player.py) answers for each Ready pod on its address, and Traefik,
# the real gateway (built by gateway.sh), implements GatewayClass
# `gitcanary-test` and serves Gateway `gateway` in namespace
# `gitcanary-test` on port 18000 there. Both reach the API server through a
# forwarder on the namespace's link; the URL printed forwards loopback to
# the gateway. Only the pods' answers are played: routing, EndpointSlices
# and Services are Traefik's and Kubernetes' own.
#
# up.sh runs this when GITCANARY_TESTENV_GATEWAY=1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
state=$(cd "${1:?usage: gateway-up.sh STATE_DIR}" && pwd)
say() { echo "gateway: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root (the pods get a network namespace of their own)"; exit 1; }
command -v ip >/dev/null || { say "needs iproute2 (ip): run scripts/setup.sh"; exit 1; }
traefik=$("$here/gateway.sh" | tail -1)
kubeconfig="$state/kubeconfig"
kubectl() { "$state/kubectl" --kubeconfig "$kubeconfig" "$@"; }
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# The pods' network namespace: a veth pair on a /30 of 10.202.0.0/16.
# shellcheck source=netns.sh
source "$here/netns.sh"
netns="gitcanary-gw-$$"
make_netns "$netns" 10.202 "$state/gateway-netns"
# Every pod address is this namespace's own.
ip netns exec "$netns" ip route add local 10.0.0.0/16 dev lo

forward_api "$state" gateway

ip netns exec "$netns" python3 "$here/pod-player.py" "$state" "$host_ip" "$api_port" \
  >"$state/logs/gateway-pod-player.log" 2>&1 &
echo $! >"$state/pids/gateway-pod-player.pid"

kubectl create namespace gitcanary-test --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply --server-side --field-manager=testenv -f - >/dev/null <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: gitcanary-test}
spec: {controllerName: traefik.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gateway, namespace: gitcanary-test}
spec:
  gatewayClassName: gitcanary-test
  listeners:
  - name: http
    port: 18000
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
YAML

metrics_port=19100
ip netns exec "$netns" env KUBECONFIG="$state/kubeconfig-gateway" "$traefik" \
  --entryPoints.web.address=:18000 --entryPoints.metrics.address=:$metrics_port \
  --providers.kubernetesGateway=true --providers.kubernetesGateway.throttleDuration=0s --providers.providersThrottleDuration=100ms \
  --metrics.prometheus=true --metrics.prometheus.entryPoint=metrics \
  --metrics.prometheus.addServicesLabels=true --metrics.prometheus.addRoutersLabels=true \
  --log.level=INFO >"$state/logs/gateway-traefik.log" 2>&1 &
echo $! >"$state/pids/gateway-traefik.pid"

port=$(free_port)
python3 "$here/forward.py" 127.0.0.1 "$port" "$ns_ip" 18000 >"$state/logs/gateway-url-forward.log" 2>&1 &
echo $! >"$state/pids/gateway-url-forward.pid"
metrics=$(free_port)
python3 "$here/forward.py" 127.0.0.1 "$metrics" "$ns_ip" "$metrics_port" >"$state/logs/gateway-metrics-forward.log" 2>&1 &
echo $! >"$state/pids/gateway-metrics-forward.pid"
echo "http://127.0.0.1:$port" >"$state/gateway-url"
echo "http://127.0.0.1:$metrics" >"$state/gateway-metrics-url"

if ! kubectl wait --for=condition=Programmed --timeout=120s -n gitcanary-test gateway/gateway >/dev/null; then
  say "the Gateway was not Programmed in 120 s; Traefik's log:"
  tail -20 "$state/logs/gateway-traefik.log" >&2
  exit 1
fi
say "Traefik, the pod player and the pod network (namespace $netns) started"
echo "GATEWAY_URL=http://127.0.0.1:$port"
