// transfer_bench: batched get/put throughput of kvtier over UCX and over gRPC bytes, side by side in one
// run with the limits measured the same way (memcpy, ucx_perftest tag_bw), for the two paths of
// DESIGN.md §4: same node (UCX shared memory + cma) and another node (UCX tcp; loopback here), and
// next to redis-server GET/SET of the same values through hiredis (a common remote tier).
// It starts and stops its own kvtier-server and redis-server processes. See bench/README.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtier/client/client.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/ucx/ucx_client.h"
#include "kvtier/v1/cache.pb.h"
#include "kvtier/wire/wire.h"

#if KVTIER_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

ABSL_FLAG(std::string, server, "", "kvtier-server binary (default: next to this build's bench/)");
ABSL_FLAG(std::string, paths, "shm,tcp", "paths to measure: shm (UCX_TLS=tcp,shm: cma single-copy), tcp");
ABSL_FLAG(std::string, block_bytes, "262144,2097152", "block sizes, bytes");
ABSL_FLAG(std::string, batches, "1,8,64", "blocks per call");
ABSL_FLAG(uint64_t, bytes_per_row, 512ULL << 20, "payload bytes each timed row moves at least");
ABSL_FLAG(int, min_iters, 5, "calls per row at least");
ABSL_FLAG(int, max_iters, 2000, "calls per row at most");
ABSL_FLAG(std::string, ops, "put,get", "kvtier operations to time (get alone still stores its blocks once)");
ABSL_FLAG(bool, grpc, true, "also measure kvtier over gRPC bytes");
ABSL_FLAG(bool, auth, false,
          "also measure kvtier over UCX against a server with a token (transport ucx-auth: a UCX session "
          "ticket per endpoint, per-request tenant checks)");
ABSL_FLAG(bool, memcpy, true, "also measure memcpy of the same blocks (the memory limit)");
ABSL_FLAG(std::string, perftest, "ucx_perftest", "ucx_perftest binary; empty = skip the UCX limit");
ABSL_FLAG(std::string, redis, "redis-server",
          "redis-server binary for the Redis baseline (GET/SET through hiredis); empty = skip");
ABSL_FLAG(int, repeat, 3, "passes over every row (limits included); each row reports its median pass");
ABSL_FLAG(bool, json, false,
          "print the rows as one JSON object, with put_breakdown: one UCX put batch step by step (reserve, "
          "send, hash, commit; microseconds, median)");
ABSL_FLAG(bool, put_commit, true,
          "the server commits a UCX put batch on its last message (ucx.put_commit); false: the client "
          "commits after kPutDone (as against a server without it)");
ABSL_FLAG(uint32_t, put_batch_blocks, 64, "the clients' put_batch_blocks: a call of more blocks is pipelined batches");
ABSL_FLAG(std::string, clients, "1",
          "concurrent clients of the UCX rows, each its own process (e.g. 1,4,16): one row per count");
// Worker mode (set by the parent for --clients above 1): one client process's share of a row.
ABSL_FLAG(std::string, worker_address, "", "internal: run as a client worker against this server");
ABSL_FLAG(std::string, worker_tls, "", "internal: the worker's UCX_TLS");
ABSL_FLAG(std::string, worker_op, "put", "internal: put or get");
ABSL_FLAG(uint64_t, worker_block, 0, "internal: block bytes");
ABSL_FLAG(uint32_t, worker_batch, 0, "internal: blocks per call");
ABSL_FLAG(int, worker_calls, 0, "internal: timed calls");
ABSL_FLAG(uint64_t, worker_seed, 0, "internal: key seed");
ABSL_FLAG(int64_t, worker_start_unix_ms, 0, "internal: when the timed calls start");
ABSL_FLAG(bool, smoke, false, "a tiny run for ctest: tcp only, 64 KiB blocks, batch 2, 3 calls, no perftest");

namespace {

using kvtier::Fingerprint;
using kvtier::Namespace;
using kvtier::client::Client;
using kvtier::client::GetResult;
using kvtier::client::PutResult;

struct Row {
  std::string path;       // shm | tcp | local
  std::string transport;  // ucx | grpc | memcpy | ucx_perftest | redis
  std::string operation;  // get | put | copy | tag_bw
  uint64_t block_bytes = 0;
  uint32_t batch = 0;
  int clients = 1;    // concurrent client processes (--clients); gbps is their sum
  double gbps = 0;    // 10^9 bytes/s, total bytes / total time
  double p50_us = 0;  // per call
  double p99_us = 0;
  int calls = 0;
  std::string note;
  int passes = 1;       // passes measured; the row is the median one
  double gbps_min = 0;  // over the passes
  double gbps_max = 0;
};

std::string UcxTls(const std::string& path) { return path == "shm" ? "tcp,shm" : "tcp"; }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

Row Summarize(Row row, const std::vector<double>& call_us, uint64_t bytes_per_call) {
  double total_us = 0;
  for (double u : call_us) total_us += u;
  row.calls = static_cast<int>(call_us.size());
  row.gbps = total_us > 0 ? static_cast<double>(bytes_per_call) * row.calls / (total_us * 1e3) : 0;
  row.p50_us = Percentile(call_us, 0.5);
  row.p99_us = Percentile(call_us, 0.99);
  return row;
}

int Iterations(uint64_t bytes_per_call) {
  const uint64_t want = absl::GetFlag(FLAGS_bytes_per_row) / std::max<uint64_t>(1, bytes_per_call);
  return static_cast<int>(std::clamp<uint64_t>(want, absl::GetFlag(FLAGS_min_iters), absl::GetFlag(FLAGS_max_iters)));
}

// A child process: argv[0] with `args`, extra environment `env` ("K=V"), stderr to `log`.
pid_t Spawn(const std::vector<std::string>& argv_in, const std::vector<std::string>& env_extra,
            const std::string& log) {
  std::vector<std::string> args = argv_in;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const auto& e : env_extra) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = fork();  // everything the child needs is built above (async-signal-safety)
  if (pid == 0) {
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execvpe(argv[0], argv.data(), envp.data());  // searches PATH (ucx_perftest)
    _exit(127);
  }
  if (fd >= 0) close(fd);
  return pid;
}

void Stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
}

// One kvtier-server with UCX on 127.0.0.1:0.
struct ServerChild {
  pid_t pid = -1;
  int grpc_port = 0;
  int ucx_port = 0;
  std::string dir;
  ~ServerChild() {
    Stop(pid);
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
};

// The worker token of tenant "bench" on a server started with one (--auth).
constexpr char kBenchToken[] = "transfer-bench-token";

// `token`: the server requires it (auth.tokens: a worker of tenant "bench"); "" = no tokens.
std::unique_ptr<ServerChild> StartServer(const std::string& binary, const std::string& tls, uint64_t host_bytes,
                                         const std::string& token = "") {
  auto s = std::make_unique<ServerChild>();
  char tmpl[] = "/tmp/kvtier-transfer-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return nullptr;
  s->dir = tmpl;
  const std::string port_file = s->dir + "/port";
  std::vector<std::string> args = {binary,
                                   "--node_id=bench",
                                   "--listen_address=127.0.0.1:0",
                                   "--metrics_address=none",
                                   "--ucx_listen_address=127.0.0.1:0",
                                   "--ucx_transports=" + tls,
                                   absl::StrCat("--host_cache_bytes=", host_bytes),
                                   "--port_file=" + port_file};
  std::string config;
  if (!token.empty()) {
    config += absl::StrCat("auth:\n  tokens:\n    - {token: ", token, ", tenant: bench, role: worker}\n");
  }
  if (!absl::GetFlag(FLAGS_put_commit)) config += "ucx:\n  put_commit: false\n";
  if (!config.empty()) {
    std::ofstream(s->dir + "/config.yaml") << config;
    args.push_back("--config=" + s->dir + "/config.yaml");
  }
  s->pid = Spawn(args, {}, s->dir + "/server.log");
  for (int i = 0; i < 1000; ++i) {
    std::ifstream in(port_file);
    int metrics = 0;
    if (in >> s->grpc_port >> metrics >> s->ucx_port) return s;
    int status = 0;
    if (waitpid(s->pid, &status, WNOHANG) == s->pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "transfer_bench: kvtier-server did not start; see %s/server.log\n", s->dir.c_str());
  s->dir.clear();
  return nullptr;
}

// A layout whose shard is exactly `bytes`: MLA, fp8, one layer, one token per block.
Namespace BenchNamespace(uint64_t bytes) {
  Namespace ns;
  ns.tenant = "bench";
  ns.model = absl::StrCat("transfer-", bytes);
  ns.layout = {.kind = kvtier::LayoutKind::kMla,
               .dtype = kvtier::DType::kFp8E4m3,
               .num_layers = 1,
               .latent_dim = static_cast<uint32_t>(bytes),
               .block_tokens = 1,
               .tp_size = 1};
  return ns;
}

std::vector<Fingerprint> Keys(const Namespace& ns, uint32_t n, uint64_t seed) {
  std::vector<uint32_t> tokens(n);
  for (uint32_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>((seed * 1000003 + i) % 4000000000u);
  auto fps = kvtier::ChainFingerprints(ns, tokens);
  return fps.ok() ? *fps : std::vector<Fingerprint>{};
}

// Get and put rows of one client against one server.
void MeasureClient(Client& client, const std::string& path, const std::string& transport, uint64_t block,
                   uint32_t batch, std::vector<Row>& rows, uint64_t& seed) {
  const Namespace ns = BenchNamespace(block);
  std::vector<std::vector<std::byte>> data(batch, std::vector<std::byte>(block));
  for (uint32_t b = 0; b < batch; ++b) {
    for (uint64_t i = 0; i < block; i += 4096) data[b][i] = static_cast<std::byte>(b + i / 4096);
  }
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  std::vector<std::vector<std::byte>> out(batch, std::vector<std::byte>(block));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  const int iters = Iterations(block * batch);
  const int warmup = std::min(3, iters);

  // Put: fresh keys every call (a put of a present block moves nothing).
  const std::string ops = absl::GetFlag(FLAGS_ops);
  const bool time_put = ops.find("put") != std::string::npos;
  const int put_calls = time_put ? iters + warmup : 1;
  std::vector<std::vector<Fingerprint>> put_keys;
  for (int i = 0; i < put_calls; ++i) put_keys.push_back(Keys(ns, batch, ++seed));
  std::vector<double> us;
  int failed = 0;
  for (int i = 0; i < put_calls; ++i) {
    const absl::Time t0 = absl::Now();
    auto r = client.Put(ns, put_keys[i], 0, in);
    const double elapsed = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (!r.ok() || std::any_of(r->begin(), r->end(), [](PutResult p) { return p != PutResult::kStored; })) ++failed;
    if (i >= warmup) us.push_back(elapsed);
  }
  Row put = Summarize({.path = path, .transport = transport, .operation = "put", .block_bytes = block, .batch = batch},
                      us, block * batch);
  if (failed > 0) put.note = absl::StrCat(failed, " calls not fully stored");
  if (time_put) rows.push_back(put);
  if (ops.find("get") == std::string::npos) return;

  // Get: the blocks of the last put, again and again (includes the lease RPC and the checksum check).
  const std::vector<Fingerprint>& keys = put_keys.back();
  us.clear();
  failed = 0;
  for (int i = 0; i < iters + warmup; ++i) {
    const absl::Time t0 = absl::Now();
    auto r = client.Get(ns, keys, 0, views);
    const double elapsed = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (!r.ok() || std::any_of(r->begin(), r->end(), [](GetResult g) { return g != GetResult::kHit; })) ++failed;
    if (i >= warmup) us.push_back(elapsed);
  }
  Row get = Summarize({.path = path, .transport = transport, .operation = "get", .block_bytes = block, .batch = batch},
                      us, block * batch);
  if (failed > 0) get.note = absl::StrCat(failed, " calls with misses");
  rows.push_back(get);
}

// One UCX put batch of `batch` blocks step by step, driven through the UCX plane's own client (as
// Client::Put drives it), over a fresh endpoint to the server at `ucx_address`; medians over `calls`
// batches of fresh keys, microseconds:
//   reserve_us: the kAllocate round trip.
//   send_us, hash_us, commit_us: the batch with the commit after its bytes (kPut and the sends until
//     the server's kPutDone; the client's XXH3 of the batch, computed meanwhile; the kCommit round trip).
//   send_commit_us, commit_hash_us: the batch with the commit on its last message (kPut, the sends and
//     the kPutCommit until its one reply; the client's XXH3, computed meanwhile); only on a server that
//     takes it (commits_puts).
// The server hashes each block as it lands (on its progress thread, inside send_us); the xxh3 row of
// the same size is that cost.
nlohmann::json MeasurePutBreakdown(const std::string& ucx_address, const std::string& tls, uint64_t block,
                                   uint32_t batch, uint64_t& seed) {
  auto ucx = kvtier::ucx::UcxClient::Create(tls, /*get_lanes=*/1);
  if (!ucx.ok()) return {{"error", std::string(ucx.status().message())}};
  auto conn = (*ucx)->Connect(ucx_address, absl::Now() + absl::Seconds(10));
  if (!conn.ok() || !conn->takes_puts) return {{"error", "no UCX endpoint that takes puts"}};
  const Namespace ns = BenchNamespace(block);
  std::vector<std::vector<std::byte>> data(batch, std::vector<std::byte>(block));
  for (uint32_t b = 0; b < batch; ++b) {
    for (uint64_t i = 0; i < block; i += 4096) data[b][i] = static_cast<std::byte>(b + i / 4096 + 7);
  }
  std::vector<std::span<const std::byte>> blocks(data.begin(), data.end());
  std::vector<uint32_t> indices(batch);
  for (uint32_t i = 0; i < batch; ++i) indices[i] = i;
  const int calls = std::clamp(Iterations(block * batch) / 4, 3, 50);
  std::map<std::string, std::vector<double>> us;
  int failed = 0;
  auto since = [](absl::Time t) { return absl::ToDoubleMicroseconds(absl::Now() - t); };
  for (int i = 0; i < 2 * calls; ++i) {
    const bool on_last = i >= calls;  // a stream of each way, as a put of many batches is
    if (on_last && !conn->commits_puts) continue;
    kvtier::v1::AllocateRequest areq;
    kvtier::wire::ToProto(ns, areq.mutable_namespace_());
    std::vector<kvtier::BlockKey> keys;
    for (const Fingerprint& fp : Keys(ns, batch, ++seed)) keys.push_back({fp, 0});
    kvtier::wire::EncodeKeys(keys, areq.mutable_keys());
    for (uint32_t d = 0; d < batch; ++d) areq.add_depths(d);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::Time t = absl::Now();
    auto answer = (*ucx)->Allocate(conn->endpoint, areq.SerializeAsString(), deadline);
    kvtier::v1::AllocateResponse aresp;
    if (!answer.ok() || !aresp.ParseFromString(*answer) || aresp.results_size() != static_cast<int>(batch)) {
      ++failed;
      continue;
    }
    us["reserve_us"].push_back(since(t));
    const kvtier::CapabilityId id = kvtier::CapabilityId::FromWire(aresp.reservation_id());
    kvtier::v1::CommitRequest creq;
    creq.set_reservation_id(aresp.reservation_id());
    double hash_us = 0;
    auto hash = [&] {
      const absl::Time h = absl::Now();
      for (const auto& b : blocks) creq.add_checksums(kvtier::BlockChecksum(b.data(), b.size()));
      hash_us = since(h);
    };
    kvtier::v1::CommitResponse cresp;
    bool ok = false;
    t = absl::Now();
    if (on_last) {
      auto r = (*ucx)->PutAndCommit(conn->endpoint, id, indices, blocks, deadline, [&] {
        hash();
        return creq.SerializeAsString();
      });
      us["send_commit_us"].push_back(since(t));
      us["commit_hash_us"].push_back(hash_us);
      ok = r.commit.ok() && cresp.ParseFromString(*r.commit);
    } else {
      const auto r = (*ucx)->Put(conn->endpoint, id, indices, blocks, deadline, hash);
      us["send_us"].push_back(since(t));
      us["hash_us"].push_back(hash_us);
      t = absl::Now();
      auto c = (*ucx)->Commit(conn->endpoint, creq.SerializeAsString(), deadline);
      us["commit_us"].push_back(since(t));
      ok = !r.endpoint_failed && c.ok() && cresp.ParseFromString(*c);
    }
    for (int k = 0; ok && k < cresp.results_size(); ++k) ok = cresp.results(k) == kvtier::v1::COMMIT_RESULT_COMMITTED;
    failed += ok && cresp.results_size() == static_cast<int>(batch) ? 0 : 1;
  }
  nlohmann::json j = {{"batches", calls}, {"failed", failed}, {"commits_puts", conn->commits_puts}};
  for (const auto& [name, v] : us) j[name] = Percentile(v, 0.5);
  return j;
}

// Worker mode: connects to --worker_address over UCX, prepares its keys (a get worker puts its batch
// once), waits for --worker_start_unix_ms, times --worker_calls calls and prints one JSON line:
// {"start_us", "end_us" (Unix microseconds), "bytes", "failed", "call_us": [...]}. Exit 1 on errors.
int RunWorker() {
  const uint64_t block = absl::GetFlag(FLAGS_worker_block);
  const uint32_t batch = absl::GetFlag(FLAGS_worker_batch);
  const int calls = absl::GetFlag(FLAGS_worker_calls);
  const bool put = absl::GetFlag(FLAGS_worker_op) == "put";
  auto client = Client::Connect({.members = {absl::GetFlag(FLAGS_worker_address)},
                                 .rpc_timeout = absl::Seconds(30),
                                 .put_batch_blocks = absl::GetFlag(FLAGS_put_batch_blocks),
                                 .transport = "ucx",
                                 .ucx_transports = absl::GetFlag(FLAGS_worker_tls)});
  if (!client.ok()) {
    std::fprintf(stderr, "transfer_bench worker: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  const Namespace ns = BenchNamespace(block);
  std::vector<std::vector<std::byte>> data(batch, std::vector<std::byte>(block));
  for (uint32_t b = 0; b < batch; ++b) {
    for (uint64_t i = 0; i < block; i += 4096) data[b][i] = static_cast<std::byte>(b + i / 4096);
  }
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  std::vector<std::vector<std::byte>> out(batch, std::vector<std::byte>(block));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  uint64_t seed = absl::GetFlag(FLAGS_worker_seed);
  std::vector<std::vector<Fingerprint>> keys;
  for (int i = 0; i < (put ? calls : 1); ++i) keys.push_back(Keys(ns, batch, ++seed));
  if (!put && !(*client)->Put(ns, keys[0], 0, in).ok()) return 1;
  const absl::Time start_at = absl::FromUnixMillis(absl::GetFlag(FLAGS_worker_start_unix_ms));
  if (absl::Now() < start_at) absl::SleepFor(start_at - absl::Now());
  std::vector<double> us;
  int failed = 0;
  const absl::Time t_start = absl::Now();
  for (int i = 0; i < calls; ++i) {
    const absl::Time t0 = absl::Now();
    bool ok = false;
    if (put) {
      auto r = (*client)->Put(ns, keys[i], 0, in);
      ok = r.ok() && std::all_of(r->begin(), r->end(), [](PutResult p) { return p == PutResult::kStored; });
    } else {
      auto r = (*client)->Get(ns, keys[0], 0, views);
      ok = r.ok() && std::all_of(r->begin(), r->end(), [](GetResult g) { return g == GetResult::kHit; });
    }
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    failed += ok ? 0 : 1;
  }
  const absl::Time t_end = absl::Now();
  std::printf("%s\n", nlohmann::json{{"start_us", absl::ToUnixMicros(t_start)},
                                     {"end_us", absl::ToUnixMicros(t_end)},
                                     {"bytes", block * batch * static_cast<uint64_t>(calls)},
                                     {"failed", failed},
                                     {"call_us", us}}
                          .dump()
                          .c_str());
  std::fflush(stdout);
  return 0;
}

// `clients` worker processes (RunWorker) against the server at `address`, started together: one row
// whose GB/s is every worker's bytes over the span from the first start to the last end, and whose
// p50/p99 are over every worker's calls.
void MeasureClients(const std::string& address, const std::string& path, const std::string& tls, uint64_t block,
                    uint32_t batch, int clients, std::vector<Row>& rows, uint64_t& seed) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int calls = std::max(3, Iterations(block * batch) / clients);
  const int64_t start_ms = absl::ToUnixMillis(absl::Now()) + 1500 + 100 * clients;  // all connected by then
  const std::string ops = absl::GetFlag(FLAGS_ops);
  for (const std::string op : {"put", "get"}) {
    if (ops.find(op) == std::string::npos) continue;
    std::vector<pid_t> pids;
    std::vector<std::string> logs;
    char tmpl[] = "/tmp/kvtier-transfer-workers-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    const std::string dir = tmpl;
    const int64_t at = std::max(start_ms, absl::ToUnixMillis(absl::Now()) + 1500 + 100 * clients);
    for (int c = 0; c < clients; ++c) {
      logs.push_back(absl::StrCat(dir, "/worker-", c, ".log"));
      seed += 1000003;
      pids.push_back(Spawn({self, "--worker_address=" + address, "--worker_tls=" + tls,
                            absl::StrCat("--worker_op=", op), absl::StrCat("--worker_block=", block),
                            absl::StrCat("--worker_batch=", batch), absl::StrCat("--worker_calls=", calls),
                            absl::StrCat("--worker_seed=", seed), absl::StrCat("--worker_start_unix_ms=", at),
                            absl::StrCat("--put_batch_blocks=", absl::GetFlag(FLAGS_put_batch_blocks))},
                           {}, logs.back()));
    }
    Row row{
        .path = path, .transport = "ucx", .operation = op, .block_bytes = block, .batch = batch, .clients = clients};
    std::vector<double> us;
    int64_t first = INT64_MAX, last = 0;
    uint64_t bytes = 0;
    int failed = 0, lost = 0;
    for (int c = 0; c < clients; ++c) {
      int status = 0;
      waitpid(pids[c], &status, 0);
      std::ifstream in(logs[c]);
      std::string line, report;
      while (std::getline(in, line)) {
        if (!line.empty() && line[0] == '{') report = line;
      }
      auto j = nlohmann::json::parse(report, nullptr, false);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || j.is_discarded()) {
        ++lost;
        continue;
      }
      first = std::min(first, j["start_us"].get<int64_t>());
      last = std::max(last, j["end_us"].get<int64_t>());
      bytes += j["bytes"].get<uint64_t>();
      failed += j["failed"].get<int>();
      for (double u : j["call_us"]) us.push_back(u);
    }
    std::filesystem::remove_all(dir);
    row.calls = static_cast<int>(us.size());
    row.gbps = last > first ? static_cast<double>(bytes) / (static_cast<double>(last - first) * 1e3) : 0;
    row.p50_us = Percentile(us, 0.5);
    row.p99_us = Percentile(us, 0.99);
    if (lost > 0) row.note = absl::StrCat(lost, " of ", clients, " workers failed");
    if (failed > 0) row.note += absl::StrCat(row.note.empty() ? "" : "; ", failed, " calls not fully done");
    rows.push_back(row);
  }
}

// Where MeasureMemcpy leaves the checksums it computed, so that the compiler cannot drop them.
volatile uint64_t g_checksums_seen = 0;

// memcpy of `batch` blocks per call from a 1 GiB arena (cold, as the server's slots are), and the
// client's check of the copied blocks (BlockChecksum of each right after its copy, as a get checks a block
// right after it landed): the CPU a get spends beyond moving bytes.

void MeasureMemcpy(uint64_t block, uint32_t batch, std::vector<Row>& rows) {
  const uint64_t arena_bytes = std::max<uint64_t>(1ULL << 30, 2 * block * batch);
  std::vector<std::byte> arena(arena_bytes);
  for (uint64_t i = 0; i < arena_bytes; i += 4096) arena[i] = static_cast<std::byte>(i);
  std::vector<std::vector<std::byte>> out(batch, std::vector<std::byte>(block));
  const uint64_t slots = arena_bytes / block;
  const int iters = Iterations(block * batch);
  std::vector<double> copy_us;
  std::vector<double> check_us;
  uint64_t next = 0;
  uint64_t sink = 0;
  for (int i = 0; i < iters + 3; ++i) {
    absl::Duration copy;
    absl::Duration check;
    for (uint32_t b = 0; b < batch; ++b) {
      const absl::Time t0 = absl::Now();
      std::memcpy(out[b].data(), arena.data() + (next % slots) * block, block);
      const absl::Time t1 = absl::Now();
      sink ^= kvtier::BlockChecksum(out[b].data(), block);
      copy += t1 - t0;
      check += absl::Now() - t1;
      next += 7;  // stride through the arena
    }
    if (i >= 3) {
      copy_us.push_back(absl::ToDoubleMicroseconds(copy));
      check_us.push_back(absl::ToDoubleMicroseconds(check));
    }
  }
  rows.push_back(
      Summarize({.path = "local", .transport = "memcpy", .operation = "copy", .block_bytes = block, .batch = batch},
                copy_us, block * batch));
  rows.push_back(
      Summarize({.path = "local", .transport = "xxh3", .operation = "check", .block_bytes = block, .batch = batch},
                check_us, block * batch));
  g_checksums_seen = sink;  // the checksums are used
}

// ucx_perftest tag_bw between two processes over the path's UCX_TLS, in UCX's default (none) error mode,
// with UCX_NET_DEVICES=lo. Returns nullopt when it could not run.
std::optional<Row> MeasurePerftest(const std::string& perftest, const std::string& path, uint64_t block) {
  const std::string tls = UcxTls(path);
  const int iters = std::max(200, static_cast<int>((2ULL << 30) / block));
  for (int attempt = 0; attempt < 5; ++attempt) {
    // ucx_perftest exchanges addresses over its own TCP port; retry on a clash with another port.
    const int port = 20000 + static_cast<int>((getpid() * 131 + attempt * 977 + block / 4096) % 20000);
    char tmpl[] = "/tmp/kvtier-perftest-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return std::nullopt;
    const std::string dir = tmpl;
    const std::vector<std::string> env = {"UCX_TLS=" + tls, "UCX_NET_DEVICES=lo"};
    const pid_t server = Spawn({perftest, "-p", std::to_string(port)}, env, dir + "/server.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const pid_t client = Spawn({perftest, "127.0.0.1", "-p", std::to_string(port), "-t", "tag_bw", "-s",
                                std::to_string(block), "-n", std::to_string(iters), "-w", "50", "-f"},
                               env, dir + "/client.log");
    int status = 0;
    waitpid(client, &status, 0);
    Stop(server);
    std::ifstream in(dir + "/client.log");
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    std::filesystem::remove_all(dir);
    std::vector<std::string> cols = absl::StrSplit(last, ' ', absl::SkipWhitespace());
    double mbps = 0;  // overall bandwidth, MB/s with MB = 2^20
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && cols.size() >= 8 && absl::SimpleAtod(cols[5], &mbps)) {
      Row r{.path = path, .transport = "ucx_perftest", .operation = "tag_bw", .block_bytes = block, .batch = 0};
      r.gbps = mbps * 1048576.0 / 1e9;
      double avg_us = 0;
      if (absl::SimpleAtod(cols[3], &avg_us)) r.p50_us = avg_us;  // overall average per message
      r.calls = iters;
      r.note = absl::StrCat("UCX_TLS=", tls);
      return r;
    }
  }
  return std::nullopt;
}

std::vector<uint64_t> ParseList(const std::string& s) {
  std::vector<uint64_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (absl::SimpleAtoi(p, &v) && v > 0) out.push_back(v);
  }
  return out;
}

