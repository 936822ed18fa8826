// `brigade report RUN_DIR`: one self-contained HTML file about a run.
//
// It shows the loss and validation curves, throughput and MFU, where each
// step's time went (compute, communication that overlap did not hide, the
// rest), every per-rank series metrics.jsonl holds (keys ending in
// `_per_rank`, one line per rank), the incidents with their detection and
// recovery times and the run's ETTR (incidents.jsonl; the straggler
// episodes recorded there apart, in a list of their own: a slow rank is no
// failure and restarts nothing), and the config and mesh. Charts are Chart.js 3 (Debian's
// libjs-chart.js), inlined into the file with the data, so the page needs no network when it is
// opened, on a laptop or attached to a ticket.
//
// The data goes in a <script type="application/json"> element with every
// '<', '>' and '&' written as a \u escape (and U+2028/9 too), so no value (a
// config string holding "</script>", say) can end the element early; the
// page reads it with JSON.parse, never eval. The page reports on itself for
// tests and for the curious: each chart's canvas gets data-series-pixels,
// how many of its pixels are in its first series' colour once drawn, and
// script errors are listed in #brigade-errors.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace brigade::diag {

// At most this many points per series; longer runs are averaged into buckets
// of consecutive steps, which keeps a million-step run's page small and quick.
inline constexpr size_t kMaxPointsPerSeries = 2000;

// Chart.js's UMD build: $BRIGADE_CHART_JS if set, else Debian's
// /usr/share/javascript/chart.js/chart.min.js. Throws Error naming the
// package when it is not there.
std::filesystem::path find_chart_js();

// Everything the page shows, read from the run directory. Throws Error if
// the directory has no metrics.jsonl or a line of it or of incidents.jsonl
// is not JSON (naming the file and line).
nlohmann::json read_run(const std::filesystem::path& run_dir);

// The page. Throws Error if chart_js contains "</script" (it could not be
// inlined safely).
std::string report_html(const nlohmann::json& run, const std::string& chart_js);

// JSON text safe inside a <script> element (see above).
std::string json_for_script(const nlohmann::json& value);

}  // namespace brigade::diag
