#include "client/staging_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtier/common/status_macros.h"

namespace kvtier::client {

absl::Status DeviceTransferOptions::Validate() const {
  if (device < 0) return absl::InvalidArgumentError(absl::StrCat("device: ", device, " is negative"));
  if (batch_blocks == 0) return absl::InvalidArgumentError("batch_blocks: must be > 0");
  if (staging_buffers == 0 || staging_buffers > 16) {
    return absl::InvalidArgumentError(absl::StrCat("staging_buffers: ", staging_buffers, " is not in 1..16"));
  }
  if (staging_buffer_bytes == 0) return absl::InvalidArgumentError("staging_buffer_bytes: must be > 0");
  return absl::OkStatus();
}

namespace internal {

absl::StatusOr<std::unique_ptr<StagingPipeline>> StagingPipeline::Create(std::unique_ptr<CopyEngine> engine,
                                                                         const DeviceTransferOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  if (engine == nullptr) return absl::InvalidArgumentError("no copy engine");
  auto p = std::unique_ptr<StagingPipeline>(new StagingPipeline(std::move(engine), options));
  KVTIER_RETURN_IF_ERROR(p->engine_->Activate());
  for (uint32_t i = 0; i < options.staging_buffers; ++i) {
    KVTIER_ASSIGN_OR_RETURN(std::byte * slot, p->engine_->AllocateStaging(options.staging_buffer_bytes));
    p->slots_.push_back(slot);
  }
  return p;
}

StagingPipeline::StagingPipeline(std::unique_ptr<CopyEngine> engine, const DeviceTransferOptions& options)
    : engine_(std::move(engine)), options_(options) {}

StagingPipeline::~StagingPipeline() {
  if (slots_.empty()) return;
  (void)engine_->Activate();
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    (void)engine_->Wait(i);  // a copy may still read or write the slot
    engine_->FreeStaging(slots_[i]);
  }
}

uint32_t StagingPipeline::BlocksPerBatch(uint64_t block_bytes) const {
  if (block_bytes == 0) return options_.batch_blocks;
  return static_cast<uint32_t>(std::min<uint64_t>(options_.batch_blocks, options_.staging_buffer_bytes / block_bytes));
}

absl::StatusOr<uint64_t> StagingPipeline::CheckCall(const Namespace& ns, size_t num_fps, uint32_t shard,
                                                    std::span<const DeviceBuffer> buffers) {
  KVTIER_RETURN_IF_ERROR(ns.Validate());
  if (buffers.size() != num_fps) {
    return absl::InvalidArgumentError(absl::StrCat(num_fps, " fingerprints but ", buffers.size(), " device buffers"));
  }
  if (shard >= ns.layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " >= tp_size ", ns.layout.tp_size));
  }
  const uint64_t block_bytes = ns.layout.ShardBytes();
  if (block_bytes > options_.staging_buffer_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("block is ", block_bytes, " bytes, staging_buffer_bytes is ", options_.staging_buffer_bytes));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].size_bytes != block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("device buffer ", i, " is ", buffers[i].size_bytes, " bytes, want ", block_bytes));
    }
    if (buffers[i].device != options_.device) {
      return absl::InvalidArgumentError(absl::StrCat("device buffer ", i, " is on device ", buffers[i].device,
                                                     ", this DeviceTransfer serves device ", options_.device));
    }
    absl::Status s = engine_->CheckDeviceBuffer(buffers[i]);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("device buffer ", i, ": ", s.message()));
  }
  return block_bytes;
}

