// Every field of the client's option structs and every counter of its stats structs, named once, for
// the layers that copy them one by one: the C API (bindings/c) and the Python module (bindings/python)
// expand these lists instead of keeping their own copies (HOUSE_STYLE §10: declared once).
//
// Each list is checked against its struct at compile time, below: a field added to the struct and not to
// its list, or removed or renamed, fails the build of client_lib (and of every binding), and so does a
// list entry whose kind does not match the field's type.
//
// Usage: define a macro X(name, Kind) (X(name) for counter lists) and expand the list with it:
//   #define COPY(name, Kind) out.name = in.name;
//   KVTIER_CLIENT_OPTIONS_FIELDS(COPY)
//   #undef COPY
// Kind is one of the type names in kvtier::client::field_kind (StringList, String, Duration, Uint32,
// Uint64, Int32, ReplicationOverrides), so that a binding can spell each kind its own way (the C API
// names a Duration field `<name>_ms` in milliseconds and a list field `<name>` plus `num_<name>`).
// ForEachField(options, f) calls f(name, field) for every field in list order, for code that dispatches
// on the field's C++ type instead.
#ifndef KVTIER_CLIENT_FIELD_LISTS_H_
#define KVTIER_CLIENT_FIELD_LISTS_H_

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/client/event_subscriber.h"
#include "kvtier/common/aggregate_fields.h"

namespace kvtier::client::field_kind {
using StringList = std::vector<std::string>;
using String = std::string;
using Duration = absl::Duration;
using Uint32 = uint32_t;
using Uint64 = uint64_t;
using Int32 = int;
using ReplicationOverrides = std::vector<ClientOptions::ReplicationOverride>;
}  // namespace kvtier::client::field_kind

// ClientOptions (client.h), in declaration order.
#define KVTIER_CLIENT_OPTIONS_FIELDS(X)          \
  X(members, StringList)                         \
  X(members_dns, String)                         \
  X(dns_server, String)                          \
  X(dns_refresh_interval, Duration)              \
  X(dns_timeout, Duration)                       \
  X(health_check_interval, Duration)             \
  X(health_check_timeout, Duration)              \
  X(unhealthy_threshold, Uint32)                 \
  X(healthy_threshold, Uint32)                   \
  X(virtual_nodes, Uint32)                       \
  X(rpc_timeout, Duration)                       \
  X(connect_timeout, Duration)                   \
  X(max_message_bytes, Uint64)                   \
  X(stream_chunk_bytes, Uint64)                  \
  X(max_blocks_per_request, Uint32)              \
  X(put_batch_blocks, Uint32)                    \
  X(max_block_bytes, Uint64)                     \
  X(transport, String)                           \
  X(ucx_transports, String)                      \
  X(ucx_reconnect_backoff, Duration)             \
  X(ucx_get_lanes, Int32)                        \
  X(tls_ca_file, String)                         \
  X(tls_cert_file, String)                       \
  X(tls_key_file, String)                        \
  X(tls_server_name, String)                     \
  X(auth_token, String)                          \
  X(replication_factor, Uint32)                  \
  X(replication_overrides, ReplicationOverrides) \
  X(hot_read_replicas, Uint32)                   \
  X(hot_depth, Uint32)                           \
  X(replica_queue_bytes, Uint64)                 \
  X(hint_queue_bytes, Uint64)                    \
  X(hint_retry_interval, Duration)

// ClientOptions::ReplicationOverride.
#define KVTIER_REPLICATION_OVERRIDE_FIELDS(X) \
  X(tenant, String)                           \
  X(model, String)                            \
  X(replication_factor, Uint32)

// EventSubscriberOptions (event_subscriber.h).
#define KVTIER_EVENT_SUBSCRIBER_OPTIONS_FIELDS(X) \
  X(members, StringList)                          \
  X(rpc_timeout, Duration)                        \
  X(retry_interval, Duration)                     \
  X(receive_hwm, Int32)                           \
  X(max_message_bytes, Uint64)                    \
  X(tls_ca_file, String)                          \
  X(tls_cert_file, String)                        \
  X(tls_key_file, String)                         \
  X(tls_server_name, String)                      \
  X(auth_token, String)

