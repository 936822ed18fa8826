// What the tests of training on a mesh share (data_parallel_test.cc,
// tensor_parallel_test.cc, pipeline_parallel_test.cc): a short run's
// options, one forked rank's groups over shm, and the comparison of a run
// with one process's through its losses and its checkpoint.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/comm/shm_communicator.h"
#include "brigade/model/param_layout.h"
#include "brigade/parallel/mesh.h"
#include "brigade/train/trainer.h"

namespace brigade::testing {

// A run of `steps` whose learning rate warms up and decays, with clipping
// low enough that it happens (the global norm must be exact under every
// layout) and buckets of 5,000 floats (several per model). Single-threaded:
// the ranks share the machine's cores.
inline TrainOptions short_run(int64_t micro_batch, int64_t grad_accum, int64_t steps,
                              int64_t warmup_steps, uint64_t seed,
                              const std::filesystem::path& run_dir) {
  TrainOptions o;
  o.micro_batch = micro_batch;
  o.grad_accum = grad_accum;
  o.steps = steps;
  o.seed = seed;
  o.threads = 1;
  o.run_dir = run_dir.string();
  o.lr.lr = 3e-3;
  o.lr.min_lr = 3e-4;
  o.lr.warmup_steps = warmup_steps;
  o.lr.total_steps = steps;
  o.grad_clip = 0.5;
  o.data.synthetic = true;
  o.parallel.bucket_mb = 0.02;
  return o;
}

// One rank's groups of a dp x tp x pp mesh over shm, grouped as
// parallel/mesh.h says; a group of one member is none (nullptr), as the
// launcher leaves it.
struct MeshGroups {
  std::unique_ptr<ShmCommunicator> world, dp, tp, pp;
  TrainerGroups view() const { return {world.get(), dp.get(), tp.get(), pp.get()}; }
};

// `dp_shared_bytes`: the data-parallel group's shared region
// (shared_bytes_for_training of the model), where its buckets reduce.
inline MeshGroups join_mesh(int dp, int tp, int pp, int rank, const std::string& prefix,
                            int64_t dp_shared_bytes, int64_t timeout_ms = 20000) {
  const int world_size = dp * tp * pp;
  const Mesh mesh({dp, tp, pp}, world_size);
  const MeshCoord me = mesh.coord(rank);
  const auto group = [&](const std::string& name, const std::vector<int>& members,
                         int64_t shared) -> std::unique_ptr<ShmCommunicator> {
    if (members.size() < 2) return nullptr;
    ShmCommunicatorOptions shm;
    shm.segment_name = prefix + "-" + name;
    shm.group_name = name;
    shm.rank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    shm.size = static_cast<int>(members.size());
    shm.timeout_ms = timeout_ms;
    shm.shared_bytes = shared;
    shm.slot_bytes = 1 << 20;
    return std::make_unique<ShmCommunicator>(shm);
  };
  std::vector<int> everyone(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) everyone[static_cast<size_t>(r)] = r;
  MeshGroups g;
  g.world = group("world", everyone, 0);
  g.dp = group(fmt::format("dp{}_{}", me.pp_stage, me.tp_rank), mesh.group(MeshDim::kData, rank),
               dp_shared_bytes);
  g.tp =
      group(fmt::format("tp{}_{}", me.pp_stage, me.dp_rank), mesh.group(MeshDim::kTensor, rank), 0);
  g.pp = group(fmt::format("pp{}_{}", me.dp_rank, me.tp_rank), mesh.group(MeshDim::kPipeline, rank),
               0);
  return g;
}

// The whole model's state in a checkpoint, as one process loads it.
struct GlobalState {
  std::vector<float> kinds[3];  // parameters, exp_avg, exp_avg_sq
};

inline GlobalState read_global_state(const std::filesystem::path& step_dir,
                                     const GptConfig& model) {
  const ResolvedCheckpoint checkpoint = resolve_checkpoint(step_dir);
  const int64_t size = ParamLayout(model).size();
  GlobalState state;
  const StateKind kinds[] = {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq};
  for (int k = 0; k < 3; ++k) {
    state.kinds[k].assign(static_cast<size_t>(size), 0.0f);
    load_checkpoint_state(checkpoint.dir, checkpoint.manifest, model, kinds[k],
                          state.kinds[k].data());
  }
  return state;
}

// A run's directory: rank 0 wrote "<step> <loss>" lines to losses.txt, and
// the checkpoints are under run/checkpoints.
inline std::vector<std::pair<int, double>> read_losses(const std::filesystem::path& dir) {
  std::ifstream in(dir / "losses.txt");
  std::vector<std::pair<int, double>> losses;
  int step = 0;
  double loss = 0;
  while (in >> step >> loss) losses.emplace_back(step, loss);
  return losses;
}

inline std::filesystem::path checkpoint_of(const std::filesystem::path& dir, int step) {
  return step_directory(dir / "run" / "checkpoints", step);
}

// Losses of the steps `run` took against the reference's same steps, and
// the checkpointed parameters against the reference's at `step`, both
// within float rounding of a different reduction order.
inline void expect_same_training(const std::filesystem::path& reference,
                                 const std::filesystem::path& run, int step,
                                 const std::string& what, const GptConfig& model) {
  const auto want = read_losses(reference);
  const auto got = read_losses(run);
  ASSERT_FALSE(got.empty()) << what << ": no losses";
  for (const auto& [s, loss] : got) {
    ASSERT_LT(s, static_cast<int>(want.size())) << what;
    const double expected = want[static_cast<size_t>(s)].second;
    EXPECT_LE(std::abs(loss - expected), 1e-5 * std::abs(expected))
        << what << ": step " << s << " loss " << loss << " vs " << expected;
  }
  const GlobalState a = read_global_state(checkpoint_of(reference, step), model);
  const GlobalState b = read_global_state(checkpoint_of(run, step), model);
  float largest = 0, worst = 0;
  for (const float p : a.kinds[0]) largest = std::max(largest, std::abs(p));
  for (size_t i = 0; i < a.kinds[0].size(); ++i) {
    worst = std::max(worst, std::abs(a.kinds[0][i] - b.kinds[0][i]));
  }
  EXPECT_LE(worst, 1e-5f * largest) << what << ": largest parameter difference";
}

}  // namespace brigade::testing
