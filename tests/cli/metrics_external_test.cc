// The agent's /metrics scraped by a real Prometheus (Debian's prometheus):
// a two-worker `brigade train` serves on a port it picks and prints, a
// Prometheus started by the test scrapes it every second, and the series
// come back through Prometheus's query API, the step moving on as training
// does. Skips, saying so, when the prometheus binary is absent
// (scripts/install_deps.sh --test installs it).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "testing/child_process.h"
#include "testing/free_port.h"
#include "testing/http_get.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The first match of `re`'s group 1 in the file, waiting for it to appear
// (the file is another process's output) until the deadline.
std::string wait_for_match(const fs::path& path, const std::regex& re, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    const std::string text = read_all(path);
    std::smatch m;
    if (std::regex_search(text, m, re)) return m[1].str();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

// One instant query's result vector, or an empty array while Prometheus
// is not up or has no sample yet.
nlohmann::json query(int port, const std::string& promql) {
  std::string encoded;
  for (char c : promql) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      encoded += c;
    } else {
      encoded += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    }
  }
  const auto r = testing::http_get(port, "/api/v1/query?query=" + encoded);
  if (!r || r->status != 200) return nlohmann::json::array();
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json::array();
  return j["data"]["result"];
}

double value_of(const nlohmann::json& sample) {
  return std::stod(sample["value"][1].get<std::string>());
}

TEST(MetricsScrapedByPrometheus, SeriesComeBackThroughTheQueryApi) {
  const std::string prometheus = testing::find_program("prometheus");
  if (prometheus.empty()) {
    GTEST_SKIP() << "prometheus is not installed (apt-get install prometheus, or "
                    "scripts/install_deps.sh --test): the /metrics scrape test needs it";
  }
  testing::TempDir dir("brigade_metrics");
  const fs::path config = dir.path() / "config.toml";
  // Far more steps than the test waits for: it stops the job itself.
  std::ofstream(config) << testing::kTinyModelToml
                        << "[train]\nmicro_batch = 2\nsteps = 10000000\nrun_dir = \""
                        << (dir.path() / "run").string() << "\"\n[data]\nsynthetic = true\n";
  // Two loaded cores may slow every part tenfold; the test ends as soon as it has its answer.
  const auto deadline = Clock::now() + std::chrono::seconds(180);
  testing::ChildProcess job(
      {testing::kBrigade, "train", "--nproc", "2", config.string(), "--metrics", "127.0.0.1:0"},
      dir.path() / "job.out", dir.path() / "job.err");
  const std::string metrics_port =
      wait_for_match(dir.path() / "job.err",
                     std::regex("metrics at http://127\\.0\\.0\\.1:([0-9]+)/metrics"), deadline);
  ASSERT_FALSE(metrics_port.empty()) << read_all(dir.path() / "job.err");

  const int web_port = testing::free_port();
  std::ofstream(dir.path() / "prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
         "scrape_configs:\n  - job_name: brigade\n    static_configs:\n"
         "      - targets: ['127.0.0.1:"
      << metrics_port << "']\n";
  testing::ChildProcess server(
      {prometheus, "--config.file=" + (dir.path() / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (dir.path() / "tsdb").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(web_port)},
      dir.path() / "prometheus.out", dir.path() / "prometheus.log");

  // The first scraped step, then a later, larger one: the series is live.
  double first_step = -1, later_step = -1;
  while (Clock::now() < deadline) {
    const nlohmann::json result = query(web_port, "brigade_step");
    if (result.size() == 1) {
      const double step = value_of(result[0]);
      if (first_step < 0 && step > 0) first_step = step;
      if (first_step > 0 && step > first_step) {
        later_step = step;
        break;
      }
    }
    ASSERT_FALSE(job.wait_for(std::chrono::milliseconds(0)).has_value())
        << "the job ended early:\n"
        << read_all(dir.path() / "job.err");
    ASSERT_FALSE(server.wait_for(std::chrono::milliseconds(200)).has_value())
        << "prometheus ended:\n"
        << read_all(dir.path() / "prometheus.log");
  }
  ASSERT_GT(later_step, first_step) << "no moving brigade_step through Prometheus; its log:\n"
                                    << read_all(dir.path() / "prometheus.log");

  const nlohmann::json step = query(web_port, "brigade_step");
  ASSERT_EQ(step.size(), 1u);
  EXPECT_EQ(step[0]["metric"]["job"], "brigade");
  EXPECT_EQ(step[0]["metric"]["node"], "0");
  EXPECT_EQ(value_of(query(web_port, "up{job=\"brigade\"}")[0]), 1.0);
  // The job's values: a byte-level loss near ln(64) at the start, positive throughput and MFU.
  const nlohmann::json loss = query(web_port, "brigade_loss");
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_GT(value_of(loss[0]), 1.0);
  EXPECT_LT(value_of(loss[0]), 10.0);
  for (const char* name : {"brigade_tokens_per_second", "brigade_mfu"}) {
    const nlohmann::json r = query(web_port, name);
    ASSERT_EQ(r.size(), 1u) << name;
    EXPECT_GT(value_of(r[0]), 0.0) << name;
  }
  EXPECT_LT(value_of(query(web_port, "brigade_mfu")[0]), 1.0);
  EXPECT_EQ(value_of(query(web_port, "brigade_generation")[0]), 0.0);
  EXPECT_EQ(value_of(query(web_port, "brigade_incidents_total")[0]), 0.0);
  // One series per rank, each from that worker's own heartbeat slot.
  for (const char* name :
       {"brigade_step_seconds", "brigade_comm_wait_fraction", "brigade_worker_up"}) {
    nlohmann::json r = query(web_port, name);
    ASSERT_EQ(r.size(), 2u) << name << ": " << r;
    if (r[0]["metric"]["rank"] > r[1]["metric"]["rank"]) std::swap(r[0], r[1]);
    EXPECT_EQ(r[0]["metric"]["rank"], "0") << name;
    EXPECT_EQ(r[1]["metric"]["rank"], "1") << name;
    for (const auto& sample : r) EXPECT_GE(value_of(sample), 0.0) << name;
  }
  EXPECT_GT(value_of(query(web_port, "min(brigade_step_seconds)")[0]), 0.0);
  // The step's parts, by rank and part: compute is on every rank.
  const nlohmann::json compute = query(web_port, "brigade_step_part_seconds{part=\"compute\"}");
  ASSERT_EQ(compute.size(), 2u) << compute;
  for (const auto& sample : compute) EXPECT_GT(value_of(sample), 0.0) << compute;
  EXPECT_EQ(query(web_port, "count(brigade_step_part_seconds)")[0]["value"][1], "16");

  // The user's SIGTERM: the job saves and exits with 128 + 15.
  EXPECT_EQ(job.stop(SIGTERM, std::chrono::seconds(120)), 128 + SIGTERM)
      << read_all(dir.path() / "job.err");
  EXPECT_EQ(server.stop(SIGTERM, std::chrono::seconds(60)), 0)
      << read_all(dir.path() / "prometheus.log");
  EXPECT_TRUE(testing::wait_until_gone(dir.path().string(), std::chrono::seconds(30)));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
