// The staging pipeline behind DeviceTransfer, without a GPU or a network: "device" memory is host
// memory, and the fake copy engine defers every copy until Wait() on a later marker (as a busy GPU
// would), so a staging slot reused too early shows up as wrong bytes, and the order of host transfers
// against copies shows the overlap.
#include "client/staging_pipeline.h"

#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "testing/status_matchers.h"

namespace kvtier::client::internal {
namespace {

// Copies run only when Wait() reaches a marker recorded after them, or on Drain() (a stream sync).
class DeferredCopyEngine final : public CopyEngine {
 public:
  struct Op {
    bool is_marker = false;
    uint32_t slot = 0;
    CopyKind kind = CopyKind::kHostToDevice;
    void* dst = nullptr;
    const void* src = nullptr;
    uint64_t bytes = 0;
    uint64_t seq = 0;  // a marker's number; a copy has the number of the next marker
  };

  explicit DeferredCopyEngine(std::vector<std::string>* log) : log_(log) {}

  absl::Status Activate() override { return absl::OkStatus(); }
  absl::Status CheckDeviceBuffer(const DeviceBuffer& b) override {
    if (b.ptr == nullptr) return absl::InvalidArgumentError("null pointer");
    return absl::OkStatus();
  }
  absl::StatusOr<std::byte*> AllocateStaging(uint64_t bytes) override {
    ++allocations;
    return new std::byte[bytes];
  }
  void FreeStaging(std::byte* p) override {
    log_->push_back("free");
    delete[] p;
  }
  absl::Status CopyAsync(CopyKind kind, void* dst, const void* src, uint64_t bytes, void*) override {
    queue_.push_back({.kind = kind, .dst = dst, .src = src, .bytes = bytes, .seq = seq_ + 1});
    log_->push_back(kind == CopyKind::kHostToDevice ? "enqueue h2d" : "enqueue d2h");
    return absl::OkStatus();
  }
  absl::Status Record(uint32_t slot, void*) override {
    queue_.push_back({.is_marker = true, .slot = slot, .seq = ++seq_});
    last_marker_[slot] = seq_;
    log_->push_back(absl::StrCat("record ", slot));
    return absl::OkStatus();
  }
  absl::Status Wait(uint32_t slot) override {
    log_->push_back(absl::StrCat("wait ", slot));
    auto it = last_marker_.find(slot);
    if (it == last_marker_.end()) return absl::OkStatus();
    RunThrough(it->second);
    return absl::OkStatus();
  }
  void Drain() { RunThrough(UINT64_MAX); }
  size_t pending_copies() const {
    size_t n = 0;
    for (const Op& op : queue_) n += op.is_marker ? 0 : 1;
    return n;
  }

  int allocations = 0;

 private:
  void RunThrough(uint64_t seq) {
    while (!queue_.empty()) {
      Op op = queue_.front();
      if (op.seq > seq) return;
      queue_.pop_front();
      if (!op.is_marker) {
        std::memcpy(op.dst, op.src, op.bytes);
        log_->push_back(op.kind == CopyKind::kHostToDevice ? "run h2d" : "run d2h");
      }
    }
  }

  std::vector<std::string>* log_;
  std::deque<Op> queue_;
  std::map<uint32_t, uint64_t> last_marker_;
  uint64_t seq_ = 0;
};

// An in-memory block store standing in for the cluster; it logs each batch it serves.
class FakeBlockIo final : public HostBlockIo {
 public:
  explicit FakeBlockIo(std::vector<std::string>* log, DeferredCopyEngine** engine) : log_(log), engine_(engine) {}

