// The pieces of the fault tests (tests/fault/README.md): child processes (kvtier-server, trace_replay)
// with their output, a network namespace joined to this one by a veth pair, /metrics reads, and the
// per-phase sums of trace_replay's windows.
#ifndef KVTIER_TESTS_FAULT_FAULT_HARNESS_H_
#define KVTIER_TESTS_FAULT_FAULT_HARNESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/server_process.h"

namespace kvtier::testing {

inline int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

// Runs `cmd` through the shell; returns its exit code (-1 when it did not exit) and its output (stdout
// and stderr) in `output` when given.
inline int Shell(const std::string& cmd, std::string* output = nullptr) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  std::string out;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (output != nullptr) *output = std::move(out);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A child process: argv[0] is a path, stderr goes to `log_path`, stdout to a pipe this object reads
// (ReadLine) or to the same log. The destructor kills it (SIGKILL) if it still runs.
class Child {
 public:
  static absl::StatusOr<std::unique_ptr<Child>> Start(std::vector<std::string> args, const std::string& log_path,
                                                      bool capture_stdout) {
    auto c = std::unique_ptr<Child>(new Child());
    // Everything the child needs is built before fork(): a child of a multi-threaded process may only
    // call async-signal-safe functions until it execs.
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path));
    int out[2] = {-1, -1};
    if (capture_stdout && pipe2(out, O_CLOEXEC) != 0) {
      close(log_fd);
      return absl::InternalError("pipe2 failed");
    }
    c->pid_ = fork();
    if (c->pid_ < 0) return absl::InternalError("fork failed");
    if (c->pid_ == 0) {
      dup2(log_fd, STDERR_FILENO);
      dup2(capture_stdout ? out[1] : log_fd, STDOUT_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(log_fd);
    if (capture_stdout) {
      close(out[1]);
      c->out_fd_ = out[0];
    }
    return c;
  }

  ~Child() {
    Kill(SIGKILL);
    if (out_fd_ >= 0) close(out_fd_);
  }

  // Sends `sig` and waits for the exit; returns the wait status, or -1 when it was not running.
  int Kill(int sig) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    return Wait();
  }

  // Waits for the exit; returns the wait status, or -1 when it was not running.
  int Wait() {
    if (pid_ <= 0) return -1;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  // True while it runs (reaps it when it has exited).
  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_status_ = status;
      return false;
    }
    return true;
  }
  int exit_status() const { return exit_status_; }

  enum class Read { kLine, kTimeout, kEof };
  // The next line of the child's stdout (without the newline), waiting at most `timeout`.
  Read ReadLine(std::string* line, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        *line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return Read::kLine;
      }
      if (out_fd_ < 0) return Read::kEof;
      const int64_t wait_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
      pollfd pfd{.fd = out_fd_, .events = POLLIN, .revents = 0};
      const int ready = poll(&pfd, 1, static_cast<int>(wait_ms));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return Read::kTimeout;
      char buf[8192];
      const ssize_t n = read(out_fd_, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(out_fd_);
        out_fd_ = -1;
        if (!buffer_.empty()) {  // a last line without a newline
          *line = std::exchange(buffer_, "");
          return Read::kLine;
        }
        return Read::kEof;
      }
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

  pid_t pid() const { return pid_; }

 private:
  Child() = default;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int exit_status_ = -1;
  std::string buffer_;
};

