#include "kvtier/common/host_port.h"

#include <string>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(HostPortTest, SplitsAtTheLastColon) {
  auto a = ParseHostPort("127.0.0.1:7400");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7400u);
  auto v6 = ParseHostPort("[::1]:65535");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "[::1]");
  EXPECT_EQ(v6->port, 65535u);
  EXPECT_TRUE(ParseHostPort("kvtier-0.kvtier:1").ok());
}

TEST(HostPortTest, RefusesPortsThatWouldWrapAndNamesTheAddress) {
  for (const std::string bad :
       {"127.0.0.1:100403", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:+80", "127.0.0.1: 80", "127.0.0.1:80x",
        "127.0.0.1:", "127.0.0.1", ":80", "127.0.0.1:0000080", "127.0.0.1:0"}) {
    auto r = ParseHostPort(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  }
}

TEST(HostPortTest, PortZeroOnlyForAListenAddress) {
  EXPECT_FALSE(ParseHostPort("127.0.0.1:0").ok());
  auto listen = ParseHostPort("127.0.0.1:0", /*min_port=*/0);
  ASSERT_TRUE(listen.ok()) << listen.status();
  EXPECT_EQ(listen->port, 0u);
}

}  // namespace
}  // namespace kvtier
