// Silent data corruption and non-finite losses end to end, through the real
// binary on the tiny model:
//   - a bit flipped in one rank's parameters (--inject sdc) is caught by the
//     replicas' comparison (train/silent_corruption.h) at the next save or
//     check, the launcher's one incident line names that rank, its node and
//     the step, the evidence holds the ranks' reports, and the job rolls
//     back to a snapshot taken before the flip: its final parameters are bit
//     for bit a fault-free run's (`brigade ckpt hash`);
//   - under ZeRO 3, a flip in a rank's own slices is caught by their hash
//     against the one taken after its update;
//   - a flip in one rank's local gradient before the reduce is caught by a
//     check step's replay of its peer's micro-batches, and its rank named
//     (settled by a third rank where there is one); a flip in a rank's
//     parameters found in such a step names that rank only;
//   - a clean run that checks after every step raises no alarm, and ends
//     bit for bit where a run without checks does;
//   - a NaN loss re-runs the step: once (a passing fault) training goes on
//     with the same result as a clean run; twice (as bad data would) it
//     stops, naming the data window and the fix.
// sdc_slow_test.cc runs the 1,000-step clean run.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::read_failures;
using testing::run_brigade;

// A snapshot every step, and a replica check only every 1000: the flip is
// caught at its own step only because the check runs before every save.
constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 8
seed = 5
snapshot_every = 1
[optim]
lr = 3e-3
min_lr = 3e-3
[data]
synthetic = true
[parallel]
timeout_s = 20
bucket_mb = 0.01
[diag]
sdc_every = 1000
)";

class SilentCorruption : public ::testing::Test {
 protected:
  fs::path config() {
    const fs::path path = dir_.path() / "config.toml";
    if (!fs::exists(path)) std::ofstream(path) << testing::kTinyModelToml << kTraining;
    return path;
  }
  testing::Output train(const std::string& run, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train", config().string(), "--set",
                                     "train.run_dir=\"" + (dir_.path() / run).string() + "\""};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_brigade(args, std::chrono::seconds(120));
  }
  std::string hash(const std::string& run) {
    const auto r = run_brigade({"ckpt", "hash", (dir_.path() / run).string()});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }
  void TearDown() override {
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }
  testing::TempDir dir_{"brigade_sdc"};
};

// Returns the incident line (without "brigade launch: "). `named`: how the
// line starts when it names several ranks ("ranks 1 (node 0) and 3").
// `step`: the steps done when the check failed; `rollback`: the snapshot's
// or checkpoint's step the job must resume from (-1: step - 1's snapshot).
// `finding`: words the line must hold instead of a replicas' comparison's.
std::string expect_sdc_incident(const testing::Output& r, const fs::path& run, int rank, int step,
                                const std::string& named = "", int rollback = -1,
                                const std::string& from = "the in-memory snapshot",
                                const std::string& finding = "") {
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string head =
      "brigade launch: incident 1: " + (named.empty() ? "rank " + std::to_string(rank) : named) +
      " (node 0): silent data corruption after step " + std::to_string(step) + ":";
  const size_t at = r.err.find(head);
  EXPECT_NE(at, std::string::npos) << r.err;
  if (at == std::string::npos) return "";
  const std::string line = r.err.substr(at + 16, r.err.find('\n', at) - at - 16);
  EXPECT_NE(
      line.find(!finding.empty() ? finding
                                 : (named.empty() ? "differ from those of the" : "no majority")),
      std::string::npos)
      << line;
  EXPECT_EQ(r.err.find("brigade launch: incident", at + 1), std::string::npos) << r.err;
  const auto failures = read_failures(run / "incidents.jsonl");
  EXPECT_FALSE(failures.empty());
  if (!failures.empty()) {
    EXPECT_EQ(failures.front().at("cause"), line) << failures.front();
  }
  EXPECT_TRUE(
      fs::exists(run / "incidents" / "1" /
                 ("sdc_rank" + std::to_string(rank) + "_step" + std::to_string(step) + ".json")));
  EXPECT_FALSE(fs::exists(
      run / ("sdc_rank" + std::to_string(rank) + "_step" + std::to_string(step) + ".json")))
      << "moved into the evidence";
  // Rolled back to the save before the corruption, not one that read it.
  const std::string resumed =
      "from " + from + " of step " + std::to_string(rollback < 0 ? step - 1 : rollback);
  EXPECT_NE(r.err.find(resumed), std::string::npos) << resumed << "\n" << r.err;
  return line;
}

