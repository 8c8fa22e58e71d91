// KV events in vLLM's format end to end (docs/events.md, "vLLM format"): a kvtier-server process with
// `events.format: both`, a real ZeroMQ SUB on its vLLM endpoint and a DEALER on its vLLM replay ROUTER.
// Puts through the client library fill a 1 MiB host tier until it evicts; the stream, decoded as a vLLM
// subscriber would, rebuilds exactly what the server lists, and the replay socket returns the batches a
// late subscriber missed, then vLLM's end marker. Malformed replay requests are survived.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "kvtier/client/client.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/events.grpc.pb.h"
#include "replayer.h"
#include "testing/msgpack_reader.h"
#include "testing/scrape_metrics.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::MsgpackReader;
using testing::MsgpackValue;
using testing::ServerProcess;

constexpr char kTopic[] = "kv-events";

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

uint64_t Be64(const std::string& b) {
  uint64_t v = 0;
  for (unsigned char c : b) v = (v << 8) | c;
  return v;
}
std::string Be64Bytes(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

// One multipart message, or an empty vector when none arrives within `timeout_ms`.
std::vector<std::string> Recv(void* socket, int timeout_ms) {
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return {};
  std::vector<std::string> frames;
  bool more = true;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) {
      zmq_msg_close(&msg);
      break;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
  }
  return frames;
}

void Send(void* socket, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    ASSERT_GE(zmq_send(socket, frames[i].data(), frames[i].size(), i + 1 < frames.size() ? ZMQ_SNDMORE : 0), 0);
  }
}

uint64_t IntHash(const Fingerprint& fp) {
  uint64_t v = 0;
  for (size_t i = 24; i < 32; ++i) v = (v << 8) | fp.bytes[i];
  return v;
}

class VllmEventsTest : public ::testing::Test {
 protected:
  virtual std::string Format() const { return "  format: both\n"; }
  virtual std::vector<std::string> ExtraArgs(const std::string& /*dir*/) const { return {}; }

  void SetUp() override {
    pub_port_ = FreePort();
    replay_port_ = FreePort();
    ASSERT_NE(pub_port_, 0);
    ASSERT_NE(replay_port_, 0);
    ASSERT_NE(pub_port_, replay_port_);
    char dir[] = "/tmp/kvtier-vllm-events-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    config_ = std::string(dir) + "/server.yaml";
    std::ofstream(config_) << "events:\n  enabled: true\n"
                           << Format() << "  pub_endpoint: tcp://127.0.0.1:0\n"
                           << "  vllm_pub_endpoint: tcp://127.0.0.1:" << pub_port_ << "\n"
                           << "  vllm_replay_endpoint: tcp://127.0.0.1:" << replay_port_ << "\n"
                           << "  vllm_topic: " << kTopic << "\n  vllm_block_size: 16\n"
                           << "  max_batch_events: 16\n  heartbeat_interval: 100ms\n";
    // 1 MiB of 4 KiB blocks: 256 blocks, so the workload evicts.
    std::vector<std::string> args = {"--config=" + config_, "--host_cache_bytes=1MiB", "--slab_bytes=1MiB",
                                     "--max_block_bytes=1MiB"};
    for (auto& a : ExtraArgs(dir)) args.push_back(std::move(a));
    args_ = args;
    auto p = ServerProcess::Start("vllm-node", args);
    ASSERT_OK(p);
    proc_ = std::move(p).value();
    auto c = client::Client::Connect({.members = {proc_->address()}, .rpc_timeout = absl::Milliseconds(2000)});
    ASSERT_OK(c);
    client_ = std::move(c).value();
    auto ns = bench::ReplayNamespace(ro_);
    ASSERT_OK(ns);
    ns_ = *ns;
    ctx_ = zmq_ctx_new();
    ASSERT_NE(ctx_, nullptr);
  }

  void TearDown() override {
    for (void* s : sockets_) zmq_close(s);
    if (ctx_ != nullptr) zmq_ctx_term(ctx_);
    std::remove(config_.c_str());
  }

