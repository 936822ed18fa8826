// What happens to a run's checkpoints when things go wrong, through the real
// binary and launcher (label `slow`):
// - a rollback (resume from an older step of the same run directory) moves
//   the abandoned branch's later steps aside, so an automatic resume after a
//   crash continues the new branch, bit-identical to a run that started
//   from the same step elsewhere;
// - a disk that fills during a background save stops the job on every rank
//   within seconds, naming the rank, its file and the cause, without a
//   .partial step left behind, the previous checkpoint still the newest;
// - SIGTERM to a worker whose peer is already dead: it gives up the save at
//   once and exits with the signal's status, well inside the launcher's 5 s
//   grace period, leaving the newest complete checkpoint as it was.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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
using testing::run_brigade;

constexpr char kConfig[] = R"(
[train]
micro_batch = 2
grad_accum = 2
steps = 30
checkpoint_every = 10
keep_checkpoints = 3
seed = 9
[optim]
lr = 3e-3
min_lr = 3e-3
[data]
synthetic = true
[parallel]
zero = 1
)";

std::string set_run_dir(const fs::path& run) {
  return "train.run_dir=\"" + run.string() + "\"";
}

// Starts `brigade ARGS...` as a child with stderr to `err_path`; returns its pid.
pid_t spawn_brigade(const std::vector<std::string>& args, const fs::path& err_path) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::freopen(err_path.c_str(), "w", stderr);
    ::freopen("/dev/null", "w", stdout);
    std::vector<char*> argv{const_cast<char*>(testing::kBrigade)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(testing::kBrigade, argv.data());
    ::_exit(127);
  }
  return pid;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class CheckpointSafety : public ::testing::Test {
 protected:
  void SetUp() override { std::ofstream(config_) << testing::kTinyModelToml << kConfig; }
  std::string hash(const fs::path& path) {
    const auto r = run_brigade({"ckpt", "hash", path.string()});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }
  std::vector<std::string> train_args(const fs::path& run, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"train",          "--nproc", "2",
                                     config_.string(), "--set",   set_run_dir(run)};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  testing::TempDir dir_{"brigade_ckpt_safety"};
  fs::path config_ = dir_.path() / "config.toml";
};