// A flip after step 3's update: the snapshot of step 3 reads it, the check
// before step 4's update catches it, and that snapshot is never committed.
// Fixed cases: the first rank early, and the last rank after the last step,
// where the check before the final save finds it.
TEST_F(SilentCorruption, TheFlippedRankIsNamedAndTheRollbackEndsBitIdentical) {
  // The fault-free run checks before every update: no false alarm either.
  const auto clean = train("clean", {"--nproc", "4", "--set", "diag.sdc_every=1"});
  ASSERT_EQ(clean.status, 0) << clean.err;
  EXPECT_EQ(clean.err.find("silent data corruption"), std::string::npos) << clean.err;
  // And rank 1's flip found in a check step that replays the gradients
  // (sdc_every 1): the parameters are compared before the replay, which
  // alone would blame rank 1's replayer as well.
  for (const auto& [rank, step, every] :
       {std::tuple{0, 3, "1000"}, std::tuple{3, 8, "1000"}, std::tuple{1, 3, "1"}}) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " step " + std::to_string(step));
    const std::string run = "run" + std::to_string(rank);
    const auto r =
        train(run, {"--nproc", "4", "--set", std::string("diag.sdc_every=") + every, "--inject",
                    "sdc:rank=" + std::to_string(rank) + ":step=" + std::to_string(step)});
    expect_sdc_incident(r, dir_.path() / run, rank, step);
    EXPECT_EQ(hash(run), hash("clean"));
  }
}

// A flip at the start of step 4's forward, while the snapshot of step 3 may
// be reading it: found before step 4's update (the state after step 3 is
// what differs), and the job resumes from the snapshot of step 2, never
// from the one read during the corrupted step.
TEST_F(SilentCorruption, AFlipDuringTheForwardNeverReachesTheRollback) {
  const auto clean = train("clean", {"--nproc", "2"});
  ASSERT_EQ(clean.status, 0) << clean.err;
  const auto r = train("run", {"--nproc", "2", "--inject", "sdc:rank=1:step=4:when=forward"});
  expect_sdc_incident(r, dir_.path() / "run", 1, 3, "ranks 0 (node 0) and 1", 2);
  EXPECT_NE(r.err.find("at the start of step 4"), std::string::npos) << r.err;
  EXPECT_EQ(hash("run"), hash("clean"));
}

// Without snapshots, a checkpoint's step is checked in the next step before
// the checkpoint commits: a flip after step 3 is found after step 4 (the
// checkpoint every 2 steps), and the job resumes from step 2's checkpoint.
TEST_F(SilentCorruption, ACheckpointIsCheckedBeforeItCommits) {
  // ZeRO 0: under ZeRO 1/2 the next update's gather would spread a flip in
  // an owned slice to every replica before a check due only at step 4.
  const std::vector<std::string> common = {
      "--nproc", "3", "--set", "train.snapshot_every=0", "--set", "train.checkpoint_every=2"};
  const auto clean = train("clean", common);
  ASSERT_EQ(clean.status, 0) << clean.err;
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--inject", "sdc:rank=2:step=3"});
  const auto r = train("run", args);
  expect_sdc_incident(r, dir_.path() / "run", 2, 4, "", 2, "the checkpoint");
  EXPECT_EQ(hash("run"), hash("clean"));
}

// ZeRO 2 gathers the updated slices into every rank's whole buffer, which
// is what the ranks compare; three replicas still have a majority. Step 4
// replays the gradients (sdc_every 3): rank 1's flipped parameters make
// both its own gradient and its replay of rank 2's differ, but the
// parameters are compared first, and only rank 1 is named.
TEST_F(SilentCorruption, UnderZero2TheGatheredBufferIsCompared) {
  const std::vector<std::string> args = {"--nproc",         "3",     "--set",
                                         "parallel.zero=2", "--set", "diag.sdc_every=3"};
  const auto clean = train("clean", args);
  ASSERT_EQ(clean.status, 0) << clean.err;
  std::vector<std::string> faulty = args;
  faulty.insert(faulty.end(), {"--inject", "sdc:rank=1:step=3"});
  const auto r = train("run", faulty);
  expect_sdc_incident(r, dir_.path() / "run", 1, 3);
  EXPECT_EQ(hash("run"), hash("clean"));
}