  void* Socket(int type, int port) {
    void* s = zmq_socket(ctx_, type);
    const int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (type == ZMQ_SUB) zmq_setsockopt(s, ZMQ_SUBSCRIBE, kTopic, sizeof(kTopic) - 1);
    const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
    EXPECT_EQ(zmq_connect(s, ep.c_str()), 0);
    sockets_.push_back(s);
    return s;
  }

  void Put(int prompts) {
    for (int p = 0; p < prompts; ++p) {
      std::vector<uint32_t> tokens(8 * ro_.block_tokens);
      for (auto& t : tokens) t = static_cast<uint32_t>(rng_() % 50000);
      auto fps = ChainFingerprints(ns_, tokens);
      ASSERT_OK(fps);
      std::vector<std::vector<std::byte>> data(fps->size(), std::vector<std::byte>(ro_.block_bytes));
      std::vector<std::span<const std::byte>> views;
      for (auto& d : data) {
        bench::BlockPayload(next_id_++, d);
        views.emplace_back(d);
      }
      for (size_t j = 0; j < fps->size(); ++j) {
        parent_of_[IntHash((*fps)[j])] = j == 0 ? 0 : IntHash((*fps)[j - 1]);
        parent_fp_of_[(*fps)[j]] = j == 0 ? std::nullopt : std::optional<Fingerprint>((*fps)[j - 1]);
      }
      ASSERT_OK(client_->Put(ns_, *fps, 0, views));
    }
  }

