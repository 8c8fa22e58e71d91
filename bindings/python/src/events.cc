// kvtier.EventSubscriber: the C++ EventSubscriber (kvtier/client/event_subscriber.h, docs/events.md),
// which follows the KV events of many servers and keeps an index of which node holds which blocks, for
// KV-aware routers written in Python. Every call that waits (start, catch-up, stop) or takes the index's
// mutex runs without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kvtier/client/event_subscriber.h"
#include "kvtier/common/aggregate_fields.h"
#include "kvtier/common/namespace.h"
#include "module_parts.h"

namespace kvtier::python {
namespace {

using client::EventSubscriber;

// Shared so that close() while another thread is inside a call (GIL released) only drops this
// reference; the subscriber is destroyed when the last call returns.
class PyEventSubscriber {
 public:
  explicit PyEventSubscriber(std::shared_ptr<EventSubscriber> s) : sub_(std::move(s)) {}

  std::shared_ptr<EventSubscriber> Get() const {
    if (sub_ == nullptr) RaiseStatus(absl::FailedPreconditionError("kvtier.EventSubscriber: closed"));
    return sub_;
  }
  void Close() {
    std::shared_ptr<EventSubscriber> s = std::move(sub_);
    py::gil_scoped_release release;  // Stop() joins the background thread
    if (s != nullptr) s->Stop();
    s.reset();
  }
  bool closed() const { return sub_ == nullptr; }

 private:
  std::shared_ptr<EventSubscriber> sub_;
};

PyEventSubscriber Start(py::handle members, const py::kwargs& kwargs) {
  const client::EventSubscriberOptions options = EventSubscriberOptionsFromPython(members, kwargs);
  absl::StatusOr<std::unique_ptr<EventSubscriber>> s;
  {
    py::gil_scoped_release release;
    s = EventSubscriber::Start(options);
  }
  if (!s.ok()) RaiseStatus(s.status());
  return PyEventSubscriber(std::shared_ptr<EventSubscriber>(std::move(s).value()));
}

Fingerprint OneFingerprint(py::handle fp) {
  py::list one;
  one.append(fp);
  const std::vector<Fingerprint> fps = ToFingerprints(one);
  return fps[0];
}

py::bytes FingerprintBytes(const Fingerprint& fp) {
  return py::bytes(reinterpret_cast<const char*>(fp.bytes.data()), fp.bytes.size());
}

uint64_t NamespaceId(py::handle ns) {
  if (py::isinstance<Namespace>(ns)) return ns.cast<const Namespace&>().Id();
  if (py::isinstance<py::int_>(ns) && !py::isinstance<py::bool_>(ns)) return ns.cast<uint64_t>();
  throw py::type_error("ns: must be a kvtier.Namespace or a namespace id (int)");
}

py::dict NodeToDict(const client::NodeEventState& n) {
  static_assert(AggregateFieldCount<client::NodeEventState>() == 6, "NodeEventState changed: update NodeToDict");
  py::dict d;
  d["node_id"] = n.node_id;
  d["address"] = n.address;
  d["instance_id"] = n.instance_id;
  d["applied_seq"] = n.applied_seq;
  d["synced"] = n.synced;
  d["blocks"] = n.blocks;
  return d;
}

// IndexedBlock's fields: key (fingerprint and shard), namespace_id, tenant_id, tier, depth, size_bytes.
// (No field-count check: BlockKey and Fingerprint are aggregates, which brace elision counts as theirs.)
py::dict BlockToDict(const client::IndexedBlock& b) {
  py::dict d;
  d["fingerprint"] = FingerprintBytes(b.key.fingerprint);
  d["shard"] = b.key.shard;
  d["namespace_id"] = b.namespace_id;
  d["tenant_id"] = b.tenant_id;
  d["tier"] = b.tier;
  d["depth"] = b.depth;
  d["size_bytes"] = b.size_bytes;
  return d;
}

constexpr const char* kDoc = R"doc(
Follows the KV events of many kvtier servers (docs/events.md) and keeps an index of which node holds
which blocks, for KV-aware routing. One background thread reads every server's ZeroMQ stream and
catches up over gRPC (Replay, Snapshot) after a gap or a restart; queries read the index.

EventSubscriber(members, *, rpc_timeout=5.0, retry_interval=1.0, receive_hwm=100000,
                max_message_bytes=80 MiB, tls_ca_file="", tls_cert_file="", tls_key_file="",
                tls_server_name="", auth_token="")
  members: the servers' gRPC addresses ("host:port", or one comma-separated str); each must run with
    events enabled (events.enabled / --events_pub_endpoint).
  Durations are seconds (int or float) or datetime.timedelta, or `<name>_ms` in milliseconds.
  TLS and token as for Client; servers with auth need an admin token (events describe every tenant).
  Unreachable members are retried in the background.
Raises InvalidArgumentError (bad options) or kvtier.Error (ZeroMQ failed).
Thread-safe. Use as a context manager, or call close().)doc";

}  // namespace

