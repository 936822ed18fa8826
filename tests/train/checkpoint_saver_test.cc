// Checkpoint saves agreed on by a data-parallel group (forked ranks over the
// shm backend): a shard write that fails on one rank stops the save on every
// rank within seconds, however long rank 0 would otherwise wait for the
// missing shard; the error names the rank and its file; the step's
// .partial directory is gone and the previous checkpoint is still the
// newest good one. A failed write is made by giving rank 1 a checkpoint
// root it cannot create (under /proc), the way a full or broken disk fails.
// The same holds when the caller gathers the states (the training loop).
// A save's start issues no collective once the previous save settled; a
// dead attempt's half-written step never mixes into a new save of it; a
// step directory that cannot be made fails the save like a failed shard;
// across nodes each node's committer clears its own area, and only its own.
#include "brigade/train/checkpoint_saver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "brigade/ckpt/node_part.h"
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

// A real communicator that counts the collectives issued through it.
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& group_name() const override { return inner_.group_name(); }
  int64_t timeout_ms() const override { return inner_.timeout_ms(); }
  std::shared_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override {
    ++ops;
    return inner_.all_reduce(data, count, dtype, op);
  }
  std::shared_ptr<Work> reduce_scatter(const void* input, void* output, int64_t count, DType dtype,
                                       ReduceOp op) override {
    ++ops;
    return inner_.reduce_scatter(input, output, count, dtype, op);
  }
  std::shared_ptr<Work> all_gather(const void* input, void* output, int64_t count,
                                   DType dtype) override {
    ++ops;
    return inner_.all_gather(input, output, count, dtype);
  }
  std::shared_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root) override {
    ++ops;
    return inner_.broadcast(data, count, dtype, root);
  }
  std::shared_ptr<Work> barrier() override {
    ++ops;
    return inner_.barrier();
  }
  std::shared_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override {
    ++ops;
    return inner_.send(data, count, dtype, peer, tag);
  }
  std::shared_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override {
    ++ops;
    return inner_.recv(data, count, dtype, peer, tag);
  }

  int ops = 0;

 private:
  Communicator& inner_;
};

