# Sourced by knative-up.sh and gateway-up.sh: make_netns NAME PREFIX STATE_FILE
# makes network namespace NAME with a veth pair on a free /30 of PREFIX.0.0/16,
# records NAME in STATE_FILE (down.sh deletes it), and sets host_ip (this
# side) and ns_ip (the namespace's side).
make_netns() {
  local netns=$1 prefix=$2 record=$3 subnet
  for _ in $(seq 1 20); do
    subnet=$((RANDOM % 16384 * 4))
    host_ip="$prefix.$((subnet / 256)).$((subnet % 256 + 1))"
    # Not a pipe: under pipefail, grep -q leaving early fails `ip`.
    grep -q "inet $host_ip/" <<<"$(ip -4 addr show)" || break
  done
  ns_ip="${host_ip%.*}.$((${host_ip##*.} + 1))"
  ip netns add "$netns"
  echo "$netns" >"$record"
  ip link add "${netns: -10}h" type veth peer name "${netns: -10}n"
  ip link set "${netns: -10}n" netns "$netns"
  ip addr add "$host_ip/30" dev "${netns: -10}h"
  ip link set "${netns: -10}h" up
  ip netns exec "$netns" ip addr add "$ns_ip/30" dev "${netns: -10}n"
  ip netns exec "$netns" ip link set "${netns: -10}n" up
  ip netns exec "$netns" ip link set lo up
}

# forward_api STATE NAME: from the namespace made last, the API server is
# reached at host_ip through a forwarder (pid and log under NAME-forward);
# writes STATE/kubeconfig-NAME for it and sets api_port.
forward_api() {
  local state=$1 name=$2 kubeconfig="$1/kubeconfig"
  api_port=$(sed -n 's#.*server: https://127.0.0.1:\([0-9]*\).*#\1#p' "$kubeconfig")
  python3 "$here/forward.py" "$host_ip" "$api_port" 127.0.0.1 "$api_port" >"$state/logs/$name-forward.log" 2>&1 &
  echo $! >"$state/pids/$name-forward.pid"
  # The server's certificate names localhost, not the link's address.
  sed "s#server: https://127.0.0.1:$api_port#server: https://$host_ip:$api_port\n    tls-server-name: localhost#" \
    "$kubeconfig" >"$state/kubeconfig-$name"
}
