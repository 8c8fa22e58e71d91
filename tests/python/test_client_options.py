"""kvtier.ClientOptions and the keywords of kvtier.Client: every field of the C++ ClientOptions is taken
(each set alone arrives and moves nothing else), durations come as seconds, timedelta or _ms, bad values
raise ValueError naming the field, the type stub lists every keyword, and stats() / members() carry every
counter and field of the C++ structs (checked against client.h itself, not only against the binding's
own list)."""

import ast
import datetime
import os
import pickle
import re
import unittest

import kvtier
import kvtier_cluster

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLIENT_H = os.path.join(SOURCE_DIR, "client_lib", "include", "kvtier", "client", "client.h")
STUB = os.path.join(os.path.dirname(kvtier.__file__), "_kvtier.pyi")

# One value unlike the default for every ClientOptions field, and the value it must read back as. A
# field added to ClientOptions (and so to ClientOptions.FIELDS) without an entry here fails
# test_every_field_has_a_sample.
SAMPLES = {
    "members": (["n1=10.0.0.1:7400", "10.0.0.2:7400"], ["n1=10.0.0.1:7400", "10.0.0.2:7400"]),
    "members_dns": ("kvtier-members.kvtier.svc.cluster.local:7400", "kvtier-members.kvtier.svc.cluster.local:7400"),
    "dns_server": ("127.0.0.1:5353", "127.0.0.1:5353"),
    "dns_refresh_interval": (datetime.timedelta(milliseconds=250), 0.25),
    "dns_timeout": (0.5, 0.5),
    "health_check_interval": (3, 3.0),
    "health_check_timeout": (datetime.timedelta(seconds=2, microseconds=500), 2.0005),
    "unhealthy_threshold": (5, 5),
    "healthy_threshold": (4, 4),
    "virtual_nodes": (64, 64),
    "rpc_timeout": (0.75, 0.75),
    "connect_timeout": (datetime.timedelta(seconds=9), 9.0),
    "max_message_bytes": (64 << 20, 64 << 20),
    "stream_chunk_bytes": (512 << 10, 512 << 10),
    "max_blocks_per_request": (100, 100),
    "put_batch_blocks": (8, 8),
    "max_block_bytes": (16 << 20, 16 << 20),
    "transport": ("ucx", "ucx"),
    "ucx_transports": ("tcp", "tcp"),
    "ucx_reconnect_backoff": (0.1, 0.1),
    "ucx_get_lanes": (4, 4),
    "tls_ca_file": ("/etc/kvtier/ca.pem", "/etc/kvtier/ca.pem"),
    "tls_cert_file": ("/etc/kvtier/client.pem", "/etc/kvtier/client.pem"),
    "tls_key_file": ("/etc/kvtier/client.key", "/etc/kvtier/client.key"),
    "tls_server_name": ("kvtier.kvtier.svc", "kvtier.kvtier.svc"),
    "auth_token": ("s3cret-token", "s3cret-token"),
    "replication_factor": (2, 2),
    "replication_overrides": ([kvtier.ReplicationOverride("acme", "llama", 3), {"tenant": "beta", "replication_factor": 2},
                               ("gamma",)],
                              [{"tenant": "acme", "model": "llama", "replication_factor": 3},
                               {"tenant": "beta", "model": "", "replication_factor": 2},
                               {"tenant": "gamma", "model": "", "replication_factor": 1}]),
    "hot_read_replicas": (2, 2),
    "hot_depth": (8, 8),
    "replica_queue_bytes": (1 << 20, 1 << 20),
    "hint_queue_bytes": (0, 0),
    "hint_retry_interval": (2.5, 2.5),
}

DURATIONS = [f for f in kvtier.ClientOptions.FIELDS if f + "_ms" in kvtier.ClientOptions.KEYWORDS]


def read(path):
    with open(path) as f:
        return f.read()


def struct_fields(header_text, struct):
    """Field names of `struct` in a C++ header: the declarations at the struct's own indentation, with
    nested structs and member functions left out."""
    body = re.search(r"^struct %s \{\n(.*?)^\};" % struct, header_text, re.S | re.M).group(1)
    body = re.sub(r"^  struct \w+ \{.*?^  \};\n", "", body, flags=re.S | re.M)  # nested structs
    names = []
    for line in body.splitlines():
        line = line.split("//")[0].rstrip()
        m = re.match(r"^  [A-Za-z_][\w:<>, ]*[\s>](\w+)(\s*=.*|\{.*\})?;$", line)
        if m:
            names.append(m.group(1))
    return names


