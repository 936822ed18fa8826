// StepClock: time goes to the innermost open section, moved milliseconds
// change section, a step's parts add up to its window, and each window
// starts where the last ended. Busy waits on the steady clock give lower
// bounds only, which hold however loaded the machine is.
#include "brigade/train/step_breakdown.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <thread>

#include "brigade/core/clock.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

void spin_ms(double ms) {
  const int64_t until = now_ns() + static_cast<int64_t>(ms * 1e6);
  while (now_ns() < until) {
  }
}

void expect_adds_up(const StepBreakdown& b) {
  EXPECT_NEAR(b.sum_ms(), b.step_ms, 1e-9);
  for (double v : b.ms) EXPECT_GE(v, -1e-9);
}

TEST(StepClock, TimeGoesToTheInnermostSection) {
  StepClock clock;
  clock.restart();
  {
    const StepClock::Section compute(clock, StepPart::kCompute);
    spin_ms(3);
    {
      const StepClock::Section data(clock, StepPart::kData);
      spin_ms(2);
    }
    spin_ms(1);
  }
  spin_ms(1);
  const StepBreakdown b = clock.end_step();
  expect_adds_up(b);
  EXPECT_GE(b[StepPart::kCompute], 4.0);
  EXPECT_GE(b[StepPart::kData], 2.0);
  EXPECT_GE(b[StepPart::kOther], 1.0);
  EXPECT_GE(b.step_ms, 7.0);
  // The nested data is not also compute: compute's share is what it spun
  // alone, far from the whole window (a margin of 1 ms of preemption).
  EXPECT_LT(b[StepPart::kCompute], b.step_ms - 2.0);
  EXPECT_GE(b.compute_runqueue_ms, 0.0);
}

TEST(StepClock, MovedMillisecondsLeaveTheEnclosingSection) {
  StepClock clock;
  {
    const StepClock::Section compute(clock, StepPart::kCompute);
    spin_ms(3);
    clock.move(1.5, StepPart::kBubble);
    clock.move(0.5, StepPart::kComm);
  }
  const StepBreakdown b = clock.end_step();
  expect_adds_up(b);
  EXPECT_DOUBLE_EQ(b[StepPart::kBubble], 1.5);
  EXPECT_DOUBLE_EQ(b[StepPart::kComm], 0.5);
  EXPECT_GE(b[StepPart::kCompute], 1.0);
}

TEST(StepClock, EachWindowStartsWhereTheLastEnded) {
  StepClock clock;
  const StepClock::Section compute(clock, StepPart::kCompute);
  spin_ms(5);
  const StepBreakdown first = clock.end_step();
  spin_ms(1);
  const StepBreakdown second = clock.end_step();
  expect_adds_up(first);
  expect_adds_up(second);
  EXPECT_GE(first[StepPart::kCompute], 5.0);
  // The open section goes on accruing in the next window, and only there.
  EXPECT_GE(second[StepPart::kCompute], 1.0);
  EXPECT_LT(second.step_ms, first.step_ms + 1.0 + 50.0);
  EXPECT_NEAR(second[StepPart::kCompute], second.step_ms, 1e-9);
}

// Three threads spinning on one CPU: the clock's thread waits on the run
// queue about two thirds of the time, and compute says so. More than half:
// the time on a cpu (the field before the wait in schedstat) is a third.
TEST(StepClock, CountsComputesWaitForACore) {
  if (!std::filesystem::exists("/proc/thread-self/schedstat")) {
    GTEST_SKIP() << "this kernel keeps no schedstat";
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(one), &one), 0);
  cpu_set_t saved = one;
  int cpu = 0;
  while (!CPU_ISSET(cpu, &one)) ++cpu;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  // Each inherits the affinity: the same CPU.
  const auto spin = [&] {
    started.fetch_add(1);
    while (!stop.load(std::memory_order_relaxed)) {
    }
  };
  std::thread rival(spin), second_rival(spin);
  while (started.load() < 2) std::this_thread::yield();
  StepClock clock;
  {
    const StepClock::Section compute(clock, StepPart::kCompute);
    spin_ms(200);
  }
  const StepBreakdown b = clock.end_step();
  stop = true;
  rival.join();
  second_rival.join();
  ::sched_setaffinity(0, sizeof(saved), &saved);
  EXPECT_GE(b[StepPart::kCompute], 200.0);
  EXPECT_TRUE(clock.counts_runqueue());
  // Two thirds of it waiting while the rivals ran (other processes only add).
  EXPECT_GT(b.compute_runqueue_ms, 0.5 * b[StepPart::kCompute]);
  EXPECT_LE(b.compute_runqueue_ms, b[StepPart::kCompute]);
}

// The process's CPU in the window counts every thread's work, not the
// clock's thread's: a snapshot's writer burns its CPU beside the step.
// Lower bounds again: what the other thread itself measured it used.
TEST(StepClock, CountsTheCpuOfEveryThreadOfTheProcess) {
  StepClock clock;
  std::atomic<int64_t> worker_cpu_ns{0};
  std::thread worker([&] {
    const int64_t start = thread_cpu_ns();
    while (thread_cpu_ns() - start < 150 * kNsPerMs) {
    }
    worker_cpu_ns = thread_cpu_ns() - start;
  });
  worker.join();
  const StepBreakdown b = clock.end_step();
  EXPECT_GE(b.process_cpu_ms, static_cast<double>(worker_cpu_ns.load()) * 1e-6);
  // The next window starts where this one ended: none of it there.
  const StepBreakdown next = clock.end_step();
  EXPECT_LT(next.process_cpu_ms, 100.0);
}

TEST(StepBreakdown, TravelsAsAVectorAndPrintsPercentages) {
  StepBreakdown b;
  b.step_ms = 100;
  b.compute_runqueue_ms = 3;
  b.process_cpu_ms = 180;
  b[StepPart::kCompute] = 71;
  b[StepPart::kComm] = 12;
  b[StepPart::kBubble] = 9;
  b[StepPart::kData] = 1;
  b[StepPart::kOther] = 7;
  const std::vector<double> v = b.to_vector();
  ASSERT_EQ(static_cast<int>(v.size()), StepBreakdown::kVectorSize);
  const StepBreakdown back = StepBreakdown::from_vector(v.data());
  EXPECT_EQ(back.ms, b.ms);
  EXPECT_EQ(back.step_ms, 100);
  EXPECT_EQ(back.compute_runqueue_ms, 3);
  EXPECT_EQ(back.process_cpu_ms, 180);
  EXPECT_EQ(b.percentages(), "compute 71% comm 12% bubble 9% data 1% ckpt 0% other 7%");
  b[StepPart::kOptimizer] = 4;
  EXPECT_EQ(b.percentages(), "compute 71% opt 4% comm 12% bubble 9% data 1% ckpt 0% other 7%");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
