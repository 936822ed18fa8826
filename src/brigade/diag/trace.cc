#include "brigade/diag/trace.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>
#include <vector>

#include "brigade/comm/communicator.h"
#include "brigade/comm/flight_recorder.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/trace.h"

namespace brigade::diag {
namespace fs = std::filesystem;

namespace {

constexpr int kAlignmentRounds = 8;
// Lanes for the communication groups: above any Linux thread id (at most
// 2^22), and within the 32 bits Perfetto reads a tid in.
constexpr int64_t kGroupLaneBase = 1LL << 30;
// How long rank 0 waits for a part another node wrote to appear (a network
// filesystem's cached lookups may lag the writer).
constexpr int64_t kPartWaitMs = 10'000;

bool parse_step(std::string_view text, int64_t* out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size() && *out >= 1;
}

// The kernel's boot id, hashed: equal on every rank that reads the same
// CLOCK_MONOTONIC (one kernel, whatever its namespaces).
int64_t boot_id_hash() {
  const std::string id = boot_id();
  return id.empty() ? 0 : static_cast<int64_t>(std::hash<std::string>{}(id) >> 1);
}

}  // namespace

std::string trace_file_name(int64_t generation) {
  return generation == 0 ? std::string("trace.json") : fmt::format("trace.gen{}.json", generation);
}

bool is_trace_file_name(std::string_view name) {
  if (name == "trace.json") return true;
  constexpr std::string_view kPrefix = "trace.gen", kSuffix = ".json";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  const std::string_view generation =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  return !generation.empty() && generation.find_first_not_of("0123456789") == std::string::npos;
}

void shift_trace_events(nlohmann::json& events, double by_us) {
  for (nlohmann::json& e : events) {
    if (e.contains("ts")) e["ts"] = e.at("ts").get<double>() + by_us;
    if (e.contains("args") && e.at("args").is_object() && e.at("args").contains("called_us")) {
      e["args"]["called_us"] = e.at("args").at("called_us").get<double>() + by_us;
    }
  }
}

namespace {

std::string event_name(const trace::Event& e) {
  return e.index >= 0 ? fmt::format("{} {}", e.name, e.index) : std::string(e.name);
}

int64_t clock_skew_ns(int world_rank) {
  const char* value = std::getenv(kSkewVariable);
  if (value == nullptr || *value == '\0') return 0;
  int64_t ns = 0;
  const std::string_view text(value);
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ns);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw_error("{}=\"{}\": expected nanoseconds (an integer)", kSkewVariable, text);
  }
  return ns * world_rank;
}

fs::path part_path(const fs::path& run_dir, int rank) {
  return run_dir / fmt::format("trace.rank{}.part.json", rank);
}

}  // namespace

TraceSteps parse_trace_steps(std::string_view spec, int64_t start_step) {
  const auto bad = [&] {
    throw_error(
        "diag.trace \"{}\": expected steps as A:B (steps A to B, counted from 1) or N (the first "
        "N steps this run takes), e.g. --trace 10:12",
        spec);
  };
  TraceSteps steps;
  if (const size_t colon = spec.find(':'); colon != std::string_view::npos) {
    if (!parse_step(spec.substr(0, colon), &steps.first) ||
        !parse_step(spec.substr(colon + 1), &steps.last) || steps.last < steps.first) {
      bad();
    }
    return steps;
  }
  int64_t n = 0;
  if (!parse_step(spec, &n)) bad();
  return {start_step + 1, start_step + n};
}

TraceWindow::TraceWindow(TraceSteps steps, fs::path run_dir, std::string file_name,
                         Communicator* world, int world_rank, std::string node)
    : steps_(steps),
      run_dir_(std::move(run_dir)),
      file_name_(std::move(file_name)),
      world_(world),
      world_rank_(world_rank),
      node_(std::move(node)),
      train_thread_(static_cast<int>(::gettid())) {}

