#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/log.h"
#include "ucx_server_impl.h"

namespace kvtier::ucx {

void UcxServer::Impl::MaintenanceIfDue() {
  worker->ReapCloses();
  if (!to_close.empty()) {
    // UCX reports some peer failures even without error handling (a tcp connection that broke):
    // close at once, which also cancels that client's unmatched receives.
    KVTIER_LOG_EVERY(std::chrono::seconds(10), info, "kvtier-server: {} UCX endpoints failed (peer gone); closed",
                     to_close.size());
    for (EpId id : std::vector<EpId>(std::move(to_close))) CloseEp(id);
    to_close.clear();
  }
  const absl::Time now = absl::Now();
  if (now >= next_pending_sweep) {
    next_pending_sweep = now + kPendingSweepInterval;
    const PendingConnectionReaper::SweepResult swept = reaper->Sweep(now);
    source->SetPendingConnections(swept.pending - swept.timed_out - swept.over_limit);
    if (swept.timed_out + swept.over_limit > 0) {
      source->CountPendingConnectionResets(swept.timed_out, swept.over_limit);
      KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                       "kvtier-server: reset {} connections to the UCX port that sent no valid connection request "
                       "within {} and {} beyond {} pending from one host",
                       swept.timed_out, absl::FormatDuration(options.pending_connection_timeout), swept.over_limit,
                       options.max_pending_connections_per_host);
    }
  }
  for (size_t i = 0; i < unproven.size();) {
    if (unproven[i].second <= now) {
      if (!sessions_of.contains(unproven[i].first)) CloseEp(unproven[i].first);
      unproven[i] = unproven.back();
      unproven.pop_back();
    } else {
      ++i;
    }
  }
  for (size_t i = 0; i < refused.size();) {
    if (refused[i].second <= now) {
      CloseEp(refused[i].first);
      refused[i] = refused.back();
      refused.pop_back();
    } else {
      ++i;
    }
  }
  if (now < next_sweep) return;
  next_sweep = now + kSweepInterval;
  // Transfers past their deadline (transfer_timeout, or the expiry of the lease or reservation they
  // pin, whichever comes first): cancel receives not matched yet; force-close the endpoint of
  // anything else (a send waiting for its client, a receive whose cancel did nothing because it was
  // matched: its data stopped coming). Endpoints run without peer failure handling (see the class
  // comment), so this is how a writer that died or stalled mid-put gives its keys back by its
  // reservation's expiry rather than transfer_timeout later. UCX 1.13 does not always complete such
  // requests when their endpoint closes (in error mode NONE, after the client died; a receive
  // matched over tcp never does); those are abandoned kAbandonGrace after the close, a send not
  // before its deadline: unpinned and counted, the request left to UCX. Nothing can still write a
  // receive's slot then (its endpoint, the only way in, is closed), and a late read of a send's slot
  // by a client still running would fail that client's checksum check.
  const absl::Duration grace = std::min(options.transfer_timeout, kAbandonGrace);
  std::vector<Op*> late;  // past the deadline, or on an endpoint closed (e.g. failed) a grace ago
  for (Op* op : inflight) {
    if (now >= op->deadline || now - op->closed > grace) late.push_back(op);
  }
  absl::flat_hash_set<EpId> close;
  uint64_t given_up = 0;
  for (Op* op : late) {
    if (!inflight.contains(op)) continue;  // completed by an earlier cancel's callback chain
    const bool is_recv = op->batch->is_put;
    if (is_recv && !op->cancel_requested) {
      op->cancel_requested = true;
      ucp_request_cancel(worker->get(), op->request);  // may complete (and free) op right here
      // Still in flight: it was matched, its data partly in. Close its endpoint now (below).
      if (!inflight.contains(op)) continue;
    }
    // A receive's slot is safe to give up once its endpoint has been closed a while; a send's only
    // at its deadline too (a client still running may read the slot until it gives up itself).
    if (now - op->closed > grace && (is_recv || now >= op->deadline)) {
      Abandon(op);
      ++given_up;
      continue;
    }
    if (now >= op->deadline && op->closed == absl::InfiniteFuture()) close.insert(op->ep);
  }
  for (EpId id : close) CloseEp(id);
  if (!close.empty()) {
    KVTIER_LOG_EVERY(std::chrono::seconds(10), warn,
                     "kvtier-server: force-closed {} UCX endpoints with transfers past their deadline (a client "
                     "that died or stalled mid-transfer)",
                     close.size());
  }
  if (given_up > 0) {
    KVTIER_LOG(warn, "kvtier-server: gave up on {} UCX transfers of closed endpoints", given_up);
  }
}

