// The run's trace shows its incidents and stragglers (diag/trace_incidents.h):
// with `--trace 3` every generation traces its first 3 steps, so a kill of
// rank 1 after step 4 leaves trace.json (steps 1-3, before the fault) and
// trace.gen1.json (the restarted generation's first steps); the second
// carries the incident on its "incidents" track, detected after the last
// step traced before the fault and before the first step after it, its
// restart span ending within that first step, with the kind, rank, cause and
// the pointer to its own timeline, placed by clocks of one machine. A rank
// slowed 4x shows as a span on its own process's "straggler" track, from the
// step that named it to the launch's end (it never recovered).
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
using nlohmann::json;
using testing::read_jsonl;

const std::string kConfig = testing::small_config("checkpoint_every = 2\n");

json read_trace(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

double origin_us(const json& trace) {
  return trace.at("otherData").at("origin_unix_us").get<double>();
}

// Rank `rank`'s steps ("step N"; the step clock's sections share the
// category), by time.
std::vector<json> steps_of(const json& trace, int rank) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X" && e.value("cat", "") == "step" && e.at("pid") == rank + 1 &&
        e.at("name").get<std::string>().starts_with("step ")) {
      out.push_back(e);
    }
  }
  std::sort(out.begin(), out.end(), [](const json& a, const json& b) {
    return a.at("ts").get<double>() < b.at("ts").get<double>();
  });
  return out;
}

std::vector<json> marks(const json& trace, const std::string& category, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("cat", "") == category && e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

double end_of(const json& e) {
  return e.at("ts").get<double>() + e.value("dur", 0.0);
}

class TraceIncidentsTest : public ::testing::Test {
 protected:
  testing::SmallRun small_{"brigade_trace_incidents", kConfig};
  const fs::path& run_ = small_.run;
};

TEST_F(TraceIncidentsTest, AKilledRankShowsAsAnIncidentBetweenTheStepsAroundIt) {
  const auto result =
      small_.train(2, {"--set", "train.steps=8", "--trace", "3", "--inject", "kill:rank=1:step=4"});
  ASSERT_EQ(result.status, 0) << result.err;
  const json before = read_trace(run_ / "trace.json");
  const json after = read_trace(run_ / "trace.gen1.json");

  // The incident is marked where it happened, not in the trace before it.
  EXPECT_TRUE(marks(before, "incident", "i").empty()) << result.err;
  const std::vector<json> detected = marks(after, "incident", "i");
  ASSERT_EQ(detected.size(), 1u) << result.err;
  const json& args = detected[0].at("args");
  EXPECT_EQ(args.at("kind"), "crash") << args;
  EXPECT_EQ(args.at("rank"), 1) << args;
  EXPECT_EQ(args.at("node"), 0) << args;
  ASSERT_TRUE(args.at("cause").is_string()) << args;
  EXPECT_NE(args.at("cause").get<std::string>().find("rank 1"), std::string::npos) << args;
  ASSERT_TRUE(args.contains("timeline")) << args;
  EXPECT_TRUE(fs::exists(run_ / args.at("timeline").get<std::string>())) << args;
  // On a track of its own, named.
  bool named = false;
  for (const json& e : after.at("traceEvents")) {
    named =
        named || (e.at("ph") == "M" && e.at("name") == "process_name" &&
                  e.at("pid") == detected[0].at("pid") && e.at("args").at("name") == "incidents");
  }
  EXPECT_TRUE(named);
  // One machine: the agent's stamps and rank 0's zero share its boot id.
  EXPECT_EQ(after.at("otherData").value("marks_clock", "").rfind("rank 0's machine", 0), 0u)
      << after.at("otherData");

  // On the wall clock: after the last step traced before the fault (step
  // 3, trace.json), before the restarted generation's first step.
  const std::vector<json> old_steps = steps_of(before, 0);
  const std::vector<json> new_steps = steps_of(after, 0);
  ASSERT_EQ(old_steps.size(), 3u);
  ASSERT_EQ(new_steps.size(), 3u);
  const double detected_us = origin_us(after) + detected[0].at("ts").get<double>();
  EXPECT_GT(detected_us, origin_us(before) + end_of(old_steps.back()));
  EXPECT_LT(detected[0].at("ts").get<double>(), new_steps.front().at("ts").get<double>());

  // The restart: from the detection to the end of the first step after it.
  // The agent's stamp is each rank's heartbeat after the step's update, the
  // later one's: after both ranks' optimizer sections of that step, before
  // the step's span ends (2 ms for the two conversions to the wall clock).
  const std::vector<json> restart = marks(after, "incident", "X");
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_DOUBLE_EQ(restart[0].at("ts").get<double>(), detected[0].at("ts").get<double>());
  double updated = 0, first_end = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const json first = steps_of(after, rank).front();
    first_end = std::max(first_end, end_of(first));
    for (const json& e : after.at("traceEvents")) {
      if (e.at("ph") == "X" && e.at("pid") == rank + 1 && e.at("name") == "optimizer" &&
          e.at("ts").get<double>() >= first.at("ts").get<double>() && end_of(e) <= end_of(first)) {
        updated = std::max(updated, end_of(e));
      }
    }
  }
  ASSERT_GT(updated, 0) << "no optimizer section in the first step after the restart";
  EXPECT_GE(end_of(restart[0]), updated - 2000) << restart[0];
  EXPECT_LE(end_of(restart[0]), first_end + 2000) << restart[0];
  // Every time stays viewable (zero moved back for the detection).
  for (const json& e : after.at("traceEvents")) {
    if (e.contains("ts")) {
      EXPECT_GE(e.at("ts").get<double>(), 0.0) << e;
    }
  }
}

