// What every kvtierctl command shares: options, exit codes, one channel per member, parallel unary calls
// under one deadline, the cluster's view of itself (node ids and the ring), and table/JSON formatting.
// Private to cli/ (docs/kvtierctl.md is the contract).
#ifndef KVTIER_CLI_CTL_COMMON_H_
#define KVTIER_CLI_CTL_COMMON_H_

#include <cstdint>
#include <functional>
#include <latch>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvtier/common/fingerprint.h"
#include "kvtier/common/hash_ring.h"
#include "kvtier/v1/admin.grpc.pb.h"
#include "kvtier/wire/channel_security.h"

namespace kvtier::cli {

using Json = nlohmann::ordered_json;  // keeps keys in the order written, which follows the proto

// Exit codes; the --help footer and docs/kvtierctl.md list them too. When several apply, the highest
// wins (a corrupt block found while a member was unreachable exits 4).
constexpr int kExitOk = 0;           // everything asked was done, every member answered
constexpr int kExitFailure = 1;      // anything else (e.g. inspect: no member holds the block)
constexpr int kExitUsage = 2;        // bad flags or arguments (CLI11 errors, a bad fingerprint)
constexpr int kExitUnreachable = 3;  // some member did not answer or is not SERVING; the report is printed
constexpr int kExitCorrupt = 4;      // verify: some block failed its checksum

// Options every command takes (before or after the subcommand).
struct CtlOptions {
  std::vector<std::string> members;  // host:port, in the order given; required
  // Node ids given as node_id=host:port, by address: such a member is on the ring under that id (as a
  // client places it) whether or not it answers. The others are placed by the id they report.
  absl::flat_hash_map<std::string, std::string> node_ids;
  absl::Duration rpc_timeout = absl::Milliseconds(2000);    // deadline of every unary RPC
  bool json = false;                                        // one JSON object on stdout instead of tables
  uint32_t virtual_nodes = HashRing::kDefaultVirtualNodes;  // ring points per member, as the client's default
  // TLS, mutual TLS and the bearer token (--tls-ca-file, --tls-cert-file, --tls-key-file,
  // --tls-server-name, --token / $KVTIER_TOKEN); off by default.
  wire::ChannelSecurity security;
  // Made from `security` by main() before any command runs; null = plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// ---------------------------------------------------------------------------------------------------
// RPCs

// One channel per member, shared by its stubs.
struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::AdminService::Stub> admin;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

// Channels to `members` with the credentials and token of `options`.
std::vector<Endpoint> Connect(const std::vector<std::string>& members, const CtlOptions& options);

// The addresses `name_port` ("NAME:PORT", e.g. a headless Service) resolves to, as "ip:port" ("[ip]:port"
// for IPv6), in the resolver's order without repeats: client::ResolveMembers, the code path and
// dns_server option of ClientOptions::members_dns. `dns_server` "" = the system resolver. Errors:
// InvalidArgument (not NAME:PORT, bad dns_server), NotFound (no record), Unavailable (no answer in time).
absl::StatusOr<std::vector<std::string>> ResolveMembers(const std::string& name_port, const std::string& dns_server,
                                                        absl::Duration timeout);

// One unary RPC made with the callback API; it must outlive its callback.
template <typename Req, typename Resp>
struct Call {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
  grpc::Status status;
};
template <typename Req, typename Resp>
using Calls = std::vector<std::unique_ptr<Call<Req, Resp>>>;

// Runs `n` calls at once: prepare(i, call) fills call->req and returns the endpoint to ask; then
// start(endpoint, call, on_done) starts the RPC. Each call has a deadline of `timeout` and no
// wait_for_ready (a member that refuses connections fails at once). Returns when every call finished.
template <typename Req, typename Resp, typename PrepareFn, typename StartFn>
Calls<Req, Resp> RunCalls(size_t n, absl::Duration timeout, PrepareFn prepare, StartFn start) {
  Calls<Req, Resp> calls;
  calls.reserve(n);
  std::latch done(static_cast<std::ptrdiff_t>(n));
  for (size_t i = 0; i < n; ++i) {
    calls.push_back(std::make_unique<Call<Req, Resp>>());
    Call<Req, Resp>* c = calls.back().get();
    const Endpoint& ep = prepare(i, c);
    c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    start(ep, c, [c, &done](grpc::Status s) {
      c->status = std::move(s);
      done.count_down();
    });
  }
  done.wait();
  return calls;
}

// One call per endpoint with the same (default) request: the common fan-out.
template <typename Req, typename Resp, typename StartFn>
Calls<Req, Resp> CallEach(const std::vector<Endpoint>& endpoints, absl::Duration timeout, StartFn start) {
  return RunCalls<Req, Resp>(
      endpoints.size(), timeout, [&](size_t i, Call<Req, Resp>*) -> const Endpoint& { return endpoints[i]; }, start);
}

bool IsUnreachable(const grpc::Status& s);
// "unreachable (UNAVAILABLE: ...)" or "error (UNIMPLEMENTED: ...)".
std::string DescribeFailure(const grpc::Status& s);

// ---------------------------------------------------------------------------------------------------
// The cluster as its members report it

struct MemberView {
  std::string address;
  grpc::Status info_status;
  v1::GetInfoResponse info;  // valid when info_status is OK
  // Its ring key: the id given as node_id=host:port, else the one it reported; "" when neither.
  std::string node_id;
  bool answered() const { return info_status.ok(); }
};

// GetInfo of every member, and the ring a client with these members (and --virtual-nodes) builds: every
// member whose node id is known, given (node_id=host:port) or reported, is on it, answering or not, so
// that blocks a silent member owns are placed on it rather than on another member. A member that did not
// answer and has no id given cannot be placed: unplaced() lists it, and owners may then be wrong.
class ClusterView {
 public:
  static ClusterView Collect(const std::vector<Endpoint>& endpoints, const CtlOptions& options);

