// A small msgpack reader for tests: decodes a buffer into a tree of values, independently of the
// server's encoder, so tests can check what a msgpack consumer (a vLLM subscriber) would read.
#ifndef KVTIER_TESTS_TESTING_MSGPACK_READER_H_
#define KVTIER_TESTS_TESTING_MSGPACK_READER_H_

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kvtier::testing {

struct MsgpackValue {
  enum class Type { kNil, kBool, kUint, kInt, kFloat, kStr, kBin, kArray, kMap };
  Type type = Type::kNil;
  bool b = false;
  uint64_t u = 0;                   // kUint
  int64_t i = 0;                    // kInt (negative forms only)
  double f = 0;                     // kFloat (float32 widened)
  bool f64 = false;                 // kFloat: encoded as float64
  std::string s;                    // kStr, kBin
  std::vector<MsgpackValue> items;  // kArray; kMap as key, value, key, value, ...

  bool is_nil() const { return type == Type::kNil; }
};

class MsgpackReader {
 public:
  // Decodes exactly one value spanning all of `data`. Errors: InvalidArgument (truncated, trailing
  // bytes, or a type byte this reader does not know).
  static absl::StatusOr<MsgpackValue> Decode(std::string_view data) {
    MsgpackReader r(data);
    MsgpackValue v;
    if (absl::Status s = r.Read(v, 0); !s.ok()) return s;
    if (r.pos_ != data.size()) return absl::InvalidArgumentError(absl::StrCat(data.size() - r.pos_, " trailing bytes"));
    return v;
  }

 private:
  explicit MsgpackReader(std::string_view d) : d_(d) {}

  absl::Status Need(size_t n) {
    if (d_.size() - pos_ < n) return absl::InvalidArgumentError(absl::StrCat("truncated at byte ", pos_));
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Be(size_t n) {
    if (absl::Status s = Need(n); !s.ok()) return s;
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v = (v << 8) | static_cast<unsigned char>(d_[pos_ + k]);
    pos_ += n;
    return v;
  }
  absl::Status Bytes(size_t n, std::string& out) {
    if (absl::Status s = Need(n); !s.ok()) return s;
    out.assign(d_.substr(pos_, n));
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status Items(size_t n, MsgpackValue& v, int depth) {
    v.items.resize(n);
    for (auto& item : v.items) {
      if (absl::Status s = Read(item, depth + 1); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::Status Read(MsgpackValue& v, int depth) {
    if (depth > 32) return absl::InvalidArgumentError("nested too deep");
    auto tb = Be(1);
    if (!tb.ok()) return tb.status();
    const auto t = static_cast<uint8_t>(*tb);
    using T = MsgpackValue::Type;
    auto len = [&](size_t n) -> absl::StatusOr<uint64_t> { return Be(n); };
    if (t <= 0x7f) {
      v.type = T::kUint;
      v.u = t;
      return absl::OkStatus();
    }
    if (t >= 0xe0) {
      v.type = T::kInt;
      v.i = static_cast<int8_t>(t);
      return absl::OkStatus();
    }
    if ((t & 0xe0) == 0xa0) {
      v.type = T::kStr;
      return Bytes(t & 0x1f, v.s);
    }
    if ((t & 0xf0) == 0x90) {
      v.type = T::kArray;
      return Items(t & 0x0f, v, depth);
    }
    if ((t & 0xf0) == 0x80) {
      v.type = T::kMap;
      return Items(2 * (t & 0x0f), v, depth);
    }
    absl::StatusOr<uint64_t> n;
    switch (t) {
      case 0xc0:
        v.type = T::kNil;
        return absl::OkStatus();
      case 0xc2:
      case 0xc3:
        v.type = T::kBool;
        v.b = t == 0xc3;
        return absl::OkStatus();
      case 0xcc:
      case 0xcd:
      case 0xce:
      case 0xcf:
        n = Be(size_t{1} << (t - 0xcc));
        if (!n.ok()) return n.status();
        v.type = T::kUint;
        v.u = *n;
        return absl::OkStatus();
      case 0xd0:
      case 0xd1:
      case 0xd2:
      case 0xd3: {
        const size_t bytes = size_t{1} << (t - 0xd0);
        n = Be(bytes);
        if (!n.ok()) return n.status();
        const int shift = static_cast<int>(64 - 8 * bytes);
        v.type = T::kInt;
        v.i = static_cast<int64_t>(*n << shift) >> shift;
        return absl::OkStatus();
      }
      case 0xca:
        n = Be(4);
        if (!n.ok()) return n.status();
        v.type = T::kFloat;
        v.f = std::bit_cast<float>(static_cast<uint32_t>(*n));
        return absl::OkStatus();
      case 0xcb:
        n = Be(8);
        if (!n.ok()) return n.status();
        v.type = T::kFloat;
        v.f64 = true;
        v.f = std::bit_cast<double>(*n);
        return absl::OkStatus();
      case 0xd9:
      case 0xda:
      case 0xdb:
        n = len(size_t{1} << (t - 0xd9));
        if (!n.ok()) return n.status();
        v.type = T::kStr;
        return Bytes(*n, v.s);
      case 0xc4:
      case 0xc5:
      case 0xc6:
        n = len(size_t{1} << (t - 0xc4));
        if (!n.ok()) return n.status();
        v.type = T::kBin;
        return Bytes(*n, v.s);
      case 0xdc:
      case 0xdd:
        n = len(t == 0xdc ? 2 : 4);
        if (!n.ok()) return n.status();
        if (*n > d_.size()) return absl::InvalidArgumentError("array longer than the buffer");
        v.type = T::kArray;
        return Items(*n, v, depth);
      default:
        return absl::InvalidArgumentError(absl::StrCat("type byte 0x", absl::Hex(t), " at ", pos_ - 1));
    }
  }

  std::string_view d_;
  size_t pos_ = 0;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_MSGPACK_READER_H_
