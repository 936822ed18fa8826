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
namespace {

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

// The command gives exactly the estimate of the layout spelled out by hand.
TEST(TrainingLayout, PlanLayoutConfigIsTheSpelledOutLayout) {
  testing::TempDir dir;
  const std::string calibration = (dir.path() / "calibration.json").string();
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
  std::ofstream(calibration) << nlohmann::json{
      {"version", 2},
      {"cores", 2},
      {"memory_bytes", 8e9},
      {"cache_bytes", 0},
      {"compute", {compute, both}},
      {"comm",
       {{"nproc", 2},
        {"all_reduce",
         {{{"bytes", 4096}, {"time_s", 1e-5}}, {{"bytes", 16777216}, {"time_s", 8e-3}}}}}}};
  const std::string model = std::string(BRIGADE_SOURCE_DIR) + "/examples/tiny.toml";
  auto plan = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {"plan",      "--hardware", "this-machine", "--calibration",
                                     calibration, "--model",    model,          "--gpus",
                                     "2",         "--json",     "--trials",     "20"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = run_brigade(argv);
    EXPECT_EQ(r.status, 0) << r.err;
    return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json{};
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

}  // namespace
}  // namespace brigade
