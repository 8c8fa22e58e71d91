// kvtierctl verify: a checksum scrub of every block of the selected members, all at once, with a
// progress bar (docs/kvtierctl.md). One thread per member reads its Verify stream; the main thread draws.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "commands.h"
#include "ctl_common.h"

namespace kvtier::cli {
namespace {

struct NodeProgress {
  uint64_t checked = 0;
  uint64_t total = 0;  // 0 until the first progress message
  uint64_t corrupt = 0;
  bool summary = false;   // the done=true message arrived
  bool finished = false;  // the stream ended
  grpc::Status status;
  std::vector<std::string> corrupt_fingerprints;  // hex
};

class ProgressDisplay {
 public:
  ProgressDisplay(bool enabled, const ClusterView& view, const std::vector<size_t>& selected)
      : enabled_(enabled),
        tty_(isatty(STDERR_FILENO) == 1),
        view_(view),
        selected_(selected),
        last_line_(selected.size()),
        last_checked_(selected.size(), UINT64_MAX),
        done_shown_(selected.size(), false) {}

  // Called with the lock held on the shared progress.
  void Draw(const std::vector<NodeProgress>& nodes, bool final) {
    if (!enabled_) return;
    if (tty_) {
      uint64_t checked = 0, total = 0, corrupt = 0;
      size_t done = 0;
      for (const NodeProgress& n : nodes) {
        checked += n.checked;
        total += std::max(n.total, n.checked);
        corrupt += n.corrupt;
        done += n.finished ? 1 : 0;
      }
      constexpr int kWidth = 30;
      const double f = total == 0 ? (done == nodes.size() ? 1.0 : 0.0) : static_cast<double>(checked) / total;
      const int filled = static_cast<int>(f * kWidth);
      std::cerr << "\r\033[Kverify [" << std::string(filled, '#') << std::string(kWidth - filled, '-') << "] "
                << absl::StrFormat("%3.0f%%", 100 * f) << " " << checked << "/" << total << " blocks, " << corrupt
                << " corrupt, " << done << "/" << nodes.size() << " members done" << (final ? "\n" : "") << std::flush;
      return;
    }
    // Plain lines: each member at most once a second, and when it finishes.
    const auto now = std::chrono::steady_clock::now();
    for (size_t k = 0; k < nodes.size(); ++k) {
      const NodeProgress& n = nodes[k];
      if (n.finished) {
        if (done_shown_[k]) continue;
        done_shown_[k] = true;
        if (n.status.ok()) {
          std::cerr << "verify " << view_.Name(selected_[k]) << ": done, " << n.checked << " checked, " << n.corrupt
                    << " corrupt\n";
        } else {
          std::cerr << "verify " << view_.Name(selected_[k]) << ": " << DescribeFailure(n.status) << "\n";
        }
      } else if (n.total > 0 && n.checked != last_checked_[k] && now - last_line_[k] >= std::chrono::seconds(1)) {
        last_checked_[k] = n.checked;
        last_line_[k] = now;
        std::cerr << "verify " << view_.Name(selected_[k]) << ": " << n.checked << "/" << n.total << " checked, "
                  << n.corrupt << " corrupt\n";
      }
    }
  }