// The training loop's way of settling a save: the states gathered (over
// `comm`, not the saver's group) until every rank's part is done, then
// poll(states). Returns the completed save's stats.
std::optional<AsyncCheckpointWriter::Stats> settle_by_gathers(Communicator& comm,
                                                              CheckpointSaver& saver) {
  const int32_t done = static_cast<int32_t>(AsyncCheckpointWriter::State::kDone);
  for (int i = 0; i < 100'000; ++i) {
    const int32_t mine = saver.state();
    std::vector<int32_t> states(static_cast<size_t>(comm.size()), -1);
    comm.all_gather(&mine, states.data(), 1, DType::kI32)->wait();
    if (std::all_of(states.begin(), states.end(), [&](int32_t s) { return s == done; })) {
      return saver.poll(states);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::nullopt;
}

// Between two steps the loop's gather is the only collective: a save that
// starts once the previous one settled (a snapshot every step, the usual
// case) issues none, not even to prepare its directory. The first save of a
// saver pays one, clearing what earlier processes left.
TEST(CheckpointSaver, ASaveStartIssuesNoCollectiveOnceThePreviousSettled) {
  testing::TempDir dir("brigade_saver_no_collective");
  const GptConfig model = tiny_model();
  const fs::path root = dir.path() / "checkpoints";
  testing::run_shm_ranks(2, 0, /*shared=*/false, [&](Communicator& comm, float*) {
    const int rank = comm.rank();
    CountingCommunicator counted(comm);
    CheckpointSaver saver(&counted, kCommitTimeoutMs);
    const std::vector<float> state(static_cast<size_t>(ParamLayout(model).size()), 0.5f);
    int before = counted.ops;
    saver.start(save_of(model, 1, rank, root), half(state, rank));
    require(counted.ops - before == 1, "rank {}: the first save issued {} collectives, not 1", rank,
            counted.ops - before);
    for (int64_t step = 1; step <= 3; ++step) {
      const auto done = settle_by_gathers(comm, saver);
      require(done && done->step == step, "rank {}: the save of step {} never completed", rank,
              step);
      if (step == 3) break;
      before = counted.ops;
      saver.start(save_of(model, step + 1, rank, root), half(state, rank));
      require(counted.ops == before, "rank {}: the save of step {} issued {} collectives to start",
              rank, step + 1, counted.ops - before);
    }
  });
  if (HasFailure()) return;
  ASSERT_EQ(latest_checkpoint(root)->filename(), "step_00000003");
  EXPECT_NO_THROW(verify_checkpoint(root / "step_00000003"));
}

// A generation that died while writing step 1 left step_00000001.partial
// behind: its rank 1's shard of other values, and the shard of a rank the
// new generation does not have. The new generation's first save of step 1
// must commit its own shards only, however early rank 0 looks for rank 1's.
TEST(CheckpointSaver, ADeadAttemptsShardsNeverEndUpInTheCommittedStep) {
  testing::TempDir dir("brigade_saver_stale_partial");
  const GptConfig model = tiny_model();
  const fs::path root = dir.path() / "checkpoints";
  const auto size = static_cast<size_t>(ParamLayout(model).size());
  {
    const std::vector<float> stale(size, 9.0f);
    fs::create_directories(root / "step_00000001.partial");
    std::vector<CheckpointPiece> all;
    for (StateKind kind : {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
      all.push_back({kind, 0, static_cast<int64_t>(size), stale.data()});
    }
    write_checkpoint_shard(root, 1, 1, model, half(stale, 1));
    write_checkpoint_shard(root, 1, 2, model, all);
  }
  testing::run_shm_ranks(2, 0, /*shared=*/false, [&](Communicator& comm, float*) {
    const int rank = comm.rank();
    CheckpointSaver saver(&comm, kCommitTimeoutMs);
    const std::vector<float> state(size, 0.5f);
    saver.start(save_of(model, 1, rank, root), half(state, rank));
    saver.wait();
  });
  if (HasFailure()) return;
  const fs::path step = root / "step_00000001";
  const Manifest manifest = verify_checkpoint(step);
  std::set<std::string> listed = {"manifest.json"};
  for (const ShardRecord& shard : manifest.shards) listed.insert(shard.file);
  for (const auto& entry : fs::directory_iterator(step)) {
    EXPECT_TRUE(listed.count(entry.path().filename().string()))
        << entry.path() << " is in the committed step but no shard of this save";
  }
  std::vector<float> params(size);
  load_checkpoint_state(step, manifest, model, StateKind::kParams, params.data());
  EXPECT_EQ(std::count(params.begin(), params.end(), 0.5f), static_cast<int64_t>(size))
      << "the committed step holds values the dead attempt wrote";
}

// The step's directory cannot be made (a file where it should be: a full
// disk or permissions fail the same way): the save fails on every rank at
// the same gather, as a shard that cannot be written does, its error
// naming the directory; nothing is committed, and the next save goes on.
TEST(CheckpointSaver, ADirectoryThatCannotBeMadeFailsTheSaveOnEveryRankAtOneStep) {
  testing::TempDir dir("brigade_saver_unpreparable");
  const GptConfig model = tiny_model();
  const fs::path root = dir.path() / "checkpoints";
  const fs::path blocked = root / "step_00000002.partial";
  testing::run_shm_ranks(2, 0, /*shared=*/false, [&](Communicator& comm, float*) {
    const int rank = comm.rank();
    CheckpointSaver saver(&comm, kCommitTimeoutMs);
    const std::vector<float> state(static_cast<size_t>(ParamLayout(model).size()), 0.5f);
    saver.start(save_of(model, 1, rank, root), half(state, rank));
    const auto first = settle_by_gathers(comm, saver);
    require(first && first->step == 1, "rank {}: the save of step 1 never completed", rank);
    if (rank == 0) std::ofstream(blocked) << "in the way\n";
    comm.barrier()->wait();
    saver.start(save_of(model, 2, rank, root), half(state, rank));
    std::string error;
    int64_t failed_at = -1;
    for (int64_t step = 0; step < 100'000 && error.empty(); ++step) {
      const int32_t mine = saver.state();
      std::vector<int32_t> states(2, -1);
      comm.all_gather(&mine, states.data(), 1, DType::kI32)->wait();
      try {
        saver.poll(states);
      } catch (const Error& e) {
        error = e.what();
        failed_at = step;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    require(!error.empty(), "rank {}: the save that could not start went unnoticed", rank);
    std::vector<int64_t> when(2, -2);
    comm.all_gather(&failed_at, when.data(), 1, DType::kI64)->wait();
    require(when[0] == when[1], "rank {}: the ranks failed at different gathers: {} and {}", rank,
            when[0], when[1]);
    require(error.find("checkpoint of step 2 failed") != std::string::npos &&
                error.find(blocked.string()) != std::string::npos,
            "rank {}: the error does not name the step and its directory: {}", rank, error);
    // A rank among the failed ones says why in its own error; one whose part
    // had not failed yet when the gather showed another's (either rank may
    // reach the directory first) names the other's file only.
    const bool own_part_listed = error.find(fmt::format("rank {} (", rank)) != std::string::npos;
    require(!own_part_listed ||
                error.find("cannot create the checkpoint directory") != std::string::npos,
            "rank {}: its own part failed but the error does not say the directory could not be "
            "made: {}",
            rank, error);
    require(!saver.in_flight(), "rank {}: the failed save is still in flight", rank);
    // Training that goes on (a snapshot's failure stops snapshots only):
    // the next save commits.
    saver.start(save_of(model, 3, rank, root), half(state, rank));
    const auto third = settle_by_gathers(comm, saver);
    require(third && third->step == 3, "rank {}: the save after the failed one never completed",
            rank);
  });
  if (HasFailure()) return;
  EXPECT_FALSE(fs::exists(root / "step_00000002"));
  EXPECT_FALSE(fs::exists(blocked));
  ASSERT_EQ(latest_checkpoint(root)->filename(), "step_00000003");
  EXPECT_NO_THROW(verify_checkpoint(root / "step_00000003"));
}

// Snapshots across nodes: each node writes its part into its own area (its
// agent's memory), so the leftovers an earlier generation left there are
// cleared by that node's committer (its lowest rank), not by rank 0, before
// any rank of the job writes; what is not a save's stays, and each node
// commits its own part.
TEST(CheckpointSaver, EachNodesCommitterClearsItsOwnAreaBeforeTheFirstSave) {
  testing::TempDir dir("brigade_saver_node_areas");
  const GptConfig model = tiny_model();
  const std::vector<fs::path> areas = {dir.path() / "node0", dir.path() / "node1"};
  for (const fs::path& area : areas) {
    for (const char* left :
         {"step_00000006.partial", "step_00000004.old", "step_00000003.pruned", "notes"}) {
      fs::create_directories(area / left);
      std::ofstream(area / left / "shard_00003.safetensors") << "stale";
    }
  }
  testing::run_shm_ranks(4, 0, /*shared=*/false, [&](Communicator& comm, float*) {
    const int rank = comm.rank(), node = rank / 2;
    CheckpointSaver saver(&comm, kCommitTimeoutMs);
    const std::vector<float> state(static_cast<size_t>(ParamLayout(model).size()), 0.5f);
    AsyncCheckpointWriter::Save save = save_of(model, 1, rank, areas[static_cast<size_t>(node)]);
    save.num_shards = 4;
    NodePart part;
    part.step = 1;
    part.node = node;
    part.first_rank = 2 * node;
    part.ranks = 2;
    part.num_shards = 4;
    part.config = model;
    if (node == 0) part.header = save.header;
    save.part = part;
    // Rank r's quarter of each flat buffer.
    const auto size = static_cast<int64_t>(state.size());
    std::vector<CheckpointPiece> pieces;
    for (StateKind kind : {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
      pieces.push_back(
          {kind, rank * size / 4, (rank + 1) * size / 4, state.data() + rank * size / 4});
    }
    saver.start(save, pieces);
    saver.wait();
  });
  if (HasFailure()) return;
  for (const fs::path& area : areas) {
    std::vector<std::string> kept;
    for (const auto& e : fs::directory_iterator(area)) kept.push_back(e.path().filename());
    std::sort(kept.begin(), kept.end());
    EXPECT_EQ(kept, (std::vector<std::string>{"notes", "step_00000001.part"})) << area;
    EXPECT_NO_THROW(read_node_part(area / "step_00000001.part")) << area;
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
