// ResolveMembers over c-ares: glibc's resolver only asks port 53, and kvtier's tests and some
// deployments need another port or server; c-ares takes any server list and is already a gRPC dependency.
#include "kvtier/client/dns_resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <mutex>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvtier::client {
namespace {

bool ParsePort(const std::string& text, int& port) {
  if (text.empty() || text.size() > 5) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  return ec == std::errc() && end == text.data() + text.size() && port >= 1 && port <= 65535;
}

bool IsIp(const std::string& text) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, text.c_str(), &a4) == 1 || inet_pton(AF_INET6, text.c_str(), &a6) == 1;
}

// One entry of a server list: "IP", "IP:PORT", "[IPv6]" or "[IPv6]:PORT".
bool ValidServer(const std::string& entry) {
  int port = 53;
  if (!entry.empty() && entry.front() == '[') {
    const size_t close = entry.find(']');
    if (close == std::string::npos) return false;
    const std::string ip = entry.substr(1, close - 1);
    in6_addr a6;
    if (inet_pton(AF_INET6, ip.c_str(), &a6) != 1) return false;
    if (close + 1 == entry.size()) return true;
    return entry[close + 1] == ':' && ParsePort(entry.substr(close + 2), port);
  }
  if (IsIp(entry)) return true;  // IPv4 without a port, or a bare IPv6
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos) return false;
  in_addr a4;
  return inet_pton(AF_INET, entry.substr(0, colon).c_str(), &a4) == 1 && ParsePort(entry.substr(colon + 1), port);
}

void InitLibraryOnce() {
  static std::once_flag once;
  std::call_once(once, [] { (void)ares_library_init(ARES_LIB_INIT_ALL); });
}

struct Answer {
  bool done = false;
  int status = ARES_SUCCESS;
  ares_addrinfo* result = nullptr;
};

}  // namespace

absl::Status ValidateDnsName(const std::string& name_port) {
  const size_t colon = name_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !ParsePort(name_port.substr(colon + 1), port)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name_port, "\" is not NAME:PORT (port 1-65535)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDnsServer(const std::string& dns_server) {
  if (dns_server.empty()) return absl::OkStatus();
  for (absl::string_view part : absl::StrSplit(dns_server, ',')) {
    const std::string entry(part);
    if (!ValidServer(entry)) {
      return absl::InvalidArgumentError(absl::StrCat("\"", entry, "\" is not IP, IP:PORT or [IPv6]:PORT"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ResolveMembers(const std::string& name_port, const std::string& dns_server,
                                                        absl::Duration timeout) {
  if (absl::Status s = ValidateDnsName(name_port); !s.ok()) return s;
  if (absl::Status s = ValidateDnsServer(dns_server); !s.ok()) return s;
  if (timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("timeout: must be > 0");
  const size_t colon = name_port.rfind(':');
  std::string host = name_port.substr(0, colon);
  const std::string port = name_port.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);

  InitLibraryOnce();
  const absl::Time deadline = absl::Now() + timeout;
  ares_options opts{};
  int mask = ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES;
  // Two tries, each with a third of the budget (c-ares doubles the wait of later rounds); the loop below
  // enforces the whole budget.
  opts.timeout = std::max(1, static_cast<int>(absl::ToInt64Milliseconds(timeout) / 3));
  opts.tries = 2;
  char dns_only[] = "b";
  if (!dns_server.empty()) {
    // Only the given servers: /etc/hosts is not consulted, and NAME is taken as fully qualified (the
    // search domains of /etc/resolv.conf belong to its own servers).
    mask |= ARES_OPT_LOOKUPS | ARES_OPT_DOMAINS;
    opts.lookups = dns_only;
    opts.domains = nullptr;
    opts.ndomains = 0;
  }
  ares_channel channel = nullptr;
  if (const int rc = ares_init_options(&channel, &opts, mask); rc != ARES_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("c-ares init: ", ares_strerror(rc)));
  }
  if (!dns_server.empty()) {
    if (const int rc = ares_set_servers_ports_csv(channel, dns_server.c_str()); rc != ARES_SUCCESS) {
      ares_destroy(channel);
      return absl::InvalidArgumentError(absl::StrCat("dns server \"", dns_server, "\": ", ares_strerror(rc)));
    }
  }
  ares_addrinfo_hints hints{};
  hints.ai_family = AF_UNSPEC;  // A and AAAA
  hints.ai_socktype = SOCK_STREAM;
  Answer answer;
  ares_getaddrinfo(
      channel, host.c_str(), port.c_str(), &hints,
      [](void* arg, int status, int /*timeouts*/, ares_addrinfo* result) {
        auto* a = static_cast<Answer*>(arg);
        a->done = true;
        a->status = status;
        a->result = result;
      },
      &answer);
  while (!answer.done) {
    ares_socket_t socks[ARES_GETSOCK_MAXNUM];
    const int bits = ares_getsock(channel, socks, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM];
    nfds_t n = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      const bool r = ARES_GETSOCK_READABLE(bits, i), w = ARES_GETSOCK_WRITABLE(bits, i);
      if (!r && !w) continue;
      fds[n++] = {.fd = socks[i], .events = static_cast<short>((r ? POLLIN : 0) | (w ? POLLOUT : 0)), .revents = 0};
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      ares_cancel(channel);  // the callback runs with ARES_ECANCELLED
      break;
    }
    timeval max_wait = absl::ToTimeval(left);
    timeval tv;
    const timeval* wait = ares_timeout(channel, &max_wait, &tv);
    const int wait_ms = std::max(1, static_cast<int>(wait->tv_sec * 1000 + (wait->tv_usec + 999) / 1000));
    const int ready = poll(fds, n, wait_ms);
    if (ready <= 0) {
      ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
      continue;
    }
    for (nfds_t i = 0; i < n; ++i) {
      ares_process_fd(channel, (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) ? fds[i].fd : ARES_SOCKET_BAD,
                      (fds[i].revents & POLLOUT) ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
  ares_destroy(channel);  // runs a pending callback (ECANCELLED / EDESTRUCTION) first

  const std::string what = dns_server.empty() ? host : absl::StrCat(host, " (asking ", dns_server, ")");
  if (answer.status == ARES_ENOTFOUND || answer.status == ARES_ENODATA) {
    if (answer.result != nullptr) ares_freeaddrinfo(answer.result);
    return absl::NotFoundError(absl::StrCat(what, ": no A or AAAA record (", ares_strerror(answer.status), ")"));
  }
  if (answer.status != ARES_SUCCESS) {
    if (answer.result != nullptr) ares_freeaddrinfo(answer.result);
    const char* why = answer.status == ARES_ECANCELLED ? "no answer in time" : ares_strerror(answer.status);
    return absl::UnavailableError(absl::StrCat(what, ": ", why));
  }
  std::vector<std::string> out;
  absl::flat_hash_set<std::string> seen;
  for (const ares_addrinfo_node* a = answer.result != nullptr ? answer.result->nodes : nullptr; a != nullptr;
       a = a->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    std::string address;
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, ip, sizeof(ip));
      address = absl::StrCat(ip, ":", port);
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, ip, sizeof(ip));
      address = absl::StrCat("[", ip, "]:", port);
    } else {
      continue;
    }
    if (seen.insert(address).second) out.push_back(std::move(address));
  }
  if (answer.result != nullptr) ares_freeaddrinfo(answer.result);
  if (out.empty()) return absl::NotFoundError(absl::StrCat(what, ": no A or AAAA record"));
  return out;
}

}  // namespace kvtier::client
