// That the demo config, as shipped, actually learns (slow: about a minute).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/train/trainer.h"

namespace brigade {
namespace {
namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("brigade_trainer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small model on the bundled Shakespeare text, prepared once per test.
  Config small_config(int64_t steps) const {
    Config c = Config::from_string(R"(
      [model]
      n_layer = 2
      n_head = 2
      n_embd = 32
      block_size = 32
      vocab_size = 256
      [data]
      tokenizer = "byte"
      [train]
      micro_batch = 4
      grad_accum = 2
      seed = 7
      threads = 2
      [optim]
      lr = 3e-3
      warmup_steps = 3
      weight_decay = 0.1
      grad_clip = 1.0
    )");
    c.set("data.source=\"" BRIGADE_SOURCE_DIR "/data/tinyshakespeare.txt\"");
    c.set("data.dir=\"" + (dir_ / "data").string() + "\"");
    c.set("train.run_dir=\"" + (dir_ / "run").string() + "\"");
    c.set("train.steps=" + std::to_string(steps));
    return c;
  }

  fs::path dir_;
};

// The demo config, as shipped, with a step budget a CI machine can afford:
// the loss starts near ln(256) = 5.55 (uniform over bytes) and must fall below
// 2.5 nats per byte.
TEST_F(TrainerTest, DemoConfigLearns) {
  Config c = Config::from_file(BRIGADE_SOURCE_DIR "/examples/shakespeare.toml");
  c.set("data.source=\"" BRIGADE_SOURCE_DIR "/data/tinyshakespeare.txt\"");
  c.set("data.dir=\"" + (dir_ / "data").string() + "\"");
  c.set("train.run_dir=\"" + (dir_ / "run").string() + "\"");
  c.set("train.steps=200");
  c.set("train.eval_windows=64");
  const GptConfig model = GptConfig::from_config(c);
  const TrainOptions opts = TrainOptions::from_config(c);
  c.check_all_used();
  Trainer trainer(model, opts);
  const double first = trainer.train_step().loss;
  EXPECT_NEAR(first, std::log(256.0), 0.3);
  while (trainer.step() < opts.steps) trainer.train_step();
  const double val = trainer.evaluate();
  EXPECT_LT(val, 2.5) << "validation loss after " << opts.steps << " steps";
}

}  // namespace
}  // namespace brigade
