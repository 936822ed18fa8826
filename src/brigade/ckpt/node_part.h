// One node's part of a distributed snapshot, and a checkpoint assembled
// from every node's parts (issue 14, scope 4: in-memory snapshots across
// nodes).
//
// An in-memory snapshot lives in each node's own memory (elastic/
// snapshots.h), so the commit protocol of checkpoint.h, rank 0 waiting for
// every shard in one directory, cannot work across nodes. Instead each node
// commits its own part: its ranks' shards (a contiguous range of world
// ranks, the node's) written into <root>/step_N.partial as for a checkpoint,
// then the node's lowest rank writes part.json and renames the directory:
//
//   <root>/step_00000042.part/shard_00002.safetensors   the node's shards
//   <root>/step_00000042.part/shard_00002.json          their index files
//   <root>/step_00000042.part/part.json                 what the part holds
//
// A .part directory is no checkpoint (latest_checkpoint never picks it): it
// holds a slice of every bucket, not the whole state. part.json names the
// step, the node, its rank range, the job's shard count and model, and, in
// the part holding rank 0, the header (mesh, trainer state, tokenizer) the
// manifest needs. A restart gathers every node's part of one step (its own,
// the others' fetched from their agents or a lost node's from the replica
// its peer keeps, elastic/snapshot_replica.h) and assemble_checkpoint turns
// them into an ordinary step directory that loads under any layout.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "brigade/ckpt/checkpoint.h"

namespace brigade {

inline constexpr char kNodePartFile[] = "part.json";

struct NodePart {
  int64_t step = 0;
  int node = 0;        // the node's rank in the generation that wrote it
  int first_rank = 0;  // its shards: world ranks [first_rank, first_rank + ranks)
  int ranks = 1;
  int num_shards = 1;  // every node's together
  GptConfig config;
  std::optional<CheckpointHeader> header;  // in the part holding rank 0 only
};

// <root>/step_N.part
std::filesystem::path node_part_directory(const std::filesystem::path& root, int64_t step);

// <root>/sending: the step of the part the node's agent is sending to its
// peer (one at a time, elastic/snapshot_replica.h). A slow send may take
// longer than a few steps: the part it sends is kept (and its shards not
// recycled) until the send is over, whatever the committer's `keep`.
inline constexpr char kNodePartPinFile[] = "sending";
void pin_node_part(const std::filesystem::path& root, int64_t step);
// Unpins `step` (another step's pin stays); never throws.
void unpin_node_part(const std::filesystem::path& root, int64_t step);
// The pinned step; null when none (or the file is unreadable).
std::optional<int64_t> pinned_node_part(const std::filesystem::path& root);

// The node's committer, once its ranks' shards of part.step are written
// into <root>/step_N.partial: checks each one's index file is there (Error
// naming the first missing rank otherwise), writes part.json (atomically)
// and renames the directory to step_N.part, replacing an older copy of the
// same step. Then keeps the newest `keep` parts (0: all) and the pinned
// one; with `recycle` the pruned parts' shard files go to <root>/spare/
// (ShardWriting). Returns the part's directory.
std::filesystem::path commit_node_part(const std::filesystem::path& root, const NodePart& part,
                                       int64_t keep, bool recycle);

// Reads and checks a part directory's part.json: Error naming the file and
// the field when it is malformed, names a step other than the directory's,
// a rank range outside the job's shards, or lacks a listed shard's files.
NodePart read_node_part(const std::filesystem::path& part_dir);

// The steps of the complete parts under root, oldest first.
std::vector<int64_t> node_part_steps(const std::filesystem::path& root);

// Links (copies, across file systems) every part's shards into
// <root>/step_N.partial and commits them as one checkpoint
// (commit_checkpoint, with the header of the part holding rank 0); returns
// the step directory. The checkpoint shares the parts' files: the parts
// must then be removed, never pruned with recycling (whose spares are
// overwritten in place). Error, leaving nothing under root,
// when the parts are of different steps, shard counts or models, overlap,
// leave a rank uncovered (naming it), or no part carries the header.
std::filesystem::path assemble_checkpoint(const std::vector<std::filesystem::path>& parts,
                                          const std::filesystem::path& root);

}  // namespace brigade
