"""A stand-in for SGLang's HiCacheController (storage half), driving kvtier.adapters.sglang.

SGLang cannot be installed here. The stand-in makes the calls the controller makes
(python/sglang/srt/managers/cache_controller.py and its hybrid-pool subclass, at the revisions
bindings/python/README.md names), in the same order: the dynamic backend factory's constructor call,
register_mem_pool_host, page hashes chained per page, batch_exists in batches of STORAGE_BATCH_SIZE
stopping at the first short batch, a min-reduce of the hit count over TP ranks, then batch_get_v1 (zero
copy, "interface_v1") or batch_get + set_from_flat_data_page (generic) per batch, and batch_set_v1 /
batch_set for backups. The host pools mirror MHATokenToKVPoolHost and MLATokenToKVPoolHost in the
"page_first" layout, including get_page_buffer_meta's K/V pointer pairs.

HybridController adds the pool-aware (v2) calls for hybrid models: register_mem_host_pool_v2 per extra
pool, batch_exists_v2 with PoolTransfer descriptors and their hit policies, KV pages first and the extra
pools after them on prefetch (batch_get_v2 once every KV page arrived, with trailing keys re-aligned to
the hit), and the extra pools before the KV pages on backup (batch_set_v2, then the KV pages).
"""

import dataclasses
import enum
import hashlib
import importlib
from typing import Any, List, Optional

import numpy as np

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

    def backup(self, host_indices, token_ids, prefix_keys=None):
        """write_storage + _page_backup: `prefix_keys` are the page hashes of the tree path before
        token_ids (HiRadixCache passes them), which the page hashes continue from."""
        if self.backup_skip:
            return 0
        prefix_keys = list(prefix_keys) if prefix_keys else None
        hash_value = self.page_hashes(token_ids, prefix_keys[-1] if prefix_keys else None)
        completed_tokens = 0
        for i in range(0, len(hash_value), STORAGE_BATCH_SIZE):
            batch_hashes = hash_value[i:i + STORAGE_BATCH_SIZE]
            batch_host_indices = host_indices[i * self.page_size:(i + len(batch_hashes)) * self.page_size]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            if not self.page_set_func(batch_hashes, batch_host_indices, extra_info):
                break
            if prefix_keys:
                prefix_keys += batch_hashes
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


# -- hybrid models: the pool-aware (v2) interface ------------------------------------------------------


class PoolName(str, enum.Enum):  # sglang.srt.mem_cache.hicache_storage.PoolName (the names used here)
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"

    def __str__(self):
        return self.value


class PoolHitPolicy(str, enum.Enum):  # sglang.srt.mem_cache.hicache_storage.PoolHitPolicy
    ALL_PAGES = "all_pages"  # every page in [0, kv_hit) must exist
    TRAILING_PAGES = "trailing_pages"  # only the last len(keys) pages of the hit must exist


@dataclasses.dataclass
class PoolTransfer:  # sglang.srt.mem_cache.hicache_storage.PoolTransfer
    name: PoolName
    host_indices: Optional[Any] = None
    device_indices: Optional[Any] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


class MambaHostPool:
    """A host pool of Mamba states: one fp32 state [layer_num, state_dim] per slot, page_size 1. Stored
    for the last page of a backed-up prefix (TRAILING_PAGES with one trailing key)."""

    page_size = 1

    def __init__(self, slots, layer_num, state_dim):
        self.buffer = np.zeros((slots, layer_num, state_dim), np.float32)
        self._free = list(range(slots))

    def alloc(self, n):
        return np.array([self._free.pop(0) for _ in range(n)], np.int64)

    def get_data_page(self, index, flat=True):
        page = self.buffer[index:index + 1]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return np.zeros(self.buffer[0:1].size, np.float32)

    def set_from_flat_data_page(self, index, data_page):
        self.buffer[index:index + 1] = data_page.reshape(self.buffer[index:index + 1].shape)

    def page(self, index):
        return self.buffer[index].copy()

    def fill(self, index, seed):
        self.buffer[index] = np.random.default_rng(seed).standard_normal(self.buffer[index].shape).astype(np.float32)


