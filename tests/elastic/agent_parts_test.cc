// The elastic agent's parts, each alone: the watchdog's verdicts on a fake
// clock, heartbeats through a real table and thread, fault specs, the
// ETTR arithmetic, and a worker group's start, reaping, inherited
// descriptor and clean-up. The agent as a whole runs in
// tests/cli/elastic_test.cc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "brigade/comm/communicator.h"
#include "brigade/comm/flight_recorder.h"
#include "brigade/comm/world.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/fault_injection.h"
#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/incident_evidence.h"
#include "brigade/elastic/incidents.h"
#include "brigade/elastic/watchdog.h"
#include "brigade/elastic/worker_group.h"
#include "testing/temp_dir.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

constexpr int64_t kMs = 1'000'000;

TEST(Watchdog, SilenceBeyondTheHeartbeatTimeoutIsAHang) {
  const WatchdogOptions options;  // 2 s, 600 s
  WorkerProgress p;
  p.beat_ns = 10'000 * kMs;
  EXPECT_FALSE(check_progress(p, p.beat_ns + 2'000 * kMs, options));
  const auto stall = check_progress(p, p.beat_ns + 2'001 * kMs, options);
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->kind, Stall::Kind::kSilent);
  EXPECT_EQ(stall->since_ns, p.beat_ns);
  EXPECT_NE(stall->what.find("no heartbeat for 2.0 s"), std::string::npos) << stall->what;
}

TEST(Watchdog, AWorkerTheKernelHoldsStoppedIsAHangOnceItsBeatIsLate) {
  const WatchdogOptions options;  // stopped_after_ms 250
  WorkerProgress p;
  p.beat_ns = 10'000 * kMs;
  EXPECT_FALSE(beat_is_late(p, p.beat_ns + 250 * kMs, options));
  EXPECT_TRUE(beat_is_late(p, p.beat_ns + 251 * kMs, options));
  // Stopped, but its last beat is recent: not yet.
  EXPECT_FALSE(check_progress(p, p.beat_ns + 250 * kMs, options, /*stopped=*/true));
  // Late and not stopped: the 2 s silence still decides.
  EXPECT_FALSE(check_progress(p, p.beat_ns + 251 * kMs, options, /*stopped=*/false));
  const auto stall = check_progress(p, p.beat_ns + 251 * kMs, options, /*stopped=*/true);
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->kind, Stall::Kind::kSilent);
  EXPECT_EQ(stall->since_ns, p.beat_ns);
  EXPECT_NE(stall->what.find("stopped by a signal"), std::string::npos) << stall->what;
}

TEST(Watchdog, TheKernelSaysWhetherAWorkerIsStoppedByASignal) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) ::pause();
  }
  int status = 0;
  EXPECT_FALSE(stopped_by_signal(child));
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_TRUE(stopped_by_signal(child));
  ASSERT_EQ(::kill(child, SIGCONT), 0);
  ASSERT_EQ(::waitpid(child, &status, WCONTINUED), child);
  EXPECT_FALSE(stopped_by_signal(child));
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  EXPECT_FALSE(stopped_by_signal(child));  // gone
  EXPECT_FALSE(stopped_by_signal(-1));
}

TEST(Watchdog, AWorkerThatNeverBeatIsWatchedForItsExitOnly) {
  const WorkerProgress never;  // beat_ns 0: another program, or still starting
  EXPECT_FALSE(check_progress(never, 1'000'000 * kMs, WatchdogOptions{}));
}

