// store_bench: how one BlockStore serves threads at once. N threads (--threads=1,2,4,8,16) run a mix of
// lookups, leased reads (AcquireRead, CopyOut, Release) and puts (Allocate, Write, Commit) against one
// in-process store, for a fixed time each; reports operations per second and p50/p99 per operation,
// and how a thread count scales against one thread of the same run. With --disk_blocks the host tier
// spills to a RocksDB disk tier in a temporary directory (a small host tier: a disk-bound workload).
// Each operation kind also reports its share of time spent holding the store's lock, and one of the
// committed index's shard locks (--lock_share; "lock" column: store% + shard%).
// See bench/README.md "store_bench".
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtier/common/checksum.h"
#include "kvtier/server/block_store.h"
#include "kvtier/server/timed_mutex.h"

ABSL_FLAG(std::string, threads, "1,2,4,8,16", "thread counts to run, each its own row set");
ABSL_FLAG(uint64_t, block_bytes, 64 << 10, "bytes per block");
ABSL_FLAG(uint64_t, host_blocks, 4096, "host tier capacity in blocks");
ABSL_FLAG(uint64_t, disk_blocks, 0, "disk tier capacity in blocks (0: no disk tier)");
ABSL_FLAG(uint64_t, keys, 8192, "distinct keys the workload draws from (more than host_blocks: evictions)");
ABSL_FLAG(uint32_t, batch, 8, "keys per operation");
ABSL_FLAG(double, put_share, 0.2, "share of operations that are puts");
ABSL_FLAG(double, read_share, 0.4, "share that are leased reads; the rest are lookups");
ABSL_FLAG(double, seconds, 2.0, "measured time per thread count");
ABSL_FLAG(bool, json, false, "print one JSON object");
ABSL_FLAG(bool, lock_share, true,
          "time every hold of a store lock, to report each operation's share of time holding one "
          "(two clock reads per lock)");

