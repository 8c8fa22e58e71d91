#include "cache_service.h"

#include <algorithm>

#include "kvtier/wire/wire.h"
#include "rpc_scope.h"

namespace kvtier::server {

CacheServiceImpl::CacheServiceImpl(const ServerOptions& options, BlockStore& store, ServerMetrics& metrics,
                                   BlockRequests& requests, const Authenticator& auth)
    : options_(options), store_(store), metrics_(metrics), requests_(requests), auth_(auth) {}

grpc::Status CacheServiceImpl::Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                                      v1::LookupResponse* resp) {
  RpcScope rpc(metrics_, "Lookup");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  return rpc.Return(wire::ToGrpc(requests_.Lookup(who, *req, resp)));
}

grpc::Status CacheServiceImpl::Allocate(grpc::ServerContext* ctx, const v1::AllocateRequest* req,
                                        v1::AllocateResponse* resp) {
  RpcScope rpc(metrics_, "Allocate");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  // A caller that has given up (deadline passed while the request waited, e.g. in a stopped process)
  // will never write or commit: reserving for it would hold slots until reservation_ttl.
  return rpc.Return(wire::ToGrpc(requests_.Allocate(
      who, *req, [ctx] { return ctx->IsCancelled(); }, resp)));
}

grpc::Status CacheServiceImpl::WriteBlocks(grpc::ServerContext* ctx, grpc::ServerReader<v1::WriteBlocksRequest>* reader,
                                           v1::WriteBlocksResponse* resp) {
  RpcScope rpc(metrics_, "WriteBlocks");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  v1::WriteBlocksRequest chunk;
  uint64_t written = 0;
  while (reader->Read(&chunk)) {
    const std::string& data = chunk.data();
    absl::Status s =
        requests_.Write(who, CapabilityId::FromWire(chunk.reservation_id()), chunk.index(), chunk.offset(),
                        std::span<const std::byte>(reinterpret_cast<const std::byte*>(data.data()), data.size()));
    if (!s.ok()) {
      metrics_.CountTransfer(ServerMetrics::Direction::kWrite, ServerMetrics::Transport::kGrpc, written);
      return rpc.Return(wire::ToGrpc(s));
    }
    written += data.size();
  }
  metrics_.CountTransfer(ServerMetrics::Direction::kWrite, ServerMetrics::Transport::kGrpc, written);
  resp->set_bytes_written(written);
  return rpc.Return(grpc::Status::OK);
}

grpc::Status CacheServiceImpl::Commit(grpc::ServerContext* ctx, const v1::CommitRequest* req,
                                      v1::CommitResponse* resp) {
  RpcScope rpc(metrics_, "Commit");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  return rpc.Return(wire::ToGrpc(requests_.Commit(who, *req, resp)));
}

grpc::Status CacheServiceImpl::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* req, v1::AbortResponse*) {
  RpcScope rpc(metrics_, "Abort");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  requests_.Abort(who, CapabilityId::FromWire(req->reservation_id()));  // unknown and foreign ids alike: OK
  return rpc.Return(grpc::Status::OK);
}

