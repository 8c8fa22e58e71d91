"""The kvtier Python module against a 3-node local cluster: namespaces, fingerprints, lookup, and
batched get/put of real block shapes through numpy, bytearray, memoryview and DLPack."""

import threading
import time
import unittest

import numpy as np  # required: the suite fails (never skips) without numpy

import kvtier
import kvtier_cluster


def llama_like(tenant, **overrides):
    """A Llama-3-8B-shaped namespace: 32 layers, 8 KV heads of 128, 16-token blocks, bf16 (2 MiB blocks)."""
    fields = dict(num_layers=32, num_kv_heads=8, head_dim=128, block_tokens=16, dtype="bf16")
    fields.update(overrides)
    return kvtier.Namespace(tenant, "meta-llama/Llama-3.1-8B", "rev-a", **fields)


def block_shape(ns):
    l = ns.layout
    if l.kind == "mla":
        return (l.num_layers, l.block_tokens, l.latent_dim)
    return (l.num_layers, 2, l.block_tokens, l.num_kv_heads // l.tp_size, l.head_dim)


def random_blocks(ns, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 16, size=(n,) + block_shape(ns), dtype=np.uint16)


def prompt(n, seed=0):
    return ((np.arange(n, dtype=np.int64) * 2654435761 + seed * 7919) % 128000).astype(np.int64)


class DLPackOnly:
    """Exposes an array only through DLPack (like a CPU torch tensor, which has no buffer protocol)."""

    def __init__(self, array, device=(1, 0)):
        self.array = array
        self.device = device

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.device


class ModuleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.members = kvtier_cluster.shared_members()
        cls.client = kvtier.Client(cls.members, rpc_timeout_ms=5000)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    # -- namespaces and layouts ------------------------------------------------------------------------

    def test_namespace_block_bytes_follow_the_layout(self):
        ns = llama_like("t")
        self.assertEqual(ns.block_bytes, 32 * 2 * 16 * 8 * 128 * 2)
        self.assertEqual(ns.block_tokens, 16)
        self.assertEqual(ns.layout.dtype, "bf16")
        tp2 = llama_like("t", tp_size=2)
        self.assertEqual(tp2.block_bytes, ns.block_bytes // 2)
        mla = kvtier.Namespace("t", "deepseek", kind="mla", num_layers=4, latent_dim=576, block_tokens=64)
        self.assertEqual(mla.block_bytes, 4 * 64 * 576 * 2)
        layout = kvtier.KvLayout(num_layers=2, num_kv_heads=4, head_dim=8)
        self.assertEqual(kvtier.Namespace("t", "m", layout=layout).layout, layout)
        self.assertEqual(kvtier.Namespace("t", "m", layout=layout.to_dict()).block_bytes, layout.block_bytes)
        self.assertEqual(kvtier.Namespace("t", "m", layout={"num_layers": 2}, num_kv_heads=4, head_dim=8).layout,
                         layout)

    def test_namespace_errors_name_the_field(self):
        with self.assertRaises(kvtier.InvalidArgumentError) as cm:
            kvtier.Namespace("t", "m", num_layers=2, num_kv_heads=4, head_dim=0)
        self.assertIn("head_dim", str(cm.exception))
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        self.assertIsInstance(cm.exception, ValueError)
        with self.assertRaises(kvtier.InvalidArgumentError):
            kvtier.Namespace("", "m", num_layers=1, num_kv_heads=1, head_dim=1)
        with self.assertRaises(TypeError) as cm:
            kvtier.Namespace("t", "m", num_layers=1, num_kv_heads=1, head_dim=1, heads=3)
        self.assertIn("heads", str(cm.exception))
        with self.assertRaises(kvtier.InvalidArgumentError):
            kvtier.Namespace("t", "m", num_layers=1, num_kv_heads=1, head_dim=1, dtype="int4")

    def test_equal_namespaces_have_equal_ids_and_revision_none_differs_from_empty(self):
        a, b = llama_like("t"), llama_like("t")
        self.assertEqual(a, b)
        self.assertEqual(a.id, b.id)
        none_rev = kvtier.Namespace("t", "m", None, num_layers=1, num_kv_heads=1, head_dim=1)
        empty_rev = kvtier.Namespace("t", "m", "", num_layers=1, num_kv_heads=1, head_dim=1)
        self.assertNotEqual(none_rev.id, empty_rev.id)

    # -- fingerprints ----------------------------------------------------------------------------------

    def test_fingerprints_cover_full_blocks_only_and_accept_lists_and_arrays(self):
        ns = llama_like("t")
        for n in (0, 15, 16, 17, 31, 32, 33):
            self.assertEqual(len(kvtier.fingerprints(ns, list(range(n)))), n // 16, n)
        toks = prompt(100)
        as_list = kvtier.fingerprints(ns, toks.tolist())
        self.assertEqual(as_list, kvtier.fingerprints(ns, toks))
        self.assertEqual(as_list, kvtier.fingerprints(ns, toks.astype(np.uint32)))
        arr = kvtier.fingerprints(ns, toks, as_numpy=True)
        self.assertEqual(arr.shape, (6, 32))
        self.assertEqual(arr.dtype, np.uint8)
        self.assertEqual([bytes(r) for r in arr], as_list)
        self.assertTrue(all(isinstance(f, bytes) and len(f) == 32 for f in as_list))
        # A prefix's fingerprints are a prefix of the longer prompt's (the chain).
        self.assertEqual(kvtier.fingerprints(ns, toks[:50]), as_list[:3])

    def test_fingerprints_depend_on_extra_keys_namespace_and_salt(self):
        ns = llama_like("t")
        toks = prompt(64)
        base = kvtier.fingerprints(ns, toks)
        lora = kvtier.fingerprints(ns, toks, lora=("adapter", 1))
        self.assertTrue(all(a != b for a, b in zip(base, lora)))
        salted = kvtier.fingerprints(ns, toks, cache_salt="user-1")
        self.assertNotEqual(base[0], salted[0])
        mm = kvtier.fingerprints(ns, toks, multimodal=[(b"img-hash", 20, 10)])
        self.assertEqual(mm[0], base[0])  # block 0 = tokens [0, 16) does not overlap [20, 30)
        self.assertNotEqual(mm[1], base[1])
        self.assertNotEqual(kvtier.fingerprints(llama_like("other"), toks), base)
        self.assertNotEqual(kvtier.fingerprints(llama_like("t", tenant_salt=b"s3cret"), toks), base)
        with self.assertRaises(ValueError):
            kvtier.fingerprints(ns, [-1] + [0] * 15)
        with self.assertRaises(TypeError):
            kvtier.fingerprints(ns, b"not tokens")

    def test_negative_extra_key_numbers_are_value_errors_naming_the_field(self):
        ns = llama_like("t")
        toks = prompt(64)
        for multimodal, field in (([("h", -1, 5)], "multimodal[0][1]"),
                                  ([("h", 0, 5), ("h", 3, -5)], "multimodal[1][2]"),
                                  ([("h", 2**32, 5)], "multimodal[0][1]")):
            with self.assertRaises(ValueError) as cm:
                kvtier.fingerprints(ns, toks, multimodal=multimodal)
            self.assertIn(field, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.client.fingerprints(ns, toks, lora=("adapter", -1))
        self.assertIn("lora[1]", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            kvtier.fingerprints(ns, toks, lora={"adapter_id": "adapter", "version": -1})
        self.assertIn("lora['version']", str(cm.exception))
        with self.assertRaises(TypeError):
            kvtier.fingerprints(ns, toks, multimodal=[("h", 1.5, 5)])
        # numpy integers are ints here, as they are for tokens.
        self.assertEqual(kvtier.fingerprints(ns, toks, multimodal=[("h", np.int64(20), np.uint32(10))]),
                         kvtier.fingerprints(ns, toks, multimodal=[("h", 20, 10)]))

    def test_external_key_fingerprints_are_deterministic_and_namespaced(self):
        ns = llama_like("t")
        a = kvtier.external_key_fingerprints(ns, ["k1", "k2"])
        self.assertEqual(a, kvtier.external_key_fingerprints(ns, ["k1", b"k2"]))
        self.assertNotEqual(a[0], a[1])
        self.assertNotEqual(a, kvtier.external_key_fingerprints(llama_like("u"), ["k1", "k2"]))
        self.assertNotEqual(a, kvtier.external_key_fingerprints(llama_like("t", tenant_salt="x"), ["k1", "k2"]))

    # -- round trips -----------------------------------------------------------------------------------

    def test_numpy_round_trip_of_llama_sized_blocks(self):
        ns = llama_like(kvtier_cluster.unique("np"))
        toks = prompt(16 * 6 + 5, seed=1)
        fps = kvtier.fingerprints(ns, toks)
        data = random_blocks(ns, len(fps), seed=1)  # [6, 32, 2, 16, 8, 128] uint16 = bf16 bits
        self.assertEqual(self.client.lookup(ns, fps), 0)
        put = self.client.put(ns, fps, data)
        self.assertEqual(put, [kvtier.PutResult.STORED] * 6)
        self.assertEqual(self.client.lookup(ns, fps), 6)
        out = np.zeros_like(data)
        got = self.client.get(ns, fps, out)
        self.assertEqual(got, [kvtier.GetResult.HIT] * 6)
        np.testing.assert_array_equal(out, data)
        # Per-block buffers, and fingerprints as a [n, 32] array.
        rows = [np.zeros(block_shape(ns), np.uint16) for _ in fps]
        self.assertEqual(kvtier.leading_hits(self.client.get(ns, kvtier.fingerprints(ns, toks, as_numpy=True), rows)), 6)
        for i, r in enumerate(rows):
            np.testing.assert_array_equal(r, data[i])
        self.assertEqual(self.client.put(ns, fps[:1], data[:1]), [kvtier.PutResult.ALREADY_PRESENT])

    def test_tensor_parallel_shards_count_only_when_every_shard_is_stored(self):
        ns = llama_like(kvtier_cluster.unique("tp"), tp_size=2, num_layers=4)
        fps = kvtier.fingerprints(ns, prompt(16 * 4, seed=2))
        shard0, shard1 = random_blocks(ns, 4, 20), random_blocks(ns, 4, 21)
        self.assertEqual(shard0.shape[1:], (4, 2, 16, 4, 128))
        self.client.put(ns, fps, shard0, shard=0)
        self.assertEqual(self.client.lookup(ns, fps), 0)
        self.client.put(ns, fps[:3], shard1[:3], shard=1)
        detail = self.client.lookup_detail(ns, fps)
        self.assertEqual((detail.prefix_blocks, detail.prefix_tokens), (3, 48))
        self.assertEqual(detail.present, [True, True, True, False])
        out = np.zeros_like(shard1)
        self.assertEqual(kvtier.leading_hits(self.client.get(ns, fps, out, shard=1)), 3)
        np.testing.assert_array_equal(out[:3], shard1[:3])
        with self.assertRaises(kvtier.InvalidArgumentError):
            self.client.get(ns, fps, out, shard=2)

    def test_mla_blocks_round_trip(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("mla"), "deepseek-v3", kind="mla", num_layers=6,
                              latent_dim=576, block_tokens=64)
        fps = kvtier.fingerprints(ns, prompt(64 * 3, seed=3))
        data = random_blocks(ns, 3, 3)
        self.assertEqual(data.shape, (3, 6, 64, 576))
        self.client.put(ns, fps, data)
        out = np.empty_like(data)
        self.assertEqual(kvtier.leading_hits(self.client.get(ns, fps, out)), 3)
        np.testing.assert_array_equal(out, data)

    def test_bytearray_memoryview_and_bytes_buffers(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("ba"), "m", num_layers=2, num_kv_heads=2, head_dim=16,
                              block_tokens=4)
        fps = kvtier.fingerprints(ns, list(range(12)))
        blocks = [bytes([i]) * ns.block_bytes for i in range(3)]
        self.assertEqual(self.client.put(ns, fps, blocks), [kvtier.PutResult.STORED] * 3)  # bytes: read-only ok
        outs = [bytearray(ns.block_bytes), memoryview(bytearray(ns.block_bytes)), bytearray(ns.block_bytes)]
        self.assertEqual(kvtier.leading_hits(self.client.get(ns, fps, outs)), 3)
        self.assertEqual([bytes(o) for o in outs], blocks)
        with self.assertRaises(BufferError):
            self.client.get(ns, fps, blocks)  # bytes are not writable
        big = bytearray(3 * ns.block_bytes)
        self.client.get(ns, fps, memoryview(big))
        self.assertEqual(bytes(big), b"".join(blocks))

    def test_dlpack_buffers_are_written_in_place(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("dl"), "m", num_layers=2, num_kv_heads=2, head_dim=16,
                              block_tokens=4)
        fps = kvtier.fingerprints(ns, list(range(8)))
        data = random_blocks(ns, 2, 5)
        self.client.put(ns, fps, DLPackOnly(data))
        out = np.zeros_like(data)
        self.assertEqual(self.client.get(ns, fps, DLPackOnly(out)), [kvtier.GetResult.HIT] * 2)
        np.testing.assert_array_equal(out, data)  # the consumer wrote the producer's memory
        out2 = np.zeros_like(data)
        self.client.get(ns, fps, [out2[0].__dlpack__(), DLPackOnly(out2[1])])  # raw capsules too
        np.testing.assert_array_equal(out2, data)

    def test_bad_buffers_are_rejected_with_the_sizes(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("bad"), "m", num_layers=2, num_kv_heads=2, head_dim=16,
                              block_tokens=4)
        fps = kvtier.fingerprints(ns, list(range(8)))
        with self.assertRaises(ValueError) as cm:
            self.client.get(ns, fps, np.zeros(ns.block_bytes, np.uint8))  # one block's worth for two
        self.assertIn(str(2 * ns.block_bytes), str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.client.get(ns, fps, [bytearray(ns.block_bytes), bytearray(ns.block_bytes - 1)])
        self.assertIn("buffers[1]", str(cm.exception))
        with self.assertRaises(ValueError):
            self.client.get(ns, fps, [bytearray(ns.block_bytes)])  # count mismatch
        strided = np.zeros((2, 2 * ns.block_bytes), np.uint8)[:, ::2]
        with self.assertRaises(BufferError):
            self.client.get(ns, fps, strided)
        with self.assertRaises(BufferError):
            self.client.get(ns, fps, DLPackOnly(strided))
        with self.assertRaises(ValueError) as cm:
            self.client.get(ns, fps, DLPackOnly(np.zeros((2, ns.block_bytes), np.uint8), device=(2, 0)))
        self.assertIn("CUDA", str(cm.exception))
        with self.assertRaises(TypeError):
            self.client.get(ns, fps, [object(), object()])
        with self.assertRaises(ValueError):
            self.client.lookup(ns, [b"short"])

    def test_raw_pointer_segments_scatter_and_gather(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("ptr"), "m", num_layers=2, num_kv_heads=2, head_dim=16,
                              block_tokens=4)
        fps = kvtier.fingerprints(ns, list(range(12)))
        half = ns.block_bytes // 2
        k = np.arange(3 * half, dtype=np.uint8).reshape(3, half)
        v = (np.arange(3 * half, dtype=np.uint8).reshape(3, half) * 3)
        ptrs = [p for i in range(3) for p in (k[i].ctypes.data, v[i].ctypes.data)]
        self.assertEqual(self.client.put_ptrs(ns, fps, ptrs, half), [kvtier.PutResult.STORED] * 3)
        whole = np.zeros((3, ns.block_bytes), np.uint8)
        self.client.get(ns, fps, whole)
        np.testing.assert_array_equal(whole, np.concatenate([k, v], axis=1))
        k2, v2 = np.zeros_like(k), np.zeros_like(v)
        ptrs2 = [p for i in range(3) for p in (k2[i].ctypes.data, v2[i].ctypes.data)]
        self.assertEqual(kvtier.leading_hits(self.client.get_ptrs(ns, fps, ptrs2, [half] * 6)), 3)
        np.testing.assert_array_equal(k2, k)
        np.testing.assert_array_equal(v2, v)
        one = np.zeros((3, ns.block_bytes), np.uint8)  # one segment per block: in place
        self.client.get_ptrs(ns, fps, [one[i].ctypes.data for i in range(3)], ns.block_bytes)
        np.testing.assert_array_equal(one, whole)
        with self.assertRaises(ValueError):
            self.client.get_ptrs(ns, fps, ptrs2, half - 1)

    def test_raw_pointer_sizes_are_checked_before_any_copy(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("ptr-sizes"), "m", num_layers=2, num_kv_heads=2, head_dim=16,
                              block_tokens=4)
        b = ns.block_bytes
        fps = kvtier.fingerprints(ns, list(range(4)))
        src = np.arange(b, dtype=np.uint8)
        dst = np.full(b, 7, np.uint8)
        two_src = [src.ctypes.data, src.ctypes.data]
        two_dst = [dst.ctypes.data, dst.ctypes.data]
        # Sizes whose sum wraps around 2^64 to exactly block_bytes; each alone is far too large.
        for sizes, field in (([2**64 - 8, b + 8], "sizes[0]"), ([b + 8, 2**64 - 8], "sizes[0]"),
                             ([b, 1], "sizes[1]"), ([-8, b + 8], "sizes[0]"), ([8, -8], "sizes[1]"),
                             ([2**64, 0], "sizes[0]"), ([b - 1, 0], "sizes")):
            with self.assertRaises(ValueError, msg=sizes) as cm:
                self.client.put_ptrs(ns, fps, two_src, sizes)
            self.assertIn(field, str(cm.exception))
            with self.assertRaises(ValueError, msg=sizes) as cm:
                self.client.get_ptrs(ns, fps, two_dst, sizes)
            self.assertIn(field, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.client.get_ptrs(ns, fps, [dst.ctypes.data], -b)
        self.assertIn("sizes", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.client.get_ptrs(ns, fps, [-dst.ctypes.data], b)
        self.assertIn("ptrs[0]", str(cm.exception))
        with self.assertRaises(TypeError):
            self.client.get_ptrs(ns, fps, two_dst, [b / 2, b / 2])
        self.assertEqual(self.client.lookup(ns, fps), 0)  # nothing was stored
        self.assertTrue((dst == 7).all())  # nothing was written
        # numpy integers are accepted as sizes and addresses.
        self.assertEqual(self.client.put_ptrs(ns, fps, [np.uint64(src.ctypes.data)], [np.int64(b)]),
                         [kvtier.PutResult.STORED])

    def test_result_enums_compare_with_ints_by_value(self):
        for cls, names in ((kvtier.GetResult, ["HIT", "MISS", "MISS_FROM_ERROR", "CHECKSUM_MISMATCH"]),
                           (kvtier.PutResult, ["STORED", "ALREADY_PRESENT", "IN_PROGRESS", "NO_SPACE", "ERROR"])):
            self.assertEqual(list(cls.__members__), names)
            for value, name in enumerate(names):
                member = getattr(cls, name)
                self.assertTrue(member == value and value == member, name)
                self.assertFalse(member != value, name)
                self.assertNotEqual(member, value + 1)
                self.assertEqual(int(member), value)
                self.assertEqual(hash(member), hash(value))
                self.assertEqual({value: name}[member], name)
                self.assertEqual(cls(value), member)
                self.assertLess(member, len(names))
                self.assertGreaterEqual(member, 0)
                self.assertNotEqual(member, str(value))
        self.assertEqual([0, 1][kvtier.GetResult.MISS], 1)  # operator.index
        self.assertLess(kvtier.GetResult.HIT, kvtier.GetResult.MISS)
        self.assertNotEqual(kvtier.GetResult.HIT, kvtier.PutResult.STORED)  # both 0, different enums
        with self.assertRaises(TypeError):
            kvtier.GetResult.HIT < kvtier.PutResult.STORED
        with self.assertRaises(TypeError):
            kvtier.GetResult.HIT < "0"
        # Results from the server compare with ints too.
        ns = kvtier.Namespace(kvtier_cluster.unique("enum"), "m", num_layers=1, num_kv_heads=1, head_dim=8,
                              block_tokens=4)
        fps = kvtier.fingerprints(ns, list(range(8)))
        self.assertEqual(self.client.put(ns, fps[:1], bytes(ns.block_bytes)), [0])
        self.assertEqual(self.client.get(ns, fps, bytearray(2 * ns.block_bytes)), [0, 1])

    def test_stats_count_each_block_once(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("st"), "m", num_layers=1, num_kv_heads=1, head_dim=8,
                              block_tokens=4)
        with kvtier.Client(self.members) as c:
            fps = kvtier.fingerprints(ns, list(range(20)))
            c.put(ns, fps[:3], np.ones((3, ns.block_bytes), np.uint8))
            self.assertEqual(c.lookup(ns, fps), 3)
            c.get(ns, fps, np.zeros((5, ns.block_bytes), np.uint8))
            s = c.stats()
            self.assertEqual(s["lookups"], 1)
            self.assertEqual(s["prefix_hit_blocks"], 3)
            self.assertEqual(s["prefix_hit_tokens"], 12)
            self.assertEqual(s["get_blocks"], 5)
            self.assertEqual(s["retrieve_hit_blocks"], 3)
            self.assertEqual(s["retrieve_hit_bytes"], 3 * ns.block_bytes)
            self.assertEqual(s["put_stored_blocks"], 3)
            self.assertEqual(s["misses_from_errors"], 0)
            self.assertEqual(len(c.members()), 3)
            self.assertTrue(all(m["in_ring"] for m in c.members()))
        self.assertTrue(c.closed)
        with self.assertRaises(kvtier.Error) as cm:
            c.lookup(ns, fps)
        self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")

    def test_io_releases_the_gil(self):
        # A pure-Python thread keeps counting while the main thread is inside put/get; with the GIL
        # held for the call it could not run at all.
        ns = llama_like(kvtier_cluster.unique("gil"), num_layers=8)
        fps = kvtier.fingerprints(ns, prompt(16 * 16, seed=9))
        data = random_blocks(ns, 16, 9)
        counter = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                counter[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        try:
            time.sleep(0.01)
            before = counter[0]
            t0 = time.monotonic()
            self.client.put(ns, fps, data)
            out = np.empty_like(data)
            self.client.get(ns, fps, out)
            elapsed = time.monotonic() - t0
            during = counter[0] - before
        finally:
            stop.set()
            t.join()
        np.testing.assert_array_equal(out, data)
        self.assertGreater(during, 1000, f"counter advanced {during} times in {elapsed * 1e3:.1f} ms")

    def test_concurrent_calls_from_threads(self):
        ns = kvtier.Namespace(kvtier_cluster.unique("thr"), "m", num_layers=4, num_kv_heads=4, head_dim=64,
                              block_tokens=16)
        errors = []

        def worker(i):
            try:
                fps = kvtier.fingerprints(ns, prompt(16 * 8, seed=100 + i))
                data = random_blocks(ns, 8, 100 + i)
                self.client.put(ns, fps, data)
                out = np.empty_like(data)
                if kvtier.leading_hits(self.client.get(ns, fps, out)) != 8 or not (out == data).all():
                    errors.append(f"thread {i}: mismatch")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"thread {i}: {e!r}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])


class DeadMemberTest(unittest.TestCase):
    """A member that dies turns into counted misses within the RPC timeout, never a hang or an error."""

    def test_killed_member_becomes_misses_from_errors(self):
        cluster = kvtier_cluster.Cluster(2, prefix="dead")
        try:
            ns = kvtier.Namespace(kvtier_cluster.unique("dead"), "m", num_layers=1, num_kv_heads=1, head_dim=8,
                                  block_tokens=4)
            with kvtier.Client(cluster.members, rpc_timeout_ms=1000) as c:
                fps = kvtier.fingerprints(ns, list(range(4 * 32)))
                c.put(ns, fps, np.ones((32, ns.block_bytes), np.uint8))
                self.assertEqual(c.lookup(ns, fps), 32)
                cluster.servers[1].stop(9)
                t0 = time.monotonic()
                results = c.get(ns, fps, np.zeros((32, ns.block_bytes), np.uint8))
                self.assertLess(time.monotonic() - t0, 5.0)
                lost = results.count(kvtier.GetResult.MISS_FROM_ERROR)
                self.assertGreater(lost, 0)
                self.assertEqual(results.count(kvtier.GetResult.HIT) + lost, 32)
                self.assertEqual(c.stats()["misses_from_errors"], lost)
                detail = c.lookup_detail(ns, fps)
                self.assertLess(detail.prefix_blocks, 32)
                self.assertGreater(detail.blocks_from_errors, 0)
        finally:
            cluster.stop()

    def test_unreachable_cluster_is_unavailable(self):
        with self.assertRaises(kvtier.UnavailableError) as cm:
            kvtier.Client(["127.0.0.1:1"], connect_timeout_ms=300)
        self.assertIsInstance(cm.exception, ConnectionError)
        with self.assertRaises(kvtier.InvalidArgumentError):
            kvtier.Client([])


class ServerRefusalTest(unittest.TestCase):
    """A server's refusal of the request itself raises with the server's code and message."""

    def test_a_servers_refusal_raises_with_its_code_and_message(self):
        # The server takes blocks of at most 1 MiB, the client up to 64 MiB: only the server can refuse
        # 2 MiB blocks, and its code and text reach Python (not a per-block ERROR or MISS_FROM_ERROR).
        cluster = kvtier_cluster.Cluster(1, prefix="small", extra_args=["--max_block_bytes=1MiB"])
        try:
            ns = llama_like(kvtier_cluster.unique("oversized"))
            self.assertEqual(ns.block_bytes, 2 << 20)
            fps = kvtier.fingerprints(ns, prompt(16 * 2))
            blocks = random_blocks(ns, 2, seed=5)
            with kvtier.Client(cluster.members, rpc_timeout_ms=5000) as c:
                calls = [("put", lambda: c.put(ns, fps, blocks)),
                         ("get", lambda: c.get(ns, fps, np.zeros_like(blocks))),
                         ("lookup", lambda: c.lookup(ns, fps))]
                for name, call in calls:
                    with self.assertRaises(kvtier.InvalidArgumentError, msg=name) as cm:
                        call()
                    self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT", name)
                    self.assertIn("this server accepts at most 1048576", str(cm.exception), name)
                    self.assertIn("member small-1 (127.0.0.1:", str(cm.exception), name)
                self.assertEqual(c.stats()["misses_from_errors"], 0)
        finally:
            cluster.stop()


if __name__ == "__main__":
    unittest.main()
