#include "brigade/sim/validation.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "brigade/core/error.h"
#include "brigade/sim/hardware.h"
#include "brigade/sim/published_csv.h"

namespace brigade::sim {
namespace {

// The columns, in order; `source` is last and may itself contain commas.
const std::vector<std::string> kColumns = {
    "name",   "hardware",     "layers",    "heads", "hidden",    "vocab",
    "seq",    "global_batch", "gpus",      "tp",    "pp",        "vp",
    "micro",  "zero",         "recompute", "sp",    "attention", "overlap_dp",
    "metric", "published",    "role",      "source"};

std::vector<std::string> split_row(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream stream(line);
  std::string field;
  while (fields.size() + 1 < kColumns.size() && std::getline(stream, field, ',')) {
    fields.push_back(field);
  }
  std::string rest;
  std::getline(stream, rest);
  fields.push_back(rest);
  return fields;
}

class RowReader {
 public:
  RowReader(std::vector<std::string> fields, int line) : fields_(std::move(fields)), line_(line) {}

  const std::string& text(const std::string& column) const {
    const auto it = std::find(kColumns.begin(), kColumns.end(), column);
    BRIGADE_CHECK(it != kColumns.end(), "no column {}", column);
    return fields_.at(static_cast<size_t>(it - kColumns.begin()));
  }
  double number(const std::string& column) const {
    const std::string& t = text(column);
    try {
      size_t used = 0;
      const double v = std::stod(t, &used);
      if (used == t.size() && v > 0) return v;
    } catch (const std::exception&) {
    }
    throw_error("published runs, line {}: column {} must be a positive number, got \"{}\"", line_,
                column, t);
  }
  int64_t integer(const std::string& column) const {
    const double v = number(column);
    if (v != std::floor(v)) {
      throw_error("published runs, line {}: column {} must be an integer, got {}", line_, column,
                  v);
    }
    return static_cast<int64_t>(v);
  }
  // Blank means "not published: let the search choose".
  std::optional<int64_t> optional_integer(const std::string& column) const {
    if (text(column).empty()) return std::nullopt;
    return integer(column);
  }
  [[noreturn]] void fail(const std::string& column, const std::string& expected) const {
    throw_error("published runs, line {}: column {} must be {}, got \"{}\"", line_, column,
                expected, text(column));
  }

