# Plays Knative's networking layer on the test control plane, as kwok plays
# the kubelet: no ingress implementation runs there, so every KIngress is
# marked ready (and load-balanced by a placeholder name) for the generation
# it has. Nothing else of Knative or gitcanary is played.
#   python3 ingress-player.py STATE_DIR
import datetime, http.client, json, re, ssl, sys, time

state = sys.argv[1]
kubeconfig = open(f"{state}/kubeconfig").read()
host, port = re.search(r"server: https://([0-9.]+):([0-9]+)", kubeconfig).groups()
context = ssl.create_default_context(cafile=f"{state}/pki/ca.crt")
context.load_cert_chain(f"{state}/pki/admin.crt", f"{state}/pki/admin.key")
base = "/apis/networking.internal.knative.dev/v1alpha1"
balancer = {"ingress": [{"domainInternal": "gitcanary-test-ingress.knative-serving.svc.cluster.local"}]}


def call(method, path, body=None, content_type="application/json"):
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    headers = {"Content-Type": content_type} if body is not None else {}
    connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


while True:
    try:
        status, data = call("GET", f"{base}/ingresses")
        items = json.loads(data).get("items", []) if status == 200 else []
        for ingress in items:
            meta = ingress["metadata"]
            generation = meta.get("generation", 0)
            if ingress.get("status", {}).get("observedGeneration") == generation:
                continue
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            conditions = [
                {"type": kind, "status": "True", "lastTransitionTime": now}
                for kind in ("Ready", "LoadBalancerReady", "NetworkConfigured")
            ]
            patch = {"status": {"observedGeneration": generation, "conditions": conditions,
                                "publicLoadBalancer": balancer, "privateLoadBalancer": balancer}}
            path = f"{base}/namespaces/{meta['namespace']}/ingresses/{meta['name']}/status"
            call("PATCH", path, patch, "application/merge-patch+json")
            print(f"ingress {meta['namespace']}/{meta['name']} ready at generation {generation}", flush=True)
    except (OSError, ValueError, KeyError) as error:
        print(f"ingress player: {error}", flush=True)
    time.sleep(0.5)
