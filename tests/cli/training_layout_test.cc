// `brigade plan --layout config`: the layout a training config runs as on N
// workers, which bench/check_plan_local.py compares with measured runs.
#include "brigade/cli/training_layout.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

using cli::training_layout;
using testing::run_brigade;

constexpr const char* kModel = R"(
[model]
n_layer = 4
n_head = 4
n_embd = 64
block_size = 32
vocab_size = 97
)";
const std::string kTiny = std::string(BRIGADE_SOURCE_DIR) + "/examples/tiny.toml";

// The model above, `rest` (sections other than [model]), then `sets` as --set.
Config config_with(const std::string& rest, const std::vector<std::string>& sets = {}) {
  Config config = Config::from_string(kModel + rest);
  for (const std::string& s : sets) config.set(s);
  return config;
}

TEST(TrainingLayout, TensorParallelRunTakesTheWorkersThatTpLeaves) {
  const Config config = config_with(R"(
[train]
micro_batch = 4
grad_accum = 3
[parallel]
tp = 2
sequence_parallel = true
zero = 1
)");
  const cli::TrainingLayout run = training_layout(config, 4);
  EXPECT_EQ(run.layout.tp, 2);
  EXPECT_EQ(run.layout.pp, 1);
  EXPECT_EQ(run.layout.dp, 2);
  EXPECT_TRUE(run.layout.sp);
  EXPECT_EQ(run.layout.zero, 1);
  EXPECT_EQ(run.layout.micro, 4);
  EXPECT_EQ(run.layout.recompute, sim::PlanRecompute::kNone);
  // Each of the 2 replicas runs 3 micro-batches of 4.
  EXPECT_EQ(run.global_batch, 24);
  // The model splits the sequence only across a tensor-parallel group: at
  // tp 1 sequence_parallel changes nothing, and the plan must not cost it.
  const cli::TrainingLayout alone =
      training_layout(config_with("[parallel]\nsequence_parallel = true\n"), 2);
  EXPECT_EQ(alone.layout.tp, 1);
  EXPECT_FALSE(alone.layout.sp);
}

// The planner costs n_layer / pp blocks a stage; the trainer's cut
// (split_stages) is taken when equal, refused with the fix when not.
TEST(TrainingLayout, StagesAreTheTrainersCut) {
  // A large vocabulary makes the LM head cost more than a block, so the
  // balanced split moves a block off the last stage: [0, 3), [3, 4).
  const std::vector<std::string> pp2 = {"parallel.pp=2", "train.grad_accum=2",
                                        "model.vocab_size=2000"};
  try {
    training_layout(config_with("", pp2), 2);
    ADD_FAILURE() << "planned unequal stages as equal";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[0, 3), [3, 4)"), std::string::npos) << what;
    EXPECT_NE(what.find("set parallel.stage_layers = [2, 2]"), std::string::npos) << what;
  }
  // Taking that fix makes the run one the planner costs.
  std::vector<std::string> equal = pp2;
  equal.push_back("parallel.stage_layers=[2, 2]");
  EXPECT_EQ(training_layout(config_with("", equal), 2).layout.pp, 2);
  // A pp that does not divide n_layer can never be cut equally.
  try {
    training_layout(config_with("", {"parallel.pp=3", "train.grad_accum=3"}), 3);
    ADD_FAILURE() << "planned 4 blocks as 3 equal stages";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan a parallel.pp that divides 4"), std::string::npos)
        << e.what();
  }
  // More stages than blocks: the trainer's own error.
  try {
    training_layout(config_with("", {"parallel.pp=5", "train.grad_accum=5"}), 5);
    ADD_FAILURE() << "planned 5 stages of 4 blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("each stage needs at least one block"), std::string::npos)
        << e.what();
  }
}

TEST(TrainingLayout, PipelineRunKeepsItsScheduleAndMicroBatches) {
  const Config config = config_with(R"(
[train]
micro_batch = 2
grad_accum = 8
[parallel]
pp = 2
schedule = "zb-h1"
)",
                                    {"model.recompute=\"full\""});
  const cli::TrainingLayout run = training_layout(config, 2);
  EXPECT_EQ(run.layout.pp, 2);
  EXPECT_EQ(run.layout.tp, 1);
  EXPECT_EQ(run.layout.dp, 1);
  EXPECT_EQ(run.layout.schedule, schedule::Kind::kZbH1);
  EXPECT_EQ(run.layout.recompute, sim::PlanRecompute::kFull);
  EXPECT_EQ(run.layout.micro, 2);
  EXPECT_EQ(run.global_batch, 16);
  // The defaults are the trainer's: 1F1B, micro-batches of 8.
  const cli::TrainingLayout plain =
      training_layout(config_with("[train]\ngrad_accum = 2\n[parallel]\npp = 2\n"), 4);
  EXPECT_EQ(plain.layout.schedule, schedule::Kind::kOneFOneB);
  EXPECT_EQ(plain.layout.micro, 8);
  EXPECT_EQ(plain.layout.dp, 2);
  EXPECT_EQ(plain.global_batch, 32);
  EXPECT_EQ(plain.layout.vp, 1);
  // Interleaved: the virtual stages reach the plan (without them it is not
  // the interleaved schedule, and the planner refuses it).
  const cli::TrainingLayout interleaved = training_layout(
      config_with("[train]\ngrad_accum = 4\n[parallel]\npp = 2\nschedule = \"interleaved\"\n"
                  "virtual_stages = 2\n"),
      2);
  EXPECT_EQ(interleaved.layout.schedule, schedule::Kind::kInterleaved);
  EXPECT_EQ(interleaved.layout.vp, 2);
}