  // The kvtier-format events of the current instance from seq 1, through gRPC Replay.
  std::vector<v1::KvEvent> KvtierEvents() {
    auto stub = v1::EventService::NewStub(grpc::CreateChannel(proc_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext info_ctx;
    v1::GetEventsInfoResponse info;
    EXPECT_TRUE(stub->GetEventsInfo(&info_ctx, v1::GetEventsInfoRequest(), &info).ok());
    v1::ReplayRequest req;
    req.set_instance_id(info.instance_id());
    req.set_from_seq(1);
    grpc::ClientContext ctx;
    auto reader = stub->Replay(&ctx, req);
    std::vector<v1::KvEvent> out;
    v1::KvEventBatch batch;
    while (reader->Read(&batch)) out.insert(out.end(), batch.events().begin(), batch.events().end());
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

  // Checks every kvtier-format BlockStored of `events` against parent_fp_of_: the block's
  // parent_fingerprint is the previous block of its prompt (empty for the first), and the engine
  // metadata never repeats it. Returns the number checked.
  size_t CheckParentFingerprints(const std::vector<v1::KvEvent>& events) {
    size_t checked = 0;
    for (const v1::KvEvent& e : events) {
      if (!e.has_stored()) continue;
      const v1::EventBlock& b = e.stored().block();
      Fingerprint fp;
      std::copy(b.fingerprint().begin(), b.fingerprint().end(), reinterpret_cast<char*>(fp.bytes.data()));
      auto it = parent_fp_of_.find(fp);
      EXPECT_NE(it, parent_fp_of_.end()) << "a block never put: " << fp.Hex();
      if (it == parent_fp_of_.end()) continue;
      const std::string want =
          it->second.has_value() ? std::string(reinterpret_cast<const char*>(it->second->bytes.data()), 32) : "";
      EXPECT_EQ(b.parent_fingerprint(), want) << fp.Hex();
      EXPECT_TRUE(b.engine().parent_fingerprint().empty()) << fp.Hex();
      ++checked;
    }
    return checked;
  }

  // The server's blocks as vLLM int block hashes (Admin ListBlocks).
  std::set<uint64_t> Listed() {
    auto stub = v1::AdminService::NewStub(grpc::CreateChannel(proc_->address(), grpc::InsecureChannelCredentials()));
    std::set<uint64_t> out;
    uint64_t cursor = 0;
    do {
      v1::ListBlocksRequest req;
      req.set_cursor(cursor);
      req.set_limit(1000);
      v1::ListBlocksResponse resp;
      grpc::ClientContext ctx;
      const grpc::Status s = stub->ListBlocks(&ctx, req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const auto& b : resp.blocks()) {
        Fingerprint fp;
        std::copy(b.fingerprint().begin(), b.fingerprint().end(), reinterpret_cast<char*>(fp.bytes.data()));
        out.insert(IntHash(fp));
      }
      cursor = resp.next_cursor();
    } while (cursor != 0);
    return out;
  }

  // The server's blocks as int block hash -> vLLM medium (Admin ListBlocks).
  std::map<uint64_t, std::string> ListedMedia() {
    auto stub = v1::AdminService::NewStub(grpc::CreateChannel(proc_->address(), grpc::InsecureChannelCredentials()));
    std::map<uint64_t, std::string> out;
    uint64_t cursor = 0;
    do {
      v1::ListBlocksRequest req;
      req.set_cursor(cursor);
      req.set_limit(1000);
      v1::ListBlocksResponse resp;
      grpc::ClientContext ctx;
      const grpc::Status s = stub->ListBlocks(&ctx, req, &resp);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      for (const auto& b : resp.blocks()) {
        Fingerprint fp;
        std::copy(b.fingerprint().begin(), b.fingerprint().end(), reinterpret_cast<char*>(fp.bytes.data()));
        out[IntHash(fp)] = b.tier() == "disk" ? "DISK" : b.tier() == "hbm" ? "GPU" : "CPU";
      }
      cursor = resp.next_cursor();
    } while (cursor != 0);
    return out;
  }

  // Asks the replay socket for every batch from `start`: (seq, payload) in order, up to the end marker,
  // which must come (seq -1, empty payload).
  std::vector<std::pair<uint64_t, std::string>> Replay(void* dealer, uint64_t start) {
    Send(dealer, {"", Be64Bytes(start)});
    std::vector<std::pair<uint64_t, std::string>> out;
    while (true) {
      auto f = Recv(dealer, 30000);
      EXPECT_EQ(f.size(), 3u) << "no end marker";
      if (f.size() != 3) break;
      EXPECT_EQ(f[0], "");
      EXPECT_EQ(f[1].size(), 8u);
      if (f[1] == std::string(8, '\xff')) {
        EXPECT_EQ(f[2], "");
        break;
      }
      out.emplace_back(Be64(f[1]), f[2]);
    }
    return out;
  }

  // Applies vLLM batches to a set of int block hashes; counts events by tag.
  void Apply(const std::string& payload, std::set<uint64_t>& blocks, std::map<std::string, int>& tags) {
    auto v = MsgpackReader::Decode(payload);
    ASSERT_OK(v);
    ASSERT_EQ(v->type, MsgpackValue::Type::kArray);
    ASSERT_EQ(v->items.size(), 3u);  // [ts, events, data_parallel_rank]
    EXPECT_TRUE(v->items[0].f64);
    EXPECT_GT(v->items[0].f, 1.6e9);  // seconds since the epoch
    EXPECT_EQ(v->items[2].u, 0u);
    for (const MsgpackValue& e : v->items[1].items) {
      ASSERT_FALSE(e.items.empty());
      const std::string& tag = e.items[0].s;
      ++tags[tag];
      if (tag == "BlockStored") {
        ASSERT_EQ(e.items.size(), 8u);
        ASSERT_EQ(e.items[1].items.size(), 1u);  // one block per event
        // parent_block_hash: the previous block of its prompt, named as the block is (its fingerprint);
        // nil for a prompt's first block.
        auto parent = parent_of_.find(e.items[1].items[0].u);
        EXPECT_NE(parent, parent_of_.end()) << "a block never put";
        if (parent != parent_of_.end() && parent->second == 0) {
          EXPECT_TRUE(e.items[2].is_nil());
        } else if (parent != parent_of_.end()) {
          EXPECT_EQ(e.items[2].u, parent->second);
        }
        EXPECT_TRUE(e.items[3].items.empty());  // token_ids
        EXPECT_EQ(e.items[4].u, 16u);           // block_size
        EXPECT_TRUE(e.items[5].is_nil());       // lora_id
        EXPECT_EQ(e.items[6].s, "CPU");         // medium: the host tier
        EXPECT_TRUE(e.items[7].is_nil());       // lora_name
        for (const auto& h : e.items[1].items) blocks.insert(h.u);
      } else if (tag == "BlockRemoved") {
        ASSERT_EQ(e.items.size(), 3u);
        EXPECT_EQ(e.items[2].s, "CPU");
        for (const auto& h : e.items[1].items) EXPECT_EQ(blocks.erase(h.u), 1u) << "removed a block never stored";
      } else if (tag == "AllBlocksCleared") {
        ASSERT_EQ(e.items.size(), 1u);
        blocks.clear();
      } else {
        ADD_FAILURE() << "unknown tag " << tag;
      }
    }
  }

  bench::ReplayOptions ro_{.block_tokens = 16, .block_bytes = 2 * 16 * 2 * 64};
  Namespace ns_;
  std::string config_;
  int pub_port_ = 0;
  int replay_port_ = 0;
  std::vector<std::string> args_;  // the server's arguments, for a restart
  std::unique_ptr<ServerProcess> proc_;
  std::unique_ptr<client::Client> client_;
  void* ctx_ = nullptr;
  std::vector<void*> sockets_;
  std::mt19937_64 rng_{7};
  uint64_t next_id_ = 1;
  std::map<uint64_t, uint64_t> parent_of_;  // int block hash -> its parent's put by Put (0: none)
  std::map<Fingerprint, std::optional<Fingerprint>> parent_fp_of_;  // the same by fingerprint
};

TEST_F(VllmEventsTest, StreamAndReplayRebuildTheServersBlocks) {
  void* sub = Socket(ZMQ_SUB, pub_port_);
  void* dealer = Socket(ZMQ_DEALER, replay_port_);
  // The SUB joins after the server's first batch (AllBlocksCleared at start), and may miss more while
  // its subscription propagates: the replay socket fills the gap, as for any vLLM subscriber.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Put(48);  // 384 blocks into 256 slots: evictions

  // Replay from 0 until the rebuilt set equals the server's list (the publisher sends asynchronously).
  std::vector<std::pair<uint64_t, std::string>> all;
  std::set<uint64_t> replayed;
  std::map<std::string, int> tags;
  const std::set<uint64_t> listed = Listed();
  ASSERT_GT(listed.size(), 100u);
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       std::chrono::steady_clock::now() < deadline;) {
    all = Replay(dealer, 0);
    replayed.clear();
    tags.clear();
    for (const auto& [seq, payload] : all) Apply(payload, replayed, tags);
    if (replayed == listed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_FALSE(all.empty());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i].first, i) << "vLLM seqs are 0, 1, 2, ...";
  EXPECT_EQ(replayed, listed);
  EXPECT_EQ(tags["AllBlocksCleared"], 1);  // the server's first event
  EXPECT_GE(tags["BlockStored"], 384);
  EXPECT_GE(tags["BlockRemoved"], 384 - 256);
  EXPECT_EQ(
      testing::MetricValue(testing::ScrapeMetrics(proc_->metrics_port()), "kvtier_event_vllm_batches_published_total"),
      static_cast<double>(all.size()));

  // The live stream: [topic, seq, payload], each payload the same bytes the replay returned.
  const uint64_t last = all.back().first;
  std::set<uint64_t> live;
  bool saw_removed = false;
  while (live.empty() || *live.rbegin() < last) {
    auto f = Recv(sub, 30000);
    ASSERT_EQ(f.size(), 3u) << "the SUB got no message within 30 s; live seqs so far: " << live.size();
    EXPECT_EQ(f[0], kTopic);
    ASSERT_EQ(f[1].size(), 8u);
    const uint64_t seq = Be64(f[1]);
    ASSERT_LE(seq, last);
    EXPECT_EQ(f[2], all[seq].second) << "seq " << seq;
    saw_removed = saw_removed || f[2].find("BlockRemoved") != std::string::npos;
    live.insert(seq);
  }
  EXPECT_TRUE(saw_removed);
  EXPECT_GE(live.size(), all.size() / 2) << "the SUB should see most of the stream live";

  // A replay from the middle returns exactly the tail; one past the end only the end marker.
  const uint64_t mid = last / 2;
  auto tail = Replay(dealer, mid);
  ASSERT_EQ(tail.size(), last - mid + 1);
  for (size_t i = 0; i < tail.size(); ++i) {
    EXPECT_EQ(tail[i].first, mid + i);
    EXPECT_EQ(tail[i].second, all[mid + i].second);
  }
  EXPECT_TRUE(Replay(dealer, last + 100).empty());

  // An operator's evict-all is AllBlocksCleared on the live stream.
  auto stub = v1::AdminService::NewStub(grpc::CreateChannel(proc_->address(), grpc::InsecureChannelCredentials()));
  v1::EvictRequest req;
  req.set_all(true);
  v1::EvictResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Evict(&ctx, req, &resp).ok());
  bool cleared = false;
  while (!cleared) {
    auto f = Recv(sub, 30000);
    ASSERT_EQ(f.size(), 3u) << "no AllBlocksCleared after evict-all";
    std::set<uint64_t> blocks = listed;
    std::map<std::string, int> t;
    Apply(f[2], blocks, t);
    cleared = t["AllBlocksCleared"] > 0;
  }
  // The kvtier-format stream runs alongside (format: both); each stored block names its parent's
  // fingerprint.
  auto events = v1::EventService::NewStub(grpc::CreateChannel(proc_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext info_ctx;
  v1::GetEventsInfoResponse info;
  ASSERT_TRUE(events->GetEventsInfo(&info_ctx, v1::GetEventsInfoRequest(), &info).ok());
  EXPECT_GT(info.last_seq(), 384u);
  EXPECT_GE(CheckParentFingerprints(KvtierEvents()), 384u);
}

TEST_F(VllmEventsTest, MalformedReplayRequestsAreSurvived) {
  void* dealer = Socket(ZMQ_DEALER, replay_port_);
  Put(2);
  // No empty delimiter (two frames at the ROUTER), too many frames, a 5-byte seq, an empty seq.
  Send(dealer, {Be64Bytes(0)});
  Send(dealer, {"", Be64Bytes(0), "x", "y"});
  Send(dealer, {"", "\x01\x02\x03\x04\x05"});
  Send(dealer, {"", ""});
  // The short seqs get the end marker alone; the others nothing. Then a good request is still served.
  for (int i = 0; i < 2; ++i) {
    auto f = Recv(dealer, 30000);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(f[1], std::string(8, '\xff'));
    EXPECT_EQ(f[2], "");
  }
  std::vector<std::pair<uint64_t, std::string>> got;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       got.size() < 2 && std::chrono::steady_clock::now() < deadline;) {
    got = Replay(dealer, 0);
  }
  ASSERT_GE(got.size(), 2u);  // AllBlocksCleared at start, then the puts' BlockStored
  EXPECT_EQ(got[0].first, 0u);
  // A client that asks and disconnects before reading costs the server nothing.
  for (int i = 0; i < 20; ++i) {
    void* gone = Socket(ZMQ_DEALER, replay_port_);
    Send(gone, {"", Be64Bytes(0)});
    zmq_close(gone);
    sockets_.pop_back();
  }
  EXPECT_EQ(Listed().size(), 16u);  // the server still answers
  const std::string page = testing::ScrapeMetrics(proc_->metrics_port());
  EXPECT_EQ(testing::MetricValue(page, "kvtier_event_vllm_replay_requests_total{result=\"malformed\"}"), 4);
  EXPECT_GE(testing::MetricValue(page, "kvtier_event_vllm_replay_requests_total{result=\"ok\"}"), 1);
  EXPECT_GE(testing::MetricValue(page, "kvtier_event_vllm_replayed_batches_total"), 2);
}

// format: vllm with the map encoding: no kvtier PUB socket, and batches keyed by field name.
class VllmMapEventsTest : public VllmEventsTest {
 protected:
  std::string Format() const override { return "  format: vllm\n  vllm_encoding: map\n"; }
};

TEST_F(VllmMapEventsTest, MapBatchesOnTheVllmStreamOnly) {
  void* dealer = Socket(ZMQ_DEALER, replay_port_);
  Put(1);
  std::vector<std::pair<uint64_t, std::string>> got;
  std::map<std::string, int> tags;
  std::set<uint64_t> stored;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       stored.size() < 8 && std::chrono::steady_clock::now() < deadline;) {
    got = Replay(dealer, 0);
    tags.clear();
    stored.clear();
    for (const auto& [seq, payload] : got) {
      auto v = MsgpackReader::Decode(payload);
      ASSERT_OK(v);
      ASSERT_EQ(v->type, MsgpackValue::Type::kMap);
      ASSERT_EQ(v->items.size(), 6u);  // ts, events, data_parallel_rank
      EXPECT_EQ(v->items[0].s, "ts");
      EXPECT_EQ(v->items[2].s, "events");
      EXPECT_EQ(v->items[4].s, "data_parallel_rank");
      for (const MsgpackValue& e : v->items[3].items) {
        ASSERT_EQ(e.type, MsgpackValue::Type::kMap);
        ASSERT_GE(e.items.size(), 2u);
        EXPECT_EQ(e.items[0].s, "type");
        ++tags[e.items[1].s];
        if (e.items[1].s == "BlockStored") {
          ASSERT_EQ(e.items.size(), 16u);
          EXPECT_EQ(e.items[2].s, "block_hashes");
          for (const auto& h : e.items[3].items) stored.insert(h.u);
          EXPECT_EQ(e.items[12].s, "medium");
          EXPECT_EQ(e.items[13].s, "CPU");
        }
      }
    }
  }
  EXPECT_EQ(tags["AllBlocksCleared"], 1);
  EXPECT_EQ(stored, Listed());
  auto events = v1::EventService::NewStub(grpc::CreateChannel(proc_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::GetEventsInfoResponse info;
  ASSERT_TRUE(events->GetEventsInfo(&ctx, v1::GetEventsInfoRequest(), &info).ok());
  EXPECT_EQ(info.pub_endpoint(), "") << "format vllm binds no kvtier PUB socket";
}

// A disk tier under the 1 MiB host tier: evictions demote blocks to disk (kvtier's BlockMoved), which
// the vLLM stream carries as BlockRemoved on "CPU" then BlockStored on "DISK" in the same batch.
class VllmDiskEventsTest : public VllmEventsTest {
 protected:
  std::vector<std::string> ExtraArgs(const std::string& dir) const override {
    return {"--disk_path=" + dir + "/disk", "--disk_capacity_bytes=64MiB"};
  }
};

TEST_F(VllmDiskEventsTest, TierMovesAreRemovedThenStoredOnTheNewMedium) {
  void* dealer = Socket(ZMQ_DEALER, replay_port_);
  Put(48);  // 384 blocks into 256 host slots: demotions to disk
  const std::map<uint64_t, std::string> listed = ListedMedia();
  size_t on_disk = 0;
  for (const auto& [h, m] : listed) on_disk += m == "DISK" ? 1 : 0;
  ASSERT_GT(on_disk, 0u) << "the workload should demote blocks to disk";
  EXPECT_GE(CheckParentFingerprints(KvtierEvents()), 384u);  // the kvtier format names the parents

  std::map<uint64_t, std::string> media;  // what the vLLM events say: block -> medium
  int moves = 0;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       std::chrono::steady_clock::now() < deadline;) {
    media.clear();
    moves = 0;
    for (const auto& [seq, payload] : Replay(dealer, 0)) {
      auto v = MsgpackReader::Decode(payload);
      ASSERT_OK(v);
      const auto& evs = v->items[1].items;
      for (size_t i = 0; i < evs.size(); ++i) {
        const auto& e = evs[i].items;
        if (e[0].s == "AllBlocksCleared") {
          media.clear();
          continue;
        }
        const std::string& medium = e[0].s == "BlockStored" ? e[6].s : e[2].s;
        for (const auto& h : e[1].items) {
          if (e[0].s == "BlockStored") {
            EXPECT_EQ(media.count(h.u), 0u) << "stored twice without a removal";
            media[h.u] = medium;
          } else {
            ASSERT_EQ(media.count(h.u), 1u) << "removed a block never stored";
            EXPECT_EQ(media[h.u], medium) << "removed from a medium it was not on";
            media.erase(h.u);
            // A move: the next event of the batch stores the same block on the new medium.
            if (i + 1 < evs.size() && evs[i + 1].items[0].s == "BlockStored" && evs[i + 1].items[1].items[0].u == h.u) {
              EXPECT_EQ(medium, "CPU");
              EXPECT_EQ(evs[i + 1].items[6].s, "DISK");
              ++moves;
            }
          }
        }
      }
    }
    if (media == listed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(media, listed);
  EXPECT_GE(moves, static_cast<int>(on_disk));
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Puts that carry the engine's metadata (its block hashes, token ids, LoRA id): the vLLM stream names
// the blocks by the engine's hashes and fills parent_block_hash, token_ids, block_size and lora_id; the
// blocks spilled to disk keep it across a restart on that disk, and the restarted server's stream (read
// through the replay socket) carries it again for every recovered block.
class VllmEngineMetaEventsTest : public VllmEventsTest {
 protected:
  std::vector<std::string> ExtraArgs(const std::string& dir) const override {
    return {"--disk_path=" + dir + "/disk", "--disk_capacity_bytes=64MiB"};
  }

  struct Expected {
    uint64_t parent = 0;  // 0: the first block of its prompt (nil)
    std::vector<uint32_t> tokens;
    std::optional<int64_t> lora;
  };

  // Puts `prompts` prompts of 8 blocks with metadata; engine hash of block j of prompt p: p * 100 + j + 1.
  void PutWithMeta(int prompts) {
    for (int p = 0; p < prompts; ++p) {
      std::vector<uint32_t> tokens(8 * ro_.block_tokens);
      for (auto& t : tokens) t = static_cast<uint32_t>(rng_() % 50000);
      auto fps = ChainFingerprints(ns_, tokens);
      ASSERT_OK(fps);
      std::vector<std::vector<std::byte>> data(fps->size(), std::vector<std::byte>(ro_.block_bytes));
      std::vector<std::span<const std::byte>> views;
      std::vector<BlockMeta> meta(fps->size());
      for (size_t j = 0; j < fps->size(); ++j) {
        bench::BlockPayload(next_id_++, data[j]);
        views.emplace_back(data[j]);
        const uint64_t h = static_cast<uint64_t>(p) * 100 + j + 1;
        meta[j].hash = EngineBlockHash::Uint(h);
        meta[j].token_ids.assign(tokens.begin() + static_cast<std::ptrdiff_t>(j * ro_.block_tokens),
                                 tokens.begin() + static_cast<std::ptrdiff_t>((j + 1) * ro_.block_tokens));
        if (p % 2 == 0) meta[j].lora_id = 3;
        expected_[h] = {.parent = j == 0 ? 0 : h - 1, .tokens = meta[j].token_ids, .lora = meta[j].lora_id};
        parent_fp_of_[(*fps)[j]] = j == 0 ? std::nullopt : std::optional<Fingerprint>((*fps)[j - 1]);
      }
      ASSERT_OK(client_->Put(ns_, *fps, 0, views, client::PutOptions{.block_meta = meta}));
    }
  }

  // Replays from 0 and applies every batch: engine hash -> medium of the blocks present; checks each
  // BlockStored against expected_.
  std::map<uint64_t, std::string> Rebuild(void* dealer) {
    std::map<uint64_t, std::string> present;
    for (const auto& [seq, payload] : Replay(dealer, 0)) {
      auto v = MsgpackReader::Decode(payload);
      EXPECT_OK(v);
      if (!v.ok()) continue;
      for (const MsgpackValue& e : v->items[1].items) {
        const std::string& tag = e.items[0].s;
        if (tag == "AllBlocksCleared") {
          present.clear();
        } else if (tag == "BlockStored") {
          EXPECT_EQ(e.items.size(), 8u);
          EXPECT_EQ(e.items[1].items.size(), 1u);
          const uint64_t h = e.items[1].items[0].u;
          auto it = expected_.find(h);
          EXPECT_NE(it, expected_.end()) << "a block named by something else than its engine hash: " << h;
          if (it == expected_.end()) continue;
          const Expected& x = it->second;
          if (x.parent == 0) {
            EXPECT_TRUE(e.items[2].is_nil()) << h;
          } else {
            EXPECT_EQ(e.items[2].u, x.parent) << h;
          }
          std::vector<uint32_t> tokens;
          for (const auto& t : e.items[3].items) tokens.push_back(static_cast<uint32_t>(t.u));
          EXPECT_EQ(tokens, x.tokens) << h;
          EXPECT_EQ(e.items[4].u, ro_.block_tokens);
          if (x.lora.has_value()) {
            EXPECT_EQ(e.items[5].u, static_cast<uint64_t>(*x.lora)) << h;
          } else {
            EXPECT_TRUE(e.items[5].is_nil()) << h;
          }
          present[h] = e.items[6].s;
        } else if (tag == "BlockRemoved") {
          EXPECT_EQ(present.erase(e.items[1].items[0].u), 1u) << "removed a block never stored";
        }
      }
    }
    return present;
  }

  std::map<uint64_t, Expected> expected_;
};

TEST_F(VllmEngineMetaEventsTest, EngineHashesTokensAndLoraSurviveARestartOnDisk) {
  PutWithMeta(48);  // 384 blocks into 256 host slots: demotions to disk
  void* dealer = Socket(ZMQ_DEALER, replay_port_);
  std::map<uint64_t, std::string> before;
  const size_t listed = Listed().size();
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       std::chrono::steady_clock::now() < deadline;) {
    before = Rebuild(dealer);
    if (before.size() == listed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(before.size(), listed);
  size_t on_disk = 0;
  for (const auto& [h, m] : before) on_disk += m == "DISK" ? 1 : 0;
  ASSERT_GT(on_disk, 0u) << "the workload should demote blocks to disk";
  EXPECT_GE(CheckParentFingerprints(KvtierEvents()), 384u);  // the kvtier format names the parents

  // A clean stop flushes the disk tier; the restarted server recovers its disk blocks with their
  // metadata and restates them on its new stream.
  client_.reset();
  proc_->KillAndWait(SIGTERM);
  proc_.reset();
  auto p = ServerProcess::Start("vllm-node", args_);
  ASSERT_OK(p);
  proc_ = std::move(p).value();
  zmq_close(dealer);
  sockets_.pop_back();
  dealer = Socket(ZMQ_DEALER, replay_port_);
  std::map<uint64_t, std::string> after;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       std::chrono::steady_clock::now() < deadline;) {
    after = Rebuild(dealer);
    if (after.size() >= on_disk) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(after.size(), on_disk);
  for (const auto& [h, m] : after) {
    EXPECT_EQ(m, "DISK") << h;
    EXPECT_EQ(before.count(h), 1u) << h;
  }
  // The parent fingerprints came back from the disk records too.
  EXPECT_EQ(CheckParentFingerprints(KvtierEvents()), on_disk);
}

TEST_F(VllmEngineMetaEventsTest, TooManyTokenIdsIsInvalidArgument) {
  std::vector<uint32_t> tokens(ro_.block_tokens, 1);
  auto fps = ChainFingerprints(ns_, tokens);
  ASSERT_OK(fps);
  std::vector<std::byte> data(ro_.block_bytes);
  std::vector<std::span<const std::byte>> views = {data};
  std::vector<BlockMeta> meta(1);
  meta[0].token_ids.assign(kMaxBlockTokenIds + 1, 1);
  auto r = client_->Put(ns_, *fps, 0, views, client::PutOptions{.block_meta = meta});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("token_ids"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace kvtier
