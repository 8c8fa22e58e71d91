"""kvtier.adapters.sglang.KvtierHiCacheStorage driven by a stand-in for SGLang's HiCacheController
(sglang_standin.py): the v1 zero-copy and generic calls, and the pool-aware v2 calls of hybrid models
with extra pools under both hit policies, including a writer killed between an entry's extra-pool
pages and its KV page.
"""

import os
import signal
import subprocess
import sys
import time
import unittest

import numpy as np

import kvtier
import kvtier_cluster
from sglang_standin import (
    HYBRID_PAGE,
    HiCacheStorageConfig,
    MHAHostPool,
    MLAHostPool,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    StandInController,
    expected_page,
    hybrid_extra_config,
    hybrid_prompt,
    make_hybrid_controller,
    prefetch_all_ranks,
    write_hybrid_prompt,
)

WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_hybrid_writer.py")

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



class SGLangHybridTest(unittest.TestCase):
    """The v2 calls with two extra pools: Mamba states (TRAILING_PAGES) and indexer pages (ALL_PAGES)."""

    @classmethod
    def setUpClass(cls):
        cls.members = kvtier_cluster.shared_members()

    def controller(self, tenant, zero_copy=True, **kwargs):
        c = make_hybrid_controller(hybrid_extra_config(self.members, tenant, zero_copy), **kwargs)
        self.addCleanup(c.storage_backend.close)
        return c

    def assert_loaded(self, reader, writer, seed, hit_pages, kv_indices, transfers, results):
        """The reader holds the writer's pages (contents from `seed`): KV pages [0, hit_pages) at
        kv_indices, and each extra pool's pages named by its transfer's keys in its host slots."""
        for p in range(hit_pages):
            np.testing.assert_array_equal(reader.mem_pool_host.page(int(kv_indices[p * HYBRID_PAGE])),
                                          expected_page(writer, "kv", seed, p), err_msg=f"kv page {p}")
        hashes = reader.page_hashes(self.tokens)[:hit_pages]
        for t in transfers:
            name = t.name.value
            self.assertEqual(results[name], [True] * len(t.keys), name)
            pool = reader.extra_pools[name][0]
            for k, key in enumerate(t.keys):
                page = hashes.index(key)
                slot = int(t.host_indices[k * pool.page_size])
                np.testing.assert_array_equal(pool.page(slot), expected_page(writer, name, seed, page),
                                              err_msg=f"{name} page {page}")

    def round_trip(self, zero_copy):
        tenant = kvtier_cluster.unique("sgl-hybrid")
        writer = self.controller(tenant, zero_copy)
        self.tokens = hybrid_prompt(0, pages=10)
        results, completed = write_hybrid_prompt(writer, self.tokens, seed=7)
        self.assertEqual(results, {"mamba": [True], "indexer": [True] * 10})
        self.assertEqual(completed, 10 * HYBRID_PAGE)
        reader = self.controller(tenant, zero_copy)
        hit, completed, kv_idx, transfers, results = reader.prefetch_hybrid(self.tokens)
        self.assertEqual((hit, completed), (10, 10 * HYBRID_PAGE))
        self.assert_loaded(reader, writer, 7, hit, kv_idx, transfers, results)

    def test_zero_copy_round_trip_with_two_extra_pools(self):
        self.round_trip(zero_copy=True)

    def test_generic_round_trip_with_two_extra_pools(self):
        self.round_trip(zero_copy=False)

    def test_all_pages_pool_cuts_the_prefix_at_its_first_missing_page(self):
        tenant = kvtier_cluster.unique("sgl-all-pages")
        writer = self.controller(tenant)
        self.tokens = hybrid_prompt(0, pages=10)
        write_hybrid_prompt(writer, self.tokens, seed=3, mamba_pages=[3, 5, 9], indexer_pages=range(6))
        hashes = writer.page_hashes(self.tokens)
        backend = writer.storage_backend
        self.assertEqual(backend.batch_exists(hashes), 10)  # every KV page is there ...
        mamba = PoolTransfer(name=PoolName.MAMBA, keys=hashes[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        indexer = PoolTransfer(name=PoolName.INDEXER, keys=hashes, hit_policy=PoolHitPolicy.ALL_PAGES)
        result = backend.batch_exists_v2(hashes, [mamba, indexer])
        self.assertEqual(result.kv_hit_pages, 6)  # ... but indexer pages exist only for pages 0..5
        self.assertEqual(result.extra_pool_hit_pages, {"kv": 10, "mamba": 10, "indexer": 6})
        self.assertEqual(backend.batch_exists_v2(hashes, [indexer]).kv_hit_pages, 6)
        # Mamba states after pages 3 and 5 only: a 6-page prefix ends on one, so it is usable as a whole.
        reader = self.controller(tenant)
        hit, completed, kv_idx, transfers, results = reader.prefetch_hybrid(self.tokens)
        self.assertEqual((hit, completed), (6, 6 * HYBRID_PAGE))
        self.assert_loaded(reader, writer, 3, hit, kv_idx, transfers, results)

    def test_trailing_pages_pool_needs_only_the_pages_at_the_end_of_the_prefix(self):
        tenant = kvtier_cluster.unique("sgl-trailing")
        writer = self.controller(tenant)
        self.tokens = hybrid_prompt(0, pages=12)
        # An 8-page request stored its state after page 7; this 12-page one, after page 11.
        write_hybrid_prompt(writer, self.tokens, seed=5, mamba_pages=[7, 11])
        hashes = writer.page_hashes(self.tokens)
        backend = writer.storage_backend

        def usable(n_pages, trailing):
            t = PoolTransfer(name=PoolName.MAMBA, keys=hashes[n_pages - trailing:n_pages],
                             hit_policy=PoolHitPolicy.TRAILING_PAGES)
            return backend.batch_exists_v2(hashes[:n_pages], [t]).kv_hit_pages

        self.assertEqual(usable(12, 1), 12)
        self.assertEqual(usable(11, 1), 8)  # the 11-page prefix has no state of its own: back off to 8
        self.assertEqual(usable(7, 1), 0)  # no state at or before page 6
        # The controller's prefetch of the 11-page prefix loads 8 pages and the state after page 7.
        reader = self.controller(tenant)
        full = self.tokens
        self.tokens = full[:11 * HYBRID_PAGE]
        hit, completed, kv_idx, transfers, results = reader.prefetch_hybrid(self.tokens)
        self.assertEqual((hit, completed), (8, 8 * HYBRID_PAGE))
        self.assertEqual([t.keys for t in transfers if t.name == PoolName.MAMBA], [[hashes[7]]])
        self.assert_loaded(reader, writer, 5, hit, kv_idx, transfers, results)
        # A 2-page window (sliding-window attention) needs the pages at both ends of the prefix.
        self.assertEqual(usable(12, 2), 0)  # pages 10 and 11, or 6 and 7, ...: 10 and 6 are missing
        write_hybrid_prompt(writer, full, seed=5, mamba_pages=[10])
        self.assertEqual(usable(12, 2), 12)
        self.assertEqual(usable(11, 2), 0)  # pages 9 and 10

    def test_kv_page_whose_extra_page_failed_is_not_written(self):
        tenant = kvtier_cluster.unique("sgl-blocked")
        c = self.controller(tenant)
        self.tokens = hybrid_prompt(0, pages=4)
        hashes = c.page_hashes(self.tokens)
        bad = PoolTransfer(name=PoolName.INDEXER, keys=hashes[2:3], host_indices=[0],  # 1 slot for a 4-slot page
                           hit_policy=PoolHitPolicy.ALL_PAGES)
        with self.assertLogs("kvtier.adapters", level="ERROR"):
            self.assertEqual(c.storage_backend.batch_set_v2([bad]), {"indexer": [False]})
        kv_idx = c.mem_pool_host.alloc(4 * HYBRID_PAGE)
        self.assertEqual(c.storage_backend.batch_set_v1(hashes, kv_idx), [True, True, False, True])
        self.assertEqual(c.storage_backend.batch_exists(hashes), 2)
        # Only once: a later backup of that page (its extra pages now written) stores it.
        self.assertEqual(c.storage_backend.batch_set_v1(hashes[2:3], kv_idx[2 * HYBRID_PAGE:3 * HYBRID_PAGE]), [True])

    def test_unregistered_pool_is_never_a_hit(self):
        c = self.controller(kvtier_cluster.unique("sgl-unregistered"))
        self.tokens = hybrid_prompt(0, pages=3)
        write_hybrid_prompt(c, self.tokens, seed=1)
        hashes = c.page_hashes(self.tokens)
        swa = PoolTransfer(name=PoolName.SWA, keys=hashes[-2:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        with self.assertLogs("kvtier.adapters", level="WARNING"):
            self.assertEqual(c.storage_backend.batch_exists_v2(hashes, [swa]).kv_hit_pages, 0)

    # -- a writer process killed part-way --------------------------------------------------------------

    def start_writer(self, tenant, mode):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(WRITER)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        proc = subprocess.Popen([sys.executable, WRITER, ",".join(self.members), tenant, mode],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        def stop():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()

        self.addCleanup(stop)
        return proc

    def test_writer_killed_between_extra_pages_and_kv_pages_leaves_no_partial_entry(self):
        tenant = kvtier_cluster.unique("sgl-killed")
        proc = self.start_writer(tenant, "pause")
        self.assertEqual(proc.stdout.readline().strip(), "paused")  # prompt 0 done, its extension's extras written
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader = self.controller(tenant)
        self.tokens = hybrid_prompt(0, pages=9)
        hashes = reader.page_hashes(self.tokens)
        backend = reader.storage_backend
        # The extension's extra-pool pages made it ...
        probe = kvtier.Client(self.members)
        self.addCleanup(probe.close)
        mamba = backend._extra_pools["mamba"]
        self.assertEqual(probe.lookup_detail(mamba.ns, backend._pool_fingerprints(mamba, hashes)).present,
            [False] * 5 + [True] + [False] * 2 + [True])
        # ... its KV pages did not, and no lookup finds pages 6..8: only prompt 0's complete entries.
        self.assertEqual(backend.batch_exists(hashes), 6)
        hit, completed, kv_idx, transfers, results = reader.prefetch_hybrid(self.tokens)
        self.assertEqual((hit, completed), (6, 6 * HYBRID_PAGE))
        self.assert_loaded(reader, reader, 0, hit, kv_idx, transfers, results)

    def test_writer_killed_at_any_moment_never_leaves_a_partial_entry(self):
        tenant = kvtier_cluster.unique("sgl-killed-any")
        proc = self.start_writer(tenant, "stream")
        for _ in range(12):  # let it get going, then kill it wherever it is
            self.assertTrue(proc.stdout.readline().startswith("done"))
        time.sleep(0.003 * (os.getpid() % 10))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader = self.controller(tenant, pages=4096)
        backend = reader.storage_backend
        probe = kvtier.Client(self.members)
        self.addCleanup(probe.close)
        complete, partial = 0, 0
        for j in range(40):
            self.tokens = hybrid_prompt(j)
            hashes = reader.page_hashes(self.tokens)
            kv = probe.lookup_detail(backend.ns, backend._fingerprints(hashes)).present
            indexer_pool = backend._extra_pools["indexer"]
            indexer = probe.lookup_detail(indexer_pool.ns, backend._pool_fingerprints(indexer_pool, hashes)).present
            for p, (has_kv, has_indexer) in enumerate(zip(kv, indexer)):
                self.assertTrue(has_indexer or not has_kv, f"prompt {j} page {p}: a KV page without its indexer page")
            hit, completed, kv_idx, transfers, results = reader.prefetch_hybrid(self.tokens)
            self.assertEqual(completed, hit * HYBRID_PAGE)
            if hit:
                self.assert_loaded(reader, reader, j, hit, kv_idx, transfers, results)
            complete += hit == 6
            partial += 0 < hit < 6
        self.assertGreaterEqual(complete, 12)
        self.assertEqual(partial, 0)  # a prompt's last page carries its only Mamba state: all or nothing


if __name__ == "__main__":
    unittest.main()
