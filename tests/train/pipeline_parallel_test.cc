// Pipeline parallelism against a single process: forked ranks over the shm
// backend, grouped as parallel/mesh.h says (stages outermost), running
// GPipe, 1F1B, ZB-H1 or interleaved 1F1B on one global batch must give the single process's loss at
// every step and, through the checkpoint they save (loaded whole by one
// process), its parameters. Checkpoints are global: one saved at pp 2
// continues at pp 1 and one saved at pp 1 at pp 2 as the uninterrupted run
// does, and reloaded and saved again under another layout it holds the same
// tensors bit for bit. A stage that dies is an error on the other, not a hang.
//
// Every run, the reference too, happens in a forked child: OpenMP's thread
// pool does not survive a fork, so the parent never trains itself.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/comm/shm_communicator.h"
#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/model/param_layout.h"
#include "brigade/parallel/mesh.h"
#include "brigade/parallel/pipeline_stage.h"
#include "brigade/schedule/simulate.h"
#include "brigade/train/trainer.h"
#include "testing/forked_ranks.h"
#include "testing/temp_dir.h"
#include "train/mesh_training.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr int kSteps = 8;
constexpr int64_t kMicroBatch = 2;
constexpr int64_t kGradAccum = 4;

// Five blocks: the balanced split of two stages is uneven, and four stages
// get one or two each. (Four for the interleaved schedule: 2 stages x 2 chunks.)
GptConfig model_config(int64_t n_layer = 5) {
  Config c = Config::from_string(R"(
    [model]
    n_head = 2
    n_embd = 24
    block_size = 16
    vocab_size = 67
  )");
  GptConfig model = GptConfig::from_config(c);
  model.n_layer = n_layer;
  return model;
}

struct Layout {
  int dp = 1, tp = 1, pp = 1, zero = 0;
  std::string schedule = "1f1b";
  std::vector<int64_t> stage_layers = {};
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  int64_t virtual_stages = 1;
  int64_t n_layer = 5;
  std::string name() const {
    return fmt::format("dp{}_tp{}_pp{}_zero{}_{}{}{}_v{}_l{}", dp, tp, pp, zero, schedule,
                       sequence_parallel ? "_sp" : "",
                       recompute == Recompute::kSelective ? "_selective" : "", virtual_stages,
                       n_layer);
  }
};

TrainOptions options_for(const Layout& layout, int64_t grad_accum, const fs::path& run_dir) {
  TrainOptions o = testing::short_run(kMicroBatch, grad_accum, kSteps, /*warmup_steps=*/2,
                                      /*seed=*/5, run_dir);
  o.parallel.dp = layout.dp;
  o.parallel.tp = layout.tp;
  o.parallel.pp = layout.pp;
  o.parallel.schedule = layout.schedule;
  o.parallel.virtual_stages = layout.virtual_stages;
  o.parallel.stage_layers = layout.stage_layers;
  o.parallel.sequence_parallel = layout.sequence_parallel;
  o.parallel.zero = layout.zero;
  return o;
}

using testing::checkpoint_of;
using testing::GlobalState;
using testing::read_losses;

GlobalState read_checkpoint(const fs::path& step_dir, int64_t n_layer) {
  return testing::read_global_state(step_dir, model_config(n_layer));
}

testing::MeshGroups join(const Layout& layout, int rank, const std::string& prefix,
                         int64_t timeout_ms) {
  return testing::join_mesh(layout.dp, layout.tp, layout.pp, rank, prefix,
                            shared_bytes_for_training(model_config()), timeout_ms);
}

int64_t live_microbatches(const Layout& layout, int64_t grad_accum, int stage) {
  schedule::Shape shape;
  shape.kind = schedule::parse_kind(layout.schedule);
  shape.stages = layout.pp;
  shape.microbatches = grad_accum;
  shape.virtual_stages = layout.virtual_stages;
  const schedule::Simulation sim =
      schedule::simulate(schedule::all_stage_instructions(shape), schedule::Costs{}, false);
  return sim.stages[static_cast<size_t>(stage)].peak_live;
}