// The issue's case: train to 30 with checkpoints every 10, roll back to 10
// with a lower learning rate (what one does after a loss spike), crash once
// the new branch has saved step 20, resume the run directory, train to 40.
TEST_F(CheckpointSafety, RollbackMovesTheAbandonedBranchAsideAndResumeContinuesTheNewOne) {
  const fs::path run = dir_.path() / "run";
  const fs::path root = run / "checkpoints";
  const auto first = run_brigade(train_args(run));
  ASSERT_EQ(first.status, 0) << first.err;
  const std::string old_thirty = hash(root / "step_00000030");
  // The reference: the same rollback, into a directory of its own.
  const fs::path tenth = dir_.path() / "step_00000010";
  fs::copy(root / "step_00000010", tenth);
  const std::vector<std::string> lower_lr = {"--set", "optim.lr=1e-3", "--set", "optim.min_lr=1e-3",
                                             "--set", "train.steps=40"};
  auto reference_args = train_args(dir_.path() / "reference", lower_lr);
  reference_args.insert(reference_args.end(), {"--resume", tenth.string()});
  const auto reference = run_brigade(reference_args);
  ASSERT_EQ(reference.status, 0) << reference.err;

  // The rollback, killed (launcher and workers) once its own step 20 is
  // committed: told apart from the old branch's by its learning rate.
  auto rollback_args = train_args(run, lower_lr);
  rollback_args.insert(rollback_args.end(), {"--set", "train.steps=1000", "--resume",
                                             (root / "step_00000010").string()});
  const fs::path err = dir_.path() / "rollback.err";
  const pid_t pid = spawn_brigade(rollback_args, err);
  const fs::path twentieth = root / "step_00000020" / "manifest.json";
  auto new_branch_saved_twenty = [&] {
    try {
      const auto manifest = nlohmann::json::parse(read_text(twentieth));
      return manifest.at("trainer_state").at("lr_schedule").at("lr").get<double>() < 2e-3;
    } catch (const std::exception&) {
      return false;  // not there yet, or being replaced
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!new_branch_saved_twenty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  ASSERT_TRUE(new_branch_saved_twenty()) << read_text(err);
  EXPECT_NE(read_text(err).find("moved the later checkpoints step_00000020, step_00000030"),
            std::string::npos)
      << read_text(err);

  // The old branch is kept whole, out of the way; the newest checkpoint of
  // the run is the new branch's.
  const fs::path abandoned = root / "abandoned" / "after_step_00000010";
  EXPECT_EQ(hash(abandoned / "step_00000030"), old_thirty);
  EXPECT_NO_THROW(verify_checkpoint(abandoned / "step_00000020"));
  EXPECT_EQ(latest_checkpoint(root)->filename(), "step_00000020");

  auto resume_args = train_args(run, lower_lr);
  resume_args.insert(resume_args.end(), {"--resume", run.string()});
  const auto resumed = run_brigade(resume_args);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(hash(root / "step_00000040"),
            hash(dir_.path() / "reference" / "checkpoints" / "step_00000040"));
}

// A tmpfs the test mounts, sized to hold the first checkpoint but not the
// second; unmounted when the test ends.
class SmallTmpfs {
 public:
  SmallTmpfs(const fs::path& where, int64_t bytes) : where_(where) {
    fs::create_directories(where_);
    const std::string options = fmt::format("size={}", bytes);
    mounted_ = ::mount("tmpfs", where_.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (mounted_) ::umount2(where_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  fs::path where_;
  bool mounted_ = false;
};

int64_t directory_bytes(const fs::path& dir) {
  int64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) bytes += static_cast<int64_t>(entry.file_size());
  }
  return bytes;
}

TEST_F(CheckpointSafety, ADiskThatFillsStopsEveryRankAndKeepsThePreviousCheckpoint) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root (CI runs as root)";
  // How big one checkpoint is, from a run on the normal disk.
  const fs::path probe = dir_.path() / "probe";
  const auto sized = run_brigade(train_args(probe, {"--set", "train.steps=10"}));
  ASSERT_EQ(sized.status, 0) << sized.err;
  const int64_t checkpoint_bytes = directory_bytes(probe / "checkpoints" / "step_00000010");

  const fs::path disk = dir_.path() / "disk";
  const SmallTmpfs tmpfs(disk, checkpoint_bytes * 3 / 2 + 64 * 1024);
  ASSERT_TRUE(tmpfs.mounted()) << "mount -t tmpfs failed: " << std::strerror(errno);
  const fs::path run = disk / "run";
  // A collective timeout far longer than the test allows: the failure must
  // arrive by the ranks' agreement, not by rank 0 timing out.
  const auto start = std::chrono::steady_clock::now();
  // No restarts: the failure itself is under test, not the recovery.
  const auto r = run_brigade(train_args(run, {"--set", "train.steps=1000", "--set",
                                              "parallel.timeout_s=600", "--max-restarts", "0"}),
                             std::chrono::seconds(120));
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.status, 0);
  EXPECT_LT(took_s, 60) << "the failed save was not noticed in time";
  EXPECT_NE(r.err.find("checkpoint of step 20 failed on rank"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step_00000020.partial/shard_0000"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step_00000010 is still the newest checkpoint"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  const fs::path root = run / "checkpoints";
  EXPECT_FALSE(fs::exists(root / "step_00000020.partial"));
  EXPECT_FALSE(fs::exists(root / "step_00000020"));
  ASSERT_EQ(latest_checkpoint(root)->filename(), "step_00000010");
  EXPECT_NO_THROW(verify_checkpoint(root / "step_00000010"));
}

TEST_F(CheckpointSafety, SigtermWithADeadPeerGivesUpTheSaveAndExitsWithTheSignal) {
  const fs::path run = dir_.path() / "run";
  const fs::path root = run / "checkpoints";
  // A save every step, so one is in flight when the peer dies.
  // No restarts: the launcher, once continued, must end rather than start
  // the workers again.
  const pid_t launcher =
      spawn_brigade(train_args(run, {"--set", "train.steps=100000", "--set",
                                     "train.checkpoint_every=1", "--max-restarts", "0"}),
                    dir_.path() / "launch.err");
  const pid_t rank0 = testing::wait_for_worker(launcher, 0, std::chrono::seconds(30));
  const pid_t rank1 = testing::wait_for_worker(launcher, 1, std::chrono::seconds(30));
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (latest_checkpoint(root).value_or("").filename() < "step_00000003" &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // The launcher holds still, so it neither reaps nor signals anyone; rank
  // 0 holds still while rank 1 dies and the SIGTERM waits for it.
  ::kill(launcher, SIGSTOP);
  ::kill(rank0, SIGSTOP);
  ::kill(rank1, SIGKILL);
  ::kill(rank0, SIGTERM);
  const auto resumed_at = std::chrono::steady_clock::now();
  ::kill(rank0, SIGCONT);
  // Rank 0 exits; its stopped parent leaves it a zombie whose exit status
  // /proc still shows.
  std::optional<std::vector<std::string>> stat;
  while ((stat = testing::proc_stat(rank0)) && (*stat)[0] != "Z" &&
         std::chrono::steady_clock::now() < resumed_at + std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - resumed_at).count();
  ASSERT_TRUE(stat && (*stat)[0] == "Z") << "rank 0 did not exit within 30 s of SIGTERM";
  const int wait_status = std::stoi(stat->at(49));
  ::kill(launcher, SIGCONT);
  ::waitpid(launcher, nullptr, 0);
  EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  // Inside the launcher's 5 s grace period (the work takes milliseconds).
  EXPECT_LT(took_s, 5.0);
  EXPECT_TRUE(WIFEXITED(wait_status)) << "rank 0 was killed, status " << wait_status;
  EXPECT_EQ(WEXITSTATUS(wait_status), 128 + SIGTERM);
  const std::string err = read_text(dir_.path() / "launch.err");
  EXPECT_NE(err.find("stopping on Terminated"), std::string::npos) << err;
  // The newest complete checkpoint verifies; no unfinished step is left.
  for (const auto& entry : fs::directory_iterator(root)) {
    EXPECT_NE(entry.path().extension(), ".partial") << entry.path();
  }
  const auto newest = latest_checkpoint(root);
  ASSERT_TRUE(newest.has_value());
  EXPECT_NO_THROW(verify_checkpoint(*newest));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
