// The agent's status as Prometheus text: the series and their values, per
// rank where they are per rank, nothing for what no worker reported, and a
// text Prometheus's own linter (promtool, when installed) accepts.
#include "brigade/diag/prometheus.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>

namespace brigade::diag {
namespace BRIGADE_TEST_FILE {

elastic::AgentStatus two_workers() {
  elastic::AgentStatus s;
  s.node_rank = 1;
  s.generation = 2;
  s.restarts = 2;
  s.incidents = 3;
  s.taken_ns = 10'000'000'000;
  for (int local = 0; local < 2; ++local) {
    elastic::AgentStatus::Worker w;
    w.rank = 4 + local;
    w.local_rank = local;
    w.running = local == 0;
    w.progress.beat_ns = 9'750'000'000;
    w.progress.step = 120 + local;  // rank 4 is a step behind
    w.progress.last_step_ns = 250'000'000 + local * 250'000'000;
    w.progress.stats.loss = 3.5;
    w.progress.stats.tokens_per_s = 4096;
    w.progress.stats.comm_wait_fraction = 0.125 * (local + 1);
    w.progress.stats.part_ms[static_cast<size_t>(StepPart::kCompute)] = 200.0 + local;
    w.progress.stats.part_ms[static_cast<size_t>(StepPart::kBubble)] = 12.5;
    s.workers.push_back(w);
  }
  return s;
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(PrometheusText, NamesEverySeriesWithItsValue) {
  const std::string text = prometheus_text(two_workers());
  for (const char* line : {
           "brigade_generation{node=\"1\"} 2",
           "brigade_restarts_total{node=\"1\"} 2",
           "brigade_incidents_total{node=\"1\"} 3",
           "brigade_step{node=\"1\"} 120",
           "brigade_loss{node=\"1\"} 3.5",
           "brigade_tokens_per_second{node=\"1\"} 4096",
           "brigade_step_seconds{node=\"1\",rank=\"4\"} 0.25",
           "brigade_step_seconds{node=\"1\",rank=\"5\"} 0.5",
           "brigade_comm_wait_fraction{node=\"1\",rank=\"4\"} 0.125",
           "brigade_comm_wait_fraction{node=\"1\",rank=\"5\"} 0.25",
           "brigade_step_part_seconds{node=\"1\",rank=\"4\",part=\"compute\"} 0.2",
           "brigade_step_part_seconds{node=\"1\",rank=\"5\",part=\"compute\"} 0.201",
           "brigade_step_part_seconds{node=\"1\",rank=\"5\",part=\"bubble\"} 0.0125",
           "brigade_heartbeat_age_seconds{node=\"1\",rank=\"4\"} 0.25",
           "brigade_worker_up{node=\"1\",rank=\"4\"} 1",
           "brigade_worker_up{node=\"1\",rank=\"5\"} 0",
           "# TYPE brigade_step gauge",
           "# TYPE brigade_incidents_total counter",
       }) {
    EXPECT_TRUE(has_line(text, line)) << line << " missing from\n" << text;
  }
  // No rank measured MFU here: no series, rather than NaN.
  EXPECT_EQ(text.find("brigade_mfu{"), std::string::npos) << text;
  EXPECT_EQ(text.find("NaN"), std::string::npos) << text;
  // Parts no step reported are left out.
  EXPECT_EQ(text.find("part=\"data\""), std::string::npos) << text;
}

TEST(PrometheusText, TakesMfuFromTheRankThatMeasuresIt) {
  elastic::AgentStatus s = two_workers();
  s.workers[1].progress.stats.mfu = 0.42;
  EXPECT_TRUE(has_line(prometheus_text(s), "brigade_mfu{node=\"1\"} 0.42"));
}

TEST(PrometheusText, BeforeTheFirstStepOnlyTheAgentsOwnSeries) {
  elastic::AgentStatus s = two_workers();
  for (auto& w : s.workers) {
    w.progress = elastic::WorkerProgress{};
    w.progress.step = 0;
  }
  const std::string text = prometheus_text(s);
  EXPECT_TRUE(has_line(text, "brigade_step{node=\"1\"} 0"));
  EXPECT_EQ(text.find("brigade_loss{"), std::string::npos) << text;
  EXPECT_EQ(text.find("brigade_step_seconds{"), std::string::npos) << text;
  EXPECT_EQ(text.find("brigade_step_part_seconds{"), std::string::npos) << text;
  EXPECT_EQ(text.find("brigade_heartbeat_age_seconds{"), std::string::npos) << text;
  EXPECT_EQ(text.find("NaN"), std::string::npos) << text;
}

TEST(PrometheusText, PromtoolAcceptsIt) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool is not installed (Debian's prometheus package has it)";
  }
  const std::string text = prometheus_text(two_workers());
  const std::string path = ::testing::TempDir() + "brigade_metrics.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  const std::string command = "promtool check metrics < " + path + " 2>&1";
  FILE* out = ::popen(command.c_str(), "r");
  std::string said;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), out) != nullptr) said += buffer;
  EXPECT_EQ(::pclose(out), 0) << said << "\n" << text;
  EXPECT_EQ(said, "") << text;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::diag
