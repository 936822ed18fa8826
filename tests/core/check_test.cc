// BRIGADE_CHECK: a failed invariant throws naming the condition, where it
// is, and the message with its arguments formatted.
#include <gtest/gtest.h>

#include <string>

#include "brigade/core/error.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

std::string failure_of(int value, bool with_message) {
  try {
    if (with_message) {
      BRIGADE_CHECK(value < 3, "value {} is not below {}", value, 3);
    } else {
      BRIGADE_CHECK(value < 3);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Check, AFailureNamesTheConditionAndFormatsItsMessage) {
  EXPECT_EQ(failure_of(1, true), "");
  const std::string with = failure_of(7, true);
  EXPECT_NE(with.find("internal check failed: value < 3 ("), std::string::npos) << with;
  EXPECT_NE(with.find("check_test.cc:"), std::string::npos) << with;
  EXPECT_NE(with.find("): value 7 is not below 3"), std::string::npos) << with;
  const std::string without = failure_of(7, false);
  EXPECT_NE(without.find("internal check failed: value < 3 ("), std::string::npos) << without;
  EXPECT_EQ(without.back(), ')') << without;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
