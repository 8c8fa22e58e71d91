"""KV events in vLLM's format read the way a Python vLLM subscriber reads them (pyzmq and the msgpack
library, independent of kvtier's encoder): a real server with `events.format: vllm` and bytes block
hashes; its batches decode to vLLM's BlockStored / AllBlocksCleared arrays naming exactly the
fingerprints put, on the live PUB stream and through the replay ROUTER with its end marker; a put with
the engine's block hashes and token ids is published under those hashes, with parents and tokens."""

import os
import socket
import tempfile
import time
import unittest

import msgpack
import numpy as np
import zmq

import kvtier
import kvtier_cluster

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmEventsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.pub_port, self.replay_port = free_port(), free_port()
        config = os.path.join(self.dir.name, "server.yaml")
        with open(config, "w") as f:
            f.write("events:\n  enabled: true\n  format: vllm\n"
                    f"  vllm_pub_endpoint: tcp://127.0.0.1:{self.pub_port}\n"
                    f"  vllm_replay_endpoint: tcp://127.0.0.1:{self.replay_port}\n"
                    "  vllm_block_size: 4\n  vllm_block_hash: bytes\n")
        self.server = kvtier_cluster.Server(kvtier_cluster.unique("vllm"), self.dir.name,
                                            extra_args=[f"--config={config}"])
        self.client = kvtier.Client([self.server.address], transport="grpc", rpc_timeout=5)
        self.ctx = zmq.Context()

    def tearDown(self):
        self.client.close()
        self.ctx.destroy(linger=0)
        self.server.stop()
        self.dir.cleanup()

    def replay(self, dealer, start):
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            self.assertTrue(dealer.poll(30000), "no end marker within 30 s")
            empty, seq, payload = dealer.recv_multipart()
            self.assertEqual(empty, b"")
            if seq == END_SEQ:
                self.assertEqual(payload, b"")
                return out
            out.append((int.from_bytes(seq, "big"), payload))

    def test_stream_and_replay_decode_as_vllm_batches(self):
        sub = self.ctx.socket(zmq.SUB)
        self.addCleanup(sub.close, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{self.pub_port}")
        dealer = self.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        time.sleep(0.3)  # lets the SUB's subscription reach the server; what it misses, replay has

        ns = kvtier.Namespace("vllm-tenant", "vllm-model", num_layers=2, num_kv_heads=2, head_dim=16, block_tokens=4)
        rng = np.random.default_rng(3)
        put = set()
        for seed in range(3):
            fps = kvtier.fingerprints(ns, [(i * 31 + seed * 1009) % 50000 for i in range(6 * 4)])
            results = self.client.put(ns, fps, rng.integers(0, 256, size=(6, ns.block_bytes), dtype=np.uint8))
            self.assertTrue(all(r == kvtier.PutResult.STORED for r in results), results)
            put.update(fps)

        deadline = time.monotonic() + 60
        while True:
            batches = self.replay(dealer, 0)
            stored, tags = set(), []
            for seq, payload in batches:
                ts, events, dp_rank = msgpack.unpackb(payload, raw=False)
                self.assertIsInstance(ts, float)
                self.assertEqual(dp_rank, 0)
                for e in events:
                    tags.append(e[0])
                    if e[0] == "BlockStored":
                        self.assertEqual(e[2:], [None, [], 4, None, "CPU", None])
                        stored.update(e[1])
            if stored == put or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(stored, put)
        self.assertEqual(tags[0], "AllBlocksCleared")
        self.assertEqual(tags.count("BlockStored"), len(put))
        self.assertEqual([s for s, _ in batches], list(range(len(batches))))

        last = batches[-1][0]
        live = {}
        while last not in live:
            self.assertTrue(sub.poll(30000), f"the SUB got nothing within 30 s; seqs so far {sorted(live)}")
            topic, seq, payload = sub.recv_multipart()
            self.assertEqual(topic, b"")
            live[int.from_bytes(seq, "big")] = payload
        for seq, payload in live.items():
            self.assertEqual(payload, batches[seq][1])


    def test_put_with_engine_hashes_and_tokens(self):
        dealer = self.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        ns = kvtier.Namespace("vllm-tenant", "meta-model", num_layers=2, num_kv_heads=2, head_dim=16, block_tokens=4)
        tokens = [(i * 7) % 50000 for i in range(3 * 4)]
        fps = kvtier.fingerprints(ns, tokens)
        hashes = [b"engine-hash-%d" % i for i in range(3)]
        blocks = np.zeros((3, ns.block_bytes), dtype=np.uint8)
        results = self.client.put(ns, fps, blocks, block_hashes=hashes,
                                  token_ids=[tokens[i * 4:(i + 1) * 4] for i in range(3)], lora_id=5,
                                  parent_hash=-9)
        self.assertTrue(all(r == kvtier.PutResult.STORED for r in results), results)
        with self.assertRaises(kvtier.InvalidArgumentError):
            self.client.put(ns, fps[:1], blocks[:1], token_ids=[list(range(1025))])
        with self.assertRaises(ValueError):
            self.client.put(ns, fps, blocks, block_hashes=hashes[:2])

        deadline = time.monotonic() + 30
        while True:
            stored = {}
            for seq, payload in self.replay(dealer, 0):
                for e in msgpack.unpackb(payload, raw=False)[1]:
                    if e[0] == "BlockStored":
                        stored[e[1][0]] = e[2:6]
            if len(stored) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(stored, {
            hashes[0]: [-9, tokens[0:4], 4, 5],
            hashes[1]: [hashes[0], tokens[4:8], 4, 5],
            hashes[2]: [hashes[1], tokens[8:12], 4, 5],
        })


if __name__ == "__main__":
    unittest.main()
