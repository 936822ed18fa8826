// `brigade train --trace`: RUN_DIR/trace.json of a dp 2 and a pp 2 run.
// The file parses as a Chrome trace, every rank appears with its steps,
// its compute by micro-batch and layer, and its communication; spans on a
// lane nest; and the clocks line up: no rank finishes an all-reduce before
// every rank started it, also when rank 1's clock is skewed by 5 s and the
// offset has to be estimated.
#include "brigade/diag/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "testing/run_brigade.h"
#include "testing/scoped_env.h"
#include "testing/small_run.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_brigade;

const std::string kConfig =
    testing::small_config("steps = 6\ncheckpoint_every = 2\n", "[parallel]\nbucket_mb = 0.05\n");

class TraceTest : public ::testing::Test {
 protected:
  // Trains with `args` and returns trace.json's events.
  json train(std::vector<std::string> args) {
    const auto result = small_.train(0, args);
    EXPECT_EQ(result.status, 0) << result.err;
    EXPECT_NE(result.err.find("wrote " + (run_ / "trace.json").string()), std::string::npos)
        << result.err;
    std::ifstream in(run_ / "trace.json");
    json trace = json::parse(in);
    // Only trace.json stays: the ranks' parts are joined and removed.
    for (const auto& entry : fs::directory_iterator(run_)) {
      EXPECT_EQ(entry.path().filename().string().find(".part."), std::string::npos) << entry.path();
    }
    return trace;
  }

  testing::SmallRun small_{"brigade_trace", kConfig};
  const fs::path& config_ = small_.config;
  const fs::path& run_ = small_.run;
};

std::vector<json> spans(const json& trace) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") out.push_back(e);
  }
  return out;
}

std::set<std::string> names_of(const json& trace, int rank, const std::string& category) {
  std::set<std::string> names;
  for (const json& e : spans(trace)) {
    if (e.at("pid") == rank + 1 && e.value("cat", "") == category) names.insert(e.at("name"));
  }
  return names;
}

// What Perfetto needs to show it: processes from 1 (0 is the kernel's idle
// task), thread ids within 32 bits, no negative times; and each lane's
// complete events a stack, each within the one it starts in.
void expect_viewable(const json& trace) {
  for (const json& e : trace.at("traceEvents")) {
    EXPECT_GE(e.at("pid").get<int64_t>(), 1) << e;
    EXPECT_LT(e.at("tid").get<int64_t>(), int64_t{1} << 32) << e;
    if (e.contains("ts")) {
      EXPECT_GE(e.at("ts").get<double>(), 0.0) << e;
    }
  }
  std::map<std::pair<int, int64_t>, std::vector<json>> lanes;
  for (const json& e : spans(trace)) {
    lanes[{e.at("pid").get<int>(), e.at("tid").get<int64_t>()}].push_back(e);
  }
  for (auto& [lane, events] : lanes) {
    std::sort(events.begin(), events.end(), [](const json& a, const json& b) {
      const double ta = a.at("ts"), tb = b.at("ts");
      return ta != tb ? ta < tb : a.at("dur").get<double>() > b.at("dur").get<double>();
    });
    std::vector<double> open_ends;
    for (const json& e : events) {
      const double begin = e.at("ts"), end = begin + e.at("dur").get<double>();
      EXPECT_GE(e.at("dur").get<double>(), 0.0) << e;
      while (!open_ends.empty() && open_ends.back() <= begin) open_ends.pop_back();
      if (!open_ends.empty()) {
        EXPECT_LE(end, open_ends.back() + 1e-3) << "rank " << lane.first << ": " << e;
      }
      open_ends.push_back(end);
    }
  }
}

// An all-reduce completes on no rank before every rank started it: true of
// the operation, so what the file shows of it says whether the clocks are
// aligned. `slack_us`: the alignment's own error.
void expect_all_reduces_line_up(const json& trace, int ranks, double slack_us) {
  std::map<std::string, std::vector<json>> by_key;
  for (const json& e : spans(trace)) {
    if (e.value("cat", "") == "comm" &&
        e.at("name").get<std::string>().find("all_reduce") != std::string::npos) {
      by_key[e.at("args").at("key")].push_back(e);
    }
  }
  ASSERT_GE(by_key.size(), 4u);
  for (const auto& [key, events] : by_key) {
    ASSERT_EQ(events.size(), static_cast<size_t>(ranks)) << key;
    double last_start = -1e300, first_end = 1e300;
    for (const json& e : events) {
      last_start = std::max(last_start, e.at("ts").get<double>());
      first_end = std::min(first_end, e.at("ts").get<double>() + e.at("dur").get<double>());
    }
    EXPECT_LE(last_start, first_end + slack_us) << key;
  }
}