// ClientStats (client.h): every counter, a std::atomic<uint64_t>, with its help text (all are
// monotonic: CounterKind::kCounter). X(name, help).
#define KVTIER_CLIENT_STATS_COUNTERS(X)                                                                             \
  X(lookups, "LookupPrefix calls.")                                                                                 \
  X(lookup_blocks, "Blocks asked of LookupPrefix.")                                                                 \
  X(prefix_hit_blocks, "Blocks in the leading runs LookupPrefix returned.")                                         \
  X(prefix_hit_tokens, "Tokens of those blocks.")                                                                   \
  X(get_blocks, "Blocks asked of Get.")                                                                             \
  X(retrieve_hit_blocks, "Blocks Get received intact.")                                                             \
  X(retrieve_hit_tokens, "Tokens of those blocks.")                                                                 \
  X(retrieve_hit_bytes, "Bytes of those blocks.")                                                                   \
  X(put_blocks, "Blocks asked of Put.")                                                                             \
  X(put_stored_blocks, "Blocks Put stored (or found stored).")                                                      \
  X(put_stored_bytes, "Bytes of those blocks.")                                                                     \
  X(put_rejected_blocks, "Blocks a server refused for want of space.")                                              \
  X(misses_from_errors, "Blocks turned into misses because an owner failed.")                                       \
  X(rpc_errors, "RPCs that failed (each may cover many blocks).")                                                   \
  X(checksum_failures, "Blocks whose bytes failed verification.")                                                   \
  X(ucx_get_blocks, "Blocks that arrived intact over UCX.")                                                         \
  X(ucx_lane_get_blocks, "Of those, blocks the get lanes received (ucx_get_lanes).")                                \
  X(ucx_leases, "Read leases taken over UCX.")                                                                      \
  X(ucx_put_blocks, "Blocks whose bytes a server took over UCX.")                                                   \
  X(ucx_endpoint_failures, "UCX endpoints dropped after an error or a missed deadline.")                            \
  X(ucx_connects, "UCX endpoints established (the first and reconnects).")                                          \
  X(ring_changes, "Rings swapped in after Connect (members joined or left).")                                       \
  X(dns_resolutions, "members_dns resolutions that answered (records or none).")                                    \
  X(dns_failures, "members_dns resolutions that failed (the members were kept).")                                   \
  X(health_check_failures, "Failed health checks, all members.")                                                    \
  X(members_ejected, "Member ejections (a member ejected twice counts twice).")                                     \
  X(replica_puts, "Replica blocks an owner stored (or already had).")                                               \
  X(replica_put_failures, "Replica blocks an attempt did not store (queue full, owner down or failing, no space).") \
  X(hints_queued, "Replica blocks put in the hinted-handoff queue.")                                                \
  X(hints_delivered, "Hinted blocks an owner later stored (or had).")                                               \
  X(hints_dropped, "Hinted blocks dropped (oldest first) over hint_queue_bytes.")                                   \
  X(replica_read_blocks, "Blocks of Get and LookupPrefix found on an owner other than the first one asked.")        \
  X(ucx_allocates, "Put reservations taken over UCX.")                                                              \
  X(ucx_commits, "Put commits over UCX.")                                                                           \
  X(nccl_get_blocks, "Blocks that arrived over NCCL into the caller's device buffers.")

// EventSubscriberStats (event_subscriber.h): every counter, a uint64_t.
#define KVTIER_EVENT_SUBSCRIBER_STATS_COUNTERS(X) \
  X(batches)                                      \
  X(events_applied)                               \
  X(gaps)                                         \
  X(instance_changes)                             \
  X(replays)                                      \
  X(snapshots)                                    \
  X(catch_up_failures)                            \
  X(decode_errors)

namespace kvtier::client {

#define KVTIER_FIELD_LISTS_ONE_(name, Kind) +1
#define KVTIER_FIELD_LISTS_ONE_COUNTER_(name, ...) +1
inline constexpr size_t kClientOptionsFieldCount = 0 KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_FIELD_LISTS_ONE_);
inline constexpr size_t kReplicationOverrideFieldCount = 0 KVTIER_REPLICATION_OVERRIDE_FIELDS(KVTIER_FIELD_LISTS_ONE_);
inline constexpr size_t kEventSubscriberOptionsFieldCount =
    0 KVTIER_EVENT_SUBSCRIBER_OPTIONS_FIELDS(KVTIER_FIELD_LISTS_ONE_);
inline constexpr size_t kClientStatsCounterCount = 0 KVTIER_CLIENT_STATS_COUNTERS(KVTIER_FIELD_LISTS_ONE_COUNTER_);
inline constexpr size_t kEventSubscriberStatsCounterCount =
    0 KVTIER_EVENT_SUBSCRIBER_STATS_COUNTERS(KVTIER_FIELD_LISTS_ONE_COUNTER_);
#undef KVTIER_FIELD_LISTS_ONE_
#undef KVTIER_FIELD_LISTS_ONE_COUNTER_

// A list that misses a field of its struct fails here: add the field to the list above (and to the C
// struct of bindings/c/include/kvtier/kvtier.h, whose conversion then fails to compile until it has it).
static_assert(AggregateFieldCount<ClientOptions>() == kClientOptionsFieldCount,
              "ClientOptions has a field that KVTIER_CLIENT_OPTIONS_FIELDS does not name");
static_assert(AggregateFieldCount<ClientOptions::ReplicationOverride>() == kReplicationOverrideFieldCount,
              "ClientOptions::ReplicationOverride has a field that KVTIER_REPLICATION_OVERRIDE_FIELDS does not name");
static_assert(AggregateFieldCount<EventSubscriberOptions>() == kEventSubscriberOptionsFieldCount,
              "EventSubscriberOptions has a field that KVTIER_EVENT_SUBSCRIBER_OPTIONS_FIELDS does not name");
static_assert(AggregateFieldCount<ClientStats>() == kClientStatsCounterCount,
              "ClientStats has a counter that KVTIER_CLIENT_STATS_COUNTERS does not name");
