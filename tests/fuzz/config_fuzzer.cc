// libFuzzer target: the YAML config parser and validation never crash, whatever the bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvtier/server/server_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto options = kvtier::server::ParseServerConfig(text);
  if (options.ok()) (void)options->Validate();
  (void)kvtier::server::ParseByteSize("fuzz", text);
  return 0;
}
