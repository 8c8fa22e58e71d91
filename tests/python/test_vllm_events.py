"""KV events in vLLM's format read the way a Python vLLM subscriber reads them (pyzmq and the msgpack
library, independent of kvtier's encoder): a real server with `events.format: vllm` and bytes block
hashes; its batches decode to vLLM's BlockStored / AllBlocksCleared arrays naming exactly the
fingerprints put, on the live PUB stream and through the replay ROUTER with its end marker; a put with
the engine's block hashes and token ids is published under those hashes, with parents and tokens, from
put() and from put_ptrs(); blocks without engine hashes name their parents by fingerprint; replica
copies (replication_factor 3 on three servers) carry the same metadata."""

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
        put, parents = set(), {}
        for seed in range(3):
            fps = kvtier.fingerprints(ns, [(i * 31 + seed * 1009) % 50000 for i in range(6 * 4)])
            results = self.client.put(ns, fps, rng.integers(0, 256, size=(6, ns.block_bytes), dtype=np.uint8))
            self.assertTrue(all(r == kvtier.PutResult.STORED for r in results), results)
            put.update(fps)
            parents.update((fp, fps[i - 1] if i else None) for i, fp in enumerate(fps))

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
                        # parent_block_hash: the previous block of its prompt, by fingerprint as the
                        # block is named; None for a prompt's first block.
                        self.assertEqual(len(e[1]), 1)
                        self.assertEqual(e[2], parents.get(e[1][0], "never put"))
                        self.assertEqual(e[3:], [[], 4, None, "CPU", None])
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

    def stored_events(self, dealer, want):
        """{first block hash: BlockStored fields after the hashes} replayed from 0, once `want` are in."""
        deadline = time.monotonic() + 30
        while True:
            stored = {}
            for seq, payload in self.replay(dealer, 0):
                for e in msgpack.unpackb(payload, raw=False)[1]:
                    if e[0] == "BlockStored":
                        stored[e[1][0]] = e[2:6]
            if len(stored) >= want or time.monotonic() > deadline:
                return stored
            time.sleep(0.2)

    def test_put_ptrs_carries_engine_metadata_and_parent_fingerprint(self):
        dealer = self.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        ns = kvtier.Namespace("vllm-tenant", "ptrs-model", num_layers=2, num_kv_heads=2, head_dim=16, block_tokens=4)
        tokens = [(i * 13) % 50000 for i in range(4 * 4)]
        fps = kvtier.fingerprints(ns, tokens)
        pages = np.arange(4 * ns.block_bytes, dtype=np.uint64).astype(np.uint8).reshape(4, ns.block_bytes)
        ptrs = [pages[i].ctypes.data for i in range(4)]
        # Blocks 1..3 as an engine writing after a hit of block 0: SGLang-style signed hashes, the
        # parent's hash and fingerprint given for the first.
        hashes = [-(1 << 63) + i for i in range(4)]
        results = self.client.put_ptrs(ns, fps[1:], ptrs[1:], ns.block_bytes, first_block_index=1,
                                       block_hashes=hashes[1:], token_ids=[tokens[i * 4:(i + 1) * 4] for i in (1, 2, 3)],
                                       lora_id=7, parent_hash=hashes[0], parent_fingerprint=fps[0])
        self.assertTrue(all(r == kvtier.PutResult.STORED for r in results), results)
        # Without metadata, put_ptrs' blocks are named by fingerprint with fingerprint parents.
        results = self.client.put_ptrs(ns, fps[:1], ptrs[:1], ns.block_bytes)
        self.assertEqual(results, [kvtier.PutResult.STORED])
        with self.assertRaises(ValueError):
            self.client.put_ptrs(ns, fps[1:], ptrs[1:], ns.block_bytes, block_hashes=hashes[:1])
        with self.assertRaises(kvtier.InvalidArgumentError):
            self.client.put_ptrs(ns, fps[:1], ptrs[:1], ns.block_bytes, token_ids=[list(range(1025))])
        got = {h: got for h, got in self.stored_events(dealer, 4).items() if h in hashes or h in fps}
        self.assertEqual(got, {
            hashes[1]: [hashes[0], tokens[4:8], 4, 7],
            hashes[2]: [hashes[1], tokens[8:12], 4, 7],
            hashes[3]: [hashes[2], tokens[12:16], 4, 7],
            fps[0]: [None, [], 4, None],
        })
        out = np.zeros((4, ns.block_bytes), dtype=np.uint8)
        self.assertEqual(self.client.get(ns, fps, out), [kvtier.GetResult.HIT] * 4)
        np.testing.assert_array_equal(out, pages)

    def test_parent_fingerprint_names_the_first_blocks_parent(self):
        dealer = self.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        ns = kvtier.Namespace("vllm-tenant", "parent-model", num_layers=2, num_kv_heads=2, head_dim=16, block_tokens=4)
        fps = kvtier.fingerprints(ns, [(i * 17) % 50000 for i in range(3 * 4)])
        blocks = np.ones((2, ns.block_bytes), dtype=np.uint8)
        self.client.put(ns, fps[1:], blocks, first_block_index=1, parent_fingerprint=fps[0].hex())
        with self.assertRaises(ValueError):
            self.client.put(ns, fps[1:], blocks, parent_fingerprint=b"short")
        got = {h: v[0] for h, v in self.stored_events(dealer, 2).items() if h in fps}
        self.assertEqual(got, {fps[1]: fps[0], fps[2]: fps[1]})

    def test_sglang_adapter_publishes_sglangs_page_hashes(self):
        from sglang_standin import HiCacheStorageConfig, MHAHostPool, StandInController

        dealer = self.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        page = 4
        hashes = {}  # SGLang's event hash of each page -> [parent's, tokens, block size, lora id]
        for zero_copy in (True, False):
            extra = {"module_path": "kvtier.adapters.sglang", "class_name": "KvtierHiCacheStorage",
                     "interface_v1": 1 if zero_copy else 0, "members": [self.server.address],
                     "tenant": kvtier_cluster.unique("sgl-events"), "rpc_timeout_ms": 5000}
            pool = MHAHostPool(64, page, layer_num=2, head_num=2, head_dim=16)
            config = HiCacheStorageConfig(tp_rank=0, tp_size=1, is_mla_model=False, model_name="sgl-model",
                                          extra_config=dict(extra))
            controller = StandInController(extra, config, pool)
            self.addCleanup(controller.storage_backend.close)
            tokens = list(range(500 + 100 * zero_copy, 500 + 100 * zero_copy + 5 * page))
            keys = controller.page_hashes(tokens)
            # The first 3 pages, then the next 2 after them (prefix_keys: the tree path before them).
            idx = pool.alloc(5 * page)
            self.assertEqual(controller.backup(idx[:3 * page], tokens[:3 * page]), 3 * page)
            self.assertEqual(controller.backup(idx[3 * page:], tokens[3 * page:], prefix_keys=keys[:3]), 2 * page)
            event_hashes = [int(k[:16], 16) - (1 << 64) if int(k[:16], 16) >= (1 << 63) else int(k[:16], 16)
                            for k in keys]
            for i, h in enumerate(event_hashes):
                # The generic path (batch_set) has no prefix_keys: its batch's first page has no parent.
                parent = event_hashes[i - 1] if i and (zero_copy or i != 3) else None
                hashes[h] = [parent, [], 4, None]
        got = {h: v for h, v in self.stored_events(dealer, len(hashes)).items() if h in hashes}
        self.assertEqual(got, hashes)

    def test_vllm_connector_sends_hashes_tokens_and_lora_id(self):
        import types

        from vllm_standin import B, Request, StandInEngine

        dealer = self.ctx.socket(zmq.DEALER)
        self.addCleanup(dealer.close, 0)
        dealer.connect(f"tcp://127.0.0.1:{self.replay_port}")
        engine = StandInEngine({"members": [self.server.address], "tenant": kvtier_cluster.unique("vllm-lora"),
                                "rpc_timeout_ms": 5000, "load_deadline_ms": 5000, "step_budget_ms": 2000})
        self.addCleanup(engine.close)
        tokens = list(range(3000, 3000 + 3 * B + 3))
        request = Request("a", tokens, lora_request=types.SimpleNamespace(lora_name="sql-adapter", lora_int_id=5))
        request.block_hashes = [b"vllm-block-%d" % i for i in range(3)]  # vLLM's Request.block_hashes
        engine.run(request)
        self.assertTrue(engine.wait_idle(30))
        want = {request.block_hashes[i]: [request.block_hashes[i - 1] if i else None, tokens[i * B:(i + 1) * B], B, 5]
                for i in range(3)}
        got = {h: v for h, v in self.stored_events(dealer, 3).items() if h in want}
        self.assertEqual(got, want)


