#include "events/event_publisher.h"

#include <zmq.h>

#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvtier/common/log.h"
#include "kvtier/wire/wire.h"

namespace kvtier::server {

namespace {

// "tcp://host:0" binds an ephemeral port in ZeroMQ as "tcp://host:*".
std::string ZmqBindEndpoint(const std::string& endpoint) {
  if (absl::StartsWith(endpoint, "tcp://") && absl::EndsWith(endpoint, ":0")) {
    return absl::StrCat(endpoint.substr(0, endpoint.size() - 1), "*");
  }
  return endpoint;
}

std::string LastEndpoint(void* socket) {
  char last[256] = {};
  size_t last_len = sizeof(last);
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, last, &last_len) == 0) return last;
  return "";
}

// A socket bound to `endpoint` (key: the config key named in errors), or nullptr with *error set.
void* BindSocket(void* ctx, int type, const std::string& endpoint, const char* key, int send_hwm, absl::Status* error) {
  void* s = zmq_socket(ctx, type);
  if (s == nullptr) {
    *error = absl::InternalError(absl::StrCat("zmq_socket: ", zmq_strerror(zmq_errno())));
    return nullptr;
  }
  const int linger_ms = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
  zmq_setsockopt(s, ZMQ_SNDHWM, &send_hwm, sizeof(send_hwm));
  const std::string bind = ZmqBindEndpoint(endpoint);
  if (zmq_bind(s, bind.c_str()) != 0) {
    *error = absl::UnavailableError(absl::StrCat(key, ": cannot bind ", endpoint, ": ", zmq_strerror(zmq_errno())));
    zmq_close(s);
    return nullptr;
  }
  return s;
}

std::string BigEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

}  // namespace

EventPublisher::EventPublisher(const EventPublisherOptions& options)
    : options_(options), instance_id_(NewInstanceId()) {}

absl::StatusOr<std::unique_ptr<EventPublisher>> EventPublisher::Start(const EventPublisherOptions& options) {
  if (options.node_id.empty()) return absl::InvalidArgumentError("events: node_id is required");
  if (options.replay_buffer_events == 0) return absl::InvalidArgumentError("events.replay_buffer_events: must be > 0");
  if (options.max_batch_events == 0) return absl::InvalidArgumentError("events.max_batch_events: must be > 0");
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("events.heartbeat_interval: must be > 0");
  }
  const bool kvtier = options.format != EventFormat::kVllm;
  const bool vllm = options.format != EventFormat::kKvtier;
  if (vllm && options.vllm_block_size == 0) return absl::InvalidArgumentError("events.vllm_block_size: must be > 0");
  auto p = std::unique_ptr<EventPublisher>(new EventPublisher(options));
  p->zmq_context_ = zmq_ctx_new();
  if (p->zmq_context_ == nullptr) return absl::InternalError("zmq_ctx_new failed");
  absl::Status error;
  if (kvtier) {
    p->pub_socket_ =
        BindSocket(p->zmq_context_, ZMQ_PUB, options.pub_endpoint, "events.pub_endpoint", options.send_hwm, &error);
    if (p->pub_socket_ == nullptr) return error;
    p->bound_endpoint_ = LastEndpoint(p->pub_socket_);
  }
  if (vllm) {
    p->vllm_pub_socket_ = BindSocket(p->zmq_context_, ZMQ_PUB, options.vllm_pub_endpoint, "events.vllm_pub_endpoint",
                                     options.send_hwm, &error);
    if (p->vllm_pub_socket_ == nullptr) return error;
    p->vllm_bound_endpoint_ = LastEndpoint(p->vllm_pub_socket_);
    if (!options.vllm_replay_endpoint.empty()) {
      p->vllm_replay_socket_ = BindSocket(p->zmq_context_, ZMQ_ROUTER, options.vllm_replay_endpoint,
                                          "events.vllm_replay_endpoint", options.send_hwm, &error);
      if (p->vllm_replay_socket_ == nullptr) return error;
      // A reply to a peer that is gone fails (EHOSTUNREACH) instead of vanishing; a full pipe says EAGAIN.
      const int mandatory = 1;
      zmq_setsockopt(p->vllm_replay_socket_, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory));
      p->vllm_replay_bound_endpoint_ = LastEndpoint(p->vllm_replay_socket_);
    }
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  if (p->vllm_replay_socket_ != nullptr) p->replay_thread_ = std::thread([raw = p.get()] { raw->RunVllmReplay(); });
  return p;
}

