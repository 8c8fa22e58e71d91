"""A vLLM v1 KV connector on kvtier.

Targets vLLM's ``KVConnectorBase_V1`` (vllm/distributed/kv_transfer/kv_connector/v1/base.py), in the shape
of vLLM's own ExampleConnector; bindings/python/README.md names the revision. Point vLLM at it with
configuration only:

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.adapters.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"members": ["10.0.0.1:7000"], "tenant": "acme"}}'

Flow (one connector instance per role, as vLLM creates them)
- Scheduler: get_num_new_matched_tokens() fingerprints the prompt (kvtier.fingerprints: namespace,
  tokens, LoRA, cache_salt, multimodal hashes) and asks the cluster for the leading run;
  update_state_after_alloc() records which of the request's blocks to load; build_connector_meta()
  turns that, and the prompt blocks that this step completes, into a picklable KvtierConnectorMetadata.
- Worker: start_load_kv() fetches the blocks into a staging buffer and scatters them into the paged KV
  cache of every layer (synchronously, so wait_for_layer_load() has nothing to wait for);
  wait_for_save() gathers finished prompt blocks from every layer and stores them. save_kv_layer() does
  nothing, because one kvtier block holds all layers of a block ([num_layers, 2, block_tokens,
  num_kv_heads / tp_size, head_dim]), which exists only once the last layer has run.
- A block that fails to load is reported by get_block_ids_with_load_errors(), so vLLM recomputes it.

Block arithmetic (what vLLM relies on): the matched count is hit_blocks * block_size, capped at
(len(prompt) - 1) // block_size * block_size -- vLLM must compute at least the last prompt token to
get logits -- and minus the tokens vLLM already has locally (num_computed_tokens, itself a multiple of
block_size). So it is always a multiple of block_size and never more than len(prompt) - 1 -
num_computed_tokens. Only prompt tokens are stored (generated tokens are not).

Paged KV layout per layer (kv_connector_extra_config "kv_layout"):
  "nhd" (default; FlashAttention): [2, num_blocks, block_size, num_kv_heads, head_dim]
  "blocks_first" (FlashInfer):      [num_blocks, 2, block_size, num_kv_heads, head_dim]
  "mla":                             [num_blocks, block_size, latent_dim]
Tensors may be torch (any device; staging is on the CPU) or numpy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import kvtier

from ._common import connect, dtype_name, logger, optional_str

try:  # Subclass vLLM's ABC when vLLM is installed.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1 as _Base,
        KVConnectorMetadata as _MetaBase,
        KVConnectorRole,
    )

    _SCHEDULER_ROLE = KVConnectorRole.SCHEDULER
except ImportError:  # pragma: no cover - vLLM is not installable here
    _Base = object
    _MetaBase = object
    _SCHEDULER_ROLE = "scheduler"


def reusable_prompt_tokens(hit_blocks: int, block_size: int, prompt_tokens: int) -> int:
    """Tokens vLLM may skip for a prompt whose first `hit_blocks` blocks are cached: whole blocks, and
    never the last prompt token (vLLM computes it for the logits)."""
    return kvtier.reusable_tokens(hit_blocks, block_size, prompt_tokens, keep_last=1)


@dataclasses.dataclass
class BlockTransfer:
    """Blocks of one request to load or save. fingerprints[i] belongs in vLLM block block_ids[i]; the
    first is block `first_block_index` of the prompt's chain."""

    request_id: str
    fingerprints: List[bytes]
    block_ids: List[int]
    first_block_index: int


@dataclasses.dataclass
class KvtierConnectorMetadata(_MetaBase):
    """Scheduler -> worker metadata of one step (picklable: vLLM ships it to worker processes)."""

    loads: List[BlockTransfer] = dataclasses.field(default_factory=list)
    saves: List[BlockTransfer] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _RequestState:
    """Scheduler-side bookkeeping of one running request."""

    fingerprints: List[bytes]  # of the prompt's full blocks
    block_ids: List[int] = dataclasses.field(default_factory=list)
    stored_blocks: int = 0  # leading prompt blocks known to be in kvtier (hit or saved)


def _block_ids(blocks: Any) -> List[int]:
    """The first KV-cache group's block ids of a KVCacheBlocks (or of a plain list/tuple)."""
    get = getattr(blocks, "get_block_ids", None)
    ids = get() if get is not None else blocks
    if ids and isinstance(ids[0], (list, tuple)):  # tuple of per-group lists
        ids = ids[0]
    return [int(b) for b in ids]


