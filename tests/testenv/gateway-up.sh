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
# `gitcanary-test` on port 18000 there. kube-proxy (built by build.sh) runs
# there too, so a Service's ClusterIP reaches its endpoints as in a cluster:
# Traefik's Knative provider, Knative Serving's ingress when knative-up.sh
# ran first, dials Revisions' Services by ClusterIP. Each reaches the API
# server through a forwarder on the namespace's link; the URL printed
# forwards loopback to the gateway. Only the pods' answers are played:
# routing, EndpointSlices and Services are Traefik's and Kubernetes' own.
#
# up.sh runs this when GITCANARY_TESTENV_GATEWAY=1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
state=$(cd "${1:?usage: gateway-up.sh STATE_DIR}" && pwd)
say() { echo "gateway: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root (the pods get a network namespace of their own)"; exit 1; }
command -v ip >/dev/null || { say "needs iproute2 (ip): run scripts/setup.sh"; exit 1; }
command -v iptables-restore >/dev/null || { say "needs iptables (for kube-proxy): run scripts/setup.sh"; exit 1; }
traefik=$("$here/gateway.sh" | tail -1)
controlplane=$("$here/build.sh" | tail -1)
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
# Every pod address is this namespace's own; a ClusterIP (up.sh's service
# range) is routed there too, for kube-proxy's rules to rewrite.
ip netns exec "$netns" ip route add local 10.0.0.0/16 dev lo
ip netns exec "$netns" ip route add local 10.96.0.0/16 dev lo

forward_api "$state" gateway

# Knative's autoscaler scrapes each Revision pod's queue-proxy by pod IP: its
# namespace reaches the pod network through a link of its own to this one.
if [ -f "$state/knative-netns" ]; then
  autoscaler_netns=$(cat "$state/knative-netns")
  ip link add "${netns: -10}k" type veth peer name "${netns: -10}a"
  ip link set "${netns: -10}k" netns "$netns"
  ip link set "${netns: -10}a" netns "$autoscaler_netns"
  ip netns exec "$netns" ip addr add 10.203.0.1/30 dev "${netns: -10}k"
  ip netns exec "$netns" ip link set "${netns: -10}k" up
  ip netns exec "$autoscaler_netns" ip addr add 10.203.0.2/30 dev "${netns: -10}a"
  ip netns exec "$autoscaler_netns" ip link set "${netns: -10}a" up
  ip netns exec "$autoscaler_netns" ip route add 10.0.0.0/16 via 10.203.0.1
fi

# It proxies for the gateway alone, as if on one of kwok's nodes (it waits
# 30 s for a Node of its name to exist), and leaves the host's conntrack
# limit as it is.
ip netns exec "$netns" "$controlplane/bin/kube-proxy" --kubeconfig="$state/kubeconfig-gateway" \
  --proxy-mode=iptables --hostname-override=kwok-node-0 --bind-address="$ns_ip" \
  --conntrack-max-per-core=0 --iptables-min-sync-period=0 --metrics-bind-address="" \
  >"$state/logs/gateway-kube-proxy.log" 2>&1 &
echo $! >"$state/pids/gateway-kube-proxy.pid"

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

# Knative's ingress, when knative-up.sh set its class to Traefik's.
knative=()
if [ -f "$state/pids/knative-controller.pid" ]; then
  # With no domain configured, Knative's routes are cluster-local.
  knative=(--experimental.knative=true --providers.knative=true
    --providers.knative.publicEntrypoints=web --providers.knative.privateEntrypoints=web
    --providers.knative.publicService.name=gitcanary-test-ingress --providers.knative.publicService.namespace=knative-serving
    --providers.knative.privateService.name=gitcanary-test-ingress --providers.knative.privateService.namespace=knative-serving)
fi
metrics_port=19100
ip netns exec "$netns" env KUBECONFIG="$state/kubeconfig-gateway" "$traefik" "${knative[@]}" \
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

# kube-proxy has written its rules (a Service's ClusterIP reaches its pods).
for _ in $(seq 1 120); do
  ip netns exec "$netns" iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1 && break
  kill -0 "$(cat "$state/pids/gateway-kube-proxy.pid")" 2>/dev/null || break
  sleep 0.5
done
if ! ip netns exec "$netns" iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1; then
  say "kube-proxy wrote no rules in 60 s; its log:"
  tail -20 "$state/logs/gateway-kube-proxy.log" >&2
  exit 1
fi
if ! kubectl wait --for=condition=Programmed --timeout=120s -n gitcanary-test gateway/gateway >/dev/null; then
  say "the Gateway was not Programmed in 120 s; Traefik's log:"
  tail -20 "$state/logs/gateway-traefik.log" >&2
  exit 1
fi
say "Traefik, kube-proxy, the pod player and the pod network (namespace $netns) started"
echo "GATEWAY_URL=http://127.0.0.1:$port"