  absl::StatusOr<std::vector<GetResult>> Get(const Namespace&, std::span<const Fingerprint> fps, uint32_t,
                                             std::span<const std::span<std::byte>> buffers) override {
    log_->push_back(absl::StrCat("get ", fps.size(), " pending ", (*engine_)->pending_copies()));
    std::vector<GetResult> out;
    for (size_t i = 0; i < fps.size(); ++i) {
      auto it = blocks.find(fps[i].Hex());
      if (it == blocks.end()) {
        out.push_back(GetResult::kMiss);
        continue;
      }
      std::memcpy(buffers[i].data(), it->second.data(), buffers[i].size());
      out.push_back(GetResult::kHit);
    }
    return out;
  }
  absl::StatusOr<std::vector<PutResult>> Put(const Namespace&, std::span<const Fingerprint> fps, uint32_t,
                                             std::span<const std::span<const std::byte>> data,
                                             uint32_t first_block_index) override {
    log_->push_back(
        absl::StrCat("put ", fps.size(), " from ", first_block_index, " pending ", (*engine_)->pending_copies()));
    std::vector<PutResult> out;
    for (size_t i = 0; i < fps.size(); ++i) {
      blocks[fps[i].Hex()].assign(data[i].begin(), data[i].end());
      out.push_back(PutResult::kStored);
    }
    return out;
  }

  absl::flat_hash_map<std::string, std::vector<std::byte>> blocks;

 private:
  std::vector<std::string>* log_;
  DeferredCopyEngine** engine_;
};

Namespace SmallNamespace() {
  Namespace ns;
  ns.tenant = "t";
  ns.model = "m";
  ns.layout.num_layers = 1;
  ns.layout.num_kv_heads = 1;
  ns.layout.head_dim = 8;
  ns.layout.block_tokens = 4;
  return ns;
}

Fingerprint Fp(int i) {
  Fingerprint f;
  f.bytes[0] = static_cast<uint8_t>(i);
  f.bytes[1] = static_cast<uint8_t>(i >> 8);
  f.bytes[31] = 0x5a;
  return f;
}

class StagingPipelineTest : public ::testing::Test {
 protected:
  void MakePipeline(uint32_t batch_blocks, uint32_t staging_buffers) {
    auto engine = std::make_unique<DeferredCopyEngine>(&log_);
    engine_ = engine.get();
    auto p = StagingPipeline::Create(
        std::move(engine),
        {.batch_blocks = batch_blocks, .staging_buffers = staging_buffers, .staging_buffer_bytes = 1 << 20});
    ASSERT_OK(p);
    pipeline_ = std::move(p).value();
  }

  // n "device" buffers, block i filled with a pattern of `seed + i`.
  void MakeDevice(size_t n, int seed) {
    const uint64_t bytes = ns_.layout.ShardBytes();
    device_.assign(n, std::vector<std::byte>(bytes));
    buffers_.clear();
    for (size_t i = 0; i < n; ++i) {
      for (uint64_t b = 0; b < bytes; ++b) device_[i][b] = static_cast<std::byte>((seed + i) * 31 + b);
      buffers_.push_back({.device = 0, .ptr = device_[i].data(), .size_bytes = bytes});
    }
  }

  std::vector<Fingerprint> Fps(size_t n, int from = 0) {
    std::vector<Fingerprint> fps;
    for (size_t i = 0; i < n; ++i) fps.push_back(Fp(from + static_cast<int>(i)));
    return fps;
  }

  std::vector<std::string> Only(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& l : log_) {
      if (l.rfind(prefix, 0) == 0) out.push_back(l);
    }
    return out;
  }

