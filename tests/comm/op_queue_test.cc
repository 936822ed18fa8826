#include "brigade/comm/op_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace brigade {
namespace {

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

}  // namespace
}  // namespace brigade
