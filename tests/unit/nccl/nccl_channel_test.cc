// NcclChannel's state machine against FakeNcclApi and a fake clock: init and transfers complete when the
// peer takes part, and a missing peer, an asynchronous error or a cancel aborts the communicator at the
// deadline (or at once) instead of hanging. No GPU, no sockets, no real sleeping.
#include "kvtier/nccl/nccl_channel.h"

#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "testing/fake_nccl_api.h"
#include "testing/status_matchers.h"

namespace kvtier::nccl {
namespace {

class NcclChannelTest : public ::testing::Test {
 protected:
  NcclChannelOptions Options() {
    NcclChannelOptions o;
    o.poll_interval = absl::Milliseconds(1);
    o.clock = &clock_;
    o.sleep = [this](absl::Duration d) {
      clock_.Advance(d);
      ++sleeps_;
      std::this_thread::yield();  // lets a peer thread run; time itself is fake
    };
    return o;
  }

  // Two channels of one communicator (ranks 0 and 1), both ready.
  void MakePair() {
    a_ = std::make_unique<NcclChannel>(api_, Options());
    b_ = std::make_unique<NcclChannel>(api_, Options());
    auto id = api_.GetUniqueId();
    ASSERT_OK(id);
    ASSERT_OK(a_->StartInit(*id, 2, 0, 0));
    ASSERT_OK(b_->StartInit(*id, 2, 1, 0));
    ASSERT_OK(a_->WaitReady(clock_.Now() + absl::Seconds(1)));
    ASSERT_OK(b_->WaitReady(clock_.Now() + absl::Seconds(1)));
  }

  FakeClock clock_;
  std::atomic<int> sleeps_{0};
  testing::FakeNcclApi api_;
  std::unique_ptr<NcclChannel> a_, b_;
};

TEST_F(NcclChannelTest, InitIsReadyOnceBothRanksHaveJoined) {
  MakePair();
  EXPECT_EQ(a_->state(), ChannelState::kReady);
  EXPECT_EQ(b_->state(), ChannelState::kReady);
  EXPECT_EQ(api_.inits.load(), 2);
  EXPECT_EQ(api_.aborts.load(), 0);
}

TEST_F(NcclChannelTest, InitTimesOutAndAbortsWhenThePeerNeverJoins) {
  NcclChannel ch(api_, Options());
  auto id = api_.GetUniqueId();
  ASSERT_OK(id);
  ASSERT_OK(ch.StartInit(*id, 2, 0, 0));
  EXPECT_EQ(ch.state(), ChannelState::kInitializing);
  const absl::Time start = clock_.Now();
  absl::Status s = ch.WaitReady(start + absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(clock_.Now() - start, absl::Seconds(3));
  EXPECT_LT(clock_.Now() - start, absl::Seconds(3) + absl::Milliseconds(2));  // aborted at the first poll past it
  EXPECT_EQ(ch.state(), ChannelState::kAborted);
  EXPECT_EQ(api_.aborts.load(), 1);
  EXPECT_EQ(api_.live_comms(), 0u);
  EXPECT_NE(ch.abort_reason().find("not ready"), std::string::npos) << ch.abort_reason();
  // An aborted channel refuses work without touching NCCL.
  std::vector<std::byte> buf(8);
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}};
  s = ch.Transfer(TransferKind::kSend, spans, 1, nullptr, clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(api_.group_transfers.load(), 0);
}

TEST_F(NcclChannelTest, GroupedTransferDeliversEveryBufferInOrder) {
  MakePair();
  api_.enqueue_polls = 3;  // non-blocking enqueue: the group is "in progress" for a few polls
  std::vector<std::vector<std::byte>> src(3), dst(3);
  std::vector<DeviceSpan> send, recv;
  for (int i = 0; i < 3; ++i) {
    src[i].assign(64 * (i + 1), std::byte(i + 1));
    dst[i].assign(64 * (i + 1), std::byte{0});
    send.push_back({src[i].data(), src[i].size()});
    recv.push_back({dst[i].data(), dst[i].size()});
  }
  absl::Status received;
  std::thread peer(
      [&] { received = b_->Transfer(TransferKind::kRecv, recv, 0, nullptr, clock_.Now() + absl::Hours(1)); });
  EXPECT_OK(a_->Transfer(TransferKind::kSend, send, 1, nullptr, clock_.Now() + absl::Hours(1)));
  peer.join();
  EXPECT_OK(received);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dst[i], src[i]) << "buffer " << i;
  EXPECT_EQ(a_->state(), ChannelState::kReady);
  EXPECT_EQ(api_.group_transfers.load(), 2);  // one group per side, not one call per buffer
  // The channel is reused: a second transfer on the same communicator.
  std::thread peer2(
      [&] { received = b_->Transfer(TransferKind::kRecv, recv, 0, nullptr, clock_.Now() + absl::Hours(1)); });
  EXPECT_OK(a_->Transfer(TransferKind::kSend, send, 1, nullptr, clock_.Now() + absl::Hours(1)));
  peer2.join();
  EXPECT_OK(received);
  EXPECT_EQ(api_.inits.load(), 2);
}

TEST_F(NcclChannelTest, ASendThePeerNeverReceivesAbortsAtTheDeadline) {
  MakePair();
  std::vector<std::byte> buf(128, std::byte{7});
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}};
  const absl::Time start = clock_.Now();
  absl::Status s = a_->Transfer(TransferKind::kSend, spans, 1, nullptr, start + absl::Seconds(2));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(clock_.Now() - start, absl::Seconds(2));
  EXPECT_LT(clock_.Now() - start, absl::Seconds(2) + absl::Milliseconds(2));
  EXPECT_EQ(a_->state(), ChannelState::kAborted);
  EXPECT_EQ(api_.aborts.load(), 1);
  EXPECT_EQ(b_->state(), ChannelState::kReady);  // the peer's own state is its business
  // Abort is idempotent; Close after an abort does not destroy twice.
  a_->Abort();
  a_->Close();
  EXPECT_EQ(api_.aborts.load(), 1);
  EXPECT_EQ(api_.destroys.load(), 0);
}