std::string DefaultServerBinary() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (self.parent_path().parent_path().parent_path() / "cache_server" / "kvtier-server").string();
}

}  // namespace

// redis-server on 127.0.0.1 (no persistence), GET and SET of `batch` values of `block` bytes per call,
// pipelined (all commands written, then all replies read: Redis's batched form), over loopback TCP.
// Rows: path "tcp", transport "redis", operations "put" (SET) and "get" (GET).
void MeasureRedis(const std::string& binary, uint64_t block, uint32_t batch, std::vector<Row>& rows) {
#if KVTIER_HAVE_HIREDIS
  char tmpl[] = "/tmp/kvtier-redis-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return;
  const std::string dir = tmpl;
  redisContext* c = nullptr;
  pid_t pid = -1;
  for (int attempt = 0; attempt < 5 && c == nullptr; ++attempt) {
    const int port = 21000 + static_cast<int>((getpid() * 7 + attempt * 131 + block / 4096 + batch) % 20000);
    pid = Spawn(
        {binary, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
         dir, "--protected-mode", "no", "--proto-max-bulk-len", "1gb", "--client-query-buffer-limit", "1gb"},
        {}, dir + "/redis.log");
    for (int i = 0; i < 200 && c == nullptr; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      redisContext* t = redisConnect("127.0.0.1", port);
      if (t != nullptr && t->err == 0) {
        c = t;
      } else if (t != nullptr) {
        redisFree(t);
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) break;  // port taken: try another
    }
    if (c == nullptr) Stop(pid);
  }
  if (c == nullptr) {
    std::fprintf(stderr, "transfer_bench: redis-server did not start; see %s/redis.log\n", dir.c_str());
    return;
  }
  std::vector<std::string> values(batch);
  for (uint32_t b = 0; b < batch; ++b) {
    values[b].assign(block, '\0');
    for (uint64_t i = 0; i < block; i += 4096) values[b][i] = static_cast<char>(b + i / 4096);
  }
  const int iters = Iterations(block * batch);
  const int warmup = std::min(3, iters);
  int failed = 0;
  auto pipeline = [&](bool set, int call) {
    for (uint32_t b = 0; b < batch; ++b) {
      const std::string key = absl::StrCat(set ? call : 0, ":", b);
      if (set) {
        redisAppendCommand(c, "SET %b %b", key.data(), key.size(), values[b].data(), values[b].size());
      } else {
        redisAppendCommand(c, "GET %b", key.data(), key.size());
      }
    }
    for (uint32_t b = 0; b < batch; ++b) {
      void* reply = nullptr;
      if (redisGetReply(c, &reply) != REDIS_OK || reply == nullptr) {
        ++failed;
        continue;
      }
      auto* r = static_cast<redisReply*>(reply);
      if (set ? r->type != REDIS_REPLY_STATUS
              : r->type != REDIS_REPLY_STRING || r->len != static_cast<decltype(r->len)>(block) ||
                    std::memcmp(r->str, values[b].data(), block) != 0) {
        ++failed;
      }
      freeReplyObject(reply);
    }
  };
  std::vector<double> us;
  for (int i = 0; i < iters + warmup; ++i) {  // SET: fresh keys every call, as kvtier's put
    const absl::Time t0 = absl::Now();
    pipeline(true, i + 1);
    if (i >= warmup) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    if (i + 1 < iters + warmup) {  // keep memory flat: drop this call's keys (untimed)
      redisReply* r = static_cast<redisReply*>(redisCommand(c, "FLUSHALL"));
      if (r != nullptr) freeReplyObject(r);
    }
  }
  Row put = Summarize({.path = "tcp", .transport = "redis", .operation = "put", .block_bytes = block, .batch = batch},
                      us, block * batch);
  for (uint32_t b = 0; b < batch; ++b) {  // the GET keys
    const std::string key = absl::StrCat(0, ":", b);
    redisReply* r = static_cast<redisReply*>(
        redisCommand(c, "SET %b %b", key.data(), key.size(), values[b].data(), values[b].size()));
    if (r != nullptr) freeReplyObject(r);
  }
  if (failed > 0) put.note = absl::StrCat(failed, " SET replies failed");
  rows.push_back(put);
  failed = 0;
  us.clear();
  for (int i = 0; i < iters + warmup; ++i) {
    const absl::Time t0 = absl::Now();
    pipeline(false, 0);
    if (i >= warmup) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  Row get = Summarize({.path = "tcp", .transport = "redis", .operation = "get", .block_bytes = block, .batch = batch},
                      us, block * batch);
  if (failed > 0) get.note = absl::StrCat(failed, " GET replies wrong");
  rows.push_back(get);
  redisFree(c);
  Stop(pid);
  std::filesystem::remove_all(dir);
#else
  (void)binary;
  (void)block;
  (void)batch;
  (void)rows;
  static bool warned = false;
  if (!warned) std::fprintf(stderr, "transfer_bench: built without hiredis; no Redis baseline\n");
  warned = true;
#endif
}

// What one pass measures (main's flags, after --smoke).
struct BenchPlan {
  std::vector<std::string> paths;
  std::vector<uint64_t> blocks;
  std::vector<uint64_t> batches;
  std::string perftest;  // empty: no UCX limit
  bool do_memcpy = true;
  std::string redis;  // empty: no Redis baseline
  std::string server;
  uint64_t host_bytes = 0;
};

// One pass over every row: the UCX limit, kvtier over UCX (and gRPC), memcpy, Redis. Appends to `rows`
// (and with --json one put batch's breakdown per path, size and batch to `breakdowns`);
// clears `ok` when a kvtier row lost blocks. Returns false when the run cannot go on (a server did not
// start, a client did not connect).
bool MeasureOnce(const BenchPlan& plan, std::vector<Row>& rows, nlohmann::json& breakdowns, bool& ok) {
  const auto& [paths, blocks, batches, perftest, do_memcpy, redis, server, host_bytes] = plan;
  for (const std::string& path : paths) {
    // The UCX limit first, while no kvtier process competes for the cores.
    if (!perftest.empty()) {
      for (uint64_t b : blocks) {
        if (auto r = MeasurePerftest(perftest, path, b); r.has_value()) {
          rows.push_back(*r);
        } else {
          std::fprintf(stderr, "transfer_bench: ucx_perftest did not run for %s, %llu bytes\n", path.c_str(),
                       static_cast<unsigned long long>(b));
        }
      }
    }
    auto srv = StartServer(server, UcxTls(path), host_bytes);
    if (srv == nullptr) return false;
    std::unique_ptr<ServerChild> auth_srv;
    if (absl::GetFlag(FLAGS_auth)) {
      auth_srv = StartServer(server, UcxTls(path), host_bytes, kBenchToken);
      if (auth_srv == nullptr) return false;
    }
    uint64_t seed = std::hash<std::string>{}(path) ^ static_cast<uint64_t>(getpid());
    // Row transport "ucx-auth": client transport ucx with the token, against the server with tokens.
    std::vector<std::pair<std::string, std::string>> transports = {{"ucx", UcxTls(path)}};
    if (auth_srv != nullptr) transports.push_back({"ucx-auth", UcxTls(path)});
    if (absl::GetFlag(FLAGS_grpc) && path == paths.front()) transports.push_back({"grpc", ""});  // same on both
    for (const auto& [row_transport, tls] : transports) {
      const bool with_auth = row_transport == "ucx-auth";
      const std::string transport = with_auth ? "ucx" : row_transport;
      const std::string address = absl::StrCat("127.0.0.1:", with_auth ? auth_srv->grpc_port : srv->grpc_port);
      kvtier::client::ClientOptions options{.members = {address},
                                            .rpc_timeout = absl::Seconds(30),
                                            .put_batch_blocks = absl::GetFlag(FLAGS_put_batch_blocks),
                                            .transport = transport,
                                            .ucx_transports = tls};
      if (with_auth) options.auth_token = kBenchToken;
      auto client = Client::Connect(options);
      if (!client.ok()) {
        std::fprintf(stderr, "transfer_bench: %s\n", std::string(client.status().message()).c_str());
        return false;
      }
      if ((*client)->members()[0].transport != transport) {
        std::fprintf(stderr, "transfer_bench: wanted %s, the client uses %s\n", transport.c_str(),
                     (*client)->members()[0].transport.c_str());
        ok = false;
      }
      for (uint64_t b : blocks) {
        for (uint64_t n : batches) {
          // gRPC bytes always ride loopback TCP, whatever the UCX path: measured once, as tcp.
          MeasureClient(**client, transport == "grpc" ? "tcp" : path, row_transport, b, static_cast<uint32_t>(n), rows,
                        seed);
        }
      }
      ok &= (*client)->stats().misses_from_errors.load() == 0;
    }
    if (absl::GetFlag(FLAGS_json) && absl::GetFlag(FLAGS_ops).find("put") != std::string::npos) {
      for (uint64_t b : blocks) {
        for (uint64_t n : batches) {
          nlohmann::json j = MeasurePutBreakdown(absl::StrCat("127.0.0.1:", srv->ucx_port), UcxTls(path), b,
                                                 static_cast<uint32_t>(n), seed);
          j["path"] = path;
          j["block_bytes"] = b;
          j["batch"] = n;
          breakdowns.push_back(std::move(j));
        }
      }
    }
    // Concurrent clients, each its own process, against the server without tokens.
    for (uint64_t n_clients : ParseList(absl::GetFlag(FLAGS_clients))) {
      if (n_clients <= 1) continue;
      for (uint64_t b : blocks) {
        for (uint64_t n : batches) {
          MeasureClients(absl::StrCat("127.0.0.1:", srv->grpc_port), path, UcxTls(path), b, static_cast<uint32_t>(n),
                         static_cast<int>(n_clients), rows, seed);
        }
      }
    }
  }
  if (do_memcpy) {
    for (uint64_t b : blocks) {
      for (uint64_t n : batches) MeasureMemcpy(b, static_cast<uint32_t>(n), rows);
    }
  }
  if (!redis.empty()) {
    for (uint64_t b : blocks) {
      for (uint64_t n : batches) MeasureRedis(redis, b, static_cast<uint32_t>(n), rows);
    }
  }

  return true;
}

// Row by row (rows are in the same order in every pass), the pass with the median GB/s; gbps_min and
// gbps_max keep the spread. Rows missing from some pass (a limit that did not run) use the passes they
// are in.
std::vector<Row> MedianRows(const std::vector<std::vector<Row>>& passes) {
  using Key = std::tuple<std::string, std::string, std::string, uint64_t, uint32_t, int>;
  std::map<Key, std::vector<Row>> by_key;
  std::vector<Key> order;
  for (const auto& pass : passes) {
    for (const Row& r : pass) {
      auto key = std::make_tuple(r.path, r.transport, r.operation, r.block_bytes, r.batch, r.clients);
      auto [it, inserted] = by_key.try_emplace(key);
      if (inserted) order.push_back(key);
      it->second.push_back(r);
    }
  }
  std::vector<Row> out;
  for (const auto& key : order) {
    std::vector<Row>& runs = by_key[key];
    std::sort(runs.begin(), runs.end(), [](const Row& a, const Row& b) { return a.gbps < b.gbps; });
    Row r = runs[runs.size() / 2];
    r.passes = static_cast<int>(runs.size());
    r.gbps_min = runs.front().gbps;
    r.gbps_max = runs.back().gbps;
    for (const Row& run : runs) {
      if (r.note.empty() && !run.note.empty() && run.transport != "ucx_perftest") r.note = run.note;  // failures show
    }
    out.push_back(std::move(r));
  }
  return out;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Batched get/put throughput of kvtier over UCX and gRPC, next to memcpy and "
      "ucx_perftest. See bench/README.md.");
  absl::ParseCommandLine(argc, argv);
  setenv("UCX_NET_DEVICES", "lo", /*overwrite=*/0);  // stay on 127.0.0.1 (TOOLCHAIN.md pitfall 6)
  std::signal(SIGPIPE, SIG_IGN);
  if (!absl::GetFlag(FLAGS_worker_address).empty()) return RunWorker();

  std::vector<std::string> paths = absl::StrSplit(absl::GetFlag(FLAGS_paths), ',', absl::SkipEmpty());
  std::vector<uint64_t> blocks = ParseList(absl::GetFlag(FLAGS_block_bytes));
  std::vector<uint64_t> batches = ParseList(absl::GetFlag(FLAGS_batches));
  std::string perftest = absl::GetFlag(FLAGS_perftest);
  bool do_memcpy = absl::GetFlag(FLAGS_memcpy);
  std::string redis = absl::GetFlag(FLAGS_redis);
  if (absl::GetFlag(FLAGS_smoke)) {
    paths = {"tcp"};
    blocks = {64 << 10};
    batches = {2};
    absl::SetFlag(&FLAGS_min_iters, 3);
    absl::SetFlag(&FLAGS_max_iters, 3);
    absl::SetFlag(&FLAGS_repeat, 1);
    perftest.clear();
    do_memcpy = false;
  }
  std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) server = DefaultServerBinary();
  uint64_t max_call = 0;
  for (uint64_t b : blocks) {
    for (uint64_t n : batches) max_call = std::max(max_call, b * n);
  }
  const uint64_t host_bytes = std::max<uint64_t>(256ULL << 20, 4 * max_call);

  for (const std::string& path : paths) {
    if (path != "shm" && path != "tcp") {
      std::fprintf(stderr, "transfer_bench: unknown path \"%s\" (shm or tcp)\n", path.c_str());
      return 2;
    }
  }
  const BenchPlan plan{.paths = paths,
                       .blocks = blocks,
                       .batches = batches,
                       .perftest = perftest,
                       .do_memcpy = do_memcpy,
                       .redis = redis,
                       .server = server,
                       .host_bytes = host_bytes};
  // Every pass measures every row once, limits included, so that a limit and the row compared with it
  // alternate; each row reports its median pass (a loaded or noisy machine moves single passes by 20%).
  const int repeat = std::max(1, absl::GetFlag(FLAGS_repeat));
  std::vector<std::vector<Row>> passes(repeat);
  bool ok = true;
  nlohmann::json breakdowns = nlohmann::json::array();  // every pass's
  for (auto& pass : passes) {
    if (!MeasureOnce(plan, pass, breakdowns, ok)) return 1;
  }
  const std::vector<Row> rows = MedianRows(passes);

  // Ratios to the limits of the same run, median to median: ucx_perftest of the same path and block size,
  // memcpy of the same block size and batch.
  std::map<std::pair<std::string, uint64_t>, double> perf;
  std::map<std::pair<uint64_t, uint32_t>, double> copy;
  std::map<std::tuple<std::string, uint64_t, uint32_t>, double> redis_gbps;  // (op, block, batch)
  // UCX rows of one client, (path, op, block, batch): what the rows of several clients scale against.
  std::map<std::tuple<std::string, std::string, uint64_t, uint32_t>, double> one_client;
  for (const Row& r : rows) {
    if (r.transport == "ucx_perftest") perf[{r.path, r.block_bytes}] = r.gbps;
    if (r.transport == "memcpy") copy[{r.block_bytes, r.batch}] = r.gbps;
    if (r.transport == "redis") redis_gbps[{r.operation, r.block_bytes, r.batch}] = r.gbps;
    if (r.transport == "ucx" && r.clients == 1) one_client[{r.path, r.operation, r.block_bytes, r.batch}] = r.gbps;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json j = {
        {"path", r.path},        {"transport", r.transport}, {"operation", r.operation}, {"block_bytes", r.block_bytes},
        {"batch", r.batch},      {"clients", r.clients},     {"gbps", r.gbps},           {"p50_us", r.p50_us},
        {"p99_us", r.p99_us},    {"calls", r.calls},         {"passes", r.passes},       {"gbps_min", r.gbps_min},
        {"gbps_max", r.gbps_max}};
    if (auto it = perf.find({r.path, r.block_bytes}); it != perf.end() && r.transport == "ucx" && it->second > 0) {
      j["ratio_to_ucx_perftest"] = r.gbps / it->second;
    }
    if (auto it = copy.find({r.block_bytes, r.batch}); it != copy.end() && r.transport != "memcpy" && it->second > 0) {
      j["ratio_to_memcpy"] = r.gbps / it->second;
    }
    if (auto it = redis_gbps.find({r.operation, r.block_bytes, r.batch});
        it != redis_gbps.end() && r.transport != "redis" && it->second > 0) {
      j["ratio_to_redis"] = r.gbps / it->second;
    }
    if (auto it = one_client.find({r.path, r.operation, r.block_bytes, r.batch});
        r.clients > 1 && it != one_client.end() && it->second > 0) {
      j["ratio_to_one_client"] = r.gbps / it->second;
      j["note"] = absl::StrFormat("%.2fx one client%s%s", r.gbps / it->second, r.note.empty() ? "" : "; ", r.note);
    } else if (!r.note.empty()) {
      j["note"] = r.note;
    }
    out.push_back(j);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", nlohmann::json{{"rows", out}, {"put_breakdown", breakdowns}}.dump().c_str());
  } else {
    std::printf("%-5s %-12s %-6s %10s %5s %8s %12s %10s %10s %8s %8s %8s  %s\n", "path", "transport", "op", "block",
                "batch", "GB/s", "min-max", "p50_us", "p99_us", "/perf", "/memcpy", "/redis", "note");
    for (const auto& j : out) {
      std::printf(
          "%-5s %-12s %-6s %10llu %5u %8.2f %12s %10.1f %10.1f %8s %8s %8s  %s\n", j["path"].get<std::string>().c_str(),
          (j["clients"].get<int>() > 1 ? absl::StrCat(j["transport"].get<std::string>(), " x", j["clients"].get<int>())
                                       : j["transport"].get<std::string>())
              .c_str(),
          j["operation"].get<std::string>().c_str(), static_cast<unsigned long long>(j["block_bytes"].get<uint64_t>()),
          j["batch"].get<uint32_t>(), j["gbps"].get<double>(),
          absl::StrFormat("%.2f-%.2f", j["gbps_min"].get<double>(), j["gbps_max"].get<double>()).c_str(),
          j["p50_us"].get<double>(), j["p99_us"].get<double>(),
          j.contains("ratio_to_ucx_perftest")
              ? absl::StrFormat("%.2f", j["ratio_to_ucx_perftest"].get<double>()).c_str()
              : "-",
          j.contains("ratio_to_memcpy") ? absl::StrFormat("%.2f", j["ratio_to_memcpy"].get<double>()).c_str() : "-",
          j.contains("ratio_to_redis") ? absl::StrFormat("%.2f", j["ratio_to_redis"].get<double>()).c_str() : "-",
          j.contains("note") ? j["note"].get<std::string>().c_str() : "");
    }
  }
  for (const Row& r : rows) ok &= r.note.empty() || r.transport == "ucx_perftest";  // the scaling note is not a row's
  return ok ? 0 : 1;
}
