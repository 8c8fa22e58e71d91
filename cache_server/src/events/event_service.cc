#include "events/event_service.h"

#include <prometheus/metric_family.h>

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

namespace {

class EventMetrics final : public prometheus::Collectable {
 public:
  explicit EventMetrics(const EventPublisher& publisher) : publisher_(publisher) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const EventPublisherStats& s = publisher_.stats();
    auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
    std::vector<prometheus::MetricFamily> out;
    auto family = [&](const char* name, const char* help, prometheus::MetricType type,
                      std::vector<std::pair<std::vector<prometheus::ClientMetric::Label>, double>> values) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      for (auto& [labels, value] : values) {
        prometheus::ClientMetric m;
        m.label = std::move(labels);
        if (type == prometheus::MetricType::Counter)
          m.counter.value = value;
        else
          m.gauge.value = value;
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    };
    using prometheus::MetricType;
    family("kvtier_events_total", "KV events numbered (block stored, removed, moved, all cleared).",
           MetricType::Counter, {{{}, v(s.events)}});
    family("kvtier_events_published_total", "KV events sent on the PUB socket.", MetricType::Counter,
           {{{}, v(s.published_events)}});
    family("kvtier_event_batches_published_total", "PUB messages sent, heartbeats included.", MetricType::Counter,
           {{{}, v(s.published_batches)}});
    family("kvtier_events_unpublished_total", "KV events that left the replay buffer before being published.",
           MetricType::Counter, {{{}, v(s.unpublished_events)}});
    const double rejected = v(s.replay_out_of_range);
    family("kvtier_event_replay_requests_total",
           "Replay requests, by result (out_of_range: the subscriber "
           "must take a snapshot).",
           MetricType::Counter,
           {{{{"result", "ok"}}, v(s.replay_requests) - rejected}, {{{"result", "out_of_range"}}, rejected}});
    family("kvtier_event_replayed_total", "KV events served by Replay.", MetricType::Counter,
           {{{}, v(s.replayed_events)}});
    family("kvtier_event_snapshot_requests_total", "Snapshot requests served.", MetricType::Counter,
           {{{}, v(s.snapshot_requests)}});
    const double malformed = v(s.vllm_replay_bad_requests);
    family("kvtier_event_vllm_batches_published_total", "vLLM-format KV event batches sent on the vLLM PUB socket.",
           MetricType::Counter, {{{}, v(s.vllm_published_batches)}});
    family("kvtier_event_vllm_replay_requests_total",
           "Requests on the vLLM replay socket, by result (malformed: ignored, or answered with the end marker "
           "only).",
           MetricType::Counter,
           {{{{"result", "ok"}}, v(s.vllm_replay_requests)}, {{{"result", "malformed"}}, malformed}});
    family("kvtier_event_vllm_replayed_batches_total", "vLLM-format batches sent by the replay socket.",
           MetricType::Counter, {{{}, v(s.vllm_replayed_batches)}});
    family("kvtier_event_last_seq", "The latest KV event sequence number of this server instance.", MetricType::Gauge,
           {{{}, static_cast<double>(publisher_.last_seq())}});
    return out;
  }

 private:
  const EventPublisher& publisher_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> NewEventMetrics(const EventPublisher& publisher) {
  return std::make_shared<EventMetrics>(publisher);
}

}  // namespace kvtier::server