def stub_keywords(cls_name):
    """Keyword-only parameter names of `cls_name`.__init__ in the type stub."""
    tree = ast.parse(read(STUB))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    return [a.arg for a in item.args.kwonlyargs]
    raise AssertionError(f"{cls_name}.__init__ not in {STUB}")


class ClientOptionsTest(unittest.TestCase):
    def test_fields_are_the_fields_of_the_cpp_struct(self):
        header = read(CLIENT_H)
        self.assertEqual(list(kvtier.ClientOptions.FIELDS), struct_fields(header, "ClientOptions"))
        self.assertEqual(len(kvtier.ClientOptions.FIELDS), 33)
        self.assertEqual(set(kvtier.ClientOptions.KEYWORDS),
                         set(kvtier.ClientOptions.FIELDS) | {f + "_ms" for f in DURATIONS})

    def test_every_field_has_a_sample(self):
        self.assertEqual(sorted(SAMPLES), sorted(kvtier.ClientOptions.FIELDS))

    def test_every_field_set_alone_arrives_and_moves_nothing_else(self):
        defaults = kvtier.ClientOptions("unused:1").to_dict()
        defaults["members"] = []
        for field in kvtier.ClientOptions.FIELDS:
            value, want = SAMPLES[field]
            with self.subTest(field=field):
                extra = {} if field in ("members", "members_dns") else {"members": ["10.9.9.9:1"]}
                got = kvtier.ClientOptions(**extra, **{field: value}).to_dict()
                self.assertEqual(got[field], want)
                self.assertEqual(getattr(kvtier.ClientOptions(**extra, **{field: value}), field), want)
                changed = {k for k in got if got[k] != defaults[k]}
                self.assertEqual(changed, {field} | set(extra))

    def test_defaults_are_the_cpp_defaults(self):
        d = kvtier.ClientOptions("a:1").to_dict()
        self.assertEqual((d["rpc_timeout"], d["connect_timeout"], d["transport"], d["replication_factor"]),
                         (2.0, 5.0, "auto", 1))
        self.assertEqual((d["max_message_bytes"], d["hint_queue_bytes"], d["ucx_get_lanes"]), (80 << 20, 256 << 20, 2))

    def test_durations_take_seconds_timedelta_or_milliseconds_but_not_two_of_them(self):
        for value in (1.5, datetime.timedelta(milliseconds=1500)):
            self.assertEqual(kvtier.ClientOptions("a:1", rpc_timeout=value).rpc_timeout, 1.5)
        for field in DURATIONS:
            self.assertAlmostEqual(getattr(kvtier.ClientOptions("a:1", **{field + "_ms": 1250}), field), 1.25)
            with self.assertRaisesRegex(ValueError, f"^{field}: given twice"):
                kvtier.ClientOptions("a:1", **{field: 1, field + "_ms": 1000})
        with self.assertRaisesRegex(TypeError, "^rpc_timeout: must be seconds"):
            kvtier.ClientOptions("a:1", rpc_timeout="2s")
        with self.assertRaisesRegex(ValueError, "^rpc_timeout: nan seconds"):
            kvtier.ClientOptions("a:1", rpc_timeout=float("nan"))

    def test_bad_values_are_value_errors_naming_the_field(self):
        cases = {
            "rpc_timeout": 0,
            "health_check_interval_ms": -5,
            "unhealthy_threshold": 0,
            "virtual_nodes": -1,
            "max_message_bytes": 1 << 70,
            "ucx_get_lanes": 65,
            "transport": "carrier-pigeon",
            "members_dns": "no-port",
            "dns_server": "not-an-ip",
            "replication_factor": 17,
            "replica_queue_bytes": 0,
        }
        for field, value in cases.items():
            with self.subTest(field=field):
                with self.assertRaises(ValueError) as cm:
                    kvtier.ClientOptions("a:1", **{field: value})
                self.assertIsInstance(cm.exception, kvtier.InvalidArgumentError)
                self.assertTrue(str(cm.exception).startswith(field.removesuffix("_ms") + ":"), str(cm.exception))
        with self.assertRaisesRegex(ValueError, r"^replication_overrides\[1\]\.replication_factor: 0 is not in"):
            kvtier.ClientOptions("a:1", replication_overrides=[("a",), ("b", "", 0)])
        with self.assertRaisesRegex(ValueError, r"^replication_overrides\[0\]\.tenant: must not be empty"):
            kvtier.ClientOptions("a:1", replication_overrides=[{"tenant": ""}])
        with self.assertRaisesRegex(ValueError, r"^members: at least one member"):
            kvtier.ClientOptions()
        with self.assertRaisesRegex(ValueError, r"^members: at least one member"):
            kvtier.Client()

    def test_wrong_types_and_unknown_options_are_type_errors(self):
        for field, value in (("unhealthy_threshold", True), ("put_batch_blocks", 2.0), ("transport", 3),
                             ("members", 7), ("replication_overrides", "acme")):
            with self.subTest(field=field):
                with self.assertRaisesRegex(TypeError, f"^{field}"):
                    kvtier.ClientOptions(**{"members": "a:1", field: value})
        with self.assertRaisesRegex(TypeError, "unknown option 'rpc_timeout_s'"):
            kvtier.ClientOptions("a:1", rpc_timeout_s=2)
        with self.assertRaisesRegex(TypeError, r"^replication_overrides\[0\]: unknown field 'factor'"):
            kvtier.ClientOptions("a:1", replication_overrides=[{"tenant": "t", "factor": 2}])

    def test_none_keeps_the_default_and_paths_are_accepted(self):
        import pathlib

        o = kvtier.ClientOptions("a:1", transport=None, rpc_timeout=None, tls_ca_file=pathlib.Path("/x/ca.pem"))
        self.assertEqual((o.transport, o.rpc_timeout, o.tls_ca_file), ("auto", 2.0, "/x/ca.pem"))
        self.assertEqual(kvtier.ClientOptions(" a:1 , b:2 ,").members, ["a:1", "b:2"])

    def test_to_dict_pickle_and_repr(self):
        kwargs = {f: SAMPLES[f][0] for f in kvtier.ClientOptions.FIELDS}
        o = kvtier.ClientOptions(**kwargs)
        self.assertEqual(kvtier.ClientOptions(**o.to_dict()), o)
        self.assertEqual(pickle.loads(pickle.dumps(o)), o)
        self.assertNotEqual(kvtier.ClientOptions("a:1"), o)
        self.assertNotIn("s3cret-token", repr(o))
        self.assertIn("auth_token='<redacted>'", repr(o))
        self.assertEqual(repr(kvtier.ClientOptions("a:1", transport="grpc")), "ClientOptions(members=['a:1'], transport='grpc')")

    def test_the_stub_lists_every_keyword(self):
        want = sorted(kvtier.ClientOptions.KEYWORDS - {"members"})
        self.assertEqual(sorted(stub_keywords("ClientOptions")), want)
        self.assertEqual(sorted(set(stub_keywords("Client")) - {"options"}), want)
        self.assertEqual(sorted(stub_keywords("EventSubscriber")), sorted(set(kvtier.EVENT_SUBSCRIBER_OPTIONS) - {"members"}))


