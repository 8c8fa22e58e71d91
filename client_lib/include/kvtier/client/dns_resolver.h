// DNS membership: the addresses a name such as a Kubernetes headless Service resolves to.
#ifndef KVTIER_CLIENT_DNS_RESOLVER_H_
#define KVTIER_CLIENT_DNS_RESOLVER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvtier::client {

// Checks a "NAME:PORT" membership name (what ClientOptions::members_dns and kvtierctl --members-dns
// take): NAME non-empty, PORT a decimal in 1..65535. Errors: InvalidArgument (the message quotes it).
absl::Status ValidateDnsName(const std::string& name_port);

// Checks a DNS server list: comma-separated "IP" or "IP:PORT" ("[IPv6]:PORT" for IPv6; port 53 when
// absent). "" (the system resolver) is valid. Errors: InvalidArgument (the message quotes the entry).
absl::Status ValidateDnsServer(const std::string& dns_server);

// Resolves `name_port` ("NAME:PORT") to member addresses: one "ip:port" per A record and one
// "[ip]:port" per AAAA record, all with PORT, in the order the answer gave them, without repeats.
// `dns_server`: "" asks the servers of /etc/resolv.conf (and /etc/hosts first, as glibc does); else
// only the given servers (see ValidateDnsServer), NAME is fully qualified (no search domains) and
// /etc/hosts is not read. Unlike glibc, any port
// works, so tests can run a DNS server on 127.0.0.1 with a high port. A numeric IP resolves to itself.
// Blocks the calling thread for at most about `timeout` (> 0: the whole query, all retries included).
// Thread-safety: safe to call concurrently; each call uses its own c-ares channel.
// Errors: InvalidArgument (bad name_port or dns_server), NotFound (the server answered that the name
// has no A or AAAA record: an authoritative empty set), Unavailable (no answer in time, or the server
// failed: retry later; the caller keeps what it had).
absl::StatusOr<std::vector<std::string>> ResolveMembers(const std::string& name_port, const std::string& dns_server,
                                                        absl::Duration timeout);

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_DNS_RESOLVER_H_