absl::StatusOr<std::vector<GetResult>> StagingPipeline::Get(HostBlockIo& io, const Namespace& ns,
                                                            std::span<const Fingerprint> fps, uint32_t shard,
                                                            std::span<const DeviceBuffer> buffers, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  KVTIER_RETURN_IF_ERROR(engine_->Activate());
  KVTIER_ASSIGN_OR_RETURN(const uint64_t block_bytes, CheckCall(ns, fps.size(), shard, buffers));
  const size_t per_batch = BlocksPerBatch(block_bytes);
  std::vector<GetResult> results(fps.size(), GetResult::kMiss);
  // Blocks a device path delivered straight into their buffers are done; the rest (`rest`, positions
  // in the call) are staged.
  KVTIER_ASSIGN_OR_RETURN(const std::vector<bool> arrived, io.GetIntoDevice(ns, fps, shard, buffers, stream));
  if (arrived.size() != fps.size()) {
    return absl::InternalError(absl::StrCat("device get returned ", arrived.size(), " results for ", fps.size()));
  }
  std::vector<uint32_t> rest;
  std::vector<Fingerprint> rest_fps;
  for (uint32_t i = 0; i < fps.size(); ++i) {
    if (arrived[i]) {
      results[i] = GetResult::kHit;
    } else {
      rest.push_back(i);
      rest_fps.push_back(fps[i]);
    }
  }
  std::vector<std::span<std::byte>> views;
  for (size_t start = 0; start < rest.size(); start += per_batch) {
    const size_t count = std::min(per_batch, rest.size() - start);
    const uint32_t slot = next_slot_;
    next_slot_ = (next_slot_ + 1) % slots_.size();
    // The slot's previous host-to-device copies (this call's or an earlier one's) must have run
    // before the network overwrites it.
    KVTIER_RETURN_IF_ERROR(engine_->Wait(slot));
    views.clear();
    for (size_t j = 0; j < count; ++j) views.emplace_back(slots_[slot] + j * block_bytes, block_bytes);
    KVTIER_ASSIGN_OR_RETURN(std::vector<GetResult> got,
                            io.Get(ns, std::span<const Fingerprint>(rest_fps).subspan(start, count), shard, views));
    if (got.size() != count) {
      return absl::InternalError(absl::StrCat("host get returned ", got.size(), " results for ", count, " blocks"));
    }
    for (size_t j = 0; j < count; ++j) {
      const uint32_t i = rest[start + j];
      results[i] = got[j];
      if (got[j] != GetResult::kHit) continue;
      KVTIER_RETURN_IF_ERROR(
          engine_->CopyAsync(CopyKind::kHostToDevice, buffers[i].ptr, views[j].data(), block_bytes, stream));
      stats_.host_to_device_bytes.fetch_add(block_bytes, std::memory_order_relaxed);
    }
    KVTIER_RETURN_IF_ERROR(engine_->Record(slot, stream));
    stats_.batches.fetch_add(1, std::memory_order_relaxed);
  }
  return results;
}

absl::StatusOr<std::vector<PutResult>> StagingPipeline::Put(HostBlockIo& io, const Namespace& ns,
                                                            std::span<const Fingerprint> fps, uint32_t shard,
                                                            std::span<const DeviceBuffer> blocks, void* stream,
                                                            uint32_t first_block_index) {
  std::lock_guard<std::mutex> lock(mu_);
  KVTIER_RETURN_IF_ERROR(engine_->Activate());
  KVTIER_ASSIGN_OR_RETURN(const uint64_t block_bytes, CheckCall(ns, fps.size(), shard, blocks));
  const size_t per_batch = BlocksPerBatch(block_bytes);
  const size_t num_batches = (fps.size() + per_batch - 1) / per_batch;
  const uint32_t num_slots = static_cast<uint32_t>(slots_.size());
  const uint32_t base_slot = next_slot_;
  auto slot_of = [&](size_t batch) { return static_cast<uint32_t>((base_slot + batch) % num_slots); };
  // Enqueues the device-to-host copies of `batch` into its slot. The slot's last user was batch
  // `batch - num_slots`, whose Put has returned, or an earlier call (Wait covers its copies).
  auto stage = [&](size_t batch) -> absl::Status {
    const uint32_t slot = slot_of(batch);
    KVTIER_RETURN_IF_ERROR(engine_->Wait(slot));
    const size_t start = batch * per_batch;
    const size_t count = std::min(per_batch, fps.size() - start);
    for (size_t j = 0; j < count; ++j) {
      KVTIER_RETURN_IF_ERROR(engine_->CopyAsync(CopyKind::kDeviceToHost, slots_[slot] + j * block_bytes,
                                                blocks[start + j].ptr, block_bytes, stream));
    }
    stats_.device_to_host_bytes.fetch_add(count * block_bytes, std::memory_order_relaxed);
    return engine_->Record(slot, stream);
  };
  std::vector<PutResult> results;
  results.reserve(fps.size());
  std::vector<std::span<const std::byte>> views;
  size_t staged = 0;
  for (size_t batch = 0; batch < num_batches; ++batch) {
    // Keep up to num_slots - 1 batches of copies ahead of the network.
    while (staged < num_batches && staged < batch + num_slots) KVTIER_RETURN_IF_ERROR(stage(staged++));
    const uint32_t slot = slot_of(batch);
    KVTIER_RETURN_IF_ERROR(engine_->Wait(slot));  // its device-to-host copies have landed
    const size_t start = batch * per_batch;
    const size_t count = std::min(per_batch, fps.size() - start);
    views.clear();
    for (size_t j = 0; j < count; ++j) views.emplace_back(slots_[slot] + j * block_bytes, block_bytes);
    KVTIER_ASSIGN_OR_RETURN(std::vector<PutResult> put, io.Put(ns, fps.subspan(start, count), shard, views,
                                                               first_block_index + static_cast<uint32_t>(start)));
    if (put.size() != count) {
      return absl::InternalError(absl::StrCat("host put returned ", put.size(), " results for ", count, " blocks"));
    }
    results.insert(results.end(), put.begin(), put.end());
    stats_.batches.fetch_add(1, std::memory_order_relaxed);
  }
  next_slot_ = slot_of(num_batches);
  return results;
}

}  // namespace internal
}  // namespace kvtier::client
