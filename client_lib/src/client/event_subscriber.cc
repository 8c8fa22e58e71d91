#include "kvtier/client/event_subscriber.h"

#include <zmq.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/event_sequence.h"
#include "kvtier/common/host_port.h"
#include "kvtier/v1/events.grpc.pb.h"
#include "kvtier/wire/channel_security.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {
namespace {

constexpr uint32_t kSchemaVersion = 1;  // v1::EVENT_SCHEMA_CURRENT this library understands

// "tcp://0.0.0.0:7402" seen from a member at "10.0.0.5:7400" is "tcp://10.0.0.5:7402".
std::string ConnectEndpoint(const std::string& bound, const std::string& member_address) {
  const size_t scheme = bound.find("://");
  const size_t colon = bound.rfind(':');
  if (scheme == std::string::npos || colon == std::string::npos || colon <= scheme + 3) return bound;
  const std::string host = bound.substr(scheme + 3, colon - scheme - 3);
  if (!IsWildcardHost(host)) return bound;
  const std::string member_host = member_address.substr(0, member_address.rfind(':'));
  return absl::StrCat(bound.substr(0, scheme + 3), member_host, bound.substr(colon));
}

bool DecodeBlock(const v1::EventBlock& in, IndexedBlock* out) {
  if (in.fingerprint().size() != out->key.fingerprint.bytes.size()) return false;
  std::memcpy(out->key.fingerprint.bytes.data(), in.fingerprint().data(), in.fingerprint().size());
  out->key.shard = in.shard();
  out->namespace_id = in.namespace_id();
  out->tenant_id = in.tenant_id();
  out->tier = in.tier();
  out->depth = in.depth();
  out->size_bytes = in.size_bytes();
  return true;
}

}  // namespace

struct EventSubscriber::Impl {
  struct Node {
    std::string address;
    std::unique_ptr<v1::EventService::Stub> stub;
    std::string node_id;   // empty until GetEventsInfo answered
    std::string endpoint;  // connected PUB endpoint; empty when not connected
    EventCursor cursor;
    absl::flat_hash_map<BlockKey, IndexedBlock> blocks;
    absl::Time retry_at = absl::InfinitePast();  // next connect or catch-up attempt
    bool needs_catch_up = false;                 // a catch-up failed: retried at retry_at
    std::vector<uint64_t> retired;  // instances this node had before (messages of them still queued are stale)
  };

  EventSubscriberOptions options;
  void* context = nullptr;
  void* socket = nullptr;  // owned by the thread after Start

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Node> nodes;                              // guarded by mu (stubs are immutable)
  absl::flat_hash_map<std::string, size_t> by_node_id;  // guarded by mu
  EventSubscriberStats stats;                           // guarded by mu
  bool stopping = false;                                // guarded by mu
  bool paused = false;                                  // guarded by mu (requested state)
  std::thread thread;

  // ---- the background thread ----

  absl::Status OpenSocket() {
    socket = zmq_socket(context, ZMQ_SUB);
    if (socket == nullptr) return absl::InternalError(absl::StrCat("zmq_socket: ", zmq_strerror(zmq_errno())));
    const int linger = 0;
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(socket, ZMQ_RCVHWM, &options.receive_hwm, sizeof(options.receive_hwm));
    zmq_setsockopt(socket, ZMQ_SUBSCRIBE, "", 0);
    return absl::OkStatus();
  }

  void CloseSocket() {
    if (socket != nullptr) zmq_close(socket);
    socket = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    for (Node& n : nodes) n.endpoint.clear();
  }

  // Asks member i for its endpoint and connects the SUB socket to it. With `catch_up`, then takes its
  // current state. Runs on the thread (or in Start before it exists).
  void Connect(size_t i, bool catch_up) {
    v1::GetEventsInfoResponse info;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    const grpc::Status s = nodes[i].stub->GetEventsInfo(&ctx, v1::GetEventsInfoRequest(), &info);
    std::unique_lock<std::mutex> lock(mu);
    Node& n = nodes[i];
    if (!s.ok()) {
      n.retry_at = absl::Now() + options.retry_interval;
      return;
    }
    const std::string endpoint = ConnectEndpoint(info.pub_endpoint(), n.address);
    if (!n.node_id.empty() && n.node_id != info.node_id()) by_node_id.erase(n.node_id);
    n.node_id = info.node_id();
    by_node_id[n.node_id] = i;
    lock.unlock();
    if (zmq_connect(socket, endpoint.c_str()) != 0) {
      lock.lock();
      n.retry_at = absl::Now() + options.retry_interval;
      return;
    }
    lock.lock();
    n.endpoint = endpoint;
    if (!catch_up) return;
    if (n.cursor.instance_id != info.instance_id()) ResetLocked(n, info.instance_id());
    lock.unlock();
    CatchUp(i, n.cursor.applied_seq + 1);
  }