// dp 2 x tp 2: two replicas per group have no majority, so both ranks of
// the group are named; the other group's ranks stop at the same step.
TEST_F(SilentCorruption, UnderTensorParallelismBothReplicasAreNamedAndEveryGroupStops) {
  const auto clean = train("clean", {"--nproc", "4", "--set", "parallel.tp=2"});
  ASSERT_EQ(clean.status, 0) << clean.err;
  EXPECT_NE(clean.err.find("no gradient replay with tensor or pipeline parallelism"),
            std::string::npos)
      << clean.err;
  const auto r =
      train("run", {"--nproc", "4", "--set", "parallel.tp=2", "--inject", "sdc:rank=1:step=3"});
  expect_sdc_incident(r, dir_.path() / "run", 1, 3, "ranks 1 (node 0) and 3");
  EXPECT_NE(r.err.find("after step 3: another data-parallel group's replicas hold different"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(hash("run"), hash("clean"));
}

// Ten steps checked before every update, their gradients replayed in
// every step, under each ZeRO stage, on three ranks (sdc_slow_test.cc runs
// 1,000): the recomputations are bit-identical, the slices unchanged
// between update and check. And the checks leave training as it was: the
// final parameters are bit for bit those of a run without checks (three
// ranks, so that a rank reducing its peer's gradient instead of its own
// would sum the same gradients in another order).
TEST_F(SilentCorruption, ACleanRunCheckedEveryStepRaisesNoAlarm) {
  for (const std::string zero : {"0", "1", "2", "3"}) {
    SCOPED_TRACE("ZeRO " + zero);
    const auto run_with = [&](const std::string& run, const std::string& every) {
      return train(run,
                   {"--nproc", "3", "--set", "train.steps=10", "--set", "train.snapshot_every=0",
                    "--set", "diag.sdc_every=" + every, "--set", "parallel.zero=" + zero});
    };
    const auto r = run_with("zero" + zero, "1");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("0 incidents"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("silent data corruption"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("no gradient replay"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("gradient replay off"), std::string::npos) << r.err;
    if (zero == "0" || zero == "3") {
      const auto unchecked = run_with("unchecked" + zero, "0");
      ASSERT_EQ(unchecked.status, 0) << unchecked.err;
      EXPECT_EQ(hash("zero" + zero), hash("unchecked" + zero));
    }
  }
}

// ZeRO 3 holds each slice once: a flip in one after its update (at rest),
// or at the start of the next forward (which gathers it to every rank), is
// caught by the rank's own hash of its slices, taken after the update, and
// the rank is named; the job resumes from the snapshot before.
TEST_F(SilentCorruption, UnderZero3ARanksOwnSlicesAreCheckedAgainstThemselves) {
  const std::vector<std::string> zero3 = {"--nproc", "2", "--set", "parallel.zero=3"};
  const auto clean = train("clean", zero3);
  ASSERT_EQ(clean.status, 0) << clean.err;
  const struct {
    const char* fault;
    int rank, step;
  } cases[] = {{"sdc:rank=1:step=3", 1, 3},
               {"sdc:rank=0:step=4:when=forward", 0, 3},
               {"sdc:rank=1:step=5:what=moment", 1, 5}};
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fault);
    const std::string run = "run" + std::to_string(n++);
    std::vector<std::string> args = zero3;
    args.insert(args.end(), {"--inject", c.fault});
    const auto r = train(run, args);
    expect_sdc_incident(r, dir_.path() / run, c.rank, c.step, "", -1, "the in-memory snapshot",
                        "its own parameter and Adam moment slices (ZeRO 3: held by no other "
                        "rank) changed after the update of step " +
                            std::to_string(c.step));
    EXPECT_EQ(hash(run), hash("clean"));
  }
}

// A bit flipped in one rank's local gradient before the reduce enters every
// rank's sum, so the replicas agree on the wrong update. The check step's
// replay (rank r recomputes rank r + 1's micro-batches) finds the gradient
// that differs, a third computation names its rank, and the job
// resumes from before the step: the final parameters are a fault-free
// run's. ZeRO 0 (all-reduce) and 3 (reduce-scatter, the replay's forward
// gathering again); sdc_slow_test.cc runs ZeRO 1 and 2.
TEST_F(SilentCorruption, AFlipInALocalGradientIsFoundByTheReplayAndItsRankNamed) {
  // ZeRO 0 on three ranks: rank 2, on neither side, settles rank 1's
  // dispute with rank 0; ZeRO 3 on two: rank 1 recomputes its own.
  for (const auto& [zero, nproc] : {std::pair{"0", "3"}, std::pair{"3", "2"}}) {
    SCOPED_TRACE(std::string("ZeRO ") + zero);
    const std::string run = std::string("zero") + zero;
    const std::vector<std::string> args = {"--nproc", nproc,
                                           "--set",   std::string("parallel.zero=") + zero,
                                           "--set",   "diag.sdc_every=3"};
    const auto clean = train(run + "clean", args);
    ASSERT_EQ(clean.status, 0) << clean.err;
    std::vector<std::string> faulty = args;
    // Step 4 is the check step after step 3, the 3rd.
    faulty.insert(faulty.end(), {"--inject", "sdc:rank=1:step=4:what=grad"});
    const auto r = train(run, faulty);
    EXPECT_NE(r.err.find("before the reduce"), std::string::npos) << r.err;
    const std::string line =
        expect_sdc_incident(r, dir_.path() / run, 1, 3, "", -1, "the in-memory snapshot",
                            "rank 1's local gradient of step 4 (before the reduce)");
    EXPECT_NE(line.find("rank 1's own computation was off"), std::string::npos) << line;
    const std::string settler = std::string(nproc) == "3" ? "2" : "1";
    EXPECT_NE(line.find("rank " + settler + "'s recomputation"), std::string::npos) << line;
    EXPECT_EQ(hash(run), hash(run + "clean"));
  }
}

// Without data parallelism there is no reduce to corrupt nor a replay to
// catch it: the fault is refused with the fix, not silently ignored.
TEST_F(SilentCorruption, AGradientFlipWithoutDataParallelismIsRefused) {
  const auto r = train("run", {"--inject", "sdc:rank=0:step=2:what=grad"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("this run has no data-parallel group"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("more data-parallel ranks (--nproc)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_.path() / "run" / "checkpoints" / "step_00000008")) << r.err;
}

// Under ZeRO 0 the Adam moments are replicas too: a flip in one, which
// leaves the parameters alike until the next update, is found before that
// update, and the job resumes from the snapshot before it.
TEST_F(SilentCorruption, UnderZero0TheMomentsAreComparedToo) {
  const auto clean = train("clean", {"--nproc", "3"});
  ASSERT_EQ(clean.status, 0) << clean.err;
  const auto r = train("run", {"--nproc", "3", "--inject", "sdc:rank=1:step=2:what=moment"});
  expect_sdc_incident(r, dir_.path() / "run", 1, 2);
  EXPECT_NE(r.err.find("parameters and Adam moments"), std::string::npos) << r.err;
  EXPECT_EQ(hash("run"), hash("clean"));
}

// Alone, under ZeRO 2 on two ranks (only rank 1's loss is NaN) and on a
// tensor-parallel pair: every rank re-runs, and the result is a clean run's.
TEST_F(SilentCorruption, APassingNanLossIsReRunAndTrainingGoesOnIdentically) {
  const std::vector<std::vector<std::string>> layouts = {
      {}, {"--nproc", "2", "--set", "parallel.zero=2"}, {"--nproc", "2", "--set", "parallel.tp=2"}};
  int n = 0;
  for (std::vector<std::string> args : layouts) {
    SCOPED_TRACE(::testing::PrintToString(args));
    const std::string run = "layout" + std::to_string(n++);
    args.insert(args.end(), {"--set", "train.snapshot_every=0"});
    const auto clean = train(run + "clean", args);
    ASSERT_EQ(clean.status, 0) << clean.err;
    args.insert(args.end(),
                {"--inject",
                 args.empty() || args[0] != "--nproc" ? "nan:rank=0:step=3" : "nan:rank=1:step=3"});
    const auto r = train(run, args);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("step 3: a NaN or infinite loss or gradient norm"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("re-ran the step on the same batch"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("brigade launch: incident"), std::string::npos) << r.err;
    EXPECT_EQ(hash(run), hash(run + "clean"));
  }
}

TEST_F(SilentCorruption, ANanLossThatRepeatsStopsNamingTheDataWindow) {
  const fs::path text = dir_.path() / "text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 400; ++i)
      out << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const fs::path data = dir_.path() / "data";
  const auto prepared = run_brigade(
      {"data", "prepare", text.string(), "--tokenizer", "byte", "--out", data.string()});
  ASSERT_EQ(prepared.status, 0) << prepared.err;
  // Two data-parallel ranks: only rank 1's samples gave the NaN.
  const auto r =
      train("run", {"--nproc", "2", "--max-restarts", "0", "--set", "model.vocab_size=256", "--set",
                    "data.synthetic=false", "--set", "data.dir=\"" + data.string() + "\"", "--set",
                    "train.snapshot_every=0", "--inject", "nan:rank=1:step=3:times=2"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("step 3: the loss is nan"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("again after re-running the step on the same batch"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("samples [2, 4) of the step's global batch (dp rank 1)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("(dp rank 0)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find((data / "train").string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens ["), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("skip the window"), std::string::npos) << r.err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