 private:
  std::vector<std::string> fields_;
  int line_;
};

PublishedRun parse_row(const RowReader& r) {
  PublishedRun run;
  run.name = r.text("name");
  run.hardware = r.text("hardware");
  hardware_by_name(run.hardware);  // throws naming the known devices
  run.job.model.n_layer = r.integer("layers");
  run.job.model.n_head = r.integer("heads");
  run.job.model.n_embd = r.integer("hidden");
  run.job.model.vocab_size = r.integer("vocab");
  run.job.seq_len = r.integer("seq");
  run.job.model.block_size = run.job.seq_len;
  run.job.global_batch = r.integer("global_batch");
  run.gpus = r.integer("gpus");
  run.pins.tp = r.integer("tp");
  run.pins.pp = r.integer("pp");
  run.pins.vp = r.optional_integer("vp");
  run.pins.micro = r.optional_integer("micro");
  if (!r.text("zero").empty()) {
    const int64_t zero = static_cast<int64_t>(std::stod(r.text("zero")));
    if (zero < 0 || zero > 3) r.fail("zero", "0-3 or blank");
    run.pins.zero = static_cast<int>(zero);
  }
  const std::string& recompute = r.text("recompute");
  if (recompute == "none") {
    run.pins.recompute = PlanRecompute::kNone;
  } else if (recompute == "selective") {
    run.pins.recompute = PlanRecompute::kSelective;
  } else if (recompute == "full") {
    run.pins.recompute = PlanRecompute::kFull;
  } else if (!recompute.empty()) {
    r.fail("recompute", "none, selective, full or blank");
  }
  const std::string& sp = r.text("sp");
  if (sp == "true" || sp == "false") {
    run.pins.sp = sp == "true";
  } else if (!sp.empty()) {
    r.fail("sp", "true, false or blank");
  }
  // What the measured software did (not fitted: facts of each run).
  const std::string& attention = r.text("attention");
  if (attention == "flash") {
    run.job.features.flash_attention = true;
    run.job.features.attention_dropout = false;
  } else if (attention == "unfused" || attention == "unfused-dropout") {
    run.job.features.flash_attention = false;
    run.job.features.attention_dropout = attention == "unfused-dropout";
  } else {
    r.fail("attention", "flash, unfused or unfused-dropout");
  }
  const std::string& overlap = r.text("overlap_dp");
  if (overlap != "true" && overlap != "false") r.fail("overlap_dp", "true or false");
  run.job.features.overlap_dp = overlap == "true";
  // Every published row ran Megatron-LM (or MegaScale's Megatron baseline),
  // whose pipeline runs 1F1B, interleaved when vp > 1, and whose LM head
  // runs its backward in the backward pass.
  const SystemFeatures megatron = SystemFeatures::megatron_2021();
  run.job.features.schedules = megatron.schedules;
  run.job.features.head_backward_in_forward = megatron.head_backward_in_forward;
  const std::string& metric = r.text("metric");
  if (metric == "tflops_per_gpu") {
    run.metric = PublishedMetric::kTflopsPerGpu;
  } else if (metric == "model_tflops_per_gpu") {
    run.metric = PublishedMetric::kModelTflopsPerGpu;
  } else if (metric == "step_s") {
    run.metric = PublishedMetric::kStepSeconds;
  } else {
    r.fail("metric", "tflops_per_gpu, model_tflops_per_gpu or step_s");
  }
  run.published = r.number("published");
  const std::string& role = r.text("role");
  if (role != "calibration" && role != "held-out") r.fail("role", "calibration or held-out");
  run.calibration = role == "calibration";
  run.source = r.text("source");
  if (run.gpus % (*run.pins.tp * *run.pins.pp) != 0) {
    r.fail("gpus", fmt::format("a multiple of tp*pp = {}", *run.pins.tp * *run.pins.pp));
  }
  return run;
}

double predicted_value(PublishedMetric metric, const Estimate& e) {
  switch (metric) {
    case PublishedMetric::kTflopsPerGpu:
      return e.tflops_per_gpu;
    case PublishedMetric::kModelTflopsPerGpu:
      return e.model_flops / (e.time.step_s() * static_cast<double>(e.layout.gpus())) / 1e12;
    case PublishedMetric::kStepSeconds:
      return e.time.step_s();
  }
  return 0;
}

}  // namespace

const char* published_metric_name(PublishedMetric metric) {
  switch (metric) {
    case PublishedMetric::kTflopsPerGpu:
      return "tflops_per_gpu";
    case PublishedMetric::kModelTflopsPerGpu:
      return "model_tflops_per_gpu";
    case PublishedMetric::kStepSeconds:
      return "step_s";
  }
  return "?";
}

std::vector<PublishedRun> parse_published_runs(const std::string& csv_text) {
  std::vector<PublishedRun> runs;
  std::stringstream stream(csv_text);
  std::string line;
  int line_number = 0;
  bool header = true;
  while (std::getline(stream, line)) {
    ++line_number;
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields = split_row(line);
    if (header) {
      for (size_t i = 0; i + 1 < kColumns.size(); ++i) {
        if (i >= fields.size() || fields[i] != kColumns[i]) {
          throw_error("published runs: the header must be {}", fmt::join(kColumns, ","));
        }
      }
      header = false;
      continue;
    }
    if (fields.size() != kColumns.size()) {
      throw_error("published runs, line {}: {} columns, expected {}", line_number, fields.size(),
                  kColumns.size());
    }
    runs.push_back(parse_row(RowReader(std::move(fields), line_number)));
  }
  return runs;
}

const std::string& builtin_published_csv() {
  static const std::string text = kPublishedCsv;
  return text;
}

ValidationSummary validate(const std::vector<PublishedRun>& runs) {
  ValidationSummary summary;
  int calibration = 0, held_out = 0;
  for (const PublishedRun& run : runs) {
    ValidationRow row;
    row.run = run;
    const Hardware& hw = hardware_by_name(run.hardware);
    const SearchResult found = search_layouts(run.job, run.gpus, hw, run.pins, 1);
    // A published run the model says cannot run (or fit) counts as a 100%
    // miss, so it cannot flatter the summary by dropping out of it.
    double abs_error = 1.0;
    if (!found.ranked.empty()) {
      const Estimate& best = found.ranked.front();
      row.predicted_ok = true;
      row.layout = best.layout;
      row.predicted = predicted_value(run.metric, best);
      row.error = (row.predicted - run.published) / run.published;
      abs_error = std::fabs(row.error);
    }
    if (run.calibration) {
      ++calibration;
      summary.calibration_mean_abs_error += abs_error;
      summary.calibration_max_abs_error = std::max(summary.calibration_max_abs_error, abs_error);
    } else {
      ++held_out;
      summary.held_out_mean_abs_error += abs_error;
      summary.held_out_max_abs_error = std::max(summary.held_out_max_abs_error, abs_error);
    }
    summary.rows.push_back(std::move(row));
  }
  if (calibration > 0) summary.calibration_mean_abs_error /= calibration;
  if (held_out > 0) summary.held_out_mean_abs_error /= held_out;
  return summary;
}

}  // namespace brigade::sim