TEST(Watchdog, BeatingWithoutStepsIsStuckOnlyAfterTheStepTimeout) {
  WatchdogOptions options;
  options.step_timeout_ms = 30'000;
  WorkerProgress p;
  const int64_t t0 = 5'000 * kMs;
  p.start_step = 7;
  p.step = 9;
  p.step_ns = t0;
  // Beating all along: only the step clock can say anything.
  p.beat_ns = t0 + 30'000 * kMs;
  EXPECT_FALSE(check_progress(p, t0 + 30'000 * kMs, options));
  p.beat_ns = t0 + 30'001 * kMs;
  const auto stall = check_progress(p, t0 + 30'001 * kMs, options);
  ASSERT_TRUE(stall);
  EXPECT_EQ(stall->kind, Stall::Kind::kStuck);
  EXPECT_EQ(stall->since_ns, t0);
  EXPECT_NE(stall->what.find("after step 9"), std::string::npos) << stall->what;
  // Set-up (no start_step yet) is not timed by the step clock.
  p.start_step = -1;
  EXPECT_FALSE(check_progress(p, t0 + 30'001 * kMs, options));
}

// Waits for a condition, polling: the heartbeat thread runs on its own time.
template <typename Condition>
bool eventually(Condition condition, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST(Heartbeat, AWorkerBeatsAndReportsItsStepsThroughItsOwnSlot) {
  HeartbeatTable table(2, /*generation=*/3);
  EXPECT_EQ(table.read(1).generation, 3);
  EXPECT_EQ(table.read(1).start_step, -1);
  int64_t first_beat = 0;
  {
    WorkerHeartbeat worker(::dup(table.fd()), /*local_rank=*/1, /*generation=*/3);
    const WorkerProgress p = table.read(1);
    EXPECT_EQ(p.pid, ::getpid());
    first_beat = p.beat_ns;
    EXPECT_GT(first_beat, 0);
    EXPECT_TRUE(eventually([&] { return table.read(1).beat_ns > first_beat; }))
        << "the heartbeat thread never beat again";
    worker.started(4, "/runs/a");
    // The trainer's step, and the training time the ETTR counts (its
    // window on the loop's clock less saves and evaluations).
    worker.step_done(5, 250 * kMs, 270 * kMs);
    StepStats stats;
    stats.loss = 2.5;
    stats.part_ms[static_cast<size_t>(StepPart::kCompute)] = 300;
    stats.part_ms[static_cast<size_t>(StepPart::kOther)] = 0.5;
    worker.step_stats(stats);
    worker.step_done(6, 350 * kMs, 380 * kMs);
    const WorkerProgress q = table.read(1);
    EXPECT_EQ(q.start_step, 4);
    EXPECT_EQ(q.step, 6);
    EXPECT_EQ(q.train_ns, 650 * kMs);
    EXPECT_EQ(q.last_step_ns, 350 * kMs);
    EXPECT_GT(q.first_step_ns, 0);
    EXPECT_LE(q.first_step_ns, q.step_ns);
    EXPECT_EQ(q.run_dir, "/runs/a");
    // The step's numbers, its parts included (the agent's /metrics).
    EXPECT_EQ(q.stats.loss, 2.5);
    EXPECT_EQ(q.stats.part_ms[static_cast<size_t>(StepPart::kCompute)], 300);
    EXPECT_EQ(q.stats.part_ms[static_cast<size_t>(StepPart::kOther)], 0.5);
    EXPECT_TRUE(std::isnan(q.stats.part_ms[static_cast<size_t>(StepPart::kData)]))
        << "a part the step did not report";
    EXPECT_EQ(q.fault_ns, 0);
    worker.fault_injected();
    EXPECT_GT(table.read(1).fault_ns, 0);
    // The other slot is untouched.
    EXPECT_EQ(table.read(0).beat_ns, 0);
    EXPECT_EQ(table.read(0).pid, 0);
  }
  // The worker is gone: its slot falls silent, which the watchdog calls a hang.
  const WorkerProgress last = table.read(1);
  EXPECT_TRUE(check_progress(last, last.beat_ns + 2'100 * kMs, WatchdogOptions{}));
}

// A node fault's step: the worker stops there, reporting it, and goes on
// only when the agent lets it (so the fault cannot land steps later).
TEST(Heartbeat, AHeldWorkerWaitsAfterTheStepUntilReleased) {
  HeartbeatTable table(1, /*generation=*/0);
  table.hold_after(2);
  WorkerHeartbeat worker(::dup(table.fd()), 0, /*generation=*/0);
  worker.started(0, "/runs/a");
  std::atomic<int64_t> returned{0};
  std::thread loop([&] {
    for (int64_t step = 1; step <= 3; ++step) {
      worker.step_done(step, kMs, kMs);
      returned.store(step);
    }
  });
  EXPECT_TRUE(eventually([&] { return table.read(0).step == 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(returned.load(), 1) << "step_done(2) returned while held";
  EXPECT_EQ(table.read(0).step, 2);
  table.hold_after(0);
  loop.join();
  EXPECT_EQ(returned.load(), 3);
  EXPECT_EQ(table.read(0).step, 3);
}

TEST(Heartbeat, AWorkerOfAnotherGenerationIsRefused) {
  HeartbeatTable table(1, /*generation=*/2);
  try {
    WorkerHeartbeat stale(::dup(table.fd()), 0, /*generation=*/1);
    FAIL() << "a generation-1 worker joined generation 2's table";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to generation 1 but its heartbeat table to "
                                         "generation 2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(table.read(0).beat_ns, 0);
}

TEST(FaultInjection, SpecsParseAndBelongToOneGeneration) {
  const auto faults = parse_faults("kill:rank=1:step=5,stop:rank=2:step=8:gen=1");
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_EQ(faults[0].kind, InjectedFault::Kind::kKill);
  EXPECT_EQ(faults[1].kind, InjectedFault::Kind::kStop);
  EXPECT_EQ(faults[1].generation, 1);
  EXPECT_EQ(fault_after_step(faults, 1, 0, 5), &faults[0]);
  EXPECT_EQ(fault_after_step(faults, 1, 1, 5), nullptr) << "a restart must not re-inject";
  EXPECT_EQ(fault_after_step(faults, 1, 0, 4), nullptr);
  EXPECT_EQ(fault_after_step(faults, 0, 0, 5), nullptr);
  EXPECT_EQ(fault_after_step(faults, 2, 1, 8), &faults[1]);
  EXPECT_EQ(fault_after_step(faults, 2, 0, 8), nullptr);
  EXPECT_TRUE(parse_faults("").empty());
}

TEST(FaultInjection, SkipMismatchAndSlowParseAndBelongToOneGeneration) {
  const auto faults =
      parse_faults("skip:rank=1:step=3,mismatch:rank=2:step=4:gen=1,slow:rank=3:factor=2");
  ASSERT_EQ(faults.size(), 3u);
  EXPECT_EQ(faults[0].kind, InjectedFault::Kind::kSkip);
  EXPECT_EQ(faults[1].kind, InjectedFault::Kind::kMismatch);
  EXPECT_EQ(faults[2].kind, InjectedFault::Kind::kSlow);
  EXPECT_EQ(fault_after_step(faults, 1, 0, 3), &faults[0]);
  EXPECT_EQ(fault_after_step(faults, 2, 1, 4), &faults[1]);
  EXPECT_EQ(fault_after_step(faults, 2, 0, 4), nullptr) << "a restart must not re-inject";
  // A slow rank is slow in every step of its generation, never a one-off fault.
  EXPECT_EQ(fault_after_step(faults, 3, 0, 0), nullptr);
  EXPECT_EQ(slow_factor(faults, 3, 0), 2);
  EXPECT_EQ(slow_factor(faults, 3, 1), 1);
  EXPECT_EQ(slow_factor(faults, 1, 0), 1);
}

TEST(FaultInjection, SdcAndNanParse) {
  const auto faults = parse_faults(
      "sdc:rank=2:step=4,nan:rank=1:step=3:times=2,nan:rank=0:step=5,"
      "sdc:rank=3:step=2:when=forward,sdc:rank=3:step=6:what=moment:when=after");
  ASSERT_EQ(faults.size(), 5u);
  EXPECT_EQ(faults[0].kind, InjectedFault::Kind::kSdc);
  EXPECT_FALSE(faults[0].in_forward || faults[0].in_moment);
  EXPECT_EQ(fault_after_step(faults, 2, 0, 4), &faults[0]);
  // A NaN loss and a flip during the forward happen inside their step.
  EXPECT_EQ(fault_after_step(faults, 1, 0, 3), nullptr);
  EXPECT_EQ(fault_after_step(faults, 3, 0, 2), nullptr);
  const auto nans = in_step_faults(faults, 1, 0);
  ASSERT_EQ(nans.size(), 1u);
  EXPECT_EQ(nans[0].step, 3);
  EXPECT_EQ(nans[0].times, 2);
  EXPECT_EQ(in_step_faults(faults, 0, 0).at(0).times, 1);
  EXPECT_TRUE(in_step_faults(faults, 0, 1).empty()) << "a restart must not re-inject";
  const auto forward = in_step_faults(faults, 3, 0);
  ASSERT_EQ(forward.size(), 1u);
  EXPECT_TRUE(forward[0].in_forward);
  EXPECT_EQ(forward[0].step, 2);
  EXPECT_EQ(fault_after_step(faults, 3, 0, 6), &faults[4]);
  EXPECT_TRUE(faults[4].in_moment);
  EXPECT_FALSE(faults[4].in_forward);
}

TEST(FaultInjection, MalformedSpecsAreNamed) {
  auto error_of = [](const std::string& spec) {
    try {
      parse_faults(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error_of("boom:rank=1:step=2").find("unknown kind 'boom'"), std::string::npos);
  EXPECT_NE(error_of("kill:rank=1").find("needs rank= and step="), std::string::npos);
  EXPECT_NE(error_of("kill:rank=1:step=0").find("a step from 1 on"), std::string::npos);
  EXPECT_NE(error_of("kill:rank=x:step=1").find("rank wants a non-negative integer, got 'x'"),
            std::string::npos);
  EXPECT_NE(error_of("kill:rank=1:step=2:when=3").find("unknown or repeated key 'when'"),
            std::string::npos);
  EXPECT_NE(error_of("kill:rank=1:step=2,").find("unknown kind ''"), std::string::npos);
  EXPECT_NE(error_of("slow:rank=1").find("needs rank= and factor="), std::string::npos);
  EXPECT_NE(error_of("slow:rank=1:factor=0").find("factor= (1 or more)"), std::string::npos);
  EXPECT_NE(error_of("slow:rank=1:step=2:factor=2").find("unknown or repeated key 'step'"),
            std::string::npos);
  EXPECT_NE(error_of("skip:rank=1:factor=2").find("unknown or repeated key 'factor'"),
            std::string::npos);
  EXPECT_NE(error_of("nan:rank=1:step=2:times=0").find("times= wants 1 or more"),
            std::string::npos);
  EXPECT_NE(error_of("sdc:rank=1:step=2:times=2").find("unknown or repeated key 'times'"),
            std::string::npos);
  EXPECT_NE(error_of("sdc:rank=1:step=2:when=later").find("when= is forward"), std::string::npos);
  EXPECT_NE(error_of("kill:rank=1:step=2:when=forward").find("unknown or repeated key 'when'"),
            std::string::npos);
  EXPECT_NE(error_of("sdc:rank=1:step=2:what=param").find("what= is moment"), std::string::npos);
  EXPECT_NE(error_of("sdc:rank=1:step=2:what=grad:when=forward").find("when= does not apply"),
            std::string::npos);
}

// A flip in the local gradient happens inside its step, between backward
// and reduce: the trainer's, not the loop's after the step.
TEST(FaultInjection, AGradientFlipIsRaisedInsideItsStep) {
  const auto faults = parse_faults("sdc:rank=1:step=4:what=grad");
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_TRUE(faults[0].in_grad);
  EXPECT_FALSE(faults[0].in_moment || faults[0].in_forward);
  EXPECT_EQ(fault_after_step(faults, 1, 0, 4), nullptr);
  const auto in_step = in_step_faults(faults, 1, 0);
  ASSERT_EQ(in_step.size(), 1u);
  EXPECT_EQ(in_step[0].step, 4);
  EXPECT_TRUE(in_step_faults(faults, 1, 1).empty()) << "a restart must not re-inject";
}

// The agent's request for evidence is answered by the heartbeat thread
// alone: the flight recorder lands in RUN_DIR/incidents/<N>/ and the slot
// says so, while the worker's own thread does nothing.
TEST(Heartbeat, ADumpRequestIsAnsweredWithTheFlightRecorderInTheIncidentsDirectory) {
  testing::TempDir run("brigade_dump_request");
  HeartbeatTable table(1, 0);
  WorkerHeartbeat worker(::dup(table.fd()), 0, 0);
  FlightRecorder& recorder = FlightRecorder::global();
  const auto group = recorder.add_group({"dumptest", 0, 2, {7, 8}});
  recorder.scheduled(group, RecordKind::kCollective, 0, "shm", "all_reduce(count 1, f64, max)", 8,
                     true);
  worker.started(0, run.path().string());
  table.request_dump(0, 4);
  const int64_t deadline = now_ns() + 30'000 * kMs;
  while (table.read(0).dump_done != 4 && now_ns() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(table.read(0).dump_done, 4);
  const auto dump = run.path() / "incidents" / "4" / "flight_recorder_rank7_dumptest.json";
  ASSERT_TRUE(std::filesystem::exists(dump));
  std::ifstream in(dump);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("records").at(0).at("state"), "started");
  recorder.close_group(group);
}

// A worker that died of a communication error left its dump in the run
// directory: it is this incident's evidence only if it is that process's.
TEST(IncidentEvidence, ExitDumpsAreCopiedOnlyForTheWorkersOwnPid) {
  testing::TempDir run("brigade_exit_dumps");
  const auto incident = incident_dir(run.path(), 2);
  std::filesystem::create_directories(incident);
  std::ofstream(run.path() / "flight_recorder_rank1_world.json") << R"({"pid": 41, "records": []})";
  std::ofstream(run.path() / "flight_recorder_rank1_tp0.json") << R"({"pid": 40, "records": []})";
  std::ofstream(run.path() / "flight_recorder_rank2_world.json") << R"({"pid": 41, "records": []})";
  std::ofstream(run.path() / "flight_recorder_rank1_dp0.json") << "{\"pid\": 4";  // half-written
  EXPECT_TRUE(copy_exit_dumps(run.path(), incident, 1, 41));
  EXPECT_TRUE(std::filesystem::exists(incident / "flight_recorder_rank1_world.json"));
  EXPECT_FALSE(std::filesystem::exists(incident / "flight_recorder_rank1_tp0.json"));
  EXPECT_FALSE(std::filesystem::exists(incident / "flight_recorder_rank2_world.json"));
  EXPECT_FALSE(std::filesystem::exists(incident / "flight_recorder_rank1_dp0.json"));
  EXPECT_FALSE(copy_exit_dumps(run.path(), incident, 3, 41));
  EXPECT_EQ(incident, run.path() / "incidents" / "2");
}

// A replica check's report is moved: the run directory keeps none.
TEST(IncidentEvidence, CorruptionReportsAreMovedForTheWorkersOwnPid) {
  testing::TempDir run("brigade_sdc_reports");
  const auto incident = incident_dir(run.path(), 1);
  std::filesystem::create_directories(incident);
  std::ofstream(run.path() / "sdc_rank1_step4.json") << R"({"pid": 41, "step": 4})";
  std::ofstream(run.path() / "sdc_rank1_step2.json") << R"({"pid": 40, "step": 2})";
  EXPECT_TRUE(copy_corruption_reports(run.path(), incident, 1, 41));
  EXPECT_TRUE(std::filesystem::exists(incident / "sdc_rank1_step4.json"));
  EXPECT_FALSE(std::filesystem::exists(run.path() / "sdc_rank1_step4.json"));
  EXPECT_FALSE(std::filesystem::exists(incident / "sdc_rank1_step2.json"));
  EXPECT_TRUE(std::filesystem::exists(run.path() / "sdc_rank1_step2.json"));
  EXPECT_FALSE(copy_corruption_reports(run.path(), incident, 1, 41));
}

TEST(IncidentEvidence, TheAgentsViewGivesAgesAtDetection) {
  Incident incident;
  incident.kind = "hang";
  incident.rank = 1;
  incident.what = "worker rank 1 sent no heartbeat";
  WorkerView stopped;
  stopped.rank = 1;
  stopped.local_rank = 1;
  stopped.running = true;
  stopped.progress.beat_ns = 1'000 * kMs;
  stopped.progress.step_ns = 900 * kMs;
  stopped.progress.step = 7;
  WorkerView crashed;
  crashed.rank = 2;
  crashed.running = false;
  crashed.signal = SIGKILL;
  const nlohmann::json view = agent_view(incident, 5, 0, 4, 3'100 * kMs, {stopped, crashed});
  EXPECT_EQ(view.at("incident"), 5);
  EXPECT_EQ(view.at("detected").at("rank"), 1);
  const nlohmann::json& w = view.at("workers").at(0);
  EXPECT_DOUBLE_EQ(w.at("beat_age_ms").get<double>(), 2'100.0);
  EXPECT_DOUBLE_EQ(w.at("step_age_ms").get<double>(), 2'200.0);
  EXPECT_EQ(w.at("step"), 7);
  EXPECT_TRUE(w.at("exit_code").is_null());
  EXPECT_TRUE(view.at("workers").at(1).at("beat_age_ms").is_null()) << "never beat";
  EXPECT_EQ(view.at("workers").at(1).at("signal"), SIGKILL);
}

// Generation 0 reached step 58; generation 1 resumed from 58 and failed
// during its restart, before its first step; generation 2 went back to
// step 0: generation 1's incident lost the 58 steps, at generation 0's pace.
TEST(Incidents, AFaultDuringARecoveryLosesTheStepsTheJobHadDone) {
  JobProgress progress;
  Incident first;
  first.last_step = 58;
  first.mean_step_ms = 200;
  progress.account(first);
  progress.saw(58);  // generation 0 ended
  first.resumed_from_step = 58;
  EXPECT_EQ(first.steps_lost(), 0);
  Incident during;  // generation 1's workers completed no step
  during.last_step = 0;
  progress.account(during);
  progress.saw(0);
  during.resumed_from_step = 0;
  EXPECT_EQ(during.last_step, 58);
  EXPECT_EQ(during.steps_lost(), 58);
  EXPECT_DOUBLE_EQ(during.mean_step_ms, 200);
  first.recovered_ns = first.fault_ns;  // the recoveries' own time is not the point here
  during.recovered_ns = during.fault_ns;
  const RunSummary s =
      summarize({first, during}, {{0, 58, 11'600 * kMs}, {58, 58, 0}, {0, 100, 20'000 * kMs}}, 2, 0,
                40'000 * kMs);
  EXPECT_NEAR(s.lost_s, 58 * 0.2, 1e-9);
}

TEST(Incidents, EttrCountsOnlyTheStepsTheResultKeeps) {
  // Generation 0 trained steps 0..6 in 600 ms, then failed; generation 1
  // resumed from step 5 (the newest checkpoint) and trained 5..10 in 500 ms.
  std::vector<GenerationRecord> generations = {{0, 6, 600 * kMs}, {5, 10, 500 * kMs}};
  Incident crash;
  crash.kind = "crash";
  crash.fault_ns = 1'000 * kMs;
  crash.detected_ns = 1'002 * kMs;
  crash.recovered_ns = 1'402 * kMs;
  crash.last_step = 6;
  crash.resumed_from_step = 5;
  crash.mean_step_ms = 100;
  EXPECT_EQ(crash.steps_lost(), 1);
  EXPECT_DOUBLE_EQ(crash.detected_after_ms(), 2.0);
  EXPECT_DOUBLE_EQ(*crash.recovered_after_ms(), 400.0);
  const RunSummary s = summarize({crash}, generations, 1, 0, 2'000 * kMs);
  EXPECT_DOUBLE_EQ(s.wall_s, 2.0);
  EXPECT_NEAR(s.productive_s, 0.6 * 5 / 6 + 0.5, 1e-12);
  EXPECT_NEAR(s.ettr, s.productive_s / 2.0, 1e-12);
  EXPECT_NEAR(s.lost_s, 0.402 + 0.1, 1e-12);
  const auto j = crash.to_json();
  EXPECT_EQ(j.at("steps_lost"), 1);
  EXPECT_EQ(j.at("signal"), nullptr);
  EXPECT_EQ(s.to_json().at("kind"), "summary");
  // A generation that never trained counts nothing, and does not end the
  // kept history of the one before it.
  generations.insert(generations.begin() + 1, GenerationRecord{});
  EXPECT_NEAR(summarize({crash}, generations, 2, 0, 2'000 * kMs).productive_s, s.productive_s,
              1e-12);
}

Program shell(const std::string& script) {
  return {"/bin/sh", {"sh", "-c", script}};
}

// Reaps until every worker has exited; false past the limit.
bool reap_all(WorkerGroup& group, std::vector<WorkerExit>& exits) {
  return eventually([&] {
    for (const WorkerExit& e : group.reap()) exits.push_back(e);
    return group.running() == 0;
  });
}

TEST(WorkerGroup, StartsRanksWithTheirVariablesAndTheInheritedDescriptorOnly) {
  testing::TempDir dir("brigade_worker_group");
  HeartbeatTable table(2, 0), other(1, 0);
  Environment env;
  env.set("DIR", dir.path().string());
  env.set("FD", std::to_string(table.fd()));
  env.set("OTHER_FD", std::to_string(other.fd()));
  // Exit status: 10 + local rank, plus 50 if the table's descriptor is
  // missing, plus 100 if the other one leaked in.
  const std::string script =
      "echo $RANK $LOCAL_RANK > $DIR/w$LOCAL_RANK; s=$((10 + LOCAL_RANK)); "
      "[ -e /proc/self/fd/$FD ] || s=$((s + 50)); [ -e /proc/self/fd/$OTHER_FD ] && s=$((s + "
      "100)); exit $s";
  sigset_t mask;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  WorkerGroup group(shell(script), env, /*first_rank=*/4, /*count=*/2, mask, table.fd());
  std::vector<WorkerExit> exits;
  ASSERT_TRUE(reap_all(group, exits));
  ASSERT_EQ(exits.size(), 2u);
  for (const WorkerExit& e : exits) {
    EXPECT_TRUE(e.failed());
    EXPECT_EQ(describe_exit(e.wait_status),
              "exited with status " + std::to_string(10 + e.worker.local_rank));
    std::ifstream in(dir.path() / ("w" + std::to_string(e.worker.local_rank)));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line,
              std::to_string(4 + e.worker.local_rank) + " " + std::to_string(e.worker.local_rank));
  }
}

// The workers' GLIBC_TUNABLES: the malloc cache off, added to what the user
// set, and the user's own cache size kept.
TEST(WorkerGroup, WorkersRunWithoutGlibcsMallocCacheUnlessTheUserSizedIt) {
  EXPECT_EQ(worker_glibc_tunables(""), "glibc.malloc.tcache_count=0");
  EXPECT_EQ(worker_glibc_tunables("glibc.malloc.arena_max=2"),
            "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0");
  EXPECT_EQ(worker_glibc_tunables("glibc.malloc.tcache_count=3"), "glibc.malloc.tcache_count=3");
  EXPECT_EQ(worker_glibc_tunables("glibc.malloc.arena_max=2:glibc.malloc.tcache_count=3"),
            "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=3");
  EXPECT_EQ(worker_glibc_tunables("glibc.malloc.arena_max=2:"),
            "glibc.malloc.arena_max=2::glibc.malloc.tcache_count=0");  // glibc skips the empty one
  // A name that merely ends the same way is not the cache's size.
  EXPECT_EQ(worker_glibc_tunables("x.glibc.malloc.tcache_count=3"),
            "x.glibc.malloc.tcache_count=3:glibc.malloc.tcache_count=0");
}

// A rejoin takes a number (its generation) and keeps no evidence: the next
// launch's first incident must not be given that number again.
TEST(IncidentEvidence, ANumberTakenWithoutADirectoryIsNotGivenAgain) {
  testing::TempDir run("brigade_evidence");
  fs::create_directories(run.path() / "incidents" / "1");
  std::ofstream(run.path() / "incidents.jsonl") << R"({"kind":"crash","number":1})"
                                                << "\n"
                                                << R"({"kind":"rejoin","number":2,"restart":false})"
                                                << "\n"
                                                << R"({"kind":"summary"})"
                                                << "\n"
                                                << R"({"kind":"crash","num)";  // torn by a kill
  EXPECT_EQ(last_incident_number(run.path()), 2);
}

// Nodes share the run directory: node 1's agent, told incident 1 (the job's
// number), writes its own view beside node 0's, in the same directory.
TEST(IncidentEvidence, EachNodeWritesItsViewIntoTheJobsIncidentNumber) {
  testing::TempDir run("brigade_evidence");
  EXPECT_EQ(last_incident_number(run.path()), 0);
  fs::create_directories(run.path() / "incidents" / "1");
  fs::create_directories(run.path() / "incidents" / "notes");
  std::ofstream(run.path() / "incidents" / "1" / agent_view_file(0)) << "{\"node\": 0}";
  EXPECT_EQ(last_incident_number(run.path()), 1);
  HeartbeatTable table(1, 0);
  sigset_t mask;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  WorkerGroup group(shell("exit 3"), Environment(), /*first_rank=*/1, /*count=*/1, mask,
                    table.fd());
  std::vector<WorkerExit> exits;
  ASSERT_TRUE(reap_all(group, exits));
  Incident incident;
  incident.rank = 1;
  const fs::path dir = keep_evidence(group, table, {{1, exits.at(0).wait_status}}, run.path(),
                                     /*node=*/1, /*nproc_per_node=*/1, /*number=*/1, incident);
  EXPECT_EQ(dir, run.path() / "incidents" / "1");
  std::ifstream mine(run.path() / "incidents" / "1" / "agent_node1.json");
  ASSERT_TRUE(mine.good());
  const nlohmann::json view = nlohmann::json::parse(mine);
  EXPECT_EQ(view.at("node"), 1);
  EXPECT_EQ(view.at("workers").at(0).at("exit_code"), 3);
  std::ifstream theirs(run.path() / "incidents" / "1" / "agent_node0.json");
  EXPECT_EQ(nlohmann::json::parse(theirs), (nlohmann::json{{"node", 0}}));
}

// A live worker that beat a moment ago and then never answers its dump
// request keeps the agent waiting out the whole evidence wait (1 s); the
// agent's own beat to the coordinator goes on meanwhile, or a loaded node
// collecting evidence would be declared lost by the leader.
TEST(IncidentEvidence, TheAgentKeepsBeatingWhileItWaitsForDumps) {
  testing::TempDir run("brigade_evidence");
  HeartbeatTable table(1, 0);
  sigset_t mask;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  WorkerGroup group(shell("sleep 30"), Environment(), /*first_rank=*/0, /*count=*/1, mask,
                    table.fd());
  {
    // The worker's beat, stopped before the request: nobody answers it.
    WorkerHeartbeat beat(::dup(table.fd()), /*local_rank=*/0, /*generation=*/0);
    ASSERT_TRUE(eventually([&] { return table.read(0).beat_ns > 0; }));
  }
  Incident incident;
  incident.rank = 0;
  int beats = 0;
  const fs::path dir =
      keep_evidence(group, table, {}, run.path(), /*node=*/0,
                    /*nproc_per_node=*/1, /*number=*/1, incident, [&] { ++beats; });
  group.stop(SIGKILL, 0);
  std::vector<WorkerExit> exits;
  ASSERT_TRUE(reap_all(group, exits));
  EXPECT_EQ(dir, run.path() / "incidents" / "1");
  EXPECT_GE(incident.evidence_ms, 0.9 * kEvidenceWaitMs);
  // One beat per kEvidenceKeepAliveMs of the wait, the first at once; a
  // loaded machine may miss a few.
  EXPECT_GE(beats, kEvidenceWaitMs / kEvidenceKeepAliveMs / 2) << incident.evidence_ms << " ms";
}

TEST(WorkerGroup, StoppingKillsAfterTheGraceAndTheDestructorLeavesNoWorker) {
  testing::TempDir dir("brigade_worker_group");
  sigset_t mask;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  pid_t survivor = -1;
  {
    // Ignores SIGTERM (once it says so): only the SIGKILL at the end of the
    // grace ends it.
    Environment env;
    env.set("READY", (dir.path() / "ready").string());
    WorkerGroup group(shell("trap '' TERM; touch $READY; while :; do sleep 0.05; done"), env, 0, 1,
                      mask);
    ASSERT_TRUE(eventually([&] { return std::filesystem::exists(dir.path() / "ready"); }));
    group.stop(SIGTERM, /*grace_ms=*/200);
    std::vector<WorkerExit> exits;
    ASSERT_TRUE(eventually([&] {
      group.enforce_grace();
      for (const WorkerExit& e : group.reap()) exits.push_back(e);
      return group.running() == 0;
    }));
    ASSERT_EQ(exits.size(), 1u);
    EXPECT_EQ(describe_exit(exits[0].wait_status), "was killed by SIGKILL");
    WorkerGroup left(shell("exec sleep 30"), Environment(), 0, 1, mask);
    survivor = left.workers()[0].pid;
    EXPECT_EQ(::kill(survivor, 0), 0);
  }
  // Killed and reaped: the pid no longer names a process of ours.
  EXPECT_EQ(::kill(survivor, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

// A restarted generation must not open a segment a killed one left behind:
// the worker's environment puts the generation into the segment's name.
TEST(Generations, ShmSegmentsOfEachGenerationHaveTheirOwnName) {
  const std::vector<std::pair<const char*, const char*>> world = {
      {"RANK", "1"},
      {"WORLD_SIZE", "2"},
      {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", "1"},
      {"BRIGADE_STORE_TOKEN", "generations-test"},
      {"BRIGADE_GENERATION", "3"}};
  for (const auto& [name, value] : world) ::setenv(name, value, 1);
  EXPECT_EQ(read_world_environment().generation, 3);
  const std::string segment = shm_segment_name("generations-test", "world", 3);
  EXPECT_NE(segment, shm_segment_name("generations-test", "world", 2));
  EXPECT_NE(segment.find("-g3-world"), std::string::npos) << segment;
  // Rank 1 alone: rank 0 never creates the segment, and the error names it.
  std::string error;
  try {
    connect_world("shm", /*timeout_ms=*/100);
  } catch (const CommError& e) {
    error = e.what();
  }
  for (const auto& [name, value] : world) ::unsetenv(name);
  EXPECT_NE(error.find("segment " + segment + " was not created"), std::string::npos) << error;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

// The agent's whole-node faults: launch --inject's, beside chaos; a
// worker's fault there, or a node fault given to the workers, is refused
// naming where it belongs.
TEST(FaultInjection, NodeFaultsAreTheLaunchersAndParsedWithTheirGeneration) {
  const auto faults = parse_node_faults(
      "kill-agent:node=1:step=4,chaos:mtbf=30,partition:node=2:step=6:gen=1,"
      "hold:node=0:step=2:gen=1");
  ASSERT_EQ(faults.size(), 3u);
  EXPECT_EQ(faults[2].kind, NodeFault::Kind::kHold);
  EXPECT_EQ(faults[2].node, 0);
  EXPECT_EQ(faults[2].step, 2);
  EXPECT_EQ(faults[2].generation, 1);
  EXPECT_STREQ(faults[2].name(), "hold");
  EXPECT_EQ(faults[0].kind, NodeFault::Kind::kKillAgent);
  EXPECT_EQ(faults[0].node, 1);
  EXPECT_EQ(faults[0].step, 4);
  EXPECT_EQ(faults[0].generation, 0);
  EXPECT_STREQ(faults[0].name(), "kill-agent");
  EXPECT_EQ(faults[1].kind, NodeFault::Kind::kPartition);
  EXPECT_EQ(faults[1].node, 2);
  EXPECT_EQ(faults[1].generation, 1);
  EXPECT_STREQ(faults[1].name(), "partition");
  auto error_of = [](auto parse, const std::string& spec) {
    try {
      parse(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const auto node = [](const std::string& s) { parse_node_faults(s); };
  const auto worker = [](const std::string& s) { parse_faults(s); };
  EXPECT_NE(error_of(node, "kill:rank=1:step=2").find("pass them to `brigade train --inject`"),
            std::string::npos);
  EXPECT_NE(error_of(node, "kill-agent:node=1").find("needs node= and step="), std::string::npos);
  EXPECT_NE(error_of(node, "partition:node=1:step=2:rank=1").find("unknown or repeated key 'rank'"),
            std::string::npos);
  EXPECT_NE(
      error_of(worker, "kill-agent:node=1:step=2").find("pass it to `brigade launch --inject`"),
      std::string::npos);
  EXPECT_NE(error_of(worker, "hold:node=0:step=2").find("pass it to `brigade launch --inject`"),
            std::string::npos);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic
