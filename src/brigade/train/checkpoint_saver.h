// Checkpoint saves of a data-parallel group, agreed on by every rank.
//
// Each rank writes its shard in the background (ckpt/async_writer.h) and
// rank 0 commits once every shard is on disk. A write can fail on one rank
// alone (its disk is full, EIO); rank 0 would then wait for a shard that
// never comes. So while a save is in flight the ranks exchange, once per
// training step, where each stands (writing, written, committed, failed):
// the training loop carries this rank's state() in its per-step gather of
// rank stats (train/rank_stats.h) and passes every rank's to poll(states);
// poll() gathers them itself. A failure reaches every rank at the same
// step, the step's .partial directory is removed, the previous checkpoint
// stays the newest, and every rank throws an Error naming the ranks and
// files that failed. A save is complete once every rank reports its part
// done (rank 0: committed).
//
// A state is read before the gather and acted on after it, so a part that
// finishes or fails during the gather is seen at the next step's, or by the
// next start()'s wait(), which gathers until the save settles: every rank
// acts on the same gathered states, so they still agree on the step at
// which a save completes or fails, and no rank starts the next save before
// the previous one has settled.
//
// Every method but state(), wait_until_written() and abandon() is
// collective: all ranks call it at the same points (the training loop's
// steps do). poll(states) runs a collective only when a rank failed (a
// barrier before the step is removed), which every rank sees in the same
// states.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>
#include <vector>

#include "brigade/ckpt/async_writer.h"

namespace brigade {

class Communicator;

// Every rank writes its shard into one directory and rank 0 commits the
// step once it sees them all, so the ranks of a multi-node job need a run
// directory every node mounts (NFS, Lustre, ...). Checked at start, not at
// the first save hours later: rank 0 writes a file named by a nonce into
// `root`, every rank looks for it, and a rank that cannot see it makes every
// rank throw an Error naming the ranks and the fix. Collective over `group`
// (null or size 1: nothing to check).
void require_shared_directory(Communicator* group, const std::filesystem::path& root);

class CheckpointSaver {
 public:
  // group: the data-parallel ranks that save together (null or size 1 alone).
  // what: "checkpoint", or "snapshot" for the in-memory snapshots (whose
  // failure message then points at no directory to resume from).
  CheckpointSaver(Communicator* group, int64_t commit_timeout_ms, std::string what = "checkpoint");
  // Gives up a save in flight (abandon()): one is left only on a way out,
  // by an error.
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Waits for the save in flight (wait()) and starts this rank's background
  // write, which makes the step's directory itself. save.rank and
  // save.num_shards are the group's.
  //
  // When the previous save has settled (the training loop's poll saw it
  // done), no collective: the loop's one per-step gather is all a save
  // costs between two steps (docs/ARCHITECTURE.md "Between two steps").
  // Only a saver's first save clears what earlier processes left under its
  // root (checkpoint.h, phase 0: the committers, then an all-reduce that
  // says whether they could); later ones need no clearing (checkpoint.h
  // says why), so no rank waits for a committer before writing. A rank's
  // saves therefore all go under one root (the training loop's do; the
  // ranks' roots may differ: a node's snapshot area is its own). A step
  // directory that cannot be made (a full disk, permissions, a file in its
  // place) fails the save like a shard that cannot be written: at the next
  // poll, on every rank, the error naming the directory.
  void start(AsyncCheckpointWriter::Save save, const std::vector<CheckpointPiece>& pieces);
  // Once per training step while a save may be in flight: the stats of a
  // save that completed (on every rank) since the last call. Throws an
  // Error if any rank's part failed, after dropping the step.
  std::optional<AsyncCheckpointWriter::Stats> poll();
  // The same from every rank's state() gathered by the caller in one
  // collective with others (train/rank_stats.h), by group rank. Every rank
  // must pass the states of one gather.
  std::optional<AsyncCheckpointWriter::Stats> poll(const std::vector<int32_t>& states);
  // This rank's writer state, for the caller's gather.
  int32_t state() const { return static_cast<int32_t>(writer_.state()); }
  // Blocks until the save in flight is committed, or throws as poll() does.
  void wait();
  // Not collective: blocks until this rank's part of the save in flight has
  // been written (or failed), so an unstaged save's pieces may change.
  void wait_until_written() { writer_.wait_until_written(); }
  // Not collective: claims this rank's spare shard file for `save`, the
  // recycled save this rank start()s next, for the caller to write the
  // pieces' data in place (AsyncCheckpointWriter::claim); then start() it
  // with save.writing.prewritten. Empty before this saver's first save
  // (whose phase 0 clears its root) and where there is no spare. Call once
  // this rank's part of the save in flight is written (wait_until_written).
  std::vector<float*> claim(const AsyncCheckpointWriter::Save& save,
                            const std::vector<CheckpointPiece>& pieces) {
    return cleared_ ? writer_.claim(save, pieces) : std::vector<float*>{};
  }
  // Not collective: gives up the save in flight, for a group that can no
  // longer agree (a peer died). Rank 0 removes the step's .partial
  // directory; the previous checkpoint stays the newest.
  void abandon();

  bool in_flight() const { return in_flight_; }

 private:
  // The first save's phase 0 (start()).
  void clear_leftovers(const AsyncCheckpointWriter::Save& save);
  // Every rank's writer state, gathered; then what they add up to.
  std::vector<int32_t> gather_states();
  // True when every rank's part is done (rank 0's: committed); throws if
  // a rank failed.
  bool settle(const std::vector<int32_t>& states);

  Communicator* group_;
  std::string what_;
  int rank_ = 0;
  int size_ = 1;
  AsyncCheckpointWriter writer_;
  bool in_flight_ = false;
  std::filesystem::path root_;
  int64_t step_ = 0;
  // This rank commits the save in flight, and removes it if it fails
  // (rank 0, or a node's committer of a snapshot part).
  bool committer_ = false;
  // Phase 0 done: this saver's first save cleared its root.
  bool cleared_ = false;
  // The stats of saves completed (by wait() or a poll) and not yet
  // reported, oldest first.
  std::deque<AsyncCheckpointWriter::Stats> completed_;
};

}  // namespace brigade
