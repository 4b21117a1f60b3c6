# Plays the pods' containers on the test control plane, as kwok plays the
# kubelet: every Ready pod answers HTTP on its pod IP, on each port its
# containers declare and each numeric targetPort of a Service, with
#   {"pod": "<name>", "image": "<first container's image>", "headers": {x-*}}
# (the request's headers named x-*, as the pod received them, but for the
# gateway's own x-forwarded-* and x-real-ip).
# A pod labelled gitcanary.test/http-status: "503" answers with that status;
# gitcanary.test/latency-ms: "200" delays its answers. It runs in the pod
# network namespace (gateway-up.sh), where every pod address is local: it
# listens on all of them at once, and the address a connection came to
# names the pod. A pod answers from when it runs (Ready or not) until it is
# deleted, and for GRACE seconds more, as a real one finishes its requests
# after its endpoints moved. A Knative pod's queue-proxy container also
# answers the autoscaler's scrape (port 9090, protobuf) with its requests in
# flight and since the last scrape, as the real queue-proxy reports them.
#   python3 pod-player.py STATE_DIR API_HOST API_PORT
import asyncio, json, socket, ssl, struct, sys, threading, time
import http.client

state, api_host, api_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
GRACE = 30.0  # terminationGracePeriodSeconds by default
context = ssl.create_default_context(cafile=f"{state}/pki/ca.crt")
context.load_cert_chain(f"{state}/pki/admin.crt", f"{state}/pki/admin.key")

pods = {}  # ip -> {"pod", "image", "status", "latency", "gone_at", "queue", "started", "in_flight", "served"}
listening = set()
pod_ports = set()


class Api(http.client.HTTPSConnection):
    """The API server through the forwarder; its certificate names localhost."""

    def connect(self):
        raw = socket.create_connection((api_host, api_port), self.timeout)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")


def listener(number):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", number))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def get(path):
    connection = Api("localhost", api_port, context=context, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return json.loads(data) if response.status == 200 else {}


def number(labels, name, default):
    try:
        return int(labels.get(name, default))
    except ValueError:
        return default


def info(pod):
    containers = pod.get("spec", {}).get("containers") or [{}]
    labels = pod["metadata"].get("labels") or {}
    return {
        "pod": pod["metadata"]["name"],
        "image": containers[0].get("image", ""),
        "status": number(labels, "gitcanary.test/http-status", 200),
        "latency": number(labels, "gitcanary.test/latency-ms", 0) / 1000.0,
        "gone_at": None,
        "queue": any(c.get("name") == "queue-proxy" for c in containers),
        "started": time.time(),
        "in_flight": 0,
        "served": 0,
    }


QUEUE_METRICS_PORT = 9090  # knative.dev/networking's AutoscalingQueueMetricsPort
PROTOBUF = b"application/protobuf"


def varint(n):
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def queue_stat(pod):
    """Knative's metrics.Stat: pod_name, average (proxied) concurrency,
    (proxied) request count, process uptime, timestamp."""
    name = pod["pod"].encode()
    concurrency, served = float(pod["in_flight"]), float(pod["served"])
    pod["served"] = 0
    doubles = (concurrency, 0.0, served, 0.0, time.time() - pod["started"])
    body = b"\x0a" + varint(len(name)) + name
    for field, value in enumerate(doubles, start=2):
        body += bytes([field << 3 | 1]) + struct.pack("<d", value)
    return body + b"\x38" + varint(int(time.time()))


def serving(pod):
    """A pod whose containers run answers, Ready or not, until it is deleted."""
    status = pod.get("status", {})
    return bool(status.get("podIP")) and status.get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def seen(event, pod):
    for container in pod.get("spec", {}).get("containers") or []:
        for p in container.get("ports") or []:
            if isinstance(p.get("containerPort"), int):
                pod_ports.add(p["containerPort"])
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        return
    known = pods.get(ip)
    if event != "DELETED" and serving(pod):
        fresh = info(pod)
        if known is not None and known["pod"] == fresh["pod"]:
            # The same pod again: its requests in flight go on counting.
            known.update({k: v for k, v in fresh.items() if k not in ("started", "in_flight", "served")})
        else:
            pods[ip] = fresh
    elif known is not None and known["pod"] == pod["metadata"]["name"] and known["gone_at"] is None:
        known["gone_at"] = time.monotonic()


def watch_pods():
    """Lists, then watches, every pod: a pod answers as soon as it runs."""
    while True:
        try:
            listing = get("/api/v1/pods")
            for pod in listing.get("items", []):
                seen("ADDED", pod)
            version = listing["metadata"]["resourceVersion"]
            connection = Api("localhost", api_port, context=context, timeout=330)
            connection.request("GET", f"/api/v1/pods?watch=1&resourceVersion={version}&timeoutSeconds=300")
            response = connection.getresponse()
            while line := response.readline():
                event = json.loads(line)
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    seen(event["type"], event["object"])
            connection.close()
        except Exception as error:  # the API server restarts in some tests
            print(f"pod-player: watch: {error}", file=sys.stderr)
            time.sleep(1)


def wanted_ports():
    """Every containerPort of a pod and numeric targetPort of a Service."""
    ports = set(pod_ports)
    for service in get("/api/v1/services").get("items", []):
        for p in service.get("spec", {}).get("ports") or []:
            target = p.get("targetPort", p.get("port"))
            if isinstance(target, int):
                ports.add(target)
    now = time.monotonic()
    for ip, known in list(pods.items()):
        if known["gone_at"] is not None and now - known["gone_at"] > GRACE:
            pods.pop(ip, None)
    return ports


# What the gateway adds to every request: not the client's, not echoed.
GATEWAY_HEADERS = (b"x-forwarded-", b"x-real-ip")


async def answer(reader, writer):
    ip, port = writer.get_extra_info("sockname")[:2]
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length, seen = 0, {}
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value.strip() or 0)
                elif name.startswith(b"x-") and not name.startswith(GATEWAY_HEADERS):
                    seen[name.decode("latin-1")] = value.strip().decode("latin-1")
            if length:
                await reader.readexactly(length)
            pod = pods.get(ip)
            if pod is None:
                break  # no pod there: the connection is dropped
            if pod["queue"] and port == QUEUE_METRICS_PORT and PROTOBUF in head.lower():
                body = queue_stat(pod)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (PROTOBUF, len(body)) + body)
                await writer.drain()
                continue
            pod["in_flight"] += 1
            try:
                if pod["latency"]:
                    await asyncio.sleep(pod["latency"])
                body = json.dumps({"pod": pod["pod"], "image": pod["image"], "headers": seen}).encode()
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % (pod["status"], len(body))
                    + body
                )
                await writer.drain()
            finally:
                pod["in_flight"] -= 1
                pod["served"] += 1
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main():
    threading.Thread(target=watch_pods, daemon=True).start()
    while True:
        try:
            wanted = await asyncio.to_thread(wanted_ports)
            for number in sorted(wanted - listening):
                try:
                    await asyncio.start_server(answer, sock=listener(number))
                    listening.add(number)
                except OSError as error:
                    print(f"pod-player: cannot listen on {number}: {error}", file=sys.stderr)
                    listening.add(number)
        except Exception as error:  # the API server restarts in some tests
            print(f"pod-player: {error}", file=sys.stderr)
        await asyncio.sleep(2)


asyncio.run(main())
