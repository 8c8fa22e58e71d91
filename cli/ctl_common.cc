#include "ctl_common.h"

#include <algorithm>
#include <charconv>
#include <iterator>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvtier/client/dns_resolver.h"
#include "kvtier/wire/wire.h"

namespace kvtier::cli {

namespace {
constexpr uint64_t kMaxMessageBytes = 4ULL << 20;  // admin replies are small (a ListBlocks page: ~2 MiB)
}  // namespace

std::vector<Endpoint> Connect(const std::vector<std::string>& members, const CtlOptions& options) {
  const grpc::ChannelArguments args = wire::ChannelArgs(kMaxMessageBytes);
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  std::vector<Endpoint> out;
  for (const std::string& address : members) {
    auto channel = wire::CreateSecureChannel(address, credentials, args, options.security);
    out.push_back({address, channel, v1::AdminService::NewStub(channel), grpc::health::v1::Health::NewStub(channel)});
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ResolveMembers(const std::string& name_port, const std::string& dns_server,
                                                        absl::Duration timeout) {
  return client::ResolveMembers(name_port, dns_server, timeout);  // the client library's own code path
}

bool IsUnreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::string DescribeFailure(const grpc::Status& s) {
  return absl::StrCat(IsUnreachable(s) ? "unreachable" : "error", " (", wire::FromGrpc(s).ToString(), ")");
}

// ---------------------------------------------------------------------------------------------------
// ClusterView

ClusterView ClusterView::Collect(const std::vector<Endpoint>& endpoints, const CtlOptions& options) {
  auto calls = CallEach<v1::GetInfoRequest, v1::GetInfoResponse>(
      endpoints, options.rpc_timeout,
      [](const Endpoint& ep, auto* c, auto cb) { ep.admin->async()->GetInfo(&c->ctx, &c->req, &c->resp, cb); });
  ClusterView view;
  std::vector<std::string> ids;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    MemberView m{endpoints[i].address, calls[i]->status, calls[i]->resp, ""};
    // As the client library: an id given is the ring key, the member is not asked for it.
    if (auto given = options.node_ids.find(m.address); given != options.node_ids.end()) {
      m.node_id = given->second;
    } else if (m.answered()) {
      m.node_id = m.info.node_id();
    }
    if (m.node_id.empty()) {
      view.unplaced_.push_back(i);
    } else {
      ids.push_back(m.node_id);
      view.ring_member_.push_back(i);
    }
    view.members_.push_back(std::move(m));
  }
  if (ids.empty()) {
    view.ring_status_ = absl::UnavailableError("no member answered GetInfo or has a node id given (node_id=host:port)");
    return view;
  }
  auto ring = HashRing::Create(ids, options.virtual_nodes);
  if (ring.ok()) {
    view.ring_ = std::move(ring).value();
  } else {
    view.ring_status_ = ring.status();
  }
  return view;
}

std::optional<size_t> ClusterView::PrimaryOwner(const Fingerprint& fp) const {
  if (!ring_) return std::nullopt;
  return ring_member_[ring_->Primary(fp)];
}

absl::StatusOr<size_t> ClusterView::Find(const std::string& value) const {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i].address == value) return i;
  }
  for (size_t i = 0; i < members_.size(); ++i) {
    if (!members_[i].node_id.empty() && members_[i].node_id == value) return i;
  }
  const size_t silent = members_.size() - CountAnswered();
  return absl::NotFoundError(absl::StrCat("no member has the address or node id \"", value, "\"",
                                          silent > 0 ? absl::StrCat(" (", silent, " did not answer)") : ""));
}

absl::StatusOr<std::vector<size_t>> ClusterView::Select(const std::vector<std::string>& values) const {
  std::vector<size_t> out;
  if (values.empty()) {
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(i);
    return out;
  }
  absl::flat_hash_set<size_t> seen;
  for (const std::string& v : values) {
    absl::StatusOr<size_t> i = Find(v);
    if (!i.ok()) return i.status();
    if (seen.insert(*i).second) out.push_back(*i);
  }
  return out;
}