TEST(TrainingLayout, RefusesWhatTrainingWouldRefuse) {
  struct Case {
    std::vector<std::string> sets;
    int64_t processes;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"parallel.tp=2"},
       3,
       "3 workers are not a multiple of parallel.tp = 2 times parallel.pp = 1"},
      {{"parallel.tp=2", "parallel.dp=2"},
       2,
       "parallel.dp = 2 but 2 workers at tp 2 x pp 1 are dp 1"},
      {{"parallel.tp=3"}, 3, "n_head"},
      {{"parallel.tp=2", "parallel.sequence_parallel=true", "model.block_size=33"}, 2, "33"},
      {{"parallel.pp=2", "train.grad_accum=2", "parallel.schedule=\"round-robin\""},
       2,
       "round-robin"},
      {{"model.recompute=\"selective\""}, 1, "does not model Brigade's selective"},
      // A key `brigade train` never reads is refused as it refuses it.
      {{"train.micro_batchs=4"}, 1, "unknown config key 'train.micro_batchs'"},
      {{"elastic.max_restarts=1", "diag.metrics=\"off\"", "train.grad_acum=2"},
       1,
       "unknown config key 'train.grad_acum'"},
  };
  for (const Case& c : cases) {
    try {
      training_layout(config_with("", c.sets), c.processes);
      ADD_FAILURE() << "accepted " << c.sets.back();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
          << "wanted: " << c.message << "\ngot: " << e.what();
    }
  }
}

// A this-machine calibration of 2 cores: one worker with both is twice as
// fast as a worker with one.
std::string write_calibration(const testing::TempDir& dir) {
  const std::string path = (dir.path() / "calibration.json").string();
  nlohmann::json compute = {{"threads", 1},
                            {"peak_gflops", 250.0},
                            {"gemm", {{1e6, 100.0}, {1e9, 100.0}}},
                            {"stream_bytes_per_s", 25e9},
                            {"cache_stream_bytes_per_s", 25e9},
                            {"adamw_params_per_s", 300e6},
                            {"refault_bytes_per_s", 1e9},
                            {"attention_gflops", 50.0},
                            {"kernel_overhead_s", 2e-6}};
  nlohmann::json both = compute;
  both["threads"] = 2;
  both["peak_gflops"] = 500.0;
  std::ofstream(path) << nlohmann::json{
      {"version", 2},
      {"cores", 2},
      {"memory_bytes", 8e9},
      {"cache_bytes", 0},
      {"compute", {compute, both}},
      {"comm",
       {{"nproc", 2},
        {"all_reduce",
         {{{"bytes", 4096}, {"time_s", 1e-5}}, {{"bytes", 16777216}, {"time_s", 8e-3}}}}}}};
  return path;
}

