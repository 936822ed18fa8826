// Checkpoints through the real binary and launcher, data-parallel (label
// `slow`: some 30 training runs; the sanitizer build leaves them out):
// - kill -9 after the step-10 checkpoint, resume, finish: the same losses,
//   bit for bit, and the same final state (ckpt hash) as an uninterrupted run;
// - a checkpoint saved by dp 2 under ZeRO 1 continues under dp 4 ZeRO 3,
//   dp 2 ZeRO 2, dp 3 ZeRO 3, dp 4 ZeRO 2 and one process (same global
//   batch), within the data-parallel equivalence tolerance of the
//   same-layout continuation; and what each of those saves, reloaded by one
//   process, dp 3 ZeRO 1 and dp 4 ZeRO 3 and saved again, has the same
//   `ckpt hash`.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::run_brigade;

// Global batch 12 sequences: dp 2 x 2 x 3, dp 3 x 2 x 2, dp 4 x 3 x 1. A
// constant learning rate, so a run told to go on for 1000 steps (to be
// killed mid-way) follows the same trajectory as one of 20.
constexpr char kConfig[] = R"(
[train]
micro_batch = 2
grad_accum = 3
steps = 20
checkpoint_every = 10
seed = 5
[optim]
lr = 3e-3
min_lr = 3e-3
grad_clip = 0.5
[data]
synthetic = true
[parallel]
bucket_mb = 0.01
)";

std::map<int64_t, double> losses(const fs::path& run) {
  std::map<int64_t, double> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("loss")) out[row.at("step").get<int64_t>()] = row.at("loss").get<double>();
  }
  return out;
}

std::string set_run_dir(const fs::path& run) {
  return "train.run_dir=\"" + run.string() + "\"";
}

class CheckpointResume : public ::testing::Test {
 protected:
  void SetUp() override { std::ofstream(config_) << testing::kTinyModelToml << kConfig; }
  // The uninterrupted reference: dp 2, ZeRO 1, 20 steps.
  fs::path reference() {
    const fs::path run = dir_.path() / "reference";
    const auto r = run_brigade({"train", "--nproc", "2", config_.string(), "--set",
                                "parallel.zero=1", "--set", set_run_dir(run)});
    EXPECT_EQ(r.status, 0) << r.err;
    return run;
  }
  std::string hash(const fs::path& path) {
    const auto r = run_brigade({"ckpt", "hash", path.string()});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }

  testing::TempDir dir_{"brigade_ckpt_resume"};
  fs::path config_ = dir_.path() / "config.toml";
};

TEST_F(CheckpointResume, KillNineThenResumeIsBitIdentical) {
  const fs::path ref = reference();
  const fs::path run = dir_.path() / "killed";
  // A run that is killed -9 (launcher and, through it, both workers) as
  // soon as its step-10 checkpoint is complete: somewhere in steps 11-20.
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string run_dir = set_run_dir(run);
    ::freopen("/dev/null", "w", stderr);
    ::execl(testing::kBrigade, testing::kBrigade, "train", "--nproc", "2", config_.c_str(), "--set",
            "parallel.zero=1", "--set", "train.steps=1000", "--set", run_dir.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const fs::path tenth = run / "checkpoints" / "step_00000010" / "manifest.json";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(tenth) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(fs::exists(tenth)) << "no step-10 checkpoint within 60 s";
  // The workers die with the launcher; wait until they are gone.
  ASSERT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));

  const auto resumed =
      run_brigade({"train", "--nproc", "2", config_.string(), "--set", "parallel.zero=1", "--set",
                   set_run_dir(run), "--resume", (run / "checkpoints" / "step_00000010").string()});
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  const auto a = losses(ref), b = losses(run);
  for (int64_t step = 11; step <= 20; ++step) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_EQ(a.at(step), b.at(step)) << "step " << step;
  }
  EXPECT_EQ(hash(ref / "checkpoints" / "step_00000020"),
            hash(run / "checkpoints" / "step_00000020"));
}

TEST_F(CheckpointResume, ContinuesUnderOtherDpAndZeroStages) {
  const fs::path ref = reference();
  const fs::path tenth = ref / "checkpoints" / "step_00000010";
  const auto a = losses(ref);
  struct Layout {
    int dp, zero, micro_batch, grad_accum;
  };
  // The saving layouts (the reference is dp 2 ZeRO 1); each continues the
  // reference's step-10 checkpoint to step 20 and saves there.
  const Layout savers[] = {{4, 3, 3, 1}, {2, 2, 2, 3}, {3, 3, 2, 2}, {4, 2, 3, 1}, {1, 0, 2, 6}};
  // The loading layouts: each reloads every saver's step-20 checkpoint.
  const Layout loaders[] = {{1, 0, 2, 6}, {3, 1, 2, 2}, {4, 3, 3, 1}};
  auto train = [&](const Layout& l, const fs::path& from, const fs::path& run) {
    return run_brigade({"train", "--nproc", std::to_string(l.dp), config_.string(), "--resume",
                        from.string(), "--set", fmt::format("parallel.zero={}", l.zero), "--set",
                        fmt::format("train.micro_batch={}", l.micro_batch), "--set",
                        fmt::format("train.grad_accum={}", l.grad_accum), "--set",
                        set_run_dir(run)});
  };
  for (const Layout& saver : savers) {
    const std::string what = fmt::format("saved by dp {} zero {}", saver.dp, saver.zero);
    const fs::path run = dir_.path() / fmt::format("dp{}_zero{}", saver.dp, saver.zero);
    const auto r = train(saver, tenth, run);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto b = losses(run);
    for (int64_t step = 11; step <= 20; ++step) {
      ASSERT_TRUE(b.count(step)) << what << ", step " << step;
      EXPECT_LE(std::abs(b.at(step) - a.at(step)), 1e-5 * std::abs(a.at(step)))
          << what << ", step " << step;
    }
    // Reloaded by each loader (4 -> 3 ranks among them: shards that do not
    // line up) and saved again at once: the same global state.
    const fs::path saved = run / "checkpoints" / "step_00000020";
    const std::string expected = hash(saved);
    for (const Layout& loader : loaders) {
      const fs::path resaved =
          dir_.path() /
          fmt::format("{}_reloaded_dp{}_zero{}", run.filename().string(), loader.dp, loader.zero);
      const auto again = train(loader, saved, resaved);
      ASSERT_EQ(again.status, 0) << again.err;
      EXPECT_EQ(hash(resaved / "checkpoints" / "step_00000020"), expected)
          << what << ", reloaded by dp " << loader.dp << " zero " << loader.zero;
    }
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
