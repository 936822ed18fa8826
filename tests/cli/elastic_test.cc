// The elastic agent end to end, through the real binary: a `brigade train
// --nproc 4` whose worker is killed with SIGKILL, or stopped with SIGSTOP,
// by an injected fault recovers by itself, records the incident with its
// detection time, and ends bit-identical to a run without faults; restarts
// are bounded; generations keep the Gloo store keys of a killed group away
// from the next one; an arbitrary program that fails once is simply rerun.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "brigade/train/train_options.h"
#include "testing/processes.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::read_failures;
using testing::read_jsonl;
using testing::run_brigade;
using testing::trimmed;

// No disk checkpoint but the last: a restart resumes from the in-memory
// snapshot taken after every step, so it loses a step (two if the last
// snapshot's write had not committed when the fault struck). A collective
// timeout far below the test's own, yet far above the detection bounds: a
// hang the watchdog missed would surface as a late crash, failing the bound.
constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 12
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

class Elastic : public ::testing::Test {
 protected:
  fs::path config() {
    const fs::path path = dir_.path() / "config.toml";
    if (!fs::exists(path)) std::ofstream(path) << testing::kTinyModelToml << kTraining;
    return path;
  }

  testing::Output train(const std::string& name, int nproc, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "train",           "--nproc", std::to_string(nproc),
        config().string(), "--set",   "train.run_dir=\"" + (dir_.path() / name).string() + "\""};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_brigade(args, std::chrono::seconds(300));
  }

  std::string hash(const std::string& name) {
    const auto r = run_brigade({"ckpt", "hash", (dir_.path() / name).string()});
    EXPECT_EQ(r.status, 0) << r.err;
    return trimmed(r.out);
  }

  // The final parameters of a run without faults, on `nproc` workers.
  std::string reference_hash(int nproc, std::vector<std::string> extra = {}) {
    const std::string name = "reference" + std::to_string(nproc);
    const auto r = train(name, nproc, std::move(extra));
    EXPECT_EQ(r.status, 0) << r.err;
    return hash(name);
  }

  void TearDown() override {
    // Every worker of every run is gone (they mention the temp dir).
    EXPECT_TRUE(testing::wait_until_gone(dir_.path().string(), std::chrono::seconds(30)));
  }

  testing::TempDir dir_{"brigade_elastic"};
};

// Checks what every recovered incident says, and prints the figures.
void expect_recovered(const nlohmann::json& incident, const char* kind, int rank,
                      double detect_bound_ms) {
  EXPECT_EQ(incident.at("kind"), kind) << incident;
  EXPECT_EQ(incident.at("rank"), rank) << incident;
  EXPECT_EQ(incident.at("generation"), 0) << incident;
  EXPECT_EQ(incident.at("injected"), true) << incident;
  const double detected = incident.at("detected_after_ms").get<double>();
  EXPECT_GE(detected, 0.0) << incident;
  EXPECT_LE(detected, detect_bound_ms) << incident;
  ASSERT_FALSE(incident.at("recovered_after_ms").is_null()) << incident;
  EXPECT_GT(incident.at("recovered_after_ms").get<double>(), 0.0) << incident;
  ASSERT_FALSE(incident.at("steps_lost").is_null()) << incident;
  EXPECT_EQ(incident.at("last_step"), 5) << incident;
  EXPECT_EQ(incident.at("steps_lost").get<int64_t>(),
            5 - incident.at("resumed_from_step").get<int64_t>())
      << incident;
  EXPECT_LE(incident.at("steps_lost").get<int64_t>(), 2) << incident;
  // The recovery's five phases, from the agent's and the workers' stamps,
  // add up to the fault to the first step after it.
  const nlohmann::json& split = incident.at("recovery_ms");
  double sum = 0;
  std::string phases;
  for (const char* phase : {"detect", "stop", "rendezvous", "load", "first_step"}) {
    ASSERT_TRUE(split.at(phase).is_number()) << phase << ": " << incident;
    const double ms = split.at(phase).get<double>();
    EXPECT_GE(ms, 0.0) << phase << ": " << incident;
    sum += ms;
    phases += fmt::format("{}{} {:.0f}", phases.empty() ? "" : ", ", phase, ms);
  }
  EXPECT_NEAR(sum, detected + incident.at("recovered_after_ms").get<double>(), 1e-3) << incident;
  EXPECT_DOUBLE_EQ(split.at("detect").get<double>(), detected) << incident;
  std::printf(
      "[ elastic  ] %s: detected after %.0f ms, recovered after %.0f ms, %lld step(s) lost; "
      "split (ms): %s\n",
      kind, detected, incident.at("recovered_after_ms").get<double>(),
      static_cast<long long>(incident.at("steps_lost").get<int64_t>()), phases.c_str());
}

