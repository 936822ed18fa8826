// One root-cause trial through the real binary: a `brigade train --nproc 4`
// on the tiny model with one injected fault (kill, stop, skip or mismatch) on
// `rank` after `step`; the launcher must print one incident line naming that
// rank and the fault's kind, write it as the incident's `cause`, and recover.
// Shared by root_cause_test.cc (one trial per kind) and
// root_cause_chaos_test.cc (many, at random).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/run_brigade.h"
#include "testing/run_records.h"

namespace brigade::testing {

// A snapshot every step: a restart loses at most a step or two. The
// collective timeout is far below the test's own and far above the hang
// detection (2 s), so a hang the agent missed fails the trial.
inline constexpr char kRootCauseTraining[] = R"(
[train]
micro_batch = 2
steps = 8
seed = 5
snapshot_every = 1
[optim]
lr = 3e-3
min_lr = 3e-3
[data]
synthetic = true
[parallel]
timeout_s = 20
)";

// What the line must say for each injected kind.
inline std::string expected_phrase(const std::string& kind) {
  if (kind == "kill") return "crashed (killed by SIGKILL)";
  if (kind == "stop") return "stopped responding";
  // The collective a skip or mismatch acts on is the loop's per-step
  // gather of rank stats (elastic/fault_injection.h).
  if (kind == "skip") return "skipped all_gather";
  return "with another shape";  // mismatch; "(a mismatch)" follows
}

// Runs the trial in `run_dir` and checks it; returns the incident's cause.
// `also` adds faults that must not be blamed (a slow rank).
inline std::string root_cause_trial(const std::filesystem::path& config,
                                    const std::filesystem::path& run_dir, const std::string& kind,
                                    int rank, int step, const std::string& also = "") {
  const std::string inject = kind + ":rank=" + std::to_string(rank) +
                             ":step=" + std::to_string(step) + (also.empty() ? "" : "," + also);
  SCOPED_TRACE(inject);
  const Output r = run_brigade({"train", "--nproc", "4", config.string(), "--set",
                                "train.run_dir=\"" + run_dir.string() + "\"", "--inject", inject},
                               std::chrono::seconds(300));
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string head =
      "brigade launch: incident 1: rank " + std::to_string(rank) + " (node 0) ";
  const size_t at = r.err.find(head);
  EXPECT_NE(at, std::string::npos) << r.err;
  if (at == std::string::npos) return "";
  const std::string line =
      r.err.substr(at + 16, r.err.find('\n', at) - at - 16);  // without "brigade launch: "
  EXPECT_NE(line.find(expected_phrase(kind)), std::string::npos) << line;
  if (kind == "mismatch") {
    EXPECT_NE(line.find("(a mismatch)"), std::string::npos) << line;
  }
  if (kind == "kill" || kind == "stop") {
    EXPECT_NE(line.find("after step " + std::to_string(step)), std::string::npos) << line;
    // How many survivors dumped in time depends on the machine's load; what
    // users rely on is the rank and the kind, checked above.
  }
  // One incident line, not a wall of them.
  EXPECT_EQ(r.err.find("brigade launch: incident", at + 1), std::string::npos) << r.err;
  const auto failures = read_failures(run_dir / "incidents.jsonl");
  EXPECT_FALSE(failures.empty()) << "no incident in incidents.jsonl";
  if (failures.empty()) return line;
  const nlohmann::json& incident = failures.front();
  EXPECT_EQ(incident.at("cause"), line) << incident;
  // The evidence wait is bounded (1 s, then the write); the margin is for a
  // loaded machine, the bound for a wait that would hold the restart up.
  EXPECT_LT(incident.at("evidence_ms").get<double>(), 5'000.0) << incident;
  // Node 0's own view, named per node: the run directory is shared by every
  // node's agent.
  EXPECT_TRUE(std::filesystem::exists(run_dir / "incidents" / "1" / "agent_node0.json"));
  // The incident's timeline (diag/incident_trace.h), written by the launcher
  // once the incident was resolved: the line on the culprit's own process
  // (R + 1); the fault before its detection, and a detection through the
  // survivors' wait after that wait began (the steady clock's stamps and
  // the dumps' wall clock agree).
  std::ifstream trace_file(run_dir / "incidents" / "1" / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(trace_file, nullptr, /*exceptions=*/false);
  EXPECT_FALSE(trace.is_discarded()) << "incidents/1/trace.json";
  bool culprit = false;
  double fault_us = -1, detected_us = -1, first_wait_us = -1;
  if (!trace.is_discarded()) {
    for (const nlohmann::json& e : trace.at("traceEvents")) {
      const std::string name = e.value("name", std::string());
      const double ts = e.value("ts", -1.0);
      culprit = culprit || (e.value("pid", -1) == rank + 1 && name == line);
      if (name.starts_with("fault (node 0): ")) fault_us = ts;
      if (name == "detected (node 0)") detected_us = ts;
      if (name.ends_with("(never completed)") && (first_wait_us < 0 || ts < first_wait_us)) {
        first_wait_us = ts;
      }
    }
  }
  EXPECT_TRUE(culprit) << "no event named the cause on rank " << rank << "'s process";
  EXPECT_GE(fault_us, 0) << "no fault instant in incidents/1/trace.json";
  EXPECT_GE(detected_us, fault_us);
  // A hang or a skipped or mismatched collective is found through the
  // survivors' wait, so after it began; a crash is found from the process's
  // exit, which may come before the survivors reach the collective they
  // then wait in (CI's ASan run: detected 1.6 ms before the first wait).
  if (first_wait_us >= 0 && kind != "kill") {
    EXPECT_GE(detected_us, first_wait_us);
  }
  std::printf("[ cause    ] %s (evidence %.0f ms)\n", line.c_str(),
              incident.at("evidence_ms").get<double>());
  return line;
}

}  // namespace brigade::testing
