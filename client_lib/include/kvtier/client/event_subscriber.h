// EventSubscriber: follows the KV events of many cache servers and keeps an index of which node holds
// which blocks, for KV-aware routers (docs/events.md).
#ifndef KVTIER_CLIENT_EVENT_SUBSCRIBER_H_
#define KVTIER_CLIENT_EVENT_SUBSCRIBER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/block_key.h"

namespace kvtier::client {

struct EventSubscriberOptions {
  // gRPC host:port of each server (its listen_address), as for ClientOptions::members. The subscriber
  // asks each for its PUB endpoint (EventService.GetEventsInfo); a wildcard bind host (0.0.0.0, *, ::)
  // is replaced by the member's host.
  std::vector<std::string> members;
  absl::Duration rpc_timeout = absl::Seconds(5);     // GetEventsInfo, Replay and Snapshot deadline
  absl::Duration retry_interval = absl::Seconds(1);  // retry unreachable members and failed catch-ups
  int receive_hwm = 100000;                          // ZMQ_RCVHWM of the SUB socket, in messages
  uint64_t max_message_bytes = 80ULL << 20;          // Default: 80 MiB gRPC messages (snapshots)
  // gRPC security, as ClientOptions' fields of the same names: TLS when tls_ca_file is set, mutual TLS
  // with tls_cert_file and tls_key_file, and a bearer token (an admin token: events describe every
  // tenant's blocks). The ZeroMQ PUB stream itself is plaintext and unauthenticated. Default: none.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  std::string auth_token;
};

// One block in the index.
struct IndexedBlock {
  BlockKey key;
  uint64_t namespace_id = 0;  // Namespace::Id()
  uint64_t tenant_id = 0;     // XXH3-64 of the tenant name
  std::string tier;           // "host", "disk", ...
  uint32_t depth = 0;         // index in its prompt's chain, as the writer reported it
  uint64_t size_bytes = 0;
};

// Where the subscriber stands with one server.
struct NodeEventState {
  std::string node_id;
  std::string address;       // the member's gRPC address
  uint64_t instance_id = 0;  // the server instance followed (0: never reached)
  uint64_t applied_seq = 0;  // every event of that instance up to this seq is in the index
  bool synced = false;       // the index holds a consistent view of the node (false while catching up
                             // failed and is being retried)
  uint64_t blocks = 0;
};

// Counters since Start.
struct EventSubscriberStats {
  uint64_t batches = 0;            // PUB messages handled (heartbeats included)
  uint64_t events_applied = 0;     // from PUB messages and replays
  uint64_t gaps = 0;               // sequence gaps seen on the PUB stream (messages this subscriber missed)
  uint64_t instance_changes = 0;   // a node restarted (new instance): its state was dropped
  uint64_t replays = 0;            // catch-ups served by Replay
  uint64_t snapshots = 0;          // catch-ups served by Snapshot (the replay buffer no longer held the seq)
  uint64_t catch_up_failures = 0;  // catch-ups that failed (the node is retried every retry_interval)
  uint64_t decode_errors = 0;      // messages that did not parse or had an unknown schema_version
};

// Subscribes to every member's PUB socket (one ZeroMQ SUB socket), applies events in sequence order per
// node, and on a gap (a missed message, a late join, a resume after Pause) catches up with Replay from
// the first missing seq, falling back to a Snapshot when the server no longer holds it. A node whose
// instance changes (a restart) has its blocks dropped and is rebuilt from its new stream.
// A background thread does all of this; queries read the index under a mutex.
// Thread-safety: all methods may be called concurrently from any thread.
class EventSubscriber {
 public:
  // Contacts each member (GetEventsInfo), connects to the reachable ones, takes each one's current state
  // (Replay from seq 1 or a Snapshot) and starts following. Unreachable members are retried in the
  // background. Errors: InvalidArgument (no members, bad options), Internal (ZeroMQ failed).
  static absl::StatusOr<std::unique_ptr<EventSubscriber>> Start(const EventSubscriberOptions& options);
  ~EventSubscriber();  // Stop()

  // Stops the background thread and closes the socket. Queries keep answering from the last state.
  // Idempotent.
  void Stop();

  // Stops reading: the SUB socket is closed, so every message published meanwhile is lost to this
  // subscriber (as for a router that stalls or restarts its connection). Queries keep answering from the
  // state before the pause. Resume() reopens the socket; the next message or heartbeat of each node shows
  // the gap, and the subscriber catches up.
  void Pause();
  void Resume();

  // Waits until, for every member reachable now, the index has applied every event that member had
  // numbered when this was called (asked over gRPC). Errors: DeadlineExceeded (not caught up within
  // `timeout`), Unavailable (a member did not answer).
  absl::Status WaitForCatchUp(absl::Duration timeout);

  // Node ids holding `key` (any tier), sorted.
  std::vector<std::string> NodesHolding(const BlockKey& key) const;
  // For each node holding at least fps[0]: how many leading blocks of `fps` (shard `shard`, namespace
  // `namespace_id`) it holds, longest first. `fps` is borrowed for the call.
  std::vector<std::pair<std::string, size_t>> PrefixMatch(uint64_t namespace_id, std::span<const Fingerprint> fps,
                                                          uint32_t shard = 0) const;
  // Every block the index holds for `node_id` (empty when unknown).
  std::vector<IndexedBlock> BlocksOf(const std::string& node_id) const;
  // One entry per member, in the order of options.members.
  std::vector<NodeEventState> Nodes() const;
  EventSubscriberStats stats() const;

  struct Impl;

 private:
  explicit EventSubscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_EVENT_SUBSCRIBER_H_