EventPublisher::~EventPublisher() {
  Stop();
  if (pub_socket_ != nullptr) zmq_close(pub_socket_);
  if (vllm_pub_socket_ != nullptr) zmq_close(vllm_pub_socket_);
  if (vllm_replay_socket_ != nullptr) zmq_close(vllm_replay_socket_);
  if (zmq_context_ != nullptr) zmq_ctx_term(zmq_context_);
}

void EventPublisher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  replay_stop_.store(true);
  if (replay_thread_.joinable()) replay_thread_.join();
}

void EventPublisher::OnStored(const EventBlockInfo& block) { Append(Kind::kStored, &block, Tier{}); }
void EventPublisher::OnRemoved(const EventBlockInfo& block) { Append(Kind::kRemoved, &block, Tier{}); }
void EventPublisher::OnMoved(const EventBlockInfo& block, Tier from) { Append(Kind::kMoved, &block, from); }
void EventPublisher::OnCleared() { Append(Kind::kCleared, nullptr, Tier{}); }

void EventPublisher::Append(Kind kind, const EventBlockInfo* block, Tier from) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Event e{.seq = ++last_seq_, .kind = kind, .from = from};
    if (block != nullptr) e.block = *block;
    if (ring_.size() == options_.replay_buffer_events) {
      if (ring_.front().seq > published_seq_) {
        stats_.unpublished_events.fetch_add(1, std::memory_order_relaxed);
        published_seq_ = ring_.front().seq;  // the thread never saw it; subscribers will see the gap
      }
      ring_.pop_front();
    }
    ring_.push_back(e);
  }
  stats_.events.fetch_add(1, std::memory_order_relaxed);
  cv_.notify_one();
}

uint64_t EventPublisher::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_;
}

uint64_t EventPublisher::oldest_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_.empty() ? last_seq_ + 1 : ring_.front().seq;
}

void EventPublisher::AddName(uint64_t namespace_id, google::protobuf::Map<uint64_t, v1::EventNamespace>* names) const {
  if (!options_.namespace_names || names->contains(namespace_id)) return;
  if (auto n = options_.namespace_names(namespace_id); n.has_value()) {
    v1::EventNamespace& out = (*names)[namespace_id];
    out.set_tenant(n->first);
    out.set_model(n->second);
  }
}

void EventPublisher::FillBlock(const EventBlockInfo& b, v1::EventBlock* out) const {
  out->set_fingerprint(b.key.fingerprint.bytes.data(), b.key.fingerprint.bytes.size());
  out->set_shard(b.key.shard);
  out->set_namespace_id(b.namespace_id);
  out->set_tenant_id(b.tenant_id);
  out->set_tier(TierName(b.tier));
  out->set_depth(b.depth);
  out->set_size_bytes(b.size_bytes);
  if (b.block_meta == nullptr) return;
  if (const auto& parent = b.block_meta->parent_fingerprint; parent.has_value()) {
    out->set_parent_fingerprint(parent->bytes.data(), parent->bytes.size());
  }
  if (!b.block_meta->engine_empty()) {
    wire::ToProto(*b.block_meta, out->mutable_engine());
    out->mutable_engine()->clear_parent_fingerprint();  // in parent_fingerprint above, not twice
  }
}

v1::KvEventBatch EventPublisher::Encode(const std::vector<Event>& events, uint64_t last_seq) const {
  v1::KvEventBatch batch;
  batch.set_schema_version(v1::EVENT_SCHEMA_CURRENT);
  batch.set_node_id(options_.node_id);
  batch.set_instance_id(instance_id_);
  batch.set_backend_id(options_.backend_id.empty() ? options_.node_id : options_.backend_id);
  for (const std::string& id : options_.instance_ids) batch.add_engine_instance_ids(id);
  batch.set_last_seq(last_seq);
  batch.set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
  for (const Event& e : events) {
    v1::KvEvent* out = batch.add_events();
    out->set_seq(e.seq);
    switch (e.kind) {
      case Kind::kStored:
        FillBlock(e.block, out->mutable_stored()->mutable_block());
        break;
      case Kind::kRemoved:
        FillBlock(e.block, out->mutable_removed()->mutable_block());
        break;
      case Kind::kMoved:
        FillBlock(e.block, out->mutable_moved()->mutable_block());
        out->mutable_moved()->set_from_tier(TierName(e.from));
        break;
      case Kind::kCleared:
        out->mutable_cleared();
        break;
    }
    if (e.kind != Kind::kCleared) AddName(e.block.namespace_id, batch.mutable_namespaces());
  }
  return batch;
}

