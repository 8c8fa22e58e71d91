// Runs kvtier-server as a real child process for integration and fault tests.
#ifndef KVTIER_TESTS_TESTING_SERVER_PROCESS_H_
#define KVTIER_TESTS_TESTING_SERVER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvtier::testing {

// The build tree (ctest sets KVTIER_BINARY_DIR); falls back to the current directory's parent.
inline std::string BinaryDir() {
  const char* d = std::getenv("KVTIER_BINARY_DIR");
  return d != nullptr ? d : "..";
}
inline std::string SourceDir() {
  const char* d = std::getenv("KVTIER_SOURCE_DIR");
  return d != nullptr ? d : "../..";
}

// A kvtier-server child. The destructor kills it (SIGKILL) if still running.
class ServerProcess {
 public:
  // Starts `kvtier-server --node_id=ID --port_file=... extra_args...` on port 0 and waits (up to 20 s)
  // for the port file. Errors: Internal (fork/exec failed), DeadlineExceeded (never bound).
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::string& node_id,
                                                              std::vector<std::string> extra_args = {}) {
    auto p = std::unique_ptr<ServerProcess>(new ServerProcess());
    char dir_template[] = "/tmp/kvtier-test-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
    p->dir_ = dir_template;
    p->node_id_ = node_id;
    const std::string port_file = p->dir_ + "/port";
    std::vector<std::string> args = {BinaryDir() + "/cache_server/kvtier-server",
                                     "--node_id=" + node_id,
                                     "--port_file=" + port_file,
                                     "--listen_address=127.0.0.1:0",
                                     "--metrics_address=127.0.0.1:0",
                                     "--host_cache_bytes=67108864"};
    for (auto& a : extra_args) args.push_back(std::move(a));
    // Everything the child needs is built before fork(): a child of a multi-threaded process may only
    // call async-signal-safe functions until it execs.
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = p->dir_ + "/server.log";
    const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    // A test process that aborts (a failed ASSERT in a death path, a sanitizer report) must not leave
    // its servers running: the child dies with the thread that forked it. Only when that thread is the
    // main one, which lives as long as the test process (a worker thread may end before its server).
    const bool main_thread = gettid() == getpid();
    const pid_t parent = getpid();
    p->pid_ = fork();
    if (p->pid_ < 0) return absl::InternalError("fork failed");
    if (p->pid_ == 0) {
      if (main_thread) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(126);  // the parent died before prctl
      }
      if (log_fd >= 0) dup2(log_fd, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (log_fd >= 0) close(log_fd);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(port_file);
      if (in >> p->grpc_port_ >> p->metrics_port_) {
        if (!(in >> p->ucx_port_)) p->ucx_port_ = 0;        // third number: the UCX port, 0 without UCX
        if (!(in >> p->health_port_)) p->health_port_ = 0;  // fourth: the plain health port, if any
        return p;
      }
      int status = 0;
      if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {
        p->pid_ = -1;
        return absl::InternalError(absl::StrCat("kvtier-server exited early; see ", p->dir_, "/server.log"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return absl::DeadlineExceededError("kvtier-server did not write its port file");
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }

  // Sends `sig` and waits for the exit; returns the wait status (or -1 when not running).
  int KillAndWait(int sig) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  int ucx_port() const { return ucx_port_; }
  int health_port() const { return health_port_; }  // 0 without server.health_address
  const std::string& node_id() const { return node_id_; }
  pid_t pid() const { return pid_; }
  // The server's stderr (its log), kept until this object is destroyed.
  std::string log_path() const { return dir_ + "/server.log"; }
  // True while the process runs (reaps it when it has exited).
  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }

 private:
  ServerProcess() = default;
  std::string dir_;
  std::string node_id_;
  pid_t pid_ = -1;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  int ucx_port_ = 0;
  int health_port_ = 0;
};

// Runs `kvtier-server args` (a shell command line; stopped after 20 s: exit status 124) until it exits;
// returns its wait status (pclose) and sets `out` to what it printed on stdout and stderr. For
// configurations the server must refuse at start.
inline int RunServerToExit(const std::string& args, std::string& out) {
  const std::string cmd = "timeout 20 " + BinaryDir() + "/cache_server/kvtier-server " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  return pclose(p);
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_SERVER_PROCESS_H_
