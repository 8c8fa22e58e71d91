#include "kvtier/common/counters.h"

#include <string>
#include <string_view>

namespace kvtier {
namespace {

bool IsNameChar(char c, bool first, bool colon) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
  return alpha || (!first && c >= '0' && c <= '9');
}

bool IsValidName(std::string_view name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, colon)) return false;
  }
  return true;
}

}  // namespace

const char* CounterKindName(CounterKind kind) { return kind == CounterKind::kGauge ? "gauge" : "counter"; }

std::string SampleName(const CounterInfo& info) {
  std::string out(info.name);
  if (info.labels.empty()) return out;
  out += '{';
  for (size_t i = 0; i < info.labels.size(); ++i) {
    if (i > 0) out += ',';
    out += info.labels[i].first;
    out += "=\"";
    for (char c : info.labels[i].second) {
      if (c == '\\' || c == '"') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else {
        out += c;
      }
    }
    out += '"';
  }
  out += '}';
  return out;
}

bool IsValidMetricName(std::string_view name) { return IsValidName(name, /*colon=*/true); }

bool IsValidLabelName(std::string_view name) {
  return IsValidName(name, /*colon=*/false) && !(name.size() >= 2 && name[0] == '_' && name[1] == '_');
}

}  // namespace kvtier
