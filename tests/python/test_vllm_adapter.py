"""kvtier.adapters.vllm.KvtierConnector driven by a stand-in for vLLM's v1 engine (vllm_standin.py):
asynchronous loads reported through get_finished, load errors recomputed, saves queued in the background,
and, with a member stopped (SIGSTOP), no engine step spending more than the connector's step budget.
"""

import signal
import time
import types
import unittest

import numpy as np

import kvtier
import kvtier_cluster
from vllm_standin import B, Request, StandInEngine, token_kv

# What a step may spend in connector calls beyond the step budget: the connector's own local work
# (fingerprints, staging copies of a few small blocks, thread hand-offs) on a loaded 2-core machine.
# A connector that waited on the stopped member would exceed the budget by the rpc timeout (seconds).
LOCAL_WORK_ALLOWANCE_S = 0.1


class VllmConnectorTestBase(unittest.TestCase):
    def engine(self, extra=None, **kwargs):
        e = StandInEngine(extra or self.extra, **kwargs)
        self.addCleanup(e.close)
        return e

    def writer_run(self, engine, request, **kwargs):
        """Runs a request and waits until its saves are stored (saves are asynchronous)."""
        out = engine.run(request, **kwargs)
        self.assertTrue(engine.wait_idle(30))
        return out

    def stored_blocks(self, engine, tokens, client=None):
        fps = kvtier.fingerprints(engine.scheduler.ns, tokens)
        return (client or self.client).lookup(engine.scheduler.ns, fps)

    def assert_cache_matches_model(self, engine, request, n_blocks=None):
        tokens, block_ids = request.prompt_token_ids, request.block_ids
        n_blocks = len(tokens) // B if n_blocks is None else n_blocks
        for rank in range(engine.tp_size):
            for b in range(n_blocks):
                for got, want in zip(engine.cached_block(rank, block_ids[b]), engine.expected_block(rank, tokens, b)):
                    np.testing.assert_array_equal(got, want, err_msg=f"{request.request_id} rank {rank} block {b}")

    def assert_block_arithmetic(self, engine):
        for prompt_len, num_computed, ext, load_async in engine.checks:
            self.assertEqual(ext % B, 0)
            self.assertEqual(load_async, ext > 0)  # asynchronous whenever something is loaded
            self.assertLessEqual(num_computed + ext, max(prompt_len - 1, 0))


