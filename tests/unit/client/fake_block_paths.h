// Fake BlockPaths for unit tests of Client (the test seam SetBlockPathFactoryForTest): a cluster of
// in-memory servers by member address, reached through a gRPC-like host path, a UCX path that may or
// may not move the bytes, and an NCCL path that copies into "device" buffers (host memory here).
// Members are configured with their node ids and health checks are an hour apart, so no RPC is made.
#ifndef KVTIER_TESTS_UNIT_CLIENT_FAKE_BLOCK_PATHS_H_
#define KVTIER_TESTS_UNIT_CLIENT_FAKE_BLOCK_PATHS_H_

#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "client/data_path.h"
#include "kvtier/client/client.h"

namespace kvtier::client::fakes {

constexpr uint64_t kBlockBytes = 64;  // Ns()'s shard bytes

// The server a fake path stands for.
struct FakeServer {
  bool down = false;                                                          // reads leave kMissFromError, puts kError
  bool offers_nccl = false;                                                   // Nccl() gives a path for this member
  bool hbm_empty = false;                                                     // NCCL reads are misses
  std::map<std::pair<Fingerprint, uint32_t>, std::vector<std::byte>> blocks;  // (fingerprint, shard) -> bytes
  int reads = 0;                                                              // read batches over the host path
  int ucx_reads = 0;                                                          // read batches offered to the UCX path
  int nccl_reads = 0;                                                         // read batches over NCCL
  std::set<int32_t> nccl_devices;                                             // devices NCCL paths were asked for
  std::vector<absl::Time> read_deadlines;                                     // of every host read batch, in order
};

struct FakeCluster {
  std::mutex mu;
  std::map<std::string, FakeServer> servers;  // guarded by mu; by member address
  bool ucx_endpoint = false;                  // whether Ucx() offers a path
  bool ucx_moves = false;                     // whether that path moves the bytes (else: the caller's fallback)
};

// The host path (as gRPC): reads into host buffers, stores puts.
class FakeGrpcPath final : public BlockPath {
 public:
  FakeGrpcPath(FakeCluster& cluster, std::string address) : cluster_(cluster), address_(std::move(address)) {}
  absl::string_view name() const override { return "grpc"; }
  BlockPathCapabilities capabilities() const override { return {}; }
  bool Read(const ReadBatchRequest& batch, CallRefusal&) override {
    EXPECT_TRUE(batch.device_buffers.empty());
    std::lock_guard<std::mutex> lock(cluster_.mu);
    FakeServer& s = cluster_.servers[address_];
    ++s.reads;
    s.read_deadlines.push_back(batch.deadline);
    if (s.down) return true;  // a dead member: the blocks stay misses from error
    for (size_t k = 0; k < batch.keys.size(); ++k) {
      auto it = s.blocks.find({batch.keys[k].fingerprint, batch.keys[k].shard});
      const uint32_t i = batch.idx[k];
      if (it == s.blocks.end()) {
        batch.results[i] = GetResult::kMiss;
        continue;
      }
      std::memcpy(batch.buffers[i].data(), it->second.data(), batch.block_bytes);
      batch.results[i] = GetResult::kHit;
    }
    return true;
  }
  std::optional<absl::Status> Put(const PutBatchRequest& batch) override {
    std::lock_guard<std::mutex> lock(cluster_.mu);
    FakeServer& s = cluster_.servers[address_];
    if (s.down) return absl::OkStatus();  // all kError
    for (size_t k = 0; k < batch.keys.size(); ++k) {
      s.blocks[{batch.keys[k].fingerprint, batch.keys[k].shard}].assign(batch.blocks[k].begin(), batch.blocks[k].end());
      batch.results[k] = PutResult::kStored;
    }
    return absl::OkStatus();
  }

