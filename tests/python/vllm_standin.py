"""A stand-in for vLLM's v1 engine core, driving kvtier.adapters.vllm.KvtierConnector.

vLLM cannot be installed here. This engine makes the connector calls that vLLM's scheduler
(vllm/v1/core/sched/scheduler.py) and GPU model runner (vllm/v1/worker/kv_connector_model_runner_mixin.py)
make, in the same order, at the revision bindings/python/README.md names:

  scheduler, each step, for each waiting request:
    - WAITING_FOR_REMOTE_KVS: promoted once every worker reported it finished receiving; its
      num_computed_tokens is then its allocated blocks (minus the last token when that covers the whole
      prompt), or, after load errors, what _update_requests_with_invalid_blocks truncated it to (the
      first failed block); with nothing left, its blocks are freed and it is matched again.
    - num_computed_tokens == 0: local prefix hit -> get_num_new_matched_tokens (None: skip it this
      step) -> allocate (only the local and external blocks when the load is asynchronous) ->
      update_state_after_alloc -> asynchronous: WAITING_FOR_REMOTE_KVS; else scheduled.
    - promoted after a load: allocate the rest -> update_state_after_alloc(..., 0) -> scheduled.
    then build_connector_meta(scheduler_output).
  workers, each step (steps with nothing to compute too): bind_connector_metadata -> start_load_kv ->
    forward: per layer wait_for_layer_load, compute, save_kv_layer -> wait_for_save -> get_finished ->
    get_block_ids_with_load_errors -> clear_connector_metadata.
  scheduler, after the step: invalid block ids truncate each affected waiting request at its first
    failed block (the "recompute" load-failure policy); update_connector_output; finished_recving
    counts once every worker reported the request (KVOutputAggregator); request_finished once a
    request's prefill is done.

Per-layer KV caches are numpy arrays in FlashAttention's layout [2, num_blocks, block_size, heads,
head_dim] (bf16 bits as uint16), or [num_blocks, block_size, latent] for MLA. The "model" writes a
deterministic function of each token's prefix, so a loaded block can be checked against what the
engine would have computed. Every connector call is timed, per step.
"""

from __future__ import annotations

import enum
import pickle
import time
import types
from typing import Callable, Dict, List, Optional

import numpy as np

from kvtier.adapters.vllm import KvtierConnector, KvtierConnectorMetadata

B = 16  # vLLM block_size


class KVConnectorRole(enum.Enum):  # vllm.distributed.kv_transfer.kv_connector.v1.base.KVConnectorRole
    SCHEDULER = 0
    WORKER = 1


class KVCacheBlocks:
    def __init__(self, block_ids):
        self.block_ids = list(block_ids)

    def get_block_ids(self):
        return (list(self.block_ids),)  # one KV-cache group


class Request:
    """The attributes of vllm.v1.request.Request the connector reads, plus the scheduler's state."""

    def __init__(self, request_id, prompt_token_ids, cache_salt=None, lora_request=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.cache_salt = cache_salt
        self.lora_request = lora_request
        self.mm_features = []
        self.status = "WAITING"
        self.num_computed_tokens = 0
        self.block_ids: List[int] = []
        self.local_prefix_blocks = 0
        self.local_block_ids: List[int] = []

    @property
    def num_tokens(self):
        return len(self.prompt_token_ids)


def vllm_config(extra, num_layers, heads, head_dim, tp_size=1, use_mla=False):
    model_config = types.SimpleNamespace(
        model="meta-llama/Llama-3.1-8B", revision=None, dtype="bfloat16", use_mla=use_mla,
        get_num_layers=lambda parallel_config: num_layers,
        get_total_num_kv_heads=lambda: heads,
        get_head_size=lambda: head_dim,
    )
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(block_size=B, cache_dtype="auto"),
        model_config=model_config,
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp_size),
        kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config=dict(extra)),
    )