grpc::Status CacheServiceImpl::Read(grpc::ServerContext* ctx, const v1::ReadRequest* req,
                                    grpc::ServerWriter<v1::ReadResponse>* writer) {
  RpcScope rpc(metrics_, "Read");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  auto admitted = requests_.Admit(who, req->namespace_(), req->keys());
  if (!admitted.ok()) return rpc.Return(wire::ToGrpc(admitted.status()));
  v1::ReadResponse head;
  BlockStore::ReadLease lease = requests_.LeaseAdmitted(*admitted, req->lease_ms(), &head);
  const grpc::Status gone(grpc::StatusCode::CANCELLED, "client went away");
  if (admitted->shadow) return rpc.Return(writer->Write(head) ? grpc::Status::OK : gone);
  if (req->status_only()) {
    // The bytes go over UCX; the lease stays until Release, the UCX request's release, or expiry.
    if (!writer->Write(head) && !lease.lease_id.null()) {
      store_.Release(std::span<const CapabilityId>(&lease.lease_id, 1));
      return rpc.Return(gone);
    }
    return rpc.Return(grpc::Status::OK);
  }
  grpc::Status status = writer->Write(head) ? grpc::Status::OK : gone;
  v1::ReadResponse chunk;
  uint64_t sent = 0;
  for (size_t i = 0; status.ok() && i < lease.blocks.size(); ++i) {
    const ReadBlockInfo& b = lease.blocks[i];
    if (!b.present) continue;
    for (uint64_t off = 0; off < b.size_bytes && status.ok(); off += options_.stream_chunk_bytes) {
      if (ctx->IsCancelled()) {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
        break;
      }
      const uint64_t n = std::min<uint64_t>(options_.stream_chunk_bytes, b.size_bytes - off);
      chunk.set_index(static_cast<uint32_t>(i));
      chunk.set_offset(off);
      std::string* data = chunk.mutable_data();
      data->resize(n);
      absl::Status s = store_.CopyOut(lease.lease_id, static_cast<uint32_t>(i), off,
                                      std::span<std::byte>(reinterpret_cast<std::byte*>(data->data()), n));
      if (!s.ok()) {
        // The lease expired under a slow reader: abort so the client counts these blocks as misses.
        status = grpc::Status(grpc::StatusCode::ABORTED, std::string(s.message()));
        break;
      }
      if (!writer->Write(chunk)) {
        status = gone;
      } else {
        sent += n;
      }
    }
  }
  metrics_.CountTransfer(ServerMetrics::Direction::kRead, ServerMetrics::Transport::kGrpc, sent);
  if (!req->hold_lease() && !lease.lease_id.null()) store_.Release(std::span<const CapabilityId>(&lease.lease_id, 1));
  return rpc.Return(status);
}

grpc::Status CacheServiceImpl::Lease(grpc::ServerContext* ctx, const v1::ReadRequest* req, v1::ReadResponse* resp) {
  RpcScope rpc(metrics_, "Lease");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  if (absl::Status s = requests_.Lease(who, *req, resp); !s.ok()) return rpc.Return(wire::ToGrpc(s));
  if (ctx->IsCancelled() && !resp->lease_id().empty()) {  // nobody will use or release it
    const CapabilityId id = CapabilityId::FromWire(resp->lease_id());
    store_.Release(std::span<const CapabilityId>(&id, 1));
    return rpc.Return(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
  }
  return rpc.Return(grpc::Status::OK);
}

grpc::Status CacheServiceImpl::OpenUcxSession(grpc::ServerContext* ctx, const v1::OpenUcxSessionRequest*,
                                              v1::OpenUcxSessionResponse* resp) {
  RpcScope rpc(metrics_, "OpenUcxSession");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  if (ucx_sessions_ == nullptr) {
    return rpc.Return(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this server has no UCX listener"));
  }
  auto ticket = ucx_sessions_->Open(who);
  if (!ticket.ok()) return rpc.Return(wire::ToGrpc(ticket.status()));
  resp->set_ticket(*std::move(ticket));
  resp->set_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(ucx_sessions_->ttl())));
  resp->set_required(ucx_sessions_->required());
  return rpc.Return(grpc::Status::OK);
}

grpc::Status CacheServiceImpl::Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                                       v1::ReleaseResponse* resp) {
  RpcScope rpc(metrics_, "Release");
  Principal who;
  if (grpc::Status s = auth_.Authenticate(*ctx, &who); !s.ok()) return rpc.Return(s);
  std::vector<CapabilityId> ids;
  ids.reserve(req->lease_ids_size());
  for (const std::string& id : req->lease_ids()) ids.push_back(CapabilityId::FromWire(id));
  // Unknown, ended and other tenants' leases are skipped alike (and not counted).
  resp->set_released(requests_.Release(who, ids));
  return rpc.Return(grpc::Status::OK);
}

}  // namespace kvtier::server
