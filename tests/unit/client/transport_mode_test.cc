// The transport option's parser (client/transport_mode.h), the one place its string is read.
#include "client/transport_mode.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kvtier/client/client.h"

namespace kvtier::client {
namespace {

TEST(ParseTransportTest, TakesTheThreeValues) {
  EXPECT_EQ(ParseTransport("auto").value(), TransportMode::kAuto);
  EXPECT_EQ(ParseTransport("grpc").value(), TransportMode::kGrpc);
  EXPECT_EQ(ParseTransport("ucx").value(), TransportMode::kUcx);
}

TEST(ParseTransportTest, RefusesAnythingElseNamingTheValue) {
  for (const char* bad : {"", "UCX", "tcp", "auto "}) {
    const auto mode = ParseTransport(bad);
    ASSERT_FALSE(mode.ok()) << bad;
    EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(mode.status().message(), absl::StrCat("transport: \"", bad, "\" is not auto, grpc or ucx"));
  }
}

TEST(ParseTransportTest, ValidateReportsABadTransport) {
  ClientOptions o;
  o.members = {"127.0.0.1:7400"};
  o.transport = "rdma";
  const absl::Status s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "transport: \"rdma\" is not auto, grpc or ucx");
}

}  // namespace
}  // namespace kvtier::client