// A network namespace with one veth pair to this one: host_ip() here, ns_ip() inside. Cut() takes the
// namespace's end down, so packets to it vanish silently (no reset, no ICMP: the peer looks hung, the
// hardest partition for deadlines); Heal() brings it back. The destructor kills what still runs inside
// and deletes the namespace (which deletes the veth pair).
class NetnsLink {
 public:
  // Errors: FailedPrecondition (no `ip`, or namespaces not permitted here, e.g. no CAP_NET_ADMIN; the
  // message says which), Internal (a later step failed).
  static absl::StatusOr<std::unique_ptr<NetnsLink>> Create() {
    std::string out;
    if (Shell("ip -V", &out) != 0) {
      return absl::FailedPreconditionError("no `ip` command (iproute2; scripts/install-deps.sh installs it)");
    }
    RemoveStale();
    auto n = std::unique_ptr<NetnsLink>(new NetnsLink());
    const pid_t pid = getpid();
    n->name_ = absl::StrCat("kvtf-", pid);
    n->host_if_ = absl::StrCat("kvtf", pid, "h");
    n->ns_if_ = absl::StrCat("kvtf", pid, "n");
    const int subnet = static_cast<int>(pid % 250) + 1;
    n->host_ip_ = absl::StrCat("10.201.", subnet, ".1");
    n->ns_ip_ = absl::StrCat("10.201.", subnet, ".2");
    if (Shell("ip netns add " + n->name_, &out) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("network namespaces not permitted here (`ip netns add` ",
                                                        "failed: ", out, "); needs root with CAP_NET_ADMIN"));
    }
    n->created_ = true;
    const std::vector<std::string> steps = {
        absl::StrCat("ip link add ", n->host_if_, " type veth peer name ", n->ns_if_),
        absl::StrCat("ip link set ", n->ns_if_, " netns ", n->name_),
        absl::StrCat("ip addr add ", n->host_ip_, "/24 dev ", n->host_if_),
        absl::StrCat("ip link set ", n->host_if_, " up"),
        absl::StrCat("ip netns exec ", n->name_, " ip addr add ", n->ns_ip_, "/24 dev ", n->ns_if_),
        absl::StrCat("ip netns exec ", n->name_, " ip link set ", n->ns_if_, " up"),
        absl::StrCat("ip netns exec ", n->name_, " ip link set lo up"),
    };
    for (const auto& s : steps) {
      if (Shell(s, &out) != 0) {
        const bool first_veth = &s == &steps[0];
        const std::string msg = absl::StrCat("`", s, "` failed: ", out);
        if (first_veth) return absl::FailedPreconditionError(msg);  // e.g. no veth driver
        return absl::InternalError(msg);
      }
    }
    return n;
  }

  ~NetnsLink() {
    if (!created_) return;
    std::string pids;
    Shell("ip netns pids " + name_, &pids);
    for (absl::string_view p : absl::StrSplit(pids, '\n', absl::SkipWhitespace())) {
      int pid = 0;
      if (absl::SimpleAtoi(p, &pid) && pid > 0) kill(pid, SIGKILL);
    }
    Shell("ip netns del " + name_);
    Shell("ip link del " + host_if_ + " >/dev/null");  // gone with the namespace; in case it was not
  }

  absl::Status Cut() { return Run(absl::StrCat("ip netns exec ", name_, " ip link set ", ns_if_, " down")); }
  absl::Status Heal() { return Run(absl::StrCat("ip netns exec ", name_, " ip link set ", ns_if_, " up")); }

  // The words that run a program inside the namespace.
  std::vector<std::string> ExecPrefix() const { return {"/usr/sbin/ip", "netns", "exec", name_}; }
  const std::string& host_ip() const { return host_ip_; }
  const std::string& ns_ip() const { return ns_ip_; }

 private:
  NetnsLink() = default;

  static absl::Status Run(const std::string& cmd) {
    std::string out;
    if (Shell(cmd, &out) != 0) return absl::InternalError(absl::StrCat("`", cmd, "` failed: ", out));
    return absl::OkStatus();
  }

  // Namespaces left by an earlier run that was killed before its destructor ran (kvtf-<pid> of a
  // process that no longer exists).
  static void RemoveStale() {
    std::string list;
    if (Shell("ip netns list", &list) != 0) return;
    for (absl::string_view line : absl::StrSplit(list, '\n', absl::SkipWhitespace())) {
      absl::string_view name = line.substr(0, line.find(' '));
      int pid = 0;
      if (!absl::ConsumePrefix(&name, "kvtf-")) continue;
      if (!absl::SimpleAtoi(name, &pid) || pid <= 0) continue;
      if (kill(pid, 0) == 0 || errno != ESRCH) continue;
      Shell(absl::StrCat("ip netns del kvtf-", pid));
    }
  }

  bool created_ = false;
  std::string name_, host_if_, ns_if_, host_ip_, ns_ip_;
};

// A kvtier-server child with its own disk directory, which outlives the process so that a restart
// can find it (or not, when the test deletes it).
struct ServerSpec {
  std::string node_id;
  std::string host = "127.0.0.1";        // where gRPC and /metrics listen
  int grpc_port = 0;                     // 0: any (a restart passes the old port, so members keep the address)
  std::string disk_path;                 // "" = no disk tier
  std::vector<std::string> exec_prefix;  // e.g. NetnsLink::ExecPrefix()
  std::vector<std::string> extra_args;
};

class FaultServer {
 public:
  // Starts it and waits (up to 20 s) for its port file. Errors: Internal, DeadlineExceeded.
  static absl::StatusOr<std::unique_ptr<FaultServer>> Start(const ServerSpec& spec, const std::string& work_dir) {
    auto s = std::unique_ptr<FaultServer>(new FaultServer());
    s->spec_ = spec;
    const std::string port_file = absl::StrCat(work_dir, "/", spec.node_id, ".port");
    std::filesystem::remove(port_file);
    std::vector<std::string> args = spec.exec_prefix;
    for (const std::string& a : std::vector<std::string>{
             BinaryDir() + "/cache_server/kvtier-server", "--node_id=" + spec.node_id, "--port_file=" + port_file,
             absl::StrCat("--listen_address=", spec.host, ":", spec.grpc_port),
             absl::StrCat("--metrics_address=", spec.host, ":0")}) {
      args.push_back(a);
    }
    if (!spec.disk_path.empty()) args.push_back("--disk_path=" + spec.disk_path);
    for (const auto& a : spec.extra_args) args.push_back(a);
    s->log_ = absl::StrCat(work_dir, "/", spec.node_id, ".log");
    auto child = Child::Start(args, s->log_, /*capture_stdout=*/false);
    if (!child.ok()) return child.status();
    s->child_ = *std::move(child);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      std::ifstream in(port_file);
      if (in >> s->grpc_port_ >> s->metrics_port_) return s;
      if (!s->child_->Running()) {
        return absl::InternalError(absl::StrCat("kvtier-server ", spec.node_id, " exited early; see ", s->log_));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat("kvtier-server ", spec.node_id, " wrote no port file"));
  }