TEST_F(TraceTest, DataParallelRanksShareOneTimeline) {
  const json trace = train({"--nproc", "2", "--trace", "2:4"});
  EXPECT_EQ(trace.at("otherData").at("steps"), "2-4");
  for (int rank = 0; rank < 2; ++rank) {
    const std::set<std::string> steps = names_of(trace, rank, "step");
    EXPECT_TRUE(steps.count("step 2") && steps.count("step 4") && !steps.count("step 1") &&
                !steps.count("step 5"))
        << rank;
    EXPECT_TRUE(steps.count("compute") && steps.count("optimizer") && steps.count("comm"));
    const std::set<std::string> compute = names_of(trace, rank, "compute");
    for (const char* name : {"forward 0", "forward 1", "backward 1", "block forward 0",
                             "block forward 1", "block backward 0", "lm head and loss"}) {
      EXPECT_TRUE(compute.count(name)) << "rank " << rank << " has no " << name;
    }
    // The checkpoint of step 2 is written in the background, on its own
    // lane, before step 4's may start.
    EXPECT_TRUE(names_of(trace, rank, "ckpt").count("write checkpoint 2")) << rank;
  }
  bool named = false;
  for (const json& e : trace.at("traceEvents")) {
    named |= e.at("ph") == "M" && e.at("name") == "process_name" && e.at("pid") == 2 &&
             e.at("args").at("name") == "rank 1 (node 0)";
  }
  EXPECT_TRUE(named);
  EXPECT_NE(trace.at("otherData").at("clock").get<std::string>().find("exact"), std::string::npos);
  expect_viewable(trace);
  expect_all_reduces_line_up(trace, 2, 0.0);
}

TEST_F(TraceTest, ASkewedClockIsEstimatedAndTheCollectivesStillLineUp) {
  testing::ScopedEnv env;
  env.set(diag::kSkewVariable, "5000000000");  // rank 1 reads 5 s ahead
  const json trace = train({"--nproc", "2", "--trace", "2:3", "--set", "train.steps=3"});
  const json& ranks = trace.at("otherData").at("ranks");
  ASSERT_EQ(ranks.size(), 2u);
  const double offset = ranks.at(1).at("clock_offset_us");
  // Within 0.1 s of the 5 s: the exchange, not the shared clock, aligned it
  // (rounds a loaded core delays stay well inside that).
  EXPECT_NEAR(offset, 5e6, 1e5) << trace.at("otherData");
  expect_viewable(trace);
  // The estimate's error is the barrier's release skew: milliseconds at
  // most; 5 s off would not line up.
  expect_all_reduces_line_up(trace, 2, 1e5);
}

TEST_F(TraceTest, PipelineStagesShowTheirBubblesAndSendsAndReceives) {
  const json trace =
      train({"--nproc", "2", "--set", "parallel.pp=2", "--trace", "3", "--set", "train.steps=3"});
  EXPECT_EQ(trace.at("otherData").at("steps"), "1-3");
  // The last stage waits for activations, the first for gradients.
  const std::set<std::string> first = names_of(trace, 0, "bubble");
  const std::set<std::string> last = names_of(trace, 1, "bubble");
  EXPECT_TRUE(first.count("wait gradient 0")) << trace.dump().substr(0, 2000);
  EXPECT_TRUE(last.count("wait activation 0"));
  EXPECT_FALSE(names_of(trace, 1, "compute").count("block forward 0")) << "stage 1 has layer 1";
  EXPECT_TRUE(names_of(trace, 1, "compute").count("block forward 1"));
  // 1F1B's backward is whole: the LM head's weight gradient stays fused
  // with its loss, in the forward.
  EXPECT_FALSE(names_of(trace, 1, "compute").count("lm head weight"));
  // Every send and receive is an async span that ends after it begins; what
  // one stage sends, the other receives.
  std::map<std::string, double> begun, ended;
  std::map<std::string, int> count;  // "<pid> send" / "<pid> recv"
  for (const json& e : trace.at("traceEvents")) {
    if (e.value("cat", "") != "p2p") continue;
    const std::string pid = std::to_string(e.at("pid").get<int>());
    const std::string id = pid + ":" + e.at("id2").at("local").get<std::string>();
    EXPECT_EQ((e.at("ph") == "b" ? begun : ended).count(id), 0u) << e;
    (e.at("ph") == "b" ? begun : ended)[id] = e.at("ts");
    if (e.at("ph") == "b") {
      const bool send = e.at("name").get<std::string>().find(" send(") != std::string::npos;
      count[pid + (send ? " send" : " recv")] += 1;
    }
  }
  EXPECT_GE(begun.size(), 4u);
  ASSERT_EQ(begun.size(), ended.size());
  for (const auto& [id, ts] : begun) {
    ASSERT_TRUE(ended.count(id)) << id;
    EXPECT_GE(ended.at(id), ts) << id;
  }
  EXPECT_GT(count["1 send"], 0);
  EXPECT_EQ(count["1 send"], count["2 recv"]);
  EXPECT_EQ(count["2 send"], count["1 recv"]);
  expect_viewable(trace);
}

