// What the command-line tests of parallel layouts (train_nproc_test.cc,
// train_tp_test.cc, train_pp_test.cc) check the same way: a config of the
// tiny model, a refusal before any worker starts, and a checkpoint that is
// the same tensors whatever layout saved it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "testing/run_brigade.h"

namespace brigade::testing {

// DIR/config.toml: the tiny model and `training`.
inline std::filesystem::path write_tiny_config(const std::filesystem::path& dir,
                                               const char* training) {
  const std::filesystem::path path = dir / "config.toml";
  std::ofstream(path) << kTinyModelToml << training;
  return path;
}

// Refused by the launcher itself: `message` once (each worker would print
// it again, and the launcher would report its exit), and no worker ever ran
// (no run directory).
inline void expect_refused_before_starting(const Output& result, const std::string& message,
                                           const std::filesystem::path& run) {
  EXPECT_NE(result.status, 0);
  EXPECT_EQ(occurrences(result.err, message), 1) << result.err;
  EXPECT_EQ(result.err.find("brigade launch"), std::string::npos) << result.err;
  EXPECT_FALSE(std::filesystem::exists(run)) << "a worker started";
}

// The checkpoint in run directory `run`, resumed by one process (`sets`:
// what it needs to read it, e.g. the same global batch) and saved at once
// into `again`: the same tensors, so the same `brigade ckpt hash`.
inline void expect_one_process_saves_the_same(const std::filesystem::path& config,
                                              const std::filesystem::path& run,
                                              const std::filesystem::path& again,
                                              const std::vector<std::string>& sets) {
  const auto hash = run_brigade({"ckpt", "hash", run.string()});
  ASSERT_EQ(hash.status, 0) << hash.err;
  std::vector<std::string> args = {"train",    config.string(),
                                   "--resume", run.string(),
                                   "--set",    "train.run_dir=\"" + again.string() + "\""};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  const auto resumed = run_brigade(args);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  const auto rehash = run_brigade({"ckpt", "hash", again.string()});
  EXPECT_EQ(trimmed(rehash.out), trimmed(hash.out));
  EXPECT_EQ(trimmed(hash.out).size(), 16u) << hash.out;
}

}  // namespace brigade::testing
