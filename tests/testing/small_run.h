// The small run the CLI's whole-run tests train (the trace and its
// incidents, stragglers, the step breakdown): a 2-layer model on synthetic
// data, steps of about 10 ms on one core, trained in a temporary directory
// of its own.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade::testing {

// The run's config.toml: `train` adds [train] keys, `rest` whole sections.
inline std::string small_config(std::string_view train = "", std::string_view rest = "") {
  std::string text =
      "[model]\nn_layer = 2\nn_head = 2\nn_embd = 64\nblock_size = 64\nvocab_size = 64\n"
      "[train]\nmicro_batch = 4\ngrad_accum = 2\n";
  text += train;
  text += "[data]\nsynthetic = true\n";
  text += rest;
  return text;
}

// A temporary directory with the config (config.toml) and the run
// directory (run/, train.run_dir).
struct SmallRun {
  explicit SmallRun(const std::string& name, const std::string& config_text = small_config())
      : dir(name) {
    std::ofstream(config) << config_text;
  }

  // `brigade train [--nproc N] CONFIG --set train.run_dir=RUN EXTRA...`;
  // nproc 0: one process, without the launcher.
  Output train(int nproc, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args{"train"};
    if (nproc > 0) args.insert(args.end(), {"--nproc", std::to_string(nproc)});
    args.insert(args.end(), {config.string(), "--set", "train.run_dir=\"" + run.string() + "\""});
    args.insert(args.end(), extra.begin(), extra.end());
    return run_brigade(args);
  }

  TempDir dir;
  std::filesystem::path config = dir.path() / "config.toml";
  std::filesystem::path run = dir.path() / "run";
};

}  // namespace brigade::testing
