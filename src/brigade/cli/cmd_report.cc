// brigade report RUN_DIR [-o FILE]: the run as one self-contained HTML page
// (diag/report.h), by default RUN_DIR/report.html.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "brigade/cli/commands.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/diag/report.h"

namespace brigade::cli {
namespace fs = std::filesystem;

void add_report_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Write a run's report: one HTML file with its loss, throughput, MFU, per-rank series, "
      "incidents and ETTR, viewable offline (Chart.js inlined)");
  cmd->add_option("run_dir", *run_dir, "The run directory (train.run_dir)")->required();
  cmd->add_option("-o,--output", *output, "The HTML file to write (default RUN_DIR/report.html)");
  cmd->callback([run_dir, output] {
    const fs::path chart_js_path = diag::find_chart_js();
    const nlohmann::json run = diag::read_run(*run_dir);
    std::ifstream in(chart_js_path, std::ios::binary);
    std::ostringstream chart_js;
    chart_js << in.rdbuf();
    if (!in || chart_js.str().empty()) throw_error("cannot read {}", chart_js_path.string());
    const fs::path out = output->empty() ? fs::path(*run_dir) / "report.html" : fs::path(*output);
    write_file_atomic(out, diag::report_html(run, chart_js.str()));
    std::printf("wrote %s\n", out.string().c_str());
  });
}

}  // namespace brigade::cli
