#include "sweep_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::bench {
namespace {

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string EscapeXml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string CapacityLabel(uint64_t blocks) {
  if (blocks >= 1'000'000 && blocks % 100'000 == 0) return absl::StrCat(blocks / 1e6, "M");
  if (blocks >= 1000 && blocks % 100 == 0) return absl::StrCat(blocks / 1e3, "k");
  return absl::StrCat(blocks);
}

}  // namespace

absl::Status WriteSweepCsv(const std::string& path, const std::vector<SweepPoint>& points) {
  std::string text =
      "policy,capacity_blocks,hit_ratio,belady_fraction,hit_blocks,blocks,evictions,not_admitted,seconds\n";
  for (const SweepPoint& p : points) {
    absl::StrAppendFormat(&text, "%s,%s,%.6f,%.4f,%d,%d,%d,%d,%.3f\n", p.policy,
                          p.capacity_blocks == 0 ? std::string("inf") : absl::StrCat(p.capacity_blocks), p.hit_ratio,
                          p.belady_fraction, p.hit_blocks, p.blocks, p.evictions, p.not_admitted, p.seconds);
  }
  return WriteFile(path, text);
}

absl::Status WriteSweepSvg(const std::string& path, const std::string& title, const std::vector<SweepPoint>& points) {
  constexpr double kWidth = 760, kHeight = 480, kLeft = 70, kRight = 170, kTop = 40, kBottom = 60;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  std::map<std::string, std::vector<const SweepPoint*>> lines;  // finite capacities per policy
  std::vector<std::string> order;                               // policies in first-seen order
  double infinite = -1, max_ratio = 0;
  uint64_t min_cap = UINT64_MAX, max_cap = 0;
  for (const SweepPoint& p : points) {
    if (std::find(order.begin(), order.end(), p.policy) == order.end()) order.push_back(p.policy);
    max_ratio = std::max(max_ratio, p.hit_ratio);
    if (p.capacity_blocks == 0) {
      infinite = std::max(infinite, p.hit_ratio);
      continue;
    }
    lines[p.policy].push_back(&p);
    min_cap = std::min(min_cap, p.capacity_blocks);
    max_cap = std::max(max_cap, p.capacity_blocks);
  }
  if (max_cap == 0) min_cap = max_cap = 1;
  // A round tick step giving at most 10 ticks, and the axis up to the first tick above the data.
  double y_step = 0.2;
  for (double step : {0.01, 0.02, 0.05, 0.1}) {
    if (max_ratio * 1.05 / step <= 10) {
      y_step = step;
      break;
    }
  }
  int y_ticks = std::max(1, static_cast<int>(std::ceil(max_ratio * 1.05 / y_step)));
  y_ticks = std::min(y_ticks, static_cast<int>(std::lround(1.0 / y_step)));  // a ratio never exceeds 1
  const double y_max = y_ticks * y_step;
  const double lx0 = std::log10(static_cast<double>(min_cap));
  const double lx1 = std::max(lx0 + 1e-9, std::log10(static_cast<double>(max_cap)));
  auto x_of = [&](uint64_t c) { return kLeft + (std::log10(static_cast<double>(c)) - lx0) / (lx1 - lx0) * plot_w; };
  auto y_of = [&](double r) { return kTop + plot_h - r / y_max * plot_h; };
  static constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                            "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"14\">%s</text>\n",
      kWidth, kHeight, kLeft, EscapeXml(title));
  // Axes, grid and ticks.
  for (int i = 0; i <= y_ticks; ++i) {
    const double r = i * y_step, y = y_of(r);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n",
                          kLeft, y, kLeft + plot_w, y, kLeft - 6, y + 4, r);
  }
  std::vector<uint64_t> ticks;
  for (const auto& [policy, pts] : lines) {
    for (const SweepPoint* p : pts) ticks.push_back(p->capacity_blocks);
  }
  std::sort(ticks.begin(), ticks.end());
  ticks.erase(std::unique(ticks.begin(), ticks.end()), ticks.end());
  double last_label_x = -1e9;
  for (uint64_t c : ticks) {
    const double x = x_of(c);
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", x, kTop,
                          x, kTop + plot_h);
    if (x - last_label_x >= 40) {
      absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x,
                            kTop + plot_h + 18, CapacityLabel(c));
      last_label_x = x;
    }
  }
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n"
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">capacity (blocks, log scale)</text>\n"
                        "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">"
                        "block-weighted prefix hit ratio</text>\n",
                        kLeft, kTop, plot_w, plot_h, kLeft + plot_w / 2, kHeight - 16, kTop + plot_h / 2,
                        kTop + plot_h / 2);
  // One polyline per policy, then the legend.
  size_t color = 0;
  double legend_y = kTop + 10;
  for (const std::string& policy : order) {
    const char* stroke = kColors[color++ % (sizeof(kColors) / sizeof(kColors[0]))];
    auto it = lines.find(policy);
    if (it != lines.end()) {
      std::vector<const SweepPoint*> pts = it->second;
      std::sort(pts.begin(), pts.end(),
                [](const SweepPoint* a, const SweepPoint* b) { return a->capacity_blocks < b->capacity_blocks; });
      std::string coords;
      for (const SweepPoint* p : pts) {
        absl::StrAppendFormat(&coords, "%.1f,%.1f ", x_of(p->capacity_blocks), y_of(p->hit_ratio));
      }
      absl::StrAppendFormat(&svg, "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n", coords,
                            stroke);
      for (const SweepPoint* p : pts) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x_of(p->capacity_blocks),
                              y_of(p->hit_ratio), stroke);
      }
    }
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                          kLeft + plot_w + 12, legend_y, kLeft + plot_w + 36, legend_y, stroke, kLeft + plot_w + 42,
                          legend_y + 4, EscapeXml(policy));
    legend_y += 18;
  }
  if (infinite >= 0) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\" "
                          "stroke-dasharray=\"6,4\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\">infinite cache %.3f</text>\n",
                          kLeft, y_of(infinite), kLeft + plot_w, y_of(infinite), kLeft + plot_w + 12, legend_y + 4,
                          infinite);
  }
  svg += "</svg>\n";
  return WriteFile(path, svg);
}

}  // namespace kvtier::bench