  void ResetLocked(Node& n, uint64_t instance_id) {
    if (n.cursor.instance_id != 0) {
      ++stats.instance_changes;
      n.retired.push_back(n.cursor.instance_id);
      if (n.retired.size() > 8) n.retired.erase(n.retired.begin());
    }
    n.cursor = EventCursor{.instance_id = instance_id, .applied_seq = 0, .synced = true};
    n.blocks.clear();
    cv.notify_all();
  }

  // Applies `e` to node n (whose cursor is at e.seq() - 1).
  void ApplyLocked(Node& n, const v1::KvEvent& e) {
    IndexedBlock b;
    switch (e.kind_case()) {
      case v1::KvEvent::kStored:
        if (DecodeBlock(e.stored().block(), &b)) n.blocks[b.key] = std::move(b);
        break;
      case v1::KvEvent::kRemoved:
        if (DecodeBlock(e.removed().block(), &b)) n.blocks.erase(b.key);
        break;
      case v1::KvEvent::kMoved:
        if (DecodeBlock(e.moved().block(), &b)) n.blocks[b.key] = std::move(b);
        break;
      case v1::KvEvent::kCleared:
        n.blocks.clear();
        break;
      default:
        break;  // a kind added by a later schema: it changes nothing this version tracks
    }
    n.cursor.applied_seq = e.seq();
    ++stats.events_applied;
  }

  // Applies events[from..] of a batch that continues the cursor exactly. False if it does not.
  bool ApplyBatchLocked(Node& n, const v1::KvEventBatch& b, size_t from) {
    for (size_t k = from; k < static_cast<size_t>(b.events_size()); ++k) {
      if (b.events(static_cast<int>(k)).seq() != n.cursor.applied_seq + 1) return false;
      ApplyLocked(n, b.events(static_cast<int>(k)));
    }
    cv.notify_all();
    return true;
  }

