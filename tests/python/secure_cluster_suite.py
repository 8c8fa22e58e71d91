"""Both engine adapters, driven by their engine stand-ins, against a secured cluster as docs/deploy.md
sets one up, with one server killed mid-run.

The cluster: three kvtier-server processes on 127.0.0.1..3 at one gRPC port, each with a UCX listener,
mutual TLS (a certificate for the name kvtier.kvtier.test only, so clients dialling the IPs must set
tls_server_name) and tenant tokens; the members are found through DNS (dnsmasq on a high loopback port,
as tests/integration/dns_membership_test.cc runs it). The adapters get everything from their extra
config: members_dns, dns_server, the TLS files, tls_server_name, auth_token_file, transport "ucx" and
replication_factor 2. Each UCX endpoint presents a session ticket the client got over its TLS
channel with its token (docs/architecture.md "Security"), so gets lease over UCX too and move their
bytes there.

Each test writes prompts through one engine, waits until every block has its two copies, then reads
them through a second engine and SIGKILLs one server just before the loads of a step begin. What must
hold: no exception reaches the engine, every request finishes with the KV the model computes (0 wrong
bytes: loaded blocks are compared with the model, and pages with the writer's), bytes moved over UCX,
and reads failed over to the replicas.
"""

import os
import shutil
import signal
import tempfile
import time
import unittest

import numpy as np

import kvtier
import kvtier_cluster
from sglang_standin import HiCacheStorageConfig, MHAHostPool, StandInController, prefetch_all_ranks
from vllm_standin import B, Request, StandInEngine

TENANT = "acme"
TOKEN = "worker-token-of-acme"
SERVER_NAME = kvtier_cluster.Dnsmasq.NAME  # the only name on the servers' certificate


class SecureClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        binary = kvtier_cluster.find_dnsmasq()
        if binary is None:
            raise RuntimeError("dnsmasq is not installed (scripts/install-deps.sh installs dnsmasq-base)")
        cls.dir = tempfile.mkdtemp(prefix="kvtier-pysecure-")
        cls.ca = kvtier_cluster.TestCA(cls.dir, server_names=[SERVER_NAME])
        config = os.path.join(cls.dir, "kvtier.yaml")
        with open(config, "w") as f:
            f.write(cls.ca.server_config([{"token": TOKEN, "tenant": TENANT, "role": "worker"}]))
        cls.token_file = os.path.join(cls.dir, "token")
        with open(cls.token_file, "w") as f:
            f.write(TOKEN + "\n")
        cls.dns = kvtier_cluster.Dnsmasq(binary)

    @classmethod
    def tearDownClass(cls):
        cls.dns.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        self.cluster = kvtier_cluster.Cluster(3, prefix="secure", distinct_hosts=True, ucx=True,
                                              extra_args=[f"--config={os.path.join(self.dir, 'kvtier.yaml')}"])
        self.addCleanup(self.cluster.stop)
        for s in self.cluster.servers:
            self.dns.add(s.host)
            self.addCleanup(self.dns.remove, s.host)
        self.revision = kvtier_cluster.unique("rev")

    def extra(self, **more):
        """The adapters' extra config for this cluster."""
        config = {
            "tenant": TENANT,
            "revision": self.revision,
            "members_dns": f"{SERVER_NAME}:{self.cluster.servers[0].port}",
            "dns_server": self.dns.server,
            "dns_refresh_interval_ms": 200,
            "health_check_interval_ms": 200,
            "health_check_timeout_ms": 500,
            "tls_ca_file": self.ca.path("ca.pem"),
            "tls_cert_file": self.ca.path("client.pem"),
            "tls_key_file": self.ca.path("client.key"),
            "tls_server_name": SERVER_NAME,
            "auth_token_file": self.token_file,
            "transport": "ucx",
            "replication_factor": 2,
            "rpc_timeout_ms": 3000,
        }
        config.update(more)
        return config

    def one_server_clients(self):
        """A client per server (gRPC, same credentials), to count the copies each one holds."""
        out = []
        for s in self.cluster.servers:
            c = kvtier.Client([s.address], transport="grpc", tls_server_name=SERVER_NAME, auth_token=TOKEN,
                              **self.ca.client_options())
            self.addCleanup(c.close)
            out.append(c)
        return out

    def wait_for_two_copies(self, ns, chains):
        """Until every block of `chains` is on two servers (replicas are put in the background)."""
        clients = self.one_server_clients()
        want = 2 * sum(len(fps) for fps in chains)
        deadline = time.monotonic() + 30
        while True:
            copies = sum(sum(c.lookup_detail(ns, fps).present) for c in clients for fps in chains)
            if copies == want:
                return
            self.assertLess(time.monotonic(), deadline, f"{copies} copies of {want // 2} blocks, want {want}")
            time.sleep(0.1)

    def kill_one_server(self):
        victim = self.cluster.servers[1]
        victim.kill()
        return victim

    # -- vLLM -----------------------------------------------------------------------------------------

    def test_vllm_connector_survives_a_server_killed_mid_run(self):
        prompts = [list(range(40000 + 1000 * i, 40000 + 1000 * i + 6 * B + 3)) for i in range(8)]
        extra = self.extra(load_deadline_ms=5000, step_budget_ms=2000)
        writer = StandInEngine(extra)
        self.addCleanup(writer.close)
        for i, p in enumerate(prompts):
            writer.add(Request(f"w{i}", p))
        writer.run_until_done()
        self.assertTrue(writer.wait_idle(30))
        ns = writer.scheduler.ns
        self.assertEqual(ns.tenant, TENANT)
        chains = [kvtier.fingerprints(ns, p) for p in prompts]
        self.wait_for_two_copies(ns, chains)
        writer_stats = writer.workers[0].stats()
        self.assertEqual(writer_stats["ucx_put_blocks"], 2 * 8 * 6)  # both copies' bytes over UCX

        reader = StandInEngine(extra)
        self.addCleanup(reader.close)
        first = [Request(f"a{i}", p) for i, p in enumerate(prompts[:4])]
        for r in first:
            reader.add(r)
        reader.run_until_done()
        loaded_before = reader.workers[0].connector_stats().get("load_blocks_written", 0)
        self.assertEqual(loaded_before, 4 * 6)

        # The second half: a server dies after the lookups answered and before the loads start. Two new
        # prompts are saved meanwhile.
        killed = []

        def kill_before_loads(meta):
            if meta.loads and not killed:
                killed.append(self.kill_one_server())

        reader.before_workers = kill_before_loads
        new_prompts = [list(range(90000 + 1000 * i, 90000 + 1000 * i + 4 * B + 1)) for i in range(2)]
        second = [Request(f"b{i}", p) for i, p in enumerate(prompts[4:] + new_prompts)]
        for r in second:
            reader.add(r)
        reader.run_until_done()  # an exception from the connector would fail the test here
        self.assertTrue(killed, "no server was killed")
        self.assertTrue(reader.wait_idle(30))

        for r in first + second:  # 0 wrong bytes: every block holds what the model computes
            self.assertEqual(r.status, "FINISHED")
            self.assert_cache_matches_model(reader, r)
        stats = reader.workers[0].stats()
        self.assertGreater(stats["ucx_get_blocks"], 0)  # bytes over UCX ...
        self.assertGreater(stats["ucx_leases"], 0)  # ... leased over UCX too: the endpoints hold session tickets
        self.assertEqual(stats["checksum_failures"], 0)
        self.assertGreater(stats["replica_read_blocks"], 0)  # the killed server's blocks came from replicas
        connector = reader.workers[0].connector_stats()
        loaded_after = connector.get("load_blocks_written", 0) - loaded_before
        self.assertGreater(loaded_after, 0)
        print(f"\nvLLM after the kill: {loaded_after} blocks loaded, {connector.get('load_blocks_failed', 0)} "
              f"recomputed; reader: {stats['ucx_get_blocks']} blocks over UCX, {stats['replica_read_blocks']} from "
              f"replicas, {stats['misses_from_errors']} misses from errors, 0 wrong bytes")

    def test_vllm_connector_whose_token_is_refused_recomputes_without_an_exception(self):
        # The token is acme's, the namespace another tenant's: the servers refuse every lookup and put
        # (PERMISSION_DENIED, the call's error); the connector logs it and the engine computes everything.
        engine = StandInEngine(self.extra(tenant="beta", load_deadline_ms=3000, step_budget_ms=2000))
        self.addCleanup(engine.close)
        tokens = list(range(70000, 70000 + 4 * B + 1))
        for rid in ("x", "y"):
            request = Request(rid, tokens)
            self.assertEqual(engine.run(request)[0], 0)  # never a hit
            self.assertTrue(engine.wait_idle(30))
            self.assertEqual(engine.forward_tokens[rid], len(tokens))
            self.assert_cache_matches_model(engine, request)
        self.assertEqual(engine.workers[0].connector_stats().get("save_blocks_failed"), 2 * 4)

    def assert_cache_matches_model(self, engine, request):
        tokens, block_ids = request.prompt_token_ids, request.block_ids
        for b in range(len(tokens) // B):
            for got, want in zip(engine.cached_block(0, block_ids[b]), engine.expected_block(0, tokens, b)):
                np.testing.assert_array_equal(got, want, err_msg=f"{request.request_id} block {b}")

    # -- SGLang ---------------------------------------------------------------------------------------

    PAGE = 4

    def sglang(self, extra):
        pool = MHAHostPool(2048, self.PAGE, layer_num=3, head_num=4, head_dim=16)
        config = HiCacheStorageConfig(tp_rank=0, tp_size=1, is_mla_model=False, model_name="Qwen/Qwen3-8B",
                                      extra_config=dict(extra))
        controller = StandInController(extra, config, pool)
        self.addCleanup(controller.storage_backend.close)
        return controller

    def test_sglang_backend_survives_a_server_killed_mid_run(self):
        extra = self.extra(backend_name="kvtier", module_path="kvtier.adapters.sglang",
                           class_name="KvtierHiCacheStorage", interface_v1=1)
        writer = self.sglang(extra)
        prompts = [list(range(7 + 1000 * i, 7 + 1000 * i + 24 * self.PAGE + 3)) for i in range(6)]
        written = []
        for i, tokens in enumerate(prompts):
            n_pages = len(tokens) // self.PAGE
            idx = writer.mem_pool_host.alloc(n_pages * self.PAGE)
            for p in range(n_pages):
                writer.mem_pool_host.fill(int(idx[p * self.PAGE]), i * 100003 + p)
            self.assertEqual(writer.backup(idx, tokens), n_pages * self.PAGE)
            written.append(idx)
        ns = writer.storage_backend.ns
        keys = [writer.storage_backend._key_prefix + k for tokens in prompts for k in writer.page_hashes(tokens)]
        self.wait_for_two_copies(ns, [kvtier.external_key_fingerprints(ns, keys)])
        self.assertEqual(writer.storage_backend.stats()["ucx_put_blocks"], 2 * 6 * 24)  # both copies over UCX

        reader = self.sglang(extra)

        def load(i):
            hit, [(completed, idx)] = prefetch_all_ranks([reader], prompts[i])
            self.assertEqual(completed % self.PAGE, 0)
            for p in range(completed // self.PAGE):  # 0 wrong bytes
                np.testing.assert_array_equal(reader.mem_pool_host.page(int(idx[p * self.PAGE])),
                                              writer.mem_pool_host.page(int(written[i][p * self.PAGE])),
                                              err_msg=f"prompt {i} page {p}")
            return completed

        for i in range(3):
            self.assertEqual(load(i), 24 * self.PAGE)
        self.kill_one_server()
        after = [load(i) for i in range(3, 6)]  # an exception from the backend would fail the test here
        self.assertGreater(sum(after), 0)
        # A backup with a dead member reports, never raises.
        idx = reader.mem_pool_host.alloc(8 * self.PAGE)
        reader.backup(idx, list(range(500000, 500000 + 8 * self.PAGE)))
        stats = reader.storage_backend.stats()
        self.assertGreater(stats["ucx_get_blocks"], 0)
        self.assertGreater(stats["ucx_leases"], 0)  # servers with tokens lease to ticketed UCX endpoints
        self.assertEqual(stats["checksum_failures"], 0)
        self.assertGreater(stats["replica_read_blocks"], 0)
        print(f"\nSGLang after the kill: {sum(after) // self.PAGE} of {3 * 24} pages loaded; reader: "
              f"{stats['ucx_get_blocks']} blocks over UCX, {stats['replica_read_blocks']} from replicas, "
              f"{stats['misses_from_errors']} misses from errors, 0 wrong bytes")


if __name__ == "__main__":
    unittest.main()