void UcxServer::Impl::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  Op* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  op->request = nullptr;
  op->impl->Completed(op, status, op->size);
}

void UcxServer::Impl::OnRecvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  Op* op = static_cast<Op*>(user_data);
  const uint64_t length = status == UCS_OK && info != nullptr ? info->length : 0;
  ucp_request_free(request);
  op->request = nullptr;
  op->impl->Completed(op, status, length);
}

void UcxServer::Impl::StartGet(EpId ep, const msg::GetRequest& req, const Principal& who) {
  auto* batch = new Batch{.is_put = false,
                          .who = who,
                          .request_id = req.request_id,
                          .id = req.lease_id,
                          .flags = req.flags,
                          .ep = ep,
                          .ok = std::vector<uint8_t>(req.indices.size(), 0),
                          .remaining = req.indices.size(),
                          .indices = req.indices,
                          .tag_base = req.tag_base};
  // A window of sends: with every block's rendezvous in flight at once, UCX interleaves their
  // fragments and every block lands at the end; a window makes blocks land one after another, so the
  // client verifies each while the next moves (and while it is still in cache).
  while (batch->next < batch->indices.size() && batch->in_flight_bytes < kSendWindowBytes) PostNextSend(batch);
}

void UcxServer::Impl::PostNextSend(Batch* batch) {
  static const std::byte kEmpty{};
  const uint32_t j = static_cast<uint32_t>(batch->next++);
  const absl::Time now = absl::Now();
  auto* op = new Op{.impl = this,
                    .batch = batch,
                    .slot = j,
                    .index = batch->indices[j],
                    .ep = batch->ep,
                    .start = now,
                    .deadline = now + options.transfer_timeout};
  const std::byte* data = &kEmpty;
  auto pinned = source->PinForSend(batch->who, batch->id, op->index);  // unknown id: an empty message
  if (pinned.ok()) {
    op->pinned = true;
    op->size = pinned->size_bytes;
    op->deadline = std::min(op->deadline, now + pinned->expires_in);
    data = pinned->data;
  }
  batch->in_flight_bytes += std::max<uint64_t>(op->size, 1);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &Impl::OnSendDone;
  p.user_data = op;
  if (memh != nullptr && op->pinned && data >= region && data + op->size <= region + region_bytes) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  auto it = eps.find(batch->ep);
  ucs_status_ptr_t r = it != eps.end() ? ucp_tag_send_nbx(it->second, data, op->size, batch->tag_base + j, &p)
                                       : UCS_STATUS_PTR(UCS_ERR_CANCELED);  // closed meanwhile
  Track(op, r);
}

void UcxServer::Impl::StartPut(EpId ep, const msg::PutRequest& req, uint64_t put_tag_key, const Principal& who) {
  auto* batch = new Batch{.is_put = true,
                          .who = who,
                          .request_id = req.request_id,
                          .id = req.reservation_id,
                          .ep = ep,
                          .ok = std::vector<uint8_t>(req.indices.size(), 0),
                          .remaining = req.indices.size()};
  if (req.indices.empty()) {
    FinishBatch(batch);
    return;
  }
  put_batches[{ep, batch->request_id}] = batch;  // a second kPut of one request id: the first keeps its commit
  const absl::Time now = absl::Now();
  std::optional<bool> tag_free;  // PutTagFreeFor(id), asked once, when a block cannot be pinned
  for (uint32_t j = 0; j < req.indices.size(); ++j) {
    auto* op = new Op{.impl = this,
                      .batch = batch,
                      .slot = j,
                      .index = req.indices[j],
                      .ep = ep,
                      .start = now,
                      .deadline = now + options.transfer_timeout};
    if (op->index > msg::kMaxTagIndex) {
      deferred.push_back({op, UCS_ERR_INVALID_PARAM});  // the client cannot have a valid tag for it
      continue;
    }
    std::byte* data = nullptr;
    // The kPut's full id is checked here (a tag is no capability): only a live id of the endpoint's
    // tenant pins its slots.
    auto pinned = source->PinForReceive(batch->who, req.reservation_id, op->index);
    if (pinned.ok()) {
      op->pinned = true;
      op->size = pinned->size_bytes;
      op->deadline = std::min(op->deadline, now + pinned->expires_in);
      data = pinned->data;
      op->data = data;
    } else {
      // A zero-byte receive drains the client's message (truncated), so its send completes; but not
      // on a tag of another live reservation (a wrong id sharing its tag prefix): that message is not
      // this request's to take.
      if (!tag_free.has_value()) tag_free = source->PutTagFreeFor(req.reservation_id);
      if (!*tag_free) {
        deferred.push_back({op, UCS_ERR_INVALID_PARAM});
        continue;
      }
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = &Impl::OnRecvDone;
    p.user_data = op;
    if (memh != nullptr && op->pinned) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = memh;
    }
    ucs_status_ptr_t r =
        ucp_tag_recv_nbx(worker->get(), data, op->size, msg::SessionPutTag(req.reservation_id, op->index, put_tag_key),
                         kFullTagMask, &p);
    Track(op, r);
  }
}

