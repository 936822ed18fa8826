// Schedules without processes: what every stage's list must say, checked on
// the lists themselves.
#include "brigade/schedule/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "brigade/core/error.h"

namespace brigade::schedule {
namespace BRIGADE_TEST_FILE {

// Every shape the grid tests run: p 1-6, m 1-12, v 1-3, where valid.
std::vector<Shape> grid() {
  std::vector<Shape> shapes;
  for (Kind kind : {Kind::kGpipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kZbH1}) {
    for (int64_t p = 1; p <= 6; ++p) {
      for (int64_t m = 1; m <= 12; ++m) {
        for (int64_t v = 1; v <= 3; ++v) {
          const Shape s{kind, p, m, v};
          try {
            check(s);
          } catch (const Error&) {
            continue;
          }
          shapes.push_back(s);
        }
      }
    }
  }
  return shapes;
}

std::string name(const Shape& s) {
  return fmt::format("{} p={} m={} v={}", kind_name(s.kind), s.stages, s.microbatches,
                     s.virtual_stages);
}

TEST(Schedule, GridCoversEveryKind) {
  std::map<Kind, int> count;
  for (const Shape& s : grid()) ++count[s.kind];
  EXPECT_EQ(count.size(), 4u);
  EXPECT_GT(count[Kind::kInterleaved], 20);
}

TEST(Schedule, EachMicroBatchRunsForwardThenBackwardOnceOnEveryStage) {
  for (const Shape& s : grid()) {
    const bool split = s.kind == Kind::kZbH1;
    for (int64_t stage = 0; stage < s.stages; ++stage) {
      const auto list = stage_instructions(s, stage);
      // Position of each compute instruction, by (op, mb, chunk).
      std::map<std::tuple<Op, int64_t, int64_t>, std::vector<size_t>> at;
      for (size_t i = 0; i < list.size(); ++i) {
        at[{list[i].op, list[i].microbatch, list[i].chunk}].push_back(i);
      }
      auto where = [&at](Op op, int64_t mb, int64_t chunk) { return at[{op, mb, chunk}]; };
      ASSERT_EQ(list.back().op, Op::kOptimizerStep) << name(s);
      ASSERT_EQ(where(Op::kOptimizerStep, -1, 0).size(), 1u) << name(s);
      for (int64_t mb = 0; mb < s.microbatches; ++mb) {
        for (int64_t c = 0; c < s.virtual_stages; ++c) {
          const auto f = where(Op::kForward, mb, c);
          const auto b = where(split ? Op::kBackwardInput : Op::kBackward, mb, c);
          ASSERT_EQ(f.size(), 1u) << name(s) << " stage " << stage << " mb " << mb;
          ASSERT_EQ(b.size(), 1u) << name(s) << " stage " << stage << " mb " << mb;
          EXPECT_LT(f[0], b[0]) << name(s) << " stage " << stage << " mb " << mb << " chunk " << c;
          const auto w = where(Op::kBackwardWeight, mb, c);
          if (split) {
            ASSERT_EQ(w.size(), 1u) << name(s) << " stage " << stage << " mb " << mb;
            EXPECT_LT(b[0], w[0]) << name(s) << " stage " << stage << " mb " << mb;
          } else {
            EXPECT_TRUE(w.empty()) << name(s);
            EXPECT_TRUE(where(Op::kBackwardInput, mb, c).empty()) << name(s);
          }
        }
      }
    }
  }
}

TEST(Schedule, EverySendHasItsReceiveAtTheNextVirtualStage) {
  for (const Shape& s : grid()) {
    // (gradient?, mb, from virtual stage, to virtual stage) -> sends - receives
    std::map<std::tuple<bool, int64_t, int64_t, int64_t>, int> balance;
    int64_t sends = 0;
    for (int64_t stage = 0; stage < s.stages; ++stage) {
      for (const Instruction& in : stage_instructions(s, stage)) {
        const int64_t here = s.virtual_stage(stage, in.chunk);
        const bool grad = in.op == Op::kSendGrad || in.op == Op::kRecvGrad;
        if (in.op == Op::kSendActivation || in.op == Op::kSendGrad) {
          const int64_t to = grad ? here - 1 : here + 1;
          EXPECT_EQ(in.peer, to % s.stages) << name(s) << " " << to_string(in);
          ++balance[{grad, in.microbatch, here, to}];
          ++sends;
        } else if (in.op == Op::kRecvActivation || in.op == Op::kRecvGrad) {
          const int64_t from = grad ? here + 1 : here - 1;
          EXPECT_EQ(in.peer, from % s.stages) << name(s) << " " << to_string(in);
          --balance[{grad, in.microbatch, from, here}];
        } else {
          EXPECT_EQ(in.peer, -1) << name(s) << " " << to_string(in);
        }
      }
    }
    for (const auto& [message, count] : balance) {
      EXPECT_EQ(count, 0) << name(s) << ": mb " << std::get<1>(message) << " "
                          << (std::get<0>(message) ? "gradient" : "activation") << " from "
                          << std::get<2>(message) << " to " << std::get<3>(message);
    }
    // One activation and one gradient per micro-batch and boundary between
    // virtual stages.
    EXPECT_EQ(sends, 2 * s.microbatches * (s.stages * s.virtual_stages - 1)) << name(s);
  }
}

TEST(Schedule, BadShapesNameTheNumbersAndTheFix) {
  auto message = [](const Shape& s) {
    try {
      check(s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({Kind::kInterleaved, 4, 6, 2})
                .find("6 micro-batches is not a multiple of 4 "
                      "(use 4 or 8 micro-batches)"),
            std::string::npos)
      << message({Kind::kInterleaved, 4, 6, 2});
  EXPECT_NE(message({Kind::kInterleaved, 4, 8, 1}).find("at least 2 virtual stages"),
            std::string::npos);
  EXPECT_NE(message({Kind::kInterleaved, 1, 8, 2}).find("at least 2 pipeline stages"),
            std::string::npos);
  EXPECT_NE(message({Kind::kOneFOneB, 4, 8, 2}).find("virtual stages = 2"), std::string::npos);
  EXPECT_NE(message({Kind::kZbH1, 4, 0, 1}).find("at least 1 micro-batch, got 0"),
            std::string::npos);
  EXPECT_NE(message({Kind::kGpipe, 0, 4, 1}).find("stages must be at least 1, got 0"),
            std::string::npos);
  EXPECT_EQ(message({Kind::kInterleaved, 4, 8, 2}), "(accepted)");
  EXPECT_THROW(stage_instructions({Kind::kOneFOneB, 4, 8, 1}, 4), Error);
  EXPECT_EQ(parse_kind("zb-h1"), Kind::kZbH1);
  try {
    parse_kind("1F1B");
    ADD_FAILURE() << "accepted 1F1B";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: gpipe, 1f1b, interleaved, zb-h1"),
              std::string::npos);
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::schedule
