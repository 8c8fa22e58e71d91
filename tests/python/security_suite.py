"""kvtier.Client and kvtier.EventSubscriber against a real server with mutual TLS and tenant tokens: the
certificates come from the openssl CLI in a temporary directory (a CA, a server certificate for
localhost and 127.0.0.1, a client certificate, and a client certificate of a CA the server does not
trust), as tests/integration/security/ makes them. A trusted certificate with a tenant's token round-trips
blocks; a missing or untrusted certificate, plaintext or a wrong server name get no connection (the
blocks of a member named anyway are misses from error), and a wrong or missing token and another
tenant's token are refused with the server's code (UNAUTHENTICATED, PERMISSION_DENIED) and get nothing."""

import os
import shutil
import tempfile
import unittest

import numpy as np

import kvtier
import kvtier_cluster

TOKEN_A = "token-of-tenant-a"
TOKEN_B = "token-of-tenant-b"
TOKEN_ADMIN = "token-of-the-operator"


def namespace(tenant):
    return kvtier.Namespace(tenant, "secure/model", num_layers=2, num_kv_heads=2, head_dim=32, block_tokens=16,
                            tenant_salt=f"salt-of-{tenant}")


def prompt(n_blocks, seed):
    return [(i * 7919 + seed * 104729) % 50000 for i in range(16 * n_blocks)]


def payload(ns, n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, ns.block_bytes), dtype=np.uint8)


class SecureServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvtier-pysec-")
        cls.ca = kvtier_cluster.TestCA(cls.dir)
        config = os.path.join(cls.dir, "kvtier.yaml")
        with open(config, "w") as f:
            f.write(cls.ca.server_config([{"token": TOKEN_A, "tenant": "tenant-a", "role": "worker"},
                                          {"token": TOKEN_B, "tenant": "tenant-b", "role": "worker"},
                                          {"token": TOKEN_ADMIN, "role": "admin"}]))
        cls.cluster = kvtier_cluster.Cluster(1, prefix="secure", events=True, extra_args=[f"--config={config}"])
        cls.server = cls.cluster.servers[0]

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def client(self, members=None, cert="client", **kwargs):
        options = dict(self.ca.client_options(cert), transport="grpc", rpc_timeout=5, connect_timeout=5)
        options.update(kwargs)
        return kvtier.Client(members or [self.server.address], **options)

    def test_mutual_tls_and_a_token_round_trip_blocks(self):
        ns = namespace("tenant-a")
        fps = kvtier.fingerprints(ns, prompt(6, 1))
        data = payload(ns, 6, 1)
        with self.client(auth_token=TOKEN_A) as c:
            self.assertEqual(c.members()[0]["node_id"], "secure-1")
            self.assertEqual(c.put(ns, fps, data), [kvtier.PutResult.STORED] * 6)
            self.assertEqual(c.lookup(ns, fps), 6)
            got = np.zeros_like(data)
            self.assertEqual(c.get(ns, fps, got), [kvtier.GetResult.HIT] * 6)
            np.testing.assert_array_equal(got, data)
            self.assertEqual(c.stats()["rpc_errors"], 0)
            self.assertEqual(c.options.tls_cert_file, self.ca.path("client.pem"))

    def test_the_certificate_may_name_the_server_other_than_its_address(self):
        port = self.server.port
        with self.client([f"localhost:{port}"], auth_token=TOKEN_A) as c:  # the certificate names localhost
            self.assertTrue(c.members()[0]["in_ring"])
        with self.client([f"127.0.0.1:{port}"], auth_token=TOKEN_A, tls_server_name="localhost") as c:
            self.assertTrue(c.members()[0]["in_ring"])
        with self.assertRaises(kvtier.Error):  # a name the certificate does not carry
            self.client(auth_token=TOKEN_A, tls_server_name="kvtier.elsewhere.test", connect_timeout=2)

    def test_clients_without_a_trusted_certificate_get_no_connection(self):
        no_cert = {"tls_ca_file": self.ca.path("ca.pem")}
        attempts = {
            "no client certificate": dict(no_cert),
            "a certificate of an untrusted CA": self.ca.client_options("untrusted-client"),
            "a server CA that did not sign the server": dict(self.ca.client_options(),
                                                             tls_ca_file=self.ca.path("untrusted-ca.pem")),
            "plaintext": {"tls_ca_file": "", "tls_cert_file": "", "tls_key_file": ""},
        }
        for what, tls in attempts.items():
            with self.subTest(what):
                with self.assertRaises(kvtier.Error):
                    kvtier.Client([self.server.address], transport="grpc", connect_timeout=2, auth_token=TOKEN_A, **tls)
        # Named members join without an answer, but every block is then a miss from error, never a hit.
        ns = namespace("tenant-a")
        fps = kvtier.fingerprints(ns, prompt(2, 2))
        with kvtier.Client([f"secure-1={self.server.address}"], transport="grpc", rpc_timeout=2,
                           auth_token=TOKEN_A, tls_ca_file=self.ca.path("ca.pem")) as c:
            self.assertEqual(c.put(ns, fps, payload(ns, 2, 2)), [kvtier.PutResult.ERROR] * 2)
            self.assertEqual(c.lookup_detail(ns, fps).blocks_from_errors, 2)

    def test_tls_files_that_cannot_be_read_are_refused_by_name(self):
        with self.assertRaisesRegex(kvtier.Error, "tls_cert_file"):
            self.client(tls_cert_file=os.path.join(self.dir, "missing.pem"), auth_token=TOKEN_A)
        with self.assertRaisesRegex(kvtier.Error, "tls_ca_file"):
            self.client(tls_ca_file=os.path.join(self.dir, "missing-ca.pem"), auth_token=TOKEN_A)

    def test_a_wrong_or_missing_token_is_refused(self):
        ns = namespace("tenant-a")
        fps = kvtier.fingerprints(ns, prompt(4, 3))
        with self.client(auth_token=TOKEN_A) as good:
            self.assertEqual(good.put(ns, fps[:2], payload(ns, 2, 3)), [kvtier.PutResult.STORED] * 2)
        for token in ("not-a-token", ""):
            with self.subTest(token=token):
                # The member cannot even be asked its node id.
                with self.assertRaises(kvtier.Error):
                    self.client(auth_token=token, connect_timeout=2)
                # Named, it joins the ring; then every call is refused with the server's code.
                with self.client([f"secure-1={self.server.address}"], auth_token=token) as c:
                    got = np.zeros((4, ns.block_bytes), np.uint8)
                    for call in (lambda: c.lookup(ns, fps), lambda: c.get(ns, fps, got),
                                 lambda: c.put(ns, fps[2:], payload(ns, 2, 4))):
                        with self.assertRaises(kvtier.Error) as cm:
                            call()
                        self.assertEqual(cm.exception.code_name, "UNAUTHENTICATED")
                    self.assertFalse(got.any())
        with self.client(auth_token=TOKEN_A) as good:
            self.assertEqual(good.lookup(ns, fps), 2)  # the refused put stored nothing

    def test_another_tenants_token_cannot_read_or_write_the_tenants_blocks(self):
        a = namespace("tenant-a")
        fps = kvtier.fingerprints(a, prompt(4, 5))
        data = payload(a, 4, 5)
        with self.client(auth_token=TOKEN_A) as ca:
            self.assertEqual(ca.put(a, fps, data), [kvtier.PutResult.STORED] * 4)
        with self.client(auth_token=TOKEN_B) as cb:
            got = np.zeros_like(data)
            for call in (lambda: cb.lookup(a, fps), lambda: cb.get(a, fps, got),
                         lambda: cb.put(a, fps, payload(a, 4, 6))):
                with self.assertRaises(kvtier.Error) as cm:
                    call()
                self.assertEqual(cm.exception.code_name, "PERMISSION_DENIED")
            self.assertFalse(got.any())  # no byte of tenant A's blocks arrived
            b = namespace("tenant-b")  # its own tenant works
            fb = kvtier.fingerprints(b, prompt(2, 5))
            self.assertEqual(cb.put(b, fb, payload(b, 2, 7)), [kvtier.PutResult.STORED] * 2)
        with self.client(auth_token=TOKEN_A) as ca:
            got = np.zeros_like(data)
            self.assertEqual(ca.get(a, fps, got), [kvtier.GetResult.HIT] * 4)
            np.testing.assert_array_equal(got, data)  # tenant B changed nothing

    def test_server_stats_need_an_admin_token_and_name_every_configured_tenant(self):
        with self.client(auth_token=TOKEN_A) as c:
            [worker] = c.server_stats()
        self.assertFalse(worker["ok"])
        self.assertEqual(worker["code"], "PERMISSION_DENIED")
        self.assertEqual(worker["counters"], {})
        with self.client(auth_token=TOKEN_ADMIN) as c:
            [admin] = c.server_stats()
        self.assertTrue(admin["ok"], admin)
        self.assertGreater(admin["counters"]['kvtier_rejections_total{reason="permission_denied"}'], 0)
        # Each token's tenant has its refusal series from the start, at 0 until refused.
        for tenant in ("tenant-a", "tenant-b"):
            self.assertEqual(
                admin["counters"][f'kvtier_lease_refusals_total{{tenant="{tenant}",reason="pinned_bound"}}'], 0)

    def test_an_event_subscriber_with_an_admin_token_follows_the_server_over_mutual_tls(self):
        ns = namespace("tenant-a")
        fps = kvtier.fingerprints(ns, prompt(3, 8))
        with self.client(auth_token=TOKEN_A) as c:
            c.put(ns, fps, payload(ns, 3, 8))
        with kvtier.EventSubscriber([self.server.address], auth_token=TOKEN_ADMIN, **self.ca.client_options()) as sub:
            sub.wait_for_catch_up(10)
            self.assertEqual(sub.prefix_match(ns, fps), [("secure-1", 3)])
        with self.assertRaises(kvtier.Error):  # plaintext: the catch-up cannot reach the server
            with kvtier.EventSubscriber([self.server.address], auth_token=TOKEN_ADMIN, rpc_timeout=1) as sub:
                sub.wait_for_catch_up(2)


if __name__ == "__main__":
    unittest.main()
