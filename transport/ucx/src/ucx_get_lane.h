// The get lanes of UcxClient: threads with their own UCX worker that receive shares of one Get side by
// side (UcxClient::Get, "Lanes"). Private to the UCX library.
#ifndef KVTIER_UCX_SRC_UCX_GET_LANE_H_
#define KVTIER_UCX_SRC_UCX_GET_LANE_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/common/capability_id.h"
#include "kvtier/ucx/ucx_client.h"
#include "ucx_worker.h"

namespace kvtier::ucx {

// After a missed deadline: how long to wait for cancelled receives, then for the force-closed
// endpoint's requests to complete.
inline constexpr absl::Duration kCancelGrace = absl::Milliseconds(50);
inline constexpr absl::Duration kCloseGrace = absl::Seconds(1);

// Whether `ep`'s rendezvous (RMA bandwidth) lanes include a single-copy transport, i.e. the server is on
// this node and a received block is copied by the thread that receives it. UCX 1.13 has no query for an
// endpoint's transports, so this reads ucp_ep_print_info's lane table, whose rows look like
// "lane[1]:  3:cma/memory.0 md[3] -> addr[4].md[3]/cma/sysdev[255] rma_bw#0". Anything it cannot parse
// counts as no, which keeps a Get on the progress thread (correct, only slower).
bool HasSingleCopyLane(ucp_ep_h ep);

// One Get split over lanes: what the caller waits for. Buffers and on_arrival are borrowed (the caller
// waits until remaining is 0).
struct LaneGroup {
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = 0;                      // guarded by mu: lanes still working
  std::vector<UcxClient::ItemStatus> items;  // item j is written by the one lane that has j, before it counts down
  const std::function<void(size_t)>* on_arrival = nullptr;

  void LaneDone() {
    std::lock_guard<std::mutex> lock(mu);
    if (--remaining == 0) cv.notify_all();
  }
};

// One lane's share of a Get.
struct LaneGet {
  std::shared_ptr<LaneGroup> group;
  UcxClient::EndpointId endpoint = 0;  // the main endpoint: names the server
  std::string host_port;               // its UCX listener
  std::string ticket;                  // the session ticket a new lane endpoint presents ("" = none)
  CapabilityId lease_id;
  absl::Time deadline;
  std::vector<uint32_t> slots;    // items j of the group
  std::vector<uint32_t> indices;  // their lease indices
  std::vector<std::span<std::byte>> buffers;
};

// A get lane: a thread with its own UCX worker and its own endpoint to each server, receiving its share
// of Gets (kvtier/ucx/ucx_messages.h kGet) and running on_arrival on each block right after it landed.
// Thread-safety: Post and Forget from any thread.
class GetLane {
 public:
  // Errors: Unavailable (no worker).
  static absl::StatusOr<std::unique_ptr<GetLane>> Start(std::shared_ptr<UcxContext> context);

  ~GetLane();  // stops the thread and closes the lane's endpoints

  void Post(std::shared_ptr<LaneGet> get);
  // Closes this lane's endpoint to the server of `endpoint`, if any.
  void Forget(UcxClient::EndpointId endpoint);

  uint64_t abandoned() const { return abandoned_.load(std::memory_order_relaxed); }

 private:
  // One receive; heap-allocated, since an abandoned receive may complete after its Get returned.
  struct Recv {
    GetLane* lane = nullptr;
    size_t k = 0;  // position in the LaneGet
    uint64_t expected = 0;
    void* request = nullptr;
    bool done = false;
    UcxClient::ItemStatus status = UcxClient::ItemStatus::kError;
  };

  GetLane() = default;

  void Enqueue(std::function<void()> fn);

  void Run();

  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);

  void Work(LaneGet& g);

  // This lane's endpoint to the server of g.endpoint, connected through its listener like the main one.
  ucp_ep_h EndpointFor(const LaneGet& g);

  void CloseEndpoint(UcxClient::EndpointId id);

  std::unique_ptr<UcxWorker> worker_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::atomic<uint64_t> abandoned_{0};
  // The lane's thread only (and the destructor, after it stopped).
  uint64_t next_tag_ = 1;
  absl::flat_hash_map<UcxClient::EndpointId, ucp_ep_h> eps_;
  absl::flat_hash_set<Recv*> abandoned_recvs_;
};

}  // namespace kvtier::ucx

#endif  // KVTIER_UCX_SRC_UCX_GET_LANE_H_
