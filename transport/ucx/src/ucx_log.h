// Process-wide handling of one UCX log message that the UCX data plane must survive (UcxContext::Create
// installs it, for the block server and the block client alike).
#ifndef KVTIER_UCX_SRC_UCX_LOG_H_
#define KVTIER_UCX_SRC_UCX_LOG_H_

#include <cstdint>

namespace kvtier::ucx {

// UCX 1.13 treats a failed cma copy (process_vm_readv / process_vm_writev) on an endpoint without peer
// failure handling as fatal and aborts the process. kvtier's endpoints run in that mode
// (UCP_ERR_HANDLING_MODE_NONE: the peer mode turns off cma's single-copy rendezvous), and the copy fails
// exactly when the process on the other side dies mid-transfer: an inference worker reading a block from
// its cache server (the receiver of a rendezvous copies) would die with it. The server installs it too,
// for any copy it makes from a client that died. InstallCmaFailureHandler pushes, once per
// process, a UCX log handler (ucs_log_push_handler) that turns that one fatal message (from cma_ep.c)
// into a line on stderr; the copy then returns its error, the transfer completes with an error, and the
// caller treats it like any failed endpoint (misses from error and a reconnect; a receive that is not
// complete). Every other UCX message goes on to UCX's own handlers. Idempotent and thread-safe; call it
// before creating a UCX context.
void InstallCmaFailureHandler();

// How many such failures the handler took since the process started. Thread-safe.
uint64_t CmaFailures();

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_SRC_UCX_LOG_H_
