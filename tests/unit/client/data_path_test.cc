// DataPath's choice of a member's BlockPath per batch (client/data_path.h), over fake paths: UCX first
// where the member has an endpoint, the fallback to gRPC with transport "auto", none with "ucx", and
// gRPC only with "grpc". The member's channel is never used (no RPC is made: no sockets).
#include "client/data_path.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/wire/channel_security.h"

namespace kvtier::client {
namespace {

// What the fake paths saw.
struct Calls {
  int ucx_asked = 0;  // BlockPathFactory::Ucx calls
  int ucx_reads = 0;
  int ucx_puts = 0;
  int grpc_reads = 0;
  int grpc_puts = 0;
  absl::Time ucx_deadline;  // the deadline the last Ucx() call got
};

// A path that records its calls and answers as told: `moves` false = "another path may" (Read false,
// Put nullopt); otherwise sets every result to `read_result` / `put_result`.
class FakePath final : public BlockPath {
 public:
  FakePath(std::string name, bool moves, int* reads, int* puts, GetResult read_result, PutResult put_result)
      : name_(std::move(name)),
        moves_(moves),
        reads_(reads),
        puts_(puts),
        read_result_(read_result),
        put_result_(put_result) {}
  absl::string_view name() const override { return name_; }
  BlockPathCapabilities capabilities() const override { return {}; }
  bool Read(const ReadBatchRequest& batch, CallRefusal&) override {
    ++*reads_;
    if (!moves_) return false;
    for (uint32_t i : batch.idx) batch.results[i] = read_result_;
    return true;
  }
  std::optional<absl::Status> Put(const PutBatchRequest& batch) override {
    ++*puts_;
    if (!moves_) return std::nullopt;
    for (PutResult& r : batch.results) r = put_result_;
    return absl::OkStatus();
  }

 private:
  std::string name_;
  bool moves_;
  int* reads_;
  int* puts_;
  GetResult read_result_;
  PutResult put_result_;
};

// `has_endpoint`: whether Ucx() gives a path; `ucx_moves`: whether that path moves the bytes.
class FakePaths final : public BlockPathFactory {
 public:
  FakePaths(Calls* calls, bool has_endpoint, bool ucx_moves)
      : calls_(calls), has_endpoint_(has_endpoint), ucx_moves_(ucx_moves) {}
  std::unique_ptr<BlockPath> Ucx(Member&, absl::Time deadline) override {
    ++calls_->ucx_asked;
    calls_->ucx_deadline = deadline;
    if (!has_endpoint_) return nullptr;
    return std::make_unique<FakePath>("ucx", ucx_moves_, &calls_->ucx_reads, &calls_->ucx_puts, GetResult::kHit,
                                      PutResult::kStored);
  }
  std::unique_ptr<BlockPath> Grpc(Member&) override {
    return std::make_unique<FakePath>("grpc", true, &calls_->grpc_reads, &calls_->grpc_puts, GetResult::kMiss,
                                      PutResult::kAlreadyPresent);
  }

 private:
  Calls* calls_;
  bool has_endpoint_;
  bool ucx_moves_;
};

class DataPathTest : public ::testing::Test {
 protected:
  DataPathTest()
      : member_("127.0.0.1:1", "node-1", /*dns=*/false, grpc::ChannelArguments(), grpc::InsecureChannelCredentials(),
                wire::ChannelSecurity{}) {
    options_.rpc_timeout = absl::Seconds(3);
  }

  // Reads two blocks through a DataPath of `mode` over FakePaths; returns their results.
  std::vector<GetResult> Read(TransportMode mode, bool has_endpoint, bool ucx_moves) {
    DataPath path(options_, mode, stats_, std::make_unique<FakePaths>(&calls_, has_endpoint, ucx_moves));
    const std::vector<BlockKey> keys(2);
    const std::vector<uint32_t> idx = {0, 1};
    std::vector<std::byte> bytes(2 * 16);
    const std::vector<std::span<std::byte>> buffers = {std::span(bytes).subspan(0, 16),
                                                       std::span(bytes).subspan(16, 16)};
    std::vector<GetResult> results(2, GetResult::kMissFromError);
    CallRefusal refusal;
    path.ReadBatch(member_, pns_, keys, idx, 16, buffers, results, deadline_, refusal);
    EXPECT_FALSE(refusal.refused());
    return results;
  }

  std::vector<PutResult> Put(TransportMode mode, bool has_endpoint, bool ucx_moves) {
    DataPath path(options_, mode, stats_, std::make_unique<FakePaths>(&calls_, has_endpoint, ucx_moves));
    const std::vector<BlockKey> keys(2);
    const std::vector<uint32_t> depths = {0, 1};
    const std::vector<std::byte> bytes(2 * 16);
    const std::vector<std::span<const std::byte>> blocks = {std::span(bytes).subspan(0, 16),
                                                            std::span(bytes).subspan(16, 16)};
    std::vector<PutResult> results(2, PutResult::kError);
    EXPECT_TRUE(path.PutBatch(member_, pns_, keys, depths, blocks, 16, results).ok());
    return results;
  }