static_assert(AggregateFieldCount<EventSubscriberStats>() == kEventSubscriberStatsCounterCount,
              "EventSubscriberStats has a counter that KVTIER_EVENT_SUBSCRIBER_STATS_COUNTERS does not name");

// Each entry names a real field of the kind it claims (a renamed field, or a wrong kind, fails here).
#define KVTIER_FIELD_LISTS_CHECK_(Struct, name, Kind)                     \
  static_assert(std::is_same_v<decltype(Struct::name), field_kind::Kind>, \
                #Struct "::" #name " is not a field of kind " #Kind);
#define KVTIER_FIELD_LISTS_CHECK_CLIENT_(name, Kind) KVTIER_FIELD_LISTS_CHECK_(ClientOptions, name, Kind)
#define KVTIER_FIELD_LISTS_CHECK_OVERRIDE_(name, Kind) \
  KVTIER_FIELD_LISTS_CHECK_(ClientOptions::ReplicationOverride, name, Kind)
#define KVTIER_FIELD_LISTS_CHECK_EVENTS_(name, Kind) KVTIER_FIELD_LISTS_CHECK_(EventSubscriberOptions, name, Kind)
#define KVTIER_FIELD_LISTS_CHECK_STAT_(name, help) \
  static_assert(std::is_same_v<decltype(ClientStats::name), std::atomic<uint64_t>>);
#define KVTIER_FIELD_LISTS_CHECK_EVENT_STAT_(name) \
  static_assert(std::is_same_v<decltype(EventSubscriberStats::name), uint64_t>);
KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_FIELD_LISTS_CHECK_CLIENT_)
KVTIER_REPLICATION_OVERRIDE_FIELDS(KVTIER_FIELD_LISTS_CHECK_OVERRIDE_)
KVTIER_EVENT_SUBSCRIBER_OPTIONS_FIELDS(KVTIER_FIELD_LISTS_CHECK_EVENTS_)
KVTIER_CLIENT_STATS_COUNTERS(KVTIER_FIELD_LISTS_CHECK_STAT_)
KVTIER_EVENT_SUBSCRIBER_STATS_COUNTERS(KVTIER_FIELD_LISTS_CHECK_EVENT_STAT_)
#undef KVTIER_FIELD_LISTS_CHECK_
#undef KVTIER_FIELD_LISTS_CHECK_CLIENT_
#undef KVTIER_FIELD_LISTS_CHECK_OVERRIDE_
#undef KVTIER_FIELD_LISTS_CHECK_EVENTS_
#undef KVTIER_FIELD_LISTS_CHECK_STAT_
#undef KVTIER_FIELD_LISTS_CHECK_EVENT_STAT_

// Calls f(const char* name, Field& field) for every field of `o` (ClientOptions, const or not), in list
// order.
template <typename Options, typename F>
requires std::is_same_v<std::remove_const_t<Options>, ClientOptions>
void ForEachField(Options& o, F&& f) {
#define KVTIER_FIELD_LISTS_VISIT_(name, Kind) f(#name, o.name);
  KVTIER_CLIENT_OPTIONS_FIELDS(KVTIER_FIELD_LISTS_VISIT_)
#undef KVTIER_FIELD_LISTS_VISIT_
}

// The same for ClientOptions::ReplicationOverride.
template <typename Override, typename F>
requires std::is_same_v<std::remove_const_t<Override>, ClientOptions::ReplicationOverride>
void ForEachField(Override& o, F&& f) {
#define KVTIER_FIELD_LISTS_VISIT_(name, Kind) f(#name, o.name);
  KVTIER_REPLICATION_OVERRIDE_FIELDS(KVTIER_FIELD_LISTS_VISIT_)
#undef KVTIER_FIELD_LISTS_VISIT_
}

// The same for EventSubscriberOptions.
template <typename Options, typename F>
requires std::is_same_v<std::remove_const_t<Options>, EventSubscriberOptions>
void ForEachField(Options& o, F&& f) {
#define KVTIER_FIELD_LISTS_VISIT_(name, Kind) f(#name, o.name);
  KVTIER_EVENT_SUBSCRIBER_OPTIONS_FIELDS(KVTIER_FIELD_LISTS_VISIT_)
#undef KVTIER_FIELD_LISTS_VISIT_
}

// Calls f(const char* name, uint64_t value) for every counter of `s`, in list order (relaxed loads).
template <typename F>
void ForEachCounter(const ClientStats& s, F&& f) {
#define KVTIER_FIELD_LISTS_VISIT_(name, help) f(#name, s.name.load(std::memory_order_relaxed));
  KVTIER_CLIENT_STATS_COUNTERS(KVTIER_FIELD_LISTS_VISIT_)
#undef KVTIER_FIELD_LISTS_VISIT_
}

template <typename F>
void ForEachCounter(const EventSubscriberStats& s, F&& f) {
#define KVTIER_FIELD_LISTS_VISIT_(name) f(#name, s.name);
  KVTIER_EVENT_SUBSCRIBER_STATS_COUNTERS(KVTIER_FIELD_LISTS_VISIT_)
#undef KVTIER_FIELD_LISTS_VISIT_
}

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_FIELD_LISTS_H_
