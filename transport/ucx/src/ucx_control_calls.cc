#include "ucx_control_calls.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtier/v1/cache.pb.h"

namespace kvtier::ucx {
namespace {

template <typename Req, typename Fn>
absl::StatusOr<std::string> Typed(const UcxControlCalls::Call& call, const char* what, Fn&& fn) {
  Req req;
  if (!req.ParseFromArray(call.payload.data(), static_cast<int>(call.payload.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a ", Req::descriptor()->name()));
  }
  auto resp = fn(req);
  if (!resp.ok()) return resp.status();
  return resp->SerializeAsString();
}

}  // namespace

UcxControlCalls::UcxControlCalls(HostBlockSource& source, int threads, std::function<void()> wake)
    : source_(source), wake_(std::move(wake)) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

bool UcxControlCalls::Push(Call call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (calls_.size() >= kMaxQueued) return false;
    calls_.push_back(std::move(call));
  }
  cv_.notify_one();
  return true;
}

std::vector<UcxControlCalls::Reply> UcxControlCalls::TakeReplies() {
  std::vector<Reply> ready;
  std::lock_guard<std::mutex> lock(mu_);
  ready.swap(replies_);
  replies_ready_.store(false, std::memory_order_relaxed);
  return ready;
}

void UcxControlCalls::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

std::string UcxControlCalls::EncodeReply(uint64_t request_id, absl::StatusOr<std::string> answer) {
  msg::LeaseMessage reply{.request_id = request_id};
  reply.ok = answer.ok();
  reply.code = answer.ok() ? 0 : static_cast<uint32_t>(answer.status().code());  // the client reports it as is
  reply.payload = answer.ok() ? std::move(answer).value() : std::string(answer.status().message());
  return msg::Encode(reply, /*reply=*/true);
}

void UcxControlCalls::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !calls_.empty(); });
    if (stop_) return;
    Call call = std::move(calls_.front());
    calls_.pop_front();
    lock.unlock();
    std::string bytes = EncodeReply(call.request_id, Answer(call));
    lock.lock();
    replies_.push_back({.endpoint = call.endpoint, .reply_id = call.reply_id, .bytes = std::move(bytes)});
    replies_ready_.store(true, std::memory_order_release);
    wake_();
  }
}

absl::StatusOr<std::string> UcxControlCalls::Answer(const Call& call) {
  switch (call.call) {
    case msg::kLease:
      return Typed<v1::ReadRequest>(call, "kLease", [&](const auto& r) { return source_.Lease(call.who, r); });
    case msg::kAllocate:
      return Typed<v1::AllocateRequest>(call, "kAllocate",
                                        [&](const auto& r) { return source_.Allocate(call.who, r); });
    default:
      return Typed<v1::CommitRequest>(call, "kCommit", [&](const auto& r) { return source_.Commit(call.who, r); });
  }
}

}  // namespace kvtier::ucx
