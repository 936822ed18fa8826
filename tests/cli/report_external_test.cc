// `brigade report` rendered by a real browser: a two-worker run with an
// injected crash and a restart, its report opened in headless Chromium
// (Debian's chromium), which must draw every chart (pixels of each chart's
// first series on its canvas), log nothing to the console, show the
// incidents as text (a hostile incident line stays text, not script), and
// take a screenshot. Needs chromium and libjs-chart.js (scripts/install_deps.sh
// --test); skips, saying so, when the chromium binary is absent.
//
// BRIGADE_REPORT_SCREENSHOT=PATH keeps the screenshot (docs/report.png is one).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "testing/child_process.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::run_brigade;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Text with enough variety for a byte-level model's loss to fall.
std::string training_text() {
  std::string text;
  const char* words[] = {"the ",  "brigade ", "trains ",  "a ",    "model ", "on ",   "every ",
                         "core ", "and ",     "reports ", "what ", "it ",    "did.\n"};
  for (int i = 0; i < 4000; ++i) text += words[(i * 7 + i / 13) % 13];
  return text;
}

// Chromium's flags for a test: no sandbox (root in a container), no GPU, a
// fixed window, and a virtual-time budget so the page's scripts have run
// when the DOM is dumped or the screenshot taken.
std::vector<std::string> chromium_args(const std::string& chromium, const fs::path& profile) {
  return {chromium,
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--no-first-run",
          "--hide-scrollbars",
          "--user-data-dir=" + profile.string(),
          "--window-size=1280,2400",
          "--virtual-time-budget=10000",
          "--enable-logging=stderr",
          "--v=0"};
}

