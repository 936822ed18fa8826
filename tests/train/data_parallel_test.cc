// Data parallelism and ZeRO against a single process: dp ranks (forked
// processes over the shm backend) training on one global batch must give the
// same losses at every step and the same final parameters as one process
// running that whole batch through gradient accumulation. The parameters are
// compared as the checkpoint the dp run saves, loaded by one process: that
// covers gathering sharded state for a save. What a rank holds is measured
// (resident pages of its flat buffers, ZeRO 3's peak of gathered parameters)
// and must follow the ZeRO stage.
//
// Every run, the reference too, happens in a forked child: OpenMP's thread
// pool does not survive a fork, so the parent never trains itself.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "brigade/comm/shm_communicator.h"
#include "brigade/core/config.h"
#include "brigade/core/pages.h"
#include "brigade/train/trainer.h"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"
#include "train/mesh_training.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr int kSteps = 20;
constexpr int64_t kMicroBatch = 2;
constexpr int64_t kGradAccum = 2;

GptConfig small_model(int n_layer, int n_embd) {
  Config c = Config::from_string(R"(
    [model]
    n_head = 2
    block_size = 16
    vocab_size = 67
  )");
  c.set(fmt::format("model.n_layer={}", n_layer));
  c.set(fmt::format("model.n_embd={}", n_embd));
  return GptConfig::from_config(c);
}

// A flat buffer of 16,624 floats, which divides by none of 3, 32 or 64: every
// shard boundary lands inside a tensor, and the last bucket is padded.
GptConfig tiny_model() {
  return small_model(2, 24);
}

TrainOptions options_for(int dp, int zero, int64_t grad_accum, const fs::path& run_dir) {
  TrainOptions o = testing::short_run(kMicroBatch, grad_accum, kSteps, /*warmup_steps=*/3,
                                      /*seed=*/11, run_dir);
  o.parallel.dp = dp;
  o.parallel.zero = zero;
  return o;
}

// What a run leaves behind for the parent to compare.
struct RunResult {
  std::vector<double> losses;
  std::vector<float> params;
  MemoryAccount memory;
};

void write_result(const fs::path& path, const std::vector<double>& losses,
                  const FloatBuffer& params, const MemoryAccount& memory) {
  std::ofstream out(path, std::ios::binary);
  const int64_t n = params.size();
  out.write(reinterpret_cast<const char*>(losses.data()), sizeof(double) * losses.size());
  out.write(reinterpret_cast<const char*>(&memory), sizeof(memory));
  out.write(reinterpret_cast<const char*>(&n), sizeof(n));
  out.write(reinterpret_cast<const char*>(params.data()), sizeof(float) * n);
}

RunResult read_result(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "no result at " << path;
  RunResult r;
  r.losses.resize(kSteps);
  in.read(reinterpret_cast<char*>(r.losses.data()), sizeof(double) * kSteps);
  in.read(reinterpret_cast<char*>(&r.memory), sizeof(r.memory));
  int64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), sizeof(n));
  r.params.resize(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(r.params.data()), sizeof(float) * n);
  return r;
}

// Trains kSteps with dp forked ranks (dp 1: one process, no communicator)
// and writes each rank's result to dir/rank<r>.bin.
void train_forked(int dp, int zero, int64_t grad_accum, const fs::path& dir) {
  const GptConfig model = tiny_model();
  const std::string segment =
      fmt::format("/brigade-dp-test-{}-{}", ::getpid(), dir.filename().string());
  const auto pids = testing::fork_ranks(dp, [&](int rank) {
    std::unique_ptr<ShmCommunicator> comm;
    if (dp > 1) {
      ShmCommunicatorOptions shm;
      shm.segment_name = segment;
      shm.group_name = "dp";
      shm.rank = rank;
      shm.size = dp;
      shm.timeout_ms = 20000;
      shm.shared_bytes = shared_bytes_for_training(model);
      comm = std::make_unique<ShmCommunicator>(shm);
    }
    Trainer trainer(model, options_for(dp, zero, grad_accum, dir / "run"), comm.get());
    std::vector<double> losses;
    for (int s = 0; s < kSteps; ++s) losses.push_back(trainer.train_step().loss);
    // The whole model, as a checkpoint sees it (ZeRO 3 gathers it for that).
    const fs::path saved = trainer.save_checkpoint();
    if (rank == 0) {
      TrainOptions alone = options_for(1, 0, grad_accum * dp, dir / "resumed");
      alone.resume = saved.string();
      Trainer resumed(model, alone);
      write_result(dir / "rank0.bin", losses, resumed.params(), trainer.memory());
    }
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(120));
  for (size_t r = 0; r < codes.size(); ++r) ASSERT_EQ(codes[r], 0) << "rank " << r;
}

void expect_same_training(const RunResult& reference, const RunResult& run,
                          const std::string& what) {
  ASSERT_EQ(run.losses.size(), reference.losses.size());
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_LE(std::abs(run.losses[s] - reference.losses[s]), 1e-5 * std::abs(reference.losses[s]))
        << what << ": step " << s << " loss " << run.losses[s] << " vs " << reference.losses[s];
  }
  float largest = 0;
  for (float p : reference.params) largest = std::max(largest, std::abs(p));
  const size_t n = std::min(reference.params.size(), run.params.size());
  float worst = 0;
  for (size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(run.params[i] - reference.params[i]));
  EXPECT_LE(worst, 1e-5f * largest) << what << ": largest parameter difference";
}

