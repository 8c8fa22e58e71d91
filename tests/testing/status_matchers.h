// EXPECT_OK / ASSERT_OK for absl::Status and absl::StatusOr (abseil 20220623 has no status matchers).
#ifndef KVTIER_TESTS_TESTING_STATUS_MATCHERS_H_
#define KVTIER_TESTS_TESTING_STATUS_MATCHERS_H_

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvtier::testing {

inline const absl::Status& ToStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace kvtier::testing

#define EXPECT_OK(expr) EXPECT_TRUE(::kvtier::testing::ToStatus(expr).ok()) << ::kvtier::testing::ToStatus(expr)
#define ASSERT_OK(expr) ASSERT_TRUE(::kvtier::testing::ToStatus(expr).ok()) << ::kvtier::testing::ToStatus(expr)

#endif  // KVTIER_TESTS_TESTING_STATUS_MATCHERS_H_
