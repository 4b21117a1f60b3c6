#!/usr/bin/env bash
# Starts a local control plane on loopback: etcd, kube-apiserver (RBAC on),
# kube-controller-manager, kube-scheduler and kwok with fake nodes, installs
# the Gateway API standard CRDs, and prints KUBECONFIG=<path>. With
# GITCANARY_TESTENV_KNATIVE=1 it starts Knative Serving on it (knative-up.sh);
# with GITCANARY_TESTENV_GATEWAY=1 (or Knative, whose ingress it is) a real gateway and pods that answer
# (gateway-up.sh), and prints GATEWAY_URL= and GATEWAY_METRICS_URL= too.
#
#   tests/testenv/up.sh [STATE_DIR]
#
# Ports are picked free at start, so several instances can run side by side.
# tests/testenv/down.sh STATE_DIR stops exactly what this started.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
say() { echo "testenv: $*" >&2; }

cache=$("$here/build.sh" | tail -1)
bin="$cache/bin"
state="${1:-$(mktemp -d "${TMPDIR:-/tmp}/gitcanary-testenv.XXXXXX")}"
mkdir -p "$state/pki" "$state/logs" "$state/pids" "$state/cmds"
state=$(cd "$state" && pwd)
pki="$state/pki"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() { # name, command...
  local name=$1
  shift
  # Kept so that tests/testenv/restart.sh can start it again.
  printf '%q ' "$@" >"$state/cmds/$name"
  "$@" >"$state/logs/$name.log" 2>&1 &
  echo $! >"$state/pids/$name.pid"
}

fail() {
  say "$1; last lines of $2:"
  tail -20 "$state/logs/$2.log" >&2 || true
  "$here/down.sh" "$state" >/dev/null 2>&1 || true
  exit 1
}

# Certificates: one CA, a serving cert for the API server, one admin client
# cert (system:masters) that the components and tests use, a service-account key.
openssl_quiet() { openssl "$@" >/dev/null 2>&1; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=gitcanary-testenv-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt"
cat >"$pki/serving.ext" <<EOF
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EOF
openssl_quiet req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr"
openssl_quiet x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 365 -extfile "$pki/serving.ext" -out "$pki/apiserver.crt"
printf 'extendedKeyUsage=clientAuth\n' >"$pki/client.ext"
openssl_quiet req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=gitcanary-testenv-admin" \
  -keyout "$pki/admin.key" -out "$pki/admin.csr"
openssl_quiet x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 365 -extfile "$pki/client.ext" -out "$pki/admin.crt"
openssl_quiet genrsa -out "$pki/sa.key" 2048
openssl_quiet rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

etcd_port=$(free_port)
etcd_peer_port=$(free_port)
api_port=$(free_port)
kwok_port=$(free_port)

kubeconfig="$state/kubeconfig"
cat >"$kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gitcanary-testenv
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: admin
  user:
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: gitcanary-testenv
  context: {cluster: gitcanary-testenv, user: admin}
current-context: gitcanary-testenv
EOF

say "starting etcd on 127.0.0.1:$etcd_port"
start etcd "$bin/etcd" --name=node0 --data-dir="$state/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster="node0=http://127.0.0.1:$etcd_peer_port" --listen-metrics-urls="" \
  --unsafe-no-fsync=true --quota-backend-bytes=8589934592 --auto-compaction-retention=1 --log-level=warn

say "starting kube-apiserver on https://127.0.0.1:$api_port"
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$etcd_port" \
  --bind-address=127.0.0.1 --secure-port="$api_port" --advertise-address=127.0.0.1 \
  --endpoint-reconciler-type=none \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --authorization-mode=RBAC --allow-privileged=true \
  --service-cluster-ip-range=10.96.0.0/16 \
  --enable-aggregator-routing=true

for _ in $(seq 1 120); do
  if curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://127.0.0.1:$api_port/readyz" >/dev/null 2>&1; then
    ready=1
    break
  fi
  kill -0 "$(cat "$state/pids/kube-apiserver.pid")" 2>/dev/null || fail "kube-apiserver exited" kube-apiserver
  sleep 0.5
done
[ "${ready:-}" = 1 ] || fail "kube-apiserver did not become ready in 60 s" kube-apiserver

say "starting kube-controller-manager, kube-scheduler, kwok"
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$kubeconfig" \
  --leader-elect=false --secure-port=0 \
  --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
  --controllers='*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle,-route' \
  --kube-api-qps=1000 --kube-api-burst=2000
start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$kubeconfig" --leader-elect=false --secure-port=0

cat "$cache/kwok/"*.yaml >"$state/kwok.yaml"
echo "---" >>"$state/kwok.yaml"
cat "$here/kwok-pod-stages.yaml" >>"$state/kwok.yaml"
start kwok "$bin/kwok" --kubeconfig="$kubeconfig" --config="$state/kwok.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip=10.244.0.1 --server-address="127.0.0.1:$kwok_port" --node-lease-duration-seconds=40

kubectl() { "$bin/kubectl" --kubeconfig="$kubeconfig" "$@"; }
# The matching kubectl, next to the kubeconfig, for tests and the demo.
ln -sf "$bin/kubectl" "$state/kubectl"

for n in 0 1; do
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$n
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: kwok-node-$n
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: {cpu: "64", memory: 256Gi, pods: "1000"}
  capacity: {cpu: "64", memory: 256Gi, pods: "1000"}
EOF
done

say "installing Gateway API CRDs"
kubectl apply --server-side --field-manager=testenv -f "$cache/crds/gateway-api/" >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd --all >/dev/null

# The default ServiceAccount is made by the controller manager; nodes are
# made Ready by kwok, and their not-ready taint removed by the node lifecycle controller.
for _ in $(seq 1 120); do
  if kubectl get serviceaccount default -n default >/dev/null 2>&1 &&
    kubectl wait --for=condition=Ready --timeout=1s node --all >/dev/null 2>&1 &&
    [ -z "$(kubectl get nodes -o jsonpath='{.items[*].spec.taints}' 2>/dev/null)" ]; then
    ok=1
    break
  fi
  sleep 0.5
done
[ "${ok:-}" = 1 ] || fail "nodes or the default ServiceAccount did not appear in 60 s" kwok

# Tied to a parent process (the test run): stop when it exits, however it exits.
if [ -n "${GITCANARY_TESTENV_PARENT:-}" ]; then
  nohup bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; "$2" "$3"' _ \
    "$GITCANARY_TESTENV_PARENT" "$here/down.sh" "$state" >/dev/null 2>&1 &
fi

# Knative Serving on it, for the tests of function canaries (tests/knative.rs).
if [ "${GITCANARY_TESTENV_KNATIVE:-}" = 1 ]; then
  "$here/knative-up.sh" "$state"
fi

# A real gateway (Traefik) and pods that answer, for the tests on real
# traffic (tests/traffic.rs); Knative's ingress too, so Knative needs it.
if [ "${GITCANARY_TESTENV_GATEWAY:-}" = 1 ] || [ "${GITCANARY_TESTENV_KNATIVE:-}" = 1 ]; then
  "$here/gateway-up.sh" "$state" >/dev/null
fi

say "control plane up (state in $state)"
echo "KUBECONFIG=$kubeconfig"
if [ -f "$state/gateway-url" ]; then
  echo "GATEWAY_URL=$(cat "$state/gateway-url")"
  echo "GATEWAY_METRICS_URL=$(cat "$state/gateway-metrics-url")"
fi
