#include "brigade/train/silent_corruption.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
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
  if (!trainer.replica_checks_on()) {
    if (trainer.world_rank() == 0) {
      std::fprintf(stderr,
                   "brigade train: diag.sdc_every: no replica check under ZeRO 3: each parameter "
                   "slice exists on one rank only, so silent corruption goes unseen (ZeRO 2 or "
                   "lower keeps replicas to compare)\n");
    }
    return;
  }
  enabled_ = true;
  trainer.on_before_update([this] {
    if (due(trainer_.step())) check(trainer_.step());
  });
}

SilentCorruptionGuard::~SilentCorruptionGuard() {
  if (enabled_) trainer_.on_before_update({});
}

bool SilentCorruptionGuard::due(int64_t done) const {
  if (!enabled_ || done <= 0) return false;
  const TrainOptions& o = trainer_.options();
  const bool snapshot = trainer_.snapshots_enabled() && done % o.snapshot_every == 0;
  const bool checkpoint = o.checkpoint_every > 0 && done % o.checkpoint_every == 0;
  return done % o.sdc_every == 0 || snapshot || checkpoint;
}

void SilentCorruptionGuard::before_save() {
  if (enabled_) check(trainer_.step());
}

void SilentCorruptionGuard::check(int64_t done) {
  const ReplicaComparison c = trainer_.compare_replicas();
  Communicator& dp = *trainer_.dp_group();
  const int64_t me = trainer_.world_rank();
  // The report first: with a mesh, the other groups' ranks stop as soon as
  // the verdict is agreed, and the agent gathers the evidence then. Every
  // rank of a group saw the same hashes, so the group gathers its members
  // together.
  std::string named;
  if (!c.clean()) {
    std::vector<int64_t> members(static_cast<size_t>(trainer_.dp_size()));
    dp.all_gather(&me, members.data(), 1, DType::kI64)->wait();
    nlohmann::json hashes = nlohmann::json::array(), suspects = nlohmann::json::array();
    for (uint64_t h : c.hashes) hashes.push_back(fmt::format("{:016x}", h));
    for (int r : c.suspects) {
      suspects.push_back(members[static_cast<size_t>(r)]);
      named += fmt::format("{}{}", named.empty() ? "" : ", ", members[static_cast<size_t>(r)]);
    }
    const nlohmann::json report = {{"kind", "silent_data_corruption"},
                                   {"world_rank", me},
                                   {"pid", static_cast<int64_t>(::getpid())},
                                   {"step", done},
                                   {"group", dp.group_name()},
                                   {"members", members},
                                   {"compared", c.compared},
                                   {"hashes", hashes},
                                   {"suspects", suspects}};
    const fs::path path =
        fs::path(trainer_.options().run_dir) / silent_corruption_file(static_cast<int>(me), done);
    try {
      write_file_atomic(path, report.dump(1) + "\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "brigade train: could not write %s: %s\n", path.c_str(), e.what());
    }
  }
  // Every group's verdict, so every rank stops at this step together.
  double failed = c.clean() ? 0.0 : 1.0;
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
  if (c.clean()) {
    throw_error(
        "after step {}: another data-parallel group's replicas hold different parameters (silent "
        "data corruption, named in its ranks' errors); stopping so the job rolls back to the last "
        "snapshot or checkpoint",
        done);
  }
  const bool no_majority = static_cast<int>(c.suspects.size()) == trainer_.dp_size();
  throw_error(
      "after step {}: silent data corruption: the replicas of group {} hold different {}; {} {}. "
      "Stopping so the job rolls back to the last committed snapshot or checkpoint (none is "
      "committed before a check passed on what it read); if it recurs on the same rank, take its "
      "device out of service",
      done, dp.group_name(), c.compared,
      no_majority ? "no majority says which copy is right, so all of them are named, world ranks"
                  : "odd one(s) out by majority: world rank(s)",
      named);
}

}  // namespace brigade
