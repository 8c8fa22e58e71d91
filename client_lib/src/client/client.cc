#include "kvtier/client/client.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <latch>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "client/data_path.h"
#include "client/hot_blocks.h"
#include "client/membership.h"
#include "client/nccl_endpoints.h"
#include "client/put_pipeline.h"
#include "client/read_plan.h"
#include "client/refusal.h"
#include "client/replication.h"
#include "client/server_stats.h"
#include "client/transport_mode.h"
#include "client/ucx_endpoints.h"
#include "kvtier/client/dns_resolver.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/similarity.h"
#include "kvtier/common/status_macros.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/channel_security.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

// The client's state and the work that spans its parts: membership (membership.h), each member's
// data path (data_path.h over ucx_endpoints.h), read planning (read_plan.h), hot blocks (hot_blocks.h)
// and replication (replication.h). docs/architecture.md "A Get, step by step" walks a Get through them.
class Client::Impl {
 public:
  ClientOptions options;
  TransportMode transport_mode = TransportMode::kAuto;  // options.transport, parsed at Connect
  ClientStats stats;
  // Made by Connect, in this order; ~Impl takes them down in the reverse one.
  std::unique_ptr<UcxEndpoints> ucx;
  std::unique_ptr<NcclEndpoints> nccl;  // workers for device buffers (GetIntoDevice)
  std::unique_ptr<Membership> membership;
  std::unique_ptr<DataPath> data_path;

  // Replication (docs/architecture.md "Replication"); created by Connect, uses the members and ring.
  std::unique_ptr<Replicator> replicator;
  std::atomic<uint64_t> read_calls{0};  // spreads hot-block reads over their owners (round robin)
  HotBlocks hot_blocks;                 // shallow blocks read (Get hits) and given read replicas (PromoteHot)

  ~Impl() {
    replicator.reset();  // its thread puts through the members and the ring: stop it first
    // Members close their UCX endpoints as they go, so they go before the UCX client.
    if (membership != nullptr) {
      membership->Stop();
      membership->Clear();
    }
    data_path.reset();
    membership.reset();
    nccl.reset();
    ucx.reset();
  }

  std::shared_ptr<const RingView> View() const { return membership->View(); }

  // Runs fn(g) for each group, in parallel threads beyond the first, and waits for all.
  template <typename Fn>
  static void ForEachParallel(size_t n, Fn fn) {
    std::vector<std::future<void>> rest;
    for (size_t g = 1; g < n; ++g) rest.push_back(std::async(std::launch::async, [&fn, g] { fn(g); }));
    if (n > 0) fn(0);
    for (auto& f : rest) f.get();
  }

  // One owner's put batches in flight at once within a Put call (put_pipeline.h).
  static constexpr size_t kPutPipelineDepth = 2;

  // ---- Replication (docs/architecture.md "Replication"): owners per block, read fail-over, replica puts.

  // The read plan of `fps` (read_plan.h) with this client's hot blocks and round robin.
  ReadPlan PlanReads(const RingView& view, const Namespace& ns, std::span<const Fingerprint> fps,
                     uint64_t first_depth) {
    std::vector<bool> hot;
    if (options.hot_read_replicas > 0) {
      size_t shallow = 0;
      while (shallow < fps.size() && ShallowEnough(options, first_depth + shallow)) ++shallow;
      hot = hot_blocks.Contains(fps, shallow);
    }
    const uint64_t spread = options.hot_read_replicas > 0 ? read_calls.fetch_add(1, std::memory_order_relaxed) : 0;
    return client::PlanReads(view.ring, fps, ReplicationFactor(options, ns), options.hot_read_replicas, hot, spread);
  }

