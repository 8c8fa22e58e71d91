// Security of a real kvtier-server process: mutual TLS on the gRPC port (and a plain health port),
// tenant tokens, tenant isolation of blocks, admin-only RPCs and per-tenant quotas. The certificates
// come from the openssl CLI in a temporary directory: a CA, a server certificate for 127.0.0.1 and
// localhost, a client certificate of that CA, and a second, untrusted CA with a client certificate.
#include <sys/wait.h>

#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvtier/client/client.h"
#include "kvtier/common/capability_id.h"
#include "kvtier/common/checksum.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/server/server_options.h"
#include "kvtier/ucx/ucx_client.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/wire/channel_security.h"
#include "kvtier/wire/wire.h"
#include "kvtierctl_runner.h"
#include "testing/server_process.h"
#include "testing/status_matchers.h"

namespace kvtier {
namespace {

using testing::ServerProcess;

constexpr char kTokenA[] = "token-of-tenant-a";
constexpr char kTokenB[] = "token-of-tenant-b";
constexpr char kTokenSmall[] = "token-of-tenant-small";
constexpr char kTokenAdmin[] = "token-of-the-operator";
constexpr uint64_t kSmallQuotaBlocks = 4;

Namespace TenantNamespace(const std::string& tenant) {
  return Namespace{.tenant = tenant,
                   .model = "test/model",
                   .layout = {.num_layers = 2, .num_kv_heads = 2, .head_dim = 64, .block_tokens = 16},
                   .tenant_salt = absl::StrCat("salt-of-", tenant)};
}

std::vector<uint32_t> Prompt(size_t blocks, uint32_t seed) {
  std::vector<uint32_t> tokens(blocks * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919 + seed * 104729) % 50000);
  return tokens;
}

bool RunQuietly(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Runs `cmd` through the shell; returns its exit code and stdout and stderr.
testing::CtlResult Shell(const std::string& cmd) {
  testing::CtlResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir_template[] = "/tmp/kvtier-sec-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = new std::string(dir_template);
    const std::string d = *dir_;
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    // Two CAs; the server's certificate names 127.0.0.1 and localhost; one client certificate per CA.
    ASSERT_TRUE(RunQuietly(absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/ca.key -out ", d,
                                        "/ca.pem -days 2 -subj /CN=kvtier-test-ca")));
    ASSERT_TRUE(RunQuietly(absl::StrCat("openssl req -x509 ", key, " -keyout ", d, "/evil-ca.key -out ", d,
                                        "/evil-ca.pem -days 2 -subj /CN=untrusted-ca")));
    std::ofstream(d + "/server.ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
    std::ofstream(d + "/client.ext") << "extendedKeyUsage=clientAuth\n";
    auto issue = [&](const std::string& name, const std::string& ca, const std::string& ext) {
      return RunQuietly(absl::StrCat("openssl req ", key, " -keyout ", d, "/", name, ".key -out ", d, "/", name,
                                     ".csr -subj /CN=", name)) &&
             RunQuietly(absl::StrCat("openssl x509 -req -in ", d, "/", name, ".csr -CA ", d, "/", ca, ".pem -CAkey ", d,
                                     "/", ca, ".key -CAcreateserial -days 2 -out ", d, "/", name, ".pem -extfile ", d,
                                     "/", ext));
    };
    ASSERT_TRUE(issue("server", "ca", "server.ext"));
    ASSERT_TRUE(issue("client", "ca", "client.ext"));
    ASSERT_TRUE(issue("evil-client", "evil-ca", "client.ext"));
    // Tenant B's token is listed by its SHA-256 only, the admin's in a separate tokens file.
    std::ofstream(d + "/tokens.yaml") << "- {token: " << kTokenAdmin << ", role: admin}\n";
    std::ofstream(d + "/kvtier.yaml") << "server:\n  health_address: 127.0.0.1:0\n"
                                      << "tls:\n  cert_file: " << d << "/server.pem\n  key_file: " << d
                                      << "/server.key\n"
                                      << "  client_ca_file: " << d << "/ca.pem\n  require_client_cert: true\n"
                                      << "auth:\n  tokens_file: " << d << "/tokens.yaml\n  tokens:\n"
                                      << "    - {token: " << kTokenA << ", tenant: tenant-a, role: worker}\n"
                                      << "    - {token_sha256: " << server::Sha256Hex(kTokenB)
                                      << ", tenant: tenant-b}\n"
                                      << "    - {token: " << kTokenSmall << ", tenant: small, role: worker}\n"
                                      << "quotas:\n  small: "
                                      << kSmallQuotaBlocks * TenantNamespace("small").layout.ShardBytes() << "\n";
    auto p =
        ServerProcess::Start("secure-node", {"--config=" + d + "/kvtier.yaml", "--ucx_listen_address=127.0.0.1:0"});
    ASSERT_OK(p);
    server_ = p->release();
  }

  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    if (dir_ != nullptr) {
      std::error_code ignored;
      std::filesystem::remove_all(*dir_, ignored);
      delete dir_;
      dir_ = nullptr;
    }
  }

  static std::string File(const std::string& name) { return absl::StrCat(*dir_, "/", name); }