void EventPublisher::Run() {
  std::vector<Event> batch;
  std::string bytes;
  std::unique_lock<std::mutex> lock(mu_);
  absl::Time last_send = absl::Now();
  while (true) {
    const bool pending = last_seq_ > published_seq_;
    if (!pending) {
      if (stopping_) break;
      const absl::Duration wait = last_send + options_.heartbeat_interval - absl::Now();
      if (wait > absl::ZeroDuration()) {
        cv_.wait_for(lock, absl::ToChronoNanoseconds(wait));
        continue;
      }
    }
    // New events (up to a batch), or a heartbeat carrying last_seq only.
    batch.clear();
    if (pending) {
      const uint64_t first = published_seq_ + 1;
      const uint64_t front = ring_.front().seq;  // pending implies the ring holds `first`
      for (size_t i = first - front; i < ring_.size() && batch.size() < options_.max_batch_events; ++i) {
        batch.push_back(ring_[i]);
      }
      published_seq_ = batch.back().seq;
    }
    const uint64_t last_seq = last_seq_;
    lock.unlock();
    if (pub_socket_ != nullptr) {
      Encode(batch, last_seq).SerializeToString(&bytes);
      if (zmq_send(pub_socket_, bytes.data(), bytes.size(), 0) >= 0) {
        stats_.published_batches.fetch_add(1, std::memory_order_relaxed);
        stats_.published_events.fetch_add(batch.size(), std::memory_order_relaxed);
      }
    }
    if (vllm_pub_socket_ != nullptr && !batch.empty()) PublishVllm(batch);
    last_send = absl::Now();
    lock.lock();
  }
}

absl::Status EventPublisher::Replay(uint64_t instance_id, uint64_t from_seq,
                                    const std::function<bool(const v1::KvEventBatch&)>& emit) {
  stats_.replay_requests.fetch_add(1, std::memory_order_relaxed);
  if (instance_id != instance_id_) {
    stats_.replay_out_of_range.fetch_add(1, std::memory_order_relaxed);
    return absl::FailedPreconditionError(absl::StrCat("instance ", instance_id, " is not this server's instance ",
                                                      instance_id_, " (it restarted): take a snapshot"));
  }
  std::vector<Event> events;
  uint64_t last_seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_seq = last_seq_;
    const uint64_t oldest = ring_.empty() ? last_seq_ + 1 : ring_.front().seq;
    if (from_seq < oldest || from_seq > last_seq_ + 1) {
      stats_.replay_out_of_range.fetch_add(1, std::memory_order_relaxed);
      return absl::OutOfRangeError(absl::StrCat("seq ", from_seq, " is not held: the replay buffer holds ", oldest,
                                                "..", last_seq_, "; take a snapshot"));
    }
    events.assign(ring_.begin() + static_cast<std::ptrdiff_t>(from_seq - oldest), ring_.end());
  }
  stats_.replayed_events.fetch_add(events.size(), std::memory_order_relaxed);
  std::vector<Event> part;
  for (size_t i = 0; i < events.size(); i += options_.max_batch_events) {
    part.assign(
        events.begin() + static_cast<std::ptrdiff_t>(i),
        events.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(events.size(), i + options_.max_batch_events)));
    if (!emit(Encode(part, last_seq))) break;
  }
  if (events.empty()) emit(Encode({}, last_seq));
  return absl::OkStatus();
}

void EventPublisher::Snapshot(const BlockStore& store, size_t chunk_blocks,
                              const std::function<bool(const v1::SnapshotChunk&)>& emit) {
  stats_.snapshot_requests.fetch_add(1, std::memory_order_relaxed);
  uint64_t seq = 0;
  // The cut runs under the store's lock, which orders every sink call: `seq` is exactly the last change
  // reflected in the list.
  const std::vector<EventBlockInfo> blocks = store.SnapshotForEvents([&] {
    std::lock_guard<std::mutex> lock(mu_);
    seq = last_seq_;
  });
  stats_.snapshot_blocks.fetch_add(blocks.size(), std::memory_order_relaxed);
  if (chunk_blocks == 0) chunk_blocks = 4096;
  size_t i = 0;
  do {
    v1::SnapshotChunk chunk;
    chunk.set_schema_version(v1::EVENT_SCHEMA_CURRENT);
    chunk.set_node_id(options_.node_id);
    chunk.set_instance_id(instance_id_);
    chunk.set_seq(seq);
    const size_t end = std::min(blocks.size(), i + chunk_blocks);
    for (; i < end; ++i) {
      FillBlock(blocks[i], chunk.add_blocks());
      AddName(blocks[i].namespace_id, chunk.mutable_namespaces());
    }
    chunk.set_last(i == blocks.size());
    if (!emit(chunk)) return;
  } while (i < blocks.size());
}