def _extra_keys(request: Any) -> Optional[dict]:
    """kvtier extra keys of a vLLM Request, or None when it has inputs that cannot be keyed."""
    keys: dict = {}
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        keys["lora"] = (str(getattr(lora, "lora_name", lora)), int(getattr(lora, "lora_int_id", 0)))
    salt = getattr(request, "cache_salt", None)
    if salt:
        keys["cache_salt"] = salt
    features = getattr(request, "mm_features", None) or []
    if features:
        mm = []
        for f in features:
            pos = getattr(f, "mm_position", None)
            ident = getattr(f, "identifier", None)
            if pos is None or ident is None:
                return None  # unknown multimodal input: refuse rather than risk a wrong hit
            mm.append((str(ident), int(pos.offset), int(pos.length)))
        keys["multimodal"] = mm
    return keys


class KvtierConnector(_Base):
    """vLLM KV connector storing prompt KV blocks in kvtier. See the module docstring.

    kv_connector_extra_config keys: members (required); tenant (default "default"); revision (default
    the model revision); tenant_salt; kv_layout ("nhd" | "blocks_first" | "mla"); num_layers,
    num_kv_heads, head_dim, latent_dim, dtype (read from vllm_config when absent); tp_rank (worker;
    default from vLLM's parallel state); and Client options (rpc_timeout_ms, ...).
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None, *,
                 client: Optional[kvtier.Client] = None):
        if _Base is not object:
            try:
                super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
            except TypeError:  # vLLM releases before kv_cache_config was added
                super().__init__(vllm_config=vllm_config, role=role)
        transfer = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(transfer, "kv_connector_extra_config", None) or {})
        self._config = extra
        self._role = role
        self._is_scheduler = role == _SCHEDULER_ROLE or str(role).upper().endswith("SCHEDULER")
        self._block_size = int(vllm_config.cache_config.block_size)
        self._kv_layout = str(extra.get("kv_layout", "mla" if self._use_mla(vllm_config) else "nhd"))
        self._tp_size = int(getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", 1))
        self._tp_rank = int(extra["tp_rank"]) if "tp_rank" in extra else self._vllm_tp_rank()
        self.ns = self._make_namespace(vllm_config, extra)
        self._owns_client = client is None
        self._client = client if client is not None else connect(extra)
        # Scheduler side.
        self._requests: Dict[str, _RequestState] = {}
        self._pending_loads: Dict[str, BlockTransfer] = {}
        self._matched: Dict[str, Tuple[int, int]] = {}  # request id -> (hit blocks, local blocks)
        # Worker side.
        self._kv_caches: Dict[str, Any] = {}
        self._load_errors: set = set()
        self._metadata: Optional[KvtierConnectorMetadata] = None

    # -- configuration -------------------------------------------------------------------------------

    @staticmethod
    def _use_mla(vllm_config: Any) -> bool:
        return bool(getattr(getattr(vllm_config, "model_config", None), "use_mla", False))

    @staticmethod
    def _vllm_tp_rank() -> int:
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            return int(get_tensor_model_parallel_rank())
        except Exception:  # scheduler process, or no vLLM
            return 0

    def _make_namespace(self, vllm_config: Any, extra: dict) -> kvtier.Namespace:
        mc = getattr(vllm_config, "model_config", None)
        pc = getattr(vllm_config, "parallel_config", None)

        def field(name: str, from_model):
            if name in extra:
                return extra[name]
            try:
                return from_model()
            except Exception as e:
                raise ValueError(f"kvtier: set '{name}' in kv_connector_extra_config ({e})") from None

        dtype = extra.get("dtype")
        if dtype is None:
            cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
            dtype = getattr(mc, "dtype", None) if cache_dtype in (None, "auto") else cache_dtype
        layout = {
            "num_layers": int(field("num_layers", lambda: mc.get_num_layers(pc))),
            "block_tokens": self._block_size,
            "dtype": dtype_name(dtype),
        }
        if self._kv_layout == "mla":
            # The latent cache is the same on every TP rank: one replicated shard, saved by rank 0.
            layout.update(kind="mla", tp_size=1, latent_dim=int(field("latent_dim", lambda: mc.get_head_size())))
        else:
            layout.update(
                tp_size=self._tp_size,
                num_kv_heads=int(field("num_kv_heads", lambda: mc.get_total_num_kv_heads())),
                head_dim=int(field("head_dim", lambda: mc.get_head_size())),
            )
        model = str(extra.get("model") or getattr(mc, "model", None) or "unknown-model")
        revision = optional_str(extra, "revision") or getattr(mc, "revision", None)
        return kvtier.Namespace(str(extra.get("tenant", "default")), model, revision,
                                tenant_salt=extra.get("tenant_salt"), **layout)

    @property
    def _shard(self) -> int:
        return 0 if self._kv_layout == "mla" else self._tp_rank

    # ===============================================================================================
    # Scheduler side
    # ===============================================================================================

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        """Tokens beyond num_computed_tokens that kvtier can supply: a multiple of the block size, never
        reaching the last prompt token. Loads are synchronous, so the second element is False."""
        prompt = list(getattr(request, "prompt_token_ids", None) or [])
        cap_blocks = max(len(prompt) - 1, 0) // self._block_size  # blocks before the last prompt token
        local_blocks = num_computed_tokens // self._block_size
        state = self._state_for(request, prompt)
        if state is None or cap_blocks <= local_blocks:
            return 0, False
        try:
            hit_blocks = self._client.lookup(self.ns, state.fingerprints[:cap_blocks])
        except Exception:
            logger.exception("kvtier: lookup for request %s failed; treating as a miss", request.request_id)
            return 0, False
        state.stored_blocks = max(state.stored_blocks, hit_blocks)
        matched = reusable_prompt_tokens(hit_blocks, self._block_size, len(prompt))
        new_tokens = max(matched - num_computed_tokens, 0)
        self._matched[request.request_id] = (hit_blocks, local_blocks)
        return new_tokens, False

    def _state_for(self, request: Any, prompt: Sequence[int]) -> Optional[_RequestState]:
        state = self._requests.get(request.request_id)
        if state is not None:
            return state
        extra = _extra_keys(request)
        if extra is None:
            return None
        fps = kvtier.fingerprints(self.ns, prompt, **extra) if prompt else []
        state = _RequestState(fingerprints=list(fps))
        self._requests[request.request_id] = state
        return state

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Records the blocks to load: those covering [num_computed_tokens, + num_external_tokens)."""
        state = self._requests.get(request.request_id)
        if state is None:
            return
        state.block_ids = _block_ids(blocks)
        if num_external_tokens <= 0:
            return
        _, local_blocks = self._matched.get(request.request_id, (0, 0))
        n = num_external_tokens // self._block_size
        first = local_blocks
        self._pending_loads[request.request_id] = BlockTransfer(
            request_id=request.request_id,
            fingerprints=state.fingerprints[first:first + n],
            block_ids=state.block_ids[first:first + n],
            first_block_index=first,
        )

    def build_connector_meta(self, scheduler_output: Any) -> KvtierConnectorMetadata:
        """Loads recorded since the last step, and saves of the prompt blocks this step completes."""
        meta = KvtierConnectorMetadata(loads=list(self._pending_loads.values()))
        self._pending_loads.clear()
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        for new_req in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            state = self._requests.get(new_req.req_id)
            if state is None:
                continue
            state.block_ids = _block_ids(new_req.block_ids)
            done = int(new_req.num_computed_tokens) + int(scheduled.get(new_req.req_id, 0))
            self._add_save(meta, new_req.req_id, state, done)
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = set(getattr(cached, "resumed_req_ids", None) or [])
            resumed_flags = getattr(cached, "resumed_from_preemption", None)  # older vLLM
            for i, req_id in enumerate(getattr(cached, "req_ids", []) or []):
                state = self._requests.get(req_id)
                if state is None:
                    continue
                new_ids = cached.new_block_ids[i] if cached.new_block_ids else None
                was_resumed = req_id in resumed or bool(resumed_flags and resumed_flags[i])
                if new_ids is not None:
                    ids = _block_ids(new_ids)
                    state.block_ids = ids if was_resumed else state.block_ids + ids
                done = int(cached.num_computed_tokens[i]) + int(scheduled.get(req_id, 0))
                self._add_save(meta, req_id, state, done)
        self._matched.clear()
        return meta

    def _add_save(self, meta: KvtierConnectorMetadata, req_id: str, state: _RequestState, done_tokens: int) -> None:
        """Adds the prompt blocks in [stored_blocks, blocks complete after this step) to meta.saves."""
        complete = min(done_tokens // self._block_size, len(state.fingerprints), len(state.block_ids))
        if complete <= state.stored_blocks:
            return
        first = state.stored_blocks
        meta.saves.append(BlockTransfer(
            request_id=req_id,
            fingerprints=state.fingerprints[first:complete],
            block_ids=state.block_ids[first:complete],
            first_block_index=first,
        ))
        state.stored_blocks = complete

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[dict]]:
        """Forgets the request. Saves happened during the forward passes, so blocks can be freed now."""
        self._requests.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        return False, None

    # ===============================================================================================
    # Worker side
    # ===============================================================================================

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """The paged KV cache of every attention layer, in layer order (dict order)."""
        self._kv_caches = dict(kv_caches)
        if self._kv_caches and len(self._kv_caches) != self.ns.layout.num_layers:
            raise ValueError(f"kvtier: {len(self._kv_caches)} KV-cache layers, namespace has "
                             f"{self.ns.layout.num_layers}")

    def bind_connector_metadata(self, connector_metadata: KvtierConnectorMetadata) -> None:
        self._metadata = connector_metadata
        if _Base is not object:
            super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self._metadata = None
        if _Base is not object:
            super().clear_connector_metadata()

    def _layers(self) -> List[Any]:
        return list(self._kv_caches.values())

    def _staging(self, n: int) -> Any:
        """A CPU buffer for n blocks, shaped [n, num_layers, *per-layer block shape], in the cache dtype."""
        first = self._layers()[0]
        shape = (n, len(self._kv_caches)) + tuple(self._block_shape(first))
        if hasattr(first, "device") and hasattr(first, "new_empty"):  # torch
            import torch

            return torch.empty(shape, dtype=first.dtype, device="cpu", pin_memory=first.is_cuda)
        import numpy as np

        return np.empty(shape, dtype=first.dtype)

    def _block_shape(self, layer: Any) -> Tuple[int, ...]:
        s = tuple(layer.shape)
        if self._kv_layout == "nhd":
            return (2,) + s[2:]
        if self._kv_layout == "blocks_first":
            return s[1:]
        if self._kv_layout == "mla":
            return s[1:]
        raise ValueError(f"kvtier: unknown kv_layout {self._kv_layout!r}")

    def _gather(self, layer: Any, block_ids: List[int]) -> Any:
        """[n, *block shape] of one layer."""
        if self._kv_layout == "nhd":
            return layer[:, block_ids].swapaxes(0, 1)
        return layer[block_ids]

    def _scatter(self, layer: Any, block_ids: List[int], blocks: Any) -> None:
        if hasattr(layer, "device") and hasattr(blocks, "to"):
            blocks = blocks.to(layer.device, non_blocking=False)
        if self._kv_layout == "nhd":
            layer[:, block_ids] = blocks.swapaxes(0, 1)
        else:
            layer[block_ids] = blocks

    def start_load_kv(self, forward_context: Any = None, **kwargs: Any) -> None:
        """Loads this step's blocks into the paged caches (synchronous). Blocks that do not arrive, and
        every block after the first such one in a request, are reported as load errors."""
        meta = self._metadata
        if meta is None or not meta.loads or not self._kv_caches:
            return
        for load in meta.loads:
            n = len(load.fingerprints)
            if n == 0:
                continue
            staging = self._staging(n)
            try:
                results = self._client.get(self.ns, load.fingerprints, staging, shard=self._shard)
            except Exception:
                logger.exception("kvtier: load of %d blocks for %s failed", n, load.request_id)
                results = [kvtier.GetResult.MISS_FROM_ERROR] * n
            good = kvtier.leading_hits(results)
            self._load_errors.update(load.block_ids[good:])
            if good == 0:
                continue
            for layer_index, layer in enumerate(self._layers()):
                self._scatter(layer, load.block_ids[:good], staging[:good, layer_index])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # start_load_kv already finished

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any = None, **kwargs: Any) -> None:
        return None  # a kvtier block spans all layers: saved in wait_for_save

    def wait_for_save(self) -> None:
        """Stores the prompt blocks that this step completed (all layers are computed by now)."""
        meta = self._metadata
        if meta is None or not meta.saves or not self._kv_caches:
            return
        if self._kv_layout == "mla" and self._tp_rank != 0:
            return  # the latent cache is replicated: rank 0 stores it for every rank
        for save in meta.saves:
            n = len(save.fingerprints)
            if n == 0:
                continue
            staging = self._staging(n)
            for layer_index, layer in enumerate(self._layers()):
                blocks = self._gather(layer, save.block_ids)
                if hasattr(blocks, "cpu"):
                    blocks = blocks.cpu()
                staging[:, layer_index] = blocks
            try:
                self._client.put(self.ns, save.fingerprints, staging, shard=self._shard,
                                 first_block_index=save.first_block_index)
            except Exception:
                logger.exception("kvtier: save of %d blocks for %s failed", n, save.request_id)

    def get_block_ids_with_load_errors(self) -> set:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_finished(self, finished_req_ids: set) -> Tuple[Optional[set], Optional[set]]:
        return None, None

    def shutdown(self) -> None:
        if self._owns_client:
            self._client.close()

    def stats(self) -> dict:
        """The kvtier client's counters."""
        return self._client.stats()