void expect_summary(const nlohmann::json& summary, int incidents, int restarts) {
  EXPECT_EQ(summary.at("kind"), "summary") << summary;
  EXPECT_EQ(summary.at("incidents"), incidents) << summary;
  EXPECT_EQ(summary.at("restarts"), restarts) << summary;
  const double ettr = summary.at("ettr").get<double>();
  EXPECT_GT(ettr, 0.0) << summary;
  EXPECT_LE(ettr, 1.0) << summary;
  std::printf("[ elastic  ] ETTR %.1f%%, %.2f s lost, %.2f s wall\n", 100 * ettr,
              summary.at("lost_s").get<double>(), summary.at("wall_s").get<double>());
}

// What a run without faults counts as training time in its ETTR: every
// step's window on the loop's clock less its saves and evaluations, rank
// 0's as metrics.jsonl has them (elastic/incidents.h), not the trainer's
// step alone.
void expect_training_time_of_the_windows(const fs::path& run) {
  double windows_s = 0, steps_s = 0;
  std::optional<nlohmann::json> summary;
  for (const nlohmann::json& j : read_jsonl(run / "metrics.jsonl")) {
    if (j.value("kind", "") == "summary") summary = j;
    if (!j.contains("loss")) continue;
    const nlohmann::json& b = j.at("breakdown");
    windows_s += std::max(0.0, b.at("step_ms").get<double>() - b.at("ckpt_ms").get<double>() -
                                   b.at("eval_ms").get<double>()) *
                 1e-3;
    steps_s += j.at("step_ms").get<double>() * 1e-3;
  }
  ASSERT_TRUE(summary.has_value()) << "no summary in " << run / "metrics.jsonl";
  // Each step's nanoseconds are whole: 1 ns a step at most.
  EXPECT_NEAR(summary->at("productive_s").get<double>(), windows_s, 1e-6) << *summary;
  EXPECT_GT(windows_s, steps_s) << "the loop's own work between steps is training time too";
}