def token_kv(tokens, layer, num_heads, head_dim, head_offset=0, mla=False):
    """The 'model': KV of every token, a function of (prefix hash, layer, K/V, head, dim)."""
    h = np.zeros(len(tokens), np.uint64)
    acc = np.uint64(1469598103934665603)
    for i, t in enumerate(tokens):  # running prefix hash
        acc = np.uint64((int(acc) * 1099511628211 + int(t) + 1) & 0xFFFFFFFFFFFFFFFF)
        h[i] = acc
    base = (h[:, None, None] + np.uint64(layer * 7919)).astype(np.uint64)
    heads = np.arange(head_offset, head_offset + num_heads, dtype=np.uint64)[None, :, None] * np.uint64(31)
    dims = np.arange(head_dim, dtype=np.uint64)[None, None, :]
    k = ((base + heads + dims) % np.uint64(65521)).astype(np.uint16)
    if mla:
        return k[:, 0, :]  # [tokens, latent]
    v = ((base * np.uint64(3) + heads + dims) % np.uint64(65521)).astype(np.uint16)
    return np.stack([k, v])  # [2, tokens, heads, dim]


class StandInEngine:
    """One vLLM engine: a scheduler connector and one worker connector per TP rank, each worker with a
    paged KV cache. `token_budget` is max_num_batched_tokens (chunked prefill splits at it)."""

    def __init__(self, extra, num_layers=3, heads=4, head_dim=16, num_blocks=512, tp_size=1, mla=False,
                 worker_members=None, token_budget=2048):
        self.num_layers, self.heads, self.head_dim, self.tp_size, self.mla = num_layers, heads, head_dim, tp_size, mla
        self.token_budget = token_budget
        cfg = vllm_config(extra, num_layers, heads, head_dim, tp_size, mla)
        self.scheduler = KvtierConnector(cfg, KVConnectorRole.SCHEDULER)
        self.workers: List[KvtierConnector] = []
        self.kv_caches: List[Dict[str, np.ndarray]] = []
        for rank in range(tp_size):
            wextra = dict(extra, tp_rank=rank)
            if worker_members is not None:
                wextra["members"] = worker_members
            worker = KvtierConnector(vllm_config(wextra, num_layers, heads, head_dim, tp_size, mla),
                                     KVConnectorRole.WORKER)
            if mla:
                caches = {f"layers.{l}.attn": np.zeros((num_blocks, B, head_dim), np.uint16) for l in range(num_layers)}
            else:
                caches = {f"layers.{l}.attn": np.zeros((2, num_blocks, B, heads // tp_size, head_dim), np.uint16)
                          for l in range(num_layers)}
            worker.register_kv_caches(caches)
            self.workers.append(worker)
            self.kv_caches.append(caches)
        self.free_blocks = list(range(num_blocks))
        self.waiting: List[Request] = []
        self.running: List[Request] = []
        self.finished: Dict[str, Request] = {}
        self.finished_recving: set = set()
        self.failed_recving: set = set()
        self.finished_req_ids: set = set()
        self.load_errors: set = set()  # every invalid block id the workers reported
        self.loads: list = []  # (request id, its block ids) of every asynchronous load
        self.failed_loads: list = []  # (request id, indices of its failed blocks, blocks it had)
        self.checks: list = []  # (prompt len, num_computed_tokens, matched, load_async) per answer
        self.forward_tokens: Dict[str, int] = {}  # request id -> tokens the model computed
        self.step_connector_s: List[float] = []  # per step: seconds spent inside connector calls
        self.before_workers: Optional[Callable[[KvtierConnectorMetadata], None]] = None
        self._step_s = 0.0
        self._recving_counts: Dict[str, int] = {}

    def close(self):
        for c in [self.scheduler] + self.workers:
            c.shutdown()

    def wait_idle(self, timeout_s=30.0):
        """Until every worker's background loads and saves are done (saves are asynchronous)."""
        return all(w.wait_idle(timeout_s) for w in self.workers)

    def _call(self, fn, *args):
        start = time.monotonic()
        try:
            return fn(*args)
        finally:
            self._step_s += time.monotonic() - start

    # -- the model -------------------------------------------------------------------------------------

    def expected_block(self, rank, tokens, block_index):
        """The KV this rank's caches should hold for prompt block `block_index`, per layer."""
        per_rank = self.heads // self.tp_size
        out = []
        for l in range(self.num_layers):
            if self.mla:
                kv = token_kv(tokens[: (block_index + 1) * B], l, 1, self.head_dim, mla=True)
                out.append(kv[block_index * B:(block_index + 1) * B])
            else:
                kv = token_kv(tokens[: (block_index + 1) * B], l, per_rank, self.head_dim, head_offset=rank * per_rank)
                out.append(kv[:, block_index * B:(block_index + 1) * B])
        return out

    def cached_block(self, rank, block_id):
        caches = list(self.kv_caches[rank].values())
        return [c[block_id] if self.mla else c[:, block_id] for c in caches]

    def compute_layer(self, rank, layer, cache, tokens, block_ids, start, end):
        per_rank = self.heads // self.tp_size
        if self.mla:
            kv = token_kv(tokens[:end], layer, 1, self.head_dim, mla=True)
        else:
            kv = token_kv(tokens[:end], layer, per_rank, self.head_dim, head_offset=rank * per_rank)
        for pos in range(start, end):
            b, off = block_ids[pos // B], pos % B
            if self.mla:
                cache[b, off] = kv[pos]
            else:
                cache[:, b, off] = kv[:, pos]

    def forward(self, tokens, block_ids, start, end):
        """Computes tokens [start, end) into every rank's caches (outside any connector step)."""
        for rank, caches in enumerate(self.kv_caches):
            for l, cache in enumerate(caches.values()):
                self.compute_layer(rank, l, cache, tokens, block_ids, start, end)

    # -- the scheduler -------------------------------------------------------------------------------

    def add(self, request, local_prefix_blocks=0, local_block_ids=None):
        """Queues a request; its first `local_prefix_blocks` blocks are already in this engine's cache
        (vLLM's local prefix cache) at `local_block_ids`."""
        request.local_prefix_blocks = local_prefix_blocks
        request.local_block_ids = list(local_block_ids or [])[:local_prefix_blocks]
        self.waiting.append(request)
        self.forward_tokens[request.request_id] = 0

    def _allocate(self, request, num_tokens):
        need = -(-num_tokens // B)
        while len(request.block_ids) < need:
            request.block_ids.append(self.free_blocks.pop(0))

    def _promote(self, request) -> bool:
        """_update_waiting_for_remote_kv: False while the workers have not reported the load."""
        rid = request.request_id
        if rid not in self.finished_recving:
            return False
        self.finished_recving.discard(rid)
        if rid in self.failed_recving:
            self.failed_recving.discard(rid)
            if request.num_computed_tokens == 0:
                # kv_cache_manager.free(request): matched again from scratch; the blocks go back to the
                # pool, first in line for the next allocation.
                self.free_blocks[:0] = [b for b in request.block_ids if b not in request.local_block_ids]
                request.block_ids = []
        else:
            computed = min(len(request.block_ids) * B, request.num_tokens)
            if computed == request.num_tokens:
                computed -= 1
            request.num_computed_tokens = computed
        request.status = "WAITING"
        return True

    def _schedule(self):
        new_reqs, cached_ids, cached_computed, scheduled = [], [], [], {}
        budget = self.token_budget
        for request in self.running:
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if n <= 0:
                continue
            cached_ids.append(request.request_id)
            cached_computed.append(request.num_computed_tokens)
            scheduled[request.request_id] = n
            budget -= n
        for request in list(self.waiting):
            if budget <= 0:
                break
            if request.status == "WAITING_FOR_REMOTE_KVS" and not self._promote(request):
                continue
            if request.num_computed_tokens == 0:
                local = request.local_prefix_blocks * B
                ext, load_async = self._call(self.scheduler.get_num_new_matched_tokens, request, local)
                if ext is None:
                    continue  # the connector needs more time: ask again next step
                self.checks.append((request.num_tokens, local, ext, load_async))
                computed = local + ext
                request.block_ids = list(request.local_block_ids)
                self._allocate(request, computed if load_async else request.num_tokens)
                self._call(self.scheduler.update_state_after_alloc, request, KVCacheBlocks(request.block_ids), ext)
                if load_async:
                    request.status = "WAITING_FOR_REMOTE_KVS"
                    self.loads.append((request.request_id, list(request.block_ids)))
                    continue
            else:
                computed = request.num_computed_tokens
                self._allocate(request, request.num_tokens)
                self._call(self.scheduler.update_state_after_alloc, request, KVCacheBlocks(request.block_ids), 0)
            n = min(request.num_tokens - computed, budget)
            request.num_computed_tokens = computed
            request.status = "RUNNING"
            self.waiting.remove(request)
            self.running.append(request)
            new_reqs.append(types.SimpleNamespace(
                req_id=request.request_id, prompt_token_ids=request.prompt_token_ids, mm_features=[],
                block_ids=(list(request.block_ids),), num_computed_tokens=computed, lora_request=None))
            scheduled[request.request_id] = n
            budget -= n
        out = types.SimpleNamespace(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=types.SimpleNamespace(
                req_ids=cached_ids, resumed_req_ids=set(), new_block_ids=[None] * len(cached_ids),
                num_computed_tokens=cached_computed),
            num_scheduled_tokens=scheduled,
            finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        return out

    def _handle_invalid_blocks(self, invalid):
        for request in self.waiting:
            if request.status != "WAITING_FOR_REMOTE_KVS":
                continue
            rid = request.request_id
            computed = request.num_computed_tokens if rid in self.failed_recving else len(request.block_ids) * B
            n_blocks = -(-computed // B)
            failed = [idx for idx, block_id in enumerate(request.block_ids[:n_blocks]) if block_id in invalid]
            if failed:
                self.failed_loads.append((rid, failed, n_blocks))
                request.num_computed_tokens = failed[0] * B  # truncated at the first failed block
                self.failed_recving.add(rid)

    def step(self):
        """One engine step: schedule, run the workers, update from their output."""
        self._step_s = 0.0
        out = self._schedule()
        meta = self._call(self.scheduler.build_connector_meta, out)
        assert isinstance(pickle.loads(pickle.dumps(meta)), KvtierConnectorMetadata)
        if self.before_workers is not None:
            self.before_workers(meta)
        by_id = {r.request_id: r for r in self.running}
        recving_count = self._recving_counts  # KVOutputAggregator: counted across steps
        invalid: set = set()
        for rank, (worker, caches) in enumerate(zip(self.workers, self.kv_caches)):
            self._call(worker.bind_connector_metadata, meta)
            self._call(worker.start_load_kv, None)
            for layer, (name, cache) in enumerate(caches.items()):
                self._call(worker.wait_for_layer_load, name)
                for rid, n in out.num_scheduled_tokens.items():
                    r = by_id[rid]
                    self.compute_layer(rank, layer, cache, r.prompt_token_ids, r.block_ids,
                                       r.num_computed_tokens, r.num_computed_tokens + n)
                self._call(worker.save_kv_layer, name, cache, None)
            self._call(worker.wait_for_save)
            _, recving = self._call(worker.get_finished, out.finished_req_ids)
            for rid in recving or ():
                recving_count[rid] = recving_count.get(rid, 0) + 1
            invalid |= self._call(worker.get_block_ids_with_load_errors)
            self._call(worker.clear_connector_metadata)
        # update_from_output
        for rid, n in out.num_scheduled_tokens.items():
            r = by_id[rid]
            r.num_computed_tokens += n
            self.forward_tokens[rid] += n
            if r.num_computed_tokens >= r.num_tokens:  # prefill done: the request finishes here
                self.running.remove(r)
                r.status = "FINISHED"
                self.finished[rid] = r
                self.finished_req_ids.add(rid)
                assert self._call(self.scheduler.request_finished, r, list(r.block_ids)) == (False, None)
        if invalid:
            self.load_errors |= invalid
            self._handle_invalid_blocks(invalid)
        done = {rid for rid, c in recving_count.items() if c == len(self.workers)}
        for rid in done:
            del recving_count[rid]
        self._call(self.scheduler.update_connector_output, types.SimpleNamespace(
            finished_sending=set(), finished_recving=done, invalid_block_ids=invalid))
        self.finished_recving |= done
        self.step_connector_s.append(self._step_s)
        return bool(out.num_scheduled_tokens)

    def run_until_done(self, timeout_s=60.0):
        """Steps until every queued request finished its prefill (an idle step sleeps 1 ms, as the engine
        loop would spin)."""
        deadline = time.monotonic() + timeout_s
        while self.waiting or self.running:
            if time.monotonic() > deadline:
                raise AssertionError(f"requests not done after {timeout_s} s: "
                                     f"{[(r.request_id, r.status) for r in self.waiting + self.running]}")
            if not self.step():
                time.sleep(0.001)

    def run(self, request, local_prefix_blocks=0, local_block_ids=None):
        """Runs one request to the end of its prefill; returns (matched tokens, block ids)."""
        first_check = len(self.checks)
        self.add(request, local_prefix_blocks, local_block_ids)
        self.run_until_done()
        matched = self.checks[first_check][2] if len(self.checks) > first_check else 0
        return matched, request.block_ids