void TraceWindow::before_step(int64_t step) {
  if (done_) return;
  if (!open_ && step >= steps_.first && step <= steps_.last) {
    trace::start();
    open_ = true;
    opened_ns_ = now_ns();
  }
  step_begin_ns_ = now_ns();
}

void TraceWindow::after_step(int64_t step) {
  if (!open_) return;
  trace::Event e;
  e.category = "step";
  e.name = "step";
  e.index = step;
  e.begin_ns = step_begin_ns_;
  e.end_ns = now_ns();
  trace::record(e);
  if (step >= steps_.last) write();
}

void TraceWindow::finish() {
  if (open_) write();
}

void TraceWindow::write() {
  trace::stop();
  open_ = false;
  done_ = true;
  const int64_t closed_ns = now_ns();
  trace::Recorded recorded = trace::take();
  bool ops_complete = true;
  const auto ops = FlightRecorder::global().records_since(opened_ns_, &ops_complete);

  // One clock for all: rank 0's, from the window's opening on rank 0.
  // The exchange is tested on one kernel by skewing each rank's clock
  // (kSkewVariable).
  const int64_t skew = clock_skew_ns(world_rank_);
  const int size = world_ ? world_->size() : 1;
  // Every rank decides from the same gathered values; a skewed clock
  // (0: no boot id) makes every rank use the exchange.
  const bool skewed = std::getenv(kSkewVariable) != nullptr && *std::getenv(kSkewVariable) != 0;
  std::vector<int64_t> boots(static_cast<size_t>(size), skewed ? 0 : boot_id_hash());
  std::vector<int64_t> origins(static_cast<size_t>(size), opened_ns_);
  std::vector<std::vector<int64_t>> rounds(kAlignmentRounds, std::vector<int64_t>(size, 0));
  if (world_) {
    const int64_t mine[2] = {boots[0], opened_ns_ + skew};
    std::vector<int64_t> all(2 * static_cast<size_t>(size));
    world_->all_gather(mine, all.data(), 2, DType::kI64)->wait();
    for (int r = 0; r < size; ++r) {
      boots[static_cast<size_t>(r)] = all[2 * static_cast<size_t>(r)];
      origins[static_cast<size_t>(r)] = all[2 * static_cast<size_t>(r) + 1];
    }
  }
  const bool shared_clock = boots[0] != 0 && std::all_of(boots.begin(), boots.end(),
                                                         [&](int64_t b) { return b == boots[0]; });
  int64_t offset = 0;  // this rank's clock minus rank 0's
  std::vector<int64_t> spread;
  if (world_ && !shared_clock) {
    for (std::vector<int64_t>& round : rounds) {
      world_->barrier()->wait();
      const int64_t t = now_ns() + skew;
      world_->all_gather(&t, round.data(), 1, DType::kI64)->wait();
    }
    std::vector<int64_t> mine;
    for (const std::vector<int64_t>& round : rounds) {
      mine.push_back(round[static_cast<size_t>(world_rank_)] - round[0]);
    }
    std::sort(mine.begin(), mine.end());
    offset = mine[mine.size() / 2];
    spread.push_back(mine.back() - mine.front());
  }
  // Rank 0's opening on this rank's clock (origins[0] is on rank 0's).
  const int64_t origin = origins[0] + offset;
  const auto us = [&](int64_t ns) { return static_cast<double>(ns + skew - origin) * 1e-3; };

  nlohmann::json events = nlohmann::json::array();
  // Perfetto takes pid 0 for the kernel's idle task: ranks from 1.
  const int pid = world_rank_ + 1;
  const auto meta = [&](const char* what, int64_t tid, const nlohmann::json& args) {
    events.push_back({{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", args}});
  };
  meta("process_name", 0, {{"name", fmt::format("rank {} ({})", world_rank_, node_)}});
  meta("process_sort_index", 0, {{"sort_index", world_rank_}});
  meta("thread_name", train_thread_, {{"name", "train"}});
  meta("thread_sort_index", train_thread_, {{"sort_index", 0}});
  std::map<int, std::string> other_threads;
  for (const trace::Event& e : recorded.events) {
    nlohmann::json j = {{"name", event_name(e)},
                        {"cat", e.category},
                        {"pid", pid},
                        {"tid", e.thread},
                        {"ts", us(e.begin_ns)}};
    if (e.end_ns > e.begin_ns) {
      j["ph"] = "X";
      j["dur"] = static_cast<double>(e.end_ns - e.begin_ns) * 1e-3;
    } else {
      j["ph"] = "i";
      j["s"] = "p";
    }
    if (e.index >= 0 || e.chunk >= 0) {
      j["args"] = nlohmann::json::object();
      if (e.index >= 0) j["args"]["index"] = e.index;
      if (e.chunk >= 0) j["args"]["chunk"] = e.chunk;
    }
    if (e.thread != train_thread_) other_threads.emplace(e.thread, e.category);
    events.push_back(std::move(j));
  }
  for (const auto& [tid, category] : other_threads) {
    meta("thread_name", tid,
         {{"name", category == std::string("ckpt") ? "background writer" : "thread " + category}});
  }
  std::map<std::string, int64_t> lanes;
  for (const FlightRecorder::Named& op : ops) {
    const FlightRecord& r = op.record;
    if (r.scheduled_ns > closed_ns) continue;  // this write's own exchanges
    auto [lane, added] =
        lanes.emplace(op.group, kGroupLaneBase + static_cast<int64_t>(lanes.size()));
    if (added) {
      meta("thread_name", lane->second, {{"name", "comm " + op.group}});
      meta("thread_sort_index", lane->second, {{"sort_index", 1 + lane->second - kGroupLaneBase}});
    }
    const char* kind = record_kind_name(r.kind);
    const std::string key = fmt::format("{}/{}/{}", op.group, kind, r.seq);
    // A collective from the moment its communicator ran it (a group runs one
    // at a time, so a lane's spans nest) to its completion; when it was
    // called goes in the args. Sends and receives overlap each other: async
    // spans (their own rows in the viewer), from the call to completion.
    const bool collective = r.kind == RecordKind::kCollective;
    const int64_t begin = collective && r.started_ns > 0 ? r.started_ns : r.scheduled_ns;
    const int64_t end = std::max(begin, r.finished_ns > 0 ? r.finished_ns : closed_ns);
    const nlohmann::json args = {{"group", op.group},
                                 {"kind", kind},
                                 {"seq", r.seq},
                                 {"key", key},
                                 {"bytes", r.bytes},
                                 {"state", op_state_name(r.state)},
                                 {"called_us", us(r.scheduled_ns)}};
    nlohmann::json j = {{"name", r.op},    {"cat", collective ? "comm" : "p2p"},
                        {"pid", pid},      {"tid", lane->second},
                        {"ts", us(begin)}, {"args", args}};
    if (collective) {
      j["ph"] = "X";
      j["dur"] = static_cast<double>(end - begin) * 1e-3;
      events.push_back(std::move(j));
      continue;
    }
    j["ph"] = "b";
    j["id2"] = {{"local", key}};
    nlohmann::json e = {
        {"ph", "e"},           {"name", r.op},  {"cat", "p2p"},           {"pid", pid},
        {"tid", lane->second}, {"ts", us(end)}, {"id2", {{"local", key}}}};
    events.push_back(std::move(j));
    events.push_back(std::move(e));
  }
  nlohmann::json info = {{"rank", world_rank_},
                         {"node", node_},
                         {"events", recorded.events.size()},
                         {"dropped_events", recorded.dropped},
                         {"all_operations_kept", ops_complete},
                         {"clock_offset_us", static_cast<double>(offset) * 1e-3}};
  if (!spread.empty()) info["clock_offset_spread_us"] = static_cast<double>(spread[0]) * 1e-3;
  if (recorded.dropped > 0 || !ops_complete) {
    std::fprintf(stderr,
                 "brigade train: rank %d: the trace of steps %lld-%lld is missing %s; trace fewer "
                 "steps\n",
                 world_rank_, static_cast<long long>(steps_.first),
                 static_cast<long long>(steps_.last),
                 recorded.dropped > 0 ? "events beyond the cap"
                                      : "operations the flight recorder no longer held");
  }
  const nlohmann::json part = {{"events", std::move(events)}, {"info", std::move(info)}};

  const auto join = [&](std::vector<nlohmann::json> parts) {
    nlohmann::json all = nlohmann::json::array();
    nlohmann::json ranks = nlohmann::json::array();
    // Zero is the earliest event of any rank: a rank may open its window
    // before rank 0 does, and the viewers drop negative times.
    double first_us = 0;
    for (const nlohmann::json& p : parts) {
      for (const nlohmann::json& e : p.at("events")) {
        if (e.contains("ts")) first_us = std::min(first_us, e.at("ts").get<double>());
      }
    }
    for (nlohmann::json& p : parts) {
      for (nlohmann::json& e : p.at("events")) all.push_back(std::move(e));
      ranks.push_back(std::move(p.at("info")));
    }
    shift_trace_events(all, -first_us);
    nlohmann::json file = {
        {"traceEvents", std::move(all)},
        {"displayTimeUnit", "ms"},
        {"otherData",
         {{"steps", fmt::format("{}-{}", steps_.first, steps_.last)},
          {"clock", shared_clock ? "one monotonic clock (every rank on one kernel): exact"
                                 : "offsets from rank 0 by barrier exchange (median of 8 rounds)"},
          {"ranks", std::move(ranks)},
          // Zero on the wall clock: where diag/trace_incidents.h places the
          // run's incidents (join runs on rank 0, whose clock the times are).
          {kOriginKey, steady_to_unix_us(origin + std::llround(first_us * 1e3))},
          {kBootIdKey, boot_id()}}}};
    write_file_atomic(run_dir_ / file_name_, file.dump() + "\n");
    written_ = run_dir_ / file_name_;
  };
  // A trace is never worth the training: whatever fails here is said in one
  // line and training goes on.
  const auto give_up = [&](const std::string& why) {
    std::fprintf(stderr, "brigade train: rank %d: no trace of steps %lld-%lld written: %s\n",
                 world_rank_, static_cast<long long>(steps_.first),
                 static_cast<long long>(steps_.last), why.c_str());
    std::fflush(stderr);
  };
  if (!world_) {
    try {
      join({part});
    } catch (const std::exception& e) {
      give_up(e.what());
    }
    return;
  }
  std::string error;
  try {
    write_file_atomic(part_path(run_dir_, world_rank_), part.dump());
  } catch (const std::exception& e) {
    error = e.what();
    give_up(error);
  }
  // Every rank learns whether every part was written before rank 0 reads.
  double parts_written = error.empty() ? 1 : 0;
  world_->all_reduce(&parts_written, 1, DType::kF64, ReduceOp::kSum)->wait();
  if (world_rank_ != 0) return;
  const auto remove_parts = [&] {
    std::error_code ignored;
    for (int r = 0; r < size; ++r) fs::remove(part_path(run_dir_, r), ignored);
  };
  if (parts_written < size) {
    if (error.empty()) {
      give_up(fmt::format("{} rank(s) could not write their part", size - parts_written));
    }
    remove_parts();
    return;
  }
  try {
    std::vector<nlohmann::json> parts;
    for (int r = 0; r < size; ++r) {
      const fs::path path = part_path(run_dir_, r);
      const int64_t deadline = now_ns() + kPartWaitMs * kNsPerMs;
      while (!fs::exists(path) && now_ns() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      parts.push_back(nlohmann::json::parse(read_file(path)));
    }
    join(std::move(parts));
  } catch (const std::exception& e) {
    give_up(e.what());
  }
  remove_parts();
}

}  // namespace brigade::diag