  // Brings node i from seq `from` to the server's present: Replay, or a Snapshot when the server no
  // longer holds `from` (or the instance changed, or the replay broke off). Runs unlocked (gRPC calls).
  void CatchUp(size_t i, uint64_t from) {
    uint64_t instance = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      instance = nodes[i].cursor.instance_id;
    }
    v1::EventService::Stub& stub = *nodes[i].stub;
    if (instance != 0) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
      v1::ReplayRequest req;
      req.set_instance_id(instance);
      req.set_from_seq(from);
      auto reader = stub.Replay(&ctx, req);
      v1::KvEventBatch b;
      bool ok = true;
      while (reader->Read(&b)) {
        std::lock_guard<std::mutex> lock(mu);
        Node& n = nodes[i];
        if (!ok || b.instance_id() != n.cursor.instance_id) {
          ok = false;
          continue;
        }
        const uint64_t first = b.events_size() > 0 ? b.events(0).seq() : n.cursor.applied_seq + 1;
        const size_t skip = FirstUnapplied(n.cursor.applied_seq, first, static_cast<size_t>(b.events_size()));
        if (skip > static_cast<size_t>(b.events_size()) || !ApplyBatchLocked(n, b, skip)) ok = false;
      }
      const grpc::Status s = reader->Finish();
      if (ok && s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.replays;
        nodes[i].cursor.synced = true;
        nodes[i].needs_catch_up = false;
        cv.notify_all();
        return;
      }
      // OUT_OF_RANGE (the ring moved on), FAILED_PRECONDITION (a restart) or a broken stream: snapshot.
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
    auto reader = stub.Snapshot(&ctx, v1::SnapshotRequest());
    v1::SnapshotChunk c;
    absl::flat_hash_map<BlockKey, IndexedBlock> blocks;
    uint64_t seq = 0, snap_instance = 0;
    bool first = true, last = false, ok = true;
    while (reader->Read(&c)) {
      if (first) {
        seq = c.seq();
        snap_instance = c.instance_id();
        first = false;
      }
      if (c.seq() != seq || c.instance_id() != snap_instance || c.schema_version() != kSchemaVersion) ok = false;
      for (const v1::EventBlock& eb : c.blocks()) {
        IndexedBlock b;
        if (DecodeBlock(eb, &b)) blocks[b.key] = std::move(b);
      }
      last = c.last();
    }
    const grpc::Status s = reader->Finish();
    std::lock_guard<std::mutex> lock(mu);
    Node& n = nodes[i];
    if (!s.ok() || !ok || !last) {
      ++stats.catch_up_failures;
      n.cursor.synced = false;
      n.needs_catch_up = true;
      n.retry_at = absl::Now() + options.retry_interval;
      return;
    }
    if (n.cursor.instance_id != snap_instance && n.cursor.instance_id != 0) ResetLocked(n, snap_instance);
    n.cursor = EventCursor{.instance_id = snap_instance, .applied_seq = seq, .synced = true};
    n.blocks = std::move(blocks);
    n.needs_catch_up = false;
    ++stats.snapshots;
    cv.notify_all();
  }

  void HandleMessage(const std::string& bytes) {
    v1::KvEventBatch b;
    std::unique_lock<std::mutex> lock(mu);
    ++stats.batches;
    if (!b.ParseFromString(bytes) || b.schema_version() != kSchemaVersion) {
      ++stats.decode_errors;
      return;
    }
    auto it = by_node_id.find(b.node_id());
    if (it == by_node_id.end()) return;  // not a member of ours
    const size_t i = it->second;
    if (std::find(nodes[i].retired.begin(), nodes[i].retired.end(), b.instance_id()) != nodes[i].retired.end()) {
      return;  // queued before the node restarted
    }
    const size_t num = static_cast<size_t>(b.events_size());
    const uint64_t first = num > 0 ? b.events(0).seq() : 0;
    const BatchPlan plan = PlanBatch(nodes[i].cursor, b.instance_id(), first, num, b.last_seq());
    if (plan.reset) ResetLocked(nodes[i], b.instance_id());
    size_t from = plan.first_index;
    if (plan.catch_up_from != 0) {
      if (nodes[i].cursor.synced) ++stats.gaps;
      lock.unlock();
      CatchUp(i, plan.catch_up_from);
      lock.lock();
      from = FirstUnapplied(nodes[i].cursor.applied_seq, first, num);
      if (from > num) {  // the catch-up failed or stopped short: retried later
        nodes[i].needs_catch_up = true;
        return;
      }
    }
    if (num > 0 && !ApplyBatchLocked(nodes[i], b, from)) nodes[i].needs_catch_up = true;
  }

  void Run() {
    std::string bytes;
    bool open = socket != nullptr;
    while (true) {
      bool want_paused = false;
      std::vector<size_t> to_connect, to_catch_up;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) break;
        want_paused = paused;
        const absl::Time now = absl::Now();
        for (size_t i = 0; i < nodes.size(); ++i) {
          if (nodes[i].retry_at > now) continue;
          if (nodes[i].endpoint.empty()) {
            to_connect.push_back(i);
          } else if (nodes[i].needs_catch_up) {
            to_catch_up.push_back(i);
          }
        }
      }
      if (want_paused) {
        if (open) {
          CloseSocket();
          open = false;
        }
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping || !paused; });
        continue;
      }
      if (!open) {
        if (!OpenSocket().ok()) {
          std::this_thread::sleep_for(absl::ToChronoMilliseconds(options.retry_interval));
          continue;
        }
        open = true;
        continue;  // every node reconnects (without catching up: the stream shows what was missed)
      }
      for (size_t i : to_connect) Connect(i, /*catch_up=*/nodes[i].cursor.instance_id == 0);
      for (size_t i : to_catch_up) {
        uint64_t from = 0;
        {
          std::lock_guard<std::mutex> lock(mu);
          from = nodes[i].cursor.applied_seq + 1;
        }
        CatchUp(i, from);
      }
      zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 100) <= 0) continue;
      for (int k = 0; k < 1024; ++k) {  // drain what is there, then look at the control state again
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, socket, ZMQ_DONTWAIT) < 0) {
          zmq_msg_close(&msg);
          break;
        }
        bytes.assign(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
        zmq_msg_close(&msg);
        HandleMessage(bytes);
      }
    }
    if (open) CloseSocket();
  }
};

EventSubscriber::EventSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EventSubscriber::~EventSubscriber() {
  Stop();
  if (impl_->context != nullptr) zmq_ctx_term(impl_->context);
}

