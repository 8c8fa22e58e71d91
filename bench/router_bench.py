#!/usr/bin/env python3
"""What routers cost a kvtier cluster: KV events published per second during a put burst and the
publisher's share of the servers' CPU, and the index query API's latency for 1K- and 128K-token prompts.

Two 3-server clusters on 127.0.0.1 take the same put burst in the same run: one publishing vLLM-format
events (a subscriber counts them), one without events; the servers' CPU time (utime + stime from
/proc/PID/stat) over the burst gives the publisher's cost as CPU microseconds per event and as a share
of the burst's server CPU. Then /query (token ids) and /query_by_hash-free lookups of a cached 1K-token
and 128K-token prompt are timed against one server of the first cluster.

    PYTHONPATH=build/bindings/python KVTIER_BINARY_DIR=build python3 bench/router_bench.py [--json]

Needs the kvtier Python module, numpy, pyzmq and msgpack (Debian: python3-numpy, python3-zmq,
python3-msgpack). Figures and how to read them: bench/README.md, "router_bench".
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request

import msgpack
import numpy as np
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
import kvtier  # noqa: E402
import kvtier_cluster  # noqa: E402

LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_tokens": 16}  # 16 KiB blocks


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cluster:
    def __init__(self, workdir, prefix, events):
        self.servers, self.pubs = [], []
        for i in range(3):
            name = f"{prefix}-{i}"
            args = ["--metrics_address=127.0.0.1:0"]
            if events:
                pub, replay = free_port(), free_port()
                config = os.path.join(workdir, f"{name}.yaml")
                with open(config, "w") as f:
                    f.write("events:\n  enabled: true\n  format: vllm\n"
                            f"  vllm_pub_endpoint: tcp://127.0.0.1:{pub}\n"
                            f"  vllm_replay_endpoint: tcp://127.0.0.1:{replay}\n"
                            "  vllm_block_size: 16\n  vllm_block_hash: bytes\n")
                args.append(f"--config={config}")
                self.pubs.append(f"tcp://127.0.0.1:{pub}")
            self.servers.append(kvtier_cluster.Server(name, workdir, host_cache_bytes="512MiB",
                                                      extra_args=args))
        self.client = kvtier.Client([s.address for s in self.servers], transport="grpc", rpc_timeout=10)

    def cpu(self):
        return sum(cpu_seconds(s.process.pid) for s in self.servers)

    def http_port(self, server):
        with open(server.port_file) as f:
            return int(f.read().split()[1])

    def stop(self):
        self.client.close()
        for s in self.servers:
            s.stop()


def count_events(sub, until):
    stored = 0
    while time.monotonic() < until:
        if not sub.poll(100):
            continue
        frames = sub.recv_multipart()
        batch = msgpack.unpackb(frames[-1], raw=False)
        events = batch[1] if isinstance(batch, list) else batch.get("events", [])
        for event in events:
            tag = event[0] if isinstance(event, list) else event.get("type")
            if tag == "BlockStored":
                stored += len(event[1] if isinstance(event, list) else event.get("block_hashes", []))
    return stored


def burst(cluster, ns, prompts, rng):
    """Puts every prompt's blocks; returns (seconds, server CPU seconds)."""
    cpu0, t0 = cluster.cpu(), time.monotonic()
    for tokens in prompts:
        fps = kvtier.fingerprints(ns, tokens)
        data = rng.integers(0, 256, size=(len(fps), ns.block_bytes), dtype=np.uint8)
        cluster.client.put(ns, fps, data)
    return time.monotonic() - t0, cluster.cpu() - cpu0


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=200, help="prompts of the put burst")
    parser.add_argument("--prompt_blocks", type=int, default=64, help="blocks per prompt of the burst")
    parser.add_argument("--queries", type=int, default=30, help="queries per prompt size")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ns = kvtier.Namespace("bench-tenant", "bench-model", **LAYOUT)
    rng = np.random.default_rng(11)
    prompts = [[(p * 7919 + i * 31) % 50000 for i in range(args.prompt_blocks * 16)] for p in range(args.prompts)]
    report = {"prompts": args.prompts, "prompt_blocks": args.prompt_blocks, "block_bytes": ns.block_bytes}
    with tempfile.TemporaryDirectory() as workdir:
        plain = Cluster(workdir, "plain", events=False)
        cluster = Cluster(workdir, "events", events=True)
        try:
            ctx = zmq.Context()
            sub = ctx.socket(zmq.SUB)
            for endpoint in cluster.pubs:
                sub.connect(endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            time.sleep(0.5)  # the subscriptions reach the publishers
            # A warm-up burst on each, then the measured bursts alternate between the two clusters, so
            # that neither gets the machine's quiet moments.
            warm = [[(p * 104729 + i * 17) % 50000 for i in range(args.prompt_blocks * 16)] for p in range(20)]
            burst(plain, ns, warm, rng)
            burst(cluster, ns, warm, rng)
            count_events(sub, time.monotonic() + 1.0)
            totals = {"plain": [0.0, 0.0], "events": [0.0, 0.0]}
            rounds = 3
            for r in range(rounds):
                batch = [[t + r * 50000 for t in tokens] for tokens in prompts]
                for name, c in (("plain", plain), ("events", cluster)):
                    secs, cpu = burst(c, ns, batch, rng)
                    totals[name][0] += secs
                    totals[name][1] += cpu
            events = count_events(sub, time.monotonic() + 2.0)  # what was published, drained
            (base_s, base_cpu), (secs, cpu) = totals["plain"], totals["events"]
            report["rounds"] = rounds
            report["without_events"] = {"seconds": base_s, "server_cpu_s": base_cpu}
            report["with_events"] = {
                "seconds": secs, "server_cpu_s": cpu, "blocks_stored_events": events,
                "events_per_s": events / secs,
                "publisher_cpu_us_per_event": (cpu - base_cpu) / max(events, 1) * 1e6,
                "publisher_cpu_share": (cpu - base_cpu) / cpu if cpu > 0 else 0.0,
            }
            sub.close()
            ctx.term()
            # Queries against one server: a cached 1K-token prompt and a cached 128K-token prompt.
            long_tokens = [(i * 13 + 5) % 50000 for i in range(128 * 1024)]
            fps = kvtier.fingerprints(ns, long_tokens)
            for start in range(0, len(fps), 512):
                chunk = fps[start:start + 512]
                cluster.client.put(ns, chunk, rng.integers(0, 256, size=(len(chunk), ns.block_bytes), dtype=np.uint8))
            port = cluster.http_port(cluster.servers[0])
            namespace = {"tenant": "bench-tenant", "model": "bench-model", "layout": LAYOUT}
            for label, tokens in (("1k", long_tokens[:1024]), ("128k", long_tokens)):
                body = json.dumps({"namespace": namespace, "token_ids": tokens}).encode()
                times, matched = [], 0
                for _ in range(args.queries):
                    req = urllib.request.Request(f"http://127.0.0.1:{port}/query", data=body, method="POST")
                    t0 = time.monotonic()
                    with urllib.request.urlopen(req, timeout=30) as r:
                        matched = json.loads(r.read())["longest_matched"]["blocks"]
                    times.append((time.monotonic() - t0) * 1e3)
                report[f"query_{label}_ms"] = {"p50": statistics.median(times), "p99": percentile(times, 99),
                                              "blocks": len(tokens) // 16, "matched_on_this_server": matched}
        finally:
            plain.stop()
            cluster.stop()
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
