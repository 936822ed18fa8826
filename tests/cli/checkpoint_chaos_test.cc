// Chaos for checkpoints (label `chaos`; BRIGADE_CHAOS_TRIALS trials, 10 by
// default as CI runs it, 50 or more for the long form):
//   each trial resumes one run (2 data-parallel workers, a checkpoint every
//   step) and kills the launcher with SIGKILL at a random moment, usually
//   mid-save; every other trial then corrupts the newest checkpoint (a
//   flipped byte or a truncation, in a shard or the manifest).
// After every trial: each step directory that has a manifest either
// verifies or is one this test corrupted; the newest good step never goes
// backwards (a complete checkpoint is never lost); and the next trial's
// resume loads only a good checkpoint (brigade train would fail otherwise).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/core/error.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr char kConfig[] = R"(
[train]
micro_batch = 2
steps = 1000000
checkpoint_every = 1
keep_checkpoints = 3
[data]
synthetic = true
[parallel]
zero = 1
)";

int trials() {
  const char* value = std::getenv("BRIGADE_CHAOS_TRIALS");
  return value != nullptr ? std::max(1, std::atoi(value)) : 10;
}

std::vector<fs::path> complete_steps(const fs::path& root) {
  std::vector<fs::path> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (entry.path().extension().empty() && fs::exists(entry.path() / "manifest.json")) {
      steps.push_back(entry.path());
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

int64_t step_of(const fs::path& dir) {
  return std::stoll(dir.filename().string().substr(5));
}

void corrupt(const fs::path& step_dir, std::mt19937& rng) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(step_dir)) files.push_back(entry.path());
  const fs::path victim = files[rng() % files.size()];
  const auto size = fs::file_size(victim);
  if (rng() % 2 == 0 && size > 1) {
    fs::resize_file(victim, rng() % size);
    return;
  }
  std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(rng() % size);
  f.seekg(at);
  const char old = static_cast<char>(f.get());
  f.seekp(at);
  f.put(static_cast<char>(old ^ (1 + rng() % 255)));
}

TEST(CheckpointChaos, KillsAndCorruptionNeverLoadBadStateNorLoseAStep) {
  testing::TempDir dir("brigade_ckpt_chaos");
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << kConfig;
  const fs::path run = dir.path() / "run";
  const fs::path root = run / "checkpoints";
  const std::string run_dir = "train.run_dir=\"" + run.string() + "\"";
  std::mt19937 rng(20261130);
  std::set<fs::path> corrupted;
  int64_t newest_good = -1;
  int kills_mid_save = 0;
  for (int trial = 0; trial < trials(); ++trial) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::freopen("/dev/null", "w", stderr);
      std::vector<std::string> args = {"train", "--nproc", "2", config.string(), "--set", run_dir};
      if (newest_good >= 0) args.insert(args.end(), {"--resume", run.string()});
      std::vector<char*> argv{const_cast<char*>(testing::kBrigade)};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(testing::kBrigade, argv.data());
      ::_exit(127);
    }
    // Once the run has committed a step of its own (it is past start-up),
    // kill it at a random moment: with a save every step, often mid-save.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    bool progressed = false;
    while (!progressed && std::chrono::steady_clock::now() < deadline) {
      const auto steps = complete_steps(root);
      progressed = !steps.empty() && step_of(steps.back()) > newest_good;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    // A resume that picked a bad checkpoint would have failed instead.
    ASSERT_TRUE(progressed) << "trial " << trial << ": the run saved no new step in 30 s";
    // The workers follow the launcher; wait until they are gone.
    ASSERT_TRUE(testing::wait_until_gone(dir.path().string(), std::chrono::seconds(30)))
        << "trial " << trial << ": workers outlived their launcher";
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (entry.path().extension() == ".partial") ++kills_mid_save;
    }

    int64_t good = -1;
    for (const fs::path& step : complete_steps(root)) {
      if (corrupted.count(step)) continue;  // may have been re-saved, or not
      try {
        verify_checkpoint(step);
        good = std::max(good, step_of(step));
      } catch (const Error& e) {
        ADD_FAILURE() << "trial " << trial
                      << ": committed checkpoint does not verify: " << e.what();
      }
    }
    ASSERT_GE(good, 0) << "trial " << trial << ": no good checkpoint at all";
    EXPECT_GE(good, newest_good) << "trial " << trial << ": a complete checkpoint was lost";
    newest_good = good;
    // resolve_checkpoint picks a step that verifies, whatever was corrupted.
    const fs::path chosen = resolve_checkpoint(run).dir;
    EXPECT_NO_THROW(verify_checkpoint(chosen)) << chosen;

    if (trial % 2 == 1) {
      const fs::path newest = step_directory(root, newest_good);
      corrupt(newest, rng);
      corrupted.insert(newest);
      // Its predecessor is what the next trial resumes from, if still there.
      newest_good = -1;
      for (const fs::path& step : complete_steps(root)) {
        if (corrupted.count(step)) continue;
        newest_good = std::max(newest_good, step_of(step));
      }
      if (newest_good < 0) {
        corrupted.clear();  // all pruned or corrupted: start the run again
        fs::remove_all(run);
      }
    }
  }
  std::printf("[ chaos    ] %d trials, %d killed with a save in flight\n", trials(),
              kills_mid_save);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