  // A channel with the trusted CA, client certificate `cert` ("" = none) and bearer `token` ("" = none).
  static std::shared_ptr<grpc::Channel> Channel(const std::string& cert, const std::string& token) {
    wire::ChannelSecurity sec{.ca_file = File("ca.pem"),
                              .cert_file = cert.empty() ? "" : File(cert + ".pem"),
                              .key_file = cert.empty() ? "" : File(cert + ".key"),
                              .auth_token = token};
    auto creds = wire::MakeChannelCredentials(sec);
    EXPECT_OK(creds);
    return wire::CreateSecureChannel(server_->address(), *creds, grpc::ChannelArguments(), sec);
  }

  static client::ClientOptions ClientOptionsFor(const std::string& token) {
    return client::ClientOptions{.members = {server_->address()},
                                 .rpc_timeout = absl::Seconds(5),
                                 .transport = "grpc",
                                 .tls_ca_file = File("ca.pem"),
                                 .tls_cert_file = File("client.pem"),
                                 .tls_key_file = File("client.key"),
                                 .auth_token = token};
  }

  static std::unique_ptr<client::Client> ClientFor(const std::string& token) {
    auto c = client::Client::Connect(ClientOptionsFor(token));
    EXPECT_OK(c);
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Puts `fps` of `ns` (block i's bytes from testing::BlockBytes(size, seed + i)) and returns the results.
  static std::vector<client::PutResult> PutBlocks(client::Client& c, const Namespace& ns,
                                                  std::span<const Fingerprint> fps, uint64_t seed) {
    const uint64_t size = ns.layout.ShardBytes();
    std::vector<std::vector<std::byte>> data;
    std::vector<std::span<const std::byte>> views;
    for (size_t i = 0; i < fps.size(); ++i) data.push_back(testing::BlockBytes(size, seed + i));
    for (const auto& d : data) views.emplace_back(d);
    auto r = c.Put(ns, fps, 0, views);
    EXPECT_OK(r);
    return r.ok() ? *r : std::vector<client::PutResult>();
  }

  static v1::BlockKeys Keys(std::span<const Fingerprint> fps) {
    std::vector<BlockKey> keys;
    for (const Fingerprint& f : fps) keys.push_back({.fingerprint = f, .shard = 0});
    v1::BlockKeys out;
    wire::EncodeKeys(keys, &out);
    return out;
  }

  static uint64_t TenantBlocks(const std::string& tenant) {
    auto admin = v1::AdminService::NewStub(Channel("client", kTokenAdmin));
    grpc::ClientContext ctx;
    v1::ListBlocksRequest req;
    req.mutable_filter()->set_tenant(tenant);
    req.set_limit(10000);
    v1::ListBlocksResponse resp;
    EXPECT_TRUE(admin->ListBlocks(&ctx, req, &resp).ok());
    return static_cast<uint64_t>(resp.blocks_size());
  }

  static std::string* dir_;
  static ServerProcess* server_;
};

std::string* SecurityTest::dir_ = nullptr;
ServerProcess* SecurityTest::server_ = nullptr;

TEST_F(SecurityTest, IdenticalPromptsOfTwoTenantsNeverShareABlock) {
  const Namespace a = TenantNamespace("tenant-a");
  const Namespace b = TenantNamespace("tenant-b");
  const std::vector<uint32_t> prompt = Prompt(6, 1);
  auto fa = ChainFingerprints(a, prompt);
  auto fb = ChainFingerprints(b, prompt);
  ASSERT_OK(fa);
  ASSERT_OK(fb);
  const std::set<Fingerprint> set_a(fa->begin(), fa->end());
  for (const Fingerprint& f : *fb) EXPECT_EQ(set_a.count(f), 0u) << "a fingerprint shared across tenants";

  auto ca = ClientFor(kTokenA);
  auto cb = ClientFor(kTokenB);
  ASSERT_NE(ca, nullptr);
  ASSERT_NE(cb, nullptr);
  const uint64_t before_a = TenantBlocks("tenant-a");
  const uint64_t before_b = TenantBlocks("tenant-b");
  for (client::PutResult r : PutBlocks(*ca, a, *fa, 100)) EXPECT_EQ(r, client::PutResult::kStored);
  // The same prompt from tenant B is stored again, as B's own blocks, not found as A's.
  for (client::PutResult r : PutBlocks(*cb, b, *fb, 100)) EXPECT_EQ(r, client::PutResult::kStored);
  EXPECT_EQ(TenantBlocks("tenant-a"), before_a + fa->size());
  EXPECT_EQ(TenantBlocks("tenant-b"), before_b + fb->size());
}

TEST_F(SecurityTest, TenantBCannotReadOverwriteOrEvictTenantABlocksEvenKnowingTheirFingerprints) {
  const Namespace a = TenantNamespace("tenant-a");
  const Namespace b = TenantNamespace("tenant-b");
  auto fa = ChainFingerprints(a, Prompt(4, 2));
  ASSERT_OK(fa);
  auto ca = ClientFor(kTokenA);
  ASSERT_NE(ca, nullptr);
  for (client::PutResult r : PutBlocks(*ca, a, *fa, 200)) EXPECT_EQ(r, client::PutResult::kStored);

  auto cache_b = v1::CacheService::NewStub(Channel("client", kTokenB));
  auto admin_b = v1::AdminService::NewStub(Channel("client", kTokenB));
  auto cache_a = v1::CacheService::NewStub(Channel("client", kTokenA));
  v1::Namespace pa, pb;
  wire::ToProto(a, &pa);
  wire::ToProto(b, &pb);
  const v1::BlockKeys keys = Keys(*fa);

  {  // A's namespace with B's token: refused outright.
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    *req.mutable_namespace_() = pa;
    *req.mutable_keys() = keys;
    v1::LookupResponse resp;
    EXPECT_EQ(cache_b->Lookup(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    *req.mutable_namespace_() = pa;
    *req.mutable_keys() = keys;
    auto reader = cache_b->Read(&ctx, req);
    v1::ReadResponse msg;
    EXPECT_FALSE(reader->Read(&msg));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {  // The UCX data plane's lease: the same check.
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    *req.mutable_namespace_() = pa;
    *req.mutable_keys() = keys;
    v1::ReadResponse resp;
    EXPECT_EQ(cache_b->Lease(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(resp.lease_id(), "");
  }
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest req;
    *req.mutable_namespace_() = pa;
    *req.mutable_keys() = keys;
    v1::AllocateResponse resp;
    EXPECT_EQ(cache_b->Allocate(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {  // B's own namespace with A's fingerprints: misses, and no write over A's blocks.
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    *req.mutable_namespace_() = pb;
    *req.mutable_keys() = keys;
    v1::LookupResponse resp;
    ASSERT_TRUE(cache_b->Lookup(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.present_size(), static_cast<int>(fa->size()));
    for (bool present : resp.present()) EXPECT_FALSE(present);
  }
  {
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    *req.mutable_namespace_() = pb;
    *req.mutable_keys() = keys;
    auto reader = cache_b->Read(&ctx, req);
    v1::ReadResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    for (const auto& block : msg.blocks()) EXPECT_FALSE(block.present());
    while (reader->Read(&msg)) ADD_FAILURE() << "bytes of another tenant's block were streamed";
    EXPECT_TRUE(reader->Finish().ok());
  }
  {  // Nor can B lease them under its own namespace.
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    *req.mutable_namespace_() = pb;
    *req.mutable_keys() = keys;
    v1::ReadResponse resp;
    ASSERT_TRUE(cache_b->Lease(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.blocks_size(), static_cast<int>(fa->size()));
    for (const auto& block : resp.blocks()) EXPECT_FALSE(block.present());
    EXPECT_EQ(resp.lease_id(), "");
  }
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest req;
    *req.mutable_namespace_() = pb;
    *req.mutable_keys() = keys;
    v1::AllocateResponse resp;
    ASSERT_TRUE(cache_b->Allocate(&ctx, req, &resp).ok());
    for (int r : resp.results()) EXPECT_NE(r, v1::ALLOCATE_RESULT_ALLOCATED);
    EXPECT_EQ(resp.reservation_id(), "");
  }
  // Reservations and leases of A in the hands of B: LeakedIdsOfAnotherTenantAreAnsweredAsUnknownIds.
  {  // Admin RPCs (inspect, evict) need an admin token.
    grpc::ClientContext ctx;
    v1::InspectBlockRequest req;
    req.set_fingerprint(std::string(reinterpret_cast<const char*>((*fa)[0].bytes.data()), 32));
    v1::InspectBlockResponse resp;
    EXPECT_EQ(admin_b->InspectBlock(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    grpc::ClientContext evict_ctx;
    v1::EvictRequest evict;
    evict.mutable_filter()->set_tenant("tenant-a");
    v1::EvictResponse evicted;
    EXPECT_EQ(admin_b->Evict(&evict_ctx, evict, &evicted).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  // After all of it, A reads every block back intact.
  const uint64_t size = a.layout.ShardBytes();
  std::vector<std::vector<std::byte>> out(fa->size(), std::vector<std::byte>(size));
  std::vector<std::span<std::byte>> views(out.begin(), out.end());
  auto got = ca->Get(a, *fa, 0, views);
  ASSERT_OK(got);
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i], client::GetResult::kHit) << "block " << i;
    EXPECT_EQ(out[i], testing::BlockBytes(size, 200 + i)) << "block " << i;
  }
}

// The answers of the RPCs that take a lease or reservation id, as a caller sees them.
struct IdAnswer {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  std::string details;
  uint32_t released = 0;  // Release only
  bool operator==(const IdAnswer&) const = default;
};
std::ostream& operator<<(std::ostream& os, const IdAnswer& a) {
  return os << "{code " << a.code << ", \"" << a.message << "\", released " << a.released << "}";
}
IdAnswer AnswerOf(const grpc::Status& s) {
  return {.code = s.error_code(), .message = s.error_message(), .details = s.error_details()};
}

IdAnswer WriteWith(v1::CacheService::Stub& stub, const std::string& reservation_id, const std::string& data) {
  grpc::ClientContext ctx;
  v1::WriteBlocksResponse resp;
  auto writer = stub.WriteBlocks(&ctx, &resp);
  v1::WriteBlocksRequest chunk;
  chunk.set_reservation_id(reservation_id);
  chunk.set_index(0);
  chunk.set_data(data);
  writer->Write(chunk);
  writer->WritesDone();
  return AnswerOf(writer->Finish());
}
IdAnswer CommitWith(v1::CacheService::Stub& stub, const std::string& reservation_id, uint64_t checksum,
                    v1::CommitResponse* out = nullptr) {
  grpc::ClientContext ctx;
  v1::CommitRequest req;
  req.set_reservation_id(reservation_id);
  req.add_checksums(checksum);
  v1::CommitResponse resp;
  IdAnswer a = AnswerOf(stub.Commit(&ctx, req, &resp));
  if (out != nullptr) *out = resp;
  return a;
}
IdAnswer AbortWith(v1::CacheService::Stub& stub, const std::string& reservation_id) {
  grpc::ClientContext ctx;
  v1::AbortRequest req;
  req.set_reservation_id(reservation_id);
  v1::AbortResponse resp;
  return AnswerOf(stub.Abort(&ctx, req, &resp));
}
IdAnswer ReleaseWith(v1::CacheService::Stub& stub, const std::string& lease_id) {
  grpc::ClientContext ctx;
  v1::ReleaseRequest req;
  req.add_lease_ids(lease_id);
  v1::ReleaseResponse resp;
  IdAnswer a = AnswerOf(stub.Release(&ctx, req, &resp));
  a.released = resp.released();
  return a;
}

// Tenant B holding tenant A's live lease and reservation ids (leaked) gets nothing, and the very answer
// (code, message, details) of an id that never existed: a refusal never says that an id is live.
TEST_F(SecurityTest, LeakedIdsOfAnotherTenantAreAnsweredAsUnknownIds) {
  const Namespace a = TenantNamespace("tenant-a");
  const Namespace b = TenantNamespace("tenant-b");
  auto stored = ChainFingerprints(a, Prompt(1, 41));
  auto fresh = ChainFingerprints(a, Prompt(1, 42));
  ASSERT_OK(stored);
  ASSERT_OK(fresh);
  auto ca = ClientFor(kTokenA);
  ASSERT_NE(ca, nullptr);
  for (client::PutResult r : PutBlocks(*ca, a, *stored, 4100)) EXPECT_EQ(r, client::PutResult::kStored);
  auto cache_a = v1::CacheService::NewStub(Channel("client", kTokenA));
  auto cache_b = v1::CacheService::NewStub(Channel("client", kTokenB));
  v1::Namespace pa;
  wire::ToProto(a, &pa);

  std::string lease_id, reservation_id;
  {
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    *req.mutable_namespace_() = pa;
    *req.mutable_keys() = Keys(*stored);
    req.set_lease_ms(30000);
    v1::ReadResponse resp;
    ASSERT_TRUE(cache_a->Lease(&ctx, req, &resp).ok());
    ASSERT_TRUE(resp.blocks(0).present());
    lease_id = resp.lease_id();
  }
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest req;
    *req.mutable_namespace_() = pa;
    *req.mutable_keys() = Keys(*fresh);
    v1::AllocateResponse resp;
    ASSERT_TRUE(cache_a->Allocate(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.results(0), v1::ALLOCATE_RESULT_ALLOCATED);
    reservation_id = resp.reservation_id();
  }
  ASSERT_EQ(lease_id.size(), 16u);
  ASSERT_EQ(reservation_id.size(), 16u);
  const std::string unknown = CapabilityId::Random().ToWire();
  const std::string short_id = reservation_id.substr(0, 8);  // not 16 bytes: an unknown id too

  const std::vector<std::byte> bytes = testing::BlockBytes(a.layout.ShardBytes(), 4200);
  const std::string data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const uint64_t sum = BlockChecksum(bytes.data(), bytes.size());
  const std::string garbage(data.size(), 'x');

  // WriteBlocks and Commit: refused, with the unknown id's answer byte for byte.
  const IdAnswer write_unknown = WriteWith(*cache_b, unknown, garbage);
  EXPECT_EQ(write_unknown.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(write_unknown.message, "unknown or expired reservation");
  EXPECT_EQ(WriteWith(*cache_b, reservation_id, garbage), write_unknown);
  EXPECT_EQ(WriteWith(*cache_b, short_id, garbage), write_unknown);
  const IdAnswer commit_unknown = CommitWith(*cache_b, unknown, 0);
  EXPECT_EQ(commit_unknown, write_unknown);
  EXPECT_EQ(CommitWith(*cache_b, reservation_id, 0), commit_unknown);
  // Abort and Release: an OK that does nothing, for both.
  const IdAnswer abort_unknown = AbortWith(*cache_b, unknown);
  EXPECT_EQ(abort_unknown.code, grpc::StatusCode::OK);
  EXPECT_EQ(AbortWith(*cache_b, reservation_id), abort_unknown);
  const IdAnswer release_unknown = ReleaseWith(*cache_b, unknown);
  EXPECT_EQ(release_unknown.code, grpc::StatusCode::OK);
  EXPECT_EQ(release_unknown.released, 0u);
  EXPECT_EQ(ReleaseWith(*cache_b, lease_id), release_unknown);
  // Read names no id: B's Read of A's namespace is refused, of its own namespace it streams no byte.
  {
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    wire::ToProto(b, req.mutable_namespace_());
    *req.mutable_keys() = Keys(*stored);
    auto reader = cache_b->Read(&ctx, req);
    v1::ReadResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    for (const auto& block : msg.blocks()) EXPECT_FALSE(block.present());
    while (reader->Read(&msg)) ADD_FAILURE() << "bytes of another tenant's block were streamed";
    EXPECT_TRUE(reader->Finish().ok());
  }

  // A's reservation was neither written (A's first chunk at offset 0 is accepted) nor aborted by B.
  EXPECT_EQ(WriteWith(*cache_a, reservation_id, data).code, grpc::StatusCode::OK);
  v1::CommitResponse committed;
  EXPECT_EQ(CommitWith(*cache_a, reservation_id, sum, &committed).code, grpc::StatusCode::OK);
  ASSERT_EQ(committed.results_size(), 1);
  EXPECT_EQ(committed.results(0), v1::COMMIT_RESULT_COMMITTED);
  std::vector<std::byte> back(bytes.size());
  std::vector<std::span<std::byte>> views = {back};
  auto got = ca->Get(a, *fresh, 0, views);
  ASSERT_OK(got);
  EXPECT_EQ((*got)[0], client::GetResult::kHit);
  EXPECT_EQ(back, bytes);
  // A's lease was not released by B: A releases it now.
  EXPECT_EQ(ReleaseWith(*cache_a, lease_id).released, 1u);
  // An ended id: the same answer as one that never existed.
  EXPECT_EQ(CommitWith(*cache_a, reservation_id, sum), commit_unknown);
  EXPECT_EQ(ReleaseWith(*cache_a, lease_id), release_unknown);
}

// Ids of many allocations are 16 random bytes each: all distinct, none sharing its first 8 bytes with
// another, and consecutive ones far apart (a sequential counter fails every one of these).
TEST_F(SecurityTest, IdsOfManyAllocationsAreDistinctAndNotSequential) {
  const Namespace a = TenantNamespace("tenant-a");
  auto fp = ChainFingerprints(a, Prompt(1, 43));
  ASSERT_OK(fp);
  auto cache_a = v1::CacheService::NewStub(Channel("client", kTokenA));
  v1::AllocateRequest req;
  wire::ToProto(a, req.mutable_namespace_());
  *req.mutable_keys() = Keys(*fp);
  std::vector<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    grpc::ClientContext ctx;
    v1::AllocateResponse resp;
    ASSERT_TRUE(cache_a->Allocate(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.results(0), v1::ALLOCATE_RESULT_ALLOCATED);
    ASSERT_EQ(resp.reservation_id().size(), 16u);
    ids.push_back(resp.reservation_id());
    ASSERT_EQ(AbortWith(*cache_a, resp.reservation_id()).code, grpc::StatusCode::OK);  // the key is free again
  }
  std::set<std::string> all(ids.begin(), ids.end()), firsts;
  EXPECT_EQ(all.size(), ids.size());
  for (const std::string& id : ids) firsts.insert(id.substr(0, 8));
  EXPECT_EQ(firsts.size(), ids.size()) << "two ids share their first 8 bytes";
  for (size_t i = 1; i < ids.size(); ++i) {
    int differ = 0;
    for (size_t k = 0; k < 16; ++k) differ += std::popcount(static_cast<uint8_t>(ids[i][k] ^ ids[i - 1][k]));
    EXPECT_GE(differ, 24) << "ids " << i - 1 << " and " << i;
  }
}

// A raw peer on the UCX port (which carries no token) sends kGet with guessed lease ids: the ids a
// sequential server would have issued, 0, and neighbours of a leaked live id. Every block comes back as
// an empty message. The leaked id itself does read (a UCX peer has no tenant: the id is the capability),
// which shows that the guesses were served by a working data plane.
TEST_F(SecurityTest, GuessedLeaseIdsOverUcxReadNothing) {
  ASSERT_GT(server_->ucx_port(), 0);
  const Namespace a = TenantNamespace("tenant-a");
  auto fps = ChainFingerprints(a, Prompt(1, 44));
  ASSERT_OK(fps);
  auto ca = ClientFor(kTokenA);
  ASSERT_NE(ca, nullptr);
  for (client::PutResult r : PutBlocks(*ca, a, *fps, 4400)) EXPECT_EQ(r, client::PutResult::kStored);
  const std::vector<std::byte> expected = testing::BlockBytes(a.layout.ShardBytes(), 4400);
  auto cache_a = v1::CacheService::NewStub(Channel("client", kTokenA));
  auto lease = [&] {
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    wire::ToProto(a, req.mutable_namespace_());
    *req.mutable_keys() = Keys(*fps);
    req.set_lease_ms(30000);
    v1::ReadResponse resp;
    EXPECT_TRUE(cache_a->Lease(&ctx, req, &resp).ok());
    return CapabilityId::FromWire(resp.lease_id());
  };
  const CapabilityId leaked = lease();
  ASSERT_FALSE(leaked.null());

  // The guesser holds a UCX session ticket (a worker of tenant A: the server requires one), so only the
  // ids stand between it and the lease's bytes; a worker of tenant B holds the leaked id itself.
  auto ticket = [&](const std::string& token) {
    auto stub = v1::CacheService::NewStub(Channel("client", token));
    grpc::ClientContext ctx;
    v1::OpenUcxSessionResponse resp;
    EXPECT_TRUE(stub->OpenUcxSession(&ctx, v1::OpenUcxSessionRequest(), &resp).ok());
    return resp.ticket();
  };
  auto peer = client::UcxClient::Create("", /*get_lanes=*/1);
  ASSERT_OK(peer);
  auto conn = (*peer)->Connect(absl::StrCat("127.0.0.1:", server_->ucx_port()), absl::Now() + absl::Seconds(10),
                               ticket(kTokenA));
  ASSERT_OK(conn);
  auto peer_b = client::UcxClient::Create("", /*get_lanes=*/1);
  ASSERT_OK(peer_b);
  auto conn_b = (*peer_b)->Connect(absl::StrCat("127.0.0.1:", server_->ucx_port()), absl::Now() + absl::Seconds(10),
                                   ticket(kTokenB));
  ASSERT_OK(conn_b);
  {
    std::vector<std::byte> buf(expected.size(), std::byte{0});
    std::vector<std::span<std::byte>> bufs = {buf};
    const uint32_t first = 0;
    auto r = (*peer_b)->Get(conn_b->endpoint, leaked, /*release=*/true, std::span<const uint32_t>(&first, 1), bufs,
                            absl::Now() + absl::Seconds(10));
    ASSERT_EQ(r.items.size(), 1u);
    EXPECT_EQ(r.items[0], client::UcxClient::ItemStatus::kUnavailable) << "tenant B read A's leaked lease";
    EXPECT_EQ(buf, std::vector<std::byte>(expected.size(), std::byte{0}));
  }
  std::vector<CapabilityId> guesses = {CapabilityId()};
  for (uint64_t n = 1; n <= 64; ++n) {
    std::array<uint8_t, 16> b{};
    std::memcpy(b.data(), &n, sizeof(n));
    guesses.push_back(CapabilityId::FromArray(b));  // a u64 counter's ids, little-endian
    std::array<uint8_t, 16> c{};
    for (int k = 0; k < 8; ++k) c[15 - k] = static_cast<uint8_t>(n >> (8 * k));
    guesses.push_back(CapabilityId::FromArray(c));  // and big-endian
  }
  for (size_t k = 0; k < 16; ++k) {
    for (int delta : {1, -1}) {
      auto b = leaked.bytes();
      b[k] = static_cast<uint8_t>(b[k] + delta);
      guesses.push_back(CapabilityId::FromArray(b));  // a neighbour of the leaked id, in each byte
    }
  }
  for (int i = 0; i < 16; ++i) guesses.push_back(CapabilityId::Random());
  const uint32_t index = 0;
  for (const CapabilityId& guess : guesses) {
    std::vector<std::byte> buf(expected.size(), std::byte{0});
    std::vector<std::span<std::byte>> bufs = {buf};
    auto r = (*peer)->Get(conn->endpoint, guess, /*release=*/false, std::span<const uint32_t>(&index, 1), bufs,
                          absl::Now() + absl::Seconds(10));
    ASSERT_EQ(r.items.size(), 1u);
    EXPECT_EQ(r.items[0], client::UcxClient::ItemStatus::kUnavailable) << guess.ToHex();  // an empty message
    EXPECT_EQ(buf, std::vector<std::byte>(expected.size(), std::byte{0})) << guess.ToHex();
  }
  std::vector<std::byte> buf(expected.size());
  std::vector<std::span<std::byte>> bufs = {buf};
  auto r = (*peer)->Get(conn->endpoint, leaked, /*release=*/true, std::span<const uint32_t>(&index, 1), bufs,
                        absl::Now() + absl::Seconds(10));
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_EQ(r.items[0], client::UcxClient::ItemStatus::kOk);
  EXPECT_EQ(buf, expected);
}

TEST_F(SecurityTest, CallsWithoutAValidTokenAreUnauthenticated) {
  const Namespace a = TenantNamespace("tenant-a");
  auto fa = ChainFingerprints(a, Prompt(1, 4));
  ASSERT_OK(fa);
  v1::LookupRequest req;
  wire::ToProto(a, req.mutable_namespace_());
  *req.mutable_keys() = Keys(*fa);
  for (const std::string token : {"", "not-a-token"}) {
    auto cache = v1::CacheService::NewStub(Channel("client", token));
    auto admin = v1::AdminService::NewStub(Channel("client", token));
    grpc::ClientContext ctx;
    v1::LookupResponse resp;
    EXPECT_EQ(cache->Lookup(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    grpc::ClientContext info_ctx;
    v1::GetInfoResponse info;
    EXPECT_EQ(admin->GetInfo(&info_ctx, v1::GetInfoRequest(), &info).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // The client library without a token: the server's refusal is the call's error, with its code and
  // message (never a hit, and not a silent miss that looks like a cold cache).
  client::ClientOptions options = ClientOptionsFor("");
  options.members = {absl::StrCat("secure-node=", server_->address())};
  auto c = client::Client::Connect(options);
  ASSERT_OK(c);
  auto hit = (*c)->LookupPrefix(a, *fa);
  EXPECT_EQ(hit.status().code(), absl::StatusCode::kUnauthenticated) << hit.status();
  EXPECT_NE(hit.status().message().find("no authorization metadata"), absl::string_view::npos) << hit.status();
  EXPECT_NE(hit.status().message().find("member secure-node ("), absl::string_view::npos) << hit.status();
  EXPECT_EQ((*c)->stats().misses_from_errors.load(), 0u);
}

// A worker's token used on another tenant's namespace, through the client library: every call fails
// with the server's PERMISSION_DENIED and its message.
TEST_F(SecurityTest, AnotherTenantsNamespaceIsPermissionDeniedThroughTheClient) {
  const Namespace a = TenantNamespace("tenant-a");
  auto fa = ChainFingerprints(a, Prompt(2, 9));
  ASSERT_OK(fa);
  auto cb = ClientFor(kTokenB);
  ASSERT_NE(cb, nullptr);
  const uint64_t size = a.layout.ShardBytes();
  std::vector<std::vector<std::byte>> data(fa->size(), std::vector<std::byte>(size));
  std::vector<std::span<const std::byte>> in(data.begin(), data.end());
  std::vector<std::span<std::byte>> out(data.begin(), data.end());
  const absl::Status put = cb->Put(a, *fa, 0, in).status();
  const absl::Status get = cb->Get(a, *fa, 0, out).status();
  const absl::Status lookup = cb->LookupPrefix(a, *fa).status();
  for (const absl::Status& s : {put, get, lookup}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find("tenant-a"), absl::string_view::npos) << s;  // the server names what was refused
  }
  EXPECT_EQ(cb->stats().misses_from_errors.load(), 0u);
}

TEST_F(SecurityTest, ClientsWithoutATrustedCertificateAreRefused) {
  auto info_status = [](const std::shared_ptr<grpc::Channel>& channel) {
    auto admin = v1::AdminService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetInfoResponse info;
    return admin->GetInfo(&ctx, v1::GetInfoRequest(), &info).error_code();
  };
  EXPECT_EQ(info_status(Channel("client", kTokenA)), grpc::StatusCode::OK);
  EXPECT_NE(info_status(Channel("", kTokenA)), grpc::StatusCode::OK) << "no client certificate";
  EXPECT_NE(info_status(Channel("evil-client", kTokenA)), grpc::StatusCode::OK) << "untrusted CA";
  EXPECT_NE(info_status(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials())),
            grpc::StatusCode::OK)
      << "plaintext";
  {  // A server certificate signed by an unknown CA is refused by the client.
    wire::ChannelSecurity sec{.ca_file = File("evil-ca.pem"),
                              .cert_file = File("client.pem"),
                              .key_file = File("client.key"),
                              .auth_token = kTokenA};
    auto creds = wire::MakeChannelCredentials(sec);
    ASSERT_OK(creds);
    EXPECT_NE(info_status(wire::CreateSecureChannel(server_->address(), *creds, grpc::ChannelArguments(), sec)),
              grpc::StatusCode::OK);
  }
  // The plain health port answers probes without any certificate, and serves nothing else.
  ASSERT_NE(server_->health_port(), 0);
  auto plain =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->health_port()), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(plain);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(info_status(plain), grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecurityTest, AdminServiceRefusesAWorkerToken) {
  auto worker = v1::AdminService::NewStub(Channel("client", kTokenA));
  auto admin = v1::AdminService::NewStub(Channel("client", kTokenAdmin));
  {
    grpc::ClientContext ctx;
    v1::GetStatsResponse resp;
    EXPECT_EQ(worker->GetStats(&ctx, v1::GetStatsRequest(), &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    v1::ListBlocksResponse resp;
    EXPECT_EQ(worker->ListBlocks(&ctx, v1::ListBlocksRequest(), &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    v1::SetDrainingRequest req;
    req.set_draining(true);
    v1::SetDrainingResponse resp;
    EXPECT_EQ(worker->SetDraining(&ctx, req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {  // GetInfo (node id, for the ring) is open to workers.
    grpc::ClientContext ctx;
    v1::GetInfoResponse resp;
    ASSERT_TRUE(worker->GetInfo(&ctx, v1::GetInfoRequest(), &resp).ok());
    EXPECT_EQ(resp.node_id(), "secure-node");
  }
  grpc::ClientContext ctx;
  v1::GetStatsResponse resp;
  EXPECT_TRUE(admin->GetStats(&ctx, v1::GetStatsRequest(), &resp).ok());
}

TEST_F(SecurityTest, QuotaDropsTheTenantsOwnOldestBlocksAndNeverAnotherTenants) {
  const Namespace small = TenantNamespace("small");
  const Namespace a = TenantNamespace("tenant-a");
  auto cs = ClientFor(kTokenSmall);
  auto ca = ClientFor(kTokenA);
  ASSERT_NE(cs, nullptr);
  ASSERT_NE(ca, nullptr);
  auto fa = ChainFingerprints(a, Prompt(3, 5));
  ASSERT_OK(fa);
  for (client::PutResult r : PutBlocks(*ca, a, *fa, 500)) EXPECT_EQ(r, client::PutResult::kStored);

  // Ten blocks, two per put: each put past the quota drops the tenant's least recently used blocks.
  auto fs = ChainFingerprints(small, Prompt(10, 6));
  ASSERT_OK(fs);
  for (size_t i = 0; i < fs->size(); i += 2) {
    for (client::PutResult r : PutBlocks(*cs, small, std::span(*fs).subspan(i, 2), 600 + i)) {
      EXPECT_EQ(r, client::PutResult::kStored);
    }
    EXPECT_LE(TenantBlocks("small"), kSmallQuotaBlocks);
  }
  EXPECT_EQ(TenantBlocks("small"), kSmallQuotaBlocks);
  auto newest = cs->LookupPrefix(small, std::span(*fs).subspan(6));
  ASSERT_OK(newest);
  EXPECT_EQ(newest->prefix_blocks, 4u);  // the last four are kept
  auto oldest = cs->LookupPrefix(small, std::span(*fs).first(2));
  ASSERT_OK(oldest);
  EXPECT_EQ(oldest->prefix_blocks, 0u);
  auto others = ca->LookupPrefix(a, *fa);  // another tenant's blocks are never dropped for it
  ASSERT_OK(others);
  EXPECT_EQ(others->prefix_blocks, fa->size());

  // One put larger than the quota: the keys past it are refused (its own reservations are not evictable).
  auto big = ChainFingerprints(small, Prompt(6, 7));
  ASSERT_OK(big);
  const auto results = PutBlocks(*cs, small, *big, 700);
  size_t refused = 0;
  for (client::PutResult r : results) refused += r == client::PutResult::kNoSpace ? 1 : 0;
  EXPECT_EQ(refused, 2u);
  EXPECT_LE(TenantBlocks("small"), kSmallQuotaBlocks);
  // Counted in /metrics (plain HTTP).
  const testing::CtlResult metrics =
      Shell(absl::StrCat("curl -s http://127.0.0.1:", server_->metrics_port(), "/metrics"));
  EXPECT_NE(metrics.output.find("kvtier_rejections_total{reason=\"quota\""), std::string::npos);
  EXPECT_NE(metrics.output.find("kvtier_quota_evictions_total"), std::string::npos);
}

TEST_F(SecurityTest, KvtierctlWithAnAdminTokenWorksOverMutualTls) {
  const std::string tls = absl::StrCat("--members=", server_->address(), " --tls-ca-file=", File("ca.pem"),
                                       " --tls-cert-file=", File("client.pem"), " --tls-key-file=", File("client.key"));
  const testing::CtlResult ok = testing::RunCtl(absl::StrCat(tls, " --token=", kTokenAdmin, " --json status"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_FALSE(testing::ParseJson(ok.output).is_discarded()) << ok.output;
  EXPECT_NE(ok.output.find("secure-node"), std::string::npos) << ok.output;
  // The token from $KVTIER_TOKEN.
  const testing::CtlResult stats = Shell(absl::StrCat("env -u KVTIER_MEMBERS KVTIER_TOKEN=", kTokenAdmin, " ",
                                                      testing::BinaryDir(), "/cli/kvtierctl ", tls, " --json stats"));
  EXPECT_EQ(stats.exit_code, 0) << stats.output;
  // A worker token cannot list blocks; no token cannot even ask for status.
  EXPECT_NE(testing::RunCtl(absl::StrCat(tls, " --token=", kTokenA, " ls")).exit_code, 0);
  EXPECT_NE(testing::RunCtl(absl::StrCat(tls, " status")).exit_code, 0);
}

TEST(SecurityConfigTest, ErrorsNameTheKey) {
  auto bad = [](const std::string& yaml) {
    auto o = server::ParseServerConfig(yaml);
    if (o.ok()) {
      o->node_id = "n";
      return std::string(o->Validate().message());
    }
    return std::string(o.status().message());
  };
  EXPECT_NE(bad("tls: {cert_file: /x.pem}").find("tls.key_file"), std::string::npos);
  EXPECT_NE(bad("tls: {cert_file: /x.pem, key_file: /x.key, require_client_cert: true}").find("tls.client_ca_file"),
            std::string::npos);
  EXPECT_NE(bad("auth: {tokens: [{token: t, tenant: a, role: root}]}").find("auth.tokens[0].role"), std::string::npos);
  EXPECT_NE(bad("auth: {tokens: [{token: t}]}").find("auth.tokens[0].tenant"), std::string::npos);
  EXPECT_NE(bad("auth: {tokens: [{token_sha256: abc, tenant: a}]}").find("auth.tokens[0].token_sha256"),
            std::string::npos);
  EXPECT_NE(bad("auth: {token: x}").find("auth.token"), std::string::npos);
  EXPECT_NE(bad("quotas: {acme: lots}").find("quotas.acme"), std::string::npos);
  auto ok = server::ParseServerConfig("auth: {tokens: [{token: t, tenant: a}]}\nquotas: {a: 1MiB}\n");
  ASSERT_OK(ok);
  ASSERT_EQ(ok->auth_tokens.size(), 1u);
  EXPECT_EQ(ok->auth_tokens[0].token_sha256, server::Sha256Hex("t"));
  EXPECT_EQ(ok->auth_tokens[0].role, "worker");
  ASSERT_EQ(ok->tenant_quotas.size(), 1u);
  EXPECT_EQ(ok->tenant_quotas[0].second, 1u << 20);
}

}  // namespace
}  // namespace kvtier
