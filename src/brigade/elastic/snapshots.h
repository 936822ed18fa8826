// In-memory snapshots: a worker's newest state kept in its node's memory,
// so a restart in place resumes from the step before the failure instead
// of from the newest disk checkpoint, which may be hours old.
//
// A snapshot is a checkpoint in the usual format (ckpt/checkpoint.h: shards,
// manifest, checksums, the same commit protocol), written by the workers
// every train.snapshot_every steps into a directory on tmpfs (/dev/shm)
// that the agent owns: it outlives any worker, and the agent removes it when
// the job ends. The write runs in the background, overlapped with the next
// step; only the newest complete snapshot is kept. Reusing the checkpoint
// format means a snapshot loads under any layout and verifies like one.
//
// Across nodes each node's area is its own memory, so each node commits its
// own part of a snapshot (ckpt/node_part.h), its agent replicates the part
// to a peer node's agent, and a restart gathers every node's part of one
// step and assembles it into a checkpoint in each area
// (elastic/snapshot_sync.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

namespace brigade::elastic {

// Where the agent tells its workers to write snapshots.
inline constexpr char kSnapshotDirVariable[] = "BRIGADE_SNAPSHOT_DIR";
// Set ("1") by a multi-node job's agent: each node's workers commit their
// node's part of a snapshot (ckpt/node_part.h): its workers' world ranks.
inline constexpr char kSnapshotPartsVariable[] = "BRIGADE_SNAPSHOT_PARTS";

// A private (0700) directory under `parent`, removed with everything in it
// when this goes away, and locked (flock) while it exists: creating one
// also removes this user's areas whose agent died without removing them.
// Moves, never copies.
class SnapshotArea {
 public:
  // Null, with the reason on stderr, when `parent` is missing or not
  // writable: the job then runs with disk checkpoints only.
  static std::optional<SnapshotArea> create(const std::filesystem::path& parent = "/dev/shm");
  ~SnapshotArea();
  SnapshotArea(SnapshotArea&& other) noexcept;
  SnapshotArea& operator=(SnapshotArea&&) = delete;
  SnapshotArea(const SnapshotArea&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  explicit SnapshotArea(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
  int lock_fd_ = -1;
};

// What a restarted worker resumes from: the newer of the run directory's
// newest checkpoint and the newest snapshot (a checkpoint on a tie: it is
// durable). Null when neither exists. `snapshots` may be empty.
struct ResumePoint {
  std::filesystem::path dir;
  int64_t step = 0;
  bool from_snapshot = false;
};
std::optional<ResumePoint> newest_resume_point(const std::filesystem::path& run_dir,
                                               const std::filesystem::path& snapshots);

}  // namespace brigade::elastic