void EventPublisher::PublishVllm(const std::vector<Event>& events) {
  std::vector<VllmEvent> out;
  out.reserve(events.size());
  auto block_event = [&](VllmEvent::Kind kind, const EventBlockInfo& b, Tier tier) {
    out.push_back({.kind = kind,
                   .block_hashes = {b.key.fingerprint},
                   .medium = VllmMedium(tier),
                   .block_size = options_.vllm_block_size,
                   .block_meta = {b.block_meta}});
  };
  for (const Event& e : events) {
    switch (e.kind) {
      case Kind::kStored:
        block_event(VllmEvent::Kind::kStored, e.block, e.block.tier);
        break;
      case Kind::kRemoved:
        block_event(VllmEvent::Kind::kRemoved, e.block, e.block.tier);
        break;
      case Kind::kMoved:  // vLLM has no move: gone from the old medium, then present on the new one
        block_event(VllmEvent::Kind::kRemoved, e.block, e.from);
        block_event(VllmEvent::Kind::kStored, e.block, e.block.tier);
        break;
      case Kind::kCleared:
        out.push_back({.kind = VllmEvent::Kind::kCleared});
        break;
    }
  }
  const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  auto payload = std::make_shared<const std::string>(
      EncodeVllmBatch(ts, out, options_.vllm_data_parallel_rank, options_.vllm_block_hash, options_.vllm_encoding,
                      {.backend_id = options_.backend_id.empty() ? options_.node_id : options_.backend_id,
                       .instance_ids = options_.instance_ids}));
  const uint64_t seq = vllm_next_seq_++;
  const std::string seq_bytes = BigEndian64(seq);
  const std::string& topic = options_.vllm_topic;
  if (zmq_send(vllm_pub_socket_, topic.data(), topic.size(), ZMQ_SNDMORE) >= 0 &&
      zmq_send(vllm_pub_socket_, seq_bytes.data(), seq_bytes.size(), ZMQ_SNDMORE) >= 0 &&
      zmq_send(vllm_pub_socket_, payload->data(), payload->size(), 0) >= 0) {
    stats_.vllm_published_batches.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(vllm_mu_);
  vllm_ring_.push_back({.seq = seq, .events = out.size(), .payload = std::move(payload)});
  vllm_ring_events_ += out.size();
  while (vllm_ring_.size() > 1 && vllm_ring_events_ > options_.replay_buffer_events) {
    vllm_ring_events_ -= vllm_ring_.front().events;
    vllm_ring_.pop_front();
  }
}

void EventPublisher::RunVllmReplay() {
  while (!replay_stop_.load()) {
    zmq_pollitem_t item{vllm_replay_socket_, 0, ZMQ_POLLIN, 0};
    const int rc = zmq_poll(&item, 1, 100);  // wakes every 100 ms to see Stop
    if (rc > 0 && (item.revents & ZMQ_POLLIN) != 0) ServeVllmReplay();
  }
}

void EventPublisher::ServeVllmReplay() {
  // Read one whole request: a peer may send any number of frames (a multipart message arrives whole);
  // the first 4 are kept, the rest only counted.
  std::vector<std::string> frames;
  size_t frame_count = 0;
  bool more = true;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, vllm_replay_socket_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      return;
    }
    if (++frame_count <= 4) frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
  }
  // [identity, "", start_seq (8 bytes big-endian)], what a REQ or DEALER peer sends.
  if (frame_count != 3 || !frames[1].empty()) {
    stats_.vllm_replay_bad_requests.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn, "events: ignored a vLLM replay request of {} frames", frame_count);
    return;
  }
  const std::string& id = frames[0];
  // Sends [identity, "", a, b]; false when the peer is gone or does not read for a second.
  auto send = [&](const std::string& a, const std::string& b) {
    const std::string* parts[] = {&id, nullptr, &a, &b};
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool ok = true;
      for (size_t i = 0; i < 4 && ok; ++i) {
        const char* data = parts[i] == nullptr ? "" : parts[i]->data();
        const size_t size = parts[i] == nullptr ? 0 : parts[i]->size();
        const int flags = ZMQ_DONTWAIT | (i < 3 ? ZMQ_SNDMORE : 0);
        if (zmq_send(vllm_replay_socket_, data, size, flags) < 0) {
          // Nothing of the message is queued unless its first frame went out; ROUTER_MANDATORY fails
          // the identity frame, so a failure is always on i == 0.
          ok = false;
        }
      }
      if (ok) return true;
      if (zmq_errno() != EAGAIN) return false;
      zmq_pollitem_t item{vllm_replay_socket_, 0, ZMQ_POLLOUT, 0};
      if (zmq_poll(&item, 1, 1000) <= 0) return false;
    }
    return false;
  };
  const std::string end_marker = BigEndian64(~uint64_t{0});  // -1 as 8 bytes big-endian, two's complement
  if (frames[2].size() != 8) {
    stats_.vllm_replay_bad_requests.fetch_add(1, std::memory_order_relaxed);
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn, "events: vLLM replay request with a {}-byte start seq (want 8)",
                     frames[2].size());
    send(end_marker, "");
    return;
  }
  uint64_t start = 0;
  for (unsigned char c : frames[2]) start = (start << 8) | c;
  stats_.vllm_replay_requests.fetch_add(1, std::memory_order_relaxed);
  std::vector<VllmMessage> held;
  {
    std::lock_guard<std::mutex> lock(vllm_mu_);
    for (const VllmMessage& m : vllm_ring_) {
      if (m.seq >= start) held.push_back(m);
    }
  }
  for (const VllmMessage& m : held) {
    if (!send(BigEndian64(m.seq), *m.payload)) return;
    stats_.vllm_replayed_batches.fetch_add(1, std::memory_order_relaxed);
  }
  send(end_marker, "");
}

