// Stragglers end to end: `--inject slow:rank=1:factor=4` on a dp 2 run gets
// a line naming rank 1 and its node within 20 steps (and none naming rank
// 0), a record in metrics.jsonl and one in incidents.jsonl (no restart); a
// clean run of 100 steps gets none, and neither does a pipeline whose
// stages do unequal work (each stage alone: no peers, no check, said once).
// The longer clean check is straggler_slow_test.cc. Factor 4, not the
// issue's 2: on a loaded 2-core machine a 2x rank's score can sit near the
// threshold (straggler.h); the 2x case is the detector's unit test.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/small_run.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::read_failures;
using testing::read_jsonl;

// Steps of about 10 ms, for the injected run.
const std::string kConfig = testing::small_config();

// Steps of 30-70 ms (quiet to loaded machine), for the clean runs: a time
// slice lost to another process is a small part of one.
constexpr char kCleanConfig[] = R"([model]
n_layer = 2
n_head = 2
n_embd = 128
block_size = 128
vocab_size = 64
[train]
micro_batch = 2
grad_accum = 2
[data]
synthetic = true
)";

// Two workers train CONFIG in a fresh run directory (run_) with the extra
// command-line arguments.
class Straggler : public ::testing::Test {
 protected:
  testing::Output train(const std::string& config, std::vector<std::string> extra) {
    std::ofstream(small_.config) << config;
    return small_.train(2, extra);
  }

  testing::SmallRun small_{"brigade_straggler"};
  const fs::path& run_ = small_.run;
};

TEST_F(Straggler, ASlowRankIsNamedWithin20StepsOnce) {
  const auto result =
      train(kConfig, {"--set", "train.steps=40", "--inject", "slow:rank=1:factor=4"});
  ASSERT_EQ(result.status, 0) << result.err;
  const size_t at = result.err.find("straggler: ");
  ASSERT_NE(at, std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("straggler: rank 1 (node 0) computes ", at), at) << result.err;
  EXPECT_NE(result.err.find("(section: compute", at), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("straggler: rank 0 "), std::string::npos) << result.err;

  // The record beside the step that named it, and the incident-like one.
  nlohmann::json record;
  int64_t named_at = 0;
  for (const auto& row : read_jsonl(run_ / "metrics.jsonl")) {
    if (!row.contains("stragglers") || !record.is_null()) continue;
    ASSERT_EQ(row.at("stragglers").size(), 1u);
    record = row.at("stragglers").at(0);
    named_at = row.at("step").get<int64_t>();
  }
  ASSERT_FALSE(record.is_null()) << "no straggler record in metrics.jsonl";
  EXPECT_EQ(record.at("kind"), "straggler");
  EXPECT_EQ(record.at("rank"), 1);
  EXPECT_EQ(record.at("node"), 0);
  EXPECT_EQ(record.at("section"), "compute");
  // 4x: its compute is a quarter on the CPU and three quarters asleep,
  // both its own; the margin is for a loaded machine.
  EXPECT_GT(record.at("ratio").get<double>(), 2.5);
  // The fault is on from step 1.
  EXPECT_LE(named_at, 20);
  EXPECT_EQ(record.at("last_step").get<int64_t>(), named_at);
  int incidents = 0;
  for (const auto& line : read_jsonl(run_ / "incidents.jsonl")) {
    if (line.value("kind", "") != "straggler") continue;
    ++incidents;
    EXPECT_EQ(line.at("restart"), false);
    EXPECT_EQ(line.at("rank"), 1);
    EXPECT_EQ(line.at("what").get<std::string>().rfind("straggler: rank 1 (node 0)", 0), 0u);
  }
  EXPECT_GE(incidents, 1);
}

// A straggler episode is written to incidents.jsonl beside the failures but
// is not one: the run's summary counts the crash alone, as does every test
// that reads a run's failures through read_failures.
TEST_F(Straggler, AnEpisodeBesideACrashIsNotCountedAsAnIncident) {
  const auto result = train(
      kConfig, {"--set", "train.steps=40", "--inject", "slow:rank=1:factor=4,kill:rank=0:step=30"});
  ASSERT_EQ(result.status, 0) << result.err;
  const auto all = read_jsonl(run_ / "incidents.jsonl");
  const auto episodes = std::count_if(all.begin(), all.end(), [](const nlohmann::json& line) {
    return line.value("kind", "").starts_with("straggler");
  });
  EXPECT_GE(episodes, 1) << result.err;
  const auto failures = read_failures(run_ / "incidents.jsonl");
  ASSERT_EQ(failures.size(), 2u) << result.err;
  EXPECT_EQ(failures[0].at("kind"), "crash") << failures[0];
  EXPECT_EQ(failures[0].at("rank"), 0) << failures[0];
  EXPECT_EQ(failures[1].at("kind"), "summary") << failures[1];
  EXPECT_EQ(failures[1].at("incidents"), 1) << failures[1];
}

TEST_F(Straggler, ACleanRunOf100StepsNamesNone) {
  const auto result = train(kCleanConfig, {"--set", "train.steps=100"});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.err.find("straggler: "), std::string::npos) << result.err;
  // The detector saw every rank's compute: the per-rank series is there.
  int steps = 0;
  for (const auto& row : read_jsonl(run_ / "metrics.jsonl")) {
    if (!row.contains("loss")) continue;
    ++steps;
    EXPECT_EQ(row.at("compute_ms_per_rank").size(), 2u);
  }
  EXPECT_EQ(steps, 100);
  EXPECT_EQ(result.err.find("no straggler check"), std::string::npos) << result.err;
}

// Stage 1 has three blocks and the LM head, stage 0 one block: against each
// other stage 1 computes several times as long every step. Each is alone
// in its stage, so neither is checked, and the run says so once.
TEST_F(Straggler, APipelineOfUnequalStagesNamesNone) {
  const auto result = train(R"([model]
n_layer = 4
n_head = 2
n_embd = 64
block_size = 64
vocab_size = 64
[train]
micro_batch = 4
grad_accum = 2
[data]
synthetic = true
)",
                            {"--set", "train.steps=40", "--set", "parallel.pp=2", "--set",
                             "parallel.stage_layers=[1, 3]"});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.err.find("straggler: "), std::string::npos) << result.err;
  const std::string note = "no straggler check for ranks 0, 1 (pipeline stages 0, 1)";
  const size_t at = result.err.find(note);
  EXPECT_NE(at, std::string::npos) << result.err;
  EXPECT_EQ(result.err.find(note, at + 1), std::string::npos) << "said once: " << result.err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
