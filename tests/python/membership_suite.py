"""kvtier.Client membership from DNS and its choice of data path, against real processes.

DNS: a dnsmasq on 127.0.0.1 at a high port serves the A records of a directory, as
tests/integration/dns_membership_test.cc runs it, and kvtier-server processes listen on 127.0.0.1..4 at
one port (A records carry no port). The client finds the members through dns_server, follows records
that come and go, and joins static members with DNS ones.

Transport: servers with and without a UCX listener; "grpc", "ucx" and "auto" are checked through
members()' per-member transport and the UCX counters of stats().
"""

import time
import unittest

import numpy as np

import kvtier
import kvtier_cluster


def namespace(tenant):
    return kvtier.Namespace(tenant, "membership/model", num_layers=2, num_kv_heads=2, head_dim=32, block_tokens=16)


def prompt(n_blocks, seed):
    return [(i * 7919 + seed * 104729) % 50000 for i in range(16 * n_blocks)]


def payload(ns, n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, ns.block_bytes), dtype=np.uint8)


def wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class DnsMembershipTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        binary = kvtier_cluster.find_dnsmasq()
        if binary is None:
            raise RuntimeError("dnsmasq is not installed (scripts/install-deps.sh installs dnsmasq-base)")
        cls.dns = kvtier_cluster.Dnsmasq(binary)
        cls.cluster = kvtier_cluster.Cluster(4, prefix="dns", distinct_hosts=True)
        cls.port = cls.cluster.servers[0].port

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        cls.dns.stop()

    def setUp(self):
        for ip in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
            self.dns.add(ip)
        self.addCleanup(self.clear_records)

    def clear_records(self):
        for ip in ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"):
            try:
                self.dns.remove(ip)
            except FileNotFoundError:
                pass

    def client(self, **kwargs):
        options = dict(members_dns=f"{kvtier_cluster.Dnsmasq.NAME}:{self.port}", dns_server=self.dns.server,
                       dns_refresh_interval=0.2, dns_timeout=0.5, health_check_interval=0.2,
                       transport="grpc", rpc_timeout=2)
        options.update(kwargs)
        return kvtier.Client(**options)

    def ring_ids(self, c):
        return sorted(m["node_id"] for m in c.members() if m["in_ring"])

    def test_members_come_from_the_records_and_follow_them(self):
        ns = namespace(kvtier_cluster.unique("dns"))
        fps = kvtier.fingerprints(ns, prompt(8, 1))
        data = payload(ns, 8, 1)
        with self.client() as c:
            members = c.members()
            self.assertEqual(sorted(m["address"] for m in members),
                             [f"127.0.0.{i}:{self.port}" for i in (1, 2, 3)])
            self.assertTrue(all(m["from_dns"] for m in members))
            self.assertEqual(self.ring_ids(c), ["dns-1", "dns-2", "dns-3"])
            self.assertGreaterEqual(c.stats()["dns_resolutions"], 1)
            self.assertEqual(c.put(ns, fps, data), [kvtier.PutResult.STORED] * 8)

            self.dns.add("127.0.0.4")  # a record appears: its server joins the ring
            self.assertTrue(wait_for(lambda: self.ring_ids(c) == ["dns-1", "dns-2", "dns-3", "dns-4"]),
                            c.members())
            self.dns.remove("127.0.0.2")  # a record goes: its server leaves
            self.assertTrue(wait_for(lambda: "dns-2" not in [m["node_id"] for m in c.members()]), c.members())
            self.assertGreaterEqual(c.stats()["ring_changes"], 2)
            # Blocks now owned elsewhere are misses, never errors or wrong bytes.
            got = np.zeros_like(data)
            results = c.get(ns, fps, got)
            self.assertNotIn(kvtier.GetResult.MISS_FROM_ERROR, results)
            self.assertNotIn(kvtier.GetResult.CHECKSUM_MISMATCH, results)
            for i, r in enumerate(results):
                if r == kvtier.GetResult.HIT:
                    np.testing.assert_array_equal(got[i], data[i])

    def test_static_and_dns_members_are_joined(self):
        with self.client(members=[f"127.0.0.1:{self.port}", f"127.0.0.4:{self.port}"]) as c:
            members = c.members()
            self.assertEqual(len(members), 4)  # 127.0.0.1 is static and in DNS: one member
            self.assertEqual([m["from_dns"] for m in members[:2]], [False, False])
            self.assertEqual(self.ring_ids(c), ["dns-1", "dns-2", "dns-3", "dns-4"])

    def test_a_name_without_records_is_unavailable(self):
        with self.assertRaisesRegex(kvtier.UnavailableError, "members_dns"):
            self.client(members_dns=f"missing.kvtier.test:{self.port}")


class TransportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ucx = kvtier_cluster.Cluster(2, prefix="ucx", ucx=True)
        cls.plain = kvtier_cluster.Cluster(1, prefix="plain")

    @classmethod
    def tearDownClass(cls):
        cls.ucx.stop()
        cls.plain.stop()

    def round_trip(self, c, n=6, seed=0):
        ns = namespace(kvtier_cluster.unique("transport"))
        fps = kvtier.fingerprints(ns, prompt(n, seed))
        data = payload(ns, n, seed)
        put = c.put(ns, fps, data)
        got = np.zeros_like(data)
        results = c.get(ns, fps, got)
        for i, r in enumerate(results):
            if r == kvtier.GetResult.HIT:
                np.testing.assert_array_equal(got[i], data[i])
        return put, results

    def test_grpc_moves_no_byte_over_ucx(self):
        with kvtier.Client(self.ucx.members, transport="grpc") as c:
            self.assertEqual([m["transport"] for m in c.members()], ["grpc", "grpc"])
            put, got = self.round_trip(c)
            self.assertEqual(got, [kvtier.GetResult.HIT] * 6)
            s = c.stats()
            self.assertEqual((s["ucx_get_blocks"], s["ucx_put_blocks"], s["ucx_connects"]), (0, 0, 0))

    def test_ucx_moves_every_byte_over_ucx(self):
        with kvtier.Client(self.ucx.members, transport="ucx", ucx_transports="tcp") as c:
            put, got = self.round_trip(c, seed=1)
            self.assertEqual(got, [kvtier.GetResult.HIT] * 6)
            self.assertEqual([m["transport"] for m in c.members()], ["ucx", "ucx"])
            s = c.stats()
            self.assertEqual((s["ucx_get_blocks"], s["ucx_put_blocks"]), (6, 6))
            self.assertGreaterEqual(s["ucx_connects"], 2)
            self.assertGreater(s["ucx_leases"], 0)  # servers without tokens lease over UCX

    def test_auto_takes_ucx_where_a_member_offers_it(self):
        with kvtier.Client(self.ucx.members + self.plain.members, transport="auto") as c:
            # 48 blocks in a fresh namespace: plain-1 owns none of them with probability (2/3)^48.
            put, got = self.round_trip(c, n=48, seed=2)
            self.assertEqual(got, [kvtier.GetResult.HIT] * 48)
            by_node = {m["node_id"]: m["transport"] for m in c.members()}
            self.assertEqual(by_node, {"ucx-1": "ucx", "ucx-2": "ucx", "plain-1": "grpc"})
            s = c.stats()
            self.assertGreater(s["ucx_get_blocks"], 0)
            self.assertLess(s["ucx_get_blocks"], 48)  # plain-1's blocks came over gRPC

    def test_a_listener_bound_to_one_address_is_dialled_there(self):
        # gRPC on 127.0.0.1 and 127.0.0.2, both UCX listeners on 127.0.0.1 (GetInfo.ucx_address): the
        # client dials each listener where it is bound, not at the host it reached gRPC at.
        spread = kvtier_cluster.Cluster(2, prefix="spread", distinct_hosts=True, ucx=True)
        self.addCleanup(spread.stop)
        with kvtier.Client(spread.members, transport="ucx") as c:
            self.assertEqual([m["transport"] for m in c.members()], ["ucx", "ucx"])
            put, got = self.round_trip(c, seed=4)
            self.assertEqual(got, [kvtier.GetResult.HIT] * 6)
            self.assertEqual(c.stats()["ucx_get_blocks"], 6)

    def test_ucx_without_a_ucx_member_gives_misses_from_error(self):
        with kvtier.Client(self.plain.members, transport="ucx", rpc_timeout=1) as c:
            put, got = self.round_trip(c, n=3, seed=3)
            self.assertEqual(put, [kvtier.PutResult.ERROR] * 3)
            self.assertEqual(got, [kvtier.GetResult.MISS_FROM_ERROR] * 3)
            self.assertEqual(c.members()[0]["transport"], "none")


if __name__ == "__main__":
    unittest.main()