  // SIGKILL (no shutdown of any kind) and wait.
  void Kill() { child_->Kill(SIGKILL); }

  std::string address() const { return absl::StrCat(spec_.host, ":", grpc_port_); }
  std::string metrics_address() const { return absl::StrCat(spec_.host, ":", metrics_port_); }
  int grpc_port() const { return grpc_port_; }
  const ServerSpec& spec() const { return spec_; }
  const std::string& log() const { return log_; }

 private:
  FaultServer() = default;
  ServerSpec spec_;
  std::unique_ptr<Child> child_;
  std::string log_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
};

// The sum of the samples of Prometheus metric `name` on `metrics_address` whose labels contain
// `label` ("" = all). Errors: Unavailable (no answer within 2 s), NotFound (no such metric).
inline absl::StatusOr<double> ReadMetric(const std::string& metrics_address, const std::string& name,
                                         const std::string& label = "") {
  std::string text;
  if (Shell(absl::StrCat("curl -sf --max-time 2 http://", metrics_address, "/metrics"), &text) != 0) {
    return absl::UnavailableError(absl::StrCat("no /metrics from ", metrics_address));
  }
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == absl::string_view::npos || line.substr(0, name_end) != name) continue;
    if (!label.empty() && line.find(label) == absl::string_view::npos) continue;
    double v = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) continue;
    sum += v;
    found = true;
  }
  if (!found) return absl::NotFoundError(absl::StrCat("no metric ", name, " ", label, " on ", metrics_address));
  return sum;
}

// The sum of a set of trace_replay windows (bench/README.md, --report_interval_requests).
struct PhaseStats {
  uint64_t windows = 0, requests = 0, blocks = 0, hit_blocks = 0;
  uint64_t misses_from_errors = 0, put_errors = 0, client_errors = 0, payload_mismatches = 0, checksum_failures = 0;
  double max_p99_lookup_ms = 0;  // the largest per-window p99: at least the p99 of the union when 1 window
  int64_t start_unix_ms = 0, end_unix_ms = 0;

  double hit_ratio() const { return blocks ? double(hit_blocks) / double(blocks) : 0; }
  void Add(const nlohmann::json& w) {
    if (windows++ == 0) start_unix_ms = w["start_unix_ms"].get<int64_t>();
    end_unix_ms = w["end_unix_ms"].get<int64_t>();
    requests += w["requests"].get<uint64_t>();
    blocks += w["blocks"].get<uint64_t>();
    hit_blocks += w["hit_blocks"].get<uint64_t>();
    misses_from_errors += w["misses_from_errors"].get<uint64_t>();
    put_errors += w["put_errors"].get<uint64_t>();
    client_errors += w["client_errors"].get<uint64_t>();
    payload_mismatches += w["payload_mismatches"].get<uint64_t>();
    checksum_failures += w["checksum_failures"].get<uint64_t>();
    max_p99_lookup_ms = std::max(max_p99_lookup_ms, w["lookup_latency_ms"]["p99"].get<double>());
  }
  std::string ToString() const {
    char buf[320];
    std::snprintf(buf, sizeof(buf),
                  "%llu windows, %llu requests, hit ratio %.4f, %llu misses from errors, %llu put errors, "
                  "%llu client errors, %llu mismatches, max window p99 lookup %.1f ms, %.1f s",
                  static_cast<unsigned long long>(windows), static_cast<unsigned long long>(requests), hit_ratio(),
                  static_cast<unsigned long long>(misses_from_errors), static_cast<unsigned long long>(put_errors),
                  static_cast<unsigned long long>(client_errors), static_cast<unsigned long long>(payload_mismatches),
                  max_p99_lookup_ms, (end_unix_ms - start_unix_ms) / 1000.0);
    return buf;
  }
};

inline PhaseStats SumWindows(const std::vector<nlohmann::json>& windows,
                             const std::function<bool(const nlohmann::json&)>& pick) {
  PhaseStats p;
  for (const auto& w : windows) {
    if (pick(w)) p.Add(w);
  }
  return p;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_FAULT_FAULT_HARNESS_H_