  // After a Get: each block at depth < hot_depth that was a hit and is not hot yet becomes hot, and a copy
  // of it (from the caller's buffer) is queued for its hot_read_replicas extra owners. Hits mark blocks
  // hot because reuse is what makes a block hot: a shallow block of a prompt seen once is not.
  void PromoteHot(const RingView& view, const Namespace& ns, std::span<const Fingerprint> fps, uint32_t shard,
                  std::span<const std::span<std::byte>> buffers, uint64_t first_depth,
                  std::span<const GetResult> results) {
    if (replicator == nullptr || options.hot_read_replicas == 0) return;
    const uint32_t r = ReplicationFactor(options, ns);
    absl::flat_hash_map<uint32_t, ReplicaTask> tasks;  // by ring index
    for (size_t i = 0; i < fps.size() && ShallowEnough(options, first_depth + i); ++i) {
      if (results[i] != GetResult::kHit || !hot_blocks.Mark(fps[i])) continue;
      const std::vector<uint32_t> owners = view.ring.Owners(fps[i], r + options.hot_read_replicas);
      if (owners.size() <= r) continue;
      auto bytes = std::make_shared<const std::vector<std::byte>>(buffers[i].begin(), buffers[i].end());
      for (size_t o = r; o < owners.size(); ++o) {
        auto [it, inserted] = tasks.try_emplace(owners[o]);
        if (inserted) {
          it->second.node_id = view.ring.node_ids()[owners[o]];
          it->second.ns = ns;
          it->second.shard = shard;
        }
        it->second.blocks.push_back(
            {.fingerprint = fps[i], .depth = static_cast<uint32_t>(first_depth + i), .bytes = bytes});
      }
    }
    for (auto& [m, task] : tasks) (void)replicator->Enqueue(std::move(task));
  }

  // The member in the ring now under `node_id`; null when there is none.
  static std::shared_ptr<Member> RingMember(const RingView& view, const std::string& node_id) {
    for (size_t r = 0; r < view.owners.size(); ++r) {
      if (view.ring.node_ids()[r] == node_id) return view.owners[r];
    }
    return nullptr;
  }

  // The Replicator's put: `task` to its owner on the ring now, in put_batch_blocks batches.
  // Errors: Unavailable (the owner is not in the ring), or the owner's refusal (IsRefusal).
  absl::StatusOr<std::vector<PutResult>> PutReplica(const ReplicaTask& task) {
    const std::shared_ptr<const RingView> view = View();
    const std::shared_ptr<Member> member = RingMember(*view, task.node_id);
    if (member == nullptr) return absl::UnavailableError(absl::StrCat("member ", task.node_id, " is not in the ring"));
    v1::Namespace pns;
    wire::ToProto(task.ns, &pns);
    const uint64_t block_bytes = task.ns.layout.ShardBytes();
    std::vector<PutResult> results(task.blocks.size(), PutResult::kError);
    const size_t batch = std::min(options.max_blocks_per_request, options.put_batch_blocks);
    CallRefusal refusal;
    PutPipeline pipeline(kPutPipelineDepth);
    pipeline.Run(0, (task.blocks.size() + batch - 1) / batch, [&](size_t b) {
      const size_t off = b * batch;
      const size_t end = std::min(task.blocks.size(), off + batch);
      static const BlockMeta kNoMeta;
      const bool any_meta = std::any_of(task.blocks.begin() + off, task.blocks.begin() + end,
                                        [](const ReplicaBlock& b) { return b.meta != nullptr; });
      std::vector<PutResult> batch_results(end - off, PutResult::kError);
      absl::Status s = pipeline.PutBatch(
          end - off,
          [&](std::span<const uint32_t> positions, std::vector<PutResult>& out) {
            std::vector<BlockKey> keys;
            std::vector<uint32_t> depths;
            std::vector<std::span<const std::byte>> data;
            std::vector<const BlockMeta*> meta;  // empty, or one per key: the primary's metadata goes along
            for (uint32_t p : positions) {
              const ReplicaBlock& rb = task.blocks[off + p];
              keys.push_back({rb.fingerprint, task.shard});
              depths.push_back(rb.depth);
              data.push_back(*rb.bytes);
              if (any_meta) meta.push_back(rb.meta != nullptr ? rb.meta.get() : &kNoMeta);
            }
            out.assign(positions.size(), PutResult::kError);
            return data_path->PutBatch(*member, pns, keys, depths, data, block_bytes, out, meta);
          },
          batch_results);
      if (!s.ok()) {
        refusal.Record(std::move(s));
        return true;
      }
      std::copy(batch_results.begin(), batch_results.end(), results.begin() + static_cast<ptrdiff_t>(off));
      // An owner that failed a batch is down: leave the rest kError (hinted) rather than wait again.
      return std::all_of(batch_results.begin(), batch_results.end(),
                         [](PutResult r) { return r == PutResult::kError; });
    });
    if (refusal.refused()) return refusal.status();
    return results;
  }

  bool InRing(const std::string& node_id) const { return RingMember(*View(), node_id) != nullptr; }