TEST_F(NcclChannelTest, AReceiveFromAPeerWhoseSendsAreLostAbortsAtTheDeadline) {
  MakePair();
  api_.drop_sends_from_rank = 0;
  std::vector<std::byte> src(32, std::byte{1}), dst(32, std::byte{0});
  std::vector<DeviceSpan> send = {{src.data(), src.size()}}, recv = {{dst.data(), dst.size()}};
  EXPECT_OK(a_->Transfer(TransferKind::kSend, send, 1, nullptr, clock_.Now() + absl::Seconds(1)));
  absl::Status s = b_->Transfer(TransferKind::kRecv, recv, 0, nullptr, clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(b_->state(), ChannelState::kAborted);
  EXPECT_EQ(dst[0], std::byte{0});
}

TEST_F(NcclChannelTest, AnAsynchronousErrorAbortsAtOnce) {
  MakePair();
  api_.InjectError("remote process exited");
  std::vector<std::byte> buf(16);
  std::vector<DeviceSpan> spans = {{buf.data(), buf.size()}};
  const absl::Time start = clock_.Now();
  absl::Status s = a_->Transfer(TransferKind::kSend, spans, 1, nullptr, start + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("remote process exited"), std::string::npos) << s;
  EXPECT_LT(clock_.Now() - start, absl::Milliseconds(2));  // no wait for the deadline
  EXPECT_EQ(a_->state(), ChannelState::kAborted);
}

TEST_F(NcclChannelTest, CancelEndsAWaitInProgressWithoutWaitingForTheDeadline) {
  NcclChannel ch(api_, Options());
  auto id = api_.GetUniqueId();
  ASSERT_OK(id);
  ASSERT_OK(ch.StartInit(*id, 2, 0, 0));
  absl::Status s;
  std::thread waiter([&] { s = ch.WaitReady(clock_.Now() + absl::Hours(24)); });
  while (sleeps_.load() < 5) std::this_thread::yield();  // the waiter is polling
  ch.Cancel();
  waiter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(ch.state(), ChannelState::kAborted);
  EXPECT_LT(clock_.Now() - absl::UnixEpoch(), absl::Hours(2));
  EXPECT_EQ(api_.aborts.load(), 1);
}

TEST_F(NcclChannelTest, CloseFinalizesAReadyCommunicatorAndAbortsAnInitializingOne) {
  MakePair();
  a_->Close();
  EXPECT_EQ(a_->state(), ChannelState::kClosed);
  EXPECT_EQ(api_.finalizes.load(), 1);
  EXPECT_EQ(api_.destroys.load(), 1);
  EXPECT_EQ(api_.aborts.load(), 0);
  a_->Close();  // idempotent
  EXPECT_EQ(api_.destroys.load(), 1);

  NcclChannel lonely(api_, Options());
  auto id = api_.GetUniqueId();
  ASSERT_OK(id);
  ASSERT_OK(lonely.StartInit(*id, 2, 0, 0));
  lonely.Close();
  EXPECT_EQ(lonely.state(), ChannelState::kAborted);
  EXPECT_EQ(api_.aborts.load(), 1);
}

TEST_F(NcclChannelTest, StartInitOnlyFromIdleAndARefusedInitAborts) {
  MakePair();
  auto id = api_.GetUniqueId();
  ASSERT_OK(id);
  EXPECT_EQ(a_->StartInit(*id, 2, 0, 0).code(), absl::StatusCode::kFailedPrecondition);
  NcclChannel c1(api_, Options()), c2(api_, Options());
  ASSERT_OK(c1.StartInit(*id, 2, 0, 0));
  absl::Status s = c2.StartInit(*id, 2, 0, 0);  // rank 0 twice: NCCL refuses
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(c2.state(), ChannelState::kAborted);
}

TEST_F(NcclChannelTest, AnEmptyTransferPostsNothing) {
  MakePair();
  EXPECT_OK(a_->Transfer(TransferKind::kSend, {}, 1, nullptr, clock_.Now() + absl::Seconds(1)));
  EXPECT_EQ(api_.group_transfers.load(), 0);
}

}  // namespace
}  // namespace kvtier::nccl