class ClientKeywordsTest(unittest.TestCase):
    """Client(...) takes the same keywords (one conversion) and connects with them."""

    @classmethod
    def setUpClass(cls):
        cls.members = kvtier_cluster.shared_members()

    def test_keywords_reach_the_connected_client(self):
        # The fields that leave a plain cluster reachable, each set alone on a real connection.
        harmless = [f for f in kvtier.ClientOptions.FIELDS
                    if f not in ("members", "members_dns", "dns_server", "tls_ca_file", "tls_cert_file",
                                 "tls_key_file", "tls_server_name", "max_message_bytes", "stream_chunk_bytes",
                                 "ucx_transports", "rpc_timeout", "connect_timeout")]
        for field in harmless:
            value, want = SAMPLES[field]
            with self.subTest(field=field):
                with kvtier.Client(self.members, **{field: value}) as c:
                    self.assertEqual(c.options.to_dict()[field], want)
                    self.assertEqual(c.options.members, self.members)

    def test_options_object_is_the_base_and_keywords_apply_on_top(self):
        base = kvtier.ClientOptions(self.members, transport="grpc", rpc_timeout_ms=3000)
        with kvtier.Client(options=base, rpc_timeout=4) as c:
            self.assertEqual((c.options.transport, c.options.rpc_timeout), ("grpc", 4.0))
        with kvtier.Client(self.members[:1], options=base) as c:  # members given replace the base's
            self.assertEqual((c.options.members, c.options.transport), (self.members[:1], "grpc"))
            self.assertEqual(len(c.members()), 1)

    def test_stats_has_every_counter_of_client_stats(self):
        header = read(CLIENT_H)
        counters = struct_fields(header, "ClientStats")
        self.assertEqual(len(counters), 35)
        with kvtier.Client(self.members, transport="grpc") as c:
            self.assertEqual(list(c.stats()), counters)
            self.assertTrue(all(isinstance(v, int) for v in c.stats().values()))

    def test_stats_info_describes_every_counter_of_stats(self):
        with kvtier.Client(self.members, transport="grpc") as c:
            info = c.stats_info()
            stats = c.stats()
        self.assertEqual([i["name"] for i in info], list(stats))
        for i in info:
            self.assertEqual(set(i), {"name", "value", "help", "kind"})
            self.assertEqual(i["kind"], "counter")
            self.assertTrue(i["help"], i["name"])
            self.assertIsInstance(i["value"], int)

    def test_members_have_every_field_of_member_info(self):
        header = read(CLIENT_H)
        with kvtier.Client(self.members, transport="grpc") as c:
            members = c.members()
        self.assertEqual(len(members), 3)
        for m in members:
            self.assertEqual(list(m), struct_fields(header, "MemberInfo"))
            self.assertTrue(m["in_ring"])
            self.assertFalse(m["from_dns"])
            self.assertIn(m["health"], ("unknown", "healthy"))
            self.assertEqual(m["transport"], "grpc")



