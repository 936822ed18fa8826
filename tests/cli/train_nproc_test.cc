// `brigade train --nproc N` end to end: the real binary launches N
// data-parallel workers, rank 0 writes the run directory with the per-step
// communication metrics and bucket trace (whose reductions must overlap
// backward), and a mismatch between --nproc and
// the config's parallel.dp is refused before anything starts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "brigade/core/config.h"
#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"
#include "testing/layout_checks.h"
#include "testing/run_brigade.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using testing::run_brigade;

// Appended to the tiny model.
constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 4
[data]
synthetic = true
[parallel]
bucket_mb = 0.01
)";

fs::path write_config(const fs::path& dir, const std::string& extra = "") {
  const fs::path path = dir / "config.toml";
  std::ofstream(path) << testing::kTinyModelToml << kTraining << extra;
  return path;
}

TEST(TrainNproc, TwoWorkersTrainAndRankZeroReportsCommunication) {
  testing::TempDir dir("brigade_train_nproc");
  const fs::path run = dir.path() / "run";
  const auto result =
      run_brigade({"train", "--nproc", "2", write_config(dir.path()).string(), "--set",
                   "parallel.zero=1", "--set", "train.run_dir=\"" + run.string() + "\""});
  ASSERT_EQ(result.status, 0) << result.err;
  Config tiny = Config::from_string(testing::kTinyModelToml);
  const GptConfig model = GptConfig::from_config(tiny);
  EXPECT_NE(result.err.find("dp 2, ZeRO 1"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("per rank: parameters"), std::string::npos) << result.err;
  std::ifstream metrics(run / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (!row.contains("loss")) continue;
    ++steps;
    EXPECT_GE(row.at("exposed_comm_ms").get<double>(), 0.0) << line;
    EXPECT_GT(row.at("compute_ms").get<double>(), 0.0) << line;
    ASSERT_EQ(row.at("peak_rss_bytes_per_rank").size(), 2u) << line;
    for (const auto& bytes : row.at("peak_rss_bytes_per_rank")) EXPECT_GT(bytes.get<int64_t>(), 0);
    ASSERT_TRUE(row.contains("buckets")) << line;
    EXPECT_GT(row.at("buckets").size(), 1u) << "bucket_mb = 0.01 makes several: " << line;
    for (const auto& bucket : row.at("buckets")) {
      EXPECT_LE(bucket.at("issued_ms").get<double>(), bucket.at("done_ms").get<double>());
    }
    // Overlap: a bucket whose gradients are final before the embeddings'
    // backward (the last thing backward does) was handed to the
    // communicator before backward ended. The buckets tile the padded
    // buffer from its end, in the order listed.
    const double backward_end = row.at("backward_end_ms").get<double>();
    const int64_t embeddings_end = ParamLayout(model).block(0).ln_1_w;
    int64_t begin = 0;
    for (const auto& bucket : row.at("buckets")) begin += bucket.at("bytes").get<int64_t>() / 4;
    int overlapped = 0;
    for (const auto& bucket : row.at("buckets")) {
      begin -= bucket.at("bytes").get<int64_t>() / 4;
      if (begin < embeddings_end) continue;
      ++overlapped;
      EXPECT_LT(bucket.at("issued_ms").get<double>(), backward_end)
          << "a bucket at offset " << begin << " waited for the end of backward: " << line;
    }
    EXPECT_GE(overlapped, 2) << "bucket_mb = 0.01 puts several buckets in the blocks: " << line;
  }
  EXPECT_EQ(steps, 4);
  // One shard per rank, committed by one manifest.
  const fs::path ckpt = run / "checkpoints" / "step_00000004";
  EXPECT_TRUE(fs::exists(ckpt / "manifest.json"));
  EXPECT_TRUE(fs::exists(ckpt / "shard_00000.safetensors"));
  EXPECT_TRUE(fs::exists(ckpt / "shard_00001.safetensors"));
}

// Saved by dp 2 under ZeRO 3 (each rank its slices), resumed by one process
// and saved again at the same step: `ckpt hash` sees the same global state.
// Then a corrupted shard: inspect names it and fails, hash refuses it.
TEST(TrainNproc, CheckpointIsLayoutFreeAndVerified) {
  testing::TempDir dir("brigade_train_nproc");
  const fs::path run = dir.path() / "run";
  const fs::path config = write_config(dir.path());
  ASSERT_EQ(run_brigade({"train", "--nproc", "2", config.string(), "--set", "parallel.zero=3",
                         "--set", "train.run_dir=\"" + run.string() + "\""})
                .status,
            0);
  const auto inspect = run_brigade({"ckpt", "inspect", run.string()});
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("\"zero\":3"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("shard_00001.safetensors"), std::string::npos) << inspect.out;
  testing::expect_one_process_saves_the_same(config, run, dir.path() / "again",
                                             {"train.grad_accum=2"});

  const fs::path shard = run / "checkpoints" / "step_00000004" / "shard_00001.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x55');
  }
  const auto bad =
      run_brigade({"ckpt", "inspect", (run / "checkpoints" / "step_00000004").string()});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("CHECKSUM MISMATCH"), std::string::npos) << bad.out;
  const auto refused =
      run_brigade({"ckpt", "hash", (run / "checkpoints" / "step_00000004").string()});
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.err.find("shard_00001.safetensors"), std::string::npos) << refused.err;
}

TEST(TrainNproc, NprocDisagreeingWithTheConfigIsRefused) {
  testing::TempDir dir("brigade_train_nproc");
  const auto result =
      run_brigade({"train", "--nproc", "2", write_config(dir.path(), "dp = 3\n").string()});
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.err.find("--nproc 2 but the config sets parallel.dp = 3"), std::string::npos)
      << result.err;
}

TEST(TrainNproc, DpWithoutWorkersSaysHowToStartThem) {
  testing::TempDir dir("brigade_train_nproc");
  const auto result = run_brigade({"train", write_config(dir.path(), "dp = 2\n").string(), "--set",
                                   "train.run_dir=\"" + (dir.path() / "run").string() + "\""});
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.err.find("brigade train --nproc 2"), std::string::npos) << result.err;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
