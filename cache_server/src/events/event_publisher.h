// EventPublisher: numbers a BlockStore's changes and publishes them as KV events on a ZeroMQ PUB socket,
// keeping the recent ones for replay (docs/events.md), in kvtier's protobuf format, vLLM's msgpack format
// (with vLLM's replay socket) or both.
#ifndef KVTIER_SERVER_SRC_EVENTS_EVENT_PUBLISHER_H_
#define KVTIER_SERVER_SRC_EVENTS_EVENT_PUBLISHER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "events/vllm_encoder.h"
#include "kvtier/common/counters.h"
#include "kvtier/server/block_event_sink.h"
#include "kvtier/server/block_store.h"
#include "kvtier/v1/events.pb.h"

namespace kvtier::server {

// Which streams a publisher sends: kvtier's (protobuf KvEventBatch on pub_endpoint), vLLM's (msgpack
// KVEventBatch on vllm_pub_endpoint, replay on vllm_replay_endpoint) or both.
enum class EventFormat : uint8_t { kKvtier, kVllm, kBoth };

struct EventPublisherOptions {
  std::string node_id;                                   // required
  EventFormat format = EventFormat::kKvtier;             // Default: kvtier's stream only
  std::string pub_endpoint = "tcp://127.0.0.1:0";        // ZeroMQ endpoint to bind; port 0 = the kernel picks
  uint32_t replay_buffer_events = 65536;                 // Default: 64 Ki events kept for Replay
  uint32_t max_batch_events = 256;                       // Default: at most 256 events per PUB message
  absl::Duration heartbeat_interval = absl::Seconds(1);  // an empty batch (last_seq only) when idle this long
  int send_hwm = 10000;                                  // ZMQ_SNDHWM: messages queued per subscriber
  // vLLM format (format kVllm or kBoth; docs/events.md "vLLM format"). Both endpoints are bound.
  std::string vllm_pub_endpoint = "tcp://127.0.0.1:0";  // PUB of [topic, seq, payload]; port 0 = the kernel picks
  std::string vllm_replay_endpoint;                     // ROUTER answering replay requests; empty = none
  std::string vllm_topic;                               // first frame of every message; Default: "" (vLLM's)
  uint32_t vllm_block_size = 16;                        // BlockStored.block_size (tokens per block)
  VllmBlockHashForm vllm_block_hash = VllmBlockHashForm::kInt;
  VllmEncoding vllm_encoding = VllmEncoding::kArray;
  std::optional<int64_t> vllm_data_parallel_rank = 0;  // KVEventBatch.data_parallel_rank; nullopt omits it
  // The backend holding the blocks ("" = node_id) and the engine instances that can read them; see
  // VllmEnvelope. Default: node_id, no instances.
  std::string backend_id;
  std::vector<std::string> instance_ids;
  // (tenant, model) of a namespace id, where the server knows it; may be empty. Called on the publisher
  // thread and in Replay/Snapshot, never under the store's lock.
  std::function<std::optional<std::pair<std::string, std::string>>(uint64_t)> namespace_names;
};

// Counters since start. Relaxed atomics.
struct EventPublisherStats {
  std::atomic<uint64_t> events{0};              // events numbered (state changes)
  std::atomic<uint64_t> published_events{0};    // events sent on the PUB socket
  std::atomic<uint64_t> published_batches{0};   // PUB messages, heartbeats included
  std::atomic<uint64_t> unpublished_events{0};  // left the ring before the publisher thread sent them
  std::atomic<uint64_t> replay_requests{0};
  std::atomic<uint64_t> replay_out_of_range{0};  // Replay answered OUT_OF_RANGE or FAILED_PRECONDITION
  std::atomic<uint64_t> replayed_events{0};
  std::atomic<uint64_t> snapshot_requests{0};
  std::atomic<uint64_t> snapshot_blocks{0};
  std::atomic<uint64_t> vllm_published_batches{0};  // vLLM-format messages sent
  std::atomic<uint64_t> vllm_replay_requests{0};    // well-formed requests on the replay socket
  std::atomic<uint64_t> vllm_replay_bad_requests{
      0};  // ignored (wrong frame count) or answered with the end marker only
  std::atomic<uint64_t> vllm_replayed_batches{0};
};

// Implements BlockEventSink: each call is given the next sequence number (1, 2, ...; assigned under the
// store's lock, so in the order of the changes) and put in a ring of replay_buffer_events; a publisher
// thread sends new events in batches on the PUB socket, outside the store's lock. ZeroMQ PUB drops
// messages for a subscriber that is too slow (send_hwm); subscribers see the gap in seq and catch up with
// Replay or Snapshot. In the vLLM format each batch that carries events becomes one message numbered
// 0, 1, 2, ... (vLLM's own sequence, per instance); the latest messages holding up to
// replay_buffer_events events are kept for the replay socket, which a second thread serves.
// Thread-safety: all methods may be called concurrently.
class EventPublisher final : public BlockEventSink {
 public:
  // Binds the PUB socket and starts the publisher thread. The store is not attached (the caller calls
  // store.SetEventSink). Errors: InvalidArgument (options), Unavailable (the endpoint cannot be bound).
  static absl::StatusOr<std::unique_ptr<EventPublisher>> Start(const EventPublisherOptions& options);
  ~EventPublisher() override;  // Stop()

