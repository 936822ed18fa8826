#include "brigade/comm/op_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace brigade {
namespace BRIGADE_TEST_FILE {

OpQueue::OnFailure blame_rank(int peer) {
  return [peer](const OpQueue::Op& op, std::exception_ptr e) {
    std::string reason;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      reason = x.what();
    }
    return CommError("test " + op.what + " failed: " + reason, {peer});
  };
}

TEST(OpQueue, RunsOperationsInIssueOrderOffTheCallersThread) {
  OpQueue queue("test", "g", 0, 2, blame_rank(1));
  queue.start();
  std::vector<uint64_t> seen;
  std::atomic<bool> release{false};
  const auto caller = std::this_thread::get_id();
  std::vector<std::shared_ptr<Work>> works;
  works.push_back(queue.enqueue("first", 4, [&](const OpQueue::Op& op) {
    EXPECT_NE(std::this_thread::get_id(), caller);
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    seen.push_back(op.seq);
  }));
  for (int i = 0; i < 3; ++i) {
    works.push_back(
        queue.enqueue("next", 4, [&](const OpQueue::Op& op) { seen.push_back(op.seq); }));
  }
  EXPECT_FALSE(works.back()->test());  // the first one is still holding the thread
  release = true;
  for (auto& w : works) w->wait();
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 1, 2, 3}));
}

TEST(OpQueue, AFailureFailsEveryLaterOperationWithTheCause) {
  OpQueue queue("test", "g", 0, 2, blame_rank(1));
  queue.start();
  bool later_ran = false;
  auto failing = queue.enqueue(
      "all_reduce", 4, [](const OpQueue::Op&) { throw std::runtime_error("peer hung up"); });
  auto later = queue.enqueue("barrier", 0, [&](const OpQueue::Op&) { later_ran = true; });
  try {
    failing->wait();
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("peer hung up"), std::string::npos) << e.what();
    EXPECT_EQ(e.peer_ranks(), std::vector<int>{1});
  }
  try {
    later->wait();
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("barrier on group 'g' seq 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("failed earlier"), std::string::npos) << msg;
    EXPECT_EQ(e.peer_ranks(), std::vector<int>{1});
  }
  EXPECT_FALSE(later_ran);
}

TEST(OpQueue, TryInlineRunsOnTheCallersThreadWhenIdle) {
  OpQueue queue("test", "g", 0, 2, blame_rank(1));
  queue.start();
  const auto caller = std::this_thread::get_id();
  std::vector<uint64_t> seqs;
  auto first = queue.try_inline("small", 4, [&](const OpQueue::Op& op) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    seqs.push_back(op.seq);
    return OpQueue::Body();  // finished inline
  });
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(first->test());  // done before the call returned
  auto second = queue.enqueue("queued", 4, [&](const OpQueue::Op& op) { seqs.push_back(op.seq); });
  second->wait();
  EXPECT_EQ(seqs, (std::vector<uint64_t>{0, 1}));
}

TEST(OpQueue, TryInlineHandsTheRestToTheThreadAheadOfLaterOperations) {
  OpQueue queue("test", "g", 0, 2, blame_rank(1));
  queue.start();
  const auto caller = std::this_thread::get_id();
  std::vector<std::string> order;
  std::atomic<bool> release{false};
  auto small = queue.try_inline("small", 4, [&](const OpQueue::Op&) -> OpQueue::Body {
    order.push_back("started inline");
    return [&](const OpQueue::Op& op) {
      EXPECT_NE(std::this_thread::get_id(), caller);
      EXPECT_EQ(op.seq, 0u);
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      order.push_back("finished on the thread");
    };
  });
  ASSERT_NE(small, nullptr);
  EXPECT_FALSE(small->test());
  // The queue is busy with the rest now: a second attempt must not run inline.
  bool attempted = false;
  auto refused = queue.try_inline("small", 4, [&](const OpQueue::Op&) {
    attempted = true;
    return OpQueue::Body();
  });
  EXPECT_EQ(refused, nullptr);
  EXPECT_FALSE(attempted);
  auto later = queue.enqueue("later", 4, [&](const OpQueue::Op& op) {
    EXPECT_EQ(op.seq, 1u);  // the refused attempt took no sequence number
    order.push_back("later");
  });
  release = true;
  later->wait();
  EXPECT_TRUE(small->test());
  EXPECT_EQ(order, (std::vector<std::string>{"started inline", "finished on the thread", "later"}));
}

TEST(OpQueue, TryInlineFailuresBreakTheGroupLikeAnyOther) {
  OpQueue queue("test", "g", 0, 2, blame_rank(1));
  queue.start();
  auto failing = queue.try_inline("small", 4, [](const OpQueue::Op&) -> OpQueue::Body {
    throw std::runtime_error("slot vanished");
  });
  ASSERT_NE(failing, nullptr);
  try {
    failing->wait();
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("slot vanished"), std::string::npos) << e.what();
    EXPECT_EQ(e.peer_ranks(), std::vector<int>{1});
  }
  // A failed group runs nothing inline; the queue fails what is enqueued.
  EXPECT_EQ(queue.try_inline("small", 4, [](const OpQueue::Op&) { return OpQueue::Body(); }),
            nullptr);
  EXPECT_THROW(queue.enqueue("later", 4, [](const OpQueue::Op&) {})->wait(), CommError);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