  const std::vector<MemberView>& members() const { return members_; }
  // Not OK when no member has a known node id or two have one node id.
  const absl::Status& ring_status() const { return ring_status_; }
  const std::optional<HashRing>& ring() const { return ring_; }
  // The member (index into members()) that is ring member `r`.
  size_t MemberOfRingIndex(uint32_t r) const { return ring_member_[r]; }
  // The member owning `fp` as primary; nullopt without a ring.
  std::optional<size_t> PrimaryOwner(const Fingerprint& fp) const;
  // Members (indices) left off the ring: they did not answer and have no node id given.
  const std::vector<size_t>& unplaced() const { return unplaced_; }
  // Index of the member whose address is `value`, else of the one whose node id is `value`.
  // Errors: NotFound (no such address or node id among the members).
  absl::StatusOr<size_t> Find(const std::string& value) const;
  // Find() for each of `values`, without duplicates; every member when `values` is empty.
  absl::StatusOr<std::vector<size_t>> Select(const std::vector<std::string>& values) const;
  // Its node id when known, else its address.
  std::string Name(size_t i) const;
  size_t CountAnswered() const;

 private:
  std::vector<MemberView> members_;
  absl::Status ring_status_;
  std::optional<HashRing> ring_;
  std::vector<size_t> ring_member_;
  std::vector<size_t> unplaced_;
};

// ---------------------------------------------------------------------------------------------------
// Formatting

std::string HumanBytes(uint64_t bytes);
std::string HumanDuration(uint64_t ms);
std::string Percent(double fraction);
// hit / (hit + miss); nullopt when nothing was asked.
std::optional<double> HitRatio(uint64_t hit, uint64_t miss);
std::string RatioText(std::optional<double> r);
Json RatioJson(std::optional<double> r);
std::string DumpJson(const Json& j);
// Lower-case hex of raw bytes (a 32-byte fingerprint gives 64 characters).
std::string HexBytes(const std::string& bytes);
// A checksum as 16 hex digits.
std::string Hex64(uint64_t v);
// A 64-bit id or ring position for JSON: "0x" and 16 hex digits (JSON numbers lose bits above 2^53 in
// most readers, jq included); --namespace-id accepts it back.
std::string IdHex(uint64_t v);
// "tenant/model", or "ns:<namespace_id hex>" when the server does not know the names.
std::string NamespaceText(const v1::BlockRecord& b);
// Every field of a block record, fingerprint and checksum as hex.
Json BlockJson(const v1::BlockRecord& b);
// Parses a fingerprint given as 64 hex digits into the 32 raw bytes the admin RPCs take.
absl::StatusOr<std::string> ParseFingerprintHex(const std::string& hex);
// Parses a namespace id: decimal, or hex with a 0x prefix. Errors: InvalidArgument.
absl::StatusOr<uint64_t> ParseNamespaceId(const std::string& text);

// Columns separated by two spaces; right-aligned columns as given; no trailing blanks.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right_aligned);
  void AddRow(std::vector<std::string> row);
  void Print(std::ostream& out) const;
  size_t rows() const { return rows_.size() - 1; }

 private:
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;  // [0] is the header
};

}  // namespace kvtier::cli

#endif  // KVTIER_CLI_CTL_COMMON_H_
