// Reads a run directory's JSON-lines records (incidents.jsonl,
// metrics.jsonl) for tests of whole runs.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace brigade::testing {

// Every line, parsed; a line that is not JSON throws (fails the test).
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    EXPECT_FALSE(line.empty()) << path << " has an empty line";
    lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// incidents.jsonl without the straggler episodes the trainer writes there
// too: on a loaded machine (CI's ctest -j 2) a rank can run slow enough to
// be named in any run, so a test counting a run's failures reads only the
// failures and the summary.
inline std::vector<nlohmann::json> read_failures(const std::filesystem::path& incidents) {
  std::vector<nlohmann::json> lines;
  for (nlohmann::json& line : read_jsonl(incidents)) {
    if (!line.value("kind", "").starts_with("straggler")) lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace brigade::testing
