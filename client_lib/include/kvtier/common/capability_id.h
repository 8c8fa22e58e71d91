// CapabilityId: the id of a lease or a reservation, 128 bits from a cryptographic random generator.
// Whoever holds an id may use what it names (read a lease's blocks, write a reservation's slots), so
// ids are never guessable and never derived from each other (docs/architecture.md "Security").
#ifndef KVTIER_COMMON_CAPABILITY_ID_H_
#define KVTIER_COMMON_CAPABILITY_ID_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvtier {

// A 16-byte value type: equality, absl hashing, hex formatting and its wire encoding (the 16 bytes in
// order, as in the `bytes` fields of kvtier.v1 and the UCX messages). The all-zero id is the null id:
// "no lease" / "no reservation", never issued. Thread-safety: a plain value; Random() may be called
// from any thread.
class CapabilityId {
 public:
  static constexpr size_t kBytes = 16;

  constexpr CapabilityId() = default;  // the null id

  // A new id of 128 bits from OpenSSL's CSPRNG (RAND_bytes; getrandom(2) if that fails), never null.
  // Aborts the process when neither source answers: an id that could be guessed must not be issued.
  static CapabilityId Random();

  // The id whose wire encoding is `bytes`: exactly kBytes bytes, else nullopt (callers answer such an id
  // as an unknown one). Sixteen zero bytes decode to the null id.
  static std::optional<CapabilityId> FromBytes(std::string_view bytes);
  // The id with these 16 bytes (as Bytes() returns them).
  static constexpr CapabilityId FromArray(const std::array<uint8_t, kBytes>& bytes) {
    CapabilityId id;
    id.bytes_ = bytes;
    return id;
  }
  // The id decoded from `bytes` on the wire, or the null id when it is empty or not kBytes long: what a
  // server looks up for a request's id field (the null id names nothing).
  static CapabilityId FromWire(std::string_view bytes) { return FromBytes(bytes).value_or(CapabilityId()); }

  bool null() const { return *this == CapabilityId(); }
  const std::array<uint8_t, kBytes>& bytes() const { return bytes_; }
  // The wire encoding: the 16 bytes. The null id encodes as "" (an absent field), which FromWire reads
  // back as the null id.
  std::string ToWire() const {
    return null() ? std::string() : std::string(reinterpret_cast<const char*>(bytes_.data()), kBytes);
  }
  // The first 8 bytes as a little-endian integer.
  uint64_t low64() const {
    uint64_t v = 0;
    std::memcpy(&v, bytes_.data(), sizeof(v));
    return v;
  }
  // The low kTagPrefixBits bits of low64(): what a UCX put tag carries of a reservation id
  // (kvtier/ucx/ucx_messages.h PutTag). BlockStore keeps the prefixes of its live reservations distinct.
  static constexpr uint32_t kTagPrefixBits = 39;
  uint64_t tag_prefix() const { return low64() & ((uint64_t{1} << kTagPrefixBits) - 1); }
  // 32 lowercase hex digits, for logs. Ids are capabilities: log only an id's hex, never in messages
  // sent to another tenant.
  std::string ToHex() const;

  friend bool operator==(const CapabilityId&, const CapabilityId&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const CapabilityId& id) {
    return H::combine_contiguous(std::move(h), id.bytes_.data(), kBytes);
  }

 private:
  std::array<uint8_t, kBytes> bytes_{};
};

}  // namespace kvtier

#endif  // KVTIER_COMMON_CAPABILITY_ID_H_
