#include "kvtier/client/client.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <latch>
#include <mutex>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "client/ucx_client.h"
#include "kvtier/common/block_key.h"
#include "kvtier/common/checksum.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

absl::Status ClientOptions::Validate() const {
  if (members.empty()) return absl::InvalidArgumentError("members: at least one member is required");
  for (const std::string& m : members) {
    const std::string addr = m.substr(m.find('=') == std::string::npos ? 0 : m.find('=') + 1);
    if (addr.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("members: \"", m, "\" is not host:port or node_id=host:port"));
    }
  }
  if (virtual_nodes == 0) return absl::InvalidArgumentError("virtual_nodes: must be > 0");
  if (rpc_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("rpc_timeout: must be > 0");
  if (connect_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("connect_timeout: must be > 0");
  if (max_message_bytes < (4ULL << 20)) return absl::InvalidArgumentError("max_message_bytes: must be >= 4 MiB");
  if (stream_chunk_bytes == 0 || stream_chunk_bytes + (64 << 10) > max_message_bytes) {
    return absl::InvalidArgumentError("stream_chunk_bytes: must be > 0 and below max_message_bytes - 64 KiB");
  }
  if (max_blocks_per_request == 0) return absl::InvalidArgumentError("max_blocks_per_request: must be > 0");
  if (put_batch_blocks == 0) return absl::InvalidArgumentError("put_batch_blocks: must be > 0");
  if (max_block_bytes == 0) return absl::InvalidArgumentError("max_block_bytes: must be > 0");
  if (transport != "auto" && transport != "grpc" && transport != "ucx") {
    return absl::InvalidArgumentError(absl::StrCat("transport: \"", transport, "\" is not auto, grpc or ucx"));
  }
  if (ucx_reconnect_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ucx_reconnect_backoff: must be >= 0");
  }
  return absl::OkStatus();
}

const char* GetResultName(GetResult r) {
  switch (r) {
    case GetResult::kHit: return "hit";
    case GetResult::kMiss: return "miss";
    case GetResult::kMissFromError: return "miss_from_error";
    case GetResult::kChecksumMismatch: return "checksum_mismatch";
  }
  return "unknown";
}

const char* PutResultName(PutResult r) {
  switch (r) {
    case PutResult::kStored: return "stored";
    case PutResult::kAlreadyPresent: return "already_present";
    case PutResult::kInProgress: return "in_progress";
    case PutResult::kNoSpace: return "no_space";
    case PutResult::kError: return "error";
  }
  return "unknown";
}

namespace {

// The UCX endpoint of one member, as far as this client knows.
struct UcxPeer {
  enum class State : uint8_t { kUnknown, kReady, kDown, kUnsupported };
  std::mutex mu;
  State state = State::kUnknown;                  // guarded by mu
  UcxClient::EndpointId endpoint = 0;             // guarded by mu; valid while kReady
  absl::Time retry_after = absl::InfinitePast();  // guarded by mu; no (re)connect before it
};

// A member without UCX is asked again this often (it may restart with UCX).
constexpr absl::Duration kUcxUnsupportedRecheck = absl::Seconds(10);

struct Member {
  MemberInfo info;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::CacheService::Stub> cache;
  std::unique_ptr<v1::AdminService::Stub> admin;
  std::unique_ptr<UcxPeer> ucx = std::make_unique<UcxPeer>();
};

// Indices of `n` blocks grouped by the owner of each, in block order within a group.
using OwnerGroups = std::vector<std::pair<uint32_t, std::vector<uint32_t>>>;

}  // namespace

class Client::Impl {
 public:
  ClientOptions options;
  std::vector<Member> members;             // all configured members
  std::vector<uint32_t> ring_to_member;    // ring index -> members index
  std::unique_ptr<HashRing> ring;
  ClientStats stats;
  std::mutex ucx_mu;
  std::unique_ptr<UcxClient> ucx;  // guarded by ucx_mu until created; created once, on first need
  bool ucx_failed = false;         // guarded by ucx_mu: UCX could not start here

  UcxClient* Ucx() {
    std::lock_guard<std::mutex> lock(ucx_mu);
    if (ucx == nullptr && !ucx_failed) {
      auto created = UcxClient::Create(options.ucx_transports);
      if (created.ok()) {
        ucx = std::move(created).value();
      } else {
        ucx_failed = true;
      }
    }
    return ucx.get();
  }

  // The UCX endpoint to move member m's bytes over, connecting (GetInfo, then a UCX hello) when there
  // is none and the backoff has passed; nullopt: use gRPC bytes (or fail, with transport "ucx").
  std::optional<UcxClient::EndpointId> UcxEndpoint(uint32_t m) {
    if (options.transport == "grpc") return std::nullopt;
    Member& member = members[m];
    UcxPeer& peer = *member.ucx;
    std::lock_guard<std::mutex> lock(peer.mu);
    if (peer.state == UcxPeer::State::kReady) return peer.endpoint;
    const absl::Time now = absl::Now();
    if (now < peer.retry_after) return std::nullopt;
    v1::GetInfoResponse info;
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      v1::GetInfoRequest req;
      if (!member.admin->GetInfo(&ctx, req, &info).ok()) {
        peer.state = UcxPeer::State::kDown;
        peer.retry_after = now + options.ucx_reconnect_backoff;
        return std::nullopt;
      }
    }
    UcxClient* ucx_client = info.ucx_port() != 0 ? Ucx() : nullptr;
    if (ucx_client == nullptr) {
      peer.state = UcxPeer::State::kUnsupported;
      peer.retry_after = now + kUcxUnsupportedRecheck;
      return std::nullopt;
    }
    // The member's UCX listener, on the host we reach its gRPC at.
    const std::string& a = member.info.address;
    const std::string target = absl::StrCat(a.substr(0, a.rfind(':')), ":", info.ucx_port());
    auto conn = ucx_client->Connect(target, absl::Now() + options.rpc_timeout);
    if (!conn.ok() || (!member.info.node_id.empty() && conn->node_id != member.info.node_id)) {
      if (conn.ok()) ucx_client->Close(conn->endpoint);  // another server answers at that port
      peer.state = UcxPeer::State::kDown;
      peer.retry_after = now + options.ucx_reconnect_backoff;
      return std::nullopt;
    }
    peer.state = UcxPeer::State::kReady;
    peer.endpoint = conn->endpoint;
    stats.ucx_connects.fetch_add(1, std::memory_order_relaxed);
    return peer.endpoint;
  }

  // Drops member m's endpoint after an error or a missed deadline; the next call after the backoff
  // reconnects.
  void UcxEndpointFailed(uint32_t m, UcxClient::EndpointId endpoint) {
    UcxPeer& peer = *members[m].ucx;
    std::lock_guard<std::mutex> lock(peer.mu);
    if (peer.state != UcxPeer::State::kReady || peer.endpoint != endpoint) return;
    peer.state = UcxPeer::State::kDown;
    peer.retry_after = absl::Now() + options.ucx_reconnect_backoff;
    ucx->Close(endpoint);
    stats.ucx_endpoint_failures.fetch_add(1, std::memory_order_relaxed);
  }

  // Best effort: returns a lease now rather than at its expiry.
  void ReleaseLease(uint32_t m, uint64_t lease_id) {
    if (lease_id == 0) return;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    v1::ReleaseRequest req;
    req.add_lease_ids(lease_id);
    v1::ReleaseResponse resp;
    (void)members[m].cache->Release(&ctx, req, &resp);
  }

  // Get of one owner's batch over UCX: a status-only Read takes the lease over gRPC, then the server
  // sends the present blocks straight into `buffers` and releases the lease.
  void GetOverUcx(uint32_t m, UcxClient::EndpointId endpoint, const v1::Namespace& pns,
                  std::span<const BlockKey> keys, std::span<const uint32_t> idx, uint64_t block_bytes,
                  std::span<const std::span<std::byte>> buffers, std::span<GetResult> results) {
    const absl::Time deadline = absl::Now() + options.rpc_timeout;
    v1::ReadRequest req;
    *req.mutable_namespace_() = pns;
    wire::EncodeKeys(keys, req.mutable_keys());
    req.set_status_only(true);
    v1::ReadResponse head;
    bool got = false;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      auto reader = members[m].cache->Read(&ctx, req);
      got = reader->Read(&head) && static_cast<size_t>(head.blocks_size()) == idx.size();
      if (!got) ctx.TryCancel();
      got = reader->Finish().ok() && got;
    }
    if (!got) {
      stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      ReleaseLease(m, head.lease_id());
      // The control plane is how a dead server shows (UCX endpoints run without peer failure handling):
      // reconnect after the backoff, so that a restarted server gets a fresh endpoint.
      UcxEndpointFailed(m, endpoint);
      return;  // all kMissFromError
    }
    std::vector<uint32_t> indices;  // lease indices to fetch
    std::vector<std::span<std::byte>> bufs;
    std::vector<size_t> positions;  // k of each fetched block
    bool protocol_ok = true;
    for (size_t k = 0; k < idx.size(); ++k) {
      const v1::BlockStatus& st = head.blocks(static_cast<int>(k));
      if (!st.present()) {
        results[idx[k]] = GetResult::kMiss;
      } else if (st.size_bytes() != block_bytes) {
        protocol_ok = false;  // stays kMissFromError
      } else {
        indices.push_back(static_cast<uint32_t>(k));
        bufs.push_back(buffers[idx[k]]);
        positions.push_back(k);
      }
    }
    if (!protocol_ok) stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    if (indices.empty()) {
      ReleaseLease(m, head.lease_id());
      return;
    }
    // Each block's checksum is verified as soon as it lands, while the next ones are still moving.
    std::vector<uint8_t> verified(indices.size(), 0);
    auto verify = [&](size_t j) {
      const size_t k = positions[j];
      const uint32_t i = idx[k];
      results[i] = BlockChecksum(buffers[i].data(), block_bytes) == head.blocks(static_cast<int>(k)).checksum()
                       ? GetResult::kHit
                       : GetResult::kChecksumMismatch;
      verified[j] = 1;
    };
    const UcxClient::TransferResult r =
        ucx->Get(endpoint, head.lease_id(), /*release=*/true, indices, bufs, deadline, verify);
    uint64_t arrived = 0;
    for (size_t j = 0; j < indices.size(); ++j) {
      if (r.items[j] != UcxClient::ItemStatus::kOk) {
        results[idx[positions[j]]] = GetResult::kMissFromError;  // whatever a verify saw, it did not finish in time
        continue;
      }
      ++arrived;
      if (verified[j] == 0) verify(j);
    }
    stats.ucx_get_blocks.fetch_add(arrived, std::memory_order_relaxed);
    if (r.endpoint_failed) {
      stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      UcxEndpointFailed(m, endpoint);
      ReleaseLease(m, head.lease_id());  // the server may never have seen the request
    }
  }

  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.rpc_timeout));
  }

  // Groups by primary owner, then splits each group into batches of at most `batch` blocks (default:
  // max_blocks_per_request); batches of one owner are adjacent.
  OwnerGroups GroupByOwner(std::span<const Fingerprint> fps, std::span<const uint32_t> indices,
                           size_t batch = 0) const {
    if (batch == 0) batch = options.max_blocks_per_request;
    absl::flat_hash_map<uint32_t, size_t> slot;
    OwnerGroups groups;
    for (uint32_t i : indices) {
      const uint32_t m = ring_to_member[ring->Primary(fps[i])];
      auto [it, inserted] = slot.try_emplace(m, groups.size());
      if (inserted) groups.push_back({m, {}});
      groups[it->second].second.push_back(i);
    }
    // Split batches above the per-request limit.
    OwnerGroups out;
    for (auto& [m, idx] : groups) {
      for (size_t off = 0; off < idx.size(); off += batch) {
        const size_t end = std::min(idx.size(), off + batch);
        out.push_back({m, std::vector<uint32_t>(idx.begin() + off, idx.begin() + end)});
      }
    }
    return out;
  }

  // Runs fn(g) for each group, in parallel threads beyond the first, and waits for all.
  template <typename Fn>
  static void ForEachParallel(size_t n, Fn fn) {
    std::vector<std::future<void>> rest;
    for (size_t g = 1; g < n; ++g) rest.push_back(std::async(std::launch::async, [&fn, g] { fn(g); }));
    if (n > 0) fn(0);
    for (auto& f : rest) f.get();
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const grpc::ChannelArguments args = wire::ChannelArgs(options.max_message_bytes);
  for (const std::string& spec : options.members) {
    Member m;
    const size_t eq = spec.find('=');
    if (eq != std::string::npos) {
      m.info.node_id = spec.substr(0, eq);
      m.info.address = spec.substr(eq + 1);
    } else {
      m.info.address = spec;
    }
    m.channel = grpc::CreateCustomChannel(m.info.address, grpc::InsecureChannelCredentials(), args);
    m.cache = v1::CacheService::NewStub(m.channel);
    m.admin = v1::AdminService::NewStub(m.channel);
    impl->members.push_back(std::move(m));
  }
  // Ask the members without a configured id for theirs, all at once.
  {
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    std::vector<v1::GetInfoRequest> reqs(impl->members.size());
    std::vector<v1::GetInfoResponse> resps(impl->members.size());
    std::vector<grpc::Status> statuses(impl->members.size());
    std::vector<uint32_t> asked;
    for (uint32_t i = 0; i < impl->members.size(); ++i) {
      if (impl->members[i].info.node_id.empty()) asked.push_back(i);
    }
    std::latch done(static_cast<std::ptrdiff_t>(asked.size()));
    for (uint32_t i : asked) {
      auto ctx = std::make_unique<grpc::ClientContext>();
      ctx->set_deadline(absl::ToChronoTime(absl::Now() + options.connect_timeout));
      ctx->set_wait_for_ready(true);  // ride out a member that is still starting
      impl->members[i].admin->async()->GetInfo(ctx.get(), &reqs[i], &resps[i], [&, i](grpc::Status s) {
        statuses[i] = std::move(s);
        done.count_down();
      });
      ctxs.push_back(std::move(ctx));
    }
    done.wait();
    for (uint32_t i : asked) {
      if (statuses[i].ok() && !resps[i].node_id().empty()) impl->members[i].info.node_id = resps[i].node_id();
    }
  }
  std::vector<std::string> ids;
  absl::flat_hash_set<std::string> seen;
  for (uint32_t i = 0; i < impl->members.size(); ++i) {
    Member& m = impl->members[i];
    if (m.info.node_id.empty()) continue;
    if (!seen.insert(m.info.node_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("members: node id \"", m.info.node_id,
                                                     "\" is reported by two members"));
    }
    m.info.in_ring = true;
    ids.push_back(m.info.node_id);
    impl->ring_to_member.push_back(i);
  }
  if (ids.empty()) return absl::UnavailableError("no member answered with its node id");
  auto ring = HashRing::Create(ids, options.virtual_nodes);
  if (!ring.ok()) return ring.status();
  impl->ring = std::make_unique<HashRing>(std::move(ring).value());
  // Set up UCX endpoints now, in parallel, so that the first transfers need not; a member that fails
  // here is retried by the first call that needs it.
  if (impl->options.transport != "grpc") {
    Impl& im = *impl;
    Impl::ForEachParallel(im.ring_to_member.size(), [&im](size_t r) { (void)im.UcxEndpoint(im.ring_to_member[r]); });
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const ClientStats& Client::stats() const { return impl_->stats; }
const HashRing& Client::ring() const { return *impl_->ring; }

std::vector<MemberInfo> Client::members() const {
  std::vector<MemberInfo> out;
  for (const Member& m : impl_->members) {
    out.push_back(m.info);
    std::lock_guard<std::mutex> lock(m.ucx->mu);
    if (m.ucx->state == UcxPeer::State::kReady) {
      out.back().transport = "ucx";
    } else {
      out.back().transport = impl_->options.transport == "ucx" ? "none" : "grpc";
    }
  }
  return out;
}

absl::StatusOr<LookupResult> Client::LookupPrefix(const Namespace& ns, std::span<const Fingerprint> fps) {
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  Impl& im = *impl_;
  const uint32_t tp = ns.layout.tp_size;
  LookupResult result;
  result.present.assign(fps.size(), false);
  im.stats.lookups.fetch_add(1, std::memory_order_relaxed);
  im.stats.lookup_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return result;

  std::vector<uint32_t> all(fps.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  // With tp shards, each key is asked tp times; split so one request stays within the limit.
  OwnerGroups groups = im.GroupByOwner(fps, all);
  if (tp > 1) {
    OwnerGroups split;
    const size_t per = std::max<size_t>(1, im.options.max_blocks_per_request / tp);
    for (auto& [m, idx] : groups) {
      for (size_t off = 0; off < idx.size(); off += per) {
        split.push_back({m, std::vector<uint32_t>(idx.begin() + off, idx.begin() + std::min(idx.size(), off + per))});
      }
    }
    groups = std::move(split);
  }
  v1::Namespace pns;
  wire::ToProto(ns, &pns);
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
    ctxs[g] = std::make_unique<grpc::ClientContext>();
    im.SetDeadline(*ctxs[g]);
    im.members[groups[g].first].cache->async()->Lookup(ctxs[g].get(), &reqs[g], &resps[g], [&, g](grpc::Status s) {
      statuses[g] = std::move(s);
      done.count_down();
    });
  }
  done.wait();
  for (size_t g = 0; g < n; ++g) {
    const auto& idx = groups[g].second;
    if (!statuses[g].ok() || static_cast<size_t>(resps[g].present_size()) != idx.size() * tp) {
      im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      result.blocks_from_errors += static_cast<uint32_t>(idx.size());
      continue;
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      bool all_shards = true;
      for (uint32_t s = 0; s < tp; ++s) all_shards &= resps[g].present(static_cast<int>(k * tp + s));
      result.present[idx[k]] = all_shards;
    }
  }
  while (result.prefix_blocks < fps.size() && result.present[result.prefix_blocks]) ++result.prefix_blocks;
  im.stats.misses_from_errors.fetch_add(result.blocks_from_errors, std::memory_order_relaxed);
  im.stats.prefix_hit_blocks.fetch_add(result.prefix_blocks, std::memory_order_relaxed);
  im.stats.prefix_hit_tokens.fetch_add(uint64_t{result.prefix_blocks} * ns.layout.block_tokens,
                                       std::memory_order_relaxed);
  return result;
}

absl::StatusOr<std::vector<GetResult>> Client::Get(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<std::byte>> buffers) {
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
      return absl::InvalidArgumentError(absl::StrCat("buffers[", i, "] is ", buffers[i].size(),
                                                     " bytes, a block is ", block_bytes));
    }
  }
  Impl& im = *impl_;
  std::vector<GetResult> results(fps.size(), GetResult::kMissFromError);
  im.stats.get_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return results;
  std::vector<uint32_t> all(fps.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  const OwnerGroups groups = im.GroupByOwner(fps, all);
  v1::Namespace pns;
  wire::ToProto(ns, &pns);

  Impl::ForEachParallel(groups.size(), [&](size_t g) {
    const auto& [member, idx] = groups[g];
    v1::ReadRequest req;
    *req.mutable_namespace_() = pns;
    std::vector<BlockKey> keys;
    keys.reserve(idx.size());
    for (uint32_t i : idx) keys.push_back({fps[i], shard});
    if (im.options.transport != "grpc") {
      if (auto endpoint = im.UcxEndpoint(member); endpoint.has_value()) {
        im.GetOverUcx(member, *endpoint, pns, keys, idx, block_bytes, buffers, results);
        return;
      }
      if (im.options.transport == "ucx") {  // no fallback: these blocks are misses from error
        im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    wire::EncodeKeys(keys, req.mutable_keys());
    grpc::ClientContext ctx;
    im.SetDeadline(ctx);
    auto reader = im.members[member].cache->Read(&ctx, req);
    v1::ReadResponse msg;
    std::vector<uint64_t> received(idx.size(), 0);
    std::vector<v1::BlockStatus> status;
    bool protocol_ok = true;
    if (reader->Read(&msg) && static_cast<size_t>(msg.blocks_size()) == idx.size()) {
      status.assign(msg.blocks().begin(), msg.blocks().end());
      while (reader->Read(&msg)) {
        const uint32_t k = msg.index();
        if (k >= idx.size() || !status[k].present() || msg.offset() != received[k] ||
            msg.data().size() > block_bytes - received[k]) {
          protocol_ok = false;  // keep draining; these blocks stay errors
          continue;
        }
        std::memcpy(buffers[idx[k]].data() + received[k], msg.data().data(), msg.data().size());
        received[k] += msg.data().size();
      }
    } else {
      protocol_ok = false;
      ctx.TryCancel();  // don't wait for the rest of a stream we cannot use
    }
    const grpc::Status st = reader->Finish();
    if (!st.ok() || !protocol_ok) im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    for (size_t k = 0; k < idx.size(); ++k) {
      const uint32_t i = idx[k];
      if (k < status.size() && !status[k].present()) {
        results[i] = GetResult::kMiss;
      } else if (k < status.size() && received[k] == block_bytes && status[k].size_bytes() == block_bytes) {
        if (BlockChecksum(buffers[i].data(), block_bytes) == status[k].checksum()) {
          results[i] = GetResult::kHit;
        } else {
          results[i] = GetResult::kChecksumMismatch;
        }
      } else {
        results[i] = GetResult::kMissFromError;
      }
    }
  });

  uint64_t hits = 0, from_errors = 0, corrupt = 0;
  for (GetResult r : results) {
    hits += r == GetResult::kHit;
    from_errors += r == GetResult::kMissFromError;
    corrupt += r == GetResult::kChecksumMismatch;
  }
  im.stats.retrieve_hit_blocks.fetch_add(hits, std::memory_order_relaxed);
  im.stats.retrieve_hit_tokens.fetch_add(hits * ns.layout.block_tokens, std::memory_order_relaxed);
  im.stats.retrieve_hit_bytes.fetch_add(hits * block_bytes, std::memory_order_relaxed);
  im.stats.misses_from_errors.fetch_add(from_errors, std::memory_order_relaxed);
  im.stats.checksum_failures.fetch_add(corrupt, std::memory_order_relaxed);
  return results;
}

absl::StatusOr<std::vector<PutResult>> Client::Put(const Namespace& ns, std::span<const Fingerprint> fps,
                                                   uint32_t shard, std::span<const std::span<const std::byte>> blocks,
                                                   uint32_t first_block_index) {
  if (absl::Status s = ns.Validate(); !s.ok()) return s;
  if (shard >= ns.layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " >= tp_size ", ns.layout.tp_size));
  }
  if (blocks.size() != fps.size()) {
    return absl::InvalidArgumentError(absl::StrCat(blocks.size(), " blocks of bytes for ", fps.size(), " fingerprints"));
  }
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes > impl_->options.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a block of this layout is ", block_bytes,
                                                   " bytes, above max_block_bytes ", impl_->options.max_block_bytes));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].size() != block_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("blocks[", i, "] is ", blocks[i].size(),
                                                     " bytes, a block is ", block_bytes));
    }
  }
  Impl& im = *impl_;
  std::vector<PutResult> results(fps.size(), PutResult::kError);
  im.stats.put_blocks.fetch_add(fps.size(), std::memory_order_relaxed);
  if (fps.empty()) return results;
  std::vector<uint32_t> all(fps.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  const OwnerGroups groups =
      im.GroupByOwner(fps, all, std::min(im.options.max_blocks_per_request, im.options.put_batch_blocks));
  // Owners in parallel; one owner's batches in order, each committed before the next is reserved, so a
  // put larger than an owner's memory streams through it instead of reserving more than it has.
  std::vector<std::pair<size_t, size_t>> runs;  // [first, last) group of each owner
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g == 0 || groups[g].first != groups[g - 1].first) runs.push_back({g, g});
    runs.back().second = g + 1;
  }
  v1::Namespace pns;
  wire::ToProto(ns, &pns);

  auto put_batch = [&](size_t g) {
    const auto& [member, idx] = groups[g];
    v1::CacheService::Stub& stub = *im.members[member].cache;
    std::optional<UcxClient::EndpointId> ucx_endpoint;
    if (im.options.transport != "grpc") {
      ucx_endpoint = im.UcxEndpoint(member);
      if (!ucx_endpoint.has_value() && im.options.transport == "ucx") {
        im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        return;  // no fallback: all kError
      }
    }
    // Phase 1: reserve.
    v1::AllocateRequest areq;
    *areq.mutable_namespace_() = pns;
    std::vector<BlockKey> keys;
    keys.reserve(idx.size());
    for (uint32_t i : idx) keys.push_back({fps[i], shard});
    wire::EncodeKeys(keys, areq.mutable_keys());
    areq.mutable_depths()->Reserve(static_cast<int>(idx.size()));
    for (uint32_t i : idx) areq.add_depths(first_block_index + i);
    v1::AllocateResponse aresp;
    {
      grpc::ClientContext ctx;
      im.SetDeadline(ctx);
      if (!stub.Allocate(&ctx, areq, &aresp).ok() || static_cast<size_t>(aresp.results_size()) != idx.size()) {
        im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
        if (ucx_endpoint.has_value()) im.UcxEndpointFailed(member, *ucx_endpoint);  // see GetOverUcx
        return;  // all kError
      }
    }
    std::vector<uint32_t> allocated;  // positions k within idx
    for (size_t k = 0; k < idx.size(); ++k) {
      switch (aresp.results(static_cast<int>(k))) {
        case v1::ALLOCATE_RESULT_ALLOCATED: allocated.push_back(static_cast<uint32_t>(k)); break;
        case v1::ALLOCATE_RESULT_ALREADY_PRESENT: results[idx[k]] = PutResult::kAlreadyPresent; break;
        case v1::ALLOCATE_RESULT_IN_PROGRESS: results[idx[k]] = PutResult::kInProgress; break;
        case v1::ALLOCATE_RESULT_NO_SPACE: results[idx[k]] = PutResult::kNoSpace; break;
        default: results[idx[k]] = PutResult::kError; break;
      }
    }
    if (allocated.empty()) return;
    // Phase 1b: the bytes into the reserved slots: over UCX straight into them, or streamed over gRPC.
    auto ComputeChecksums = [&] {
      std::vector<uint64_t> sums(idx.size(), 0);
      for (uint32_t k : allocated) sums[k] = BlockChecksum(blocks[idx[k]].data(), block_bytes);
      return sums;
    };
    std::vector<uint64_t> checksums;
    bool ok = true;
    if (ucx_endpoint.has_value()) {
      std::vector<uint32_t> indices(allocated.begin(), allocated.end());
      std::vector<std::span<const std::byte>> data;
      for (uint32_t k : allocated) data.push_back(blocks[idx[k]]);
      // The commit's checksums are computed while the bytes move.
      const UcxClient::TransferResult r =
          im.ucx->Put(*ucx_endpoint, aresp.reservation_id(), indices, data, absl::Now() + im.options.rpc_timeout,
                      [&] { checksums = ComputeChecksums(); });
      uint64_t taken = 0;
      for (auto item : r.items) taken += item == UcxClient::ItemStatus::kOk;
      im.stats.ucx_put_blocks.fetch_add(taken, std::memory_order_relaxed);
      if (r.endpoint_failed) {
        im.UcxEndpointFailed(member, *ucx_endpoint);
        ok = false;  // abort below; blocks the server did not take come back INCOMPLETE otherwise
      }
    } else {
      grpc::ClientContext ctx;
      im.SetDeadline(ctx);
      v1::WriteBlocksResponse wresp;
      auto writer = stub.WriteBlocks(&ctx, &wresp);
      v1::WriteBlocksRequest chunk;
      chunk.set_reservation_id(aresp.reservation_id());
      for (uint32_t k : allocated) {
        const std::span<const std::byte> b = blocks[idx[k]];
        for (uint64_t off = 0; ok && off < b.size(); off += im.options.stream_chunk_bytes) {
          const uint64_t n = std::min<uint64_t>(im.options.stream_chunk_bytes, b.size() - off);
          chunk.set_index(k);
          chunk.set_offset(off);
          chunk.set_data(reinterpret_cast<const char*>(b.data() + off), n);
          ok = writer->Write(chunk);
        }
        if (!ok) break;
      }
      writer->WritesDone();
      ok = writer->Finish().ok() && ok;
    }
    // Phase 2: commit with checksums (entries for keys not allocated are ignored by the server).
    v1::CommitRequest creq;
    creq.set_reservation_id(aresp.reservation_id());
    if (checksums.empty()) checksums = ComputeChecksums();
    creq.mutable_checksums()->Add(checksums.begin(), checksums.end());
    v1::CommitResponse cresp;
    if (ok) {
      grpc::ClientContext ctx;
      im.SetDeadline(ctx);
      ok = stub.Commit(&ctx, creq, &cresp).ok() && static_cast<size_t>(cresp.results_size()) == idx.size();
    }
    if (!ok) {
      im.stats.rpc_errors.fetch_add(1, std::memory_order_relaxed);
      // Best effort: return the slots now rather than at reservation expiry.
      grpc::ClientContext ctx;
      im.SetDeadline(ctx);
      v1::AbortRequest abreq;
      abreq.set_reservation_id(aresp.reservation_id());
      v1::AbortResponse abresp;
      (void)stub.Abort(&ctx, abreq, &abresp);
      return;  // the allocated blocks stay kError
    }
    uint64_t mismatched = 0;
    for (uint32_t k : allocated) {
      const auto r = cresp.results(static_cast<int>(k));
      results[idx[k]] = r == v1::COMMIT_RESULT_COMMITTED ? PutResult::kStored : PutResult::kError;
      mismatched += r == v1::COMMIT_RESULT_CHECKSUM_MISMATCH;
    }
    // The server saw other bytes than we sent: count it like a corrupt read.
    im.stats.checksum_failures.fetch_add(mismatched, std::memory_order_relaxed);
  };
  Impl::ForEachParallel(runs.size(), [&](size_t r) {
    for (size_t g = runs[r].first; g < runs[r].second; ++g) put_batch(g);
  });

  uint64_t stored = 0, rejected = 0;
  for (PutResult r : results) {
    stored += r == PutResult::kStored;
    rejected += r == PutResult::kNoSpace;
  }
  im.stats.put_stored_blocks.fetch_add(stored, std::memory_order_relaxed);
  im.stats.put_stored_bytes.fetch_add(stored * block_bytes, std::memory_order_relaxed);
  im.stats.put_rejected_blocks.fetch_add(rejected, std::memory_order_relaxed);
  return results;
}

}  // namespace kvtier::client
