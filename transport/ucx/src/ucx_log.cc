#include "ucx_log.h"

#include <ucs/debug/log_def.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "kvtier/common/log.h"

namespace kvtier::ucx {
namespace {

std::atomic<uint64_t> g_cma_failures{0};
constexpr uint64_t kPrintedFailures = 16;  // then they are only counted

ucs_log_func_rc_t OnUcxLog(const char* file, unsigned /*line*/, const char* /*function*/, ucs_log_level_t level,
                           const ucs_log_component_config_t* /*comp_conf*/, const char* message, va_list ap) {
  if (level != UCS_LOG_LEVEL_FATAL || file == nullptr || std::strstr(file, "cma_ep.c") == nullptr) {
    return UCS_LOG_FUNC_RC_CONTINUE;
  }
  if (g_cma_failures.fetch_add(1, std::memory_order_relaxed) < kPrintedFailures) {
    char text[512];
    va_list copy;
    va_copy(copy, ap);
    std::vsnprintf(text, sizeof(text), message, copy);
    va_end(copy);
    KVTIER_LOG(warn, "kvtier: UCX single-copy transfer with a process on this node failed (it went away?): {}", text);
  }
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void InstallCmaFailureHandler() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(&OnUcxLog); });
}

uint64_t CmaFailures() { return g_cma_failures.load(std::memory_order_relaxed); }

}  // namespace kvtier::ucx
