// The per-node sequence rules of KV event subscribers (docs/events.md), as pure functions so that they
// can be tested without sockets.
#ifndef KVTIER_CLIENT_SRC_CLIENT_EVENT_SEQUENCE_H_
#define KVTIER_CLIENT_SRC_CLIENT_EVENT_SEQUENCE_H_

#include <cstddef>
#include <cstdint>

namespace kvtier::client {

// Where a subscriber stands with one node.
struct EventCursor {
  uint64_t instance_id = 0;  // 0: never heard of
  uint64_t applied_seq = 0;  // events 1..applied_seq of instance_id are applied
  bool synced = false;       // the applied state is consistent (false after a failed catch-up)
};

// What to do with one received batch of `num_events` events with seqs first_seq, first_seq + 1, ...
// (num_events may be 0: a heartbeat) of `instance_id`, the server's latest seq being `last_seq`.
struct BatchPlan {
  bool reset = false;          // another instance: drop the node's state; the cursor becomes (instance, 0)
  uint64_t catch_up_from = 0;  // > 0: events from this seq were missed; catch up before applying
  size_t first_index = 0;      // apply events[first_index..] (the earlier ones are already applied)
};

// The rules:
//  - Another instance (a restart, or the first message of a node): reset. Seq 1 of every instance is
//    AllBlocksCleared, so the empty state "before seq 1" is consistent and events from seq 1 rebuild it.
//  - Events at or below applied_seq are duplicates (a replay overlapped the stream): skipped.
//  - first_seq > applied_seq + 1, or a heartbeat whose last_seq > applied_seq (the publisher sends a
//    heartbeat only after every event up to last_seq), or an unsynced cursor: catch up from
//    applied_seq + 1.
inline BatchPlan PlanBatch(const EventCursor& cursor, uint64_t instance_id, uint64_t first_seq, size_t num_events,
                           uint64_t last_seq) {
  BatchPlan plan;
  uint64_t applied = cursor.applied_seq;
  bool synced = cursor.synced;
  if (cursor.instance_id != instance_id) {
    plan.reset = true;
    applied = 0;
    synced = true;
  }
  if (num_events == 0) {
    if (!synced || last_seq > applied) plan.catch_up_from = applied + 1;
    return plan;
  }
  const uint64_t end_seq = first_seq + num_events;  // one past the last event
  if (!synced || first_seq > applied + 1) {
    plan.catch_up_from = applied + 1;
    return plan;
  }
  plan.first_index = end_seq <= applied + 1 ? num_events : static_cast<size_t>(applied + 1 - first_seq);
  return plan;
}

// After a catch-up brought the cursor to `applied_seq`: the events of the batch still to apply.
inline size_t FirstUnapplied(uint64_t applied_seq, uint64_t first_seq, size_t num_events) {
  if (first_seq > applied_seq + 1) return num_events + 1;  // still a gap: caller must catch up again
  const uint64_t skip = applied_seq + 1 - first_seq;
  return skip >= num_events ? num_events : static_cast<size_t>(skip);
}

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_SRC_CLIENT_EVENT_SEQUENCE_H_