class ServerStatsTest(unittest.TestCase):
    """server_stats(): every member's GetStats counters, and a member that is down says why."""

    def test_every_members_counters_count_the_puts_and_a_dead_member_says_why(self):
        cluster = kvtier_cluster.Cluster(2, prefix="stats")
        self.addCleanup(cluster.stop)
        ns = kvtier.Namespace(kvtier_cluster.unique("stats"), "m", num_layers=2, num_kv_heads=2, head_dim=32,
                              block_tokens=16)
        fps = kvtier.fingerprints(ns, [(i * 7919) % 50000 for i in range(16 * 12)])
        data = bytes(range(256)) * (12 * ns.block_bytes // 256)
        blocks = [data[i * ns.block_bytes:(i + 1) * ns.block_bytes] for i in range(12)]
        with kvtier.Client(cluster.members, transport="grpc", rpc_timeout=2, health_check_interval=60) as c:
            before = c.server_stats()
            self.assertEqual([m["address"] for m in before], cluster.members)
            for m in before:
                self.assertTrue(m["ok"], m)
                self.assertEqual((m["code"], m["error"]), ("OK", ""))
                self.assertEqual(set(m), {"address", "node_id", "ok", "code", "error", "counters", "kinds"})
                self.assertIn(m["node_id"], ("stats-1", "stats-2"))
                self.assertEqual(set(m["counters"]), set(m["kinds"]))
                self.assertGreater(len(m["counters"]), 40)
                self.assertTrue(all(re.fullmatch(r"kvtier_[a-z0-9_]+(\{.*\})?", n) for n in m["counters"]))
                self.assertEqual(m["kinds"]['kvtier_capacity_bytes{tier="host"}'], "gauge")
                self.assertEqual(m["kinds"]["kvtier_committed_blocks_total"], "counter")
            self.assertEqual(c.put(ns, fps, blocks), [kvtier.PutResult.STORED] * 12)
            after = c.server_stats()
            committed = sum(a["counters"]["kvtier_committed_blocks_total"] - b["counters"]["kvtier_committed_blocks_total"]
                            for a, b in zip(after, before))
            self.assertEqual(committed, 12)

            cluster.servers[1].kill()
            dead = c.server_stats(timeout=datetime.timedelta(seconds=2))
            self.assertTrue(dead[0]["ok"], dead[0])
            self.assertFalse(dead[1]["ok"])
            self.assertIn(dead[1]["code"], ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
            self.assertTrue(dead[1]["error"])
            self.assertEqual((dead[1]["counters"], dead[1]["node_id"]), ({}, "stats-2"))
            with self.assertRaises((TypeError, ValueError)):
                c.server_stats(timeout=-1)

if __name__ == "__main__":
    unittest.main()
