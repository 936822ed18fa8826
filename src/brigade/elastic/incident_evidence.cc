#include "brigade/elastic/incident_evidence.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "brigade/core/clock.h"
#include "brigade/core/files.h"
#include "brigade/elastic/watchdog.h"

namespace brigade::elastic {
namespace fs = std::filesystem;

std::string agent_view_file(int node) {
  return fmt::format("agent_node{}.json", node);
}

nlohmann::json agent_view(const Incident& incident, int64_t number, int node, int nproc_per_node,
                          int64_t taken_ns, const std::vector<WorkerView>& workers) {
  auto age_ms = [&](int64_t t) {
    return t == 0 ? nlohmann::json(nullptr) : nlohmann::json((taken_ns - t) * 1e-6);
  };
  nlohmann::json list = nlohmann::json::array();
  for (const WorkerView& w : workers) {
    const WorkerProgress& p = w.progress;
    list.push_back({{"rank", w.rank},
                    {"local_rank", w.local_rank},
                    {"node", node},
                    {"pid", w.pid},
                    {"running", w.running},
                    {"exit_code", w.exit_code ? nlohmann::json(*w.exit_code) : nullptr},
                    {"signal", w.signal ? nlohmann::json(*w.signal) : nullptr},
                    {"dumped", w.dumped},
                    {"stopped", w.stopped},
                    {"beat_age_ms", age_ms(p.beat_ns)},
                    {"step", p.step},
                    {"start_step", p.start_step},
                    {"step_age_ms", age_ms(p.step_ns)},
                    {"last_step_ms", p.last_step_ns * 1e-6}});
  }
  nlohmann::json view = {{"incident", number},
                         {"node", node},
                         {"nproc_per_node", nproc_per_node},
                         {"detected", incident.to_json()},
                         {"workers", std::move(list)}};
  // On the wall clock, which the workers' dumps are stamped with too (each
  // node's monotonic clock is its own): an incident's timeline places the
  // fault and its detection among the dumps' collectives.
  if (incident.fault_ns != 0) view["fault_unix_us"] = steady_to_unix_us(incident.fault_ns);
  if (incident.detected_ns != 0) {
    view["detected_unix_us"] = steady_to_unix_us(incident.detected_ns);
  }
  return view;
}

namespace {

// Copies run_dir's <prefix>*.json whose "pid" is `pid` into dir; `move`:
// removes each one copied.
bool copy_files_of(const fs::path& run_dir, const fs::path& dir, const std::string& prefix,
                   int64_t pid, bool move = false) {
  bool copied = false;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix) || !name.ends_with(".json")) continue;
    try {
      std::ifstream in(it->path());
      const nlohmann::json dump = nlohmann::json::parse(in);
      if (dump.value("pid", int64_t{-1}) != pid) continue;
    } catch (const std::exception&) {
      continue;  // half-written or not ours
    }
    std::error_code copy_ec;
    fs::copy_file(it->path(), dir / name, fs::copy_options::overwrite_existing, copy_ec);
    if (!copy_ec && move) fs::remove(it->path(), copy_ec);
    copied = copied || !copy_ec;
  }
  return copied;
}

}  // namespace

bool copy_exit_dumps(const fs::path& run_dir, const fs::path& dir, int rank, int64_t pid) {
  return copy_files_of(run_dir, dir, fmt::format("flight_recorder_rank{}_", rank), pid);
}

bool copy_corruption_reports(const fs::path& run_dir, const fs::path& dir, int rank, int64_t pid) {
  return copy_files_of(run_dir, dir, fmt::format("sdc_rank{}_", rank), pid, /*move=*/true);
}

std::optional<int64_t> incident_number(const std::string& name) {
  if (name.empty() || name.size() > 18 ||
      !std::all_of(name.begin(), name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(name);
}

int64_t last_incident_number(const fs::path& run_dir) {
  int64_t last = 0;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir / "incidents", ec), end; !ec && it != end;
       it.increment(ec)) {
    if (const auto n = incident_number(it->path().filename().string())) {
      last = std::max(last, *n);
    }
  }
  std::ifstream records(run_dir / "incidents.jsonl");
  for (std::string line; std::getline(records, line);) {
    // A torn line (a launch killed while writing it) is passed over.
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (r.is_object() && r.contains("number") && r.at("number").is_number_integer()) {
      last = std::max(last, r.at("number").get<int64_t>());
    }
  }
  return last;
}

