"""A vLLM v1 KV connector on kvtier, with asynchronous loads and saves.

Targets vLLM's ``KVConnectorBase_V1`` (vllm/distributed/kv_transfer/kv_connector/v1/base.py) and the
scheduler and model-runner code that drives it; bindings/python/README.md names the revision read. Point
vLLM at it with configuration only:

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.adapters.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"members": ["10.0.0.1:7000"], "tenant": "acme"}}'

A secured cluster (docs/deploy.md) needs the same keys as kvtier.Client: e.g. "members_dns":
"kvtier-headless.kvtier.svc.cluster.local:7400", "tls_ca_file", "tls_cert_file", "tls_key_file",
"auth_token_file" (or "auth_token"), "transport": "ucx", "replication_factor": 2.

Flow (one connector instance per role, as vLLM creates them)
- Scheduler: get_num_new_matched_tokens() fingerprints the prompt (kvtier.fingerprints: namespace, tokens,
  LoRA, cache_salt, multimodal hashes) and starts a lookup of the leading run in the background. It waits
  for the answer at most the step budget (``step_budget_ms``, shared by every request of one scheduling
  step); without an answer it returns ``None`` ("ask again next step") and the request waits. A hit is
  returned as ``(tokens, True)``: the load is asynchronous, so vLLM allocates the blocks, parks the request
  in WAITING_FOR_REMOTE_KVS and keeps scheduling the others. update_state_after_alloc() records which of
  the request's blocks to load; build_connector_meta() turns that, and the prompt blocks this step
  completes, into a picklable KvtierConnectorMetadata.
- Worker: start_load_kv() hands each load to a background thread and returns at once. The thread
  fetches the blocks into a private staging buffer and, unless the load's deadline (``load_deadline_ms``
  after start_load_kv) has passed, scatters the leading blocks that arrived into every layer's paged
  cache. get_finished() reports a request as finished receiving once its load is written, or once its
  deadline passed; get_block_ids_with_load_errors() then reports every block that was not written (a miss,
  a dead or stopped owner, the deadline), so vLLM recomputes those blocks instead of failing the request.
  A fetch that answers after its deadline is discarded: vLLM owns those blocks again by then.
- Saves: save_kv_layer() copies each layer's finished prompt blocks into a staging buffer as the layer
  completes; wait_for_save() copies any layer not seen yet and queues the put on a background thread.
  The queue is bounded (``save_queue_bytes``); a save that does not fit is dropped and counted (a dropped
  save is only a future miss), so no step ever waits for a put. The staging copy is the connector's
  own, so request_finished() never needs to hold blocks (it returns False).
- wait_for_layer_load() has nothing to wait for: a request whose blocks are loading is not in any
  forward pass until get_finished() reports it. Layer-by-layer loading (fetching layer l while layer
  l - 1 runs) would only help a synchronous load feeding the current forward; a kvtier block holds every
  layer of its tokens ([num_layers, 2, block_tokens, heads, head_dim], so layer l is one contiguous byte
  range of the block), but the client reads whole blocks, and an asynchronous load has no forward pass
  to overlap with.

Block arithmetic (what vLLM relies on): the matched count is hit_blocks * block_size, capped at
(len(prompt) - 1) // block_size * block_size -- vLLM must compute at least the last prompt token to
get logits -- and minus the tokens vLLM already has locally (num_computed_tokens, itself a multiple of
block_size). So it is always a multiple of block_size and never more than len(prompt) - 1 -
num_computed_tokens. Only prompt tokens are stored (generated tokens are not).

Paged KV layout per layer (kv_connector_extra_config "kv_layout"):
  "nhd" (default; FlashAttention): [2, num_blocks, block_size, num_kv_heads, head_dim]
  "blocks_first" (FlashInfer):      [num_blocks, 2, block_size, num_kv_heads, head_dim]
  "mla":                             [num_blocks, block_size, latent_dim]
Tensors may be torch (any device; staging is on the CPU, pinned for CUDA caches) or numpy.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

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

# kv_connector_extra_config keys of the asynchronous paths, and their defaults.
DEFAULT_LOAD_DEADLINE_MS = 2000  # a load not written this long after start_load_kv is reported failed
DEFAULT_STEP_BUDGET_MS = 20  # longest wait on kvtier within one scheduling step (all lookups together)
DEFAULT_LOAD_THREADS = 4  # background fetch threads per worker (a stuck owner holds one for rpc_timeout)
DEFAULT_LOOKUP_THREADS = 2  # background lookup threads of the scheduler
DEFAULT_SAVE_QUEUE_BYTES = 256 << 20  # staged save bytes waiting for their put, per worker


def reusable_prompt_tokens(hit_blocks: int, block_size: int, prompt_tokens: int) -> int:
    """Tokens vLLM may skip for a prompt whose first `hit_blocks` blocks are cached: whole blocks, and
    never the last prompt token (vLLM computes it for the logits)."""
    return kvtier.reusable_tokens(hit_blocks, block_size, prompt_tokens, keep_last=1)


def _engine_hash(h: Any) -> Optional[Any]:
    """vLLM's block hash as kvtier takes it: bytes (vLLM's BlockHash) or an int; None for anything else
    (e.g. a BlockHashWithGroupId tuple of older versions)."""
    if isinstance(h, (bytes, bytearray)):
        return bytes(h) if 0 < len(h) <= 64 else None
    if isinstance(h, int) and -(1 << 63) <= h < (1 << 64):
        return h
    return None


@dataclasses.dataclass
class BlockTransfer:
    """Blocks of one request to load or save. fingerprints[i] belongs in vLLM block block_ids[i]; the
    first is block `first_block_index` of the prompt's chain."""

    request_id: str
    fingerprints: List[bytes]
    block_ids: List[int]
    first_block_index: int
    # Saves only, when vLLM has them: vLLM's own hash of each block and each block's token ids, kept with
    # the blocks and published in kvtier's KV events so routers see them in vLLM's terms.
    block_hashes: Optional[List[Any]] = None
    token_ids: Optional[List[List[int]]] = None
    parent_hash: Optional[Any] = None  # vLLM's hash of the block before the first (None: the first)
    lora_id: Optional[int] = None  # the request's LoRARequest.lora_int_id (None: no LoRA)
    parent_fingerprint: Optional[bytes] = None  # kvtier's fingerprint of the block before the first