// `brigade plan ... --json` on the calibration above; null (and a failure) if it fails.
nlohmann::json plan_json(const std::string& calibration, const std::string& gpus,
                         const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {"plan",      "--hardware", "this-machine", "--calibration",
                                   calibration, "--model",    kTiny,          "--gpus",
                                   gpus,        "--json",     "--trials",     "20"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto r = run_brigade(argv);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json{};
}

// `brigade plan` with --layout config on 2 workers, expected to fail; its stderr.
std::string plan_error(const std::string& calibration, const std::vector<std::string>& extra,
                       const std::string& hardware = "this-machine") {
  std::vector<std::string> argv = {"plan",      "--hardware", hardware, "--calibration",
                                   calibration, "--model",    kTiny,    "--gpus",
                                   "2",         "--layout",   "config"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto r = run_brigade(argv);
  EXPECT_NE(r.status, 0) << "accepted: " << extra.back();
  return r.err;
}

// The command gives exactly the estimate of the layout spelled out by hand.
TEST(TrainingLayout, PlanLayoutConfigIsTheSpelledOutLayout) {
  testing::TempDir dir;
  const std::string calibration = write_calibration(dir);
  auto plan = [&](const std::vector<std::string>& extra) {
    return plan_json(calibration, "2", extra);
  };
  struct Case {
    std::vector<std::string> sets;
    std::string layout, global_batch;
  };
  const std::vector<Case> cases = {
      {{"parallel.tp=2", "parallel.sequence_parallel=true"}, "tp=2,dp=1,micro=8,sp=true", "8"},
      {{"parallel.pp=2", "train.grad_accum=4"}, "pp=2,dp=1,micro=8,schedule=1f1b", "32"},
      {{"parallel.pp=2", "train.grad_accum=4", "parallel.schedule=\"gpipe\""},
       "pp=2,dp=1,micro=8,schedule=gpipe",
       "32"},
      {{"parallel.pp=2", "train.grad_accum=4", "parallel.schedule=\"interleaved\"",
        "parallel.virtual_stages=2"},
       "pp=2,vp=2,dp=1,micro=8,schedule=interleaved",
       "32"},
      {{"parallel.pp=2", "train.grad_accum=4", "parallel.schedule=\"zb-h1\""},
       "pp=2,dp=1,micro=8,schedule=zb-h1",
       "32"},
      {{"parallel.zero=1", "train.micro_batch=4"}, "dp=2,micro=4,zero=1", "8"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> from_config = {"--layout", "config"};
    for (const std::string& s : c.sets) {
      from_config.push_back("--set");
      from_config.push_back(s);
    }
    const nlohmann::json got = plan(from_config);
    const nlohmann::json want = plan({"--layout", c.layout, "--global-batch", c.global_batch});
    ASSERT_FALSE(got.is_null() || want.is_null()) << c.layout;
    EXPECT_EQ(got.at("layout_string"), want.at("layout_string")) << c.layout;
    EXPECT_EQ(got.at("step_time_s"), want.at("step_time_s")) << c.layout;
    EXPECT_EQ(got.at("tokens_per_s"), want.at("tokens_per_s")) << c.layout;
  }
  // --set reaches the model the plan costs, not only the layout.
  const nlohmann::json whole = plan({"--layout", "dp=2,micro=8", "--global-batch", "16"});
  const nlohmann::json halved =
      plan({"--layout", "dp=2,micro=8", "--global-batch", "16", "--set", "model.n_layer=2"});
  ASSERT_FALSE(whole.is_null() || halved.is_null());
  EXPECT_LT(halved.at("time_s").at("compute").get<double>(),
            0.75 * whole.at("time_s").at("compute").get<double>());
  const auto preset =
      run_brigade({"plan", "--model", "gpt2-small", "--gpus", "2", "--layout", "config",
                   "--hardware", "this-machine", "--calibration", calibration});
  EXPECT_NE(preset.status, 0);
  EXPECT_NE(preset.err.find("give the config file"), std::string::npos) << preset.err;
  const auto preset_set = run_brigade({"plan", "--model", "gpt2-small", "--gpus", "2", "--set",
                                       "parallel.tp=2", "--hardware", "h100-80g"});
  EXPECT_NE(preset_set.status, 0);
  EXPECT_NE(preset_set.err.find("--model gpt2-small is a preset"), std::string::npos)
      << preset_set.err;
}

// What --layout config refuses, and why: other jobs' flags, threads the
// hardware has no notion of, runs the planner cannot cost.
TEST(TrainingLayout, PlanLayoutConfigRefusals) {
  testing::TempDir dir;
  const std::string calibration = write_calibration(dir);
  // --global-batch and --seq would describe another job than the config's.
  EXPECT_NE(plan_error(calibration, {"--global-batch", "32"}).find("drop it"), std::string::npos);
  EXPECT_NE(plan_error(calibration, {"--seq", "64"}).find("--seq would plan another"),
            std::string::npos);
  // train.threads is each worker's: 2 workers of 2 threads oversubscribe 2 cores.
  const std::string over = plan_error(calibration, {"--set", "train.threads=2"});
  EXPECT_NE(over.find("does not model threads beyond the cores"), std::string::npos) << over;
  const std::string gpu = plan_error(calibration, {"--set", "train.threads=1"}, "h100-80g");
  EXPECT_NE(gpu.find("has no notion"), std::string::npos) << gpu;
  // Training runs ZeRO 2 with pp; the planner does not cost it, and says so
  // rather than that the run cannot run.
  const std::string zero2 = plan_error(
      calibration,
      {"--set", "parallel.zero=2", "--set", "parallel.pp=2", "--set", "train.grad_accum=2"});
  EXPECT_NE(zero2.find("the planner cannot cost this run"), std::string::npos) << zero2;
  EXPECT_EQ(zero2.find("cannot run this job"), std::string::npos) << zero2;
}

// train.threads reaches the hardware: one worker with one of the 2 cores
// computes at half the rate of one with both (the default).
TEST(TrainingLayout, PlanLayoutConfigUsesTrainThreads) {
  testing::TempDir dir;
  const std::string calibration = write_calibration(dir);
  const nlohmann::json both = plan_json(calibration, "1", {"--layout", "config"});
  const nlohmann::json one =
      plan_json(calibration, "1", {"--layout", "config", "--set", "train.threads=1"});
  ASSERT_FALSE(both.is_null() || one.is_null());
  EXPECT_GT(one.at("time_s").at("compute").get<double>(),
            1.5 * both.at("time_s").at("compute").get<double>());
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
