#include "brigade/train/silent_corruption.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/threads.h"
#include "brigade/kernels/cpu/gemm.h"
#include "brigade/kernels/cpu/isa.h"
#include "brigade/train/trainer.h"

namespace brigade {
namespace fs = std::filesystem;

std::string silent_corruption_file(int rank, int64_t step) {
  return fmt::format("sdc_rank{}_step{}.json", rank, step);
}

SilentCorruptionGuard::SilentCorruptionGuard(Trainer& trainer, Communicator* world)
    : trainer_(trainer), world_(world) {
  const TrainOptions& o = trainer.options();
  if (o.sdc_every <= 0 || trainer.dp_size() <= 1) return;
  enabled_ = true;
  at_rest_ = trainer.sharded_params() != nullptr;
  const bool speaks = trainer.world_rank() == 0;
  if (trainer.gradient_replay_supported()) {
    // Bit-identical recomputation needs the same reduction orders: the
    // same thread count and the same kernels on every rank: Brigade's own
    // (BRIGADE_CPU_ISA) and the GEMMs': oneDNN picks its code path by CPU
    // generation at the AVX-512 level, and at the AVX2 level the weight
    // gradients run in OpenBLAS only where it is installed.
    constexpr size_t kFacts = 3;
    const int64_t mine[kFacts] = {num_threads(), static_cast<int64_t>(cpu::active_isa()),
                                  cpu::gemm_isa()};
    std::vector<int64_t> all(kFacts * static_cast<size_t>(trainer.dp_size()));
    trainer.dp_group()->all_gather(mine, all.data(), kFacts, DType::kI64)->wait();
    replay_ = true;
    for (size_t i = 0; i < all.size(); ++i) replay_ = replay_ && all[i] == mine[i % kFacts];
    if (!replay_ && speaks) {
      std::fprintf(stderr,
                   "brigade train: diag.sdc_every: no gradient replay: the data-parallel ranks "
                   "run different thread counts or instruction sets (Brigade's or oneDNN's "
                   "GEMMs'), so their recomputations would not be bit-identical (give every node "
                   "the same OMP_NUM_THREADS and BRIGADE_CPU_ISA, and nodes of one CPU "
                   "generation); the parameters are still checked\n");
    }
  } else if (speaks) {
    std::fprintf(stderr,
                 "brigade train: diag.sdc_every: no gradient replay with tensor or pipeline "
                 "parallelism (a replay's forward would involve the other groups); the "
                 "parameters are still checked\n");
  }
  trainer.on_before_update(
      [this] {
        if (due(trainer_.step())) check(trainer_.step());
      },
      [this](int64_t done) { return due(done) || done == trainer_.options().steps; });
  if (at_rest_) {
    recorded_ = trainer.owned_state_hash();
    recorded_step_ = trainer.step();
    trainer.on_after_update([this] {
      const int64_t done = trainer_.step();
      if (!due(done) && done != trainer_.options().steps) return;
      recorded_ = trainer_.owned_state_hash();
      recorded_step_ = done;
    });
  }
  if (replay_) {
    trainer.on_local_gradients([this] { return gradients_due(trainer_.step()); },
                               [this] { check_gradients(trainer_.step()); });
  }
}

SilentCorruptionGuard::~SilentCorruptionGuard() {
  if (!enabled_) return;
  trainer_.on_before_update({});
  trainer_.on_after_update({});
  trainer_.on_local_gradients({}, {});
}

bool SilentCorruptionGuard::due(int64_t done) const {
  if (!enabled_ || done <= 0) return false;
  const TrainOptions& o = trainer_.options();
  const bool snapshot = trainer_.snapshots_enabled() && done % o.snapshot_every == 0;
  const bool checkpoint = o.checkpoint_every > 0 && done % o.checkpoint_every == 0;
  return done % o.sdc_every == 0 || snapshot || checkpoint;
}

bool SilentCorruptionGuard::gradients_due(int64_t done) const {
  return replay_ && done > 0 && done % trainer_.options().sdc_every == 0;
}

void SilentCorruptionGuard::before_save() {
  if (enabled_) check(trainer_.step());
}

void SilentCorruptionGuard::check(int64_t done) {
  conclude(done, check_state(done));
}

SilentCorruptionGuard::Verdict SilentCorruptionGuard::check_state(int64_t done) {
  if (at_rest_) return check_at_rest(done);
  ReplicaComparison c = trainer_.compare_replicas();
  return Verdict{std::move(c.compared), std::move(c.hashes), std::move(c.suspects), {}};
}

SilentCorruptionGuard::Verdict SilentCorruptionGuard::check_at_rest(int64_t done) {
  // Without a record of this very state (an interrupted run's save between
  // checks) there is nothing to hold it against.
  const bool recorded = recorded_step_ == done;
  const uint64_t now = recorded ? trainer_.owned_state_hash() : 0;
  const uint64_t mine[3] = {recorded ? 1u : 0u, recorded_, now};
  const int n = trainer_.dp_size();
  std::vector<uint64_t> all(3 * static_cast<size_t>(n));
  trainer_.dp_group()->all_gather(mine, all.data(), 3, DType::kI64)->wait();
  Verdict v;
  v.compared = "own parameter and Adam moment slices";
  std::vector<uint64_t> then;
  for (int r = 0; r < n; ++r) {
    const size_t i = 3 * static_cast<size_t>(r);
    v.hashes.push_back(all[i + 2]);
    then.push_back(all[i + 1]);
    if (all[i] != 0 && all[i + 1] != all[i + 2]) v.suspects.push_back(r);
  }
  v.finding = [v, then, done](const std::vector<int64_t>& members) {
    std::string seen;
    for (int r : v.suspects) {
      seen += fmt::format("{}xxh3 {:016x} after its update, {:016x} now on rank {}",
                          seen.empty() ? "" : "; ", then[static_cast<size_t>(r)],
                          v.hashes[static_cast<size_t>(r)], members[static_cast<size_t>(r)]);
    }
    return fmt::format(
        "{} parameter and Adam moment slices (ZeRO 3: held by no other rank) changed after the "
        "update of step {} with no update in between ({})",
        v.suspects.size() == 1 ? "its own" : "each one's own", done, seen);
  };
  return v;
}

void SilentCorruptionGuard::check_gradients(int64_t done) {
  // The parameters first: a rank whose parameters differ computes its own
  // gradient and its replay of its peer's both differently, which the
  // replay alone would blame on its replayer and itself. The check before
  // the update runs as well (it also covers what a snapshot read since).
  const Verdict state = check_state(done);
  if (!state.suspects.empty()) conclude(done, state);
  const GradientReplay g = trainer_.replay_gradients();
  if (g.clean()) return;
  const int n = trainer_.dp_size();
  const auto describe = [g, done](const std::vector<int64_t>& members) {
    const auto world = [&](int r) { return members[static_cast<size_t>(r)]; };
    std::string out;
    for (const GradientReplay::Dispute& d : g.disputes) {
      const auto i = static_cast<size_t>(d.rank), j = static_cast<size_t>(d.replayer);
      out += fmt::format(
          "{}rank {}'s local gradient of step {} (before the reduce) is xxh3 {:016x}, rank {}'s "
          "replay of its micro-batches {:016x}, rank {}'s recomputation {:016x}",
          out.empty() ? "" : "; ", world(d.rank), done + 1, g.own[i], world(d.replayer),
          g.replayed[j], world(d.settler), d.third);
      out += !d.settled() ? std::string(": nothing settles which")
             : d.own_off  ? fmt::format(": rank {}'s own computation was off", world(d.rank))
                          : fmt::format(": rank {}'s replay was off", world(d.replayer));
    }
    return out;
  };
  if (g.suspects.empty()) {
    // Nothing settles any dispute: the same micro-batches from the same
    // parameters gave different gradients on devices that each agree with
    // themselves, or on one device twice. That is the kernels'
    // non-determinism (or faults that cannot be told from it); rolling back
    // would replay the same step into the same verdict until max_restarts,
    // having named healthy devices. So the replay stops for this run, the
    // step goes on with each rank's own gradient, and the parameters stay
    // checked.
    replay_ = false;
    trainer_.restore_local_gradient();
    if (trainer_.world_rank() == 0) {
      std::vector<int64_t> members(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
      std::fprintf(stderr,
                   "brigade train: diag.sdc_every: gradient replay off from step %lld: the "
                   "data-parallel ranks' recomputations of the same micro-batches are not "
                   "bit-identical and nothing settles which is right (%s): the kernels "
                   "are not deterministic across these ranks, so the replay cannot tell "
                   "corruption from that (the parameters are still checked)\n",
                   static_cast<long long>(done + 1), describe(members).c_str());
    }
    return;
  }
  Verdict v;
  v.compared = fmt::format("local gradients of step {} (before the reduce)", done + 1);
  v.hashes = g.own;
  v.suspects = g.suspects;
  v.finding = describe;
  // The saves of the state after `done` are not checked yet either.
  conclude(done, v);
}

void SilentCorruptionGuard::conclude(int64_t done, const Verdict& v) {
  const bool clean = v.suspects.empty();
  Communicator& dp = *trainer_.dp_group();
  const int64_t me = trainer_.world_rank();
  // The report first: with a mesh, the other groups' ranks stop as soon as
  // the verdict is agreed, and the agent gathers the evidence then. Every
  // rank of a group saw the same hashes, so the group gathers its members
  // together.
  std::string named, finding;
  if (!clean) {
    std::vector<int64_t> members(static_cast<size_t>(trainer_.dp_size()));
    dp.all_gather(&me, members.data(), 1, DType::kI64)->wait();
    nlohmann::json hashes = nlohmann::json::array(), suspects = nlohmann::json::array();
    for (uint64_t h : v.hashes) hashes.push_back(fmt::format("{:016x}", h));
    for (int r : v.suspects) {
      suspects.push_back(members[static_cast<size_t>(r)]);
      named += fmt::format("{}{}", named.empty() ? "" : ", ", members[static_cast<size_t>(r)]);
    }
    nlohmann::json report = {{"kind", "silent_data_corruption"},
                             {"world_rank", me},
                             {"pid", static_cast<int64_t>(::getpid())},
                             {"step", done},
                             {"group", dp.group_name()},
                             {"members", members},
                             {"compared", v.compared},
                             {"hashes", hashes},
                             {"suspects", suspects}};
    if (v.finding) {
      finding = v.finding(members);
      report["finding"] = finding;
    }
    const fs::path path =
        fs::path(trainer_.options().run_dir) / silent_corruption_file(static_cast<int>(me), done);
    try {
      write_file_atomic(path, report.dump(1) + "\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "brigade train: could not write %s: %s\n", path.c_str(), e.what());
    }
  }
  // Every group's verdict, so every rank stops at this step together.
  double failed = clean ? 0.0 : 1.0;
  if (world_ != nullptr && world_->size() > trainer_.dp_size()) {
    world_->all_reduce(&failed, 1, DType::kF64, ReduceOp::kMax)->wait();
  }
  if (failed == 0.0) return;
  trainer_.discard_saves(done);
  // No rank throws before world rank 0 has removed the saves of the bad
  // state: the first rank to exit makes the agent stop the others, and a
  // rank 0 stopped half-way would leave the corrupted snapshot to restart
  // from (seen under ASan's slower clock).
  Communicator& everyone = world_ != nullptr ? *world_ : dp;
  everyone.barrier()->wait();
  if (clean) {
    throw_error(
        "after step {}: another data-parallel group's replicas hold different parameters (silent "
        "data corruption, named in its ranks' errors); stopping so the job rolls back to the last "
        "snapshot or checkpoint",
        done);
  }
  constexpr char kRollback[] =
      "Stopping so the job rolls back to the last committed snapshot or checkpoint (none is "
      "committed before a check passed on what it read); if it recurs on the same rank, take its "
      "device out of service";
  if (!finding.empty()) {
    throw_error("after step {}: silent data corruption in group {}: {}; world rank(s) {}. {}", done,
                dp.group_name(), finding, named, kRollback);
  }
  const bool no_majority = static_cast<int>(v.suspects.size()) == trainer_.dp_size();
  throw_error(
      "after step {}: silent data corruption: the replicas of group {} hold different {}; {} {}. "
      "{}",
      done, dp.group_name(), v.compared,
      no_majority ? "no majority says which copy is right, so all of them are named, world ranks"
                  : "odd one(s) out by majority: world rank(s)",
      named, kRollback);
}

}  // namespace brigade
