// The events section of the server config (docs/config.md, docs/events.md).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvtier/server/server_options.h"
#include "testing/status_matchers.h"

namespace kvtier::server {
namespace {

TEST(EventsConfigTest, OffByDefault) {
  auto o = ParseServerConfig("server:\n  node_id: n1\n");
  ASSERT_OK(o);
  EXPECT_FALSE(o->events_enabled);
  EXPECT_OK(o->Validate());
}

TEST(EventsConfigTest, ParsesEverySetting) {
  auto o = ParseServerConfig(
      "server:\n  node_id: n1\n"
      "events:\n  enabled: true\n  pub_endpoint: tcp://0.0.0.0:7402\n  replay_buffer_events: 1024\n"
      "  max_batch_events: 64\n  heartbeat_interval: 250ms\n");
  ASSERT_OK(o);
  EXPECT_TRUE(o->events_enabled);
  EXPECT_EQ(o->events_pub_endpoint, "tcp://0.0.0.0:7402");
  EXPECT_EQ(o->events_replay_buffer_events, 1024u);
  EXPECT_EQ(o->events_max_batch_events, 64u);
  EXPECT_EQ(o->events_heartbeat_interval, absl::Milliseconds(250));
  EXPECT_OK(o->Validate());
}

TEST(EventsConfigTest, BadValuesNameTheKey) {
  auto unknown = ParseServerConfig("events:\n  enable: true\n");
  EXPECT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("events.enable"), absl::string_view::npos);

  auto o = ParseServerConfig("server:\n  node_id: n1\nevents:\n  enabled: true\n  pub_endpoint: 0.0.0.0:7402\n");
  ASSERT_OK(o);
  EXPECT_NE(o->Validate().message().find("events.pub_endpoint"), absl::string_view::npos);
  o->events_pub_endpoint = "tcp://127.0.0.1:0";
  o->events_replay_buffer_events = 0;
  EXPECT_NE(o->Validate().message().find("events.replay_buffer_events"), absl::string_view::npos);
}

TEST(EventsConfigTest, VllmFormat) {
  auto d = ParseServerConfig("server:\n  node_id: n1\nevents:\n  enabled: true\n");
  ASSERT_OK(d);
  EXPECT_EQ(d->events_format, "kvtier");
  EXPECT_EQ(d->events_vllm_topic, "");
  EXPECT_EQ(d->events_vllm_replay_endpoint, "");
  EXPECT_EQ(d->events_vllm_block_hash, "int");
  EXPECT_EQ(d->events_vllm_encoding, "array");

  auto o = ParseServerConfig(
      "server:\n  node_id: n1\n"
      "events:\n  enabled: true\n  format: both\n  vllm_pub_endpoint: tcp://0.0.0.0:5557\n"
      "  vllm_replay_endpoint: tcp://0.0.0.0:5558\n  vllm_topic: kv\n  vllm_block_size: 64\n"
      "  vllm_block_hash: bytes\n  vllm_data_parallel_rank: 3\n  vllm_encoding: map\n");
  ASSERT_OK(o);
  EXPECT_EQ(o->events_format, "both");
  EXPECT_EQ(o->events_vllm_pub_endpoint, "tcp://0.0.0.0:5557");
  EXPECT_EQ(o->events_vllm_replay_endpoint, "tcp://0.0.0.0:5558");
  EXPECT_EQ(o->events_vllm_topic, "kv");
  EXPECT_EQ(o->events_vllm_block_size, 64u);
  EXPECT_EQ(o->events_vllm_block_hash, "bytes");
  EXPECT_EQ(o->events_vllm_data_parallel_rank, 3u);
  EXPECT_EQ(o->events_vllm_encoding, "map");
  EXPECT_OK(o->Validate());

  auto names = [&](const char* key) { return std::string(o->Validate().message()).find(key) != std::string::npos; };
  o->events_format = "protobuf";
  EXPECT_TRUE(names("events.format"));
  o->events_format = "vllm";
  o->events_vllm_pub_endpoint = "0.0.0.0:5557";
  EXPECT_TRUE(names("events.vllm_pub_endpoint"));
  o->events_vllm_pub_endpoint = "tcp://0.0.0.0:5557";
  o->events_vllm_replay_endpoint = "5558";
  EXPECT_TRUE(names("events.vllm_replay_endpoint"));
  o->events_vllm_replay_endpoint = "tcp://0.0.0.0:5557";
  EXPECT_TRUE(names("events.vllm_replay_endpoint"));
  o->events_vllm_replay_endpoint = "";
  o->events_vllm_block_size = 0;
  EXPECT_TRUE(names("events.vllm_block_size"));
  o->events_vllm_block_size = 16;
  o->events_vllm_block_hash = "hex";
  EXPECT_TRUE(names("events.vllm_block_hash"));
  o->events_vllm_block_hash = "int";
  o->events_vllm_encoding = "json";
  EXPECT_TRUE(names("events.vllm_encoding"));
  o->events_vllm_encoding = "array";
  EXPECT_OK(o->Validate());
  o->events_format = "both";
  o->events_pub_endpoint = o->events_vllm_pub_endpoint;
  EXPECT_TRUE(names("events.vllm_pub_endpoint"));

  auto neg = ParseServerConfig("events:\n  vllm_data_parallel_rank: -1\n");
  EXPECT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("events.vllm_data_parallel_rank"), absl::string_view::npos);
}

TEST(EventsConfigTest, BackendAndInstanceIds) {
  auto o = ParseServerConfig(
      "events:\n  enabled: true\n  backend_id: kvtier-rack-1\n  instance_ids: [engine-a, engine-b]\n");
  ASSERT_OK(o);
  EXPECT_EQ(o->events_backend_id, "kvtier-rack-1");
  EXPECT_EQ(o->events_instance_ids, (std::vector<std::string>{"engine-a", "engine-b"}));
  auto defaults = ParseServerConfig("events:\n  enabled: true\n");
  ASSERT_OK(defaults);
  EXPECT_EQ(defaults->events_backend_id, "");
  EXPECT_TRUE(defaults->events_instance_ids.empty());
  for (const char* bad : {"events:\n  instance_ids: engine-a\n", "events:\n  instance_ids: [a, [b]]\n",
                          "events:\n  instance_ids: [a, \"\"]\n"}) {
    auto r = ParseServerConfig(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("events.instance_ids"), absl::string_view::npos) << r.status();
  }
}

}  // namespace
}  // namespace kvtier::server
