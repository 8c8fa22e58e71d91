// The connections that UCX's listener accepted but never turned into a connection request: how a UCX
// port stays open to clients when peers send it garbage or nothing at all.
#ifndef KVTIER_UCX_UCX_PENDING_CONNECTIONS_H_
#define KVTIER_UCX_UCX_PENDING_CONNECTIONS_H_

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

namespace kvtier::ucx {

// UCX 1.13's tcp connection manager (tcp_sockcm) accepts every TCP connection on the listener port and
// waits, with no deadline, for a header and the peer's connection data before it tells ucp. A peer
// that stays silent holds that connection forever; one that sends a header claiming more bytes than
// the manager's buffer holds (any random 9 bytes do) wedges it: the manager then reads 0 bytes per
// event and never sees the peer close, so the socket sits in CLOSE-WAIT for the life of the process.
// Each holds a file descriptor and one of UCX's async handler slots (UCX_ASYNC_MAX_EVENTS), and once
// those run out every new client endpoint fails. Such connections never reach the server's connection
// handler, so only the process's own sockets show them.
//
// The reaper finds them: every socket of this process bound to the listener's port that has a peer and
// whose peer address was never admitted (a connection request UCX delivered) is pending. A pending one
// older than `timeout`, and the oldest of a peer host's pending ones beyond `max_per_host`, are reset:
// connect(AF_UNSPEC) aborts the TCP connection (an RST to the peer, ECONNRESET on the socket), which
// UCX's own error path then handles by freeing its state and closing the descriptor. The reaper never
// closes a descriptor itself (UCX owns them).
//
// A legitimate connection request is delivered within milliseconds of its connect, so `timeout` only
// has to exceed the worst scheduling delay of a loaded host.
// Thread-safety: none; the UCX server calls it from its progress thread.
class PendingConnectionReaper {
 public:
  struct Options {
    absl::Duration timeout = absl::Seconds(10);
    size_t max_per_host = 64;
  };
  struct SweepResult {
    size_t pending = 0;     // pending connections seen (before the resets)
    size_t timed_out = 0;   // reset for their age
    size_t over_limit = 0;  // reset beyond max_per_host
  };

  explicit PendingConnectionReaper(Options options) : options_(options) {}

  // The port of the UCX listener (0: none; Sweep then does nothing).
  void set_listen_port(int port) { port_ = port; }

  // A connection request from `peer` (its ip:port, as PeerKey forms it) was delivered: that connection
  // is UCX's until Released.
  void Admit(const std::string& peer) { admitted_.insert(peer); }
  void Release(const std::string& peer) { admitted_.erase(peer); }

  // Scans /proc/self/fd and resets what is due (see the class comment) as of `now`.
  SweepResult Sweep(absl::Time now);

  // "ip:port" of a socket address (AF_INET or AF_INET6); "" for other families.
  static std::string PeerKey(const sockaddr* addr);

 private:
  struct Seen {
    absl::Time first_seen;
    bool live = false;  // seen in the current sweep
  };

  Options options_;
  int port_ = 0;
  absl::flat_hash_set<std::string> admitted_;
  absl::flat_hash_map<uint64_t, Seen> seen_;  // socket inode -> when first seen pending
};

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_UCX_PENDING_CONNECTIONS_H_