@dataclasses.dataclass
class KvtierConnectorMetadata(_MetaBase):
    """Scheduler -> worker metadata of one step (picklable: vLLM ships it to worker processes)."""

    loads: List[BlockTransfer] = dataclasses.field(default_factory=list)
    saves: List[BlockTransfer] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _RequestState:
    """Scheduler-side bookkeeping of one request."""

    fingerprints: List[bytes]  # of the prompt's full blocks
    block_ids: List[int] = dataclasses.field(default_factory=list)
    prompt: List[int] = dataclasses.field(default_factory=list)  # the prompt's token ids
    block_hashes: Optional[List[Any]] = None  # vLLM's Request.block_hashes (grows with the request), if any
    lora_id: Optional[int] = None  # LoRARequest.lora_int_id, published as the blocks' lora_id
    stored_blocks: int = 0  # leading prompt blocks known to be in kvtier (hit or saved)
    lookup: Optional[concurrent.futures.Future] = None  # the background lookup of the leading run
    loading: bool = False  # an asynchronous load was handed to the workers and not yet scheduled past
    hit_cap: int = 1 << 62  # blocks from the first one that failed to load: never matched again


class _LoadJob:
    """One request's asynchronous load on one worker. `phase` moves fetching -> writing -> done under
    `lock`, or fetching -> expired when the deadline passes first (the fetch's bytes are then dropped)."""

    def __init__(self, transfer: BlockTransfer, deadline: float):
        self.transfer = transfer
        self.deadline = deadline  # time.monotonic() seconds
        self.lock = threading.Lock()
        self.phase = "fetching"
        self.failed_block_ids: List[int] = []


def _is_torch(x: Any) -> bool:
    return hasattr(x, "device") and hasattr(x, "new_empty")


def _option(extra: dict, key: str, default: int, minimum: int) -> int:
    value = int(extra.get(key, default))
    if value < minimum:
        raise ValueError(f"kvtier: kv_connector_extra_config '{key}' must be >= {minimum}, got {value}")
    return value


def _block_ids(blocks: Any) -> List[int]:
    """The first KV-cache group's block ids of a KVCacheBlocks (or of a plain list/tuple)."""
    get = getattr(blocks, "get_block_ids", None)
    ids = get() if get is not None else blocks
    if ids and isinstance(ids[0], (list, tuple)):  # tuple of per-group lists
        ids = ids[0]
    return [int(b) for b in ids]