TEST(ReportInBrowser, ChartsDrawWithoutErrorsAndIncidentsShow) {
  const std::string chromium = testing::find_program("chromium");
  if (chromium.empty()) {
    GTEST_SKIP() << "chromium is not installed (apt-get install chromium, or "
                    "scripts/install_deps.sh --test): the report's rendering test needs it";
  }
  testing::TempDir dir("brigade_report");
  const fs::path text = dir.path() / "text.txt";
  std::ofstream(text) << training_text();
  const fs::path run = dir.path() / "run";
  const fs::path config = dir.path() / "config.toml";
  std::ofstream(config) << "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 16\n"
                           "vocab_size = 256\n"
                           "[data]\nsource = \""
                        << text.string() << "\"\ntokenizer = \"byte\"\ndir = \""
                        << (dir.path() / "data").string()
                        << "\"\n"
                           "[train]\nmicro_batch = 4\nsteps = 40\neval_every = 10\n"
                           "eval_windows = 8\ncheckpoint_every = 4\nseed = 3\nrun_dir = \""
                        << run.string()
                        << "\"\n"
                           "[optim]\nlr = 3e-3\n[parallel]\ntimeout_s = 60\n";
  const auto trained = run_brigade({"train", "--nproc", "2", config.string(), "--max-restarts", "1",
                                    "--inject", "kill:rank=1:step=9"},
                                   std::chrono::seconds(300));
  ASSERT_EQ(trained.status, 0) << trained.err;
  // A line no run writes, as a hostile or corrupted file might hold it: the
  // page must show it as text.
  std::ofstream(run / "incidents.jsonl", std::ios::app)
      << R"({"kind":"hang","rank":7,"what":"</script><script>document.body.dataset.pwned='yes'</script>"})"
      << "\n";

  const fs::path html = dir.path() / "report.html";
  const auto reported = run_brigade({"report", run.string(), "-o", html.string()});
  ASSERT_EQ(reported.status, 0) << reported.err;
  const std::string page = read_all(html);
  EXPECT_EQ(page.find("src=\"http"), std::string::npos) << "the page must not load anything";
  EXPECT_NE(page.find("Chart.js v3"), std::string::npos) << "Chart.js is inlined";

  const fs::path dom_path = dir.path() / "dom.html";
  const fs::path log_path = dir.path() / "chromium.log";
  {
    std::vector<std::string> args = chromium_args(chromium, dir.path() / "profile");
    args.push_back("--dump-dom");
    args.push_back("file://" + html.string());
    testing::ChildProcess browser(args, dom_path, log_path);
    // Chromium renders this page in 2-3 s; two loaded cores, and a cold
    // start, are well inside the minute.
    const auto status = browser.wait_for(std::chrono::seconds(120));
    ASSERT_TRUE(status.has_value()) << "chromium did not finish:\n" << read_all(log_path);
    ASSERT_EQ(*status, 0) << read_all(log_path);
  }
  const std::string dom = read_all(dom_path);
  const std::string log = read_all(log_path);
  ASSERT_NE(dom.find("data-ready=\"yes\""), std::string::npos)
      << "the page's script did not finish:\n"
      << dom.substr(0, 4000) << "\n"
      << log;
  // Nothing on the console: no uncaught exception, no Chart.js complaint.
  EXPECT_EQ(log.find(":CONSOLE"), std::string::npos) << log;
  const std::regex errors_re("<pre id=\"brigade-errors\">([^<]*)</pre>");
  std::smatch errors;
  ASSERT_TRUE(std::regex_search(dom, errors, errors_re));
  EXPECT_EQ(errors[1].str(), "") << "script errors on the page";

  // Every chart drew its first series: loss, throughput, breakdown, gradient
  // norm, and the per-rank memory of the two workers.
  const std::regex chart_re("<canvas id=\"chart-([a-z_-]+)\"[^>]*data-series-pixels=\"([0-9]+)\"");
  std::map<std::string, int> pixels;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), chart_re);
       it != std::sregex_iterator(); ++it) {
    pixels[(*it)[1].str()] = std::stoi((*it)[2].str());
  }
  for (const char* id :
       {"loss", "throughput", "breakdown", "grad-norm", "peak_rss_bytes_per_rank"}) {
    ASSERT_TRUE(pixels.count(id)) << "no chart " << id << " in\n" << dom.substr(0, 3000);
    // A drawn 2-px line across a 500-px plot is over a thousand pixels;
    // axes and grid lines are grey, so they do not count.
    EXPECT_GT(pixels[id], 300) << id;
  }
  EXPECT_NE(dom.find("final validation loss"), std::string::npos);
  // The real incident (rank 1 killed) and the hostile line, both as rows of text.
  const std::regex row_re("<tr class=\"incident\">");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(dom.begin(), dom.end(), row_re), std::sregex_iterator()),
      2);
  EXPECT_NE(dom.find("was killed by SIGKILL"), std::string::npos);
  EXPECT_NE(dom.find("&lt;/script&gt;&lt;script&gt;document.body.dataset.pwned"),
            std::string::npos);
  EXPECT_EQ(dom.find("data-pwned"), std::string::npos) << "the incident's text ran as script";
  EXPECT_NE(dom.find("ETTR"), std::string::npos);

  // The screenshot: a PNG of the whole page.
  const fs::path png = dir.path() / "report.png";
  {
    std::vector<std::string> args = chromium_args(chromium, dir.path() / "profile");
    args.push_back("--screenshot=" + png.string());
    args.push_back("file://" + html.string());
    testing::ChildProcess browser(args, dir.path() / "shot.out", dir.path() / "shot.log");
    const auto status = browser.wait_for(std::chrono::seconds(120));
    ASSERT_TRUE(status.has_value()) << read_all(dir.path() / "shot.log");
    ASSERT_EQ(*status, 0) << read_all(dir.path() / "shot.log");
  }
  const std::string png_bytes = read_all(png);
  ASSERT_GT(png_bytes.size(), 20'000u);
  EXPECT_EQ(png_bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  if (const char* keep = std::getenv("BRIGADE_REPORT_SCREENSHOT")) {
    fs::copy_file(png, keep, fs::copy_options::overwrite_existing);
  }
  EXPECT_TRUE(testing::wait_until_gone(dir.path().string(), std::chrono::seconds(30)));
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
