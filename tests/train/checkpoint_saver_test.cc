// Checkpoint saves agreed on by a data-parallel group (forked ranks over the
// shm backend): a shard write that fails on one rank stops the save on every
// rank within seconds, however long rank 0 would otherwise wait for the
// missing shard; the error names the rank and its file; the step's
// .partial directory is gone and the previous checkpoint is still the
// newest good one. A failed write is made by giving rank 1 a checkpoint
// root it cannot create (under /proc), the way a full or broken disk fails.
// The same holds when the caller gathers the states (the training loop).
#include "brigade/train/checkpoint_saver.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "brigade/comm/shm_communicator.h"
#include "brigade/core/config.h"
#include "testing/forked_ranks.h"
#include "testing/shm_ranks.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::require;

// Rank 0 would wait this long for a missing shard without the agreement.
constexpr int64_t kCommitTimeoutMs = 120'000;
// How long the failure may take to reach every rank: seconds, with a margin
// for a loaded machine (it takes milliseconds).
constexpr double kFailureBoundMs = 15'000;

GptConfig tiny_model() {
  Config c = Config::from_string(
      "[model]\nn_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 8\nvocab_size = 32\n");
  return GptConfig::from_config(c);
}

// Rank r's half of each of the three flat buffers.
std::vector<CheckpointPiece> half(const std::vector<float>& data, int rank) {
  const auto size = static_cast<int64_t>(data.size());
  const int64_t begin = rank * size / 2, end = (rank + 1) * size / 2;
  std::vector<CheckpointPiece> pieces;
  for (StateKind kind : {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
    pieces.push_back({kind, begin, end, data.data() + begin});
  }
  return pieces;
}

// Rank `rank`'s save of `step` of two shards under `root`.
AsyncCheckpointWriter::Save save_of(const GptConfig& model, int64_t step, int rank,
                                    const fs::path& root) {
  AsyncCheckpointWriter::Save save;
  save.root = root;
  save.step = step;
  save.rank = rank;
  save.num_shards = 2;
  save.config = model;
  save.header = {{{"dp", 2}}, {{"step", step}}, "byte"};
  return save;
}

// kGathered: the training loop's way, the ranks' states gathered by the
// caller with its other per-step numbers (train/rank_stats.h) and passed
// to poll(states).
enum class Waiting { kPoll, kWait, kGathered };

void run_failing_save(Waiting how, const fs::path& dir) {
  const GptConfig model = tiny_model();
  const fs::path root = dir / "checkpoints";
  testing::run_shm_ranks(2, 0, /*shared=*/false, [&](Communicator& comm, float*) {
    const int rank = comm.rank();
    CheckpointSaver saver(&comm, kCommitTimeoutMs);
    const std::vector<float> state(static_cast<size_t>(ParamLayout(model).size()), 0.5f);
    const auto gathered_poll = [&] {
      const int32_t mine = saver.state();
      std::vector<int32_t> states(2, -1);
      comm.all_gather(&mine, states.data(), 1, DType::kI32)->wait();
      return saver.poll(states);
    };
    saver.start(save_of(model, 1, rank, root), half(state, rank));
    if (how == Waiting::kGathered) {
      // A save that succeeds completes on every rank, with its stats.
      std::optional<AsyncCheckpointWriter::Stats> done;
      for (int step = 0; step < 100'000 && !done; ++step) {
        done = gathered_poll();
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      require(done && done->step == 1, "rank {}: the save of step 1 never completed", rank);
      require(!saver.in_flight(), "rank {}: step 1 is still in flight", rank);
    } else {
      saver.wait();
    }
    // Step 2: rank 1 cannot write its shard.
    const fs::path unwritable = "/proc/brigade-no-such-dir/checkpoints";
    saver.start(save_of(model, 2, rank, rank == 1 ? unwritable : root), half(state, rank));
    const auto start = testing::Clock::now();
    std::string error;
    try {
      if (how == Waiting::kWait) {
        saver.wait();
      } else {
        for (int step = 0; step < 100'000; ++step) {
          if (how == Waiting::kGathered) {
            gathered_poll();
          } else {
            saver.poll();  // what each training step does
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    } catch (const Error& e) {
      error = e.what();
    }
    const double took_ms = testing::ms_since(start);
    require(!error.empty(), "rank {}: the failed save went unnoticed", rank);
    require(took_ms < kFailureBoundMs, "rank {}: the failure took {} ms to arrive", rank, took_ms);
    require(error.find("rank 1") != std::string::npos &&
                error.find("shard_00001.safetensors") != std::string::npos,
            "rank {}: the error does not name rank 1 and its file: {}", rank, error);
    if (rank == 0) {
      require(error.find("step_00000001 is still the newest") != std::string::npos,
              "rank 0: the error does not name the newest checkpoint: {}", error);
    } else {
      require(error.find("/proc/brigade-no-such-dir") != std::string::npos,
              "rank 1: its own error is not in the message: {}", error);
    }
    require(!saver.in_flight(), "rank {}: the save is still in flight", rank);
  });
  if (::testing::Test::HasFailure()) return;  // a rank failed: what it left on disk says nothing
  EXPECT_FALSE(fs::exists(root / "step_00000002.partial"));
  EXPECT_FALSE(fs::exists(root / "step_00000002"));
  ASSERT_EQ(latest_checkpoint(root)->filename(), "step_00000001");
  EXPECT_NO_THROW(verify_checkpoint(root / "step_00000001"));
}

TEST(CheckpointSaver, AFailedShardReachesEveryRankAtTheNextStep) {
  testing::TempDir dir("brigade_saver_poll");
  run_failing_save(Waiting::kPoll, dir.path());
}

TEST(CheckpointSaver, StatesGatheredByTheCallerCompleteASaveAndReportAFailedShard) {
  testing::TempDir dir("brigade_saver_gathered");
  run_failing_save(Waiting::kGathered, dir.path());
}

// A save that start()'s wait() completed is reported by the next poll, and
// the same poll settles the save in flight once every rank's part is done:
// left unsettled behind the report, every later start would settle it with
// gathers of its own (a snapshot every step: one late step and each later
// step paid for it).
TEST(CheckpointSaver, APollReportsTheWaitedSaveAndSettlesTheOneInFlight) {
  testing::TempDir dir("brigade_saver_queue");
  const GptConfig model = tiny_model();
  const fs::path root = dir.path() / "checkpoints";
  testing::run_shm_ranks(2, 0, /*shared=*/false, [&](Communicator& comm, float*) {
    const int rank = comm.rank();
    CheckpointSaver saver(&comm, kCommitTimeoutMs);
    const std::vector<float> state(static_cast<size_t>(ParamLayout(model).size()), 0.5f);
    auto start = [&](int64_t step) {
      saver.start(save_of(model, step, rank, root), half(state, rank));
    };
    const auto gather = [&] {
      const int32_t mine = saver.state();
      std::vector<int32_t> states(2, -1);
      comm.all_gather(&mine, states.data(), 1, DType::kI32)->wait();
      return states;
    };
    start(1);
    start(2);  // its wait() completes step 1
    const int32_t done = static_cast<int32_t>(AsyncCheckpointWriter::State::kDone);
    std::vector<int32_t> states = gather();
    for (int i = 0; i < 100'000 && (states[0] != done || states[1] != done); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      states = gather();
    }
    require(states[0] == done && states[1] == done, "rank {}: step 2 never finished", rank);
    const auto first = saver.poll(states);
    require(first && first->step == 1, "rank {}: the first poll did not report step 1", rank);
    require(!saver.in_flight(), "rank {}: step 2 was left unsettled behind step 1's report", rank);
    const auto second = saver.poll(gather());
    require(second && second->step == 2, "rank {}: the next poll did not report step 2", rank);
    require(!saver.poll(gather()), "rank {}: a save reported twice", rank);
  });
  if (HasFailure()) return;
  EXPECT_EQ(latest_checkpoint(root)->filename(), "step_00000002");
}

TEST(CheckpointSaver, AFailedShardEndsABlockingSaveOnEveryRank) {
  testing::TempDir dir("brigade_saver_wait");
  run_failing_save(Waiting::kWait, dir.path());
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
