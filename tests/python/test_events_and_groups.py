"""kvtier.EventSubscriber and the similarity groups against three real servers with KV events on: the
subscriber's index equals what each server holds (asked one server at a time), survives a pause, and
reports every counter; a prompt's group key computed in Python is the key the servers count its lookups
under (kvtierctl groups), and MinHasher / SimilarityIndex group similar prompts and keep others apart."""

import json
import os
import subprocess
import time
import unittest

import numpy as np

import kvtier
import kvtier_cluster

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EVENTS_H = os.path.join(SOURCE_DIR, "client_lib", "include", "kvtier", "client", "event_subscriber.h")


def kvtierctl_binary():
    path = os.environ.get("KVTIER_CTL_BINARY")
    if not path:
        path = os.path.join(os.path.dirname(kvtier_cluster.server_binary()), "..", "cli", "kvtierctl")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"kvtierctl not found at {path}: build it, or set KVTIER_CTL_BINARY")
    return path


def small_namespace(tenant):
    return kvtier.Namespace(tenant, "events-model", num_layers=2, num_kv_heads=2, head_dim=16, block_tokens=4)


def prompt(n_blocks, seed):
    return [(i * 7919 + seed * 104729) % 50000 for i in range(n_blocks * 4)]


def blocks(ns, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, ns.block_bytes), dtype=np.uint8)


class EventSubscriberTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = kvtier_cluster.Cluster(3, prefix="events", events=True)
        cls.client = kvtier.Client(cls.cluster.members, transport="grpc", rpc_timeout=5)
        # One client per server: the truth of what each one holds.
        cls.single = {s.node_id: kvtier.Client([s.address], transport="grpc", rpc_timeout=5) for s in cls.cluster.servers}

    @classmethod
    def tearDownClass(cls):
        for c in [cls.client] + list(cls.single.values()):
            c.close()
        cls.cluster.stop()

    def put_prompts(self, ns, seeds, n_blocks=6):
        chains = []
        for seed in seeds:
            fps = kvtier.fingerprints(ns, prompt(n_blocks, seed))
            results = self.client.put(ns, fps, blocks(ns, n_blocks, seed))
            self.assertTrue(all(r == kvtier.PutResult.STORED for r in results), results)
            chains.append(fps)
        return chains

    def held(self, ns, fps):
        """node id -> per-block presence on that node."""
        return {node: c.lookup_detail(ns, fps).present for node, c in self.single.items()}

    def assert_index_matches_servers(self, sub, ns, chains):
        for fps in chains:
            held = self.held(ns, fps)
            for i, fp in enumerate(fps):
                self.assertEqual(sub.nodes_holding(fp), sorted(n for n, p in held.items() if p[i]))
            want = []
            for node, present in held.items():
                run = next((i for i, p in enumerate(present) if not p), len(present))
                if run > 0:
                    want.append((node, run))
            self.assertEqual(sorted(sub.prefix_match(ns, fps)), sorted(want))
            self.assertEqual(sorted(sub.prefix_match(ns.id, fps)), sorted(want))

    def test_index_equals_what_each_server_holds(self):
        ns = small_namespace(kvtier_cluster.unique("ev"))
        with kvtier.EventSubscriber(self.cluster.members, rpc_timeout=5) as sub:
            chains = self.put_prompts(ns, range(4))
            sub.wait_for_catch_up(10)
            self.assert_index_matches_servers(sub, ns, chains)
            mine = {bytes(fp) for fps in chains for fp in fps}
            seen = 0
            for node in self.single:
                for b in sub.blocks_of(node):
                    if b["fingerprint"] not in mine:
                        continue  # another test's blocks
                    seen += 1
                    self.assertEqual((b["namespace_id"], b["size_bytes"], b["shard"], b["tier"]),
                                     (ns.id, ns.block_bytes, 0, "host"))
                    depth = next(fps.index(b["fingerprint"]) for fps in chains if b["fingerprint"] in fps)
                    self.assertEqual(b["depth"], depth)
            self.assertEqual(seen, len(mine))
            self.assertEqual(sub.blocks_of("no-such-node"), [])
            nodes = sub.nodes()
            self.assertEqual([n["address"] for n in nodes], self.cluster.members)
            self.assertEqual(sorted(n["node_id"] for n in nodes), sorted(self.single))
            self.assertTrue(all(n["synced"] and n["instance_id"] != 0 and n["applied_seq"] > 0 for n in nodes))

    def test_a_paused_subscriber_catches_up(self):
        ns = small_namespace(kvtier_cluster.unique("ev-pause"))
        with kvtier.EventSubscriber(",".join(self.cluster.members), retry_interval_ms=100) as sub:
            sub.wait_for_catch_up(10)
            before = sub.stats()
            sub.pause()
            time.sleep(1.0)  # pause() takes effect at the reader's next turn (it polls every 100 ms)
            chains = self.put_prompts(ns, range(10, 13))
            self.assertEqual(sub.nodes_holding(chains[0][0]), [])  # nothing read while paused
            sub.resume()
            sub.wait_for_catch_up(10)
            self.assert_index_matches_servers(sub, ns, chains)
            after = sub.stats()
            self.assertGreater(after["gaps"], before["gaps"])  # the lost messages were noticed ...
            self.assertGreater(after["replays"] + after["snapshots"], before["replays"] + before["snapshots"])  # ... and caught up

    def test_stats_have_every_counter_of_event_subscriber_stats(self):
        with open(EVENTS_H) as f:
            header = f.read()
        body = header[header.index("struct EventSubscriberStats {"):]
        body = body[:body.index("};")]
        counters = [line.split()[1] for line in body.splitlines() if line.strip().startswith("uint64_t ")]
        self.assertEqual(len(counters), 8)
        with kvtier.EventSubscriber(self.cluster.members) as sub:
            sub.wait_for_catch_up(10)
            stats = sub.stats()
        self.assertEqual(list(stats), counters)
        self.assertGreater(stats["events_applied"], 0)  # at least each server's seq 1 (AllBlocksCleared)
        self.assertGreaterEqual(stats["replays"] + stats["snapshots"], 3)  # the first catch-up of each

    def test_bad_options_and_closed_subscribers(self):
        with self.assertRaisesRegex(TypeError, "unknown option 'timeout'"):
            kvtier.EventSubscriber(self.cluster.members, timeout=3)
        with self.assertRaises(kvtier.InvalidArgumentError):
            kvtier.EventSubscriber([])
        sub = kvtier.EventSubscriber(self.cluster.members)
        sub.close()
        self.assertTrue(sub.closed)
        with self.assertRaises(kvtier.Error):
            sub.nodes()


class SimilarityGroupsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.members = kvtier_cluster.shared_members()

    def groups(self):
        out = subprocess.run([kvtierctl_binary(), "--members", ",".join(self.members), "--json", "groups",
                              "--limit", "0"], check=True, capture_output=True, text=True).stdout
        return {g["group_key"]: g for g in json.loads(out)["groups"]}

    def test_servers_count_lookups_under_the_key_computed_in_python(self):
        ns = small_namespace(kvtier_cluster.unique("groups"))
        fps = kvtier.fingerprints(ns, prompt(12, 99))
        key = kvtier.prompt_group_key(fps)
        self.assertNotEqual(key, 0)
        self.assertEqual(key, kvtier.prompt_group_key(kvtier.fingerprints(ns, prompt(12, 99), as_numpy=True)))
        # The default hasher's affinity key of the fingerprints' items, as similarity.h defines it.
        self.assertEqual(key, kvtier.MinHasher().affinity_key(kvtier.items_from_fingerprints(fps)))
        with kvtier.Client(self.members, transport="grpc") as c:
            c.put(ns, fps[:5], blocks(ns, 5, 1))
            for _ in range(3):
                self.assertEqual(c.lookup(ns, fps), 5)
        group = self.groups()[f"{key:016x}"]
        self.assertEqual(group["blocks"], 3 * 12)  # every block asked, summed over the members
        self.assertEqual(group["hit_blocks"], 3 * 5)

    def test_similar_prompts_share_a_group_and_different_ones_do_not(self):
        hasher = kvtier.MinHasher(threshold=0.5, num_hashes=64, shingle_size=4)
        self.assertEqual(hasher.bands, kvtier.choose_lsh_bands(0.5, 64))
        b = hasher.bands
        self.assertLessEqual(b.bands * b.rows, 64)
        self.assertAlmostEqual(b.collision_probability(1.0), 1.0)
        self.assertLess(b.collision_probability(0.1), 0.05)
        base = list(range(1000, 1400))
        near = base[:380] + [7] * 20  # Jaccard ~0.9 over 4-shingles
        other = list(range(5000, 5400))
        sig = hasher.signature(base)
        self.assertEqual(len(sig), 64)
        self.assertEqual(hasher.band_keys(sig), hasher.band_keys_of(base))
        self.assertEqual(hasher.band_keys_of(np.array(base, dtype=np.uint64)), hasher.band_keys_of(base))
        index = kvtier.SimilarityIndex(1024)
        g_base = index.assign(hasher.band_keys_of(base))
        self.assertEqual(g_base, hasher.affinity_key(base))  # a group is named after its founder
        self.assertEqual(index.assign(hasher.band_keys_of(near)), g_base)
        self.assertNotEqual(index.assign(hasher.band_keys_of(other)), g_base)
        self.assertGreater(len(index), 0)
        self.assertEqual(kvtier.items_from_tokens(np.array([1, 2, 3], dtype=np.int32)), [1, 2, 3])
        with self.assertRaisesRegex(ValueError, "signature: has 3 values"):
            hasher.band_keys([1, 2, 3])
        with self.assertRaisesRegex(ValueError, "threshold"):
            kvtier.MinHasher(threshold=1.5)
        with self.assertRaisesRegex(ValueError, r"items\[1\]: -1 is not in"):
            hasher.signature([1, -1])


if __name__ == "__main__":
    unittest.main()
