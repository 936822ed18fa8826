// What `brigade report` reads from a run directory and how it inlines it:
// steps in order with redone steps replaced, long runs averaged into at most
// kMaxPointsPerSeries points, validation and per-rank series, incidents and
// the ETTR summary, the mesh; data that cannot end its <script> element
// early; clear errors for a missing Chart.js or a broken run directory. The
// page itself is rendered by headless Chromium in cli_external_tests.
#include "brigade/diag/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "brigade/core/error.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"

namespace brigade::diag {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

class ReportData : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream metrics(dir_.path() / "metrics.jsonl");
    for (int step = 1; step <= 5000; ++step) {
      nlohmann::json line = {{"step", step},         {"loss", static_cast<double>(step)},
                             {"step_ms", 10.0},      {"tokens_per_s", 100.0},
                             {"mfu", 0.5},           {"compute_ms", 8.0},
                             {"exposed_comm_ms", 1}, {"peak_rss_bytes_per_rank", {step, 2 * step}}};
      metrics << line.dump() << "\n";
      if (step == 1000) metrics << nlohmann::json{{"step", 1000}, {"val_loss", 2.5}}.dump() << "\n";
    }
    // A restart redid steps 2999 and 3000: the later lines are the ones kept.
    metrics << nlohmann::json{{"step", 2999}, {"loss", 1e6}}.dump() << "\n";
    metrics << nlohmann::json{{"step", 3000}, {"loss", 1e6}}.dump() << "\n";
    metrics << "\n";
    std::ofstream incidents(dir_.path() / "incidents.jsonl");
    incidents
        << R"({"kind":"crash","rank":1,"what":"worker rank 1 was killed","detected_after_ms":12.5})"
        << "\n"
        << R"j({"kind":"straggler","restart":false,"rank":3,"what":"straggler: rank 3 (node 1)"})j"
        << "\n"
        << R"({"kind":"straggler_recovered","restart":false,"rank":3,"what":"no longer slow"})"
        << "\n"
        << R"({"kind":"rejoin","restart":false,"node":1,"what":"node 1 rejoins"})"
        << "\n"
        << R"({"kind":"summary","ettr":0.9,"incidents":1,"restarts":1,"wall_s":10,"productive_s":9,"lost_s":1})"
        << "\n";
    std::ofstream(dir_.path() / "config.toml")
        << "[parallel]\ndp = 2\nzero = 1\nbackend = \"gloo\"\n[train]\nrun_dir = \"</script>\"\n";
    std::ofstream(dir_.path() / "config.resumed_at_step_3000.toml") << "\n";
  }
  testing::TempDir dir_{"brigade_report_data"};
};

TEST_F(ReportData, ReadsTheRunDirectory) {
  const nlohmann::json run = read_run(dir_.path());
  EXPECT_EQ(run["step_count"], 5000);
  EXPECT_EQ(run["last_step"], 5000);
  const nlohmann::json& s = run["steps"];
  // 5000 steps in buckets of 3: 1667 points, the last bucket holding two.
  ASSERT_EQ(s["step"].size(), 1667u);
  EXPECT_LE(s["step"].size(), kMaxPointsPerSeries);
  EXPECT_EQ(s["step"][0], 3);
  EXPECT_DOUBLE_EQ(s["loss"][0].get<double>(), 2.0);  // the mean of steps 1, 2, 3
  EXPECT_EQ(s["step"].back(), 5000);
  EXPECT_DOUBLE_EQ(s["loss"].back().get<double>(), 4999.5);
  // Steps 2998..3000: the redone 2999 and 3000 replaced theirs; they have no step_ms.
  EXPECT_EQ(s["step"][999], 3000);
  EXPECT_DOUBLE_EQ(s["loss"][999].get<double>(), (2998.0 + 2e6) / 3);
  EXPECT_DOUBLE_EQ(s["step_ms"][999].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(s["mfu"][0].get<double>(), 0.5);
  EXPECT_EQ(run["validation"]["step"], nlohmann::json::array({1000}));
  EXPECT_EQ(run["validation"]["val_loss"], nlohmann::json::array({2.5}));
  const nlohmann::json& rss = run["per_rank"]["peak_rss_bytes_per_rank"];
  ASSERT_EQ(rss["ranks"].size(), 2u);
  EXPECT_DOUBLE_EQ(rss["ranks"][1][0].get<double>(), 4.0);  // 2 * mean(1, 2, 3)
  // The straggler records are no incidents: a list of their own.
  ASSERT_EQ(run["incidents"].size(), 1u);
  EXPECT_EQ(run["incidents"][0]["rank"], 1);
  // Written before records carried the agent's number: numbered in order.
  EXPECT_EQ(run["incidents"][0]["number"], 1);
  ASSERT_EQ(run["stragglers"].size(), 2u);
  EXPECT_EQ(run["stragglers"][0]["what"], "straggler: rank 3 (node 1)");
  EXPECT_EQ(run["stragglers"][1]["kind"], "straggler_recovered");
  // A rejoin (the job grew back) is no failure either.
  ASSERT_EQ(run["rejoins"].size(), 1u);
  EXPECT_EQ(run["rejoins"][0]["what"], "node 1 rejoins");
  EXPECT_DOUBLE_EQ(run["summary"]["ettr"].get<double>(), 0.9);
  EXPECT_EQ(run["mesh"]["dp"], 2);
  EXPECT_EQ(run["mesh"]["zero"], 1);
  EXPECT_EQ(run["mesh"]["backend"], "gloo");
  EXPECT_EQ(run["config_files"],
            nlohmann::json::array({"config.resumed_at_step_3000.toml", "config.toml"}));
}

TEST_F(ReportData, ThePageCarriesTheDataWhereNoValueCanEndItsScript) {
  const nlohmann::json run = read_run(dir_.path());
  const std::string chart_js = "/* Chart.js v3 stand-in */ window.Chart = function () {};";
  const std::string html = report_html(run, chart_js);
  EXPECT_NE(html.find(chart_js), std::string::npos);
  const std::string open = "<script type=\"application/json\" id=\"brigade-data\">";
  const size_t begin = html.find(open);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = html.find("</script>", begin);
  const std::string data = html.substr(begin + open.size(), end - begin - open.size());
  EXPECT_EQ(nlohmann::json::parse(data), run);
  EXPECT_NE(run["config"].get<std::string>().find("</script>"), std::string::npos);
  EXPECT_THROW(report_html(run, "var s = '</SCRIPT>';"), Error);
}

TEST(JsonForScript, EscapesWhatHtmlOrJavaScriptWouldReadAsSyntax) {
  const nlohmann::json value = {{"a", "</script><!-- & \u2028\u2029 >"}, {"b", {1, 2}}};
  const std::string text = json_for_script(value);
  for (const char* raw : {"<", ">", "&", "\u2028", "\u2029"}) {
    EXPECT_EQ(text.find(raw), std::string::npos) << raw << " in " << text;
  }
  EXPECT_EQ(nlohmann::json::parse(text), value);
}

TEST(ReportErrors, NameTheProblemAndTheFix) {
  testing::TempDir dir("brigade_report_errors");
  try {
    read_run(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no metrics.jsonl"), std::string::npos) << e.what();
  }
  std::ofstream(dir.path() / "metrics.jsonl") << "{\"step\": 1}\n{not json\n";
  try {
    read_run(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl line 2 is not JSON"), std::string::npos)
        << e.what();
  }
  testing::ScopedEnv env;
  env.set("BRIGADE_CHART_JS", (dir.path() / "missing.js").c_str());
  try {
    find_chart_js();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libjs-chart.js"), std::string::npos) << e.what();
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::diag
