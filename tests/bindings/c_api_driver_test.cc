// Runs the C API test program (c_api_test.c, compiled as C and linked only against libkvtier) against a
// real 3-process cluster: the C program cannot start servers itself, so this fixture does.
#include <spawn.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/server_process.h"
#include "testing/status_matchers.h"

extern char** environ;

namespace kvtier {
namespace {

using testing::ServerProcess;

// Runs `argv` to completion with this process's stdout/stderr; returns its wait status.
int RunProgram(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(CApiTest, CProgramRoundTripsBlocksThroughAThreeNodeCluster) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::vector<std::string> args = {KVTIER_C_API_TEST_BINARY};
  for (int i = 1; i <= 3; ++i) {
    auto p = ServerProcess::Start("c-api-" + std::to_string(i));
    ASSERT_OK(p);
    args.push_back((*p)->address());
    servers.push_back(std::move(p).value());
  }
  const int status = RunProgram(args);
  ASSERT_TRUE(WIFEXITED(status)) << "the C program did not exit normally; wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the C program reported failures (see its output above)";
}

// A server that takes blocks of at most 1 MiB refuses the C program's 2 MiB blocks: the C API returns
// the server's code (INVALID_ARGUMENT) and message, not a per-block error.
TEST(CApiTest, CProgramGetsTheServersRefusalOfAnOversizedBlock) {
  auto p = ServerProcess::Start("c-api-small", {"--max_block_bytes=1MiB"});
  ASSERT_OK(p);
  const int status = RunProgram({KVTIER_C_API_TEST_BINARY, "--refusing", (*p)->address()});
  ASSERT_TRUE(WIFEXITED(status)) << "the C program did not exit normally; wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the C program reported failures (see its output above)";
}

TEST(CApiTest, CProgramRejectsAMissingMemberList) {
  const int status = RunProgram({KVTIER_C_API_TEST_BINARY});
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

}  // namespace
}  // namespace kvtier
