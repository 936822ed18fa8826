// diag.sdc_every: the training loop's guard against silent data corruption.
//
// After a step's update, every sdc_every steps and before any snapshot or
// checkpoint of the step is started, the replicas of each data-parallel
// group compare their parameters (Trainer::compare_replicas). Checking
// before every save means no snapshot or checkpoint ever holds a state that
// has not passed a check, so the rollback after a failed check (the agent's
// restart from the newest snapshot or checkpoint) lands before the
// corruption without discarding anything.
//
// On a disagreement each rank of the group writes what it saw to
// RUN_DIR/sdc_rank<R>_step<S>.json (its pid ties it to this process: the
// agent copies it into the incident's evidence, elastic/incident_evidence.h,
// and diag/root_cause.h names the rank from it) and throws Error: the
// worker exits non-zero and the agent restarts the job. With tensor or
// pipeline parallelism the verdict is agreed over the world, so the other
// groups stop at the same step instead of waiting for the failed one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace brigade {

class Communicator;
class Trainer;

// The report's file name for world rank `rank` at step `step`.
std::string silent_corruption_file(int rank, int64_t step);

class SilentCorruptionGuard {
 public:
  // world: every rank (null alone). Off when diag.sdc_every is 0 or the
  // trainer has no data-parallel replicas.
  SilentCorruptionGuard(Trainer& trainer, Communicator* world);

  bool enabled() const { return enabled_; }
  // Whether the loop must check after step `done` (steps completed): every
  // sdc_every steps, and at steps whose state is saved (a snapshot, a
  // checkpoint or the final save).
  bool due(int64_t done) const;
  // Compares the replicas if due; throws Error on a disagreement, after
  // writing this rank's report.
  void after_step(int64_t done);

 private:
  Trainer& trainer_;
  Communicator* world_;
  bool enabled_ = false;
};

}  // namespace brigade
