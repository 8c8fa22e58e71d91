"""kvtier.adapters.vllm.KvtierConnector driven by a stand-in for vLLM's v1 engine.

vLLM cannot be installed here. The stand-in makes the connector calls that vLLM's scheduler and GPU
model runner make, in the same order, with objects that carry the attributes the connector reads:
  scheduler: get_num_new_matched_tokens -> (allocate blocks) -> update_state_after_alloc ->
             build_connector_meta (per step: scheduled_new_reqs, scheduled_cached_reqs,
             num_scheduled_tokens) -> ... -> request_finished
  worker:    register_kv_caches (once) -> per step: bind_connector_metadata -> start_load_kv ->
             get_block_ids_with_load_errors -> forward: per layer wait_for_layer_load, save_kv_layer ->
             wait_for_save -> clear_connector_metadata
Per-layer KV caches are numpy arrays in FlashAttention's layout [2, num_blocks, block_size, heads,
head_dim] (bf16 bits as uint16), or [num_blocks, block_size, latent] for MLA. The "model" writes a
deterministic function of each token's prefix, so a loaded block can be checked against what the
engine would have computed.
"""

import enum
import types
import unittest
from typing import Dict, List

import numpy as np

import kvtier
import kvtier_cluster
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
    def __init__(self, request_id, prompt_token_ids, cache_salt=None, lora_request=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.cache_salt = cache_salt
        self.lora_request = lora_request
        self.mm_features = []


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
    """One vLLM engine (scheduler + one worker per TP rank) with a paged KV cache and no local prefix
    cache unless `local_prefix_blocks` is given."""

    def __init__(self, extra, num_layers=3, heads=4, head_dim=16, num_blocks=64, tp_size=1, mla=False,
                 worker_members=None):
        self.num_layers, self.heads, self.head_dim, self.tp_size, self.mla = num_layers, heads, head_dim, tp_size, mla
        cfg = vllm_config(extra, num_layers, heads, head_dim, tp_size, mla)
        self.scheduler = KvtierConnector(cfg, KVConnectorRole.SCHEDULER)
        self.workers = []
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
        self.load_errors = set()
        self.closers = [self.scheduler.shutdown] + [w.shutdown for w in self.workers]

    def close(self):
        for c in self.closers:
            c()

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

    def forward(self, tokens, block_ids, start, end):
        """Computes tokens [start, end) of the prompt into the paged caches of every rank."""
        for rank, caches in enumerate(self.kv_caches):
            per_rank = self.heads // self.tp_size
            for l, cache in enumerate(caches.values()):
                if self.mla:
                    kv = token_kv(tokens[:end], l, 1, self.head_dim, mla=True)
                else:
                    kv = token_kv(tokens[:end], l, per_rank, self.head_dim, head_offset=rank * per_rank)
                for pos in range(start, end):
                    b, off = block_ids[pos // B], pos % B
                    if self.mla:
                        cache[b, off] = kv[pos]
                    else:
                        cache[:, b, off] = kv[:, pos]

    # -- one request ---------------------------------------------------------------------------------

    def run(self, request, local_prefix_blocks=0, chunk_tokens=None, local_block_ids=None):
        """Schedules `request` to completion of its prefill; returns (num_external_tokens, block ids)."""
        tokens = request.prompt_token_ids
        num_computed = local_prefix_blocks * B
        ext, load_async = self.scheduler.get_num_new_matched_tokens(request, num_computed)
        self.checks.append((len(tokens), num_computed, ext, load_async))
        n_blocks = -(-len(tokens) // B)
        block_ids = list(local_block_ids or [])[:local_prefix_blocks]
        block_ids += [self.free_blocks.pop(0) for _ in range(n_blocks - len(block_ids))]
        self.scheduler.update_state_after_alloc(request, KVCacheBlocks(block_ids), ext)
        computed = num_computed + ext
        first = True
        while computed < len(tokens):
            n = len(tokens) - computed if chunk_tokens is None else min(chunk_tokens, len(tokens) - computed)
            if first:
                new_req = types.SimpleNamespace(req_id=request.request_id, prompt_token_ids=tokens,
                                                mm_features=[], block_ids=(list(block_ids),),
                                                num_computed_tokens=computed, lora_request=None)
                out = types.SimpleNamespace(scheduled_new_reqs=[new_req],
                                            scheduled_cached_reqs=types.SimpleNamespace(
                                                req_ids=[], resumed_req_ids=set(), new_block_ids=[],
                                                num_computed_tokens=[]),
                                            num_scheduled_tokens={request.request_id: n})
            else:
                out = types.SimpleNamespace(scheduled_new_reqs=[],
                                            scheduled_cached_reqs=types.SimpleNamespace(
                                                req_ids=[request.request_id], resumed_req_ids=set(),
                                                new_block_ids=[None], num_computed_tokens=[computed]),
                                            num_scheduled_tokens={request.request_id: n})
            meta = self.scheduler.build_connector_meta(out)
            self.assertPicklable(meta)
            for worker in self.workers:
                worker.bind_connector_metadata(meta)
                worker.start_load_kv(forward_context=None)
                self.load_errors |= worker.get_block_ids_with_load_errors()
            self.forward(tokens, block_ids, computed, computed + n)
            for worker, caches in zip(self.workers, self.kv_caches):
                for name, cache in caches.items():
                    worker.wait_for_layer_load(name)
                    worker.save_kv_layer(name, cache, None)
                worker.wait_for_save()
                worker.clear_connector_metadata()
            computed += n
            first = False
        finished = self.scheduler.request_finished(request, block_ids)
        assert finished == (False, None)
        return ext, block_ids

    checks: list = []

    @staticmethod
    def assertPicklable(meta):
        import pickle

        assert isinstance(pickle.loads(pickle.dumps(meta)), KvtierConnectorMetadata)


class VllmConnectorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.members = kvtier_cluster.shared_members()

    def setUp(self):
        self.extra = {"members": self.members, "tenant": kvtier_cluster.unique("vllm"), "rpc_timeout_ms": 5000}
        self.client = kvtier.Client(self.members)
        self.addCleanup(self.client.close)

    def engine(self, **kwargs):
        e = StandInEngine(self.extra, **kwargs)
        e.checks = []
        self.addCleanup(e.close)
        return e

    def stored_blocks(self, engine, tokens):
        fps = kvtier.fingerprints(engine.scheduler.ns, tokens)
        return self.client.lookup(engine.scheduler.ns, fps)

    def assert_loaded(self, engine, tokens, block_ids, first_block, n_blocks):
        for rank in range(engine.tp_size):
            for b in range(first_block, first_block + n_blocks):
                for got, want in zip(engine.cached_block(rank, block_ids[b]), engine.expected_block(rank, tokens, b)):
                    np.testing.assert_array_equal(got, want, err_msg=f"rank {rank} block {b}")

    def assert_block_arithmetic(self, engine):
        for prompt_len, num_computed, ext, load_async in engine.checks:
            self.assertFalse(load_async)
            self.assertEqual(ext % B, 0)
            self.assertLessEqual(num_computed + ext, max(prompt_len - 1, 0))

    def test_cold_prompt_is_saved_and_a_second_engine_loads_it(self):
        tokens = list(range(500, 600))  # 100 tokens: 6 full blocks + 4
        first = self.engine()
        ext, _ = first.run(Request("a", tokens))
        self.assertEqual(ext, 0)
        self.assertEqual(self.stored_blocks(first, tokens), 6)  # the partial 7th block is not stored
        second = self.engine()  # another instance: nothing local
        ext, block_ids = second.run(Request("b", tokens))
        self.assertEqual(ext, 96)  # 6 blocks, all before the last prompt token
        self.assertEqual(second.load_errors, set())
        self.assert_loaded(second, tokens, block_ids, 0, 6)
        self.assert_block_arithmetic(second)

    def test_fully_cached_block_aligned_prompt_recomputes_its_last_block(self):
        tokens = list(range(1000, 1000 + 6 * B))
        self.engine().run(Request("a", tokens))
        e = self.engine()
        ext, block_ids = e.run(Request("b", tokens))
        self.assertEqual(ext, 5 * B)  # (96 - 1) // 16 = 5 blocks; the last token's block is computed
        self.assert_loaded(e, tokens, block_ids, 0, 5)
        self.assert_block_arithmetic(e)

    def test_local_prefix_hit_loads_only_the_blocks_after_it(self):
        tokens = list(range(2000, 2000 + 8 * B + 3))
        writer = self.engine()
        _, writer_blocks = writer.run(Request("a", tokens))
        e = self.engine()
        # Two blocks already in this engine's GPU cache (vLLM passes num_computed_tokens = 32).
        local = [e.free_blocks.pop(0), e.free_blocks.pop(0)]
        e.forward(tokens, local + [0] * 10, 0, 2 * B)
        ext, block_ids = e.run(Request("b", tokens), local_prefix_blocks=2, local_block_ids=local)
        self.assertEqual(ext, 6 * B)  # blocks 2..7 from kvtier
        self.assertEqual(block_ids[:2], local)
        self.assert_loaded(e, tokens, block_ids, 0, 8)
        self.assert_block_arithmetic(e)
        # Everything local already: nothing to load.
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("c", tokens), 8 * B), (0, False))

    def test_diverging_prompt_matches_up_to_the_changed_block(self):
        tokens = list(range(3000, 3000 + 8 * B))
        self.engine().run(Request("a", tokens))
        changed = tokens[: 3 * B + 5] + [7] + tokens[3 * B + 6:]
        e = self.engine()
        ext, block_ids = e.run(Request("b", changed))
        self.assertEqual(ext, 3 * B)
        self.assert_loaded(e, changed, block_ids, 0, 3)
        self.assertEqual(self.stored_blocks(e, changed), 8)  # the new suffix was saved too

    def test_cache_salt_and_lora_isolate_requests(self):
        tokens = list(range(4000, 4000 + 4 * B + 1))
        self.engine().run(Request("a", tokens, cache_salt="alice"))
        e = self.engine()
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("b", tokens, cache_salt="bob"), 0), (0, False))
        lora = types.SimpleNamespace(lora_name="sql-adapter", lora_int_id=1)
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("c", tokens, lora_request=lora), 0), (0, False))
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("d", tokens, cache_salt="alice"), 0),
                         (4 * B, False))

    def test_chunked_prefill_saves_blocks_as_they_complete(self):
        tokens = list(range(5000, 5000 + 12 * B + 7))
        e = self.engine()
        e.run(Request("a", tokens), chunk_tokens=40)  # chunks end mid-block
        self.assertEqual(self.stored_blocks(e, tokens), 12)
        other = self.engine()
        ext, block_ids = other.run(Request("b", tokens), chunk_tokens=64)
        self.assertEqual(ext, 12 * B)
        self.assert_loaded(other, tokens, block_ids, 0, 12)

    def test_blocks_that_fail_to_load_are_reported_for_recompute(self):
        tokens = list(range(6000, 6000 + 5 * B + 1))
        self.engine().run(Request("a", tokens))
        # The workers read from an empty cluster, so the hits the scheduler saw cannot be loaded.
        empty = kvtier_cluster.Cluster(1, prefix="empty")
        self.addCleanup(empty.stop)
        e = self.engine(worker_members=empty.members)
        ext, block_ids = e.run(Request("b", tokens))
        self.assertEqual(ext, 5 * B)
        self.assertEqual(e.load_errors, set(block_ids[:5]))

    def test_tensor_parallel_workers_store_and_load_their_shards(self):
        tokens = list(range(7000, 7000 + 4 * B + 2))
        writer = self.engine(tp_size=2, heads=4)
        writer.run(Request("a", tokens))
        self.assertEqual(self.stored_blocks(writer, tokens), 4)
        e = self.engine(tp_size=2, heads=4)
        ext, block_ids = e.run(Request("b", tokens))
        self.assertEqual(ext, 4 * B)
        self.assert_loaded(e, tokens, block_ids, 0, 4)

    def test_mla_layout(self):
        tokens = list(range(8000, 8000 + 3 * B + 1))
        self.engine(mla=True, head_dim=48).run(Request("a", tokens))
        e = self.engine(mla=True, head_dim=48)
        self.assertEqual(e.scheduler.ns.layout.kind, "mla")
        ext, block_ids = e.run(Request("b", tokens))
        self.assertEqual(ext, 3 * B)
        self.assert_loaded(e, tokens, block_ids, 0, 3)


if __name__ == "__main__":
    unittest.main()
