"""kvtier.adapters.sglang.KvtierHiCacheStorage driven by a stand-in for SGLang's HiCacheController.

SGLang cannot be installed here. The stand-in below makes the calls the controller makes
(python/sglang/srt/managers/cache_controller.py), in the same order: the dynamic backend factory's
constructor call, register_mem_pool_host, page hashes chained per page, batch_exists in batches of
STORAGE_BATCH_SIZE stopping at the first short batch, a min-reduce of the hit count over TP ranks,
then batch_get_v1 (zero copy, "interface_v1") or batch_get + set_from_flat_data_page (generic) per
batch, and batch_set_v1 / batch_set for backups. The host pools mirror MHATokenToKVPoolHost and
MLATokenToKVPoolHost in the "page_first" layout, including get_page_buffer_meta's K/V pointer pairs.
"""

import dataclasses
import hashlib
import importlib
import unittest
from typing import List, Optional

import numpy as np

import kvtier
import kvtier_cluster

STORAGE_BATCH_SIZE = 128  # sglang.srt.mem_cache.hicache_storage.STORAGE_BATCH_SIZE


@dataclasses.dataclass
class HiCacheStorageConfig:  # the fields of sglang's HiCacheStorageConfig that a backend reads
    tp_rank: int
    tp_size: int
    is_mla_model: bool
    model_name: Optional[str]
    is_page_first_layout: bool = True
    pp_rank: int = 0
    pp_size: int = 1
    extra_config: Optional[dict] = None


