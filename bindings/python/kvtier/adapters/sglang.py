"""SGLang hierarchical-cache (HiCache) storage backend on kvtier.

Targets SGLang's ``HiCacheStorage`` interface (python/sglang/srt/mem_cache/hicache_storage.py) as the
``HiCacheController`` (python/sglang/srt/managers/cache_controller.py) drives it; bindings/python/README.md
names the revision. Point SGLang at it with configuration only:

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
          "module_path": "kvtier.adapters.sglang", "class_name": "KvtierHiCacheStorage",
          "interface_v1": 1, "members": ["10.0.0.1:7000", "10.0.0.2:7000"], "tenant": "acme"}'

``interface_v1: 1`` makes SGLang use the zero-copy calls (batch_get_v1 / batch_set_v1: kvtier reads and
writes SGLang's host pool pages in place); without it SGLang uses batch_get / batch_set with flat page
tensors.

How SGLang's calls map onto kvtier
- A key is SGLang's page hash (a hex SHA-256 chained over the page's tokens and the previous hash), so
  it already names a whole prefix. kvtier.external_key_fingerprints turns it into a kvtier fingerprint
  inside this backend's namespace (tenant, model, revision, and a layout describing one page); the host
  pool layout and the interface are part of the key, because they decide the byte order of a page.
- KV events: writes name each page as SGLang's own events do (hash_str_to_int64 of the key: its first
  16 hex digits as a signed 64-bit int; KVCacheEventRecorder in python/sglang/srt/mem_cache/events.py,
  read at commit 06f643f402f0d7e1c4fd480f6854b742fa642951), with the previous page as the parent
  (extra_info.prefix_keys[-1] for a batch's first page, with its fingerprint), so routers that read
  SGLang's events match kvtier's blocks. SGLang gives a storage backend no token ids: the events carry
  none.
- One SGLang page = one kvtier block: block_tokens = page_size and block_bytes = the page's bytes on
  this TP rank. MHA models store one shard per TP rank (shard = tp_rank, tp_size = the engine's), and
  batch_exists counts a page only when every rank's shard is present, which is what SGLang's min
  all-reduce over ranks computes anyway. MLA models store one replicated shard (tp_size 1, shard 0),
  written by rank 0 only (SGLang skips the backup on other ranks).
- Block arithmetic: batch_exists returns the number of leading keys present (pages, not tokens);
  SGLang multiplies by page_size, so reusable tokens are always a multiple of the page size. SGLang
  itself never skips the last prompt token (Req.adjust_max_prefix_ids keeps at most len(prompt) - 1
  tokens from any cache), so this backend does not cap the count: it only sees keys.
- Failures never raise into SGLang's prefetch/backup threads (an exception there disables storage for
  the life of the process): a kvtier error is logged and reported as misses / failed writes.
- Hybrid models (v2: register_mem_host_pool_v2, batch_exists_v2, batch_get_v2, batch_set_v2 with
  PoolTransfer descriptors): each extra pool (Mamba states, sliding-window or indexer pages) has its own
  namespace, whose block is one page of that pool as bytes, and its own keys ("sglang:pool=<name>:" +
  key). A page's entry is its KV block plus the extra-pool blocks its hit policies ask for, and it is
  present or absent as a whole: the extra blocks are committed before the KV block (batch_set_v2 writes
  extra pools before KV, and a KV page whose extra-pool write failed is not written, in batch_set_v2 or
  in the following batch_set_v1 / batch_set), and batch_exists_v2 counts a page only when its KV block and
  every extra block its policies require are there. A writer that dies between the two leaves extra
  blocks without a KV block, which no lookup counts; eviction of an extra block hides its entry the same
  way.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

import kvtier

from ._common import connect, dtype_name, logger, optional_str

try:  # Subclass SGLang's ABC when SGLang is installed (its backend factory checks issubclass).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - SGLang is not installable here
    _Base = object

try:  # The v2 result type, when this SGLang has the pool-aware interface.
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
except ImportError:  # pragma: no cover - SGLang is not installable here

    @dataclasses.dataclass
    class PoolTransferResult:  # the fields of SGLang's PoolTransferResult
        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int]

_KV_POOL = "kv"  # PoolName.KV
_TRAILING_PAGES = "trailing_pages"  # PoolHitPolicy.TRAILING_PAGES (ALL_PAGES is the other)
_SHARDED_POOLS_DEFAULT = ("mamba",)  # extra pools split across TP ranks even for MLA models
_MAX_BLOCKED_KEYS = 1 << 16

_WRITE_OK = (kvtier.PutResult.STORED, kvtier.PutResult.ALREADY_PRESENT, kvtier.PutResult.IN_PROGRESS)


def _event_block_hash(key: Any) -> Optional[int]:
    """SGLang's KV-event hash of a page: hash_str_to_int64 of its page hash (the first 16 hex digits as a
    signed 64-bit int), what SGLang's own BlockStored events carry for a page without extra_key or
    cache_salt; None for a key that is not a hex page hash."""
    if not isinstance(key, str) or len(key) < 16:
        return None
    try:
        value = int(key[:16], 16)
    except ValueError:
        return None
    return value - (1 << 64) if value >= (1 << 63) else value


def _index_list(indices: Any) -> List[int]:
    tolist = getattr(indices, "tolist", None)
    return [int(i) for i in (tolist() if tolist is not None else indices)]


def _take(indices: Any, positions: List[int]) -> Any:
    """indices[positions] for a torch tensor or numpy array (fancy indexing), or a plain sequence."""
    try:
        return indices[positions]
    except TypeError:
        return [indices[p] for p in positions]


def _as_contiguous(value: Any) -> Any:
    contiguous = getattr(value, "contiguous", None)  # torch tensors: a page view may be strided
    return contiguous() if callable(contiguous) else value


def _pool_name(name: Any) -> str:
    """'mamba' for PoolName.MAMBA, 'mamba', ...: SGLang's pool names are str enums."""
    return str(getattr(name, "value", name))