  // After Put's primary round: queues a copy of every block the primary stored, refused or could not
  // take (results[i] kStored, kNoSpace or kError) for each of its other owners on `view`, and hints the
  // blocks the primary could not take (kError) for the primary itself.
  // `meta` is empty or one per block (as Put filled it); each copy carries its block's.
  void EnqueueReplicas(const RingView& view, const Namespace& ns, std::span<const Fingerprint> fps, uint32_t shard,
                       std::span<const std::span<const std::byte>> blocks, uint32_t first_block_index,
                       std::span<const BlockMeta> meta, std::span<const PutResult> results) {
    if (replicator == nullptr || view.owners.size() < 2) return;
    const uint32_t r = ReplicationFactor(options, ns);
    if (r < 2) return;
    absl::flat_hash_map<uint32_t, ReplicaTask> tasks;          // by ring index
    std::vector<uint32_t> order;                               // ring indices in the order first seen
    absl::flat_hash_map<uint32_t, ReplicaTask> primary_hints;  // by ring index: primaries that failed
    for (size_t i = 0; i < fps.size(); ++i) {
      if (results[i] == PutResult::kAlreadyPresent || results[i] == PutResult::kInProgress) continue;
      const uint64_t depth = uint64_t{first_block_index} + i;
      const std::vector<uint32_t> owners = view.ring.Owners(fps[i], r);
      if (owners.size() < 2) continue;
      auto bytes = std::make_shared<const std::vector<std::byte>>(blocks[i].begin(), blocks[i].end());
      std::shared_ptr<const BlockMeta> block_meta;
      if (!meta.empty() && !meta[i].empty()) block_meta = std::make_shared<const BlockMeta>(meta[i]);
      if (results[i] == PutResult::kError) {  // the primary is down: it gets the block when it returns
        auto [it, inserted] = primary_hints.try_emplace(owners[0]);
        if (inserted) {
          it->second.node_id = view.ring.node_ids()[owners[0]];
          it->second.ns = ns;
          it->second.shard = shard;
        }
        it->second.blocks.push_back(
            {.fingerprint = fps[i], .depth = static_cast<uint32_t>(depth), .bytes = bytes, .meta = block_meta});
      }
      for (size_t o = 1; o < owners.size(); ++o) {
        auto [it, inserted] = tasks.try_emplace(owners[o]);
        if (inserted) {
          it->second.node_id = view.ring.node_ids()[owners[o]];
          it->second.ns = ns;
          it->second.shard = shard;
          order.push_back(owners[o]);
        }
        it->second.blocks.push_back(
            {.fingerprint = fps[i], .depth = static_cast<uint32_t>(depth), .bytes = bytes, .meta = block_meta});
      }
    }
    for (uint32_t m : order) (void)replicator->Enqueue(std::move(tasks[m]));
    for (auto& [m, task] : primary_hints) replicator->HintNow(std::move(task));
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  KVTIER_ASSIGN_OR_RETURN(impl->transport_mode, ParseTransport(options.transport));
  grpc::ChannelArguments channel_args = wire::ChannelArgs(options.max_message_bytes);
  channel_args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  wire::ChannelSecurity security = wire::ChannelSecurity{.ca_file = options.tls_ca_file,
                                                         .cert_file = options.tls_cert_file,
                                                         .key_file = options.tls_key_file,
                                                         .server_name = options.tls_server_name,
                                                         .auth_token = options.auth_token};
  auto credentials = wire::MakeChannelCredentials(security, "tls_");
  if (!credentials.ok()) return credentials.status();
  impl->ucx = std::make_unique<UcxEndpoints>(impl->options, impl->transport_mode, security, impl->stats);
  impl->nccl = std::make_unique<NcclEndpoints>(impl->options, impl->transport_mode);
  impl->membership = std::make_unique<Membership>(impl->options, impl->stats, std::move(channel_args), security,
                                                  *std::move(credentials));
  const BlockPathFactoryMaker test_paths = BlockPathFactoryForTest();
  impl->data_path = std::make_unique<DataPath>(
      impl->options, impl->transport_mode, impl->stats,
      test_paths ? test_paths() : MakeBlockPathFactory(impl->options, impl->stats, *impl->ucx, *impl->nccl));
  Membership& membership = *impl->membership;
  std::vector<std::shared_ptr<Member>> members;
  absl::flat_hash_set<std::string> addresses;
  for (const std::string& spec : options.members) {
    const size_t eq = spec.find('=');
    const std::string address = eq == std::string::npos ? spec : spec.substr(eq + 1);
    addresses.insert(address);
    members.push_back(
        membership.NewMember(address, eq == std::string::npos ? "" : spec.substr(0, eq), /*from_dns=*/false));
  }
  absl::Status dns_status;
  if (!options.members_dns.empty()) {
    auto resolved = ResolveMembers(options.members_dns, options.dns_server, options.dns_timeout);
    if (resolved.ok()) {
      impl->stats.dns_resolutions.fetch_add(1, std::memory_order_relaxed);
      for (const std::string& a : *resolved) {
        if (addresses.insert(a).second) members.push_back(membership.NewMember(a, "", /*from_dns=*/true));
      }
    } else if (resolved.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrCat("members_dns: ", resolved.status().message()));
    } else {
      (resolved.status().code() == absl::StatusCode::kNotFound ? impl->stats.dns_resolutions : impl->stats.dns_failures)
          .fetch_add(1, std::memory_order_relaxed);
      dns_status = resolved.status();
    }
  }
  // Ask the members without a configured id for theirs, all at once, riding out members still starting.
  std::vector<Member*> ask;
  for (const auto& m : members) {
    if (m->node_id.empty()) ask.push_back(m.get());
  }
  membership.AskNodeIds(ask, options.connect_timeout, /*wait_for_ready=*/true);
  // Two static members may not report one id (a configuration error); a DNS member reporting an id
  // already taken (the same server under an IPv4 and an IPv6 record) stays out of the ring.
  absl::flat_hash_set<std::string> static_ids;
  for (const auto& m : members) {
    if (m->from_dns || m->node_id.empty()) continue;
    if (!static_ids.insert(m->node_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("members: node id \"", m->node_id, "\" is reported by two members"));
    }
  }
  membership.SetMembers(std::move(members));
  if (!membership.RebuildRing(/*force=*/true)) {
    return absl::UnavailableError(
        dns_status.ok() ? std::string("no member answered with its node id")
                        : absl::StrCat("no member answered with its node id; members_dns: ", dns_status.message()));
  }
  // Set up UCX endpoints now, in parallel, so that the first transfers need not; a member that fails
  // here is retried by the first call that needs it.
  if (impl->transport_mode != TransportMode::kGrpc) {
    Impl& im = *impl;
    const std::shared_ptr<const RingView> view = im.View();
    Impl::ForEachParallel(view->owners.size(), [&](size_t r) {
      im.data_path->WarmUp(*view->owners[r], absl::Now() + im.options.rpc_timeout);
    });
  }
  const bool replicates =
      options.replication_factor > 1 || !options.replication_overrides.empty() || options.hot_read_replicas > 0;
  if (replicates)
    impl->replicator = std::make_unique<Replicator>(
        Replicator::Options{.queue_bytes = options.replica_queue_bytes,
                            .hint_bytes = options.hint_queue_bytes,
                            .hint_retry_interval = options.hint_retry_interval},
        Replicator::Hooks{.put = [p = impl.get()](const ReplicaTask& t) { return p->PutReplica(t); },
                          .in_ring = [p = impl.get()](const std::string& id) { return p->InRing(id); }},
        impl->stats);
  membership.Start();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const ClientStats& Client::stats() const { return impl_->stats; }

absl::Status Client::FlushReplicas(absl::Duration timeout) {
  return impl_->replicator == nullptr ? absl::OkStatus() : impl_->replicator->Flush(timeout);
}

std::vector<MemberStats> Client::ServerStats(absl::Duration timeout) const {
  return AskServerStats(impl_->membership->Members(), timeout);
}

HashRing Client::ring() const { return impl_->View()->ring; }

uint64_t Client::ring_version() const { return impl_->membership->ring_version(); }

std::vector<MemberInfo> Client::members() const {
  const std::shared_ptr<const RingView> view = impl_->View();
  absl::flat_hash_set<const Member*> in_ring;
  for (const auto& m : view->owners) in_ring.insert(m.get());
  std::vector<MemberInfo> out;
  for (const auto& m : impl_->membership->Members()) {
    MemberInfo info;
    info.address = m->address;
    info.from_dns = m->from_dns;
    info.in_ring = in_ring.contains(m.get());
    {
      std::lock_guard<std::mutex> lock(m->mu);
      info.node_id = m->node_id;
      info.health = m->health;
      info.consecutive_failures = m->failures;
      info.last_health_error = m->last_error;
    }
    {
      std::lock_guard<std::mutex> lock(m->ucx->mu);
      if (m->ucx->state == UcxPeer::State::kReady) {
        info.transport = "ucx";
      } else {
        info.transport = impl_->transport_mode == TransportMode::kUcx ? "none" : "grpc";
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

absl::StatusOr<LookupResult> Client::LookupPrefix(const Namespace& ns, std::span<const Fingerprint> fps) {
  const absl::Time call_deadline = CallDeadline(absl::Now(), impl_->options.rpc_timeout);
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  // As Get and Put: a layout no server takes is the caller's error, not a server's failure.
  if (const uint64_t block_bytes = ns.layout.ShardBytes(); block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  Impl& im = *impl_;
  const uint32_t tp = ns.layout.tp_size;
  LookupResult result;
  result.present.assign(fps.size(), false);
  im.stats.lookups.fetch_add(1, std::memory_order_relaxed);
  im.stats.lookup_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return result;

  const std::shared_ptr<const RingView> view = im.View();  // this call's ring, whatever changes meanwhile
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
  const uint64_t group_key = PromptGroupKey(fps);  // per-group statistics on the servers (similarity.h)
  // Each block's owners in the order to ask them; a block its owner cannot answer goes to the next one
  // (another attempt), all within one rpc_timeout.
  const ReadPlan plan = im.PlanReads(*view, ns, fps, /*first_depth=*/0);
  // With tp shards, each key is asked tp times; split so one request stays within the limit.
  const size_t per = std::max<size_t>(1, im.options.max_blocks_per_request / tp);
  std::vector<uint8_t> answered(fps.size(), 0);
  std::vector<uint32_t> pending(fps.size());
  for (uint32_t i = 0; i < pending.size(); ++i) pending[i] = i;
  absl::Status refused;  // the first owner's refusal of the request (IsRefusal): the call's error
  for (size_t attempt = 0; !pending.empty() && refused.ok(); ++attempt) {
    const OwnerGroups groups = GroupByAttempt(plan, pending, attempt, per);
    const size_t n = groups.size();
    std::vector<v1::LookupRequest> reqs(n);
    std::vector<v1::LookupResponse> resps(n);
    std::vector<grpc::Status> statuses(n);
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs(n);
    std::latch done(static_cast<std::ptrdiff_t>(n));
    for (size_t g = 0; g < n; ++g) {
      *reqs[g].mutable_namespace_() = pns;
      std::vector<BlockKey> keys;
      keys.reserve(groups[g].second.size() * tp);
      for (uint32_t i : groups[g].second) {
        for (uint32_t s = 0; s < tp; ++s) keys.push_back({fps[i], s});
      }
      wire::EncodeKeys(keys, reqs[g].mutable_keys());
      reqs[g].set_group_key(group_key);
      ctxs[g] = std::make_unique<grpc::ClientContext>();
      ctxs[g]->set_deadline(
          absl::ToChronoTime(AttemptDeadline(call_deadline, plan.OwnersLeft(groups[g].second, attempt), absl::Now())));
      view->owners[groups[g].first]->cache->async()->Lookup(ctxs[g].get(), &reqs[g], &resps[g], [&, g](grpc::Status s) {
        statuses[g] = std::move(s);
        done.count_down();
      });
    }
    done.wait();
    for (size_t g = 0; g < n; ++g) {
      const auto& idx = groups[g].second;
      if (!statuses[g].ok() || static_cast<size_t>(resps[g].present_size()) != idx.size() * tp) {
        im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        if (const absl::Status st = wire::FromGrpc(statuses[g]); IsRefusal(st.code()) && refused.ok()) {
          refused = view->owners[groups[g].first]->Refused("Lookup", st);
        }
        continue;  // these blocks stay unanswered: the next owner is asked, if any
      }
      for (size_t k = 0; k < idx.size(); ++k) {
        bool all_shards = true;
        for (uint32_t s = 0; s < tp; ++s) all_shards &= resps[g].present(static_cast<int>(k * tp + s));
        result.present[idx[k]] = all_shards;
        answered[idx[k]] = 1;
      }
    }
    uint64_t found_on_replica = 0;
    std::erase_if(pending, [&](uint32_t i) {
      found_on_replica += attempt > 0 && result.present[i];
      const bool retry = RetryLookup(answered[i] != 0, result.present[i], plan.retry_miss[i], attempt);
      return !retry || attempt + 1 >= plan.owners[i].size();
    });
    im.stats.replica_read_blocks.fetch_add(found_on_replica, std::memory_order_relaxed);
  }
  if (!refused.ok()) return refused;
  for (uint8_t a : answered) result.blocks_from_errors += a == 0;
  while (result.prefix_blocks < fps.size() && result.present[result.prefix_blocks]) ++result.prefix_blocks;
  im.stats.misses_from_errors.fetch_add(result.blocks_from_errors, std::memory_order_relaxed);
  im.stats.prefix_hit_blocks.fetch_add(result.prefix_blocks, std::memory_order_relaxed);
  im.stats.prefix_hit_tokens.fetch_add(uint64_t{result.prefix_blocks} * ns.layout.block_tokens,
                                       std::memory_order_relaxed);
  return result;
}

absl::StatusOr<std::vector<GetResult>> Client::Get(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<std::byte>> buffers,
                                                   uint32_t first_block_index) {
  const absl::Time call_deadline = CallDeadline(absl::Now(), impl_->options.rpc_timeout);
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  if (shard >= ns.layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " >= tp_size ", ns.layout.tp_size));
  }
  if (buffers.size() != fps.size()) {
    return absl::InvalidArgumentError(absl::StrCat(buffers.size(), " buffers for ", fps.size(), " blocks"));
  }
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size() != block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffers[", i, "] is ", buffers[i].size(), " bytes, a block is ", block_bytes));
    }
  }
  Impl& im = *impl_;
  std::vector<GetResult> results(fps.size(), GetResult::kMissFromError);
  im.stats.get_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return results;
  const std::shared_ptr<const RingView> view = im.View();  // this call's ring, whatever changes meanwhile
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
  // Each block's owners in the order to ask them; a block its owner cannot serve goes to the next one
  // (another attempt), all within one rpc_timeout.
  const ReadPlan plan = im.PlanReads(*view, ns, fps, first_block_index);
  std::vector<uint32_t> pending(fps.size());
  for (uint32_t i = 0; i < pending.size(); ++i) pending[i] = i;
  uint64_t corrupt = 0;  // every copy that failed its checksum, whichever attempt
  CallRefusal refusal;   // the first owner's refusal of the request (IsRefusal): the call's error
  for (size_t attempt = 0; !pending.empty() && !refusal.refused(); ++attempt) {
    const OwnerGroups groups = GroupByAttempt(plan, pending, attempt, im.options.max_blocks_per_request);
    std::vector<GetResult> before(pending.size());
    for (size_t p = 0; p < pending.size(); ++p) {
      before[p] = results[pending[p]];
      results[pending[p]] = GetResult::kMissFromError;  // what an owner that fails leaves
    }
    Impl::ForEachParallel(groups.size(), [&](size_t g) {
      const auto& [owner, idx] = groups[g];
      std::vector<BlockKey> keys;
      keys.reserve(idx.size());
      for (uint32_t i : idx) keys.push_back({fps[i], shard});
      const absl::Time deadline = AttemptDeadline(call_deadline, plan.OwnersLeft(idx, attempt), absl::Now());
      im.data_path->ReadBatch(*view->owners[owner], pns, keys, idx, block_bytes, buffers, results, deadline, refusal);
    });
    for (size_t p = 0; p < pending.size(); ++p) {
      GetResult& r = results[pending[p]];
      corrupt += r == GetResult::kChecksumMismatch;
      r = AfterRetry(r, before[p]);  // a hot block's miss stands
    }
    uint64_t served_by_replica = 0;
    std::erase_if(pending, [&](uint32_t i) {
      served_by_replica += attempt > 0 && results[i] == GetResult::kHit;
      const bool retry = RetryGet(results[i], plan.retry_miss[i], attempt);
      return !retry || attempt + 1 >= plan.owners[i].size();
    });
    im.stats.replica_read_blocks.fetch_add(served_by_replica, std::memory_order_relaxed);
  }
  if (refusal.refused()) return refusal.status();
  im.PromoteHot(*view, ns, fps, shard, buffers, first_block_index, results);

  uint64_t hits = 0, from_errors = 0;
  for (GetResult r : results) {
    hits += r == GetResult::kHit;
    from_errors += r == GetResult::kMissFromError;
  }
  im.stats.retrieve_hit_blocks.fetch_add(hits, std::memory_order_relaxed);
  im.stats.retrieve_hit_tokens.fetch_add(hits * ns.layout.block_tokens, std::memory_order_relaxed);
  im.stats.retrieve_hit_bytes.fetch_add(hits * block_bytes, std::memory_order_relaxed);
  im.stats.misses_from_errors.fetch_add(from_errors, std::memory_order_relaxed);
  im.stats.checksum_failures.fetch_add(corrupt, std::memory_order_relaxed);
  return results;
}

absl::StatusOr<std::vector<bool>> Client::GetIntoDevice(const Namespace& ns, std::span<const Fingerprint> fps,
                                                        uint32_t shard, std::span<const DeviceBuffer> buffers,
                                                        void* stream, uint32_t first_block_index) {
  const absl::Time call_deadline = CallDeadline(absl::Now(), impl_->options.rpc_timeout);
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  if (shard >= ns.layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " >= tp_size ", ns.layout.tp_size));
  }
  if (buffers.size() != fps.size()) {
    return absl::InvalidArgumentError(absl::StrCat(buffers.size(), " device buffers for ", fps.size(), " blocks"));
  }
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size_bytes != block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("device buffer ", i, " is ", buffers[i].size_bytes, " bytes, a block is ", block_bytes));
    }
    if (buffers[i].device != buffers[0].device) {
      return absl::InvalidArgumentError(absl::StrCat("device buffer ", i, " is on device ", buffers[i].device,
                                                     ", buffer 0 on device ", buffers[0].device));
    }
  }
  Impl& im = *impl_;
  std::vector<bool> arrived(fps.size(), false);
  if (fps.empty()) return arrived;
  const std::shared_ptr<const RingView> view = im.View();
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
  // One attempt, at each block's first owner: what it cannot send over its device path is the caller's
  // to fetch through host memory, where Get's fail-over applies.
  const ReadPlan plan = im.PlanReads(*view, ns, fps, first_block_index);
  std::vector<uint32_t> all(fps.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  const OwnerGroups groups = GroupByAttempt(plan, all, /*attempt=*/0, im.options.max_blocks_per_request);
  std::vector<GetResult> results(fps.size(), GetResult::kMissFromError);
  CallRefusal refusal;
  Impl::ForEachParallel(groups.size(), [&](size_t g) {
    const auto& [owner, idx] = groups[g];
    std::vector<BlockKey> keys;
    keys.reserve(idx.size());
    for (uint32_t i : idx) keys.push_back({fps[i], shard});
    im.data_path->ReadDeviceBatch(*view->owners[owner], ns, pns, keys, idx, block_bytes, buffers, stream, results,
                                  call_deadline, refusal);
  });
  if (refusal.refused()) return refusal.status();
  uint64_t hits = 0;
  for (size_t i = 0; i < fps.size(); ++i) {
    arrived[i] = results[i] == GetResult::kHit;
    hits += arrived[i];
  }
  im.stats.get_blocks.fetch_add(hits, std::memory_order_relaxed);
  im.stats.retrieve_hit_blocks.fetch_add(hits, std::memory_order_relaxed);
  im.stats.retrieve_hit_tokens.fetch_add(hits * ns.layout.block_tokens, std::memory_order_relaxed);
  im.stats.retrieve_hit_bytes.fetch_add(hits * block_bytes, std::memory_order_relaxed);
  return arrived;
}