@dataclasses.dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class MHAHostPool:
    """MHATokenToKVPoolHost, layout page_first: kv_buffer [2, size, layer_num, head_num, head_dim]."""

    layout = "page_first"
    dtype = "bfloat16"

    def __init__(self, pages, page_size, layer_num, head_num, head_dim):
        self.page_size, self.layer_num, self.head_num, self.head_dim = page_size, layer_num, head_num, head_dim
        self.size = pages * page_size
        self.kv_buffer = np.zeros((2, self.size, layer_num, head_num, head_dim), np.uint16)
        self._free = list(range(0, self.size, page_size))

    def alloc(self, num_tokens):
        pages = [self._free.pop(0) for _ in range(num_tokens // self.page_size)]
        return np.array([p + i for p in pages for i in range(self.page_size)], np.int64)

    def _token_bytes(self):
        return self.layer_num * self.head_num * self.head_dim * 2

    def get_page_buffer_meta(self, indices):
        base = self.kv_buffer.ctypes.data
        v_offset = self.size * self._token_bytes()
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            k_ptr = base + int(indices[i]) * self._token_bytes()
            ptrs += [k_ptr, k_ptr + v_offset]
        return ptrs, [self.page_size * self._token_bytes()] * len(ptrs)

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[:, index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return np.zeros(2 * self.page_size * self.layer_num * self.head_num * self.head_dim, np.uint16)

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[:, index:index + self.page_size] = data_page.reshape(
            2, self.page_size, self.layer_num, self.head_num, self.head_dim)

    def page(self, index):
        return self.kv_buffer[:, index:index + self.page_size].copy()

    def fill(self, index, seed):
        rng = np.random.default_rng(seed)
        self.kv_buffer[:, index:index + self.page_size] = rng.integers(
            0, 1 << 16, size=self.kv_buffer[:, index:index + self.page_size].shape, dtype=np.uint16)


class MLAHostPool(MHAHostPool):
    """MLATokenToKVPoolHost, layout page_first: kv_buffer [size, layer_num, 1, kv_lora_rank + rope]."""

    def __init__(self, pages, page_size, layer_num, kv_lora_rank, qk_rope_head_dim):
        self.page_size, self.layer_num = page_size, layer_num
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.size = pages * page_size
        self.kv_buffer = np.zeros((self.size, layer_num, 1, kv_lora_rank + qk_rope_head_dim), np.uint16)
        self._free = list(range(0, self.size, page_size))

    def _token_bytes(self):
        return self.layer_num * (self.kv_lora_rank + self.qk_rope_head_dim) * 2

    def get_page_buffer_meta(self, indices):
        base = self.kv_buffer.ctypes.data
        ptrs = [base + int(indices[i]) * self._token_bytes() for i in range(0, len(indices), self.page_size)]
        return ptrs, [self.page_size * self._token_bytes()] * len(ptrs)

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return np.zeros(self.page_size * self._token_bytes() // 2, np.uint16)

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[index:index + self.page_size] = data_page.reshape(self.kv_buffer[index:index + self.page_size].shape)

    def page(self, index):
        return self.kv_buffer[index:index + self.page_size].copy()

    def fill(self, index, seed):
        rng = np.random.default_rng(seed)
        self.kv_buffer[index:index + self.page_size] = rng.integers(
            0, 1 << 16, size=self.kv_buffer[index:index + self.page_size].shape, dtype=np.uint16)


def get_hash_str(token_ids, prior_hash=None):
    """SGLang's page key: SHA-256 over the previous page's hash and this page's token ids, hex."""
    h = hashlib.sha256()
    if prior_hash:
        h.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        h.update(int(t).to_bytes(4, "little", signed=False))
    return h.hexdigest()


class StandInController:
    """The storage half of one TP rank's HiCacheController."""

    def __init__(self, extra_config, storage_config, host_pool):
        # StorageBackendFactory._create_dynamic_backend: import, then backend_class(storage_config, kwargs).
        module = importlib.import_module(extra_config["module_path"])
        backend_class = getattr(module, extra_config["class_name"])
        self.storage_config = storage_config
        self.storage_backend = backend_class(storage_config, {})
        self.storage_backend.register_mem_pool_host(host_pool)
        self.mem_pool_host = host_pool
        self.page_size = host_pool.page_size
        self.backup_skip = storage_config.is_mla_model and storage_config.tp_rank != 0
        if bool(extra_config.get("interface_v1", 0)):
            self.page_get_func, self.page_set_func = self._page_get_zero_copy, self._page_set_zero_copy
        else:
            self.page_get_func, self.page_set_func = self._generic_page_get, self._generic_page_set

    def page_hashes(self, token_ids, last_hash=None):
        hashes = []
        for i in range(0, len(token_ids) - len(token_ids) % self.page_size, self.page_size):
            last_hash = get_hash_str(token_ids[i:i + self.page_size], last_hash)
            hashes.append(last_hash)
        return hashes

    # -- backup (write_storage -> backup_thread_func -> _page_backup) --------------------------------

    def _generic_page_set(self, hash_values, host_indices, extra_info=None):
        data = [self.mem_pool_host.get_data_page(host_indices[i * self.page_size]) for i in range(len(hash_values))]
        return self.storage_backend.batch_set(hash_values, data)

    def _page_set_zero_copy(self, hash_values, host_indices, extra_info=None):
        return all(self.storage_backend.batch_set_v1(hash_values, host_indices, extra_info))

    def backup(self, host_indices, token_ids):
        if self.backup_skip:
            return 0
        hash_value = self.page_hashes(token_ids)
        completed_tokens = 0
        for i in range(0, len(hash_value), STORAGE_BATCH_SIZE):
            batch_hashes = hash_value[i:i + STORAGE_BATCH_SIZE]
            batch_host_indices = host_indices[i * self.page_size:(i + len(batch_hashes)) * self.page_size]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=None)
            if not self.page_set_func(batch_hashes, batch_host_indices, extra_info):
                break
            completed_tokens += self.page_size * len(batch_hashes)
        return completed_tokens

    # -- prefetch (prefetch_thread_func -> _storage_hit_query; prefetch_io_aux_func -> _page_transfer) --

    def storage_hit_query(self, token_ids):
        prefetch_length = len(token_ids) - len(token_ids) % self.page_size  # HiRadixCache.prefetch_from_storage
        page_hashes = self.page_hashes(token_ids[:prefetch_length])
        hash_value, storage_query_count = [], 0
        for start in range(0, len(page_hashes), STORAGE_BATCH_SIZE):
            batch_hashes = page_hashes[start:start + STORAGE_BATCH_SIZE]
            hit_page_num = self.storage_backend.batch_exists(batch_hashes, HiCacheStorageExtraInfo())
            hash_value.extend(batch_hashes[:hit_page_num])
            storage_query_count += hit_page_num * self.page_size
            if hit_page_num < len(batch_hashes):
                break
        return hash_value, storage_query_count

    def _page_get_zero_copy(self, hash_values, host_indices, extra_info=None):
        results = self.storage_backend.batch_get_v1(hash_values, host_indices, extra_info)
        inc = 0
        for ok in results:
            if not ok:
                break
            inc += 1
        return inc

    def _generic_page_get(self, hash_values, host_indices, extra_info=None):
        dummy_page_dst = [self.mem_pool_host.get_dummy_flat_data_page() for _ in hash_values]
        page_data = self.storage_backend.batch_get(hash_values, dummy_page_dst)
        count = 0
        for i in range(len(hash_values)):
            if page_data[i] is None:
                break
            self.mem_pool_host.set_from_flat_data_page(host_indices[i * self.page_size], page_data[i])
            count += 1
        return count

    def page_transfer(self, hash_value, host_indices):
        completed_pages = 0
        for i in range(0, len(hash_value), STORAGE_BATCH_SIZE):
            batch_hashes = hash_value[i:i + STORAGE_BATCH_SIZE]
            batch_host_indices = host_indices[i * self.page_size:(i + len(batch_hashes)) * self.page_size]
            hit_pages = self.page_get_func(batch_hashes, batch_host_indices, HiCacheStorageExtraInfo())
            completed_pages += hit_pages
            if hit_pages != len(batch_hashes):
                break
        return completed_pages * self.page_size


def prefetch_all_ranks(controllers, token_ids):
    """What the ranks agree on: each queries storage, the hit count is min-reduced, each loads that much."""
    queries = [c.storage_hit_query(token_ids) for c in controllers]
    storage_hit_count = min(count for _, count in queries)
    out = []
    for c, (hash_value, _) in zip(controllers, queries):
        hash_value = hash_value[: storage_hit_count // c.page_size]
        host_indices = c.mem_pool_host.alloc(storage_hit_count)
        completed = c.page_transfer(hash_value, host_indices)
        out.append((completed, host_indices))
    return storage_hit_count, out


class SGLangAdapterTest(unittest.TestCase):
    PAGE = 4

    @classmethod
    def setUpClass(cls):
        cls.members = kvtier_cluster.shared_members()

    def extra(self, tenant, zero_copy=True):
        return {
            "backend_name": "kvtier",
            "module_path": "kvtier.adapters.sglang",
            "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1 if zero_copy else 0,
            "members": ",".join(self.members),
            "tenant": tenant,
            "rpc_timeout_ms": 5000,
        }

    def engine(self, extra, tp_rank=0, tp_size=1, mla=False, pages=512):
        if mla:
            pool = MLAHostPool(pages, self.PAGE, layer_num=3, kv_lora_rank=64, qk_rope_head_dim=16)
        else:
            pool = MHAHostPool(pages, self.PAGE, layer_num=3, head_num=4 // tp_size, head_dim=16)
        config = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, is_mla_model=mla,
                                      model_name="Qwen/Qwen3-8B", extra_config=dict(extra))
        controller = StandInController(extra, config, pool)
        self.addCleanup(controller.storage_backend.close)
        return controller

    def compute_and_backup(self, controller, token_ids, seed):
        """The engine computed a prompt's KV into host pages, then backs them up."""
        n_pages = len(token_ids) // self.PAGE
        host_indices = controller.mem_pool_host.alloc(n_pages * self.PAGE)
        for p in range(n_pages):
            controller.mem_pool_host.fill(int(host_indices[p * self.PAGE]), seed * 100003 + p)
        written = controller.backup(host_indices, token_ids)
        return host_indices, written

    def assert_same_pages(self, pool_a, idx_a, pool_b, idx_b, n_pages):
        for p in range(n_pages):
            np.testing.assert_array_equal(pool_b.page(int(idx_b[p * self.PAGE])), pool_a.page(int(idx_a[p * self.PAGE])),
                                          err_msg=f"page {p}")

    def run_round_trip(self, zero_copy):
        tenant = kvtier_cluster.unique("sgl")
        writer = self.engine(self.extra(tenant, zero_copy))
        tokens = list(range(7, 7 + 130 * self.PAGE + 3))  # 130 full pages (two storage batches) + 3 tokens
        idx_a, written = self.compute_and_backup(writer, tokens, seed=1)
        self.assertEqual(written, 130 * self.PAGE)
        reader = self.engine(self.extra(tenant, zero_copy))  # another instance, empty host pool
        hit, [(completed, idx_b)] = prefetch_all_ranks([reader], tokens)
        self.assertEqual(hit, 130 * self.PAGE)
        self.assertEqual(completed, 130 * self.PAGE)
        self.assertEqual(completed % self.PAGE, 0)
        self.assert_same_pages(writer.mem_pool_host, idx_a, reader.mem_pool_host, idx_b, 130)
        return tenant, tokens

    def test_zero_copy_round_trip_across_storage_batches(self):
        self.run_round_trip(zero_copy=True)

    def test_generic_round_trip_with_flat_pages(self):
        tenant, tokens = self.run_round_trip(zero_copy=False)
        # Flat pages and zero-copy segments order a page's bytes differently: separate keys.
        other = self.engine(self.extra(tenant, zero_copy=True))
        self.assertEqual(other.storage_hit_query(tokens)[1], 0)

    def test_shared_prefix_and_partial_page(self):
        c = self.engine(self.extra(kvtier_cluster.unique("sgl-prefix")))
        tokens = list(range(100, 100 + 10 * self.PAGE))
        self.compute_and_backup(c, tokens, seed=2)
        diverged = tokens[: 3 * self.PAGE + 1] + [99999] + tokens[3 * self.PAGE + 2:]
        self.assertEqual(c.storage_hit_query(diverged)[1], 3 * self.PAGE)  # page 3 differs
        self.assertEqual(c.storage_hit_query(tokens[: 6 * self.PAGE + 2])[1], 6 * self.PAGE)  # partial page dropped
        self.assertEqual(c.storage_hit_query(tokens[: self.PAGE - 1])[1], 0)
        self.assertEqual(c.storage_backend.batch_exists([]), 0)
        self.assertTrue(c.storage_backend.exists(c.page_hashes(tokens)[0]))

    def test_tensor_parallel_ranks_need_every_shard(self):
        extra = self.extra(kvtier_cluster.unique("sgl-tp"))
        ranks = [self.engine(extra, tp_rank=r, tp_size=2) for r in range(2)]
        tokens = list(range(5, 5 + 6 * self.PAGE))
        idx0, _ = self.compute_and_backup(ranks[0], tokens, seed=30)
        self.assertEqual([r.storage_hit_query(tokens)[1] for r in ranks], [0, 0])  # shard 1 missing
        idx1, _ = self.compute_and_backup(ranks[1], tokens, seed=31)
        readers = [self.engine(extra, tp_rank=r, tp_size=2) for r in range(2)]
        hit, loaded = prefetch_all_ranks(readers, tokens)
        self.assertEqual(hit, 6 * self.PAGE)
        for rank, (writer_idx, (completed, reader_idx)) in enumerate(zip([idx0, idx1], loaded)):
            self.assertEqual(completed, 6 * self.PAGE)
            self.assert_same_pages(ranks[rank].mem_pool_host, writer_idx, readers[rank].mem_pool_host, reader_idx, 6)

    def test_mla_is_written_by_rank_zero_and_read_by_every_rank(self):
        extra = self.extra(kvtier_cluster.unique("sgl-mla"))
        ranks = [self.engine(extra, tp_rank=r, tp_size=2, mla=True) for r in range(2)]
        self.assertEqual(ranks[0].storage_backend.ns.layout.kind, "mla")
        self.assertEqual(ranks[0].storage_backend.ns.block_bytes, self.PAGE * 3 * 80 * 2)
        tokens = list(range(40, 40 + 5 * self.PAGE))
        idx0, written0 = self.compute_and_backup(ranks[0], tokens, seed=4)
        _, written1 = self.compute_and_backup(ranks[1], tokens, seed=5)
        self.assertEqual((written0, written1), (5 * self.PAGE, 0))  # backup_skip on rank 1
        readers = [self.engine(extra, tp_rank=r, tp_size=2, mla=True) for r in range(2)]
        hit, loaded = prefetch_all_ranks(readers, tokens)
        self.assertEqual(hit, 5 * self.PAGE)
        for c, (completed, idx) in zip(readers, loaded):
            self.assertEqual(completed, 5 * self.PAGE)
            self.assert_same_pages(ranks[0].mem_pool_host, idx0, c.mem_pool_host, idx, 5)

    def test_failures_are_reported_not_raised(self):
        c = self.engine(self.extra(kvtier_cluster.unique("sgl-closed")))
        tokens = list(range(4 * self.PAGE))
        hashes = c.page_hashes(tokens)
        c.storage_backend._client.close()  # every call now fails inside the backend
        idx = c.mem_pool_host.alloc(4 * self.PAGE)
        with self.assertLogs("kvtier.adapters", level="WARNING") as logs:
            self.assertEqual(c.storage_backend.batch_exists(hashes), 0)
            self.assertEqual(c.storage_backend.batch_get_v1(hashes, idx), [False] * 4)
            self.assertEqual(c.storage_backend.batch_set_v1(hashes, idx), [False] * 4)
            self.assertEqual(c.storage_backend.batch_get(hashes, None), [None] * 4)
            self.assertFalse(c.storage_backend.batch_set(hashes, [c.mem_pool_host.get_data_page(0)] * 4))
            self.assertFalse(c.storage_backend.clear())
        self.assertEqual(len(logs.records), 6)

    def test_layout_mismatch_is_a_logged_failure(self):
        extra = self.extra(kvtier_cluster.unique("sgl-layout"))
        extra["layout"] = {"head_dim": 32}  # declares pages twice as large as the pool's
        c = self.engine(extra)
        idx = c.mem_pool_host.alloc(self.PAGE)
        with self.assertLogs("kvtier.adapters", level="ERROR"):
            self.assertEqual(c.storage_backend.batch_set_v1(c.page_hashes(list(range(self.PAGE))), idx), [False])


if __name__ == "__main__":
    unittest.main()
