// brigade diagnose RUN_DIR: the root cause of each incident of a run, from
// the evidence its agent saved in RUN_DIR/incidents/<N>/ (diag/root_cause.h),
// one line each, as the launcher printed them.
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "brigade/cli/commands.h"
#include "brigade/core/error.h"
#include "brigade/diag/incident_trace.h"
#include "brigade/diag/root_cause.h"

namespace brigade::cli {

void add_diagnose_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "diagnose",
      "Name the root cause of each incident of a run (the rank, the kind: crash, hang, skip, "
      "mismatch, and the collective) from the evidence in RUN_DIR/incidents/; writes the "
      "timeline (trace.json, for Perfetto) of an incident that lacks one");
  cmd->add_option("run_dir", *run_dir, "The run directory (train.run_dir)")->required();
  cmd->callback([run_dir] {
    int unreadable = 0;
    for (const auto& dir : diag::incident_dirs(*run_dir)) {
      try {
        std::printf("%s\n", diag::find_root_cause(diag::read_incident(dir)).line.c_str());
        std::fflush(stdout);
      } catch (const std::exception& e) {
        // One unreadable incident (damaged JSON, a file gone, a number out
        // of range) must not hide the others'.
        ++unreadable;
        std::fprintf(stderr, "brigade diagnose: incident %s could not be read: %s\n",
                     dir.filename().c_str(), e.what());
        continue;
      }
      // The launcher writes each incident's timeline once it is resolved; one
      // that ended the job, or a run from before the timelines, lacks it.
      // Best effort: the run directory may be read-only (an archive).
      if (std::filesystem::is_regular_file(dir / "trace.json")) continue;
      try {
        diag::write_incident_trace(dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "brigade diagnose: no timeline written for incident %s: %s\n",
                     dir.filename().c_str(), e.what());
      }
    }
    std::fflush(stdout);
    if (unreadable > 0) throw ExitStatus{1};
  });
}

}  // namespace brigade::cli
