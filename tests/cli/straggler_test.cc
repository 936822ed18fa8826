// Stragglers end to end: `--inject slow:rank=1:factor=2` on a dp 2 run gets
// one line naming rank 1 and its node within 20 steps, a record in
// metrics.jsonl and one in incidents.jsonl (no restart); a clean run of 100
// steps gets none. The 1,000-step clean check is straggler_slow_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::run_brigade;

constexpr char kConfig[] = R"([model]
n_layer = 2
n_head = 2
n_embd = 64
block_size = 64
vocab_size = 64
[train]
micro_batch = 4
grad_accum = 2
[data]
synthetic = true
)";

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::vector<nlohmann::json> read_lines(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(Straggler, ASlowRankIsNamedWithin20StepsOnce) {
  testing::TempDir dir("brigade_straggler");
  const fs::path run = dir.path() / "run";
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << kConfig;
  const auto result =
      run_brigade({"train", "--nproc", "2", config.string(), "--set", "train.steps=40", "--inject",
                   "slow:rank=1:factor=2", "--set", "train.run_dir=\"" + run.string() + "\""});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(count(result.err, "straggler: "), 1) << result.err;
  const size_t at = result.err.find("straggler: rank 1 (node 0) computes ");
  ASSERT_NE(at, std::string::npos) << result.err;
  EXPECT_NE(result.err.find("(section: compute", at), std::string::npos) << result.err;

  // The record beside the step that named it, and the incident-like one.
  nlohmann::json record;
  int64_t named_at = 0;
  for (const auto& row : read_lines(run / "metrics.jsonl")) {
    if (!row.contains("stragglers")) continue;
    ASSERT_EQ(row.at("stragglers").size(), 1u);
    record = row.at("stragglers").at(0);
    named_at = row.at("step").get<int64_t>();
  }
  ASSERT_FALSE(record.is_null()) << "no straggler record in metrics.jsonl";
  EXPECT_EQ(record.at("kind"), "straggler");
  EXPECT_EQ(record.at("rank"), 1);
  EXPECT_EQ(record.at("node"), 0);
  EXPECT_EQ(record.at("section"), "compute");
  EXPECT_GE(record.at("ratio").get<double>(), 1.5);
  // The fault is on from step 1.
  EXPECT_LE(named_at, 20);
  EXPECT_EQ(record.at("last_step").get<int64_t>(), named_at);
  int incidents = 0;
  for (const auto& line : read_lines(run / "incidents.jsonl")) {
    if (line.value("kind", "") != "straggler") continue;
    ++incidents;
    EXPECT_EQ(line.at("restart"), false);
    EXPECT_EQ(line.at("rank"), 1);
    EXPECT_EQ(line.at("what").get<std::string>().rfind("straggler: rank 1 (node 0)", 0), 0u);
  }
  EXPECT_EQ(incidents, 1);
}

TEST(Straggler, ACleanRunOf100StepsNamesNone) {
  testing::TempDir dir("brigade_straggler");
  const fs::path run = dir.path() / "run";
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << kConfig;
  const auto result =
      run_brigade({"train", "--nproc", "2", config.string(), "--set", "train.steps=100", "--set",
                   "train.run_dir=\"" + run.string() + "\""});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.err.find("straggler: "), std::string::npos) << result.err;
  // The detector saw every rank's compute: the per-rank series is there.
  int steps = 0;
  for (const auto& row : read_lines(run / "metrics.jsonl")) {
    if (!row.contains("loss")) continue;
    ++steps;
    EXPECT_EQ(row.at("section_compute_ms_per_rank").size(), 2u);
  }
  EXPECT_EQ(steps, 100);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
