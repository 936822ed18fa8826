// Asynchronous, two-phase checkpoint saves: the training loop waits only for
// a copy of this rank's pieces into memory; a background thread writes the
// shard, and on rank 0 commits the step (checkpoint.h's phases 2 and 3) once
// every rank's shard is on disk. A new save first waits for the previous
// one, so at most one is in flight and each rank's staging copy is reused.
//
// Phase 1 of the protocol (rank 0's begin_checkpoint, then a barrier) stays
// with the caller, which owns the communicator: the background threads never
// touch it (a collective from a second thread would race the training
// loop's). Rank 0's thread learns that the other ranks are done from their
// shard index files in the step's directory instead, so the ranks must share
// the file system the checkpoints go to.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "brigade/ckpt/checkpoint.h"

namespace brigade {

class AsyncCheckpointWriter {
 public:
  // commit_timeout_ms bounds how long rank 0 waits for the other ranks' shards.
  explicit AsyncCheckpointWriter(int64_t commit_timeout_ms);
  // Waits for the save in flight (its error, if any, is reported on stderr).
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  struct Save {
    std::filesystem::path root;
    int64_t step = 0;
    int rank = 0;
    int num_shards = 1;
    GptConfig config;
    CheckpointHeader header;  // used by rank 0
    int64_t keep = 0;         // rank 0 prunes to this many after committing (0: keep all)
  };
  // Waits for the previous save (rethrowing its error), copies the pieces'
  // data, and returns once the background write has started.
  void start(Save save, const std::vector<CheckpointPiece>& pieces);
  // Waits for the save in flight, if any; rethrows its error.
  void wait();

  // What the last save cost this rank.
  struct Stats {
    int64_t step = 0;
    int64_t bytes = 0;       // of this rank's shard
    double blocking_ms = 0;  // the copy the caller waited for
    double write_ms = 0;     // the background write (and, on rank 0, the commit)
  };
  // The stats of a save that has finished since the last call, without
  // waiting for one that has not; rethrows a finished save's error.
  std::optional<Stats> take_finished();

 private:
  void run(const Save& save);

  int64_t commit_timeout_ms_;
  // The pieces' data, back to back, block-aligned so the shard's data
  // section goes to disk without passing through the page cache.
  struct FreeAligned {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], FreeAligned> staging_;
  int64_t staging_floats_ = 0;
  std::vector<CheckpointPiece> pieces_;  // pointing into staging_
  std::thread thread_;
  std::exception_ptr error_;
  std::atomic<bool> finished_{false};
  Stats stats_;
  bool stats_taken_ = true;
};

}  // namespace brigade
