#include "kvtier/common/capability_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include <openssl/rand.h>

namespace kvtier {
namespace {

// getrandom(2) without GRND_NONBLOCK: blocks only until the kernel's pool is seeded at boot.
bool FillFromKernel(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = getrandom(out + done, n - done, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

CapabilityId CapabilityId::Random() {
  std::array<uint8_t, kBytes> b{};
  for (;;) {
    if (RAND_bytes(b.data(), static_cast<int>(kBytes)) != 1 && !FillFromKernel(b.data(), kBytes)) {
      std::fputs("kvtier: no cryptographic random source (RAND_bytes and getrandom failed); cannot issue ids\n",
                 stderr);
      std::abort();
    }
    CapabilityId id = FromArray(b);
    if (!id.null()) return id;  // 2^-128: drawn again rather than issuing the null id
  }
}

std::optional<CapabilityId> CapabilityId::FromBytes(std::string_view bytes) {
  if (bytes.size() != kBytes) return std::nullopt;
  CapabilityId id;
  std::memcpy(id.bytes_.data(), bytes.data(), kBytes);
  return id;
}

std::string CapabilityId::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * kBytes, '0');
  for (size_t i = 0; i < kBytes; ++i) {
    out[2 * i] = kDigits[bytes_[i] >> 4];
    out[2 * i + 1] = kDigits[bytes_[i] & 0xf];
  }
  return out;
}

}  // namespace kvtier
