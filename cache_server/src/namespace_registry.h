// Remembers the namespaces a server has seen (id -> tenant, model), so that admin listings can name them.
#ifndef KVTIER_SERVER_SRC_NAMESPACE_REGISTRY_H_
#define KVTIER_SERVER_SRC_NAMESPACE_REGISTRY_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace kvtier::server {

// Thread-safe. Remembers at most kMaxNamespaces (later ones are served but not named in listings).
class NamespaceRegistry {
 public:
  static constexpr size_t kMaxNamespaces = 4096;

  // Returns true when `id` was not remembered before and is now.
  bool Remember(uint64_t id, const std::string& tenant, const std::string& model) {
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (names_.contains(id) || names_.size() >= kMaxNamespaces) return false;
    }
    std::unique_lock<std::shared_mutex> lock(mu_);
    return names_.size() < kMaxNamespaces && names_.try_emplace(id, tenant, model).second;
  }

  // (tenant, model) of `id`, if seen since start.
  std::optional<std::pair<std::string, std::string>> Find(uint64_t id) const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    auto it = names_.find(id);
    if (it == names_.end()) return std::nullopt;
    return it->second;
  }

 private:
  mutable std::shared_mutex mu_;
  absl::flat_hash_map<uint64_t, std::pair<std::string, std::string>> names_;  // guarded by mu_
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_NAMESPACE_REGISTRY_H_