class VllmConnectorTest(VllmConnectorTestBase):
    @classmethod
    def setUpClass(cls):
        cls.members = kvtier_cluster.shared_members()

    def setUp(self):
        # A generous step budget: these tests are about what is loaded, and call the scheduler directly.
        self.extra = {"members": self.members, "tenant": kvtier_cluster.unique("vllm"), "rpc_timeout_ms": 5000,
                      "load_deadline_ms": 5000, "step_budget_ms": 2000}
        self.client = kvtier.Client(self.members)
        self.addCleanup(self.client.close)

    def test_cold_prompt_is_saved_and_a_second_engine_loads_it_asynchronously(self):
        tokens = list(range(500, 600))  # 100 tokens: 6 full blocks + 4
        first = self.engine()
        ext, _ = self.writer_run(first, Request("a", tokens))
        self.assertEqual(ext, 0)
        self.assertEqual(self.stored_blocks(first, tokens), 6)  # the partial 7th block is not stored
        second = self.engine()  # another instance: nothing local
        request = Request("b", tokens)
        ext, _ = second.run(request)
        self.assertEqual(ext, 96)  # 6 blocks, all before the last prompt token
        self.assertEqual(second.load_errors, set())
        self.assertEqual(second.forward_tokens["b"], 100 - 96)  # the loaded blocks were not computed
        self.assert_cache_matches_model(second, request)
        self.assert_block_arithmetic(second)
        stats = second.workers[0].connector_stats()
        self.assertEqual((stats["loads_started"], stats["load_blocks_written"]), (1, 6))

    def test_fully_cached_block_aligned_prompt_recomputes_its_last_block(self):
        tokens = list(range(1000, 1000 + 6 * B))
        self.writer_run(self.engine(), Request("a", tokens))
        e = self.engine()
        request = Request("b", tokens)
        ext, _ = e.run(request)
        self.assertEqual(ext, 5 * B)  # (96 - 1) // 16 = 5 blocks; the last token's block is computed
        self.assertEqual(e.forward_tokens["b"], B)
        self.assert_cache_matches_model(e, request)
        self.assert_block_arithmetic(e)

    def test_local_prefix_hit_loads_only_the_blocks_after_it(self):
        tokens = list(range(2000, 2000 + 8 * B + 3))
        self.writer_run(self.engine(), Request("a", tokens))
        e = self.engine()
        # Two blocks already in this engine's GPU cache (vLLM passes num_computed_tokens = 32).
        local = [e.free_blocks.pop(0), e.free_blocks.pop(0)]
        e.forward(tokens, local + [0] * 10, 0, 2 * B)
        request = Request("b", tokens)
        ext, block_ids = e.run(request, local_prefix_blocks=2, local_block_ids=local)
        self.assertEqual(ext, 6 * B)  # blocks 2..7 from kvtier
        self.assertEqual(block_ids[:2], local)
        self.assert_cache_matches_model(e, request)
        self.assert_block_arithmetic(e)
        # Everything local already: nothing to load.
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("c", tokens), 8 * B), (0, False))

    def test_diverging_prompt_matches_up_to_the_changed_block(self):
        tokens = list(range(3000, 3000 + 8 * B))
        self.writer_run(self.engine(), Request("a", tokens))
        changed = tokens[: 3 * B + 5] + [7] + tokens[3 * B + 6:]
        e = self.engine()
        request = Request("b", changed)
        ext, _ = e.run(request)
        self.assertEqual(ext, 3 * B)
        self.assert_cache_matches_model(e, request)
        self.assertTrue(e.wait_idle(30))
        self.assertEqual(self.stored_blocks(e, changed), 8)  # the new suffix was saved too

    def test_cache_salt_and_lora_isolate_requests(self):
        tokens = list(range(4000, 4000 + 4 * B + 1))
        self.writer_run(self.engine(), Request("a", tokens, cache_salt="alice"))
        e = self.engine()
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("b", tokens, cache_salt="bob"), 0), (0, False))
        lora = types.SimpleNamespace(lora_name="sql-adapter", lora_int_id=1)
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("c", tokens, lora_request=lora), 0), (0, False))
        self.assertEqual(e.scheduler.get_num_new_matched_tokens(Request("d", tokens, cache_salt="alice"), 0),
                         (4 * B, True))

    def test_chunked_prefill_saves_blocks_as_they_complete(self):
        tokens = list(range(5000, 5000 + 12 * B + 7))
        e = self.engine(token_budget=40)  # chunks end mid-block
        self.writer_run(e, Request("a", tokens))
        self.assertEqual(self.stored_blocks(e, tokens), 12)
        other = self.engine(token_budget=64)
        request = Request("b", tokens)
        ext, _ = other.run(request)
        self.assertEqual(ext, 12 * B)
        self.assert_cache_matches_model(other, request)

    def test_blocks_that_fail_to_load_are_reported_and_recomputed(self):
        tokens = list(range(6000, 6000 + 5 * B + 1))
        self.writer_run(self.engine(), Request("a", tokens))
        # The workers read from an empty cluster, so the hits the scheduler saw cannot be loaded.
        empty = kvtier_cluster.Cluster(1, prefix="empty")
        self.addCleanup(empty.stop)
        e = self.engine(worker_members=empty.members)
        request = Request("b", tokens)
        ext, _ = e.run(request)
        self.assertEqual(ext, 5 * B)
        [(rid, loaded_blocks)] = e.loads
        self.assertEqual(e.load_errors, set(loaded_blocks[:5]))
        self.assertEqual(e.failed_loads, [("b", list(range(5)), 5)])
        self.assertEqual(e.forward_tokens["b"], len(tokens))  # recomputed from the first failed block
        self.assert_cache_matches_model(e, request)
        # The failed blocks are not offered again to this request.
        self.assertEqual(e.checks[-1][2], 0)

    def test_many_requests_load_while_others_compute(self):
        prompts = [list(range(9000 + 1000 * i, 9000 + 1000 * i + 4 * B + 5)) for i in range(6)]
        writer = self.engine()
        for i, p in enumerate(prompts[:3]):
            writer.add(Request(f"w{i}", p))
        writer.run_until_done()
        self.assertTrue(writer.wait_idle(30))
        e = self.engine()
        requests = [Request(f"r{i}", p) for i, p in enumerate(prompts)]
        for r in requests:
            e.add(r)
        e.run_until_done()
        for r in requests[:3]:
            self.assertEqual(e.forward_tokens[r.request_id], 5)  # 4 blocks loaded, 5 tokens computed
        for r in requests[3:]:
            self.assertEqual(e.forward_tokens[r.request_id], len(r.prompt_token_ids))
        for r in requests:
            self.assert_cache_matches_model(e, r)
        self.assertEqual(e.load_errors, set())

    def test_tensor_parallel_workers_store_and_load_their_shards(self):
        tokens = list(range(7000, 7000 + 4 * B + 2))
        writer = self.engine(tp_size=2, heads=4)
        self.writer_run(writer, Request("a", tokens))
        self.assertEqual(self.stored_blocks(writer, tokens), 4)
        e = self.engine(tp_size=2, heads=4)
        request = Request("b", tokens)
        ext, _ = e.run(request)
        self.assertEqual(ext, 4 * B)
        self.assert_cache_matches_model(e, request)

    def test_mla_layout(self):
        tokens = list(range(8000, 8000 + 3 * B + 1))
        self.writer_run(self.engine(mla=True, head_dim=48), Request("a", tokens))
        e = self.engine(mla=True, head_dim=48)
        self.assertEqual(e.scheduler.ns.layout.kind, "mla")
        request = Request("b", tokens)
        ext, _ = e.run(request)
        self.assertEqual(ext, 3 * B)
        self.assert_cache_matches_model(e, request)

    def test_full_save_queue_drops_saves_instead_of_waiting(self):
        tokens = list(range(11000, 11000 + 4 * B + 1))
        e = self.engine(dict(self.extra, save_queue_bytes=1))  # no save fits
        e.run(Request("a", tokens))
        self.assertTrue(e.wait_idle(30))
        self.assertEqual(e.workers[0].connector_stats()["save_blocks_dropped"], 4)
        self.assertEqual(self.stored_blocks(e, tokens), 0)

    def test_bad_deadline_is_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, "load_deadline_ms"):
            StandInEngine(dict(self.extra, load_deadline_ms=0))


