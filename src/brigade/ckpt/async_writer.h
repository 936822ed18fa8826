// Asynchronous, two-phase checkpoint saves: the training loop waits only for
// a copy of this rank's pieces into memory; a background thread writes the
// shard, and on rank 0 commits the step (checkpoint.h's phases 2 and 3) once
// every rank's shard is on disk. A new save first waits for the previous
// one, so at most one is in flight and each rank's staging copy is reused.
//
// Each rank's thread makes the step's .partial directory itself (phase 1,
// idempotent), so a save starts without the ranks waiting for rank 0 to
// make it; a directory that cannot be made fails the rank's part
// (State::kFailed) like a shard that cannot be written. Clearing what
// earlier processes left under the root (checkpoint.h, phase 0) stays with
// the caller, which owns the communicator: the background threads never
// touch it (a collective from a second thread would race the training
// loop's). Rank 0's thread learns that the other ranks are done from their
// shard index files in the step's directory instead, so the ranks must share
// the file system the checkpoints go to.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/ckpt/node_part.h"
#include "brigade/ckpt/safetensors.h"

namespace brigade {

class AsyncCheckpointWriter {
 public:
  // commit_timeout_ms bounds how long rank 0 waits for the other ranks' shards.
  explicit AsyncCheckpointWriter(int64_t commit_timeout_ms);
  // Gives up a save in flight (abort()) and reports its error, if any, on
  // stderr. Callers that want the save wait for it first.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  struct Save {
    std::filesystem::path root;
    int64_t step = 0;
    int rank = 0;
    int num_shards = 1;
    GptConfig config;
    int tp_rank = 0;  // the pieces are ranges of ParamLayout(config, tp_rank, tp_size)
    int tp_size = 1;
    std::vector<LayerRange> layers;  // and of this pipeline stage's chunks (empty: all blocks)
    CheckpointHeader header;         // used by rank 0
    int64_t keep = 0;                // rank 0 prunes to this many after committing (0: keep all)
    ShardWriting writing;            // an in-memory snapshot's: recycled, no checksums
    // Unstaged: the background thread reads the pieces where they are, with
    // no staging copy, and the caller leaves them unchanged until
    // wait_until_written() returns. What lets an in-memory snapshot of step
    // k be taken while step k+1's forward and backward run (they read the
    // parameters and moments; only the optimizer's update writes them).
    bool staged = true;
    // An in-memory snapshot across nodes (ckpt/node_part.h): the node's
    // ranks [part->first_rank, + part->ranks) are committed as the node's
    // part by the lowest of them, the node's committer, instead of the
    // whole step by rank 0 (each node's area is its own memory). Its
    // node, first_rank and ranks are read; the rest comes from this Save.
    std::optional<NodePart> part;
    // Called on the background thread once this rank's shard is written,
    // before the save reports it so (wait_until_written returns after it);
    // not when the write failed.
    std::function<void()> written;
    // The rank that clears the root's leftovers (phase 0) and commits.
    bool commits() const { return part ? rank == part->first_rank : rank == 0; }
  };
  // Waits for the previous save (rethrowing its error), copies the pieces'
  // data (if staged), and returns once the background write has started.
  void start(Save save, const std::vector<CheckpointPiece>& pieces);
  // Waits for the save in flight, if any; rethrows its error.
  void wait();
  // Claims this rank's spare shard file for `save` (a recycled one:
  // claim_checkpoint_shard, through this writer's kept mappings) for the
  // caller to write the pieces' data in place; start() then takes the save
  // with save.writing.prewritten. Empty when there is no spare to claim
  // (the save is then written as usual). On the caller's thread, while
  // this writer's thread is not writing a shard (wait_until_written).
  std::vector<float*> claim(const Save& save, const std::vector<CheckpointPiece>& pieces);

  // Where this rank's part of the save in flight stands. The ranks exchange
  // it (train/checkpoint_saver.h), so that a rank whose write failed stops
  // the save everywhere at once instead of leaving rank 0 to wait for a
  // shard that never comes.
  enum class State : int32_t {
    kIdle = 0,     // nothing started, or the last save was taken
    kWriting = 1,  // this rank's shard is being written
    kWaiting = 2,  // rank 0: its shard is written; waiting for the others', then committing
    kDone = 3,     // this rank's part is finished (rank 0: committed and pruned)
    kFailed = 4,   // this rank's part failed; error_message() says why
  };
  State state() const { return state_.load(std::memory_order_acquire); }
  // Blocks while this rank's shard is still being written (rank 0 may then
  // still be waiting for the others' shards): what a rank knows for sure
  // before it reports on the save.
  void wait_until_written();
  // The failed part's error, once state() is kFailed.
  std::string error_message() const;
  // Gives up the save in flight: rank 0 stops waiting for the other shards
  // (a shard write already under way finishes or fails first), and the
  // thread is joined. The error, if any, is dropped; the step's .partial
  // directory is the caller's to remove (abandon_checkpoint).
  void abort();

  // What the last save cost this rank.
  struct Stats {
    int64_t step = 0;
    int64_t bytes = 0;       // of this rank's shard
    double blocking_ms = 0;  // the copy the caller waited for
    double write_ms = 0;     // the background write (and, on rank 0, the commit)
    // The background thread's CPU time: what the save takes from training
    // where the ranks' compute fills every core (write_ms there is mostly
    // waiting for a core).
    double write_cpu_ms = 0;
    // The data was written in place by the caller (a claimed spare:
    // Save::writing.prewritten); the thread wrote only the shard's index.
    bool prewritten = false;
  };
  // The stats of a save that has finished since the last call, without
  // waiting for one that has not; rethrows a finished save's error.
  std::optional<Stats> take_finished();

 private:
  void run(const Save& save);
  void set_state(State state);

  int64_t commit_timeout_ms_;
  // The pieces' data, back to back, block-aligned so the shard's data
  // section goes to disk without passing through the page cache.
  struct FreeAligned {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], FreeAligned> staging_;
  int64_t staging_floats_ = 0;
  std::vector<CheckpointPiece> pieces_;  // pointing into staging_, or the caller's (unstaged)
  // A recycled shard's mapping, kept for the next save (used by the thread).
  SpareMappings spare_mappings_;
  std::thread thread_;
  std::exception_ptr error_;
  std::atomic<State> state_{State::kIdle};
  std::atomic<bool> abort_{false};
  mutable std::mutex mutex_;  // with state_changed_: wait_until_written
  std::condition_variable state_changed_;
  Stats stats_;
  bool stats_taken_ = true;
};

}  // namespace brigade
