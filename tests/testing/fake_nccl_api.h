// FakeNcclApi: an in-process stand-in for NCCL and the CUDA runtime, for testing the NCCL transport
// without a GPU. Communicators made from the same unique id form a group that becomes ready once all
// ranks have joined; a grouped send and the peer's grouped receive are matched in posting order and
// copied with memcpy ("device" memory is host memory). Knobs inject the failures a real cluster has:
// sends that never arrive, asynchronous errors, slow enqueues.
#ifndef KVTIER_TESTS_TESTING_FAKE_NCCL_API_H_
#define KVTIER_TESTS_TESTING_FAKE_NCCL_API_H_

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/nccl/nccl_api.h"

namespace kvtier::testing {

class FakeNcclApi final : public nccl::NcclApi {
 public:
  // Sends of this rank complete locally but are never delivered (a peer that vanished mid-transfer).
  std::atomic<int> drop_sends_from_rank{-1};
  // Polls that report "in progress" after each GroupTransfer (a non-blocking enqueue).
  std::atomic<int> enqueue_polls{0};
  std::atomic<int> unique_ids{0}, inits{0}, aborts{0}, finalizes{0}, destroys{0}, group_transfers{0};

  // Every live communicator reports `message` as an asynchronous error from now on.
  void InjectError(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Comm* c : comms_) c->error = message;
  }
  // Live communicators (made and neither aborted nor destroyed).
  size_t live_comms() const {
    std::lock_guard<std::mutex> lock(mu_);
    return comms_.size();
  }

  absl::StatusOr<nccl::NcclUniqueId> GetUniqueId() override {
    nccl::NcclUniqueId id;
    const int n = ++unique_ids;
    std::memcpy(id.bytes.data(), &n, sizeof(n));
    id.bytes[100] = std::byte{0x4e};
    return id;
  }

  absl::StatusOr<nccl::CommHandle> CommInitRank(const nccl::NcclUniqueId& id, int nranks, int rank,
                                                int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++inits;
    auto& group = groups_[Key(id)];
    if (group == nullptr) group = std::make_shared<Group>();
    group->nranks = nranks;
    if (group->ranks.contains(rank)) return absl::UnavailableError(absl::StrCat("rank ", rank, " joined twice"));
    group->ranks.insert(rank);
    auto* c = new Comm{.group = group, .rank = rank, .device = device};
    comms_.insert(c);
    return static_cast<nccl::CommHandle>(c);
  }

  absl::StatusOr<bool> Poll(nccl::CommHandle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    Comm* c = static_cast<Comm*>(h);
    if (!c->error.empty()) return absl::UnavailableError(c->error);
    if (static_cast<int>(c->group->ranks.size()) < c->group->nranks) return false;
    if (c->enqueue_polls_left > 0) {
      --c->enqueue_polls_left;
      return false;
    }
    if (c->finalize_polls_left > 0) {
      --c->finalize_polls_left;
      return false;
    }
    return true;
  }

  absl::Status GroupTransfer(nccl::CommHandle h, nccl::TransferKind kind, std::span<const nccl::DeviceSpan> buffers,
                             int peer, void*) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++group_transfers;
    Comm* c = static_cast<Comm*>(h);
    last_comm_[std::this_thread::get_id()] = c;
    c->enqueue_polls_left = enqueue_polls.load();
    Op op{.comm = c, .seq = ++c->posted, .spans = {buffers.begin(), buffers.end()}};
    if (kind == nccl::TransferKind::kSend) {
      if (drop_sends_from_rank.load() == c->rank) {
        c->completed = op.seq;
        return absl::OkStatus();
      }
      c->group->sends[{c->rank, peer}].push_back(std::move(op));
    } else {
      c->group->recvs[{peer, c->rank}].push_back(std::move(op));
    }
    Match(*c->group, kind == nccl::TransferKind::kSend ? std::make_pair(c->rank, peer) : std::make_pair(peer, c->rank));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> CreateStream(int) override { return static_cast<void*>(new int(0)); }
  void DestroyStream(void* s) override { delete static_cast<int*>(s); }