TEST_F(Elastic, KilledWorkerIsDetectedAtOnceAndTheRunEndsBitIdentical) {
  const std::string reference = reference_hash(4);
  expect_training_time_of_the_windows(dir_.path() / "reference4");
  const auto r = train("run", 4, {"--inject", "kill:rank=1:step=5"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("worker rank 1 (local 1, node 0) was killed by SIGKILL; restarting the "
                       "workers as generation 1 (restart 1 of 3) from the in-memory snapshot of "
                       "step "),
            std::string::npos)
      << r.err;
  const auto lines = read_failures(dir_.path() / "run" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  expect_recovered(lines[0], "crash", 1, 1000);
  EXPECT_EQ(lines[0].at("signal"), SIGKILL);
  expect_summary(lines[1], 1, 1);
  // The summary is metrics.jsonl's last record too, and said on stderr.
  EXPECT_EQ(read_jsonl(dir_.path() / "run" / "metrics.jsonl").back(), lines[1]);
  EXPECT_NE(r.err.find("brigade launch: recovered "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; ETTR "), std::string::npos) << r.err;
  // The machine's peak is measured once per job: generation 1 takes
  // generation 0's (the figure after " = " in both start-up summaries).
  const size_t measured = r.err.find("MFU is against 4 ranks x ");
  const size_t given = r.err.find(
      "MFU is against 4 ranks x the peak the job's first generation "
      "measured = ");
  ASSERT_NE(measured, std::string::npos) << r.err;
  ASSERT_NE(given, std::string::npos) << r.err;
  EXPECT_LT(measured, given);
  auto figure = [&](size_t from) {
    const std::string line = r.err.substr(from, r.err.find('\n', from) - from);
    return std::stod(line.substr(line.find(" = ") + 3));
  };
  EXPECT_NEAR(figure(given), figure(measured), 1.0) << r.err;
  // Against the failure model: no chaos mode, so the MTBF must be given.
  const std::string run = (dir_.path() / "run").string();
  const auto no_mtbf = run_brigade({"ettr", run});
  EXPECT_EQ(no_mtbf.status, 1);
  EXPECT_NE(no_mtbf.err.find("the run had no chaos mode, so its MTBF is not known: pass --mtbf-s"),
            std::string::npos)
      << no_mtbf.err;
  const auto ettr = run_brigade({"ettr", run, "--mtbf-s", "30"});
  EXPECT_EQ(ettr.status, 0) << ettr.err;
  EXPECT_NE(ettr.out.find("model ETTR"), std::string::npos) << ettr.out;
  EXPECT_NE(ettr.out.find("MTBF 30.0 s from --mtbf-s"), std::string::npos) << ettr.out;
  EXPECT_NE(ettr.out.find("the mean of 1 recovery"), std::string::npos) << ettr.out;
  EXPECT_EQ(hash("run"), reference);
  // The agent removed the snapshots with the job.
  const std::string from = " from /dev/shm/";
  const size_t at = r.err.find("resumed at step");
  ASSERT_NE(at, std::string::npos) << r.err;
  const size_t path_at = r.err.find(from, at);
  ASSERT_NE(path_at, std::string::npos) << r.err;
  const std::string snapshot = r.err.substr(path_at + 6, r.err.find('\n', path_at) - path_at - 6);
  EXPECT_FALSE(fs::exists(fs::path(snapshot).parent_path())) << snapshot;
}

// Without snapshots a restart resumes from the run directory's newest
// checkpoint, still bit-identical.
TEST_F(Elastic, WithoutSnapshotsARestartResumesFromTheNewestCheckpoint) {
  const std::vector<std::string> saves = {"--set", "train.snapshot_every=0", "--set",
                                          "train.checkpoint_every=1"};
  const std::string reference = reference_hash(2, saves);
  std::vector<std::string> args = saves;
  args.insert(args.end(), {"--inject", "kill:rank=0:step=5"});
  const auto r = train("run", 2, args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("restarting the workers as generation 1 (restart 1 of 3) from the "
                       "checkpoint of step "),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("in-memory snapshot"), std::string::npos) << r.err;
  const auto lines = read_failures(dir_.path() / "run" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  expect_recovered(lines[0], "crash", 0, 1000);
  EXPECT_EQ(hash("run"), reference);
}

TEST_F(Elastic, StoppedWorkerIsDetectedWithinThreeSecondsKilledAndTheRunEndsBitIdentical) {
  const std::string reference = reference_hash(4);
  const auto r = train("run", 4, {"--inject", "stop:rank=2:step=5"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("is stopped by a signal (state T"), std::string::npos) << r.err;
  const auto lines = read_failures(dir_.path() / "run" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  expect_recovered(lines[0], "hang", 2, 3000);
  // The stopped process itself was killed, not left stopped.
  const pid_t stopped = lines[0].at("pid").get<pid_t>();
  const auto stat = testing::proc_stat(stopped);
  EXPECT_TRUE(!stat || (*stat)[0] != "T") << "pid " << stopped << " is still stopped";
  expect_summary(lines[1], 1, 1);
  EXPECT_EQ(hash("run"), reference);
}

TEST_F(Elastic, RestartsAreBoundedAndTheLastFailureIsNamed) {
  const auto r = train(
      "run", 4, {"--max-restarts", "1", "--inject", "kill:rank=1:step=3,kill:rank=2:step=6:gen=1"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("brigade launch: worker rank 2 (local 2, node 0) was killed by SIGKILL "
                       "(after 1 restart); stopped the other 3 workers"),
            std::string::npos)
      << r.err;
  const auto lines = read_failures(dir_.path() / "run" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].at("rank"), 1);
  EXPECT_EQ(lines[0].at("generation"), 0);
  EXPECT_FALSE(lines[0].at("recovered_after_ms").is_null());
  EXPECT_EQ(lines[1].at("rank"), 2);
  EXPECT_EQ(lines[1].at("generation"), 1);
  EXPECT_TRUE(lines[1].at("recovered_after_ms").is_null());
  expect_summary(lines[2], 2, 1);
  // The newest state was only in memory: the agent kept it as a checkpoint
  // before removing the snapshots, and a resume continues from it.
  const std::string kept = "brigade launch: kept the in-memory snapshot of step ";
  const size_t at = r.err.find(kept);
  ASSERT_NE(at, std::string::npos) << r.err;
  const int64_t step = std::stoll(r.err.substr(at + kept.size()));
  EXPECT_GE(step, 4) << r.err;  // the fault came after step 6 of the second generation
  const auto resumed = train("run", 4, {"--resume", (dir_.path() / "run").string()});
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resumed at step " + std::to_string(step) + " from"),
            std::string::npos)
      << resumed.err;
}

// Over Gloo the rendezvous store outlives the killed group: without the
// generation in its keys, the restarted ranks would read the dead ones'
// addresses.
TEST_F(Elastic, GlooGroupRestartsUnderANewGeneration) {
  const std::string reference = reference_hash(2, {"--set", "parallel.backend=\"gloo\""});
  const auto r =
      train("run", 2, {"--set", "parallel.backend=\"gloo\"", "--inject", "kill:rank=0:step=5"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = read_failures(dir_.path() / "run" / "incidents.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  expect_recovered(lines[0], "crash", 0, 1000);
  EXPECT_EQ(hash("run"), reference);
}

TEST_F(Elastic, BadInjectSpecIsRefusedBeforeAnyWorkerStarts) {
  const auto r = train("run", 2, {"--inject", "kill:rank=1"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("fault 'kill:rank=1' needs rank= and step="), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_.path() / "run"));
}

TEST_F(Elastic, AnyProgramThatFailsOnceIsRunAgain) {
  const std::string out = dir_.path().string();
  // Rank 1 of the first generation fails; the second generation succeeds.
  const std::string script =
      "if [ $BRIGADE_GENERATION = 0 ] && [ $RANK = 1 ]; then exit 3; fi; "
      "echo $BRIGADE_GENERATION > " +
      out + "/done.$RANK";
  const auto r = run_brigade(
      {"launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", "sh", "-c", script});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err,
            "brigade launch: worker rank 1 (local 1, node 0) exited with status 3; restarting the "
            "workers as generation 1 (restart 1 of 1)\n");
  for (int rank : {0, 1}) {
    std::ifstream in(dir_.path() / ("done." + std::to_string(rank)));
    std::string generation;
    std::getline(in, generation);
    EXPECT_EQ(generation, "1") << "rank " << rank;
  }
  // Without restarts the same failure ends the launch.
  const auto once = run_brigade({"launch", "--nproc-per-node", "2", "--", "sh", "-c", script});
  EXPECT_EQ(once.status, 1) << once.err;
}

// `brigade launch --inject chaos:...` raises random faults on any program's
// workers. One that never beats cannot be stopped detectably (the watchdog
// hears silence only from a worker that beat), so a stop becomes a kill.
TEST_F(Elastic, LaunchChaosKillsAWorkerOfAnyProgramAndRefusesTheWorkersOwnFaults) {
  const std::string script = "if [ $BRIGADE_GENERATION -ge 1 ]; then exit 0; fi; exec sleep 60";
  const auto r = run_brigade({"launch", "--nproc-per-node", "2", "--max-restarts", "20", "--inject",
                              "chaos:mtbf=0.2:kinds=stop:seed=3", "--", "sh", "-c", script});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("brigade launch: chaos fault 1: SIGKILL to worker rank "), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("was killed by SIGKILL; restarting the workers as generation 1"),
            std::string::npos)
      << r.err;
  const auto refused = run_brigade(
      {"launch", "--nproc-per-node", "2", "--inject", "kill:rank=1:step=2", "--", "true"});
  EXPECT_EQ(refused.status, 1);
  EXPECT_NE(refused.err.find("launch --inject takes only chaos:mtbf=SECONDS"), std::string::npos)
      << refused.err;
  // A chaos spec where no launcher raises it is refused, not ignored: a
  // lone `brigade train`, and the workers of a launcher without --inject.
  const std::string fix =
      "chaos faults are raised by the launcher: add --nproc N, or pass --inject to brigade launch";
  const std::string run_dir = "train.run_dir=\"" + (dir_.path() / "lone").string() + "\"";
  const auto lone =
      run_brigade({"train", config().string(), "--set", run_dir, "--inject", "chaos:mtbf=1"});
  EXPECT_EQ(lone.status, 1) << lone.err;
  EXPECT_NE(lone.err.find(fix), std::string::npos) << lone.err;
  const auto workers =
      run_brigade({"launch", "--nproc-per-node", "1", "--", "train", config().string(), "--set",
                   run_dir, "--inject", "chaos:mtbf=1"});
  EXPECT_EQ(workers.status, 1) << workers.err;
  EXPECT_NE(workers.err.find(fix), std::string::npos) << workers.err;
  // Whole-node kinds on one node could never strike (node 0 draws none):
  // refused, under launch and under train --nproc alike.
  const std::string whole = "they need brigade launch over 2 or more nodes";
  const auto one_node = run_brigade({"launch", "--nproc-per-node", "2", "--inject",
                                     "chaos:mtbf=10:kinds=kill+kill-agent", "--", "true"});
  EXPECT_EQ(one_node.status, 1) << one_node.err;
  EXPECT_NE(one_node.err.find(whole), std::string::npos) << one_node.err;
  const auto train = run_brigade({"train", config().string(), "--nproc", "2", "--set", run_dir,
                                  "--inject", "chaos:mtbf=10:kinds=partition+kill-agent"});
  EXPECT_EQ(train.status, 1) << train.err;
  EXPECT_NE(train.err.find(whole), std::string::npos) << train.err;
}

// A run directory launched twice (the second a --resume): `brigade ettr`
// reads the last launch's records only, those after the first's summary,
// and refuses while a launch after the last summary has not ended.
TEST_F(Elastic, EttrReadsTheLastLaunchOfARunDirectory) {
  const fs::path run = dir_.path() / "twice";
  fs::create_directories(run);
  std::ofstream(run / "config.toml") << "[train]\nsnapshot_every = 2\n";
  auto summary = [](double productive_s) {
    return nlohmann::json{{"kind", "summary"},
                          {"incidents", 1},
                          {"restarts", 1},
                          {"wall_s", 10.0},
                          {"productive_s", productive_s},
                          {"lost_s", 1.0},
                          {"ettr", 0.5},
                          {"training_s", 8.0}};
  };
  auto incident = [](double detected_ms, double recovered_ms) {
    return nlohmann::json{{"kind", "crash"},
                          {"detected_after_ms", detected_ms},
                          {"recovered_after_ms", recovered_ms}};
  };
  // A step record: rank 0's breakdown (the window on the loop's clock, its
  // saves and evaluations) beside the trainer's own step time, which
  // brigade ettr does not count.
  auto step = [](double window_ms, double saves_ms) {
    return nlohmann::json{
        {"step", 1},
        {"loss", 3.0},
        {"step_ms", 1.0},
        {"breakdown",
         {{"step_ms", window_ms}, {"ckpt_ms", saves_ms / 2}, {"eval_ms", saves_ms / 2}}}};
  };
  {
    std::ofstream incidents(run / "incidents.jsonl");
    incidents << incident(100, 900) << "\n" << summary(2.0) << "\n";
    incidents << incident(10, 490) << "\n";
    // A rejoin's pause is no failure: not in the restart cost.
    incidents << nlohmann::json{{"kind", "rejoin"},
                                {"restart", false},
                                {"detected_after_ms", 10},
                                {"recovered_after_ms", 4990}}
              << "\n"
              << summary(4.0) << "\n";
    std::ofstream metrics(run / "metrics.jsonl");
    metrics << step(150, 50) << "\n" << step(150, 50) << "\n" << summary(2.0) << "\n";
    metrics << step(12, 2) << "\n" << step(36, 6) << "\n" << summary(4.0) << "\n";
  }
  const auto r = run_brigade({"ettr", run.string(), "--mtbf-s", "60", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json e = nlohmann::json::parse(r.out);
  // Training time: windows less saves, (12 - 2 + 36 - 6) / 2 ms; saves (2 + 6) / 2 ms.
  EXPECT_NEAR(e.at("step_s").get<double>(), 0.020, 1e-12) << e;
  EXPECT_NEAR(e.at("overhead_s").get<double>(), 0.004, 1e-12) << e;
  EXPECT_NEAR(e.at("restart_s").get<double>(), 0.5 - 0.020, 1e-12)
      << e;  // 10 + 490 ms, less a step
  EXPECT_DOUBLE_EQ(e.at("work_s").get<double>(), 4.0) << e;
  EXPECT_EQ(e.at("snapshot_every").get<int64_t>(), 2) << e;
  // The snapshot interval: the config's, TrainOptions' default where it
  // sets none, the checkpoints' where snapshots are off.
  auto interval_with = [&](const std::string& train_table) {
    std::ofstream(run / "config.toml") << "[train]\n" << train_table;
    const auto with = run_brigade({"ettr", run.string(), "--mtbf-s", "60", "--json"});
    EXPECT_EQ(with.status, 0) << with.err;
    return nlohmann::json::parse(with.out).at("snapshot_every").get<int64_t>();
  };
  const int64_t by_default = TrainOptions{}.snapshot_every;
  EXPECT_EQ(interval_with("checkpoint_every = 5\n"), by_default > 0 ? by_default : 5);
  EXPECT_EQ(interval_with("snapshot_every = 3\ncheckpoint_every = 5\n"), 3);
  EXPECT_EQ(interval_with("snapshot_every = 0\ncheckpoint_every = 5\n"), 5);
  // A third launch with steps and no summary yet.
  std::ofstream(run / "metrics.jsonl", std::ios::app) << step(12, 2) << "\n";
  const auto running = run_brigade({"ettr", run.string(), "--mtbf-s", "60"});
  EXPECT_EQ(running.status, 1) << running.out;
  EXPECT_NE(running.err.find("has step records after the last summary: the run directory was "
                             "launched again and that launch has not ended"),
            std::string::npos)
      << running.err;
}

// The machine peak the agent hands a restarted generation is checked.
TEST_F(Elastic, AMalformedMachinePeakIsRefused) {
  testing::ScopedEnv env;
  env.set("BRIGADE_MACHINE_PEAK", "12x");
  const auto r = run_brigade({"train", config().string(), "--set",
                              "train.run_dir=\"" + (dir_.path() / "peak").string() + "\""});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("BRIGADE_MACHINE_PEAK='12x' is not a machine peak in GFLOP/s (> 0): "
                       "brigade launch sets it for restarted workers; unset it"),
            std::string::npos)
      << r.err;
}

// The user's SIGTERM stops the job with the signal's status, restarts left or not.
TEST_F(Elastic, SigtermStopsTheJobWithoutARestart) {
  const fs::path err = dir_.path() / "launch.err";
  const std::string script = "echo $$ > " + dir_.path().string() + "/tmp.$RANK && mv " +
                             dir_.path().string() + "/tmp.$RANK " + dir_.path().string() +
                             "/pid.$RANK && exec sleep 30";
  std::fflush(nullptr);
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::freopen(err.c_str(), "w", stderr);
    ::execl(testing::kBrigade, testing::kBrigade, "launch", "--nproc-per-node", "2",
            "--max-restarts", "3", "--", "sh", "-c", script.c_str(), nullptr);
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((!fs::exists(dir_.path() / "pid.0") || !fs::exists(dir_.path() / "pid.1")) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(launcher, SIGTERM);
  int wait_status = 0;
  pid_t done = 0;
  while ((done = ::waitpid(launcher, &wait_status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (done == 0) {
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, &wait_status, 0);
    FAIL() << "the launcher did not stop on SIGTERM";
  }
  ASSERT_TRUE(WIFEXITED(wait_status)) << wait_status;
  EXPECT_EQ(WEXITSTATUS(wait_status), 128 + SIGTERM);
  std::ifstream in(err);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(text, "brigade launch: received SIGTERM; stopped 2 workers\n");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
