#include "brigade/elastic/incident_evidence.h"

#include <fmt/format.h>

#include <fstream>
#include <system_error>

namespace brigade::elastic {
namespace fs = std::filesystem;

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
                    {"beat_age_ms", age_ms(p.beat_ns)},
                    {"step", p.step},
                    {"start_step", p.start_step},
                    {"step_age_ms", age_ms(p.step_ns)},
                    {"last_step_ms", p.last_step_ns * 1e-6}});
  }
  return {{"incident", number},
          {"node", node},
          {"nproc_per_node", nproc_per_node},
          {"detected", incident.to_json()},
          {"workers", std::move(list)}};
}

bool copy_exit_dumps(const fs::path& run_dir, const fs::path& dir, int rank, int64_t pid) {
  const std::string prefix = fmt::format("flight_recorder_rank{}_", rank);
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
    copied = copied || !copy_ec;
  }
  return copied;
}

}  // namespace brigade::elastic
