// The events section of the server config (docs/config.md, docs/events.md).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvtier::server