class DataParallelTest : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  testing::TempDir temp_{"brigade_dp_test"};
};

TEST_P(DataParallelTest, MatchesOneProcessOnTheSameGlobalBatch) {
  const auto [dp, zero] = GetParam();
  const fs::path reference_dir = temp_.path() / "reference";
  const fs::path dp_dir = temp_.path() / "dp";
  fs::create_directories(reference_dir);
  fs::create_directories(dp_dir);
  // One process runs all dp * accum micro-batches of each global batch.
  train_forked(1, 0, kGradAccum * dp, reference_dir);
  train_forked(dp, zero, kGradAccum, dp_dir);
  const RunResult reference = read_result(reference_dir / "rank0.bin");
  const std::string what = fmt::format("dp {} zero {}", dp, zero);
  expect_same_training(reference, read_result(dp_dir / "rank0.bin"), what);
  // AdamW's moments, 8 bytes per parameter, divided by dp from stage 1 (the
  // optimizer allocates exactly what memory() reports). The parameters and
  // gradients are measured by ZeroResidentMemoryTest below.
  const RunResult rank0 = read_result(dp_dir / "rank0.bin");
  const double n = static_cast<double>(tiny_model().num_params());
  const double expected_optimizer = 8 * n / (zero >= 1 ? dp : 1);
  EXPECT_NEAR(rank0.memory.optimizer, expected_optimizer, 0.05 * expected_optimizer) << what;
}

INSTANTIATE_TEST_SUITE_P(DpTimesZero, DataParallelTest,
                         ::testing::Values(std::make_tuple(2, 0), std::make_tuple(4, 0),
                                           std::make_tuple(2, 1), std::make_tuple(4, 1),
                                           std::make_tuple(3, 1), std::make_tuple(2, 2),
                                           std::make_tuple(4, 2), std::make_tuple(2, 3),
                                           std::make_tuple(4, 3), std::make_tuple(3, 3)),
                         [](const auto& info) {
                           return fmt::format("dp{}_zero{}", std::get<0>(info.param),
                                              std::get<1>(info.param));
                         });

// Six blocks of 50k floats (200 KB, 49 pages each), so page rounding is
// small next to what ZeRO saves, and ZeRO 3's few gathered blocks are well
// below the whole model.
GptConfig six_block_model() {
  return small_model(6, 64);
}

// What ZeRO leaves in memory, measured (resident_bytes: mincore) after two
// steps, with the flat buffers in the shm segment (released with
// MADV_REMOVE) or on the heap (MADV_DONTNEED). Every rank checks itself.
class ZeroResidentMemoryTest : public ::testing::TestWithParam<std::tuple<int, int, bool>> {
 protected:
  testing::TempDir temp_{"brigade_zero_memory_test"};
};

