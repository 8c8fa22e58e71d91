// AggregateFieldCount<T>(): the number of non-static data members of an aggregate struct, computed by
// the compiler. Lists that name every field of an options or stats struct once (for the layers that copy
// them field by field, such as the C and Python bindings) static_assert against it, so that a field
// added to the struct and not to its list fails to compile instead of being silently dropped.
//
// How: T{a_1, ..., a_N} is well-formed for an aggregate exactly when N <= its number of fields, given
// initializers that convert to any type (AnyFieldInitializer). The count is the largest such N.
// Limits: a field that is itself an aggregate (a plain struct or std::array) is counted as its own
// fields (brace elision); the assert then fails too, which is what it is for. Bit-fields, references and
// anonymous unions are not supported. Compile-time only; nothing here runs.
#ifndef KVTIER_COMMON_AGGREGATE_FIELDS_H_
#define KVTIER_COMMON_AGGREGATE_FIELDS_H_

#include <cstddef>
#include <type_traits>
#include <utility>

namespace kvtier {
namespace internal_aggregate_fields {

// Converts to any field type; only ever named in unevaluated contexts, so it needs no definition.
struct AnyFieldInitializer {
  template <typename T>
  operator T() const;  // NOLINT(google-explicit-constructor): the point is an implicit conversion
};

template <typename T, size_t... I>
constexpr bool InitializableWith(std::index_sequence<I...>) {
  return requires { T{(static_cast<void>(I), AnyFieldInitializer{})...}; };
}

template <typename T, size_t N>
constexpr size_t CountFrom() {
  if constexpr (N > 256 || !InitializableWith<T>(std::make_index_sequence<N + 1>())) {
    return N;
  } else {
    return CountFrom<T, N + 1>();
  }
}

}  // namespace internal_aggregate_fields

template <typename T>
constexpr size_t AggregateFieldCount() {
  static_assert(std::is_aggregate_v<T>, "AggregateFieldCount needs an aggregate struct");
  return internal_aggregate_fields::CountFrom<T, 0>();
}

}  // namespace kvtier

#endif  // KVTIER_COMMON_AGGREGATE_FIELDS_H_