namespace {

using kvtier::BlockChecksum;
using kvtier::BlockKey;
using kvtier::CapabilityId;
using kvtier::server::AllocateOutcome;
using kvtier::server::BlockStore;
using kvtier::server::BlockStoreOptions;
using kvtier::server::NamespaceRef;
using kvtier::server::TimedMutex;

enum Op { kLookup = 0, kRead = 1, kPut = 2, kOps = 3 };
const char* kOpNames[kOps] = {"lookup", "read", "put"};

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

BlockKey KeyOf(uint64_t k) {
  BlockKey key;
  for (int i = 0; i < 8; ++i) key.fingerprint.bytes[i] = static_cast<uint8_t>(k >> (8 * i));
  key.fingerprint.bytes[8] = 0x5b;  // never all zero
  return key;
}

struct ThreadResult {
  std::vector<double> us[kOps];
  // Per operation kind: nanoseconds spent in the operations, and of them holding a store lock
  // (TimedMutex: the store's lock and the committed index's shard locks).
  uint64_t op_ns[kOps] = {}, held_ns[kOps] = {}, shard_held_ns[kOps] = {};
  uint64_t hits = 0, keys_asked = 0, put_failures = 0;
};

// One thread's loop until `stop`: draws an operation and a run of `batch` consecutive keys (a prefix).
void Worker(BlockStore& store, const NamespaceRef& ns, uint64_t seed, const std::atomic<bool>& stop,
            ThreadResult& out) {
  const uint64_t block = ns.block_bytes;
  const uint32_t batch = absl::GetFlag(FLAGS_batch);
  const uint64_t keys = absl::GetFlag(FLAGS_keys);
  const double put_share = absl::GetFlag(FLAGS_put_share), read_share = absl::GetFlag(FLAGS_read_share);
  std::mt19937_64 rng(seed);
  std::vector<std::byte> payload(block);
  for (uint64_t i = 0; i < block; i += 64) payload[i] = static_cast<std::byte>(seed + i);
  const uint64_t checksum = BlockChecksum(payload.data(), payload.size());
  std::vector<std::byte> dst(block);
  std::vector<BlockKey> run(batch);
  std::vector<uint32_t> depths(batch);
  std::uniform_real_distribution<double> coin(0, 1);
  while (!stop.load(std::memory_order_relaxed)) {
    const uint64_t first = (rng() % (keys / batch)) * batch;
    for (uint32_t i = 0; i < batch; ++i) {
      run[i] = KeyOf(first + i);
      depths[i] = i;
    }
    const double c = coin(rng);
    const Op op = c < put_share ? kPut : (c < put_share + read_share ? kRead : kLookup);
    const uint64_t held0 = TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kStore);
    const uint64_t shard_held0 = TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kIndexShard);
    const absl::Time t0 = absl::Now();
    if (op == kLookup) {
      auto r = store.Lookup(ns, run, absl::ZeroDuration());
      out.keys_asked += batch;
      out.hits += static_cast<uint64_t>(std::count(r.present.begin(), r.present.end(), true));
    } else if (op == kRead) {
      auto lease = store.AcquireRead(ns, run, absl::ZeroDuration());
      for (uint32_t i = 0; i < lease.blocks.size(); ++i) {
        if (lease.blocks[i].present) (void)store.CopyOut(lease.lease_id, i, 0, dst);
      }
      if (!lease.lease_id.null()) store.Release(std::span<const CapabilityId>(&lease.lease_id, 1));
    } else {
      auto a = store.Allocate(ns, run, depths);
      if (!a.ok()) {
        ++out.put_failures;
      } else if (!a->reservation_id.null()) {
        std::vector<uint64_t> sums(batch, 0);
        for (uint32_t i = 0; i < batch; ++i) {
          if (a->outcomes[i] != AllocateOutcome::kAllocated) continue;
          if (!store.Write(a->reservation_id, i, 0, payload).ok()) ++out.put_failures;
          sums[i] = checksum;
        }
        if (!store.Commit(a->reservation_id, sums).ok()) ++out.put_failures;
      }
    }
    const absl::Duration took = absl::Now() - t0;
    out.us[op].push_back(absl::ToDoubleMicroseconds(took));
    out.op_ns[op] += static_cast<uint64_t>(absl::ToInt64Nanoseconds(took));
    out.held_ns[op] += TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kStore) - held0;
    out.shard_held_ns[op] += TimedMutex::HeldNanosOfThisThread(TimedMutex::Kind::kIndexShard) - shard_held0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Operations per second of one BlockStore under N threads. See bench/README.md.");
  absl::ParseCommandLine(argc, argv);
  const uint64_t block = absl::GetFlag(FLAGS_block_bytes);
  const uint64_t disk_blocks = absl::GetFlag(FLAGS_disk_blocks);
  std::string disk_dir;
  if (disk_blocks > 0) {
    char tmpl[] = "/tmp/kvtier-store-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    disk_dir = tmpl;
  }
  BlockStoreOptions options;
  options.capacity_bytes = absl::GetFlag(FLAGS_host_blocks) * block;
  options.slab_bytes = std::max<uint64_t>(1 << 20, block);
  if (disk_blocks > 0) {
    options.disk_path = disk_dir + "/db";
    options.disk_capacity_bytes = disk_blocks * block;
  }
  auto store = BlockStore::Create(options);
  if (!store.ok()) {
    std::fprintf(stderr, "store_bench: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  const NamespaceRef ns{.id = 7, .tenant_id = kvtier::server::TenantId("bench"), .block_bytes = block};

  // Warm: every key put once, so reads and lookups find blocks from the start.
  {
    std::atomic<bool> stop{false};
    ThreadResult warm;
    const absl::Time until = absl::Now() + absl::Seconds(1);
    std::thread t([&] { Worker(**store, ns, 1, stop, warm); });
    while (absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
    stop = true;
    t.join();
  }

  nlohmann::json rows = nlohmann::json::array();
  double one_thread_ops = 0;
  for (const absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(t, &n) || n < 1) {
      std::fprintf(stderr, "store_bench: bad --threads entry \"%s\"\n", std::string(t).c_str());
      return 2;
    }
    TimedMutex::SetMeasuring(absl::GetFlag(FLAGS_lock_share));
    std::vector<ThreadResult> results(n);
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] { Worker(**store, ns, 1000 + i * 7919 + n, stop, results[i]); });
    }
    absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
    stop = true;
    for (auto& th : threads) th.join();
    TimedMutex::SetMeasuring(false);
    const double elapsed_s = absl::ToDoubleSeconds(absl::Now() - start);
    nlohmann::json row = {{"threads", n}};
    uint64_t total = 0, hits = 0, asked = 0, failures = 0;
    for (int op = 0; op < kOps; ++op) {
      std::vector<double> all;
      uint64_t op_ns = 0, held_ns = 0, shard_held_ns = 0;
      for (auto& r : results) {
        all.insert(all.end(), r.us[op].begin(), r.us[op].end());
        op_ns += r.op_ns[op];
        held_ns += r.held_ns[op];
        shard_held_ns += r.shard_held_ns[op];
      }
      total += all.size();
      row[kOpNames[op]] = {
          {"ops_per_s", static_cast<double>(all.size()) / elapsed_s},
          {"p50_us", Percentile(all, 0.5)},
          {"p99_us", Percentile(all, 0.99)},
          {"lock_share", op_ns > 0 ? static_cast<double>(held_ns) / static_cast<double>(op_ns) : 0},
          {"shard_lock_share", op_ns > 0 ? static_cast<double>(shard_held_ns) / static_cast<double>(op_ns) : 0}};
    }
    for (auto& r : results) {
      hits += r.hits;
      asked += r.keys_asked;
      failures += r.put_failures;
    }
    const double ops = static_cast<double>(total) / elapsed_s;
    if (n == 1) one_thread_ops = ops;
    row["ops_per_s"] = ops;
    row["scaling_to_one_thread"] = one_thread_ops > 0 ? ops / one_thread_ops : 0;
    row["lookup_hit_ratio"] = asked > 0 ? static_cast<double>(hits) / static_cast<double>(asked) : 0;
    row["put_failures"] = failures;
    rows.push_back(row);
  }
  const auto& stats = (*store)->stats();
  nlohmann::json out = {{"block_bytes", block},
                        {"host_blocks", absl::GetFlag(FLAGS_host_blocks)},
                        {"disk_blocks", disk_blocks},
                        {"keys", absl::GetFlag(FLAGS_keys)},
                        {"batch", absl::GetFlag(FLAGS_batch)},
                        {"cores", std::thread::hardware_concurrency()},
                        {"demotions", stats.demotions.load()},
                        {"promotions", stats.promotions.load()},
                        {"rows", rows}};
  store->reset();
  if (!disk_dir.empty()) std::filesystem::remove_all(disk_dir);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("block %llu B, host %llu blocks, disk %llu blocks, %llu keys, batch %u, %u cores\n",
              static_cast<unsigned long long>(block), static_cast<unsigned long long>(absl::GetFlag(FLAGS_host_blocks)),
              static_cast<unsigned long long>(disk_blocks), static_cast<unsigned long long>(absl::GetFlag(FLAGS_keys)),
              absl::GetFlag(FLAGS_batch), std::thread::hardware_concurrency());
  std::printf("%7s %10s %8s  %-28s %-28s %-28s\n", "threads", "ops/s", "x1 thr", "lookup ops/s p50/p99 us lock",
              "read ops/s p50/p99 us lock", "put ops/s p50/p99 us lock");
  for (const auto& r : rows) {
    auto cell = [&](const char* op) {
      return absl::StrCat(static_cast<int64_t>(r[op]["ops_per_s"].get<double>()), " ",
                          static_cast<int64_t>(r[op]["p50_us"].get<double>()), "/",
                          static_cast<int64_t>(r[op]["p99_us"].get<double>()), " ",
                          static_cast<int64_t>(r[op]["lock_share"].get<double>() * 100), "%+",
                          static_cast<int64_t>(r[op]["shard_lock_share"].get<double>() * 100), "%");
    };
    std::printf("%7d %10.0f %8.2f  %-28s %-28s %-28s\n", r["threads"].get<int>(), r["ops_per_s"].get<double>(),
                r["scaling_to_one_thread"].get<double>(), cell("lookup").c_str(), cell("read").c_str(),
                cell("put").c_str());
  }
  std::printf("demotions %llu, promotions %llu\n", static_cast<unsigned long long>(out["demotions"].get<uint64_t>()),
              static_cast<unsigned long long>(out["promotions"].get<uint64_t>()));
  return 0;
}