TEST_P(ZeroResidentMemoryTest, ReleasedPagesLeaveMemory) {
  const auto [dp, zero, shared] = GetParam();
  const GptConfig model = six_block_model();
  const std::string segment = fmt::format("/brigade-zero-memory-{}", ::getpid());
  const fs::path run_dir = temp_.path() / "run";
  const auto pids = testing::fork_ranks(dp, [&](int rank) {
    ShmCommunicatorOptions shm;
    shm.segment_name = segment;
    shm.group_name = "dp";
    shm.rank = rank;
    shm.size = dp;
    shm.timeout_ms = 20000;
    shm.shared_bytes = shared ? shared_bytes_for_training(model) : 0;
    ShmCommunicator comm(shm);
    TrainOptions options = options_for(dp, zero, 1, run_dir);
    options.parallel.bucket_mb = 0.2;  // 50k floats: 7 buckets below ZeRO 3
    Trainer trainer(model, options, &comm);
    for (int s = 0; s < 2; ++s) trainer.train_step();

    constexpr int64_t kPage = 4096;
    const int64_t whole = trainer.grads().bytes();
    const int64_t owned = whole / dp;
    const auto buckets = static_cast<int64_t>(trainer.bucket_timings().size());
    // A bucket keeps the pages its owned slice touches (at most two partial)
    // and the partial pages at its own two ends, which are zeroed in place.
    const int64_t released_bound = owned + 4 * kPage * buckets;
    const auto resident = [](const FloatBuffer& b) {
      return resident_bytes(b.data(), b.data() + b.size());
    };
    const int64_t grads = resident(trainer.grads());
    const int64_t params = resident(trainer.params());
    if (zero >= 2) {
      // The owned slices were written this step, so their pages are in.
      testing::require(grads >= owned && grads <= released_bound,
                       "rank {}: {} gradient bytes resident after ZeRO {}'s release; expected "
                       "between the owned {} and {} (page rounding over {} buckets), of {}",
                       rank, grads, zero, owned, released_bound, buckets, whole);
    } else {
      testing::require(grads >= whole,
                       "rank {}: ZeRO {} keeps every gradient, but only {} of {} "
                       "bytes are resident",
                       rank, zero, grads, whole);
    }
    if (zero == 3) {
      testing::require(params >= owned && params <= released_bound,
                       "rank {}: {} parameter bytes resident between ZeRO 3 steps; expected "
                       "between the owned {} and {}, of {}",
                       rank, params, owned, released_bound, whole);
      // At most three blocks' ranges are held or prefetched at once (this
      // block, the next, the one after), and a range can reach into one more
      // bucket where a cut was rounded down to the slice alignment: the
      // unowned parts of the four largest buckets on top of the owned share.
      std::vector<int64_t> sizes;
      for (const BucketTiming& t : trainer.bucket_timings()) sizes.push_back(t.bytes);
      std::sort(sizes.rbegin(), sizes.rend());
      int64_t gathered = 0;
      for (size_t i = 0; i < 4 && i < sizes.size(); ++i) gathered += sizes[i] - sizes[i] / dp;
      const int64_t peak = trainer.sharded_params()->peak_resident_bytes();
      testing::require(peak <= owned + gathered && peak < whole,
                       "rank {}: ZeRO 3 held {} parameter bytes at its peak; expected at most the "
                       "owned {} plus {} gathered (the four largest buckets), below the whole {}",
                       rank, peak, owned, gathered, whole);
    } else {
      testing::require(params >= whole,
                       "rank {}: ZeRO {} keeps every parameter, but only {} of "
                       "{} bytes are resident",
                       rank, zero, params, whole);
    }
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(120));
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    DpZeroMemory, ZeroResidentMemoryTest,
    ::testing::Values(std::make_tuple(2, 0, true), std::make_tuple(2, 1, true),
                      std::make_tuple(2, 2, true), std::make_tuple(2, 2, false),
                      std::make_tuple(4, 2, true), std::make_tuple(2, 3, true),
                      std::make_tuple(2, 3, false), std::make_tuple(4, 3, true)),
    [](const auto& info) {
      return fmt::format("dp{}_zero{}_{}", std::get<0>(info.param), std::get<1>(info.param),
                         std::get<2>(info.param) ? "shm" : "heap");
    });

// Ranks that each resolve "the newest checkpoint" of a run directory can
// see different ones (a network file system's cache); training different
// steps together would be silent corruption, so the trainer stops, naming
// the steps.
TEST(DataParallel, RanksThatResumeFromDifferentStepsStop) {
  testing::TempDir temp{"brigade_dp_resume_test"};
  const fs::path dir = temp.path();
  const GptConfig model = tiny_model();
  // Steps 1 and 2 of one process (in a child: OpenMP's pool and fork).
  const auto saver = testing::fork_ranks(1, [&](int) {
    Trainer t(model, options_for(1, 0, kGradAccum * 2, dir / "saved"));
    t.train_step();
    t.save_checkpoint();
    t.train_step();
    t.save_checkpoint();
  });
  ASSERT_EQ(testing::reap_all(saver, std::chrono::seconds(120)), std::vector<int>{0});
  const std::string segment = fmt::format("/brigade-dp-resume-test-{}", ::getpid());
  const auto pids = testing::fork_ranks(2, [&](int rank) {
    ShmCommunicatorOptions shm;
    shm.segment_name = segment;
    shm.group_name = "dp";
    shm.rank = rank;
    shm.size = 2;
    shm.timeout_ms = 20000;
    shm.shared_bytes = shared_bytes_for_training(model);
    ShmCommunicator comm(shm);
    TrainOptions o = options_for(2, 0, kGradAccum, dir / "run");
    o.resume =
        (dir / "saved" / "checkpoints" / (rank == 0 ? "step_00000001" : "step_00000002")).string();
    try {
      Trainer t(model, o, &comm);
    } catch (const Error& e) {
      const std::string what = e.what();
      testing::require(what.find("resumed from different steps (1 to 2") != std::string::npos,
                       "rank {}: unexpected error: {}", rank, what);
      return;
    }
    testing::require(false, "rank {}: resumed from step {} without an error", rank, rank + 1);
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(120));
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(DataParallel, RefusesDpWithoutAGroup) {
  TrainOptions options = options_for(2, 0, 1, "unused");
  EXPECT_THROW(Trainer(tiny_model(), options, nullptr), Error);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
