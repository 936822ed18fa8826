// `brigade plan --validate`: the cost model against published measurements.
//
// Each row of the table (src/brigade/sim/published.csv, built into the
// binary) is one published training run: model shape, layout, GPU type, the
// software features it used, the measured figure and where it was printed.
// Rows marked "calibration" are the ones the device's efficiency constants
// were chosen against; "held-out" rows were never looked at while choosing
// them and show how far the model carries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "brigade/sim/search.h"

namespace brigade::sim {

enum class PublishedMetric {
  kTflopsPerGpu,       // hardware FLOPs, recompute counted (Megatron-LM's papers)
  kModelTflopsPerGpu,  // model FLOPs only (MFU * peak)
  kStepSeconds,
};
const char* published_metric_name(PublishedMetric metric);

struct PublishedRun {
  std::string name;
  std::string hardware;  // catalogue name
  Workload job;
  int64_t gpus = 0;
  LayoutPins pins;  // what the publication fixed; the rest is searched
  PublishedMetric metric = PublishedMetric::kTflopsPerGpu;
  double published = 0;
  bool calibration = false;
  std::string source;
};

// Parses the CSV (header row first). Throws Error naming the line and column.
std::vector<PublishedRun> parse_published_runs(const std::string& csv_text);
// The table shipped with Brigade.
const std::string& builtin_published_csv();

struct ValidationRow {
  PublishedRun run;
  bool predicted_ok = false;  // a fitting layout existed
  Layout layout;              // the fastest fitting layout under the pins
  double predicted = 0;       // same unit as run.published
  double error = 0;           // (predicted - published) / published
};

struct ValidationSummary {
  std::vector<ValidationRow> rows;
  double calibration_mean_abs_error = 0, calibration_max_abs_error = 0;
  double held_out_mean_abs_error = 0, held_out_max_abs_error = 0;
};

ValidationSummary validate(const std::vector<PublishedRun>& runs);

}  // namespace brigade::sim
