#include "brigade/diag/report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/parallel/mesh.h"

namespace brigade::diag {
namespace fs = std::filesystem;
namespace {

constexpr char kDebianChartJs[] = "/usr/share/javascript/chart.js/chart.min.js";

// The per-step numbers the charts plot, as metrics.jsonl names them.
constexpr const char* kStepFields[] = {"loss",       "step_ms",         "tokens_per_s", "mfu",
                                       "compute_ms", "exposed_comm_ms", "grad_norm",    "lr"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error("cannot read {}", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      lines.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      throw_error("{} line {} is not JSON ({}): is this a Brigade run directory?", path.string(),
                  number, e.what());
    }
    if (!lines.back().is_object()) {
      throw_error("{} line {} is not a JSON object", path.string(), number);
    }
  }
  return lines;
}

double number_or_nan(const nlohmann::json& line, const char* key) {
  const auto it = line.find(key);
  return it != line.end() && it->is_number() ? it->get<double>()
                                             : std::numeric_limits<double>::quiet_NaN();
}

// Mean of the finite values, NaN (null in JSON) if none.
struct Mean {
  double sum = 0;
  int count = 0;
  void add(double v) {
    if (std::isfinite(v)) {
      sum += v;
      ++count;
    }
  }
  nlohmann::json value() const { return count > 0 ? nlohmann::json(sum / count) : nullptr; }
};

// Steps in order, the last line for a step winning: a step redone after a
// restart replaces the one the failure cut short.
using StepLines = std::map<int64_t, nlohmann::json>;

// Consecutive steps averaged into at most kMaxPointsPerSeries buckets.
template <typename AddBucket>
void for_each_bucket(const StepLines& lines, AddBucket add_bucket) {
  const size_t per_bucket =
      std::max<size_t>(1, (lines.size() + kMaxPointsPerSeries - 1) / kMaxPointsPerSeries);
  std::vector<const nlohmann::json*> bucket;
  for (auto it = lines.begin(); it != lines.end(); ++it) {
    bucket.push_back(&it->second);
    if (bucket.size() == per_bucket || std::next(it) == lines.end()) {
      add_bucket(it->first, bucket);
      bucket.clear();
    }
  }
}

nlohmann::json step_series(const StepLines& lines) {
  nlohmann::json series = {{"step", nlohmann::json::array()}};
  for (const char* f : kStepFields) series[f] = nlohmann::json::array();
  for_each_bucket(lines, [&](int64_t step, const std::vector<const nlohmann::json*>& bucket) {
    series["step"].push_back(step);
    for (const char* f : kStepFields) {
      Mean mean;
      for (const nlohmann::json* line : bucket) mean.add(number_or_nan(*line, f));
      series[f].push_back(mean.value());
    }
  });
  return series;
}

// Every key ending in _per_rank that holds an array of numbers: one series per rank.
nlohmann::json per_rank_series(const StepLines& lines) {
  std::map<std::string, StepLines> by_key;
  for (const auto& [step, line] : lines) {
    for (const auto& [key, value] : line.items()) {
      if (key.ends_with("_per_rank") && value.is_array() && !value.empty()) {
        by_key[key][step] = value;
      }
    }
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, values] : by_key) {
    size_t ranks = 0;
    for (const auto& [step, v] : values) ranks = std::max(ranks, v.size());
    nlohmann::json series = {{"step", nlohmann::json::array()}, {"ranks", nlohmann::json::array()}};
    for (size_t r = 0; r < ranks; ++r) series["ranks"].push_back(nlohmann::json::array());
    for_each_bucket(values, [&](int64_t step, const std::vector<const nlohmann::json*>& bucket) {
      series["step"].push_back(step);
      for (size_t r = 0; r < ranks; ++r) {
        Mean mean;
        for (const nlohmann::json* v : bucket) {
          if (r < v->size() && (*v)[r].is_number()) mean.add((*v)[r].get<double>());
        }
        series["ranks"][r].push_back(mean.value());
      }
    });
    out[key] = std::move(series);
  }
  return out;
}

// The layout from the run's config, or null if it cannot be read (the
// report still shows the rest).
nlohmann::json mesh_of(const fs::path& config_path) {
  try {
    Config config = Config::from_file(config_path);
    const MeshShape mesh = MeshShape::from_config(config);
    return {{"dp", mesh.dp},
            {"tp", mesh.tp},
            {"pp", mesh.pp},
            {"world_size", mesh.world_size()},
            {"zero", config.get_int("parallel.zero", 0)},
            {"backend", config.get_string("parallel.backend", "shm")}};
  } catch (const Error&) {
    return nullptr;
  }
}

}  // namespace