class IndexerHostPool:
    """A host pool of sparse-attention indexer keys: uint8 [size, layer_num, index_dim], pages of
    page_size tokens like the KV pool. Needed for every page of a hit (ALL_PAGES)."""

    def __init__(self, pages, page_size, layer_num, index_dim):
        self.page_size = page_size
        self.buffer = np.zeros((pages * page_size, layer_num, index_dim), np.uint8)
        self._free = list(range(0, pages * page_size, page_size))

    def alloc(self, num_tokens):
        pages = [self._free.pop(0) for _ in range(num_tokens // self.page_size)]
        return np.array([p + i for p in pages for i in range(self.page_size)], np.int64)

    def get_data_page(self, index, flat=True):
        page = self.buffer[index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return np.zeros(self.buffer[0:self.page_size].size, np.uint8)

    def set_from_flat_data_page(self, index, data_page):
        self.buffer[index:index + self.page_size] = data_page.reshape(self.buffer[index:index + self.page_size].shape)

    def page(self, index):
        return self.buffer[index:index + self.page_size].copy()

    def fill(self, index, seed):
        rng = np.random.default_rng(seed)
        self.buffer[index:index + self.page_size] = rng.integers(
            0, 256, size=self.buffer[index:index + self.page_size].shape, dtype=np.uint8)


class HybridController(StandInController):
    """The storage half of one TP rank of SGLang's hybrid-pool controller: the KV pool plus extra pools,
    `extra_pools` = {name: (host pool, hit policy, trailing pages)}."""

    def __init__(self, extra_config, storage_config, host_pool, extra_pools):
        super().__init__(extra_config, storage_config, host_pool)
        self.extra_pools = extra_pools
        for name, (pool, _, _) in extra_pools.items():
            self.storage_backend.register_mem_host_pool_v2(pool, PoolName(name))

    def backup_hybrid(self, host_indices, token_ids, extra_pages, pause=None):
        """_page_backup: the extra pools' pages first (batch_set_v2), then the KV pages. extra_pages =
        {name: (page numbers of the prompt, host indices of their slots)}. `pause`, when given, runs
        between the two (a writer to be killed there waits in it)."""
        hash_value = self.page_hashes(token_ids)
        transfers = [PoolTransfer(name=PoolName(name), keys=[hash_value[p] for p in pages], host_indices=indices,
                                  hit_policy=self.extra_pools[name][1])
                     for name, (pages, indices) in extra_pages.items()]
        results = self.storage_backend.batch_set_v2(transfers) if transfers else {}
        if pause is not None:
            pause()
        return results, self.backup(host_indices, token_ids)

    def prefetch_hybrid(self, token_ids):
        """_storage_hit_query with the pools' transfers, the KV pages (page_transfer), then, once every KV
        page of the hit arrived, the extra pools (batch_get_v2) with trailing keys re-aligned to the hit
        (_sync_trailing_keys). Returns (hit pages, KV tokens loaded, KV host indices, transfers, results)."""
        prefetch_length = len(token_ids) - len(token_ids) % self.page_size
        hashes = self.page_hashes(token_ids[:prefetch_length])
        transfers = []
        for name, (_, policy, trailing) in self.extra_pools.items():
            keys = hashes[-trailing:] if policy == PoolHitPolicy.TRAILING_PAGES else list(hashes)
            transfers.append(PoolTransfer(name=PoolName(name), keys=keys, hit_policy=policy))
        hit = self.storage_backend.batch_exists_v2(hashes, transfers, HiCacheStorageExtraInfo())
        hit_pages = hit.kv_hit_pages
        host_indices = self.mem_pool_host.alloc(hit_pages * self.page_size)
        completed = self.page_transfer(hashes[:hit_pages], host_indices)
        results = None
        if hit_pages and completed == hit_pages * self.page_size:
            for t in transfers:
                pool, policy, trailing = self.extra_pools[t.name.value]
                if policy == PoolHitPolicy.TRAILING_PAGES:
                    t.keys = hashes[max(0, hit_pages - trailing):hit_pages]
                else:
                    t.keys = hashes[:hit_pages]
                t.host_indices = pool.alloc(len(t.keys) * pool.page_size)
            results = self.storage_backend.batch_get_v2(transfers)
        return hit_pages, completed, host_indices, transfers, results


# -- one hybrid model shared by the tests and the writer process they kill ---------------------------

HYBRID_PAGE = 4  # tokens per page


def hybrid_extra_config(members, tenant, zero_copy=True):
    return {"backend_name": "kvtier", "module_path": "kvtier.adapters.sglang", "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1 if zero_copy else 0, "members": ",".join(members), "tenant": tenant,
            "rpc_timeout_ms": 5000}


def make_hybrid_controller(extra, pages=512, mamba_trailing=1):
    """A Qwen3-Next-like hybrid model: KV pages, a Mamba state per backed-up prefix (TRAILING_PAGES) and
    sparse-indexer pages for every page (ALL_PAGES)."""
    pool = MHAHostPool(pages, HYBRID_PAGE, layer_num=3, head_num=4, head_dim=16)
    mamba = MambaHostPool(pages, layer_num=3, state_dim=24)
    indexer = IndexerHostPool(pages, HYBRID_PAGE, layer_num=3, index_dim=32)
    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, is_mla_model=False, model_name="Qwen/Qwen3-Next-80B-A3B",
                                  extra_config=dict(extra))
    return HybridController(extra, config, pool, {
        "mamba": (mamba, PoolHitPolicy.TRAILING_PAGES, mamba_trailing),
        "indexer": (indexer, PoolHitPolicy.ALL_PAGES, 1),
    })


def page_seed(seed, pool, page):
    return seed * 1_000_003 + {"kv": 0, "mamba": 1, "indexer": 2}[pool] * 100_003 + page


def write_hybrid_prompt(controller, tokens, seed, mamba_pages=None, indexer_pages=None, pause=None):
    """Computes a prompt's pages into the host pools (contents from `seed`) and backs them up as the
    hybrid controller does: extra pools, then KV. Mamba states default to the last page (the state
    after the prompt), indexer pages to every page. Returns backup_hybrid's (results, KV tokens)."""
    n = len(tokens) // HYBRID_PAGE
    kv_pool = controller.mem_pool_host
    mamba, indexer = controller.extra_pools["mamba"][0], controller.extra_pools["indexer"][0]
    mamba_pages = [n - 1] if mamba_pages is None else list(mamba_pages)
    indexer_pages = list(range(n)) if indexer_pages is None else list(indexer_pages)
    kv_idx = kv_pool.alloc(n * HYBRID_PAGE)
    for p in range(n):
        kv_pool.fill(int(kv_idx[p * HYBRID_PAGE]), page_seed(seed, "kv", p))
    m_idx = mamba.alloc(len(mamba_pages))
    for slot, p in zip(m_idx, mamba_pages):
        mamba.fill(int(slot), page_seed(seed, "mamba", p))
    i_idx = indexer.alloc(len(indexer_pages) * HYBRID_PAGE)
    for k, p in enumerate(indexer_pages):
        indexer.fill(int(i_idx[k * HYBRID_PAGE]), page_seed(seed, "indexer", p))
    return controller.backup_hybrid(kv_idx, tokens, {"mamba": (mamba_pages, m_idx), "indexer": (indexer_pages, i_idx)},
                                    pause=pause)


def expected_page(controller, pool_name, seed, page):
    """What write_hybrid_prompt put in `pool_name`'s page `page` (filled into a scratch slot)."""
    pool = controller.mem_pool_host if pool_name == "kv" else controller.extra_pools[pool_name][0]
    scratch = type(pool).__new__(type(pool))
    scratch.__dict__.update(pool.__dict__)
    if pool_name == "kv":
        scratch.kv_buffer = np.zeros_like(pool.kv_buffer[:, :HYBRID_PAGE])  # [2, page, layers, heads, dim]
    else:
        scratch.buffer = np.zeros_like(pool.buffer[:pool.page_size])
    scratch.fill(0, page_seed(seed, pool_name, page))
    return scratch.page(0)


def hybrid_prompt(j, pages=6):
    """Prompt j of the writer process: its own tokens, `pages` full pages."""
    return list(range(100_000 + 1000 * j, 100_000 + 1000 * j + pages * HYBRID_PAGE))
