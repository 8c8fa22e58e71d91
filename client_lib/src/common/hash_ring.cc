#include "kvtier/common/hash_ring.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "encoding.h"

namespace kvtier {

absl::StatusOr<HashRing> HashRing::Create(std::vector<std::string> node_ids, uint32_t virtual_nodes) {
  if (node_ids.empty()) return absl::InvalidArgumentError("hash ring: node_ids must not be empty");
  if (node_ids.size() > std::numeric_limits<uint32_t>::max())
    return absl::InvalidArgumentError("hash ring: too many node_ids");
  if (virtual_nodes == 0) return absl::InvalidArgumentError("hash ring: virtual_nodes must be > 0");
  for (size_t m = 0; m < node_ids.size(); ++m) {
    if (node_ids[m].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("hash ring: node_ids[", m, "] is empty"));
    }
  }
  std::vector<const std::string*> sorted;
  sorted.reserve(node_ids.size());
  for (const std::string& id : node_ids) sorted.push_back(&id);
  std::sort(sorted.begin(), sorted.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  auto dup = std::adjacent_find(sorted.begin(), sorted.end(),
                                [](const std::string* a, const std::string* b) { return *a == *b; });
  if (dup != sorted.end()) {
    return absl::InvalidArgumentError(absl::StrCat("hash ring: node id \"", **dup, "\" appears more than once"));
  }

  HashRing ring;
  ring.node_ids_ = std::move(node_ids);
  ring.virtual_nodes_ = virtual_nodes;
  ring.points_.reserve(ring.node_ids_.size() * virtual_nodes);
  std::string input;
  uint8_t digest[internal::kSha256Bytes];
  for (uint32_t m = 0; m < ring.node_ids_.size(); ++m) {
    for (uint32_t i = 0; i < virtual_nodes; ++i) {
      // Point i of member m: SHA-256(m || 0x00 || uint32_le(i)), first 8 bytes little-endian.
      input.assign(ring.node_ids_[m]);
      internal::AppendU8(0, &input);
      internal::AppendU32(i, &input);
      internal::Sha256Digest(input.data(), input.size(), digest);
      ring.points_.push_back({internal::LoadU64Le(digest), m});
    }
  }
  // Two points at one position (probability ~2^-64 per pair) go to the smaller node id rather than
  // the smaller index, so that ownership does not depend on the order node_ids were given in.
  const std::vector<std::string>& ids = ring.node_ids_;
  std::sort(ring.points_.begin(), ring.points_.end(), [&ids](const Point& a, const Point& b) {
    if (a.position != b.position) return a.position < b.position;
    return ids[a.member] < ids[b.member];
  });
  return ring;
}

size_t HashRing::FirstPointAtOrAfter(uint64_t position) const {
  auto it = std::lower_bound(points_.begin(), points_.end(), position,
                             [](const Point& p, uint64_t pos) { return p.position < pos; });
  return it == points_.end() ? 0 : static_cast<size_t>(it - points_.begin());  // wrap past 2^64 - 1
}

std::vector<uint32_t> HashRing::Owners(const Fingerprint& fp, uint32_t replicas) const {
  const size_t want = std::min<size_t>(replicas, node_ids_.size());
  std::vector<uint32_t> owners;
  owners.reserve(want);
  if (want == 0) return owners;
  size_t p = FirstPointAtOrAfter(fp.RingPosition());
  if (want == 1) {
    owners.push_back(points_[p].member);
    return owners;
  }
  // A linear search of `owners` is cheapest for the usual few replicas; a bitmap beyond that.
  constexpr size_t kMaxLinearSearch = 8;
  std::vector<bool> taken(want > kMaxLinearSearch ? node_ids_.size() : 0, false);
  // Every member has a point, so one lap finds `want` distinct members.
  for (size_t step = 0; step < points_.size() && owners.size() < want; ++step) {
    const uint32_t member = points_[p].member;
    bool is_new;
    if (want > kMaxLinearSearch) {
      is_new = !taken[member];
      taken[member] = true;
    } else {
      is_new = std::find(owners.begin(), owners.end(), member) == owners.end();
    }
    if (is_new) owners.push_back(member);
    if (++p == points_.size()) p = 0;
  }
  return owners;
}

uint32_t HashRing::Primary(const Fingerprint& fp) const {
  return points_[FirstPointAtOrAfter(fp.RingPosition())].member;
}

std::vector<double> HashRing::Shares() const {
  // Point j owns the arc (position of point j-1, position of point j]; point 0's arc wraps past 2^64.
  constexpr double kRing = 18446744073709551616.0;  // 2^64
  std::vector<double> shares(node_ids_.size(), 0.0);
  for (size_t j = 0; j < points_.size(); ++j) {
    double arc;
    if (j == 0) {
      arc = kRing - static_cast<double>(points_.back().position - points_.front().position);
    } else {
      arc = static_cast<double>(points_[j].position - points_[j - 1].position);
    }
    shares[points_[j].member] += arc;
  }
  double total = 0;  // 2^64 up to rounding; dividing by the sum makes the shares sum to 1
  for (double s : shares) total += s;
  for (double& s : shares) s /= total;
  return shares;
}

}  // namespace kvtier