fs::path find_chart_js() {
  const char* override_path = std::getenv("BRIGADE_CHART_JS");
  const fs::path path = override_path != nullptr ? fs::path(override_path) : kDebianChartJs;
  if (!fs::is_regular_file(path)) {
    throw_error(
        "Chart.js is not at {}: brigade report inlines it into the page; install Debian's "
        "libjs-chart.js (apt-get install libjs-chart.js, or scripts/install_deps.sh), or point "
        "BRIGADE_CHART_JS at chart.min.js (Chart.js 3)",
        path.string());
  }
  return path;
}

nlohmann::json read_run(const fs::path& run_dir) {
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics_path)) {
    throw_error(
        "{} has no metrics.jsonl: pass the run directory a `brigade train` wrote "
        "(train.run_dir)",
        run_dir.string());
  }
  StepLines steps;
  nlohmann::json validation = {{"step", nlohmann::json::array()},
                               {"val_loss", nlohmann::json::array()}};
  for (const nlohmann::json& line : read_jsonl(metrics_path)) {
    const auto step = line.find("step");
    if (step == line.end() || !step->is_number_integer()) continue;
    if (line.contains("val_loss")) {
      validation["step"].push_back(*step);
      validation["val_loss"].push_back(line["val_loss"]);
    } else {
      steps[step->get<int64_t>()] = line;
    }
  }
  nlohmann::json run = {{"run_dir", fs::absolute(run_dir).lexically_normal().string()},
                        {"steps", step_series(steps)},
                        {"step_count", steps.size()},
                        {"last_step", steps.empty() ? 0 : steps.rbegin()->first},
                        {"validation", std::move(validation)},
                        {"per_rank", per_rank_series(steps)},
                        {"incidents", nlohmann::json::array()},
                        {"stragglers", nlohmann::json::array()},
                        {"rejoins", nlohmann::json::array()},
                        {"summary", nullptr},
                        {"config", nullptr},
                        {"config_files", nlohmann::json::array()},
                        {"mesh", nullptr}};
  const fs::path incidents_path = run_dir / "incidents.jsonl";
  if (fs::is_regular_file(incidents_path)) {
    int64_t last_number = 0;
    for (nlohmann::json& line : read_jsonl(incidents_path)) {
      // The summary of the run's last launch: a resumed run appends its own.
      const std::string kind = line.value("kind", "");
      if (kind == "summary") {
        run["summary"] = std::move(line);
      } else if (kind.starts_with("straggler")) {
        // A slow rank named or recovered: no failure, no restart.
        run["stragglers"].push_back(std::move(line));
      } else if (kind == "rejoin") {
        // The job grew back (a node joined): a pause, no failure.
        run["rejoins"].push_back(std::move(line));
      } else {
        // The agent's number (incidents/<N>/, the trace's marks, the
        // incident's cause line); a record written before records carried
        // one follows the one before it.
        if (!line.contains("number") || !line.at("number").is_number_integer()) {
          line["number"] = last_number + 1;
        }
        last_number = line.at("number").get<int64_t>();
        run["incidents"].push_back(std::move(line));
      }
    }
  }
  const fs::path config_path = run_dir / "config.toml";
  if (fs::is_regular_file(config_path)) {
    run["config"] = read_text(config_path);
    run["mesh"] = mesh_of(config_path);
  }
  std::vector<std::string> configs;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("config") && name.ends_with(".toml")) configs.push_back(name);
  }
  std::sort(configs.begin(), configs.end());
  run["config_files"] = configs;
  return run;
}

std::string json_for_script(const nlohmann::json& value) {
  // Replacing errors: a run directory is whatever the user points at.
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size() + text.size() / 16);
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    // In JSON these bytes only occur inside strings, where \u escapes mean the same.
    if (c == '<') {
      out += "\\u003c";
    } else if (c == '>') {
      out += "\\u003e";
    } else if (c == '&') {
      out += "\\u0026";
    } else if (c == '\xe2' && i + 2 < text.size() && text[i + 1] == '\x80' &&
               (text[i + 2] == '\xa8' || text[i + 2] == '\xa9')) {
      out += text[i + 2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace brigade::diag