 private:
  FakeCluster& cluster_;
  const std::string address_;
};

// A UCX path that moves the bytes only when the cluster says so (else: a lease answered only over gRPC,
// a reservation that failed, and the caller falls back).
class FakeUcxPath final : public BlockPath {
 public:
  FakeUcxPath(FakeCluster& cluster, std::string address) : cluster_(cluster), address_(std::move(address)) {}
  absl::string_view name() const override { return "ucx"; }
  BlockPathCapabilities capabilities() const override { return {}; }
  bool Read(const ReadBatchRequest& batch, CallRefusal& refusal) override {
    {
      std::lock_guard<std::mutex> lock(cluster_.mu);
      ++cluster_.servers[address_].ucx_reads;
    }
    if (!cluster_.ucx_moves) return false;
    return FakeGrpcPath(cluster_, address_).Read(batch, refusal);
  }
  std::optional<absl::Status> Put(const PutBatchRequest& batch) override {
    if (!cluster_.ucx_moves) return std::nullopt;
    return FakeGrpcPath(cluster_, address_).Put(batch);
  }

 private:
  FakeCluster& cluster_;
  const std::string address_;
};

// NCCL from the member's device tier: copies into the "device" buffers; puts are not its to make.
class FakeNcclPath final : public BlockPath {
 public:
  FakeNcclPath(FakeCluster& cluster, std::string address) : cluster_(cluster), address_(std::move(address)) {}
  absl::string_view name() const override { return "nccl"; }
  BlockPathCapabilities capabilities() const override { return {.device_buffers = true}; }
  bool Read(const ReadBatchRequest& batch, CallRefusal&) override {
    EXPECT_TRUE(batch.buffers.empty());
    if (batch.device_buffers.empty()) return false;
    std::lock_guard<std::mutex> lock(cluster_.mu);
    FakeServer& s = cluster_.servers[address_];
    ++s.nccl_reads;
    for (size_t k = 0; k < batch.keys.size(); ++k) {
      const uint32_t i = batch.idx[k];
      auto it = s.blocks.find({batch.keys[k].fingerprint, batch.keys[k].shard});
      if (s.hbm_empty || it == s.blocks.end()) {
        batch.results[i] = GetResult::kMiss;
        continue;
      }
      std::memcpy(batch.device_buffers[i].ptr, it->second.data(), batch.block_bytes);
      batch.results[i] = GetResult::kHit;
    }
    return true;
  }
  std::optional<absl::Status> Put(const PutBatchRequest&) override { return std::nullopt; }

 private:
  FakeCluster& cluster_;
  const std::string address_;
};

class FakePaths final : public BlockPathFactory {
 public:
  explicit FakePaths(FakeCluster& cluster) : cluster_(cluster) {}
  std::unique_ptr<BlockPath> Ucx(Member& member, absl::Time) override {
    if (!cluster_.ucx_endpoint) return nullptr;
    return std::make_unique<FakeUcxPath>(cluster_, member.address);
  }
  std::unique_ptr<BlockPath> Grpc(Member& member) override {
    return std::make_unique<FakeGrpcPath>(cluster_, member.address);
  }
  std::unique_ptr<BlockPath> Nccl(Member& member, int32_t device, absl::Time) override {
    std::lock_guard<std::mutex> lock(cluster_.mu);
    FakeServer& s = cluster_.servers[member.address];
    if (!s.offers_nccl) return nullptr;
    s.nccl_devices.insert(device);
    return std::make_unique<FakeNcclPath>(cluster_, member.address);
  }

 private:
  FakeCluster& cluster_;
};

// Distinct fingerprints spread over the ring.
inline Fingerprint Fp(uint32_t n) {
  Fingerprint fp;
  for (size_t b = 0; b < 8; ++b) fp.bytes[b] = static_cast<uint8_t>((n + 1) * 0x9E3779B1u >> (b * 3));
  fp.bytes[9] = static_cast<uint8_t>(n);
  return fp;
}

// A namespace whose blocks are kBlockBytes.
inline Namespace Ns() {
  Namespace ns{.tenant = "t", .model = "m"};
  ns.layout = KvLayout{.kind = LayoutKind::kStandard,
                       .dtype = DType::kFp16,
                       .num_layers = 1,
                       .num_kv_heads = 1,
                       .head_dim = 16,
                       .block_tokens = 1,
                       .tp_size = 1};
  return ns;
}

}  // namespace kvtier::client::fakes

#endif  // KVTIER_TESTS_UNIT_CLIENT_FAKE_BLOCK_PATHS_H_
