#include "events/event_service.h"

#include "auth.h"
#include "kvtier/wire/wire.h"

namespace kvtier::server {

grpc::Status EventServiceImpl::GetEventsInfo(grpc::ServerContext* ctx, const v1::GetEventsInfoRequest*,
                                             v1::GetEventsInfoResponse* resp) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->AuthorizeAdmin(*ctx); !s.ok()) return s;
  }
  resp->set_schema_version(v1::EVENT_SCHEMA_CURRENT);
  resp->set_node_id(publisher_.node_id());
  resp->set_instance_id(publisher_.instance_id());
  resp->set_pub_endpoint(publisher_.bound_endpoint());
  resp->set_oldest_replay_seq(publisher_.oldest_seq());
  resp->set_last_seq(publisher_.last_seq());
  return grpc::Status::OK;
}

grpc::Status EventServiceImpl::Replay(grpc::ServerContext* ctx, const v1::ReplayRequest* req,
                                      grpc::ServerWriter<v1::KvEventBatch>* writer) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->AuthorizeAdmin(*ctx); !s.ok()) return s;
  }
  const absl::Status s = publisher_.Replay(req->instance_id(), req->from_seq(), [&](const v1::KvEventBatch& b) {
    return !ctx->IsCancelled() && writer->Write(b);
  });
  return wire::ToGrpc(s);
}

grpc::Status EventServiceImpl::Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest*,
                                        grpc::ServerWriter<v1::SnapshotChunk>* writer) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->AuthorizeAdmin(*ctx); !s.ok()) return s;
  }
  publisher_.Snapshot(store_, kSnapshotChunkBlocks,
                      [&](const v1::SnapshotChunk& c) { return !ctx->IsCancelled() && writer->Write(c); });
  return grpc::Status::OK;
}

}  // namespace kvtier::server