class StoppedMemberTest(VllmConnectorTestBase):
    """A member stopped with SIGSTOP: its RPCs neither fail nor answer until the rpc timeout."""

    STEP_BUDGET_MS = 50

    def setUp(self):
        self.cluster = kvtier_cluster.Cluster(3, prefix="vllm-stop")
        self.addCleanup(self.cluster.stop)
        self.addCleanup(self.resume_all)
        self.extra = {"members": self.cluster.members, "tenant": kvtier_cluster.unique("vllm-stop"),
                      "rpc_timeout_ms": 1500, "load_deadline_ms": 1000, "step_budget_ms": self.STEP_BUDGET_MS}
        self.client = kvtier.Client(self.cluster.members)
        self.addCleanup(self.client.close)

    def resume_all(self):
        for s in self.cluster.servers:
            if s.process.poll() is None:
                s.process.send_signal(signal.SIGCONT)

    def busiest_member(self, engine, prompts):
        """The server holding the most of these prompts' blocks (asked one member at a time)."""
        best, best_count = None, -1
        for server in self.cluster.servers:
            with kvtier.Client([server.address]) as one:
                count = sum(sum(one.lookup_detail(engine.scheduler.ns, kvtier.fingerprints(engine.scheduler.ns, p)).present)
                            for p in prompts)
            if count > best_count:
                best, best_count = server, count
        self.assertGreater(best_count, 0)
        return best

    def store(self, prompts):
        writer = self.engine()
        for i, p in enumerate(prompts):
            writer.add(Request(f"w{i}", p))
        writer.run_until_done()
        self.assertTrue(writer.wait_idle(30))
        for p in prompts:
            self.assertEqual(self.stored_blocks(writer, p), len(p) // B)
        return writer

    def assert_steps_within_budget(self, engine):
        slowest = max(engine.step_connector_s)
        self.assertLessEqual(slowest, self.STEP_BUDGET_MS / 1000.0 + LOCAL_WORK_ALLOWANCE_S,
                             f"a step spent {slowest * 1000:.0f} ms in connector calls")

    def test_no_step_waits_past_the_budget_and_the_stopped_members_blocks_are_recomputed(self):
        prompts = [list(range(20000 + 1000 * i, 20000 + 1000 * i + 6 * B + 3)) for i in range(8)]
        writer = self.store(prompts)
        stopped = self.busiest_member(writer, prompts)
        reader = self.engine()

        # (a) The member stops after the lookups answered and before the fetches start.
        def stop_before_first_load(meta):
            if meta.loads and stopped.process.poll() is None and reader.before_workers is not None:
                stopped.process.send_signal(signal.SIGSTOP)
                reader.before_workers = None

        reader.before_workers = stop_before_first_load
        first = [Request(f"a{i}", p) for i, p in enumerate(prompts[:4])]
        for r in first:
            reader.add(r)
        reader.run_until_done()
        self.assertIsNone(reader.before_workers, "the member was never stopped")
        # (b) The member is still stopped: now the lookups themselves cannot answer.
        second = [Request(f"b{i}", p) for i, p in enumerate(prompts[4:])]
        for r in second:
            reader.add(r)
        reader.run_until_done()

        self.assert_steps_within_budget(reader)
        stats = reader.workers[0].connector_stats()
        self.assertGreater(stats.get("load_blocks_failed", 0), 0)  # (a) went through the load-error path
        self.assertGreater(reader.scheduler.connector_stats().get("lookups_deferred", 0), 0)  # (b) deferred
        recomputed = 0
        for r in first + second:  # every request finished, with the model's KV in every block
            self.assertEqual(r.status, "FINISHED")
            self.assert_cache_matches_model(reader, r)
            recomputed += reader.forward_tokens[r.request_id] - (len(r.prompt_token_ids) - 6 * B)
        self.assertGreater(recomputed, 0)  # blocks of the stopped member were computed, not loaded
        # Exactly the blocks that were not written are reported: per load, the blocks from one on.
        self.assertTrue(reader.failed_loads)
        for rid, failed, n_blocks in reader.failed_loads:
            self.assertEqual(failed, list(range(failed[0], n_blocks)), rid)

    def test_a_fetch_that_answers_after_its_deadline_writes_nothing(self):
        prompt = list(range(30000, 30000 + 6 * B + 3))
        writer = self.store([prompt])
        # Stop the owner of block 0: the load then fails at its first block, and vLLM frees its blocks.
        fps = kvtier.fingerprints(writer.scheduler.ns, prompt)
        stopped = None
        for server in self.cluster.servers:
            with kvtier.Client([server.address]) as one:
                if one.lookup_detail(writer.scheduler.ns, fps).present[0]:
                    stopped = server
        self.assertIsNotNone(stopped)
        reader = self.engine(dict(self.extra, rpc_timeout_ms=4000, load_deadline_ms=300))

        def stop(meta):
            if meta.loads:
                stopped.process.send_signal(signal.SIGSTOP)
                reader.before_workers = None

        reader.before_workers = stop
        late = Request("late", prompt)
        reader.add(late)
        deadline = time.monotonic() + 10
        while not reader.load_errors:  # until the expired load is reported
            self.assertLess(time.monotonic(), deadline)
            reader.step()
        given_back = set(reader.load_errors)
        reader.step()  # promoted with nothing loaded: its blocks go back to the pool
        # Another request takes one of those blocks and computes its KV into it (15 tokens: no lookup).
        other = Request("other", list(range(777, 777 + B - 1)))
        reader.add(other)
        while other.status != "FINISHED":
            self.assertLess(time.monotonic(), deadline)
            reader.step()
        self.assertIn(other.block_ids[0], given_back)
        # Now the stopped member answers the fetch that was still waiting: its bytes must go nowhere.
        stopped.process.send_signal(signal.SIGCONT)
        self.assertTrue(reader.wait_idle(10))
        stats = reader.workers[0].connector_stats()
        self.assertEqual(stats.get("load_deadline_misses"), 1)
        self.assertEqual(stats.get("late_loads_discarded"), 1)
        self.assertGreater(stats.get("late_load_blocks_arrived", 0), 0)  # the bytes came, and were dropped
        for got, want in zip(reader.cached_block(0, other.block_ids[0]),
                             [token_kv(other.prompt_token_ids, l, reader.heads, reader.head_dim)
                              for l in range(reader.num_layers)]):
            np.testing.assert_array_equal(got[:, :B - 1], want)
        reader.run_until_done()
        self.assert_cache_matches_model(reader, late)
        self.assert_steps_within_budget(reader)

if __name__ == "__main__":
    unittest.main()