class ReplicaMetaTest(unittest.TestCase):
    """Replica copies carry their block's engine metadata: with replication_factor 3 on 3 servers, every
    server's vLLM stream names each block by the engine's hash, with its parent, tokens and LoRA id."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.replay_ports, self.servers = [], []
        for i in range(3):
            pub, replay = free_port(), free_port()
            config = os.path.join(self.dir.name, f"server{i}.yaml")
            with open(config, "w") as f:
                f.write("events:\n  enabled: true\n  format: vllm\n"
                        f"  vllm_pub_endpoint: tcp://127.0.0.1:{pub}\n"
                        f"  vllm_replay_endpoint: tcp://127.0.0.1:{replay}\n"
                        "  vllm_block_size: 4\n  vllm_block_hash: bytes\n")
            self.replay_ports.append(replay)
            self.servers.append(kvtier_cluster.Server(kvtier_cluster.unique(f"replica{i}"), self.dir.name,
                                                      extra_args=[f"--config={config}"]))
        self.client = kvtier.Client([s.address for s in self.servers], transport="grpc", rpc_timeout=5,
                                    replication_factor=3)
        self.ctx = zmq.Context()

    def tearDown(self):
        self.client.close()
        self.ctx.destroy(linger=0)
        for s in self.servers:
            s.stop()
        self.dir.cleanup()

    def test_every_replica_publishes_the_engine_metadata(self):
        ns = kvtier.Namespace("vllm-tenant", "replica-model", num_layers=2, num_kv_heads=2, head_dim=16,
                              block_tokens=4)
        tokens = [(i * 11) % 50000 for i in range(8 * 4)]
        fps = kvtier.fingerprints(ns, tokens)
        hashes = [b"replica-hash-%d" % i for i in range(8)]
        results = self.client.put(ns, fps, np.full((8, ns.block_bytes), 3, dtype=np.uint8), block_hashes=hashes,
                                  token_ids=[tokens[i * 4:(i + 1) * 4] for i in range(8)], lora_id=11)
        self.assertTrue(all(r == kvtier.PutResult.STORED for r in results), results)
        self.client.flush_replicas(30)
        want = {hashes[i]: [hashes[i - 1] if i else None, tokens[i * 4:(i + 1) * 4], 4, 11] for i in range(8)}
        for server, port in zip(self.servers, self.replay_ports):
            dealer = self.ctx.socket(zmq.DEALER)
            self.addCleanup(dealer.close, 0)
            dealer.connect(f"tcp://127.0.0.1:{port}")
            deadline = time.monotonic() + 30
            while True:
                stored = {}
                dealer.send_multipart([b"", (0).to_bytes(8, "big")])
                while True:
                    self.assertTrue(dealer.poll(30000), "no end marker within 30 s")
                    _, seq, payload = dealer.recv_multipart()
                    if seq == END_SEQ:
                        break
                    for e in msgpack.unpackb(payload, raw=False)[1]:
                        if e[0] == "BlockStored":
                            stored[e[1][0]] = e[2:6]
                if len(stored) >= 8 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            self.assertEqual(stored, want, server.node_id)


if __name__ == "__main__":
    unittest.main()
