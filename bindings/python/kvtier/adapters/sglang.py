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
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

import kvtier

from ._common import connect, dtype_name, logger, optional_str

try:  # Subclass SGLang's ABC when SGLang is installed (its backend factory checks issubclass).
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # pragma: no cover - SGLang is not installable here
    _Base = object

_WRITE_OK = (kvtier.PutResult.STORED, kvtier.PutResult.ALREADY_PRESENT, kvtier.PutResult.IN_PROGRESS)


def _index_list(indices: Any) -> List[int]:
    tolist = getattr(indices, "tolist", None)
    return [int(i) for i in (tolist() if tolist is not None else indices)]


def _as_contiguous(value: Any) -> Any:
    contiguous = getattr(value, "contiguous", None)  # torch tensors: a page view may be strided
    return contiguous() if callable(contiguous) else value


class KvtierHiCacheStorage(_Base):
    """HiCacheStorage on a kvtier cluster. Construct as SGLang's dynamic backend factory does:
    ``KvtierHiCacheStorage(storage_config, kwargs)``; ``storage_config.extra_config`` carries:

    members (required): ["host:port", ...] or "h:p,h:p"; tenant (default "default"); revision;
    tenant_salt; model (default storage_config.model_name); dtype and layout (a dict of KvLayout fields,
    to override what is read from the host pool); and Client options (rpc_timeout_ms, ...).
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
        """Writes each page from the host pool slots `host_indices`."""
        if not keys:
            return []
        try:
            ptrs, sizes = self._page_segments(keys, host_indices)
            results = self._client.put_ptrs(self.ns, self._fingerprints(keys), ptrs, sizes, shard=self._shard,
                                            first_block_index=self._first_index(extra_info))
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
        try:
            pages = [_as_contiguous(v) for v in values]
            results = self._client.put(self.ns, self._fingerprints(keys), pages, shard=self._shard)
            return all(r in _WRITE_OK for r in results)
        except Exception:
            logger.exception("kvtier: batch_set of %d keys failed", len(keys))
            return False

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

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
