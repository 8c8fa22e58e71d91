// Status propagation macros for absl::Status / absl::StatusOr.
// abseil 20220623 (Debian 12) has no RETURN_IF_ERROR / ASSIGN_OR_RETURN; delete these once it does.
#ifndef KVTIER_COMMON_STATUS_MACROS_H_
#define KVTIER_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function when not OK.
#define KVTIER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status kvtier_status_ = (expr);          \
    if (!kvtier_status_.ok()) return kvtier_status_; \
  } while (0)

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else moves the value into
// `lhs` (a declaration such as `auto x` or an existing variable).
#define KVTIER_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_statusor_, __LINE__), lhs, rexpr)

#define KVTIER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // KVTIER_COMMON_STATUS_MACROS_H_
