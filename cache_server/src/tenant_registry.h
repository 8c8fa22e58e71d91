// Interns tenant names as small ids so that each index entry carries its tenant in 4 bytes.
#ifndef KVTIER_SERVER_SRC_TENANT_REGISTRY_H_
#define KVTIER_SERVER_SRC_TENANT_REGISTRY_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace kvtier::server {

// Thread-safe. Ids start at 1 and are never reused for the life of the process.
class TenantRegistry {
 public:
  uint32_t Intern(const std::string& tenant) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = ids_.try_emplace(tenant, static_cast<uint32_t>(ids_.size() + 1));
    return it->second;
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> ids_;  // guarded by mu_
};

}  // namespace kvtier::server

#endif  // KVTIER_SERVER_SRC_TENANT_REGISTRY_H_
