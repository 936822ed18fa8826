#include "brigade/schedule/simulate.h"

#include <fmt/format.h>

#include <algorithm>

#include "brigade/core/error.h"

namespace brigade::schedule {
namespace {

bool is_send(Op op) {
  return op == Op::kSendActivation || op == Op::kSendGrad;
}
bool is_recv(Op op) {
  return op == Op::kRecvActivation || op == Op::kRecvGrad;
}
bool is_grad(Op op) {
  return op == Op::kSendGrad || op == Op::kRecvGrad;
}

}  // namespace

Simulation simulate(const std::vector<std::vector<Instruction>>& lists, const Costs& costs,
                    bool keep_intervals) {
  const int64_t p = static_cast<int64_t>(lists.size());
  BRIGADE_CHECK(p >= 1, "no stages to simulate");
  BRIGADE_CHECK(costs.stages.size() == 1 || static_cast<int64_t>(costs.stages.size()) == p,
                "{} stage costs for {} stages", costs.stages.size(), p);
  int64_t v = 1, m = 0;
  for (const auto& list : lists) {
    for (const Instruction& in : list) {
      v = std::max(v, in.chunk + 1);
      m = std::max(m, in.microbatch + 1);
    }
  }
  const int64_t virtual_stages = p * v;
  // A message is (activation or gradient, micro-batch, receiving virtual
  // stage): an index into `arrival` and `state`.
  auto key = [&](bool grad, int64_t mb, int64_t to_virtual) {
    return static_cast<size_t>(((mb * virtual_stages + to_virtual) << 1) | (grad ? 1 : 0));
  };
  auto describe = [](int64_t stage, size_t pc, const Instruction& in) {
    return fmt::format("stage {} at instruction {} ({})", stage, pc, to_string(in));
  };

  Simulation sim;
  sim.stages.resize(static_cast<size_t>(p));
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0);
  std::vector<int64_t> live(static_cast<size_t>(p), 0);
  enum : uint8_t { kNotSent, kInFlight, kReceived };
  std::vector<uint8_t> state(static_cast<size_t>(2 * m * virtual_stages), kNotSent);
  std::vector<double> arrival(state.size(), 0.0);
  auto fail = [&sim](std::string problem) {
    sim.ok = false;
    sim.problem = std::move(problem);
    return sim;
  };

  // Each stage runs until it needs data not yet sent. A stage's times depend
  // only on its own list and on arrival times, which are final once sent, so
  // the order in which stages take turns does not change the result.
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t s = 0; s < p; ++s) {
      const auto& list = lists[static_cast<size_t>(s)];
      const StageCosts& c = costs.stages[costs.stages.size() == 1 ? 0 : static_cast<size_t>(s)];
      StageTimeline& t = sim.stages[static_cast<size_t>(s)];
      size_t& i = pc[static_cast<size_t>(s)];
      double& now = clock[static_cast<size_t>(s)];
      int64_t& alive = live[static_cast<size_t>(s)];
      const double chunks = static_cast<double>(v);
      while (i < list.size()) {
        const Instruction& in = list[i];
        const double start = now;
        if (in.op != Op::kOptimizerStep && (in.microbatch < 0 || in.chunk < 0)) {
          return fail(fmt::format("{} has a negative micro-batch or chunk", describe(s, i, in)));
        }
        const int64_t vs = in.chunk * p + s;
        if (is_send(in.op) || is_recv(in.op)) {
          const bool grad = is_grad(in.op);
          // Activations go to the next virtual stage, gradients to the previous.
          const bool previous = is_send(in.op) == grad;
          const int64_t other = previous ? vs - 1 : vs + 1;
          // other % p, without a division: the stage before or after s.
          const int64_t other_stage =
              previous ? (s == 0 ? p - 1 : s - 1) : (s + 1 == p ? 0 : s + 1);
          if (other < 0 || other >= virtual_stages || other_stage != in.peer) {
            return fail(fmt::format("{} names stage {}, but its data {} virtual stage {}{}",
                                    describe(s, i, in), in.peer,
                                    is_send(in.op) ? "goes to" : "comes from", other,
                                    other >= 0 && other < virtual_stages
                                        ? fmt::format(", which is on stage {}", other % p)
                                        : std::string(" (there is none)")));
          }
          if (is_send(in.op)) {
            const size_t k = key(grad, in.microbatch, other);
            if (state[k] != kNotSent) {
              return fail(fmt::format("{} sends data already sent", describe(s, i, in)));
            }
            state[k] = kInFlight;
            arrival[k] = now + costs.p2p_s;
          } else {
            const size_t k = key(grad, in.microbatch, vs);
            if (state[k] == kNotSent) break;  // not sent yet: the next stage's turn
            if (state[k] == kReceived) {
              return fail(fmt::format("{} receives data already received", describe(s, i, in)));
            }
            now = std::max(now, arrival[k]);
            state[k] = kReceived;
          }
        } else {
          double cost = 0;
          switch (in.op) {
            case Op::kForward:
              cost = c.forward / chunks;
              ++alive;
              break;
            case Op::kBackward:
              cost = (c.backward_input + c.backward_weight) / chunks;
              --alive;
              break;
            case Op::kBackwardInput:
              cost = c.backward_input / chunks;
              break;
            case Op::kBackwardWeight:
              cost = c.backward_weight / chunks;
              --alive;
              break;
            default:  // kOptimizerStep
              cost = costs.optimizer_s;
              break;
          }
          t.peak_live = std::max(t.peak_live, alive);
          now += cost;
          t.busy_s += cost;
        }
        if (keep_intervals) t.intervals.push_back(Interval{in, start, now});
        ++i;
        progress = true;
      }
    }
  }

  std::string stuck;
  for (int64_t s = 0; s < p; ++s) {
    const auto& list = lists[static_cast<size_t>(s)];
    const size_t i = pc[static_cast<size_t>(s)];
    if (i < list.size()) {
      stuck += fmt::format("{}{} waits for data never sent", stuck.empty() ? "" : "; ",
                           describe(s, i, list[i]));
    }
  }
  if (!stuck.empty()) return fail("deadlock: " + stuck);
  const int64_t unreceived = std::count(state.begin(), state.end(), kInFlight);
  if (unreceived > 0) {
    const size_t k =
        static_cast<size_t>(std::find(state.begin(), state.end(), kInFlight) - state.begin());
    const int64_t to = static_cast<int64_t>(k >> 1) % virtual_stages;
    return fail(fmt::format(
        "{} of micro-batch {} sent to virtual stage {} (stage {}) but never received, among {} "
        "such",
        (k & 1) ? "a gradient" : "an activation", static_cast<int64_t>(k >> 1) / virtual_stages, to,
        to % p, unreceived));
  }
  for (int64_t s = 0; s < p; ++s) {
    sim.stages[static_cast<size_t>(s)].finish_s = clock[static_cast<size_t>(s)];
    sim.step_s = std::max(sim.step_s, clock[static_cast<size_t>(s)]);
  }
  for (StageTimeline& t : sim.stages) {
    t.bubble_s = sim.step_s - t.busy_s;
    t.bubble_fraction = sim.step_s > 0 ? t.bubble_s / sim.step_s : 0.0;
    t.peak_live_microbatches = static_cast<double>(t.peak_live) / static_cast<double>(v);
  }
  return sim;
}

}  // namespace brigade::schedule
