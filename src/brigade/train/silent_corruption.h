// diag.sdc_every: the training loop's guard against silent data corruption.
//
// The replicas of each data-parallel group compare what they must hold bit
// for bit (Trainer::compare_replicas) right before an update: every rank
// still holds the last update's result there, so the comparison covers the
// whole step since then, and an unstaged snapshot started after that update
// has been read by then (train_step waits for it). It runs in the step after
// every sdc_every-th and after every step whose state a snapshot or
// checkpoint started to save, and before the final and the interrupted
// save. So every save's state passes a check covering everything up to the
// save's read before any step updates it further. A save may commit before
// that check (rank 0's writer commits once every shard is written), so a
// failed check discards the saves of the state it failed on
// (Trainer::discard_saves: the ones in flight given up, that step's
// committed snapshot and checkpoint removed), and the agent's ordinary
// restart from the newest one left lands before the corruption. That is
// why, while the checks run, two snapshots are kept instead of one
// (Trainer::snapshots_kept): the one before the discarded one. Checkpoints
// keep train.keep_checkpoints; with 1, a failed check right after a
// checkpoint leaves none to resume from.
//
// On a disagreement each rank of the group writes what it saw to
// RUN_DIR/sdc_rank<R>_step<S>.json (S: the steps completed when the check
// ran; its pid ties it to this process: the agent copies it into the
// incident's evidence, elastic/incident_evidence.h, and diag/root_cause.h
// names the rank from it), then, with tensor or pipeline parallelism, the
// verdict is agreed over the world, so every group stops at the same step,
// the report already written; and every rank throws Error: the workers exit
// non-zero and the agent restarts the job.
//
// Off under ZeRO 3 (with one line at start-up): each parameter slice exists
// once, so there is no replica to compare with.
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
  // world: every rank (null alone). Off when diag.sdc_every is 0, the
  // trainer has no data-parallel replicas, or under ZeRO 3. Hooks itself
  // into the trainer's steps (Trainer::on_before_update) until destroyed.
  SilentCorruptionGuard(Trainer& trainer, Communicator* world);
  ~SilentCorruptionGuard();
  SilentCorruptionGuard(const SilentCorruptionGuard&) = delete;
  SilentCorruptionGuard& operator=(const SilentCorruptionGuard&) = delete;

  bool enabled() const { return enabled_; }
  // Whether the step after `done` steps must check before its update: every
  // sdc_every steps, and when a snapshot or checkpoint of `done` started.
  bool due(int64_t done) const;
  // Collective: before a save outside the loop's steps (the final one, or
  // an interrupted run's), compares the current state.
  void before_save();

 private:
  // Compares the state after `done` steps; throws Error on a disagreement,
  // after writing this rank's report.
  void check(int64_t done);

  Trainer& trainer_;
  Communicator* world_;
  bool enabled_ = false;
};

}  // namespace brigade
