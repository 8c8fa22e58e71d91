#include "client/hot_blocks.h"

namespace kvtier::client {

bool HotBlocks::Mark(const Fingerprint& fp) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!set_.insert(fp).second) return false;
  order_.push_back(fp);
  if (order_.size() > capacity_) {
    set_.erase(order_.front());
    order_.pop_front();
  }
  return true;
}

std::vector<bool> HotBlocks::Contains(std::span<const Fingerprint> fps, size_t n) const {
  std::vector<bool> hot(fps.size(), false);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n && i < fps.size(); ++i) hot[i] = set_.contains(fps[i]);
  return hot;
}

size_t HotBlocks::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return set_.size();
}

}  // namespace kvtier::client