 private:
  const bool enabled_;
  const bool tty_;
  const ClusterView& view_;
  const std::vector<size_t>& selected_;
  std::vector<std::chrono::steady_clock::time_point> last_line_;
  std::vector<uint64_t> last_checked_;
  std::vector<bool> done_shown_;
};

}  // namespace

int RunVerify(const CtlOptions& options, const VerifyOptions& verify) {
  const std::vector<Endpoint> endpoints = Connect(options.members, options);
  const ClusterView view = ClusterView::Collect(endpoints, options);
  auto selected = view.Select(verify.nodes);
  if (!selected.ok()) {
    std::cerr << "kvtierctl: --node: " << selected.status().message() << "\n";
    return view.CountAnswered() < view.members().size() ? kExitUnreachable : kExitFailure;
  }

  std::mutex mu;
  std::condition_variable changed;
  std::vector<NodeProgress> nodes(selected->size());  // guarded by mu
  std::vector<std::thread> threads;
  for (size_t k = 0; k < selected->size(); ++k) {
    // A member that failed GetInfo is reported with that failure: a Verify stream to a hung member would
    // wait for gRPC's connect timeout (20 s), not --timeout-ms.
    if (const MemberView& m = view.members()[(*selected)[k]]; !m.answered()) {
      std::lock_guard<std::mutex> lock(mu);
      nodes[k].status = m.info_status;
      nodes[k].finished = true;
      continue;
    }
    threads.emplace_back([&, k] {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + verify.deadline));
      auto reader = endpoints[(*selected)[k]].admin->Verify(&ctx, v1::VerifyRequest());
      v1::VerifyProgress p;
      while (reader->Read(&p)) {
        std::lock_guard<std::mutex> lock(mu);
        NodeProgress& n = nodes[k];
        n.checked = p.checked();
        n.total = p.total();
        n.corrupt = p.corrupt();
        if (p.done()) {
          n.summary = true;
          for (const std::string& fp : p.corrupt_fingerprints()) n.corrupt_fingerprints.push_back(HexBytes(fp));
        }
        changed.notify_all();
      }
      grpc::Status s = reader->Finish();
      std::lock_guard<std::mutex> lock(mu);
      NodeProgress& n = nodes[k];
      if (s.ok() && !n.summary) s = grpc::Status(grpc::StatusCode::INTERNAL, "the stream ended without a summary");
      n.status = s;
      n.finished = true;
      changed.notify_all();
    });
  }
  ProgressDisplay display(verify.progress, view, *selected);
  {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      const bool all = std::all_of(nodes.begin(), nodes.end(), [](const NodeProgress& n) { return n.finished; });
      display.Draw(nodes, all);
      if (all) break;
      changed.wait_for(lock, std::chrono::milliseconds(200));
    }
  }
  for (std::thread& t : threads) t.join();

  uint64_t checked = 0, corrupt = 0;
  size_t verified = 0;
  int code = kExitOk;
  for (const NodeProgress& n : nodes) {
    if (n.status.ok()) {
      checked += n.checked;
      corrupt += n.corrupt;
      ++verified;
    } else {
      code = std::max(code, IsUnreachable(n.status) ? kExitUnreachable : kExitFailure);
    }
  }
  if (corrupt > 0) code = kExitCorrupt;

  if (options.json) {
    Json members = Json::array();
    for (size_t k = 0; k < nodes.size(); ++k) {
      const NodeProgress& n = nodes[k];
      const size_t i = (*selected)[k];
      members.push_back({{"address", endpoints[i].address},
                         {"node_id", view.members()[i].answered() ? Json(view.Name(i)) : Json(nullptr)},
                         {"verified", n.status.ok()},
                         {"checked", n.status.ok() ? Json(n.checked) : Json(nullptr)},
                         {"corrupt", n.status.ok() ? Json(n.corrupt) : Json(nullptr)},
                         {"corrupt_fingerprints", n.corrupt_fingerprints},
                         {"error", n.status.ok() ? Json(nullptr) : Json(DescribeFailure(n.status))}});
    }
    std::cout << DumpJson({{"members", members},
                           {"totals",
                            {{"members_verified", verified},
                             {"members_total", nodes.size()},
                             {"checked", checked},
                             {"corrupt", corrupt}}}})
              << "\n";
  } else {
    Table table({"NODE", "CHECKED", "CORRUPT", "RESULT"}, {false, true, true, false});
    for (size_t k = 0; k < nodes.size(); ++k) {
      const NodeProgress& n = nodes[k];
      if (!n.status.ok()) {
        table.AddRow({view.Name((*selected)[k]), "-", "-", IsUnreachable(n.status) ? "unreachable" : "error"});
      } else {
        table.AddRow({view.Name((*selected)[k]), absl::StrCat(n.checked), absl::StrCat(n.corrupt),
                      n.corrupt > 0 ? "CORRUPT" : "ok"});
      }
    }
    table.AddRow({"TOTAL", absl::StrCat(checked), absl::StrCat(corrupt), corrupt > 0 ? "CORRUPT" : ""});
    table.Print(std::cout);
    std::cout << "\n"
              << verified << "/" << nodes.size() << " members verified, " << checked << " blocks checked, " << corrupt
              << " corrupt\n";
    for (size_t k = 0; k < nodes.size(); ++k) {
      for (const std::string& fp : nodes[k].corrupt_fingerprints) {
        std::cout << view.Name((*selected)[k]) << ": corrupt " << fp << "\n";
      }
      if (!nodes[k].status.ok()) {
        std::cout << endpoints[(*selected)[k]].address << ": " << DescribeFailure(nodes[k].status) << "\n";
      }
    }
    if (corrupt > 0) std::cout << "corrupt blocks were dropped (unless leased); clients now miss them\n";
  }
  return code;
}

}  // namespace kvtier::cli
