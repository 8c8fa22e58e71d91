"""examples/router/kv_router.py against three real servers publishing vLLM-format KV events: a workload
with evictions (a 1 MiB host tier over a 2 MiB disk tier, so blocks are demoted to disk and dropped
from it), promotions (reads of disk blocks) and a filtered evict, while the router's subscriber to one
server is stalled (its SUB socket closed) and then resumes through the replay socket, and to another
is stalled and resumes live, finding the gap on the next batch and replaying then. Afterwards the
router's index of every server equals the server's block list (`kvtierctl ls`), media included, and its
prefix scores equal each server's /query answer; and again after one server is restarted
(a new instance numbering its batches from 0, restating the blocks it recovered from disk)."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import numpy as np

import kvtier
import kvtier_cluster

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "router"))
import kv_router  # noqa: E402  (the example: pyzmq and msgpack only)

MEDIUM = {"host": "CPU", "disk": "DISK", "hbm": "GPU"}


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ctl(*args):
    out = subprocess.run([os.environ["KVTIER_CTL_BINARY"], *args], capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout


class RouterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.servers, self.endpoints = [], {}
        for name in ("router-a", "router-b", "router-c"):
            pub, replay = free_port(), free_port()
            config = os.path.join(self.dir.name, f"{name}.yaml")
            with open(config, "w") as f:
                f.write("events:\n  enabled: true\n  format: vllm\n"
                        f"  vllm_pub_endpoint: tcp://127.0.0.1:{pub}\n"
                        f"  vllm_replay_endpoint: tcp://127.0.0.1:{replay}\n"
                        "  vllm_block_size: 16\n  vllm_block_hash: bytes\n")
            s = kvtier_cluster.Server(name, self.dir.name, host_cache_bytes="1MiB", extra_args=[
                f"--config={config}", "--slab_bytes=128KiB", "--max_block_bytes=128KiB",
                f"--disk_path={self.dir.name}/{name}-disk", "--disk_capacity_bytes=2MiB",
                "--metrics_address=127.0.0.1:0"])
            self.servers.append(s)
            self.endpoints[name] = (f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
        self.client = kvtier.Client([s.address for s in self.servers], transport="grpc", rpc_timeout=5)
        self.ns = kvtier.Namespace("router-tenant", "router-model", num_layers=2, num_kv_heads=2, head_dim=64,
                                   block_tokens=16)  # 16 KiB blocks: 64 fit in a host tier
        self.rng = np.random.default_rng(7)

    def tearDown(self):
        self.client.close()
        for s in self.servers:
            s.stop()
        self.dir.cleanup()

    def put_prompt(self, seed, blocks):
        tokens = [(seed * 7919 + i * 31) % 50000 for i in range(blocks * 16)]
        fps = kvtier.fingerprints(self.ns, tokens)
        data = self.rng.integers(0, 256, size=(blocks, self.ns.block_bytes), dtype=np.uint8)
        self.client.put(self.ns, fps, data)
        return tokens, fps

    def server_blocks(self, server):
        code, out = ctl("--members", server.address, "--json", "ls", "--limit", "0")
        self.assertEqual(code, 0, out)
        return {bytes.fromhex(b["fingerprint"]): MEDIUM[b["tier"]] for b in json.loads(out)["blocks"]}

    def metrics_port(self, server):
        with open(server.port_file) as f:
            return int(f.read().split()[1])

    def test_index_equals_every_servers_blocks_after_a_stall_caught_up_by_replay(self):
        router = kv_router.KvRouter(self.endpoints)
        self.addCleanup(router.close)
        time.sleep(0.3)  # the SUB subscriptions reach the servers; what they miss, replay has
        for name in self.endpoints:
            router.catch_up(name)

        prompts = []
        for seed in range(6):  # 6 x 40 blocks over 3 servers of 64 host slots: demotions
            prompts.append(self.put_prompt(seed, 40))
            router.poll(0)
        router.pause("router-b")  # stalled: what router-b publishes now is lost to its socket
        router.pause("router-c")  # also stalled; it resumes without replaying: the next batch shows a gap
        for seed in range(6, 14):  # more demotions, and disk evictions (2 MiB of disk each)
            prompts.append(self.put_prompt(seed, 40))
            router.poll(0)
        for tokens, fps in prompts[6:9]:  # reads of disk blocks promote them to host
            out = np.zeros((len(fps), self.ns.block_bytes), dtype=np.uint8)
            self.client.get(self.ns, fps, out)
        code, out = ctl("--members", self.servers[1].address, "evict", "--tier", "disk")
        self.assertEqual(code, 0, out)
        router.poll(100)
        seq_before = router.index["router-b"].next_seq
        recovered = router.resume("router-b")  # reopens the socket, replays from the seq it expected
        self.assertGreater(recovered, 0, "the stall should have cost router-b's socket some batches")
        self.assertEqual(router.index["router-b"].next_seq, seq_before + recovered)
        router.resume("router-c", replay=False)
        for seed in range(14, 16):
            prompts.append(self.put_prompt(seed, 40))
            router.poll(0)
        router.poll(300)
        self.assertGreater(router.index["router-c"].gaps, 0, "router-c's first live batch should show the gap")

        # Quiet now: catch every server up (a lost tail is found only this way) and drain the sockets.
        for name in self.endpoints:
            router.catch_up(name)
        router.poll(300)

        disk_total = 0
        for server in self.servers:
            want = self.server_blocks(server)
            disk_total += sum(1 for m in want.values() if m == "DISK")
            idx = router.index[server.node_id]
            self.assertFalse(idx.stale, server.node_id)
            got = router.snapshot(server.node_id)
            self.assertEqual(len(got), len(want), server.node_id)
            self.assertEqual(got, want, server.node_id)
        self.assertGreater(disk_total, 0, "the workload should have demoted blocks to disk")
        self.assertLess(sum(len(router.snapshot(n)) for n in self.endpoints), 16 * 40,
                        "the workload should have evicted blocks")

        # Scores agree with each server's own /query answer for the same prompts.
        for tokens, fps in prompts[::3]:
            scores = router.score(fps)
            body = json.dumps({"namespace": {"tenant": "router-tenant", "model": "router-model",
                                             "layout": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64,
                                                        "block_tokens": 16}},
                               "token_ids": tokens}).encode()
            for server in self.servers:
                req = urllib.request.Request(f"http://127.0.0.1:{self.metrics_port(server)}/query", data=body,
                                             method="POST")
                with urllib.request.urlopen(req, timeout=10) as r:
                    answer = json.loads(r.read())
                self.assertEqual(scores[server.node_id][0], answer["longest_matched"]["blocks"], server.node_id)
        ranked = router.rank(prompts[-1][1])
        self.assertEqual(len(ranked), 3)
        self.assertGreaterEqual(ranked[0][1], ranked[-1][1])

        # A restart: the new instance numbers from 0 again and restates the blocks it recovered
        # from disk. The router finds the anchor of its catch-up changed, and starts over.
        self.servers[0].restart()
        time.sleep(0.5)
        router.poll(300)
        for name in self.endpoints:
            router.catch_up(name)
        router.poll(300)
        self.assertGreater(router.index["router-a"].restarts, 0)
        for server in self.servers:
            want = self.server_blocks(server)
            self.assertEqual(router.snapshot(server.node_id), want, server.node_id)
        self.assertTrue(all(m == "DISK" for m in router.snapshot("router-a").values()))
        self.assertGreater(len(router.snapshot("router-a")), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
