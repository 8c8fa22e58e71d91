#include "kvtier/ucx/ucx_pending_connections.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier::ucx {
namespace {

struct Pending {
  int fd = -1;
  uint64_t inode = 0;
  std::string host;
  absl::Time first_seen;
};

int PortOf(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

std::string HostOf(const std::string& peer_key) { return peer_key.substr(0, peer_key.rfind(':')); }

// Aborts the TCP connection of `fd` if it is still the socket `inode` (the descriptor may have been
// closed by UCX and its number reused since the scan).
bool Reset(int fd, uint64_t inode) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) || static_cast<uint64_t>(st.st_ino) != inode) return false;
  sockaddr unspec{};
  unspec.sa_family = AF_UNSPEC;
  return connect(fd, &unspec, sizeof(unspec)) == 0;
}

}  // namespace

std::string PendingConnectionReaper::PeerKey(const sockaddr* addr) {
  char ip[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
    return absl::StrCat(ip, ":", ntohs(in->sin_port));
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
    return absl::StrCat("[", ip, "]:", ntohs(in6->sin6_port));
  }
  return "";
}

PendingConnectionReaper::SweepResult PendingConnectionReaper::Sweep(absl::Time now) {
  SweepResult result;
  if (port_ <= 0) return result;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return result;
  for (auto& [inode, seen] : seen_) seen.live = false;
  std::vector<Pending> pending;
  const int dir_fd = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dir_fd) continue;
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 || PortOf(local) != port_) continue;
    // The listening socket has no peer (ENOTCONN); so has one already reset.
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    const std::string key = PeerKey(reinterpret_cast<const sockaddr*>(&peer));
    if (key.empty() || admitted_.contains(key)) continue;
    const auto inode = static_cast<uint64_t>(st.st_ino);
    auto [it, inserted] = seen_.try_emplace(inode, Seen{.first_seen = now});
    it->second.live = true;
    pending.push_back({.fd = fd, .inode = inode, .host = HostOf(key), .first_seen = it->second.first_seen});
  }
  closedir(dir);
  absl::erase_if(seen_, [](const auto& kv) { return !kv.second.live; });
  result.pending = pending.size();

  // Oldest first: a host over its limit loses its oldest pending connections, and a legitimate
  // handshake, the newest, finishes before the next sweep.
  std::sort(pending.begin(), pending.end(),
            [](const Pending& a, const Pending& b) { return a.first_seen < b.first_seen; });
  absl::flat_hash_map<std::string, size_t> per_host;
  for (const Pending& p : pending) ++per_host[p.host];
  for (const Pending& p : pending) {
    size_t& left = per_host[p.host];
    const bool old = now - p.first_seen >= options_.timeout;
    const bool over = left > options_.max_per_host;
    --left;
    if (!old && !over) continue;
    if (!Reset(p.fd, p.inode)) continue;
    seen_.erase(p.inode);
    ++(old ? result.timed_out : result.over_limit);
  }
  return result;
}

}  // namespace kvtier::ucx