  absl::StatusOr<nccl::EventHandle> CreateEvent(int) override { return static_cast<nccl::EventHandle>(new Event); }
  void DestroyEvent(nccl::EventHandle e) override { delete static_cast<Event*>(e); }
  absl::Status RecordEvent(nccl::EventHandle e, void*) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* ev = static_cast<Event*>(e);
    auto it = last_comm_.find(std::this_thread::get_id());
    ev->comm = it != last_comm_.end() ? it->second : nullptr;
    ev->target = ev->comm != nullptr ? ev->comm->posted : 0;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> EventDone(nccl::EventHandle e) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* ev = static_cast<Event*>(e);
    if (ev->comm == nullptr || !comms_.contains(ev->comm)) return true;
    return ev->comm->completed >= ev->target;
  }

  absl::Status Finalize(nccl::CommHandle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++finalizes;
    static_cast<Comm*>(h)->finalize_polls_left = 2;
    return absl::OkStatus();
  }
  void Destroy(nccl::CommHandle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++destroys;
    Remove(static_cast<Comm*>(h));
  }
  void Abort(nccl::CommHandle h) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++aborts;
    Remove(static_cast<Comm*>(h));
  }

 private:
  struct Group;
  struct Comm {
    std::shared_ptr<Group> group;
    int rank = 0;
    int device = 0;
    uint64_t posted = 0;     // grouped operations posted
    uint64_t completed = 0;  // grouped operations completed (in order)
    int enqueue_polls_left = 0;
    int finalize_polls_left = 0;
    std::string error;
  };
  struct Op {
    Comm* comm = nullptr;
    uint64_t seq = 0;
    std::vector<nccl::DeviceSpan> spans;
  };
  struct Group {
    int nranks = 0;
    std::set<int> ranks;
    std::map<std::pair<int, int>, std::deque<Op>> sends, recvs;  // by (from, to)
  };
  struct Event {
    Comm* comm = nullptr;
    uint64_t target = 0;
  };

  static std::string Key(const nccl::NcclUniqueId& id) {
    return std::string(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
  }

  // Pairs the oldest send and receive between `route` = (from, to), in order.
  void Match(Group& g, std::pair<int, int> route) {
    auto& s = g.sends[route];
    auto& r = g.recvs[route];
    while (!s.empty() && !r.empty()) {
      Op send = std::move(s.front());
      Op recv = std::move(r.front());
      s.pop_front();
      r.pop_front();
      bool same = send.spans.size() == recv.spans.size();
      for (size_t i = 0; same && i < send.spans.size(); ++i)
        same = send.spans[i].size_bytes == recv.spans[i].size_bytes;
      if (!same) {
        send.comm->error = recv.comm->error = "mismatched send and receive sizes";
        continue;
      }
      for (size_t i = 0; i < send.spans.size(); ++i) {
        std::memcpy(recv.spans[i].ptr, send.spans[i].ptr, send.spans[i].size_bytes);
      }
      send.comm->completed = send.seq;
      recv.comm->completed = recv.seq;
    }
  }

  void Remove(Comm* c) {
    for (auto* m : {&c->group->sends, &c->group->recvs}) {
      for (auto& [route, q] : *m) {
        std::erase_if(q, [c](const Op& op) { return op.comm == c; });
      }
    }
    std::erase_if(last_comm_, [c](const auto& e) { return e.second == c; });
    comms_.erase(c);
    delete c;
  }

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_;  // by unique id
  std::set<Comm*> comms_;
  // Per thread, the communicator of its last GroupTransfer (a channel's RecordEvent follows it).
  std::map<std::thread::id, Comm*> last_comm_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_FAKE_NCCL_API_H_
