// That the demo config, as shipped, actually learns (slow: about a minute).
#include <gtest/gtest.h>

#include <cmath>

#include "brigade/core/config.h"
#include "brigade/train/trainer.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

// The demo config with a step budget a CI machine can afford: the loss
// starts near ln(256) = 5.55 (uniform over bytes) and must fall below 2.5
// nats per byte on the held-out split.
TEST(DemoConfig, Learns) {
  testing::TempDir dir("brigade_demo_learns");
  Config c = Config::from_file(BRIGADE_SOURCE_DIR "/examples/shakespeare.toml");
  c.set("data.source=\"" BRIGADE_SOURCE_DIR "/data/tinyshakespeare.txt\"");
  c.set("data.dir=\"" + (dir.path() / "data").string() + "\"");
  c.set("train.run_dir=\"" + (dir.path() / "run").string() + "\"");
  c.set("train.steps=200");
  c.set("train.eval_windows=64");
  // One thread: ctest runs another test on the second core, and an OpenMP
  // team of two on a shared core waits at every barrier (this test took
  // 322 s instead of about 100 s so).
  c.set("train.threads=1");
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

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