def _lora_int_id(request: Any) -> Optional[int]:
    """vLLM's integer id of the request's LoRA adapter, as vLLM's own BlockStored events carry it
    (block_pool.py: lora_id=request.lora_request.adapter_id, the LoRARequest's lora_int_id), or None
    without one."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None
    lora_id = getattr(lora, "adapter_id", None)
    if lora_id is None:
        lora_id = getattr(lora, "lora_int_id", None)
    if isinstance(lora_id, int) and -(1 << 63) <= lora_id < (1 << 63):
        return lora_id
    return None


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

    kv_connector_extra_config keys: members or members_dns (one is required); tenant (default
    "default"); revision (default the model revision); tenant_salt; kv_layout ("nhd" | "blocks_first" |
    "mla"); num_layers, num_kv_heads, head_dim, latent_dim, dtype (read from vllm_config when absent);
    tp_rank (worker; default from vLLM's parallel state); load_deadline_ms (default 2000); step_budget_ms
    (default 20); defer_lookups (default true: return None while a lookup is pending; false: count it as
    a miss, for vLLM releases without that answer); load_threads (4); lookup_threads (2);
    save_queue_bytes (256 MiB); auth_token_file; and every Client option by its name
    (kvtier.ClientOptions.KEYWORDS: dns_server, transport, tls_ca_file, tls_cert_file, tls_key_file,
    tls_server_name, auth_token, replication_factor, replication_overrides, rpc_timeout_ms, ...;
    the rpc timeout defaults to load_deadline_ms here, so that a fetch thread is never held longer than
    a load may take).

    Thread-safety: vLLM calls each role's methods from one thread; the connector's own background
    threads share only the locked job and counter state with it.
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
        self._load_deadline_s = _option(extra, "load_deadline_ms", DEFAULT_LOAD_DEADLINE_MS, 1) / 1000.0
        self._step_budget_s = _option(extra, "step_budget_ms", DEFAULT_STEP_BUDGET_MS, 0) / 1000.0
        self._defer_lookups = str(extra.get("defer_lookups", True)).lower() not in ("0", "false", "no")
        self._save_queue_bytes = _option(extra, "save_queue_bytes", DEFAULT_SAVE_QUEUE_BYTES, 0)
        self.ns = self._make_namespace(vllm_config, extra)
        self._owns_client = client is None
        if client is None:
            client_config = dict(extra)
            if "rpc_timeout" not in client_config and "rpc_timeout_ms" not in client_config:
                client_config["rpc_timeout_ms"] = int(self._load_deadline_s * 1000)
            client = connect(client_config)
        self._client = client
        self._counters: collections.Counter = collections.Counter()
        self._counters_lock = threading.Lock()
        # Scheduler side.
        self._requests: Dict[str, _RequestState] = {}
        self._pending_loads: Dict[str, BlockTransfer] = {}
        self._matched: Dict[str, Tuple[int, int]] = {}  # request id -> (hit blocks, local blocks)
        self._step_wait_left_s = self._step_budget_s
        self._lookup_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        if self._is_scheduler:
            self._lookup_pool = concurrent.futures.ThreadPoolExecutor(
                _option(extra, "lookup_threads", DEFAULT_LOOKUP_THREADS, 1), thread_name_prefix="kvtier-lookup")
        # Worker side.
        self._kv_caches: Dict[str, Any] = {}
        self._layer_index: Dict[str, int] = {}
        self._load_errors: Set[int] = set()
        self._metadata: Optional[KvtierConnectorMetadata] = None
        self._load_jobs: Dict[str, _LoadJob] = {}  # request id -> its load (worker thread + this one)
        self._save_staging: Dict[int, Any] = {}  # index in metadata.saves -> staging of this step
        self._save_layers: Dict[int, Set[int]] = {}  # index in metadata.saves -> layers copied so far
        self._save_bytes_queued = 0
        self._jobs_in_flight = 0  # loads and saves handed to background threads and not yet done
        self._idle = threading.Condition()  # guards _save_bytes_queued and _jobs_in_flight
        self._load_stream = None  # torch.cuda.Stream of the fetch threads' scatters (CUDA caches)
        self._load_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._save_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        if not self._is_scheduler:
            self._load_pool = concurrent.futures.ThreadPoolExecutor(
                _option(extra, "load_threads", DEFAULT_LOAD_THREADS, 1), thread_name_prefix="kvtier-load")
            self._save_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-save")

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

    def _count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self._counters[name] += n

    # ===============================================================================================
    # Scheduler side
    # ===============================================================================================

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        """Tokens beyond num_computed_tokens that kvtier can supply, loaded asynchronously: (n, True), with
        n a multiple of the block size that never reaches the last prompt token; (0, False) on a miss;
        (None, False) while the lookup has not answered within this step's budget (vLLM asks again)."""
        prompt = list(getattr(request, "prompt_token_ids", None) or [])
        cap_blocks = max(len(prompt) - 1, 0) // self._block_size  # blocks before the last prompt token
        local_blocks = num_computed_tokens // self._block_size
        state = self._state_for(request, prompt)
        if state is None or cap_blocks <= local_blocks:
            return 0, False
        hit_blocks = self._await_lookup(request.request_id, state, cap_blocks)
        if hit_blocks is None:
            return (None, False) if self._defer_lookups else (0, False)
        hit_blocks = min(hit_blocks, state.hit_cap)
        state.stored_blocks = max(state.stored_blocks, hit_blocks)
        matched = reusable_prompt_tokens(hit_blocks, self._block_size, len(prompt))
        new_tokens = max(matched - num_computed_tokens, 0)
        self._matched[request.request_id] = (hit_blocks, local_blocks)
        return new_tokens, new_tokens > 0

    def _await_lookup(self, request_id: str, state: _RequestState, cap_blocks: int) -> Optional[int]:
        """The lookup's leading-run length, waiting for it at most what is left of this step's budget;
        None while it is still running. A failed lookup is a miss (0)."""
        if state.lookup is None:
            state.lookup = self._lookup_pool.submit(self._client.lookup, self.ns, state.fingerprints[:cap_blocks])
        start = time.monotonic()
        try:
            return int(state.lookup.result(timeout=max(self._step_wait_left_s, 0.0)))
        except concurrent.futures.TimeoutError:
            self._count("lookups_deferred")
            return None
        except Exception:
            logger.exception("kvtier: lookup for request %s failed; treating as a miss", request_id)
            return 0
        finally:
            self._step_wait_left_s -= time.monotonic() - start

    def _state_for(self, request: Any, prompt: Sequence[int]) -> Optional[_RequestState]:
        state = self._requests.get(request.request_id)
        if state is not None:
            return state
        extra = _extra_keys(request)
        if extra is None:
            return None
        fps = kvtier.fingerprints(self.ns, prompt, **extra) if prompt else []
        hashes = getattr(request, "block_hashes", None)
        state = _RequestState(fingerprints=list(fps), prompt=list(prompt),
                              block_hashes=hashes if isinstance(hashes, list) else None,
                              lora_id=_lora_int_id(request))
        self._requests[request.request_id] = state
        return state

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Records the blocks to load: those covering [num_computed_tokens, + num_external_tokens). vLLM
        calls this again (num_external_tokens = 0) when it allocates the rest after the load."""
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
        state.loading = True
        state.lookup = None  # consumed: a request preempted later looks up afresh

    def build_connector_meta(self, scheduler_output: Any) -> KvtierConnectorMetadata:
        """Loads recorded since the last step, and saves of the prompt blocks this step completes. Also
        starts the next step's lookup budget."""
        meta = KvtierConnectorMetadata(loads=list(self._pending_loads.values()))
        self._pending_loads.clear()
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        for new_req in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            state = self._requests.get(new_req.req_id)
            if state is None:
                continue
            state.block_ids = _block_ids(new_req.block_ids)
            if state.loading:
                # vLLM truncated num_computed_tokens at the first block that failed to load: store the
                # recomputed blocks again.
                state.loading = False
                state.stored_blocks = min(state.stored_blocks, int(new_req.num_computed_tokens) // self._block_size)
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
                if state.loading:
                    state.loading = False
                    state.stored_blocks = min(state.stored_blocks,
                                              int(cached.num_computed_tokens[i]) // self._block_size)
                done = int(cached.num_computed_tokens[i]) + int(scheduled.get(req_id, 0))
                self._add_save(meta, req_id, state, done)
        self._matched.clear()
        self._step_wait_left_s = self._step_budget_s
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        """Remembers, per loading request, the first block the workers reported as not loaded: vLLM
        recomputes from there, and a request matched again (its load failed at its first block) is not
        offered those blocks a second time."""
        invalid = set(getattr(connector_output, "invalid_block_ids", None) or ())
        if not invalid:
            return
        for state in self._requests.values():
            if not state.loading:
                continue
            for i, block_id in enumerate(state.block_ids):
                if block_id in invalid:
                    state.hit_cap = min(state.hit_cap, i)
                    state.stored_blocks = min(state.stored_blocks, i)
                    break

    def _add_save(self, meta: KvtierConnectorMetadata, req_id: str, state: _RequestState, done_tokens: int) -> None:
        """Adds the prompt blocks in [stored_blocks, blocks complete after this step) to meta.saves."""
        complete = min(done_tokens // self._block_size, len(state.fingerprints), len(state.block_ids))
        if complete <= state.stored_blocks:
            return
        first = state.stored_blocks
        bs = self._block_size
        hashes = None
        if state.block_hashes is not None and len(state.block_hashes) >= complete:
            hashes = [_engine_hash(h) for h in state.block_hashes[first:complete]]
            if any(h is None for h in hashes):
                hashes = None
        meta.saves.append(BlockTransfer(
            request_id=req_id,
            fingerprints=state.fingerprints[first:complete],
            block_ids=state.block_ids[first:complete],
            first_block_index=first,
            block_hashes=hashes,
            token_ids=[state.prompt[i * bs:(i + 1) * bs] for i in range(first, complete)] if state.prompt else None,
            parent_hash=_engine_hash(state.block_hashes[first - 1]) if hashes is not None and first > 0 else None,
            lora_id=state.lora_id,
            parent_fingerprint=state.fingerprints[first - 1] if first > 0 else None,
        ))
        state.stored_blocks = complete

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[dict]]:
        """Forgets the request. Saves were staged during the forward passes, so blocks can be freed now."""
        state = self._requests.pop(request.request_id, None)
        if state is not None and state.lookup is not None:
            state.lookup.cancel()
        self._matched.pop(request.request_id, None)
        self._pending_loads.pop(request.request_id, None)
        return False, None

    # ===============================================================================================
    # Worker side
    # ===============================================================================================

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """The paged KV cache of every attention layer, in layer order (dict order)."""
        self._kv_caches = dict(kv_caches)
        self._layer_index = {name: i for i, name in enumerate(self._kv_caches)}
        if self._kv_caches and len(self._kv_caches) != self.ns.layout.num_layers:
            raise ValueError(f"kvtier: {len(self._kv_caches)} KV-cache layers, namespace has "
                             f"{self.ns.layout.num_layers}")

    def bind_connector_metadata(self, connector_metadata: KvtierConnectorMetadata) -> None:
        self._metadata = connector_metadata
        self._save_staging.clear()
        self._save_layers.clear()
        if _Base is not object:
            super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self._metadata = None
        self._save_staging.clear()
        self._save_layers.clear()
        if _Base is not object:
            super().clear_connector_metadata()

    def _layers(self) -> List[Any]:
        return list(self._kv_caches.values())

    def _staging(self, n: int) -> Any:
        """A CPU buffer for n blocks, shaped [n, num_layers, *per-layer block shape], in the cache dtype."""
        first = self._layers()[0]
        shape = (n, len(self._kv_caches)) + tuple(self._block_shape(first))
        if _is_torch(first):
            import torch

            return torch.empty(shape, dtype=first.dtype, device="cpu", pin_memory=first.is_cuda)
        import numpy as np

        return np.empty(shape, dtype=first.dtype)

    def _block_shape(self, layer: Any) -> Tuple[int, ...]:
        s = tuple(layer.shape)
        if self._kv_layout == "nhd":
            return (2,) + s[2:]
        if self._kv_layout in ("blocks_first", "mla"):
            return s[1:]
        raise ValueError(f"kvtier: unknown kv_layout {self._kv_layout!r}")

    def _gather_into(self, staging: Any, layer_index: int, layer: Any, block_ids: List[int]) -> None:
        """staging[:, layer_index] = this layer's blocks `block_ids` (a device-to-host copy that does not
        wait for the device; wait_for_save records the event the save thread waits on)."""
        blocks = layer[:, block_ids].swapaxes(0, 1) if self._kv_layout == "nhd" else layer[block_ids]
        if _is_torch(staging):
            staging[:, layer_index].copy_(blocks, non_blocking=True)
        else:
            staging[:, layer_index] = blocks

    def _scatter(self, layer: Any, block_ids: List[int], blocks: Any) -> None:
        if _is_torch(layer):
            blocks = blocks.to(layer.device, non_blocking=True)
        if self._kv_layout == "nhd":
            layer[:, block_ids] = blocks.swapaxes(0, 1)
        else:
            layer[block_ids] = blocks

    # -- loads ---------------------------------------------------------------------------------------

    def start_load_kv(self, forward_context: Any = None, **kwargs: Any) -> None:
        """Hands this step's loads to the background fetch threads; never waits."""
        meta = self._metadata
        if meta is None or not meta.loads or not self._kv_caches:
            return
        deadline = time.monotonic() + self._load_deadline_s
        for load in meta.loads:
            if not load.fingerprints:
                continue
            job = _LoadJob(load, deadline)
            self._load_jobs[load.request_id] = job
            with self._idle:
                self._jobs_in_flight += 1
            self._count("loads_started")
            self._load_pool.submit(self._run_load, job)

    def _run_load(self, job: _LoadJob) -> None:
        """Fetch thread: fetch, then (unless the deadline passed meanwhile) write the leading hits."""
        load = job.transfer
        n = len(load.fingerprints)
        try:
            results = [kvtier.GetResult.MISS_FROM_ERROR] * n
            staging = None
            if time.monotonic() < job.deadline:
                try:
                    staging = self._staging(n)
                    results = self._client.get(self.ns, load.fingerprints, staging, shard=self._shard)
                except Exception:
                    logger.exception("kvtier: load of %d blocks for %s failed", n, load.request_id)
            with job.lock:
                if job.phase == "expired":  # get_finished() gave the blocks back to vLLM: drop the bytes
                    self._count("late_loads_discarded")
                    self._count("late_load_blocks_arrived", kvtier.leading_hits(results))
                    return
                job.phase = "writing"
            good = kvtier.leading_hits(results)
            try:
                if good:
                    self._write_blocks(load.block_ids[:good], staging[:good])
            except Exception:
                logger.exception("kvtier: writing %d loaded blocks for %s failed", good, load.request_id)
                good = 0
            with job.lock:
                job.failed_block_ids = load.block_ids[good:]
                job.phase = "done"
            self._count("load_blocks_written", good)
        finally:
            with self._idle:
                self._jobs_in_flight -= 1
                self._idle.notify_all()

    def _write_blocks(self, block_ids: List[int], staging: Any) -> None:
        """Scatters staging [n, num_layers, ...] into every layer (on a side stream for CUDA caches, which
        is drained before the load is reported)."""
        layers = self._layers()
        first = layers[0]
        if _is_torch(first) and first.is_cuda:
            import torch

            if self._load_stream is None:
                self._load_stream = torch.cuda.Stream(device=first.device)
            with torch.cuda.stream(self._load_stream):
                for layer_index, layer in enumerate(layers):
                    self._scatter(layer, block_ids, staging[:, layer_index])
            self._load_stream.synchronize()
            return
        for layer_index, layer in enumerate(layers):
            self._scatter(layer, block_ids, staging[:, layer_index])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # a loading request is in no forward pass until get_finished() reports it

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """(None, requests whose load is written or past its deadline). Their blocks that were not written
        go to get_block_ids_with_load_errors() in the same pass. Saves hold no blocks, so nothing is ever
        reported as finished sending."""
        now = time.monotonic()
        recving: Set[str] = set()
        for req_id, job in list(self._load_jobs.items()):
            with job.lock:
                if job.phase == "done":
                    failed = job.failed_block_ids
                elif job.phase == "fetching" and now >= job.deadline:
                    job.phase = "expired"
                    failed = job.transfer.block_ids
                    self._count("load_deadline_misses")
                else:
                    continue  # still fetching within its deadline, or being written now
            if failed:
                self._load_errors.update(failed)
                self._count("load_blocks_failed", len(failed))
            recving.add(req_id)
            del self._load_jobs[req_id]
        return None, (recving or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # -- saves ---------------------------------------------------------------------------------------

    def _saves_of_this_rank(self) -> List[BlockTransfer]:
        meta = self._metadata
        if meta is None or not meta.saves or not self._kv_caches:
            return []
        if self._kv_layout == "mla" and self._tp_rank != 0:
            return []  # the latent cache is replicated: rank 0 stores it for every rank
        return meta.saves

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any = None, **kwargs: Any) -> None:
        """Copies this layer's finished prompt blocks into the step's save staging (the layer's KV for
        this step's tokens is in the paged cache once its attention has run)."""
        layer_index = self._layer_index.get(layer_name)
        if layer_index is None:
            return
        for i, save in enumerate(self._saves_of_this_rank()):
            if not save.fingerprints:
                continue
            staging = self._save_staging.get(i)
            if staging is None:
                staging = self._save_staging[i] = self._staging(len(save.fingerprints))
            self._gather_into(staging, layer_index, kv_layer, save.block_ids)
            self._save_layers.setdefault(i, set()).add(layer_index)

    def wait_for_save(self) -> None:
        """Copies the layers save_kv_layer() did not see and queues each save's put; never waits for a put.
        A save that does not fit in save_queue_bytes is dropped and counted."""
        saves = self._saves_of_this_rank()
        if not saves:
            return
        layers = self._layers()
        for i, save in enumerate(saves):
            n = len(save.fingerprints)
            if n == 0:
                continue
            staging = self._save_staging.pop(i, None)
            if staging is None:
                staging = self._staging(n)
            seen = self._save_layers.pop(i, set())
            for layer_index, layer in enumerate(layers):
                if layer_index not in seen:
                    self._gather_into(staging, layer_index, layer, save.block_ids)
            ready = None
            if _is_torch(staging) and _is_torch(layers[0]) and layers[0].is_cuda:
                import torch

                ready = torch.cuda.Event()
                ready.record()  # the device-to-host copies above, on the current stream
            nbytes = n * self.ns.block_bytes
            with self._idle:
                if self._save_bytes_queued + nbytes > self._save_queue_bytes:
                    dropped = True
                else:
                    dropped = False
                    self._save_bytes_queued += nbytes
                    self._jobs_in_flight += 1
            if dropped:
                self._count("save_blocks_dropped", n)
                logger.warning("kvtier: save queue full (%d bytes); dropped %d blocks of %s",
                               self._save_queue_bytes, n, save.request_id)
                continue
            self._count("save_blocks_queued", n)
            self._save_pool.submit(self._run_save, save, staging, ready, nbytes)

    def _run_save(self, save: BlockTransfer, staging: Any, ready: Any, nbytes: int) -> None:
        try:
            if ready is not None:
                ready.synchronize()
            results = self._client.put(self.ns, save.fingerprints, staging, shard=self._shard,
                                       first_block_index=save.first_block_index,
                                       block_hashes=save.block_hashes, token_ids=save.token_ids,
                                       parent_hash=save.parent_hash, lora_id=save.lora_id,
                                       parent_fingerprint=save.parent_fingerprint)
            bad = sum(1 for r in results if r in (kvtier.PutResult.NO_SPACE, kvtier.PutResult.ERROR))
            if bad:
                self._count("save_blocks_failed", bad)
        except Exception:
            self._count("save_blocks_failed", len(save.fingerprints))
            logger.exception("kvtier: save of %d blocks for %s failed", len(save.fingerprints), save.request_id)
        finally:
            with self._idle:
                self._save_bytes_queued -= nbytes
                self._jobs_in_flight -= 1
                self._idle.notify_all()

    # -- housekeeping --------------------------------------------------------------------------------

    def wait_idle(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until every load and save handed to the background threads has finished; True if they
        did within `timeout_s` (None: no limit). For shutdown and tests; never called on the step's path."""
        with self._idle:
            return self._idle.wait_for(lambda: self._jobs_in_flight == 0, timeout=timeout_s)

    def shutdown(self) -> None:
        """Lets queued saves and running fetches finish (each is bounded by the client's rpc_timeout), then
        closes the client."""
        for pool in (self._lookup_pool, self._load_pool, self._save_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        if self._owns_client:
            self._client.close()

    def stats(self) -> dict:
        """The kvtier client's counters."""
        return self._client.stats()

    def connector_stats(self) -> Dict[str, int]:
        """This connector's counters: loads_started, load_blocks_written, load_blocks_failed,
        load_deadline_misses, late_loads_discarded, late_load_blocks_arrived, lookups_deferred, save_blocks_queued,
        save_blocks_dropped, save_blocks_failed (absent keys are 0)."""
        with self._counters_lock:
            return dict(self._counters)