// Trains a layout from `resume` (or from scratch) until step `until`, then
// saves; rank 0 writes each step's loss to <dir>/losses.txt. The
// checkpoint is <dir>/run/checkpoints/step_<until>.
void train_forked(const Layout& layout, int64_t grad_accum, const fs::path& dir, int until,
                  const fs::path& resume = {}) {
  const int world_size = layout.dp * layout.tp * layout.pp;
  const std::string prefix =
      fmt::format("/brigade-pp-test-{}-{}", ::getpid(), dir.filename().string());
  const auto pids = testing::fork_ranks(world_size, [&](int rank) {
    const testing::MeshGroups groups = join(layout, rank, prefix, 20000);
    TrainOptions options = options_for(layout, grad_accum, dir / "run");
    options.resume = resume.string();
    GptConfig model = model_config(layout.n_layer);
    model.recompute = layout.recompute;
    Trainer trainer(model, options, groups.view());
    if (layout.virtual_stages == 1) {
      // The memory report counts a workspace per micro-batch the schedule
      // keeps alive on this stage, as the simulator finds it.
      const int64_t slots = live_microbatches(layout, grad_accum, trainer.pp_stage());
      const int64_t one = trainer.model().activation_bytes(kMicroBatch, model.block_size);
      testing::require(trainer.memory().activations == slots * one,
                       "stage {} reports {} bytes of activations, not {} slots of {}",
                       trainer.pp_stage(), trainer.memory().activations, slots, one);
    }
    std::ofstream losses;
    if (rank == 0) losses.open(dir / "losses.txt");
    while (trainer.step() < until) {
      const StepMetrics m = trainer.train_step();
      // Every stage waits at least for its first input or gradient.
      testing::require(layout.pp == 1 || m.bubble_ms > 0,
                       "step {}: stage {} reported no pipeline bubble", m.step, trainer.pp_stage());
      // The schedule ran: it kept as many micro-batches alive as its list
      // says (GPipe all, 1F1B p - stage, ZB-H1 until each weight half).
      const int64_t live = live_microbatches(layout, grad_accum, trainer.pp_stage());
      testing::require(m.live_microbatches == live,
                       "step {}: stage {} kept {} micro-batches alive, the {} schedule {}", m.step,
                       trainer.pp_stage(), m.live_microbatches, layout.schedule, live);
      if (rank == 0) losses << fmt::format("{} {:.9e}\n", m.step, m.loss);
    }
    trainer.save_checkpoint();
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(180));
  for (size_t r = 0; r < codes.size(); ++r) {
    ASSERT_EQ(codes[r], 0) << layout.name() << " rank " << r;
  }
}

void expect_same_training(const fs::path& reference, const fs::path& run, int step,
                          const std::string& what, int64_t n_layer = 5) {
  testing::expect_same_training(reference, run, step, what, model_config(n_layer));
}

class PipelineParallelTraining : public ::testing::Test {
 protected:
  // One process running every micro-batch of each global batch of `dp` ranks.
  fs::path reference(int dp, int until = kSteps, int64_t n_layer = 5) {
    const fs::path dir = temp_.path() / fmt::format("reference_dp{}_{}_l{}", dp, until, n_layer);
    if (!fs::exists(dir / "losses.txt")) {
      fs::create_directories(dir);
      train_forked({.n_layer = n_layer}, kGradAccum * dp, dir, until);
    }
    return dir;
  }
  fs::path run(const Layout& layout, int until = kSteps, const fs::path& resume = {},
               const std::string& suffix = "") {
    const fs::path dir = temp_.path() / (layout.name() + suffix);
    fs::create_directories(dir);
    train_forked(layout, kGradAccum, dir, until, resume);
    return dir;
  }
  testing::TempDir temp_{"brigade_pp_test"};
};

TEST_F(PipelineParallelTraining, Pp2GpipeMatchesOneProcess) {
  const Layout layout{.pp = 2, .schedule = "gpipe"};
  expect_same_training(reference(1), run(layout), kSteps, layout.name());
}

TEST_F(PipelineParallelTraining, Pp2OneFOneBMatchesOneProcess) {
  const Layout layout{.pp = 2, .schedule = "1f1b"};
  expect_same_training(reference(1), run(layout), kSteps, layout.name());
}

TEST_F(PipelineParallelTraining, Pp2ZbH1MatchesOneProcess) {
  const Layout layout{.pp = 2, .schedule = "zb-h1"};
  expect_same_training(reference(1), run(layout), kSteps, layout.name());
}

// ZeRO 2 under ZB-H1, whose weight halves finish the gradients in another
// order than backward: each bucket is reduced and its unowned part released
// only once all of it is final.
TEST_F(PipelineParallelTraining, Dp2Pp2ZbH1WithZero2MatchesOneProcess) {
  const Layout layout{.dp = 2, .pp = 2, .zero = 2, .schedule = "zb-h1"};
  expect_same_training(reference(2), run(layout), kSteps, layout.name());
}

// ZB-H1 at pp 1 (one stage: each micro-batch's W right after its B) with
// data parallelism: nothing holds the tied wte's buckets back there, so the
// LM head's deferred weight gradient must be added before the weight half
// reports wte ready and ZeRO 2 reduces and releases it.
TEST_F(PipelineParallelTraining, Dp2Pp1ZbH1WithZero2MatchesOneProcess) {
  const Layout layout{.dp = 2, .zero = 2, .schedule = "zb-h1"};
  expect_same_training(reference(2), run(layout), kSteps, layout.name());
}

TEST_F(PipelineParallelTraining, Pp4OneFOneBWithGivenStagesMatchesOneProcess) {
  const Layout layout{.pp = 4, .schedule = "1f1b", .stage_layers = {2, 1, 1, 1}};
  expect_same_training(reference(1), run(layout), kSteps, layout.name());
}

TEST_F(PipelineParallelTraining, Dp2Pp2WithZero1MatchesOneProcess) {
  const Layout layout{.dp = 2, .pp = 2, .zero = 1, .schedule = "1f1b"};
  expect_same_training(reference(2), run(layout), kSteps, layout.name());
}

// The 3D mesh: 8 processes, dp 2 x tp 2 x pp 2, ZeRO 1.
TEST_F(PipelineParallelTraining, Dp2Tp2Pp2MatchesOneProcess) {
  const Layout layout{.dp = 2, .tp = 2, .pp = 2, .zero = 1, .schedule = "1f1b"};
  expect_same_training(reference(2), run(layout), kSteps, layout.name());
}

// Megatron's interleaving: 2 stages of 2 chunks of one block each (stage 0
// holds blocks 0 and 2, stage 1 blocks 1 and 3; the stream goes round the
// stages twice). Also continued from one process's half-way checkpoint.
TEST_F(PipelineParallelTraining, Pp2InterleavedMatchesOneProcess) {
  constexpr int kHalf = kSteps / 2;
  const Layout layout{.pp = 2, .schedule = "interleaved", .virtual_stages = 2, .n_layer = 4};
  expect_same_training(reference(1, kSteps, 4), run(layout), kSteps, layout.name(), 4);
  const fs::path from_pp1 =
      run(layout, kSteps, checkpoint_of(reference(1, kHalf, 4), kHalf), "_from_pp1");
  expect_same_training(reference(1, kSteps, 4), from_pp1, kSteps, "pp 1 continued interleaved", 4);
}

// dp 2 x pp 2 interleaved with ZeRO 2 (the last stage's tied wte lies after
// its first chunk in the buffer, so every bucket below it waits for the tied
// sum before it is reduced and its unowned part released), saved half-way
// and continued at pp 1.
TEST_F(PipelineParallelTraining, Dp2Pp2InterleavedWithZero2MatchesOneProcessAndContinuesAtPp1) {
  constexpr int kHalf = kSteps / 2;
  const Layout layout{
      .dp = 2, .pp = 2, .zero = 2, .schedule = "interleaved", .virtual_stages = 2, .n_layer = 4};
  const fs::path saved = run(layout, kHalf, {}, "_saved");
  expect_same_training(reference(2, kHalf, 4), saved, kHalf, layout.name(), 4);
  const fs::path dir = temp_.path() / "pp1_from_interleaved";
  fs::create_directories(dir);
  train_forked({.n_layer = 4}, 2 * kGradAccum, dir, kSteps, checkpoint_of(saved, kHalf));
  expect_same_training(reference(2, kSteps, 4), dir, kSteps, "interleaved continued at pp 1", 4);
}

// tp 2 x pp 2 with everything tp brings: the vocabulary-parallel wte (67
// rows, padded to 68) on both ends of the pipeline, sequence parallelism
// (the streams between the stages are each rank's rows), and selective
// recompute under ZB-H1 (the weight half rebuilds the shared attention output).
TEST_F(PipelineParallelTraining, Tp2Pp2ZbH1WithSequenceParallelAndSelectiveRecompute) {
  const Layout layout{.tp = 2,
                      .pp = 2,
                      .schedule = "zb-h1",
                      .sequence_parallel = true,
                      .recompute = Recompute::kSelective};
  expect_same_training(reference(1), run(layout), kSteps, layout.name());
}

// Saved at dp 2 x pp 2, continued at pp 4 with the same global batch.
TEST_F(PipelineParallelTraining, CheckpointFromDp2Pp2ContinuesAtPp4) {
  constexpr int kHalf = kSteps / 2;
  const fs::path saved = run({.dp = 2, .pp = 2, .zero = 1}, kHalf, {}, "_saved");
  const Layout pp4{.pp = 4, .schedule = "gpipe"};
  const fs::path dir = temp_.path() / "pp4_from_dp2_pp2";
  fs::create_directories(dir);
  train_forked(pp4, 2 * kGradAccum, dir, kSteps, checkpoint_of(saved, kHalf));
  expect_same_training(reference(2), dir, kSteps, "dp 2 x pp 2 continued at pp 4");
}

TEST_F(PipelineParallelTraining, CheckpointsMoveBetweenPp2AndPp1) {
  constexpr int kHalf = kSteps / 2;
  // Saved at pp 2, continued at pp 1.
  const Layout pp2{.pp = 2, .schedule = "1f1b"};
  const fs::path saved = run(pp2, kHalf, {}, "_saved");
  const fs::path continued = run(Layout{}, kSteps, checkpoint_of(saved, kHalf), "_from_pp2");
  expect_same_training(reference(1), continued, kSteps, "pp 2 continued at pp 1");
  // Saved at pp 1 (the reference's half-way checkpoint), continued at pp 2.
  const fs::path from_pp1 = run(Layout{.pp = 2, .schedule = "gpipe"}, kSteps,
                                checkpoint_of(reference(1, kHalf), kHalf), "_from_pp1");
  expect_same_training(reference(1), from_pp1, kSteps, "pp 1 continued at pp 2");
  // Loaded at pp 1 and saved again at once: bit for bit what pp 2 saved
  // (wte once, from the first stage).
  const fs::path again = run(Layout{}, kHalf, checkpoint_of(saved, kHalf), "_resaved");
  const GlobalState a = read_checkpoint(checkpoint_of(saved, kHalf), 5);
  const GlobalState b = read_checkpoint(checkpoint_of(again, kHalf), 5);
  for (int k = 0; k < 3; ++k) {
    ASSERT_EQ(a.kinds[k].size(), b.kinds[k].size());
    for (size_t i = 0; i < a.kinds[k].size(); ++i) {
      ASSERT_EQ(a.kinds[k][i], b.kinds[k][i]) << "state " << k << " element " << i;
    }
  }
}

// Stage 1 exits after its first step; stage 0's second step must fail with
// a communication error naming the group within the timeout, not hang.
TEST_F(PipelineParallelTraining, DeadStageIsAnErrorOnTheOther) {
  const Layout layout{.pp = 2, .schedule = "1f1b"};
  const std::string prefix = fmt::format("/brigade-pp-test-{}-dead", ::getpid());
  const fs::path dir = temp_.path() / "dead";
  constexpr int kFailedAsExpected = 3;
  const auto started = testing::Clock::now();
  const auto pids = testing::fork_ranks(2, [&](int rank) {
    const testing::MeshGroups groups = join(layout, rank, prefix, 3000);
    Trainer trainer(model_config(), options_for(layout, kGradAccum, dir / "run"), groups.view());
    trainer.train_step();
    if (rank == 1) ::_exit(0);
    try {
      trainer.train_step();
    } catch (const CommError& e) {
      testing::require(std::string(e.what()).find("pp0_0") != std::string::npos,
                       "the error does not name the pipeline group: {}", e.what());
      ::_exit(kFailedAsExpected);
    }
    throw Error("stage 0 finished a step without its peer");
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(60));
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[0], kFailedAsExpected);
  EXPECT_LT(testing::ms_since(started), 60000.0);
}

// A stage whose step throws (not a communication error) with receives
// posted must not free their buffers under them: the shm mailbox copies a
// neighbour's activation to the posted pointer whenever it comes. Stage 1
// (GPipe, 4 micro-batches) has micro-batch 0's activation, then its fill
// throws with micro-batches 1 and 2's receives posted; its destructor must
// wait for them, so it cannot end before stage 0 (plain sends here) sends.
TEST_F(PipelineParallelTraining, AFailedStepKeepsPostedReceivesUntilTheyComplete) {
  const Layout layout{.pp = 2, .schedule = "gpipe"};
  const std::string prefix = fmt::format("/brigade-pp-test-{}-posted", ::getpid());
  const GptConfig model = model_config();
  const int64_t elements = kMicroBatch * model.block_size * model.n_embd;
  constexpr uint32_t kThrew = 100, kDestroyed = 101;
  const auto pids = testing::fork_ranks(2, [&](int rank) {
    const testing::MeshGroups groups = join(layout, rank, prefix, 5000);
    Communicator& pp = *groups.pp;
    std::vector<float> flag(1, 1.0f);
    if (rank == 1) {
      const LayerRange range = split_stages(model, 2)[1];
      const ParamLayout part_layout(model, 0, 1, range);
      std::vector<float> params(static_cast<size_t>(part_layout.size()));
      std::vector<float> grads(params.size());
      GptChunks part(model, params.data(), grads.data(), nullptr, {range});
      const schedule::Shape shape{.kind = schedule::Kind::kGpipe, .stages = 2, .microbatches = 4};
      std::vector<int32_t> tokens(static_cast<size_t>(kMicroBatch * model.block_size), 0);
      {
        PipelineStage stage(&pp, part, shape);
        try {
          stage.run([](int64_t) { throw std::runtime_error("the data loader failed"); },
                    tokens.data(), tokens.data(), kMicroBatch, model.block_size, 1.0f, {}, {});
          throw Error("the step did not throw");
        } catch (const std::runtime_error&) {
          pp.send(flag.data(), 1, DType::kF32, 0, kThrew)->wait();
        }
      }
      pp.send(flag.data(), 1, DType::kF32, 0, kDestroyed)->wait();
      return;
    }
    std::vector<float> act(static_cast<size_t>(elements), 0.5f);
    pp.send(act.data(), elements, DType::kF32, 1, /*activation of mb 0*/ 0)->wait();
    pp.recv(flag.data(), 1, DType::kF32, 1, kThrew)->wait();
    const auto destroyed = pp.recv(flag.data(), 1, DType::kF32, 1, kDestroyed);
    // Stage 1 cannot be done yet (its receives are not); a broken
    // destructor would be within far less than this.
    ::usleep(300'000);
    testing::require(!destroyed->test(),
                     "stage 1 was destroyed while its receives were still posted");
    const auto first = pp.send(act.data(), elements, DType::kF32, 1, 2);   // mb 1
    const auto second = pp.send(act.data(), elements, DType::kF32, 1, 4);  // mb 2
    destroyed->wait();
    first->wait();
    second->wait();
  });
  const auto codes = testing::reap_all(pids, std::chrono::seconds(60));
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// Validation through the pipeline (every stage runs the windows; the last
// computes the loss and every stage returns it) equals one process's, after
// a step of training; interleaved, the windows go round the stages twice.
TEST_F(PipelineParallelTraining, EvaluationThroughThePipelineMatchesOneProcess) {
  GptConfig model = model_config(4);
  model.vocab_size = 256;  // the byte tokenizer's
  const fs::path data = temp_.path() / "data";
  const auto evaluate = [&](const Layout& layout, const std::string& name) {
    const std::string prefix = fmt::format("/brigade-pp-test-{}-eval-{}", ::getpid(), name);
    const auto pids = testing::fork_ranks(layout.pp, [&](int rank) {
      const testing::MeshGroups groups = join(layout, rank, prefix, 20000);
      TrainOptions options = options_for(layout, kGradAccum, temp_.path() / name);
      options.data.synthetic = false;
      options.data.source = BRIGADE_SOURCE_DIR "/data/tinyshakespeare.txt";
      options.data.dir = data.string();
      options.eval_windows = 5;  // batches of micro_batch windows, the last one partial
      Trainer trainer(model, options, groups.view());
      trainer.train_step();
      const double loss = trainer.evaluate();
      std::ofstream(temp_.path() / fmt::format("{}_rank{}.txt", name, rank))
          << fmt::format("{:.9e}\n", loss);
    });
    const auto codes = testing::reap_all(pids, std::chrono::seconds(120));
    for (size_t r = 0; r < codes.size(); ++r) ASSERT_EQ(codes[r], 0) << name << " rank " << r;
  };
  evaluate({}, "one");  // prepares the data first
  evaluate({.pp = 2}, "pp2");
  evaluate({.pp = 2, .schedule = "interleaved", .virtual_stages = 2}, "interleaved");
  const auto read = [&](const std::string& file) {
    double v = 0;
    std::ifstream(temp_.path() / file) >> v;
    return v;
  };
  const double want = read("one_rank0.txt");
  EXPECT_GT(want, 0.0);
  for (const char* file :
       {"pp2_rank0.txt", "pp2_rank1.txt", "interleaved_rank0.txt", "interleaved_rank1.txt"}) {
    EXPECT_NEAR(read(file), want, 1e-5 * want) << file;
  }
}

TEST(PipelineParallelTrainer, RefusesBadShapesWithTheFix) {
  const auto message = [](const Layout& layout, int64_t grad_accum) -> std::string {
    try {
      Trainer trainer(model_config(layout.n_layer), options_for(layout, grad_accum, "unused"));
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(message({.pp = 6}, 8).find("parallel.pp = 6 stages but the model has n_layer = 5"),
            std::string::npos);
  EXPECT_NE(message({.pp = 2, .stage_layers = {2, 2}}, 4).find("summing to n_layer = 5"),
            std::string::npos);
  EXPECT_NE(message({.pp = 4}, 2).find("set train.grad_accum >= 4"), std::string::npos);
  // Interleaved: p*v equal chunks, Megatron's multiple of p micro-batches.
  const auto interleaved = [&](int64_t v, int64_t n_layer, int64_t grad_accum,
                               std::vector<int64_t> stage_layers = {}) {
    return message({.pp = 2,
                    .schedule = "interleaved",
                    .stage_layers = std::move(stage_layers),
                    .virtual_stages = v,
                    .n_layer = n_layer},
                   grad_accum);
  };
  EXPECT_NE(interleaved(2, 5, 4).find("* 2 = 4 equal chunks, but n_layer = 5 is not a multiple of "
                                      "4"),
            std::string::npos)
      << interleaved(2, 5, 4);
  EXPECT_NE(interleaved(2, 4, 4, {2, 2})
                .find("parallel.stage_layers is given, but the "
                      "interleaved schedule cuts"),
            std::string::npos);
  EXPECT_NE(interleaved(2, 4, 3).find("train.grad_accum = 3 micro-batches is not a multiple of "
                                      "parallel.pp = 2: the interleaved schedule sends them round "
                                      "in groups of pp (Megatron's rule); set train.grad_accum to "
                                      "2 or 4"),
            std::string::npos)
      << interleaved(2, 4, 3);
  EXPECT_NE(interleaved(0, 4, 4).find("parallel.virtual_stages = 0: it must be at least 1"),
            std::string::npos);
  EXPECT_NE(interleaved(1, 4, 4).find("needs parallel.virtual_stages >= 2"), std::string::npos);
  EXPECT_NE(message({.pp = 2, .virtual_stages = 2, .n_layer = 4}, 4)
                .find("parallel.virtual_stages = 2 needs parallel.schedule = \"interleaved\""),
            std::string::npos);
  EXPECT_EQ(interleaved(2, 4, 4).find("interleaved"), std::string::npos) << "refused a good shape";
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
