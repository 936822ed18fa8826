#include "brigade/core/config.h"

#include <gtest/gtest.h>

#include "brigade/core/error.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ReadsTypedValuesWithDefaults) {
  Config c = Config::from_string("[train]\nsteps = 10\nlr = 1e-3\nname = \"x\"\nflag = true\n");
  EXPECT_EQ(c.get_int("train.steps", 0), 10);
  EXPECT_DOUBLE_EQ(c.get_double("train.lr", 0), 1e-3);
  EXPECT_EQ(c.get_string("train.name", ""), "x");
  EXPECT_TRUE(c.get_bool("train.flag", false));
  EXPECT_EQ(c.get_int("train.absent", 7), 7);
  EXPECT_NO_THROW(c.check_all_used());
}

TEST(Config, UnknownKeyNamesTheKeyAndTheKnownOnes) {
  Config c = Config::from_string("[train]\nstpes = 10\n", "my.toml");
  c.get_int("train.steps", 0);
  const std::string msg = error_of([&] { c.check_all_used(); });
  EXPECT_NE(msg.find("train.stpes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("my.toml"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyExpectedAndFound) {
  Config c = Config::from_string("[train]\nsteps = \"ten\"\n");
  const std::string msg = error_of([&] { c.get_int("train.steps", 0); });
  EXPECT_NE(msg.find("train.steps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ten"), std::string::npos) << msg;
}

TEST(Config, SyntaxErrorNamesLine) {
  const std::string msg =
      error_of([] { Config::from_string("[train]\nsteps = = 3\n", "bad.toml"); });
  EXPECT_NE(msg.find("bad.toml line 2"), std::string::npos) << msg;
}

TEST(Config, SetOverridesAndCreatesKeys) {
  Config c = Config::from_string("[model]\nn_layer = 4\n");
  c.set("model.n_layer=6");
  c.set("data.tokenizer=byte");  // bare string, no quotes needed
  c.set("optim.lr=3e-4");
  EXPECT_EQ(c.get_int("model.n_layer", 0), 6);
  EXPECT_EQ(c.get_string("data.tokenizer", ""), "byte");
  EXPECT_DOUBLE_EQ(c.get_double("optim.lr", 0), 3e-4);
  EXPECT_FALSE(error_of([&] { c.set("nonsense"); }).empty());
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