absl::StatusOr<std::vector<PutResult>> Client::Put(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                                   uint32_t first_block_index) {
  return Put(ns, fps, shard, blocks, PutOptions{.first_block_index = first_block_index});
}

absl::StatusOr<std::vector<PutResult>> Client::Put(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                                   const PutOptions& put_options) {
  const uint32_t first_block_index = put_options.first_block_index;
  if (!put_options.block_meta.empty() && put_options.block_meta.size() != fps.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_meta: ", put_options.block_meta.size(), " for ", fps.size(), " fingerprints"));
  }
  // Each block's parent is the previous block of the chain (the caller's parent_hash and
  // parent_fingerprint for the first), unless the caller named it: filled before the blocks are split
  // among their owners. Without engine metadata the blocks still get their parent fingerprints.
  const bool engine_meta = !put_options.block_meta.empty();
  std::vector<BlockMeta> meta(put_options.block_meta.begin(), put_options.block_meta.end());
  if (!engine_meta && (fps.size() > 1 || put_options.parent_fingerprint.has_value())) meta.resize(fps.size());
  for (size_t i = 0; i < meta.size(); ++i) {
    if (engine_meta && meta[i].parent_hash.empty()) {
      meta[i].parent_hash = i == 0 ? put_options.parent_hash : meta[i - 1].hash;
    }
    if (!meta[i].parent_fingerprint.has_value()) {
      meta[i].parent_fingerprint = i == 0 ? put_options.parent_fingerprint : std::optional<Fingerprint>(fps[i - 1]);
    }
    if (absl::Status s = ValidateBlockMeta(meta[i], absl::StrCat("block_meta[", i, "]")); !s.ok()) return s;
  }
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  if (shard >= ns.layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " >= tp_size ", ns.layout.tp_size));
  }
  if (blocks.size() != fps.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(blocks.size(), " blocks of bytes for ", fps.size(), " fingerprints"));
  }
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].size() != block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("blocks[", i, "] is ", blocks[i].size(), " bytes, a block is ", block_bytes));
    }
  }
  Impl& im = *impl_;
  std::vector<PutResult> results(fps.size(), PutResult::kError);
  im.stats.put_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return results;
  std::vector<uint32_t> all(fps.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  const std::shared_ptr<const RingView> view = im.View();  // this call's ring, whatever changes meanwhile
  const OwnerGroups groups = GroupByOwner(
      all, [&](uint32_t i) { return view->ring.Primary(fps[i]); },
      std::min(im.options.max_blocks_per_request, im.options.put_batch_blocks));
  // Owners in parallel; one owner's batches in order, at most kPutPipelineDepth of them reserved at
  // once (the next one's reservation and sends overlap the last one's commit), so a put larger than an
  // owner's memory streams through it instead of reserving more than it has. Blocks refused NO_SPACE
  // while another batch held reservations are tried once more alone (put_pipeline.h).
  std::vector<std::pair<size_t, size_t>> runs;  // [first, last) group of each owner
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g == 0 || groups[g].first != groups[g - 1].first) runs.push_back({g, g});
    runs.back().second = g + 1;
  }
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
  CallRefusal refusal;  // the first owner's refusal of the request (IsRefusal): the call's error

  // Puts batch g through `pipeline`; true when its owner should get no more batches in this call.
  auto put_batch = [&](PutPipeline& pipeline, size_t g) {
    const auto& [owner, idx] = groups[g];
    std::vector<PutResult> batch(idx.size(), PutResult::kError);
    absl::Status s = pipeline.PutBatch(
        idx.size(),
        [&](std::span<const uint32_t> positions, std::vector<PutResult>& out) {
          std::vector<BlockKey> keys;
          std::vector<uint32_t> depths;
          std::vector<std::span<const std::byte>> data;
          std::vector<const BlockMeta*> batch_meta;
          for (uint32_t k : positions) {
            const uint32_t i = idx[k];
            keys.push_back({fps[i], shard});
            depths.push_back(first_block_index + i);
            data.push_back(blocks[i]);
            if (!meta.empty()) batch_meta.push_back(&meta[i]);
          }
          out.assign(positions.size(), PutResult::kError);
          return im.data_path->PutBatch(*view->owners[owner], pns, keys, depths, data, block_bytes, out, batch_meta);
        },
        batch);
    if (!s.ok()) {
      refusal.Record(std::move(s));
      return true;  // the rest would be refused too
    }
    for (size_t k = 0; k < idx.size(); ++k) results[idx[k]] = batch[k];
    return std::all_of(batch.begin(), batch.end(), [](PutResult p) { return p == PutResult::kError; });
  };
  Impl::ForEachParallel(runs.size(), [&](size_t r) {
    // An owner that failed a whole batch (down, or past its deadline) is not waited for again: the
    // rest of its blocks stay kError, so a dead owner costs the deadlines of the batches in flight, not
    // one per batch.
    PutPipeline pipeline(Impl::kPutPipelineDepth);
    pipeline.Run(runs[r].first, runs[r].second, [&](size_t g) { return put_batch(pipeline, g); });
  });
  if (!refusal.refused()) im.EnqueueReplicas(*view, ns, fps, shard, blocks, first_block_index, meta, results);

  uint64_t stored = 0, rejected = 0;
  for (PutResult r : results) {
    stored += r == PutResult::kStored;
    rejected += r == PutResult::kNoSpace;
  }
  im.stats.put_stored_blocks.fetch_add(stored, std::memory_order_relaxed);
  im.stats.put_stored_bytes.fetch_add(stored * block_bytes, std::memory_order_relaxed);
  im.stats.put_rejected_blocks.fetch_add(rejected, std::memory_order_relaxed);
  if (refusal.refused()) return refusal.status();  // blocks other owners stored stay stored (and counted)
  return results;
}

}  // namespace kvtier::client
