#include "client/grpc_block_path.h"

#include <cstring>
#include <vector>

#include "client/two_phase_put.h"
#include "kvtier/common/checksum.h"
#include "kvtier/wire/wire.h"

namespace kvtier::client {

bool GrpcBlockPath::Read(const ReadBatchRequest& batch, CallRefusal& refusal) {
  Member& member = member_;
  const std::span<const BlockKey> keys = batch.keys;
  const std::span<const uint32_t> idx = batch.idx;
  const uint64_t block_bytes = batch.block_bytes;
  const std::span<const std::span<std::byte>> buffers = batch.buffers;
  const std::span<GetResult> results = batch.results;
  v1::ReadRequest req;
  *req.mutable_namespace_() = *batch.pns;
  wire::EncodeKeys(keys, req.mutable_keys());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(batch.deadline));
  auto reader = member.cache->Read(&ctx, req);
  v1::ReadResponse msg;
  std::vector<uint64_t> received(idx.size(), 0);
  std::vector<v1::BlockStatus> status;
  bool protocol_ok = true;
  const bool have_head = reader->Read(&msg);  // false: the stream ended, with an error (Finish says which)
  if (have_head && static_cast<size_t>(msg.blocks_size()) == idx.size()) {
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
    if (have_head) ctx.TryCancel();  // don't wait for the rest of a stream we cannot use
  }
  const grpc::Status st = reader->Finish();
  if (!st.ok() || !protocol_ok) stats_.rpc_errors.fetch_add(1, std::memory_order_relaxed);
  if (const absl::Status s = wire::FromGrpc(st); IsRefusal(s.code())) refusal.Record(member.Refused("Read", s));
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
  return true;
}

std::optional<absl::Status> GrpcBlockPath::Put(const PutBatchRequest& batch) {
  return TwoPhasePut(PutPath{.member = &member_, .options = &options_, .stats = &stats_, .ucx = nullptr}, batch);
}

}  // namespace kvtier::client