void RegisterEventSubscriber(py::module_& m) {
  py::class_<PyEventSubscriber>(m, "EventSubscriber", kDoc)
      .def(py::init(&Start), py::arg("members"))
      .def(
          "wait_for_catch_up",
          [](const PyEventSubscriber& self, py::handle timeout) {
            auto s = self.Get();
            const absl::Duration t = ToDuration(timeout, "timeout");
            absl::Status st;
            {
              py::gil_scoped_release release;
              st = s->WaitForCatchUp(t);
            }
            if (!st.ok()) RaiseStatus(st);
          },
          py::arg("timeout") = 10.0, R"doc(
Waits until the index holds every event each reachable member had numbered when this was called.
timeout: seconds or datetime.timedelta. Raises kvtier.Error: DEADLINE_EXCEEDED (not caught up in time),
UNAVAILABLE (a member did not answer).)doc")
      .def(
          "nodes_holding",
          [](const PyEventSubscriber& self, py::handle fingerprint, uint32_t shard) {
            auto s = self.Get();
            const BlockKey key{.fingerprint = OneFingerprint(fingerprint), .shard = shard};
            py::gil_scoped_release release;
            return s->NodesHolding(key);
          },
          py::arg("fingerprint"), py::arg("shard") = 0, "Node ids holding this block (any tier), sorted.")
      .def(
          "prefix_match",
          [](const PyEventSubscriber& self, py::handle ns, py::handle fingerprints, uint32_t shard) {
            auto s = self.Get();
            const uint64_t id = NamespaceId(ns);
            const std::vector<Fingerprint> fps = ToFingerprints(fingerprints);
            py::gil_scoped_release release;
            return s->PrefixMatch(id, fps, shard);
          },
          py::arg("ns"), py::arg("fingerprints"), py::arg("shard") = 0, R"doc(
For each node holding at least the first block: how many leading blocks of `fingerprints` (a chain of
namespace `ns`, a kvtier.Namespace or its id) it holds, as [(node_id, blocks), ...], longest first.)doc")
      .def(
          "blocks_of",
          [](const PyEventSubscriber& self, const std::string& node_id) {
            auto s = self.Get();
            std::vector<client::IndexedBlock> blocks;
            {
              py::gil_scoped_release release;
              blocks = s->BlocksOf(node_id);
            }
            py::list out;
            for (const client::IndexedBlock& b : blocks) out.append(BlockToDict(b));
            return out;
          },
          py::arg("node_id"), R"doc(
Every block the index holds for `node_id` ([] when unknown): dicts with fingerprint (32 bytes), shard,
namespace_id, tenant_id, tier ("host", "disk", "hbm"), depth and size_bytes.)doc")
      .def(
          "nodes",
          [](const PyEventSubscriber& self) {
            auto s = self.Get();
            std::vector<client::NodeEventState> nodes;
            {
              py::gil_scoped_release release;
              nodes = s->Nodes();
            }
            py::list out;
            for (const client::NodeEventState& n : nodes) out.append(NodeToDict(n));
            return out;
          },
          R"doc(
One dict per member, in the order given: node_id, address, instance_id (0: never reached),
applied_seq, synced (False while a failed catch-up is retried), blocks.)doc")
      .def(
          "stats",
          [](const PyEventSubscriber& self) {
            auto s = self.Get();
            client::EventSubscriberStats st;
            {
              py::gil_scoped_release release;
              st = s->stats();
            }
            return StatsToDict(st);
          },
          R"doc(
Counters since start: batches, events_applied, gaps, instance_changes, replays, snapshots,
catch_up_failures, decode_errors.)doc")
      .def(
          "pause",
          [](const PyEventSubscriber& self) {
            auto s = self.Get();
            py::gil_scoped_release release;
            s->Pause();
          },
          "Stops reading (what is published meanwhile is lost, and caught up after resume()).")
      .def(
          "resume",
          [](const PyEventSubscriber& self) {
            auto s = self.Get();
            py::gil_scoped_release release;
            s->Resume();
          },
          "Reads again; the gaps are caught up.")
      .def("close", &PyEventSubscriber::Close, "Stops the background thread. Later calls raise kvtier.Error.")
      .def_property_readonly("closed", &PyEventSubscriber::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyEventSubscriber& self, py::args) {
        self.Close();
        return false;
      });
}

}  // namespace kvtier::python
