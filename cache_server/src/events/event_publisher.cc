#include "events/event_publisher.h"

#include <zmq.h>

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvtier::server {

namespace {

// "tcp://host:0" binds an ephemeral port in ZeroMQ as "tcp://host:*".
std::string ZmqBindEndpoint(const std::string& endpoint) {
  if (absl::StartsWith(endpoint, "tcp://") && absl::EndsWith(endpoint, ":0")) {
    return absl::StrCat(endpoint.substr(0, endpoint.size() - 1), "*");
  }
  return endpoint;
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
  auto p = std::unique_ptr<EventPublisher>(new EventPublisher(options));
  p->zmq_context_ = zmq_ctx_new();
  if (p->zmq_context_ == nullptr) return absl::InternalError("zmq_ctx_new failed");
  p->pub_socket_ = zmq_socket(p->zmq_context_, ZMQ_PUB);
  if (p->pub_socket_ == nullptr) return absl::InternalError(absl::StrCat("zmq_socket: ", zmq_strerror(zmq_errno())));
  const int linger_ms = 0;
  zmq_setsockopt(p->pub_socket_, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
  zmq_setsockopt(p->pub_socket_, ZMQ_SNDHWM, &options.send_hwm, sizeof(options.send_hwm));
  const std::string bind = ZmqBindEndpoint(options.pub_endpoint);
  if (zmq_bind(p->pub_socket_, bind.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("events.pub_endpoint: cannot bind ", options.pub_endpoint, ": ", zmq_strerror(zmq_errno())));
  }
  char last[256] = {};
  size_t last_len = sizeof(last);
  if (zmq_getsockopt(p->pub_socket_, ZMQ_LAST_ENDPOINT, last, &last_len) == 0) p->bound_endpoint_ = last;
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  return p;
}

EventPublisher::~EventPublisher() {
  Stop();
  if (pub_socket_ != nullptr) zmq_close(pub_socket_);
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
}

v1::KvEventBatch EventPublisher::Encode(const std::vector<Event>& events, uint64_t last_seq) const {
  v1::KvEventBatch batch;
  batch.set_schema_version(v1::EVENT_SCHEMA_CURRENT);
  batch.set_node_id(options_.node_id);
  batch.set_instance_id(instance_id_);
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
    Encode(batch, last_seq).SerializeToString(&bytes);
    if (zmq_send(pub_socket_, bytes.data(), bytes.size(), 0) >= 0) {
      stats_.published_batches.fetch_add(1, std::memory_order_relaxed);
      stats_.published_events.fetch_add(batch.size(), std::memory_order_relaxed);
    }
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

}  // namespace kvtier::server