  ClientOptions options_;
  ClientStats stats_;
  Member member_;
  v1::Namespace pns_;
  Calls calls_;
  const absl::Time deadline_ = absl::Now() + absl::Seconds(1);
};

TEST_F(DataPathTest, AutoReadsOverUcxWhenTheMemberHasAnEndpoint) {
  EXPECT_EQ(Read(TransportMode::kAuto, /*has_endpoint=*/true, /*ucx_moves=*/true),
            (std::vector<GetResult>{GetResult::kHit, GetResult::kHit}));
  EXPECT_EQ(calls_.ucx_reads, 1);
  EXPECT_EQ(calls_.grpc_reads, 0);
  EXPECT_EQ(calls_.ucx_deadline, deadline_);  // connecting may take the attempt's deadline, no more
}

TEST_F(DataPathTest, AutoFallsBackToGrpcWithoutAnEndpoint) {
  EXPECT_EQ(Read(TransportMode::kAuto, /*has_endpoint=*/false, true),
            (std::vector<GetResult>{GetResult::kMiss, GetResult::kMiss}));
  EXPECT_EQ(calls_.ucx_asked, 1);
  EXPECT_EQ(calls_.grpc_reads, 1);
  EXPECT_EQ(stats_.rpc_errors.load(), 0u);
}

TEST_F(DataPathTest, AutoFallsBackToGrpcWhenUcxDidNotMoveTheBytes) {
  EXPECT_EQ(Read(TransportMode::kAuto, true, /*ucx_moves=*/false),
            (std::vector<GetResult>{GetResult::kMiss, GetResult::kMiss}));
  EXPECT_EQ(calls_.ucx_reads, 1);
  EXPECT_EQ(calls_.grpc_reads, 1);
}

TEST_F(DataPathTest, UcxOnlyLeavesMissesFromErrorWithoutFallback) {
  EXPECT_EQ(Read(TransportMode::kUcx, /*has_endpoint=*/false, true),
            (std::vector<GetResult>{GetResult::kMissFromError, GetResult::kMissFromError}));
  EXPECT_EQ(Read(TransportMode::kUcx, true, /*ucx_moves=*/false),
            (std::vector<GetResult>{GetResult::kMissFromError, GetResult::kMissFromError}));
  EXPECT_EQ(calls_.grpc_reads, 0);
  EXPECT_EQ(stats_.rpc_errors.load(), 2u);
}

TEST_F(DataPathTest, GrpcNeverAsksForUcx) {
  EXPECT_EQ(Read(TransportMode::kGrpc, true, true), (std::vector<GetResult>{GetResult::kMiss, GetResult::kMiss}));
  EXPECT_EQ(Put(TransportMode::kGrpc, true, true),
            (std::vector<PutResult>{PutResult::kAlreadyPresent, PutResult::kAlreadyPresent}));
  EXPECT_EQ(calls_.ucx_asked, 0);
  EXPECT_EQ(calls_.grpc_reads, 1);
  EXPECT_EQ(calls_.grpc_puts, 1);
}

TEST_F(DataPathTest, AutoPutsOverUcxAndFallsBackToGrpc) {
  EXPECT_EQ(Put(TransportMode::kAuto, true, true), (std::vector<PutResult>{PutResult::kStored, PutResult::kStored}));
  EXPECT_EQ(calls_.grpc_puts, 0);
  // The endpoint is asked with a full rpc_timeout, as each of the put's RPCs gets.
  EXPECT_GE(calls_.ucx_deadline, absl::Now() + absl::Seconds(2));
  EXPECT_EQ(Put(TransportMode::kAuto, true, /*ucx_moves=*/false),
            (std::vector<PutResult>{PutResult::kAlreadyPresent, PutResult::kAlreadyPresent}));
  EXPECT_EQ(Put(TransportMode::kAuto, /*has_endpoint=*/false, true),
            (std::vector<PutResult>{PutResult::kAlreadyPresent, PutResult::kAlreadyPresent}));
  EXPECT_EQ(calls_.ucx_puts, 2);
  EXPECT_EQ(calls_.grpc_puts, 2);
}

TEST_F(DataPathTest, UcxOnlyPutsLeaveErrorsWithoutFallback) {
  EXPECT_EQ(Put(TransportMode::kUcx, /*has_endpoint=*/false, true),
            (std::vector<PutResult>{PutResult::kError, PutResult::kError}));
  EXPECT_EQ(Put(TransportMode::kUcx, true, /*ucx_moves=*/false),
            (std::vector<PutResult>{PutResult::kError, PutResult::kError}));
  EXPECT_EQ(calls_.grpc_puts, 0);
  EXPECT_EQ(stats_.rpc_errors.load(), 2u);
}

}  // namespace
}  // namespace kvtier::client