  Namespace ns_ = SmallNamespace();
  std::vector<std::string> log_;
  DeferredCopyEngine* engine_ = nullptr;
  FakeBlockIo io_{&log_, &engine_};
  std::vector<std::vector<std::byte>> device_;
  std::vector<DeviceBuffer> buffers_;
  // Declared last, destroyed first: its destructor runs the copies still queued into device_.
  std::unique_ptr<StagingPipeline> pipeline_;
};

TEST_F(StagingPipelineTest, PutThenGetRoundTripsEveryBlockThroughReusedSlots) {
  MakePipeline(/*batch_blocks=*/3, /*staging_buffers=*/2);
  MakeDevice(10, /*seed=*/7);
  const auto fps = Fps(10);
  auto put = pipeline_->Put(io_, ns_, fps, 0, buffers_, nullptr, 0);
  ASSERT_OK(put);
  ASSERT_EQ(put->size(), 10u);
  for (auto r : *put) EXPECT_EQ(r, PutResult::kStored);
  for (size_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(io_.blocks.contains(fps[i].Hex()));
    EXPECT_EQ(io_.blocks[fps[i].Hex()], device_[i]) << "block " << i << " reached the store wrong";
  }
  const auto original = device_;
  MakeDevice(10, /*seed=*/100);  // overwrite the "device" with other bytes
  auto got = pipeline_->Get(io_, ns_, fps, 0, buffers_, nullptr);
  ASSERT_OK(got);
  for (auto r : *got) EXPECT_EQ(r, GetResult::kHit);
  engine_->Drain();  // the caller's stream sync
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(device_[i], original[i]) << "block " << i;
  EXPECT_EQ(pipeline_->stats().batches.load(), 8u);  // 4 batches of <= 3 blocks each way
  EXPECT_EQ(pipeline_->stats().host_to_device_bytes.load(), 10 * ns_.layout.ShardBytes());
  EXPECT_EQ(pipeline_->stats().device_to_host_bytes.load(), 10 * ns_.layout.ShardBytes());
  EXPECT_EQ(engine_->allocations, 2);  // the pool is allocated once and reused
}

TEST_F(StagingPipelineTest, GetOverlapsTheNextBatchWithTheCopiesOfThePrevious) {
  MakePipeline(/*batch_blocks=*/2, /*staging_buffers=*/2);
  MakeDevice(8, 1);
  const auto fps = Fps(8);
  ASSERT_OK(pipeline_->Put(io_, ns_, fps, 0, buffers_, nullptr, 0));
  MakeDevice(8, 50);
  log_.clear();
  ASSERT_OK(pipeline_->Get(io_, ns_, fps, 0, buffers_, nullptr));
  // The second host get runs while the first batch's two copies are still queued (overlap); the third
  // reuses slot 0, so it waits for those copies first, leaving only the second batch's pending.
  EXPECT_EQ(Only("get"),
            (std::vector<std::string>{"get 2 pending 0", "get 2 pending 2", "get 2 pending 2", "get 2 pending 2"}));
  // Each slot is waited on before the network refills it.
  std::vector<std::string> expected_prefix = {"wait 0", "get 2 pending 0", "enqueue h2d", "enqueue h2d",    "record 0",
                                              "wait 1", "get 2 pending 2", "enqueue h2d", "enqueue h2d",    "record 1",
                                              "wait 0", "run h2d",         "run h2d",     "get 2 pending 2"};
  ASSERT_GE(log_.size(), expected_prefix.size());
  EXPECT_EQ(std::vector<std::string>(log_.begin(), log_.begin() + expected_prefix.size()), expected_prefix);
}

TEST_F(StagingPipelineTest, PutCopiesTheNextBatchBeforeSendingThePrevious) {
  MakePipeline(/*batch_blocks=*/2, /*staging_buffers=*/2);
  MakeDevice(6, 3);
  ASSERT_OK(pipeline_->Put(io_, ns_, Fps(6), 0, buffers_, nullptr, /*first_block_index=*/10));
  // While batch i goes to the network, batch i+1's two copies are queued; first_block_index advances
  // by the batch size.
  EXPECT_EQ(Only("put"), (std::vector<std::string>{"put 2 from 10 pending 2", "put 2 from 12 pending 2",
                                                   "put 2 from 14 pending 0"}));
}

TEST_F(StagingPipelineTest, OneStagingBufferStillMovesEveryBlockCorrectly) {
  MakePipeline(/*batch_blocks=*/4, /*staging_buffers=*/1);
  MakeDevice(9, 11);
  const auto fps = Fps(9);
  ASSERT_OK(pipeline_->Put(io_, ns_, fps, 0, buffers_, nullptr, 0));
  const auto original = device_;
  EXPECT_EQ(Only("put"),
            (std::vector<std::string>{"put 4 from 0 pending 0", "put 4 from 4 pending 0", "put 1 from 8 pending 0"}));
  MakeDevice(9, 60);
  ASSERT_OK(pipeline_->Get(io_, ns_, fps, 0, buffers_, nullptr));
  engine_->Drain();
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(device_[i], original[i]) << "block " << i;
}

TEST_F(StagingPipelineTest, MissesLeaveTheirDeviceBuffersUntouched) {
  MakePipeline(3, 2);
  MakeDevice(5, 2);
  const auto fps = Fps(5);
  // Store blocks 0, 2 and 4 only.
  std::vector<Fingerprint> some = {fps[0], fps[2], fps[4]};
  std::vector<DeviceBuffer> some_buffers = {buffers_[0], buffers_[2], buffers_[4]};
  ASSERT_OK(pipeline_->Put(io_, ns_, some, 0, some_buffers, nullptr, 0));
  const auto original = device_;
  MakeDevice(5, 90);
  const auto untouched = device_;
  auto got = pipeline_->Get(io_, ns_, fps, 0, buffers_, nullptr);
  ASSERT_OK(got);
  engine_->Drain();
  EXPECT_EQ(*got, (std::vector<GetResult>{GetResult::kHit, GetResult::kMiss, GetResult::kHit, GetResult::kMiss,
                                          GetResult::kHit}));
  EXPECT_EQ(device_[0], original[0]);
  EXPECT_EQ(device_[1], untouched[1]);
  EXPECT_EQ(device_[2], original[2]);
  EXPECT_EQ(device_[3], untouched[3]);
  EXPECT_EQ(device_[4], original[4]);
  EXPECT_EQ(pipeline_->stats().host_to_device_bytes.load(), 3 * ns_.layout.ShardBytes());
}

TEST_F(StagingPipelineTest, ConsecutiveCallsKeepRotatingSlotsSoPendingCopiesAreNeverOverwritten) {
  MakePipeline(/*batch_blocks=*/2, /*staging_buffers=*/2);
  MakeDevice(6, 4);
  const auto fps = Fps(6);
  ASSERT_OK(pipeline_->Put(io_, ns_, fps, 0, buffers_, nullptr, 0));
  const auto original = device_;
  MakeDevice(6, 70);
  // Three one-batch calls without a stream sync in between: each call's copies are still queued when
  // the next call starts.
  for (int k = 0; k < 3; ++k) {
    std::vector<DeviceBuffer> b(buffers_.begin() + 2 * k, buffers_.begin() + 2 * k + 2);
    ASSERT_OK(pipeline_->Get(io_, ns_, std::span(fps).subspan(2 * k, 2), 0, b, nullptr));
  }
  engine_->Drain();
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(device_[i], original[i]) << "block " << i;
}

TEST_F(StagingPipelineTest, BatchesAreCappedByTheStagingBufferSize) {
  auto engine = std::make_unique<DeferredCopyEngine>(&log_);
  engine_ = engine.get();
  const uint64_t block = ns_.layout.ShardBytes();
  auto p = StagingPipeline::Create(std::move(engine),
                                   {.batch_blocks = 8, .staging_buffers = 2, .staging_buffer_bytes = 3 * block});
  ASSERT_OK(p);
  EXPECT_EQ((*p)->BlocksPerBatch(block), 3u);
  EXPECT_EQ((*p)->BlocksPerBatch(block / 2), 6u);
  MakeDevice(7, 5);
  ASSERT_OK((*p)->Put(io_, ns_, Fps(7), 0, buffers_, nullptr, 0));
  EXPECT_EQ(Only("put"),
            (std::vector<std::string>{"put 3 from 0 pending 3", "put 3 from 3 pending 1", "put 1 from 6 pending 0"}));
}

TEST_F(StagingPipelineTest, BadCallsAreRefusedBeforeAnyTransfer) {
  MakePipeline(4, 2);
  MakeDevice(3, 0);
  const auto fps = Fps(3);
  auto wrong_count = pipeline_->Get(io_, ns_, std::span(fps).first(2), 0, buffers_, nullptr);
  EXPECT_EQ(wrong_count.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_shard = pipeline_->Put(io_, ns_, fps, 1, buffers_, nullptr, 0);
  EXPECT_EQ(bad_shard.status().code(), absl::StatusCode::kInvalidArgument);
  auto short_buffers = buffers_;
  short_buffers[1].size_bytes -= 1;
  EXPECT_EQ(pipeline_->Get(io_, ns_, fps, 0, short_buffers, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto other_device = buffers_;
  other_device[2].device = 1;
  EXPECT_EQ(pipeline_->Get(io_, ns_, fps, 0, other_device, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto null_ptr = buffers_;
  null_ptr[0].ptr = nullptr;
  auto s = pipeline_->Put(io_, ns_, fps, 0, null_ptr, nullptr, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("device buffer 0"), std::string::npos) << s;
  Namespace big = ns_;
  big.layout.num_layers = 1 << 16;  // 64 K layers x 256 B > the 1 MiB staging buffers
  std::vector<DeviceBuffer> big_buffers(1,
                                        {.device = 0, .ptr = device_[0].data(), .size_bytes = big.layout.ShardBytes()});
  s = pipeline_->Get(io_, big, std::span(fps).first(1), 0, big_buffers, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("staging_buffer_bytes"), std::string::npos) << s;
  EXPECT_TRUE(io_.blocks.empty());
  EXPECT_TRUE(Only("get").empty());
}

TEST(DeviceTransferOptionsTest, ValidateNamesTheBadField) {
  EXPECT_OK(DeviceTransferOptions{}.Validate());
  auto s = DeviceTransferOptions{.staging_buffers = 0}.Validate();
  EXPECT_NE(s.message().find("staging_buffers"), std::string::npos) << s;
  s = DeviceTransferOptions{.staging_buffers = 17}.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = DeviceTransferOptions{.batch_blocks = 0}.Validate();
  EXPECT_NE(s.message().find("batch_blocks"), std::string::npos) << s;
  s = DeviceTransferOptions{.staging_buffer_bytes = 0}.Validate();
  EXPECT_NE(s.message().find("staging_buffer_bytes"), std::string::npos) << s;
  s = DeviceTransferOptions{.device = -1}.Validate();
  EXPECT_NE(s.message().find("device"), std::string::npos) << s;
}

TEST(StagingPipelineLifetimeTest, DestructionWaitsForPendingCopiesThenFreesEverySlot) {
  std::vector<std::string> log;
  auto engine = std::make_unique<DeferredCopyEngine>(&log);
  DeferredCopyEngine* raw = engine.get();
  auto p = StagingPipeline::Create(std::move(engine),
                                   {.batch_blocks = 2, .staging_buffers = 3, .staging_buffer_bytes = 4096});
  ASSERT_OK(p);
  FakeBlockIo io(&log, &raw);
  Namespace ns = SmallNamespace();
  std::vector<std::byte> dev(ns.layout.ShardBytes(), std::byte{9});
  std::vector<DeviceBuffer> b = {{.device = 0, .ptr = dev.data(), .size_bytes = dev.size()}};
  std::vector<Fingerprint> fps = {Fp(1)};
  ASSERT_OK((*p)->Put(io, ns, fps, 0, b, nullptr, 0));
  std::fill(dev.begin(), dev.end(), std::byte{0});
  ASSERT_OK((*p)->Get(io, ns, fps, 0, b, nullptr));
  EXPECT_EQ(raw->pending_copies(), 1u);
  log.clear();
  p->reset();
  EXPECT_EQ(dev[0], std::byte{9}) << "the pending copy never ran";
  // Slot 1 holds the pending copy: it runs before that slot is freed, and all three slots are freed.
  EXPECT_EQ(log, (std::vector<std::string>{"wait 0", "free", "wait 1", "run h2d", "free", "wait 2", "free"}));
}

}  // namespace
}  // namespace kvtier::client::internal