void EventPublisher::ForEachCounter(const CounterVisitor& visit) const {
  const EventPublisherStats& s = stats_;
  auto v = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  auto one = [&](std::string_view name, std::string_view help, uint64_t value,
                 std::vector<std::pair<std::string_view, std::string_view>> labels = {},
                 CounterKind kind = CounterKind::kCounter) {
    visit(CounterInfo{.name = name, .help = help, .kind = kind, .labels = std::move(labels)}, value);
  };
  one("kvtier_events_total", "KV events numbered (block stored, removed, moved, all cleared).", v(s.events));
  one("kvtier_events_published_total", "KV events sent on the PUB socket.", v(s.published_events));
  one("kvtier_event_batches_published_total", "PUB messages sent, heartbeats included.", v(s.published_batches));
  one("kvtier_events_unpublished_total", "KV events that left the replay buffer before being published.",
      v(s.unpublished_events));
  // Rejected ones are counted in both; the "ok" sample is the difference.
  constexpr std::string_view kReplay =
      "Replay requests, by result (out_of_range: the subscriber must take a snapshot).";
  const uint64_t rejected = v(s.replay_out_of_range);
  const uint64_t replays = v(s.replay_requests);
  one("kvtier_event_replay_requests_total", kReplay, replays > rejected ? replays - rejected : 0, {{"result", "ok"}});
  one("kvtier_event_replay_requests_total", kReplay, rejected, {{"result", "out_of_range"}});
  one("kvtier_event_replayed_total", "KV events served by Replay.", v(s.replayed_events));
  one("kvtier_event_snapshot_requests_total", "Snapshot requests served.", v(s.snapshot_requests));
  one("kvtier_event_snapshot_blocks_total", "Blocks sent by Snapshot requests.", v(s.snapshot_blocks));
  one("kvtier_event_vllm_batches_published_total", "vLLM-format KV event batches sent on the vLLM PUB socket.",
      v(s.vllm_published_batches));
  constexpr std::string_view kVllmReplay =
      "Requests on the vLLM replay socket, by result (malformed: ignored, or answered with the end marker only).";
  one("kvtier_event_vllm_replay_requests_total", kVllmReplay, v(s.vllm_replay_requests), {{"result", "ok"}});
  one("kvtier_event_vllm_replay_requests_total", kVllmReplay, v(s.vllm_replay_bad_requests), {{"result", "malformed"}});
  one("kvtier_event_vllm_replayed_batches_total", "vLLM-format batches sent by the replay socket.",
      v(s.vllm_replayed_batches));
  one("kvtier_event_last_seq", "The latest KV event sequence number of this server instance.", last_seq(), {},
      CounterKind::kGauge);
}

}  // namespace kvtier::server