@dataclasses.dataclass
class _ExtraPool:
    """An extra host pool of a hybrid model and the namespace its pages are stored in."""

    host_pool: Any
    ns: kvtier.Namespace
    key_prefix: str
    shard: int
    page_size: int  # host-pool slots per page (1 for a Mamba state pool)


class KvtierHiCacheStorage(_Base):
    """HiCacheStorage on a kvtier cluster. Construct as SGLang's dynamic backend factory does:
    ``KvtierHiCacheStorage(storage_config, kwargs)``; ``storage_config.extra_config`` carries:

    members (["host:port", ...] or "h:p,h:p") or members_dns ("NAME:PORT"): one is required; tenant
    (default "default"); revision; tenant_salt; model (default storage_config.model_name); dtype and
    layout (a dict of KvLayout fields, to override what is read from the host pool); auth_token_file;
    and every Client option by its name (kvtier.ClientOptions.KEYWORDS: dns_server, transport,
    tls_ca_file, tls_cert_file, tls_key_file, tls_server_name, auth_token, replication_factor,
    replication_overrides, rpc_timeout_ms, ...).
    ``client=`` may pass an existing kvtier.Client (shared, not closed by close()).
    """

    def __init__(self, storage_config: Any, kwargs: Optional[Mapping[str, Any]] = None, *,
                 client: Optional[kvtier.Client] = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        self._config = extra
        self._tp_rank = int(getattr(storage_config, "tp_rank", 0))
        self._tp_size = int(getattr(storage_config, "tp_size", 1))
        self._is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self._model = str(extra.get("model") or getattr(storage_config, "model_name", None) or "unknown-model")
        self._zero_copy = bool(int(extra.get("interface_v1", 0)))
        self._owns_client = client is None
        self._client = client if client is not None else connect(extra)
        self.ns: Optional[kvtier.Namespace] = None
        self._key_prefix = ""
        self.mem_pool_host = None
        self.registered_pools: Dict[Any, Any] = {}  # SGLang's attribute: pool name -> host pool
        self._extra_pools: Dict[str, _ExtraPool] = {}
        self._sharded_pools = set(extra.get("sharded_pools", _SHARDED_POOLS_DEFAULT))
        # KV pages whose extra-pool pages failed to be written: their KV page is not written either.
        self._blocked_kv_keys: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._blocked_lock = threading.Lock()

    # -- setup ---------------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Called by HiCacheController after construction: derives the namespace from the host pool."""
        self.mem_pool_host = mem_pool_host
        layout = self._layout_from_pool(mem_pool_host)
        self.ns = kvtier.Namespace(
            str(self._config.get("tenant", "default")),
            self._model,
            optional_str(self._config, "revision"),
            tenant_salt=self._config.get("tenant_salt"),
            **layout,
        )
        host_layout = str(getattr(mem_pool_host, "layout", "unknown"))
        # The byte order of a page differs between host layouts, and between the zero-copy segments and
        # the flat page of the generic path: keep them apart.
        self._key_prefix = f"sglang:{host_layout}:{'v1' if self._zero_copy else 'flat'}:"
        logger.info("kvtier HiCache backend: %r, tp_rank %d, keys %s*", self.ns, self._tp_rank, self._key_prefix)

    def _layout_from_pool(self, pool: Any) -> dict:
        fields: dict = {
            "block_tokens": int(pool.page_size),
            "num_layers": int(pool.layer_num),
            "dtype": dtype_name(self._config.get("dtype") or pool.dtype),
        }
        if self._is_mla:
            latent = getattr(pool, "kv_lora_rank", None)
            rope = getattr(pool, "qk_rope_head_dim", None)
            fields.update(kind="mla", tp_size=1)
            if latent is not None:
                fields["latent_dim"] = int(latent) + int(rope or 0)
        else:
            # The host pool holds this rank's heads; kvtier's layout counts the whole model's.
            fields.update(tp_size=self._tp_size)
            if getattr(pool, "head_num", None) is not None:
                fields.update(num_kv_heads=int(pool.head_num) * self._tp_size, head_dim=int(pool.head_dim))
        fields.update(self._config.get("layout") or {})
        return fields

    @property
    def _shard(self) -> int:
        return 0 if self._is_mla else self._tp_rank

    def _fingerprints(self, keys: Sequence[str]) -> list:
        if self.ns is None:
            raise RuntimeError("kvtier: register_mem_pool_host() must be called before any I/O")
        return kvtier.external_key_fingerprints(self.ns, [self._key_prefix + k for k in keys])

    @staticmethod
    def _first_index(extra_info: Any) -> int:
        prefix_keys = getattr(extra_info, "prefix_keys", None)
        return len(prefix_keys) if prefix_keys else 0

    def _engine_meta(self, keys: Sequence[str], extra_info: Any) -> dict:
        """put()'s engine-metadata keywords for KV pages `keys`: SGLang's event hash of each page and of
        the page before the first (extra_info.prefix_keys[-1]), and that page's kvtier fingerprint.
        Empty when a key is not a page hash (then the events name the pages by fingerprint)."""
        hashes = [_event_block_hash(k) for k in keys]
        if any(h is None for h in hashes):
            return {}
        meta: dict = {"block_hashes": hashes}
        prefix_keys = getattr(extra_info, "prefix_keys", None)
        if prefix_keys:
            parent = _event_block_hash(prefix_keys[-1])
            if parent is not None:
                meta["parent_hash"] = parent
            meta["parent_fingerprint"] = self._fingerprints([prefix_keys[-1]])[0]
        return meta

    # -- existence -----------------------------------------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Number of leading `keys` (pages) stored on every TP shard."""
        if not keys:
            return 0
        try:
            return int(self._client.lookup(self.ns, self._fingerprints(keys)))
        except Exception:  # never into SGLang's prefetch thread
            logger.exception("kvtier: batch_exists of %d keys failed; reporting 0", len(keys))
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- zero-copy (interface_v1) ----------------------------------------------------------------------

    def _page_segments(self, keys: Sequence[str], host_indices: Any):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) % max(len(keys), 1) != 0:
            raise ValueError(f"kvtier: host pool gave {len(ptrs)} segments for {len(keys)} pages")
        return list(ptrs), sizes if isinstance(sizes, int) else list(sizes)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads each page straight into the host pool slots `host_indices` (page_size slots per key)."""
        if not keys:
            return []
        try:
            ptrs, sizes = self._page_segments(keys, host_indices)
            results = self._client.get_ptrs(self.ns, self._fingerprints(keys), ptrs, sizes, shard=self._shard)
            return [r == kvtier.GetResult.HIT for r in results]
        except Exception:
            logger.exception("kvtier: batch_get_v1 of %d keys failed", len(keys))
            return [False] * len(keys)

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Writes each page from the host pool slots `host_indices` (not the pages whose extra-pool pages
        failed in the batch_set_v2 before: those report False)."""
        if not keys:
            return []
        blocked = self._take_blocked(keys)
        if any(blocked):
            keep = [i for i, b in enumerate(blocked) if not b]
            page = int(self.mem_pool_host.page_size)
            positions = [i * page + j for i in keep for j in range(page)]
            written = self.batch_set_v1([keys[i] for i in keep], _take(host_indices, positions), extra_info)
            out = [False] * len(keys)
            for i, ok in zip(keep, written):
                out[i] = ok
            return out
        try:
            ptrs, sizes = self._page_segments(keys, host_indices)
            results = self._client.put_ptrs(self.ns, self._fingerprints(keys), ptrs, sizes, shard=self._shard,
                                            first_block_index=self._first_index(extra_info),
                                            **self._engine_meta(keys, extra_info))
            return [r in _WRITE_OK for r in results]
        except Exception:
            logger.exception("kvtier: batch_set_v1 of %d keys failed", len(keys))
            return [False] * len(keys)

    # -- generic path (flat page tensors) ------------------------------------------------------------

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Any]:
        """Fills each target (a flat, contiguous CPU page: torch tensor, numpy array or bytearray) and
        returns it, or None for a page that is not stored. Without targets, returns new numpy pages."""
        if not keys:
            return []
        try:
            if target_locations is None:
                import numpy as np

                target_locations = [np.empty(self.ns.block_bytes, np.uint8) for _ in keys]
            results = self._client.get(self.ns, self._fingerprints(keys), list(target_locations), shard=self._shard)
            return [t if r == kvtier.GetResult.HIT else None for t, r in zip(target_locations, results)]
        except Exception:
            logger.exception("kvtier: batch_get of %d keys failed", len(keys))
            return [None] * len(keys)

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> Any:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores each flat page of `values`; True when every page is (or is being) stored."""
        if not keys:
            return True
        blocked = self._take_blocked(keys)
        if any(blocked):
            keep = [i for i, b in enumerate(blocked) if not b]
            self.batch_set([keys[i] for i in keep], [values[i] for i in keep])
            return False
        try:
            pages = [_as_contiguous(v) for v in values]
            results = self._client.put(self.ns, self._fingerprints(keys), pages, shard=self._shard,
                                       **self._engine_meta(keys, None))
            return all(r in _WRITE_OK for r in results)
        except Exception:
            logger.exception("kvtier: batch_set of %d keys failed", len(keys))
            return False

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    # -- hybrid models: the pool-aware (v2) interface -------------------------------------------------

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Registers one host pool of a hybrid model. The KV pool is the one register_mem_pool_host()
        describes; any other pool gets its own namespace: one page of it (get_dummy_flat_data_page(), as
        bytes) per block, shard tp_rank of tp_size, except a pool replicated across ranks (any pool of an
        MLA model but those in the "sharded_pools" config, default ["mamba"]) which is one shard."""
        name = _pool_name(host_pool_name)
        self.registered_pools[host_pool_name] = host_pool
        if name == _KV_POOL:
            if self.mem_pool_host is None:
                self.register_mem_pool_host(host_pool)
            return
        page = host_pool.get_dummy_flat_data_page()
        page_bytes = int(page.nbytes) if hasattr(page, "nbytes") else int(page.numel() * page.element_size())
        replicated = self._is_mla and name not in self._sharded_pools
        layout = {"kind": "mla", "dtype": "fp8_e4m3", "num_layers": 1, "block_tokens": 1, "latent_dim": page_bytes,
                  "tp_size": 1 if replicated else self._tp_size}
        layout.update((self._config.get("pool_layouts") or {}).get(name, {}))
        ns = kvtier.Namespace(str(self._config.get("tenant", "default")), self._model,
                              optional_str(self._config, "revision"), tenant_salt=self._config.get("tenant_salt"),
                              **layout)
        self._extra_pools[name] = _ExtraPool(host_pool=host_pool, ns=ns, key_prefix=f"sglang:pool={name}:",
                                             shard=0 if replicated else self._tp_rank,
                                             page_size=int(getattr(host_pool, "page_size", 1) or 1))
        logger.info("kvtier HiCache backend: extra pool %s, %d bytes per page, %s", name, page_bytes,
                    "replicated" if replicated else f"shard {self._tp_rank} of {self._tp_size}")

    def _present(self, ns: kvtier.Namespace, fingerprints: list) -> List[bool]:
        return list(self._client.lookup_detail(ns, fingerprints).present) if fingerprints else []

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Any = None) -> PoolTransferResult:
        """The longest usable prefix of `keys`: KV pages present on every TP shard, cut where an extra
        pool's hit policy fails. ALL_PAGES: that pool's page must exist for every page of the prefix.
        TRAILING_PAGES: its pages must exist for the last len(transfer.keys) pages of the prefix (the
        prefix shrinks to the longest one that satisfies this). kv_hit_pages is the usable prefix;
        extra_pool_hit_pages has each pool's own boundary (and the KV run under "kv")."""
        if not keys:
            return PoolTransferResult(0, {})
        try:
            kv_present = self._present(self.ns, self._fingerprints(keys))
            kv_pages = next((i for i, ok in enumerate(kv_present) if not ok), len(keys))
            hits: Dict[str, int] = {_KV_POOL: kv_pages} if kv_pages else {}
            final = kv_pages
            for transfer in pool_transfers or []:
                if final == 0:
                    break
                name = _pool_name(transfer.name)
                pool = self._extra_pools.get(name)
                if pool is None:
                    logger.warning("kvtier: batch_exists_v2 names pool %r, which was never registered", name)
                    final = 0
                    break
                present = self._present(pool.ns, self._pool_fingerprints(pool, keys[:kv_pages]))
                if _pool_name(transfer.hit_policy) == _TRAILING_PAGES:
                    trailing = max(1, len(transfer.keys or ()))
                    boundary = next((end for end in range(kv_pages, 0, -1)
                                     if all(present[max(0, end - trailing):end])), 0)
                else:
                    boundary = next((i for i, ok in enumerate(present) if not ok), kv_pages)
                if boundary:
                    hits[name] = boundary
                final = min(final, boundary)
            return PoolTransferResult(final, hits)
        except Exception:  # never into SGLang's prefetch thread
            logger.exception("kvtier: batch_exists_v2 of %d keys failed; reporting 0", len(keys))
            return PoolTransferResult(0, {})

    def _pool_fingerprints(self, pool: _ExtraPool, keys: Sequence[str]) -> list:
        return kvtier.external_key_fingerprints(pool.ns, [pool.key_prefix + k for k in keys])

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[str, List[bool]]:
        """Reads each transfer's pages (transfer.keys) into its host slots (transfer.host_indices,
        page_size slots per key). {pool name: one bool per key}."""
        return {_pool_name(t.name): self._transfer_pages(t, write=False) for t in transfers}

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None) -> Dict[str, List[bool]]:
        """Writes each transfer's pages from its host slots, extra pools before KV: a KV page (in a KV
        transfer here, or in the batch_set_v1 / batch_set that follows) whose extra-pool page failed is
        not written. {pool name: one bool per key}."""
        results: Dict[str, List[bool]] = {}
        blocked = set()
        for t in transfers:
            name = _pool_name(t.name)
            if name == _KV_POOL:
                continue
            results[name] = self._transfer_pages(t, write=True)
            blocked.update(k for k, ok in zip(t.keys or [], results[name]) if not ok)
        self._block_kv_keys(blocked)
        for t in transfers:
            if _pool_name(t.name) == _KV_POOL:
                results[_KV_POOL] = self._kv_transfer(t, write=True)
        return results

    def _transfer_pages(self, transfer: Any, write: bool) -> List[bool]:
        name = _pool_name(transfer.name)
        keys = list(transfer.keys or [])
        if not keys:
            return []
        if name == _KV_POOL:
            return self._kv_transfer(transfer, write)
        pool = self._extra_pools.get(name)
        try:
            if pool is None:
                raise ValueError(f"pool {name!r} was never registered (register_mem_host_pool_v2)")
            indices = _index_list(transfer.host_indices if transfer.host_indices is not None else [])
            if len(indices) != len(keys) * pool.page_size:
                raise ValueError(f"pool {name!r}: {len(indices)} host indices for {len(keys)} pages of "
                                 f"{pool.page_size} slots")
            slots = [indices[i * pool.page_size] for i in range(len(keys))]
            fps = self._pool_fingerprints(pool, keys)
            if write:
                pages = [_as_contiguous(pool.host_pool.get_data_page(slot, flat=True)) for slot in slots]
                results = self._client.put(pool.ns, fps, pages, shard=pool.shard)
                return [r in _WRITE_OK for r in results]
            pages = [pool.host_pool.get_dummy_flat_data_page() for _ in keys]
            results = self._client.get(pool.ns, fps, pages, shard=pool.shard)
            ok = [r == kvtier.GetResult.HIT for r in results]
            for slot, page, hit in zip(slots, pages, ok):
                if hit:
                    pool.host_pool.set_from_flat_data_page(slot, page)
            return ok
        except Exception:
            logger.exception("kvtier: batch_%s_v2 of %d %s pages failed", "set" if write else "get", len(keys), name)
            return [False] * len(keys)

    def _kv_transfer(self, transfer: Any, write: bool) -> List[bool]:
        keys = list(transfer.keys or [])
        if self._zero_copy:
            return self.batch_set_v1(keys, transfer.host_indices) if write else self.batch_get_v1(keys, transfer.host_indices)
        indices = _index_list(transfer.host_indices)
        page = self.mem_pool_host.page_size
        if write:
            return [self.batch_set([k], [self.mem_pool_host.get_data_page(indices[i * page], flat=True)])
                    for i, k in enumerate(keys)]
        got = self.batch_get(keys, [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys])
        for i, data in enumerate(got):
            if data is not None:
                self.mem_pool_host.set_from_flat_data_page(indices[i * page], data)
        return [data is not None for data in got]

    def _block_kv_keys(self, keys: set) -> None:
        if not keys:
            return
        with self._blocked_lock:
            for k in keys:
                self._blocked_kv_keys[k] = None
                self._blocked_kv_keys.move_to_end(k)
            while len(self._blocked_kv_keys) > _MAX_BLOCKED_KEYS:
                self._blocked_kv_keys.popitem(last=False)

    def _take_blocked(self, keys: Sequence[str]) -> List[bool]:
        """Per key: True when its extra-pool page failed, so its KV page must not be written (once)."""
        if not self._blocked_kv_keys:
            return [False] * len(keys)
        with self._blocked_lock:
            return [self._blocked_kv_keys.pop(k, 0) is None for k in keys]

    # -- housekeeping --------------------------------------------------------------------------------

    def clear(self) -> bool:
        """Not supported: the cluster is shared by every engine; evict with the servers' policies."""
        logger.warning("kvtier: clear() is not supported on a shared cluster; nothing was removed")
        return False

    def stats(self) -> dict:
        """The kvtier client's counters (get_stats() keeps SGLang's default of None)."""
        return self._client.stats()

    def close(self) -> None:
        if self._owns_client:
            self._client.close()