absl::StatusOr<std::unique_ptr<EventSubscriber>> EventSubscriber::Start(const EventSubscriberOptions& options) {
  if (options.members.empty()) return absl::InvalidArgumentError("members: at least one server is required");
  for (const std::string& m : options.members) {
    if (auto hp = ParseHostPort(m); !hp.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("members: ", hp.status().message()));
    }
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("rpc_timeout: must be > 0");
  if (options.retry_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("retry_interval: must be > 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const grpc::ChannelArguments args = wire::ChannelArgs(options.max_message_bytes);
  const wire::ChannelSecurity security{.ca_file = options.tls_ca_file,
                                       .cert_file = options.tls_cert_file,
                                       .key_file = options.tls_key_file,
                                       .server_name = options.tls_server_name,
                                       .auth_token = options.auth_token};
  auto credentials = wire::MakeChannelCredentials(security, "tls_");
  if (!credentials.ok()) return credentials.status();
  impl->nodes.resize(options.members.size());
  for (size_t i = 0; i < options.members.size(); ++i) {
    impl->nodes[i].address = options.members[i];
    impl->nodes[i].stub =
        v1::EventService::NewStub(wire::CreateSecureChannel(options.members[i], *credentials, args, security));
  }
  impl->context = zmq_ctx_new();
  if (impl->context == nullptr) return absl::InternalError("zmq_ctx_new failed");
  auto sub = std::unique_ptr<EventSubscriber>(new EventSubscriber(std::move(impl)));
  Impl& p = *sub->impl_;
  if (absl::Status s = p.OpenSocket(); !s.ok()) return s;
  // Subscribe first, then take each node's state: what is published meanwhile arrives on the socket and
  // is deduplicated by seq, and anything lost to ZeroMQ's subscription delay shows as a gap.
  for (size_t i = 0; i < p.nodes.size(); ++i) p.Connect(i, /*catch_up=*/true);
  p.thread = std::thread([&p] { p.Run(); });
  return sub;
}

void EventSubscriber::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) return;
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void EventSubscriber::Pause() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->paused = true;
}

void EventSubscriber::Resume() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->paused = false;
  }
  impl_->cv.notify_all();
}

absl::Status EventSubscriber::WaitForCatchUp(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::pair<uint64_t, uint64_t>> targets(impl_->nodes.size());  // (instance, last_seq)
  for (size_t i = 0; i < impl_->nodes.size(); ++i) {
    v1::GetEventsInfoResponse info;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + impl_->options.rpc_timeout)));
    const grpc::Status s = impl_->nodes[i].stub->GetEventsInfo(&ctx, v1::GetEventsInfoRequest(), &info);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat(impl_->nodes[i].address, ": ", s.error_message()));
    }
    targets[i] = {info.instance_id(), info.last_seq()};
  }
  std::unique_lock<std::mutex> lock(impl_->mu);
  auto done = [&] {
    for (size_t i = 0; i < targets.size(); ++i) {
      const EventCursor& c = impl_->nodes[i].cursor;
      if (c.instance_id != targets[i].first || c.applied_seq < targets[i].second || !c.synced) return false;
    }
    return true;
  };
  if (!impl_->cv.wait_until(lock, absl::ToChronoTime(deadline), done)) {
    return absl::DeadlineExceededError("the index has not caught up with every member");
  }
  return absl::OkStatus();
}

std::vector<std::string> EventSubscriber::NodesHolding(const BlockKey& key) const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const Impl::Node& n : impl_->nodes) {
    if (n.blocks.contains(key)) out.push_back(n.node_id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, size_t>> EventSubscriber::PrefixMatch(uint64_t namespace_id,
                                                                         std::span<const Fingerprint> fps,
                                                                         uint32_t shard) const {
  std::vector<std::pair<std::string, size_t>> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const Impl::Node& n : impl_->nodes) {
    size_t k = 0;
    for (; k < fps.size(); ++k) {
      auto it = n.blocks.find(BlockKey{.fingerprint = fps[k], .shard = shard});
      if (it == n.blocks.end() || it->second.namespace_id != namespace_id) break;
    }
    if (k > 0) out.emplace_back(n.node_id, k);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::vector<IndexedBlock> EventSubscriber::BlocksOf(const std::string& node_id) const {
  std::vector<IndexedBlock> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->by_node_id.find(node_id);
  if (it == impl_->by_node_id.end()) return out;
  for (const auto& [key, b] : impl_->nodes[it->second].blocks) out.push_back(b);
  return out;
}

std::vector<NodeEventState> EventSubscriber::Nodes() const {
  std::vector<NodeEventState> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const Impl::Node& n : impl_->nodes) {
    out.push_back({.node_id = n.node_id,
                   .address = n.address,
                   .instance_id = n.cursor.instance_id,
                   .applied_seq = n.cursor.applied_seq,
                   .synced = n.cursor.synced && !n.needs_catch_up,
                   .blocks = n.blocks.size()});
  }
  return out;
}

EventSubscriberStats EventSubscriber::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace kvtier::client
