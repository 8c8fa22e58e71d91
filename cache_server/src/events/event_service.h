// gRPC implementation of kvtier.v1.EventService (proto/kvtier/v1/events.proto) over an EventPublisher.
#ifndef KVTIER_SERVER_SRC_EVENTS_EVENT_SERVICE_H_
#define KVTIER_SERVER_SRC_EVENTS_EVENT_SERVICE_H_

#include <memory>

#include "events/event_publisher.h"
#include "kvtier/server/block_store.h"
#include "kvtier/v1/events.grpc.pb.h"

namespace kvtier::server {

class Authenticator;

// Serves GetEventsInfo, Replay and Snapshot. Borrows `publisher` and `store` for its lifetime (the
// server owns all three and stops gRPC first). Thread-safety: gRPC calls the methods concurrently.
class EventServiceImpl final : public v1::EventService::Service {
 public:
  static constexpr size_t kSnapshotChunkBlocks = 4096;

  // `auth`, when not null, must outlive the service: with authentication on, every RPC needs an admin
  // token (events describe the blocks of every tenant).
  EventServiceImpl(EventPublisher& publisher, const BlockStore& store, const Authenticator* auth = nullptr)
      : publisher_(publisher), store_(store), auth_(auth) {}

  grpc::Status GetEventsInfo(grpc::ServerContext* ctx, const v1::GetEventsInfoRequest* req,
                             v1::GetEventsInfoResponse* resp) override;
  grpc::Status Replay(grpc::ServerContext* ctx, const v1::ReplayRequest* req,
                      grpc::ServerWriter<v1::KvEventBatch>* writer) override;
  grpc::Status Snapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req,
                        grpc::ServerWriter<v1::SnapshotChunk>* writer) override;

 private:
  EventPublisher& publisher_;
  const BlockStore& store_;
  const Authenticator* auth_;
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_EVENTS_EVENT_SERVICE_H_