// The spans of `rank` named `name`, and those whose name begins with
// `outer`, with each of the first inside one of the second on its thread.
int64_t count_inside(const json& trace, int rank, const std::string& name,
                     const std::string& outer) {
  std::vector<json> inner, outers;
  for (const json& e : spans(trace)) {
    if (e.at("pid") != rank + 1) continue;
    const std::string n = e.at("name");
    if (n == name) inner.push_back(e);
    if (n.rfind(outer, 0) == 0) outers.push_back(e);
  }
  for (const json& e : inner) {
    const double begin = e.at("ts"), end = begin + e.at("dur").get<double>();
    const bool inside = std::any_of(outers.begin(), outers.end(), [&](const json& o) {
      const double ob = o.at("ts"), oe = ob + o.at("dur").get<double>();
      return o.at("tid") == e.at("tid") && ob <= begin && end <= oe + 1e-3;
    });
    EXPECT_TRUE(inside) << name << " outside every " << outer << ": " << e;
  }
  return static_cast<int64_t>(inner.size());
}

// ZB-H1 defers the LM head's weight gradient (a (V,C) GEMM over every row)
// into each micro-batch's W on the last stage, as it does the blocks'; the
// loss and the head's input gradient stay in the forward.
TEST_F(TraceTest, ZbH1RunsTheLmHeadsWeightGradientInTheWeightPass) {
  const json trace =
      train({"--nproc", "2", "--set", "parallel.pp=2", "--set", "parallel.schedule=\"zb-h1\"",
             "--trace", "3", "--set", "train.steps=3"});
  // Three steps of grad_accum 2 micro-batches: one of each per micro-batch.
  EXPECT_EQ(count_inside(trace, 1, "lm head weight", "backward weight "), 6);
  EXPECT_EQ(count_inside(trace, 1, "lm head and loss", "forward "), 6);
  EXPECT_EQ(count_inside(trace, 0, "lm head weight", "backward weight "), 0);
  expect_viewable(trace);
}

// A window the run ends inside of is written at the end, with the steps
// it saw.
TEST_F(TraceTest, OneProcessWritesItsTraceTooWhenTheRunEndsInTheWindow) {
  const json trace = train({"--trace", "5:9", "--set", "train.threads=1"});
  EXPECT_EQ(trace.at("otherData").at("steps"), "5-9");
  const std::set<std::string> steps = names_of(trace, 0, "step");
  EXPECT_TRUE(steps.count("step 5") && steps.count("step 6") && !steps.count("step 4")) << trace;
  EXPECT_TRUE(names_of(trace, 0, "compute").count("block backward 1"));
  expect_viewable(trace);
}

TEST_F(TraceTest, BadStepsAreRefusedBeforeTrainingAndStepsOutsideTheRunTraceNothing) {
  // With --nproc: once, by the launcher, before any worker starts.
  const auto launched = small_.train(2, {"--trace", "x"});
  EXPECT_NE(launched.status, 0);
  const size_t said = launched.err.find("expected steps as A:B");
  ASSERT_NE(said, std::string::npos) << launched.err;
  EXPECT_EQ(launched.err.find("expected steps as A:B", said + 1), std::string::npos)
      << launched.err;
  EXPECT_EQ(launched.err.find("worker"), std::string::npos) << launched.err;
  for (const char* bad : {"0:2", "3:1", "x", "2:"}) {
    const auto result =
        run_brigade({"train", config_.string(), "--set", "train.run_dir=\"" + run_.string() + "\"",
                     "--trace", bad, "--set", "train.threads=1"});
    EXPECT_NE(result.status, 0) << bad;
    EXPECT_NE(result.err.find("expected steps as A:B"), std::string::npos) << result.err;
    EXPECT_FALSE(fs::exists(run_ / "metrics.jsonl")) << bad;
  }
  const auto result =
      run_brigade({"train", config_.string(), "--set", "train.run_dir=\"" + run_.string() + "\"",
                   "--trace", "7:9", "--set", "train.threads=1"});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.err.find("diag.trace: steps 7-9 are outside this run's steps 1-6: no trace"),
            std::string::npos)
      << result.err;
  EXPECT_FALSE(fs::exists(run_ / "trace.json"));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
