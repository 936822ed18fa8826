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
// With a snapshot every step the check runs every step, so its hash is
// not a pass of its own over the state: under ZeRO 0 the update that
// writes the state a check is due on hashes the parameters and moments
// from L1 as it computes them (cpu::state_hash), under ZeRO 1/2 the
// snapshot's copy hashes the parameters on its way; the check takes such a
// hash only where it is provably of the state before the update, and
// otherwise makes its own pass (Trainer::compare_replicas).
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
// Under ZeRO 3 each parameter and moment slice exists on one rank only, so
// there is no replica to compare with: each rank hashes its own slices
// right after the update of a step whose check is due (Trainer::
// on_after_update; at start-up too) and hashes them again at the check,
// before the update that would write them (and so before the next step's
// gathers could carry a flipped bit into a snapshot's successors). A rank
// whose slices changed with no update in between holds corrupted memory
// and is named: its own hash disagrees with itself. This sees memory
// corruption only, not a wrong update computation: the hash is taken after
// the update (the same holds for ZeRO 1/2's moment slices). A flip in a
// rank's gathered copy of a block lasts only as long as that block is
// resident, so what it can corrupt is the rank's gradient, which the replay
// below sees in a check step; comparing the gathered buckets' hashes on
// every gather would cost a hash per block per micro-batch.
//
// The gradients (data parallelism without tp or pp): a flipped bit in one
// rank's local gradient enters every rank's reduced sum, after which all
// replicas agree on the wrong update. So a check step (the one after every
// sdc_every-th; not the save-driven ones, since it costs a second and
// sometimes a third forward and backward) samples the gradients: before
// its own backward each rank recomputes the micro-batches of its next peer
// (dp rank r + 1 mod dp) from the same parameters into its gradient buffer
// and keeps their hash; its own backward then does not overlap the reduce;
// and between that backward and the reduce the group first compares the
// parameters (as the check before the update does: a rank whose parameters
// differ would compute both its own gradient and its replay differently,
// and is named by that comparison instead), then each rank's own
// gradient's hash with its replayer's (Trainer::replay_gradients). A flip
// in a step that is not a check step is not seen: the detection of
// gradient corruption is sampled, 1 step in sdc_every.
//
// The kernels are deterministic for a given thread count and code path, so
// the hashes are bit-identical; the ranks compare their OpenMP thread
// counts, Brigade's active ISA and oneDNN's effective one at start-up, and
// where they differ the replay is off, with one line (the parameter checks
// stay on). A disagreement is settled by a third computation of the
// disputed micro-batches, by a rank on neither side where dp >= 3 (so a
// device that computes wrong every time is outvoted: both its own gradient
// and its replay are pinned on it), by the rank itself with two ranks: the
// rank whose first gradient was off, or the replayer that was, is named,
// and the check fails as above: the saves of the state after the last step
// are discarded (it was not checked), and the job resumes from the one
// before. When nothing settles any dispute (the third agrees with neither
// side, or two ranks each dispute the other's), the ranks compute the same
// thing differently: non-determinism the start-up comparison missed, or
// faults that cannot be told from it. A rollback would only replay the same
// verdict until max_restarts, so the replay turns itself off for the run
// with one line, and the step goes on with each rank's own gradient.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace brigade {

class Communicator;
class Trainer;

// The report's file name for world rank `rank` at step `step`.
std::string silent_corruption_file(int rank, int64_t step);

class SilentCorruptionGuard {
 public:
  // world: every rank (null alone). Off when diag.sdc_every is 0 or the
  // trainer has no data-parallel group. Hooks itself into the trainer's
  // steps (Trainer::on_before_update, on_after_update, on_local_gradients)
  // until destroyed.
  SilentCorruptionGuard(Trainer& trainer, Communicator* world);
  ~SilentCorruptionGuard();
  SilentCorruptionGuard(const SilentCorruptionGuard&) = delete;
  SilentCorruptionGuard& operator=(const SilentCorruptionGuard&) = delete;

  bool enabled() const { return enabled_; }
  // Whether the step after `done` steps must check before its update: every
  // sdc_every steps, and when a snapshot or checkpoint of `done` started.
  bool due(int64_t done) const;
  // Whether that step also replays the gradients: every sdc_every steps.
  bool gradients_due(int64_t done) const;
  bool replays_gradients() const { return replay_; }
  // Collective: before a save outside the loop's steps (the final one, or
  // an interrupted run's), compares the current state.
  void before_save();

 private:
  // What a check found, by rank of the data-parallel group.
  struct Verdict {
    std::string compared;          // what was hashed, for people
    std::vector<uint64_t> hashes;  // each rank's
    std::vector<int> suspects;     // group ranks
    // ZeRO 3's and the gradients': the report's finding in words, given the
    // group's world ranks (the replicas' comparison words its own from the
    // hashes, diag/root_cause.cc).
    std::function<std::string(const std::vector<int64_t>&)> finding;
  };
  // Compares the state after `done` steps; throws Error on a disagreement,
  // after writing this rank's report.
  void check(int64_t done);
  // The replicas' comparison, or under ZeRO 3 check_at_rest.
  Verdict check_state(int64_t done);
  // ZeRO 3: this rank's slices against their hash after the last update.
  Verdict check_at_rest(int64_t done);
  // In step done + 1, between its backward and its reduce.
  void check_gradients(int64_t done);
  // Writes the report, agrees the verdict over the world, and throws Error
  // if any group failed.
  void conclude(int64_t done, const Verdict& v);

  Trainer& trainer_;
  Communicator* world_;
  bool enabled_ = false;
  bool at_rest_ = false;  // ZeRO 3
  bool replay_ = false;
  uint64_t recorded_ = 0;
  int64_t recorded_step_ = -1;  // the steps done when recorded_ was taken
};

}  // namespace brigade