TEST_F(TraceIncidentsTest, ASlowRankShowsAsASpanOnItsOwnTrack) {
  const auto result = small_.train(
      2, {"--set", "train.steps=24", "--trace", "24", "--inject", "slow:rank=1:factor=4"});
  ASSERT_EQ(result.status, 0) << result.err;
  int64_t named_at = 0;
  for (const json& row : read_jsonl(run_ / "metrics.jsonl")) {
    if (row.contains("stragglers") && named_at == 0) named_at = row.at("step").get<int64_t>();
  }
  ASSERT_GT(named_at, 0) << "no straggler named: " << result.err;

  const json trace = read_trace(run_ / "trace.json");
  const std::vector<json> spans = marks(trace, "straggler", "X");
  ASSERT_EQ(spans.size(), 1u) << result.err;
  EXPECT_EQ(spans[0].at("pid"), 2) << spans[0];  // rank 1's process
  EXPECT_EQ(spans[0].at("args").at("rank"), 1) << spans[0];
  EXPECT_EQ(spans[0].at("args").at("section"), "compute") << spans[0];
  // From the step that named it (rank 0 writes the record within it) to the
  // end: the rank never recovered.
  const std::vector<json> steps = steps_of(trace, 0);
  ASSERT_EQ(steps.size(), 24u);
  const json& named_step = steps[static_cast<size_t>(named_at - 1)];
  EXPECT_GE(spans[0].at("ts").get<double>(), named_step.at("ts").get<double>() - 2000);
  EXPECT_LE(spans[0].at("ts").get<double>(), end_of(named_step) + 2000);
  EXPECT_GE(end_of(spans[0]), end_of(steps.back()) - 2000);
  // Ended by the launch's end (the summary's stamp), cut to the trace.
  EXPECT_EQ(spans[0].at("args").at("ended"), "the launch ended") << spans[0];
  // Its track is named, on rank 1's process only.
  bool track = false;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("tid") == spans[0].at("tid")) {
      EXPECT_EQ(e.at("pid"), 2) << e;
      track = track || e.at("args").at("name") == "straggler";
    }
  }
  EXPECT_TRUE(track);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