std::string ClusterView::Name(size_t i) const {
  return members_[i].node_id.empty() ? members_[i].address : members_[i].node_id;
}

size_t ClusterView::CountAnswered() const {
  return static_cast<size_t>(
      std::count_if(members_.begin(), members_.end(), [](const MemberView& m) { return m.answered(); }));
}

// ---------------------------------------------------------------------------------------------------
// Formatting

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1023.95 && u + 1 < std::size(kUnits)) {  // 1023.95 would print as "1024.0"
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

std::string HumanDuration(uint64_t ms) {
  const uint64_t s = ms / 1000;
  if (s == 0) return absl::StrCat(ms, "ms");
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string Percent(double fraction) { return absl::StrFormat("%.1f%%", 100 * fraction); }

std::optional<double> HitRatio(uint64_t hit, uint64_t miss) {
  if (hit + miss == 0) return std::nullopt;
  return static_cast<double>(hit) / static_cast<double>(hit + miss);
}
std::string RatioText(std::optional<double> r) { return r ? absl::StrFormat("%.3f", *r) : "-"; }
Json RatioJson(std::optional<double> r) { return r ? Json(*r) : Json(nullptr); }

std::string DumpJson(const Json& j) {
  // Replace rather than throw on invalid UTF-8 (node ids and gRPC messages come from the network).
  return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

std::string HexBytes(const std::string& bytes) { return absl::BytesToHexString(bytes); }

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

std::string IdHex(uint64_t v) { return absl::StrFormat("0x%016x", v); }

std::string NamespaceText(const v1::BlockRecord& b) {
  if (b.tenant().empty() && b.model().empty()) return absl::StrCat("ns:", IdHex(b.namespace_id()));
  return absl::StrCat(b.tenant(), "/", b.model());
}

Json BlockJson(const v1::BlockRecord& b) {
  return {{"fingerprint", HexBytes(b.fingerprint())},
          {"shard", b.shard()},
          {"namespace_id", IdHex(b.namespace_id())},
          {"tenant", b.tenant().empty() ? Json(nullptr) : Json(b.tenant())},
          {"model", b.model().empty() ? Json(nullptr) : Json(b.model())},
          {"tier", b.tier()},
          {"size_bytes", b.size_bytes()},
          {"checksum", Hex64(b.checksum())},
          {"depth", b.depth()},
          {"access_count", b.access_count()},
          {"lease_count", b.lease_count()},
          {"age_ms", b.age_ms()},
          {"idle_ms", b.idle_ms()}};
}

absl::StatusOr<std::string> ParseFingerprintHex(const std::string& hex) {
  absl::StatusOr<Fingerprint> fp = Fingerprint::FromHex(std::string(absl::StripAsciiWhitespace(hex)));
  if (!fp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", hex, "\" is not a fingerprint (64 hex digits, as `kvtierctl ls` prints)"));
  }
  return std::string(reinterpret_cast<const char*>(fp->bytes.data()), fp->bytes.size());
}

absl::StatusOr<uint64_t> ParseNamespaceId(const std::string& text) {
  std::string_view s = text;
  int base = 10;
  if (absl::StartsWithIgnoreCase(text, "0x")) {
    s.remove_prefix(2);
    base = 16;
  }
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a namespace id (a uint64, decimal or 0x-prefixed hex)"));
  }
  return v;
}

Table::Table(std::vector<std::string> header, std::vector<bool> right_aligned) : right_(std::move(right_aligned)) {
  rows_.push_back(std::move(header));
}

void Table::AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width(rows_[0].size(), 0);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      if (c > 0) line += "  ";
      line += right_[c] ? pad + row[c] : row[c] + pad;
    }
    out << std::string(absl::StripTrailingAsciiWhitespace(line)) << "\n";
  }
}

}  // namespace kvtier::cli
