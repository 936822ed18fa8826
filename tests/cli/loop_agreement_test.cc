// What the ranks agree on between two steps through the training loop's one
// collective there, the per-step gather of rank stats (train/rank_stats.h),
// end to end through the real binary and launcher:
// - a checkpoint written in the background completes on every rank while
//   training goes on, and is reported once (metrics.jsonl's "checkpoint"),
//   with no collective of the saver's own: the gathered writer states tell
//   every rank at once that it is done, in a data-parallel and in a
//   pipeline layout (the savers' group is the world in every layout, as
//   the gather's is);
// - a stop signal sent to one worker alone stops every rank after the same
//   step: rank 0, which was sent nothing, says it was interrupted, and
//   the checkpoint they save together holds the steps metrics.jsonl reports.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
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

// Background checkpoints at steps 40, 80, ..., 360, each written while the
// next 40 steps run; the final one (step 400) by a save that waits.
constexpr char kTraining[] = R"(
[train]
micro_batch = 2
grad_accum = 2
steps = 400
checkpoint_every = 40
seed = 3
[data]
synthetic = true
)";

std::vector<nlohmann::json> step_lines(const fs::path& metrics) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (!row.is_discarded() && row.contains("loss")) lines.push_back(row);
  }
  return lines;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class LoopAgreement : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { std::ofstream(config_) << testing::kTinyModelToml << kTraining; }
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  testing::TempDir dir_{"brigade_loop_agreement"};
  fs::path config_ = dir_.path() / "config.toml";
};

TEST_P(LoopAgreement, ABackgroundCheckpointIsReportedOnceEveryRankFinishedIt) {
  const fs::path run = dir_.path() / "run";
  const auto r = run_brigade({"train", "--nproc", "2", config_.string(), "--set",
                              std::string("parallel.") + GetParam() + "=2", "--set",
                              "train.run_dir=\"" + run.string() + "\""},
                             std::chrono::seconds(300));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<nlohmann::json> lines = step_lines(run / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 400u) << r.err;
  // By the step that reported it, for each checkpoint reported.
  std::map<int64_t, int64_t> reported;
  for (const nlohmann::json& line : lines) {
    if (!line.contains("checkpoint")) continue;
    const int64_t saved = line.at("checkpoint").at("step");
    const int64_t at = line.at("step");
    EXPECT_TRUE(reported.emplace(saved, at).second) << "reported twice: " << line.dump();
    EXPECT_GT(line.at("checkpoint").at("rank0_bytes").get<double>(), 0) << line.dump();
    // Reported after it started, and at the latest by the step after the
    // next checkpoint's start (which waits for it).
    EXPECT_GT(at, saved) << line.dump();
    EXPECT_LE(at, saved + 41) << line.dump();
  }
  // Every one but the last background one (360: its write may outlast the
  // run's last 40 steps) is reported.
  for (int64_t saved = 40; saved < 360; saved += 40) {
    EXPECT_TRUE(reported.count(saved))
        << "the checkpoint of step " << saved << " was never reported";
  }
  // The gathered states complete a save as soon as every rank's part is
  // done: a checkpoint of a few hundred kilobytes is reported before the
  // next one starts (without them, only the next start's wait() would
  // complete each, reported the step after it, 41 steps on).
  int early = 0;
  for (const auto& [saved, at] : reported) early += at <= saved + 40 ? 1 : 0;
  EXPECT_GT(early, 0) << "no checkpoint completed while training went on";
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000400" / "manifest.json"));
}

INSTANTIATE_TEST_SUITE_P(Layouts, LoopAgreement, ::testing::Values("dp", "pp"));

TEST_F(LoopAgreement, ASignalToOneWorkerStopsEveryRankAfterTheSameStep) {
  const fs::path run = dir_.path() / "run";
  const fs::path err = dir_.path() / "launch.err";
  std::fflush(nullptr);
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::freopen(err.c_str(), "w", stderr);
    ::freopen("/dev/null", "w", stdout);
    // No restart: the workers' exit with the signal's status ends the job.
    const std::string run_dir = "train.run_dir=\"" + run.string() + "\"";
    // A background checkpoint every step: the stop's step would start one
    // too if the loop did not skip it for its final save.
    ::execl(testing::kBrigade, testing::kBrigade, "train", "--nproc", "2", config_.c_str(), "--set",
            "train.steps=1000000", "--set", "train.checkpoint_every=1", "--set", run_dir.c_str(),
            "--max-restarts", "0", nullptr);
    ::_exit(127);
  }
  const pid_t rank1 = testing::wait_for_worker(launcher, 1, std::chrono::seconds(60));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (step_lines(run / "metrics.jsonl").size() < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (rank1 > 0) ::kill(rank1, SIGTERM);
  int status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(launcher, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (done == 0) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, &status, 0);
  }
  const std::string text = read_text(err);
  ASSERT_GT(rank1, 0) << text;
  ASSERT_NE(done, 0) << "the job did not stop on one worker's SIGTERM: " << text;
  // Rank 0 reports; it was sent nothing and stops with rank 1.
  const std::vector<nlohmann::json> lines = step_lines(run / "metrics.jsonl");
  ASSERT_FALSE(lines.empty()) << text;
  const int64_t last = lines.back().at("step");
  EXPECT_NE(text.find("interrupted at step " + std::to_string(last) + "; saving a checkpoint"),
            std::string::npos)
      << text;
  // Its workers exited with the signal's status (128 + SIGTERM) after
  // their checkpoint; with no restart allowed the launcher says so and
  // fails (the launcher itself was sent nothing).
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << "\n" << text;
  EXPECT_NE(text.find("exited with status 143"), std::string::npos) << text;
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(last));
  // The stop's step is saved once, by the final save, not first in the
  // background as well.
  EXPECT_EQ(text.find(std::string(name) + " in the background"), std::string::npos) << text;
  EXPECT_TRUE(fs::exists(run / "checkpoints" / name / "manifest.json")) << name << "\n" << text;
  const auto verified = run_brigade({"ckpt", "inspect", (run / "checkpoints" / name).string()});
  EXPECT_EQ(verified.status, 0) << verified.err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
