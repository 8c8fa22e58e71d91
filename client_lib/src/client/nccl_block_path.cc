#include "client/nccl_block_path.h"

#include <vector>

namespace kvtier::client {

bool NcclBlockPath::Read(const ReadBatchRequest& batch, CallRefusal&) {
  if (batch.device_buffers.empty() || batch.ns == nullptr) return false;
  std::vector<nccl::DeviceSpan> spans;
  spans.reserve(batch.idx.size());
  for (uint32_t i : batch.idx) spans.push_back({batch.device_buffers[i].ptr, batch.device_buffers[i].size_bytes});
  const auto fetched = worker_.Fetch(*batch.ns, batch.keys, spans, batch.stream);
  if (!fetched.ok() || fetched->size() != batch.keys.size()) {  // the call was checked: not expected
    stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  bool failed = false;
  uint64_t arrived = 0;
  for (size_t k = 0; k < batch.keys.size(); ++k) {
    GetResult& r = batch.results[batch.idx[k]];
    switch ((*fetched)[k]) {
      case nccl::NcclFetchResult::kHit:
        r = GetResult::kHit;
        ++arrived;
        break;
      case nccl::NcclFetchResult::kMiss:
        r = GetResult::kMiss;
        break;
      case nccl::NcclFetchResult::kError:
        r = GetResult::kMissFromError;
        failed = true;
        break;
    }
  }
  stats_.nccl_get_blocks.fetch_add(arrived, std::memory_order_relaxed);
  if (failed) stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::optional<absl::Status> NcclBlockPath::Put(const PutBatchRequest&) { return std::nullopt; }

}  // namespace kvtier::client