fs::path keep_evidence(const WorkerGroup& group, const HeartbeatTable& table,
                       const std::map<int, int>& exits, const fs::path& run_dir, int node,
                       int nproc_per_node, int64_t number, Incident& incident,
                       const std::function<void()>& keep_alive) {
  const int64_t began = now_ns();
  std::error_code ec;
  const fs::path dir = incident_dir(run_dir, number);
  fs::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "brigade launch: no evidence for incident %lld: cannot create %s: %s\n",
                 static_cast<long long>(number), dir.c_str(), ec.message().c_str());
    return {};
  }
  // The views as at detection (the ages are the evidence, not the wait).
  std::vector<WorkerView> views;
  for (const Worker& w : group.workers()) {
    WorkerView v;
    v.rank = w.rank;
    v.local_rank = w.local_rank;
    v.pid = w.pid;
    v.running = w.running;
    v.stopped = w.running && stopped_by_signal(w.pid);
    v.progress = table.read(w.local_rank);
    views.push_back(std::move(v));
  }
  // Only those that can answer are asked: a stopped worker would cost the
  // whole wait.
  std::vector<const WorkerView*> asked;
  for (const WorkerView& v : views) {
    if (v.running && !v.stopped && v.progress.beat_ns > 0 &&
        began - v.progress.beat_ns < kAnswerableBeatMs * kNsPerMs) {
      table.request_dump(v.local_rank, number);
      asked.push_back(&v);
    }
  }
  // Done when each asked worker answered or has exited (a peer of the dead
  // one may be failing on its own): waitid without reaping, which stays the
  // supervision loop's.
  auto exited = [](int64_t pid, siginfo_t* info) {
    *info = siginfo_t{};
    return ::waitid(P_PID, static_cast<id_t>(pid), info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info->si_pid == static_cast<pid_t>(pid);
  };
  const int64_t deadline = began + kEvidenceWaitMs * kNsPerMs;
  int64_t next_alive = began;
  for (;;) {
    const bool all = std::all_of(asked.begin(), asked.end(), [&](const WorkerView* v) {
      siginfo_t info;
      return table.read(v->local_rank).dump_done >= number || exited(v->pid, &info);
    });
    const int64_t now = now_ns();
    if (all || now >= deadline) break;
    if (keep_alive && now >= next_alive) {
      keep_alive();
      next_alive = now + kEvidenceKeepAliveMs * kNsPerMs;
    }
    const timespec poll{0, 2 * kNsPerMs};
    ::nanosleep(&poll, nullptr);
  }
  for (WorkerView& v : views) {
    if (const auto it = exits.find(v.rank); it != exits.end()) {
      if (WIFSIGNALED(it->second)) v.signal = WTERMSIG(it->second);
      if (WIFEXITED(it->second)) v.exit_code = WEXITSTATUS(it->second);
    } else if (siginfo_t info; v.running && exited(v.pid, &info)) {
      // Ended since the loop last reaped.
      v.running = false;
      if (info.si_code == CLD_EXITED) {
        v.exit_code = info.si_status;
      } else {
        v.signal = info.si_status;
      }
    }
    v.dumped = table.read(v.local_rank).dump_done >= number ||
               copy_exit_dumps(run_dir, dir, v.rank, v.pid);
    copy_corruption_reports(run_dir, dir, v.rank, v.pid);
  }
  incident.evidence_ms = (now_ns() - began) * 1e-6;
  try {
    write_file_atomic(
        dir / agent_view_file(node),
        agent_view(incident, number, node, nproc_per_node, began, views).dump(1) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brigade launch: incident %lld: %s\n", static_cast<long long>(number),
                 e.what());
    return {};
  }
  return dir;
}

}  // namespace brigade::elastic