void UcxServer::Impl::Track(Op* op, ucs_status_ptr_t r) {
  if (UCS_PTR_IS_PTR(r)) {
    op->request = r;
    inflight.insert(op);
  } else {
    deferred.push_back({op, UCS_PTR_STATUS(r)});
  }
}

void UcxServer::Impl::RunDeferred() {
  while (!deferred.empty()) {
    std::vector<std::pair<Op*, ucs_status_t>> now;
    now.swap(deferred);
    for (auto [op, status] : now) Complete(op, status, status == UCS_OK ? op->size : 0);
  }
}

void UcxServer::Impl::Completed(Op* op, ucs_status_t status, uint64_t length) {
  if (op->abandoned) {  // settled already
    abandoned.erase(op);
    delete op;
    return;
  }
  Complete(op, status, length);
}

void UcxServer::Impl::Abandon(Op* op) {
  op->abandoned = true;
  abandoned.insert(op);
  Settle(op, UCS_ERR_CANCELED, 0);
}

void UcxServer::Impl::Complete(Op* op, ucs_status_t status, uint64_t length) {
  Settle(op, status, length);
  delete op;
}

void UcxServer::Impl::Settle(Op* op, ucs_status_t status, uint64_t length) {
  inflight.erase(op);
  Batch* batch = op->batch;
  op->batch = nullptr;
  bool ok = false;
  if (batch->is_put) {
    ok = op->pinned && status == UCS_OK && length == op->size;
    // Hash the block now, while it is in cache, so that Commit need not read it again. Abandoned ops
    // are not hashed: UCX may not be done with their slot.
    std::optional<uint64_t> sum;
    if (ok && !op->abandoned) sum = BlockChecksum(op->data, op->size);
    if (op->pinned) source->FinishReceive(batch->id, op->index, length, ok, sum);
    if (ok) {
      source->CountTransfer(TransferDirection::kWrite, length);
    } else {
      source->CountTransferError(TransferDirection::kWrite);
    }
  } else {
    ok = op->pinned && status == UCS_OK;
    if (op->pinned) source->UnpinSend(batch->id, op->index);
    batch->in_flight_bytes -= std::max<uint64_t>(op->size, 1);
    if (ok) {
      source->CountTransfer(TransferDirection::kRead, op->size);
    } else {
      source->CountTransferError(TransferDirection::kRead);
    }
  }
  batch->ok[op->slot] = ok ? 1 : 0;
  if (--batch->remaining == 0) {
    FinishBatch(batch);
    return;
  }
  if (!batch->is_put) {
    // Refill the send window. Immediate completions are deferred (Track), so this cannot recurse.
    while (batch->next < batch->indices.size() && batch->in_flight_bytes < kSendWindowBytes) PostNextSend(batch);
  }
}

void UcxServer::Impl::FinishBatch(Batch* batch) {
  if (batch->is_put) {
    if (auto it = put_batches.find({batch->ep, batch->request_id}); it != put_batches.end() && it->second == batch) {
      put_batches.erase(it);
    }
    if (batch->commit.has_value()) {
      // Every receive finished (each block hashed as it landed): the commit checks the client's checksums.
      PushCall(*std::move(batch->commit), "kPutCommit");
    } else {
      SendAm(batch->ep, msg::kPutDone, msg::Encode(msg::PutDone{.request_id = batch->request_id, .ok = batch->ok}));
    }
  } else if ((batch->flags & msg::kGetRelease) != 0) {  // never another tenant's lease (who)
    source->Release(batch->who, batch->id);
  }
  delete batch;
}

}  // namespace kvtier::ucx