  // Publishes what is queued, then stops the thread and closes the socket. Idempotent. Detach the store
  // first: calls after Stop are numbered and kept for Replay but never published.
  void Stop();

  // BlockEventSink (called under the store's lock).
  void OnStored(const EventBlockInfo& block) override;
  void OnRemoved(const EventBlockInfo& block) override;
  void OnMoved(const EventBlockInfo& block, Tier from) override;
  void OnCleared() override;

  // Events from_seq .. the latest, as batches of max_batch_events, to `emit` (which returns false to
  // stop). Errors: FailedPrecondition (instance_id is not this instance), OutOfRange (from_seq is older
  // than the ring or past the latest seq + 1).
  absl::Status Replay(uint64_t instance_id, uint64_t from_seq,
                      const std::function<bool(const v1::KvEventBatch&)>& emit);
  // Every block of `store`, consistent with one seq, as chunks of up to `chunk_blocks` to `emit` (which
  // returns false to stop). The store must be the one this publisher is attached to.
  void Snapshot(const BlockStore& store, size_t chunk_blocks,
                const std::function<bool(const v1::SnapshotChunk&)>& emit);

  std::string bound_endpoint() const {
    return bound_endpoint_;
  }  // e.g. "tcp://127.0.0.1:40123"; "" without kvtier format
  // The vLLM PUB and replay endpoints as bound; "" when not enabled.
  std::string vllm_bound_endpoint() const { return vllm_bound_endpoint_; }
  std::string vllm_replay_bound_endpoint() const { return vllm_replay_bound_endpoint_; }
  uint64_t instance_id() const { return instance_id_; }
  const std::string& node_id() const { return options_.node_id; }
  uint64_t last_seq() const;
  uint64_t oldest_seq() const;  // the first seq Replay can serve (last_seq() + 1 when the ring is empty)
  const EventPublisherStats& stats() const { return stats_; }
  // Calls `visit` once per sample of every counter of stats() (each field in exactly one sample), then
  // the kvtier_event_last_seq gauge. /metrics and GetStats iterate it (ServerMetrics::ForEachCounter).
  // Thread-safety: any thread (relaxed loads; last_seq() takes mu_ briefly).
  void ForEachCounter(const CounterVisitor& visit) const;

 private:
  enum class Kind : uint8_t { kStored, kRemoved, kMoved, kCleared };
  struct Event {
    uint64_t seq = 0;
    Kind kind = Kind::kCleared;
    EventBlockInfo block;
    Tier from{};
  };

  explicit EventPublisher(const EventPublisherOptions& options);
  void Append(Kind kind, const EventBlockInfo* block, Tier from);
  void Run();
  // Encodes events (consecutive seqs) into a batch with the namespace names and last_seq.
  v1::KvEventBatch Encode(const std::vector<Event>& events, uint64_t last_seq) const;
  void FillBlock(const EventBlockInfo& b, v1::EventBlock* out) const;
  void AddName(uint64_t namespace_id, google::protobuf::Map<uint64_t, v1::EventNamespace>* names) const;
  // Publisher thread: sends `events` as one vLLM-format message and keeps it for replay.
  void PublishVllm(const std::vector<Event>& events);
  // Replay thread: answers requests on the ROUTER socket until Stop.
  void RunVllmReplay();
  void ServeVllmReplay();

  EventPublisherOptions options_;
  uint64_t instance_id_ = 0;
  void* zmq_context_ = nullptr;
  void* pub_socket_ = nullptr;  // used only by the publisher thread after Start
  std::string bound_endpoint_;
  void* vllm_pub_socket_ = nullptr;     // used only by the publisher thread after Start
  void* vllm_replay_socket_ = nullptr;  // used only by the replay thread after Start
  std::string vllm_bound_endpoint_;
  std::string vllm_replay_bound_endpoint_;
  uint64_t vllm_next_seq_ = 0;  // publisher thread only
  EventPublisherStats stats_;

  struct VllmMessage {
    uint64_t seq = 0;
    size_t events = 0;
    std::shared_ptr<const std::string> payload;
  };
  mutable std::mutex vllm_mu_;         // never held with mu_
  std::deque<VllmMessage> vllm_ring_;  // guarded by vllm_mu_
  size_t vllm_ring_events_ = 0;        // guarded by vllm_mu_: sum of vllm_ring_[i].events
  std::atomic<bool> replay_stop_{false};
  std::thread replay_thread_;

  mutable std::mutex mu_;  // taken inside the store's lock (store -> publisher), never the reverse
  std::condition_variable cv_;
  std::deque<Event> ring_;      // guarded by mu_; the latest replay_buffer_events events
  uint64_t last_seq_ = 0;       // guarded by mu_
  uint64_t published_seq_ = 0;  // guarded by mu_; the publisher thread has sent every seq <= this
  bool stopping_ = false;       // guarded by mu_
  std::thread thread_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_EVENTS_EVENT_PUBLISHER_H_
