// `brigade plan` end to end: search, one layout, sweep, validation and the
// errors a user can make.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

using testing::run_brigade;

TEST(PlanCommand, SearchPrintsFittingLayoutsLosersAndCheckpointing) {
  const auto r = run_brigade({"plan", "--model", "175b", "--gpus", "1024", "--hardware", "h100-80g",
                              "--json", "--trials", "200"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j.at("layouts").empty());
  double previous = 0;
  for (const nlohmann::json& l : j.at("layouts")) {
    EXPECT_TRUE(l.at("fits").get<bool>());
    const nlohmann::json& layout = l.at("layout");
    EXPECT_EQ(layout.at("tp").get<int>() * layout.at("pp").get<int>() * layout.at("dp").get<int>(),
              1024);
    EXPECT_LE(l.at("memory_gib").at("total").get<double>(), 80.0);
    EXPECT_GE(l.at("step_time_s").get<double>(), previous);
    previous = l.at("step_time_s").get<double>();
  }
  EXPECT_FALSE(j.at("losers").empty());
  EXPECT_GT(j.at("evaluated").get<int64_t>(), 1000);
  const nlohmann::json& ckpt = j.at("checkpointing");
  // 128 nodes at 6,300 node-hours each: a failure every ~49 h.
  EXPECT_NEAR(ckpt.at("job_mtbf_hours").get<double>(), 6300.0 / 128.0, 1e-9);
  EXPECT_GT(ckpt.at("interval_s").get<double>(), 0.0);
  EXPECT_GT(ckpt.at("monte_carlo").at("ettr_mean").get<double>(), 0.5);
  EXPECT_LT(ckpt.at("monte_carlo").at("ettr_mean").get<double>(), 1.0);
}

TEST(PlanCommand, OneLayoutReportsTflopsTheWayMegatronCounts) {
  const auto r = run_brigade(
      {"plan", "--model", "175b", "--gpus", "1024", "--hardware", "a100-80g", "--layout",
       "tp=8,pp=8,dp=16,vp=1,zero=1,recompute=full,sp=false,micro=1", "--json", "--trials", "100"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const double step = j.at("step_time_s").get<double>();
  EXPECT_GT(step, 0.0);
  // TFLOP/s counts the recompute forward (96 B s L h^2 (1 + s/6h + V/16Lh)),
  // MFU does not (72 ... (1 + s/6h + V/12Lh)): their ratio is fixed by the
  // shape. GPT-3: s/6h = 2048/73728, V/16Lh and V/12Lh with V 51200.
  const double s = 2048, h = 12288, L = 96, V = 51200;
  const double ratio =
      96.0 * (1 + s / (6 * h) + V / (16 * L * h)) / (72.0 * (1 + s / (6 * h) + V / (12 * L * h)));
  EXPECT_NEAR(j.at("tflops_per_gpu").get<double>() / (j.at("mfu").get<double>() * 312.0), ratio,
              1e-9);
  // tokens/s is the batch over the step.
  EXPECT_NEAR(j.at("tokens_per_s").get<double>(), 1536.0 * 2048.0 / step, 1e-6);
}

TEST(PlanCommand, TheScheduleIsPartOfTheLayout) {
  // The search chooses a schedule and prints it with the layout.
  const auto r = run_brigade({"plan", "--model", "175b", "--gpus", "1024", "--hardware", "h100-80g",
                              "--json", "--trials", "50"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const nlohmann::json& l : j.at("layouts")) {
    const std::string kind = l.at("layout").at("schedule").get<std::string>();
    EXPECT_TRUE(kind == "gpipe" || kind == "1f1b" || kind == "interleaved" || kind == "zb-h1")
        << kind;
    EXPECT_NE(l.at("layout_string").get<std::string>().find("schedule=" + kind), std::string::npos);
  }
  const auto text = run_brigade(
      {"plan", "--model", "175b", "--gpus", "1024", "--hardware", "h100-80g", "--trials", "50"});
  EXPECT_NE(text.out.find("recompute  sp    schedule"), std::string::npos) << text.out;
  // One layout under two schedules: ZB-H1 idles less than 1F1B.
  auto bubble = [](const std::string& kind) {
    const auto one = run_brigade(
        {"plan", "--model", "175b", "--gpus", "256", "--hardware", "h100-80g", "--layout",
         "tp=8,pp=8,dp=4,zero=1,micro=1,schedule=" + kind, "--json", "--trials", "50"});
    EXPECT_EQ(one.status, 0) << one.err;
    return nlohmann::json::parse(one.out).at("time_s").at("bubble").get<double>();
  };
  EXPECT_LT(bubble("zb-h1"), 0.7 * bubble("1f1b"));
  const auto bad = run_brigade({"plan", "--model", "175b", "--gpus", "256", "--layout",
                                "tp=8,pp=8,dp=4,schedule=pipedream"});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("known: gpipe, 1f1b, interleaved, zb-h1"), std::string::npos) << bad.err;
}

TEST(PlanCommand, ALayoutThatDoesNotFitExitsThree) {
  const auto r = run_brigade({"plan", "--model", "175b", "--gpus", "8", "--hardware", "a100-80g",
                              "--layout", "tp=8,pp=1,dp=1,micro=1"});
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
}

TEST(PlanCommand, NothingToShowStillAnswersInJson) {
  // 7 GPUs: tp must divide a node's 8, so only tp=1 and dp=7, which does not
  // divide a batch of 512: no layout can run.
  const auto none = run_brigade({"plan", "--model", "1.7b", "--gpus", "7", "--json"});
  EXPECT_EQ(none.status, 3);
  const nlohmann::json j = nlohmann::json::parse(none.out);
  EXPECT_EQ(j.at("evaluated").get<int>(), 0);
  EXPECT_NE(j.at("common_invalid").get<std::string>().find("not a multiple of dp"),
            std::string::npos);
  const auto text = run_brigade({"plan", "--model", "1.7b", "--gpus", "7"});
  EXPECT_NE(text.out.find("no layout can run this job on 7 GPUs"), std::string::npos) << text.out;
  // 1T on one node: everything valid is out of memory.
  const auto oom = run_brigade({"plan", "--model", "1t", "--gpus", "8", "--hardware", "a100-80g"});
  EXPECT_EQ(oom.status, 3);
  EXPECT_NE(oom.out.find("no layout fits in memory"), std::string::npos) << oom.out;
}

TEST(PlanCommand, EveryDeviceGivesFiniteAnswers) {
  for (const char* device : {"a100-80g", "h100-80g", "h200"}) {
    const auto r = run_brigade({"plan", "--model", "7.5b", "--gpus", "64", "--hardware", device,
                                "--json", "--trials", "50"});
    ASSERT_EQ(r.status, 0) << device << ": " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const nlohmann::json& best = j.at("layouts").at(0);
    ASSERT_TRUE(best.at("step_time_s").is_number()) << device;
    const double mfu = best.at("mfu").get<double>();
    EXPECT_GT(mfu, 0.1) << device;
    EXPECT_LT(mfu, 1.0) << device;
  }
  // The H200 is an H100 with more and faster memory: never slower.
  auto step = [](const char* device) {
    const auto r =
        run_brigade({"plan", "--model", "175b", "--gpus", "256", "--hardware", device, "--layout",
                     "tp=8,pp=8,dp=4,zero=1,micro=1", "--json", "--trials", "50"});
    return nlohmann::json::parse(r.out).at("step_time_s").get<double>();
  };
  EXPECT_LE(step("h200"), step("h100-80g"));
  EXPECT_LT(step("h100-80g"), step("a100-80g"));
}

TEST(PlanCommand, SweepShowsEveryScale) {
  const auto r = run_brigade(
      {"plan", "--model", "175b", "--hardware", "h100-80g", "--sweep-gpus", "1024:4096", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("points").size(), 3u);
  EXPECT_EQ(j.at("points")[2].at("gpus").get<int>(), 4096);
  for (const nlohmann::json& p : j.at("points")) {
    ASSERT_TRUE(p.at("feasible").get<bool>());
    EXPECT_GT(p.at("fastest").at("mfu").get<double>(), 0.0);
  }
}

TEST(PlanCommand, ValidatePrintsEveryPublishedRow) {
  const auto r = run_brigade({"plan", "--validate", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GE(j.at("rows").size(), 6u);
  EXPECT_LE(j.at("calibration_mean_abs_error").get<double>(), 0.05);
  EXPECT_LE(j.at("calibration_max_abs_error").get<double>(), 0.10);
  const auto text = run_brigade({"plan", "--validate"});
  EXPECT_NE(text.out.find("Narayanan et al. 2021"), std::string::npos);
  EXPECT_NE(text.out.find("calibration rows: mean |error|"), std::string::npos);
}

TEST(PlanCommand, ThisMachineReadsItsCalibration) {
  testing::TempDir dir;
  const std::string path = (dir.path() / "calibration.json").string();
  // Two cores; 100 GFLOP/s per thread flat (of a 250 peak), 50 GB/s; 2 workers
  // all-reduce 16 MiB in 8 ms.
  nlohmann::json cal = {
      {"version", 2},
      {"cores", 2},
      {"memory_bytes", 8e9},
      {"cache_bytes", 0},
      {"compute",
       {{{"threads", 1},
         {"peak_gflops", 250.0},
         {"gemm", {{1e6, 100.0}, {1e9, 100.0}}},
         {"stream_bytes_per_s", 25e9},
         {"cache_stream_bytes_per_s", 25e9},
         {"adamw_params_per_s", 300e6},
         {"refault_bytes_per_s", 1e9},
         {"attention_gflops", 50.0},
         {"kernel_overhead_s", 2e-6}},
        {{"threads", 2},
         {"peak_gflops", 500.0},
         {"gemm", {{1e6, 200.0}, {1e9, 200.0}}},
         {"stream_bytes_per_s", 50e9},
         {"cache_stream_bytes_per_s", 50e9},
         {"adamw_params_per_s", 600e6},
         {"refault_bytes_per_s", 2e9},
         {"attention_gflops", 100.0},
         {"kernel_overhead_s", 2e-6}}}},
      {"comm",
       {{"nproc", 2},
        {"all_reduce",
         {{{"bytes", 4096}, {"time_s", 1e-5}}, {{"bytes", 16777216}, {"time_s", 8e-3}}}}}}};
  std::ofstream(path) << cal.dump();
  const std::string model = std::string(BRIGADE_SOURCE_DIR) + "/examples/tiny.toml";
  auto plan = [&](const std::string& gpus, const std::string& layout) {
    return run_brigade({"plan", "--hardware", "this-machine", "--calibration", path, "--model",
                        model, "--gpus", gpus, "--global-batch", gpus == "1" ? "8" : "16",
                        "--layout", layout, "--json", "--trials", "50"});
  };
  const auto one = plan("1", "dp=1,micro=8");
  ASSERT_EQ(one.status, 0) << one.err;
  const auto two = plan("2", "dp=2,micro=8,zero=1");
  ASSERT_EQ(two.status, 0) << two.err;
  const nlohmann::json j1 = nlohmann::json::parse(one.out), j2 = nlohmann::json::parse(two.out);
  // One process computes at 200 GFLOP/s on both cores; each of two workers
  // gets one core (100) for the same 8 sequences: twice the compute time
  // (less the fixed per-kernel cost), plus the exchange of the 3.3M fp32
  // gradients (ZeRO 1: reduce-scatter + all-gather of 13 MB at 2.1 GB/s,
  // ~6 ms), which the cores pay for themselves.
  const double c1 = j1.at("time_s").at("compute").get<double>();
  const double c2 = j2.at("time_s").at("compute").get<double>();
  EXPECT_NEAR(c2, 2.0 * c1, 0.05 * c2);
  EXPECT_NEAR(j2.at("time_s").at("dp_exposed").get<double>(), 2 * 0.5 * 13.2e6 / 2.097e9, 0.001);
  // MFU is against the machine's peak (500 on both cores), as `brigade
  // train` reports it, not against the GEMMs' 200: the step's model FLOPs
  // (tflops_per_gpu x step, no recompute here) over step x peak.
  const double step1 = j1.at("step_time_s").get<double>();
  EXPECT_NEAR(j1.at("mfu").get<double>(),
              j1.at("tflops_per_gpu").get<double>() * 1e12 * step1 / (step1 * 500e9),
              1e-9 * j1.at("mfu").get<double>());
  // Two namespace nodes of two workers (--one-machine): the 13 MB of
  // gradients cross the link once per leader; Gloo measured at 0.5 GB/s,
  // the staged shm path of the node step at 1 GB/s.
  cal["comm"]["gloo_all_reduce"] = {{{"bytes", 4096}, {"time_s", 1e-4}},
                                    {{"bytes", 16777216}, {"time_s", 16777216.0 / 0.5e9}}};
  cal["comm"]["staged_all_reduce"] = {{{"bytes", 4096}, {"time_s", 2e-5}},
                                      {{"bytes", 16777216}, {"time_s", 16777216.0 / 1e9}}};
  std::ofstream(path) << cal.dump();
  auto across = [&](const std::string& link) {
    const auto r = run_brigade({"plan",
                                "--hardware",
                                "this-machine",
                                "--calibration",
                                path,
                                "--model",
                                model,
                                "--gpus",
                                "4",
                                "--global-batch",
                                "16",
                                "--layout",
                                "dp=4,micro=4",
                                "--nodes",
                                "2",
                                "--link",
                                link,
                                "--one-machine",
                                "--json",
                                "--trials",
                                "50"});
    EXPECT_EQ(r.status, 0) << r.err;
    return nlohmann::json::parse(r.out).at("time_s").at("dp_exposed").get<double>();
  };
  const double slow = across("100mbit"), fast = across("10gbit");
  // The gradients: tiny's 4 blocks of 12 h^2 + 13 h (h = 256), embeddings
  // of 256 + 128 positions, the final LayerNorm: 3,257,856 fp32 values.
  // One bucket, one micro-batch: all of the exchange shows. Both rates
  // give the two node steps (the members' all-reduce and the leader's
  // broadcast), which all 4 workers run at once on the 2 cores: S at half
  // of 1 GB/s and 2 hops of 10 us each. Between them the 2 leaders' ring
  // (2 hops of 50 us): 100 Mbit carries ~12 MB/s of payload, about a
  // second for S; at 10 Gbit the cores' TCP at 0.5 GB/s is the limit (2
  // leaders on 2 cores, as calibrated).
  const double grads = 4.0 * 3257856;
  const double node_steps = 2 * (grads / 0.5e9 + 2 * 1e-5);
  const double slow_expected = node_steps + grads / (12.5e6 * 1448.0 / 1514.0) + 2 * 5e-5;
  const double fast_expected = node_steps + grads / 0.5e9 + 2 * 5e-5;
  EXPECT_NEAR(slow, slow_expected, 1e-6 * slow_expected);
  EXPECT_NEAR(fast, fast_expected, 1e-6 * fast_expected);
  nlohmann::json broken = cal;
  broken.erase("comm");
  std::ofstream(path) << broken.dump();
  const auto bad = plan("1", "dp=1,micro=8");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("\"comm\""), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("brigade bench calibrate"), std::string::npos) << bad.err;
}

TEST(PlanCommand, CalibrateReusesEarlierAllReduceFigures) {
  // `bench calibrate --comm-from` measures the compute figures (seconds) and
  // copies the all-reduce rows; plan reads the result.
  testing::TempDir dir;
  const std::string earlier = (dir.path() / "earlier.json").string();
  const std::string fresh = (dir.path() / "fresh.json").string();
  const nlohmann::json comm = {
      {"nproc", 2},
      {"all_reduce",
       {{{"bytes", 4096}, {"time_s", 1e-5}}, {{"bytes", 16777216}, {"time_s", 8e-3}}}}};
  std::ofstream(earlier) << nlohmann::json{{"comm", comm}}.dump();
  // Calibration times this machine: about 10 s alone, minutes on a loaded
  // one (it took over 120 s with both cores busy); the bound only catches a hang.
  const auto r = run_brigade({"bench", "calibrate", "--comm-from", earlier, "--out", fresh},
                             std::chrono::seconds(540));
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(fresh);
  const nlohmann::json written = nlohmann::json::parse(in);
  EXPECT_EQ(written.at("comm"), comm);
  ASSERT_FALSE(written.at("compute").empty());
  for (const nlohmann::json& c : written.at("compute")) {
    EXPECT_GT(c.at("gemm").back().at(1).get<double>(), 0.1);  // GFLOP/s of a real sgemm
    EXPECT_GT(c.at("adamw_params_per_s").get<double>(), 1e6);
    // The machine's peak for these threads: at least every GEMM it measured,
    // and at least the FMA figure (kernels/cpu/fma_peak.h).
    const double peak = c.at("peak_gflops").get<double>();
    for (const nlohmann::json& point : c.at("gemm")) EXPECT_GE(peak, point.at(1).get<double>());
    EXPECT_EQ(c.at("fma_peak").at("threads"), c.at("threads"));
    EXPECT_GE(peak, c.at("fma_peak").at("gflops").get<double>());
    EXPECT_NE(c.at("peak_description").get<std::string>().find(" GHz"), std::string::npos);
  }
  const std::string model = std::string(BRIGADE_SOURCE_DIR) + "/examples/tiny.toml";
  const auto plan =
      run_brigade({"plan", "--hardware", "this-machine", "--calibration", fresh, "--model", model,
                   "--gpus", "1", "--layout", "dp=1,micro=8", "--json", "--trials", "20"});
  ASSERT_EQ(plan.status, 0) << plan.err;
  EXPECT_GT(nlohmann::json::parse(plan.out).at("step_time_s").get<double>(), 0.0);

  std::ofstream(earlier) << "{}";
  const auto bad = run_brigade({"bench", "calibrate", "--comm-from", earlier, "--out", fresh});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("no all-reduce figures"), std::string::npos) << bad.err;
}

TEST(PlanCommand, BadInputSaysWhatIsWrong) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"plan", "--model", "nosuch", "--gpus", "8"}, "neither a preset nor a config file"},
      {{"plan", "--model", "175b"}, "--gpus N is required"},
      {{"plan", "--gpus", "8"}, "--model is required"},
      {{"plan", "--model", "175b", "--gpus", "8", "--hardware", "tpu-v9"}, "unknown hardware"},
      {{"plan", "--model", "175b", "--gpus", "1024", "--layout", "tp=8,pp=8,dp=8"},
       "tp*pp*dp = 512 GPUs but --gpus is 1024"},
      {{"plan", "--model", "175b", "--gpus", "24", "--layout", "tp=3,pp=8,dp=1"},
       "tp=3 does not divide the 8 GPUs of a node"},
      {{"plan", "--model", "175b", "--gpus", "8", "--layout", "tp=8,flavour=mild"},
       "unknown key \"flavour\""},
      {{"plan", "--model", "175b", "--sweep-gpus", "4096:1024"}, "--sweep-gpus must be LO:HI"},
      {{"plan", "--model", "175b", "--gpus", "8", "--hardware", "this-machine", "--calibration",
        "/nonexistent/cal.json"},
       "no such calibration file"},
      {{"plan", "--model", "175b", "--gpus", "8", "--top", "0"}, "--top"},
      {{"plan", "--model", "175b", "--gpus", "-8"}, "--gpus"},
      {{"plan", "--model", "175b", "--gpus", "8", "--restart-s", "-1"}, "--restart-s"},
      {{"plan", "--model", "175b", "--gpus", "8", "--storage-gb-per-s", "0"}, "--storage-gb-per-s"},
      {{"plan", "--model", "175b", "--gpus", "8", "--layout", "tp=8,tp=4"}, "tp is given twice"},
      {{"plan", "--model", "175b", "--gpus", "8", "--layout", "tp=8,recompute=selective"},
       "fused attention never keeps"},
      // Clusters of this machine (--nodes), refused before any calibration is read.
      {{"plan", "--model", "175b", "--gpus", "16", "--nodes", "2", "--link", "10gbit"},
       "describe clusters of this machine: use them with --hardware this-machine"},
      {{"plan", "--model", "175b", "--gpus", "16", "--one-machine"},
       "describe clusters of this machine: use them with --hardware this-machine"},
      {{"plan", "--model", "175b", "--gpus", "8", "--hardware", "h200", "--nodes", "3"},
       "describe clusters of this machine"},
      {{"plan", "--model", "175b", "--hardware", "this-machine", "--nodes", "2", "--link",
        "10gbit"},
       "--gpus N is required"},
      {{"plan", "--validate", "--nodes", "2"}, "--validate checks published runs"},
      {{"plan", "--model", "175b", "--gpus", "4", "--hardware", "this-machine", "--calibration",
        "/nonexistent/cal.json", "--nodes", "2"},
       "--nodes 2 needs --link RATE"},
      {{"plan", "--model", "175b", "--gpus", "4", "--hardware", "this-machine", "--calibration",
        "/nonexistent/cal.json", "--nodes", "2", "--link", "10gb"},
       "expected a rate as tc writes it"},
      {{"plan", "--model", "175b", "--gpus", "3", "--hardware", "this-machine", "--calibration",
        "/nonexistent/cal.json", "--nodes", "2", "--link", "10gbit"},
       "--gpus 3 does not split evenly over --nodes 2"},
      {{"plan", "--model", "175b", "--gpus", "2", "--hardware", "this-machine", "--calibration",
        "/nonexistent/cal.json", "--link", "10gbit"},
       "add --nodes N"},
  };
  for (const Case& c : cases) {
    const auto r = run_brigade(c.args);
    EXPECT_NE(r.status, 0) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos)
        << "wanted: " << c.message << "\ngot: " << r.err;
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
