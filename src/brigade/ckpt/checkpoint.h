// Training checkpoints: one directory per step, written by every rank in
// parallel, loadable under any other layout.
//
//   <root>/step_00000100/shard_00000.safetensors  rank 0's pieces of the global tensors
//   <root>/step_00000100/shard_00001.safetensors  ...
//   <root>/step_00000100/manifest.json            what is where, checksums (manifest.h)
//
// Saving is three phases, after a one-time clearing:
//   0. once, before a process's first save under root, the committer
//      (rank 0): clear_checkpoint_leftovers removes what saves, commits and
//      prunes that died half-way left (*.partial, *.old, *.pruned); the
//      caller then keeps the ranks apart from it (a barrier), since the
//      checkpoint layer knows no communicator
//   1. every rank: create_checkpoint_directory  step_N.partial (idempotent)
//   2. every rank: write_checkpoint_shard  its pieces, into step_N.partial
//   3. rank 0:     commit_checkpoint  writes the manifest (atomically, last)
//                                     and renames step_N.partial to step_N
// So a step directory exists only complete, and a crash at any moment leaves
// the previous checkpoints as they were. save_checkpoint is the phases for
// one process.
//
// Why the clearing is not part of every save (it was, with a barrier after
// it, one collective per save): clearing removes every .partial under the
// root, and a rank may already be writing into one (this step's, or a
// slower rank's part of the previous save). Within one process no leftover
// can appear that a save would trip on: a save that fails is removed by its
// committer after every rank's writer stopped (train/checkpoint_saver.h),
// a commit's .old and a prune's .pruned are the committer's own and carry
// no shard a later save reads, and no two saves of a process write the same
// step_N.partial while one is live. (A save given up on a way out, with
// no barrier, may leave a slower rank's part: the process ends, and the
// next one clears it.) What another process left (a crashed
// generation's half-written step, whose shards a replayed save of the same
// step would otherwise mix with its own) is there before this process's
// first save, which clears it.
//
// A piece is a flat range of one of the three flat buffers (parameters and
// AdamW's two moments, laid out by ParamLayout); the writer cuts it into
// boxes of the tensors it crosses, so a ZeRO rank's slices and whole
// tensors are stored alike, and loading assembles any tensor from whichever
// ranks wrote its parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "brigade/ckpt/manifest.h"
#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"

namespace brigade {

class SpareMappings;  // ckpt/safetensors.h

enum class StateKind { kParams, kExpAvg, kExpAvgSq };

// The global tensor name of a parameter's state: "model/h.0.ln_1.weight",
// "optim/exp_avg/h.0.ln_1.weight", "optim/exp_avg_sq/...".
std::string state_tensor_name(StateKind kind, const std::string& param_name);

struct CheckpointPiece {
  StateKind kind = StateKind::kParams;
  int64_t begin = 0;  // flat range [begin, end) of the ParamLayout buffer
  int64_t end = 0;
  const float* data = nullptr;  // element `begin`; end - begin floats
};

struct CheckpointHeader {
  nlohmann::json mesh;           // {"dp": .., "tp": .., "pp": .., "zero": ..}
  nlohmann::json trainer_state;  // step, optimizer step, sampler and schedule
  std::string tokenizer_spec;    // so `brigade sample` can decode
};

std::filesystem::path step_directory(const std::filesystem::path& root, int64_t step);
// The step a step directory holds (step_00000042 -> 42): step_directory's inverse.
int64_t checkpoint_step(const std::filesystem::path& step_dir);

// Phase 0: removes every *.partial, *.old and *.pruned entry under root (no
// rank may be writing into root); Error naming what could not be removed.
void clear_checkpoint_leftovers(const std::filesystem::path& root);
// Phase 1, on every rank: creates <root>/step_N.partial if it is not there;
// Error naming the directory when it cannot (a full disk, permissions, a
// file in its place).
void create_checkpoint_directory(const std::filesystem::path& root, int64_t step);
// Phases 0 and 1, for one process.
void begin_checkpoint(const std::filesystem::path& root, int64_t step);

// How shards are written. An in-memory snapshot, saved as often as every
// step on tmpfs, recycles: pruning moves the shard files of the steps it
// removes to <root>/spare/, and the next save of the same layout
// overwrites its rank's spare in place (SafetensorsWriter::Reuse) instead of
// allocating, zeroing and freeing that much memory again. It skips the
// shard checksums too, which cost more than the copy itself: a snapshot is
// checked by sizes and the manifest's own checksum, and copy_checkpoint
// adds shard checksums when one is kept on disk.
//
// `read` is given every block of the pieces' data as the write reads it
// (SafetensorsWriter::Reuse::read): how the replica check's hash of a
// snapshot's state rides on the snapshot's copy (train/trainer.h).
//
// `mappings` (with recycle) keeps the spares' mappings from one save to the
// next (SpareMappings); its owner outlives the saves that use it.
//
// `prewritten`: the shard file is in the step's .partial directory with its
// data already written (claim_checkpoint_shard); only its index is written.
struct ShardWriting {
  bool recycle = false;
  bool checksum = true;
  std::function<void(const void* data, size_t bytes)> read;
  SpareMappings* mappings = nullptr;
  bool prewritten = false;
};

// Claims this rank's spare shard file (ShardWriting) for step `step` of
// these pieces, for the caller to write their data in place: how an
// in-memory snapshot is written by the update that computes the state
// instead of by a copy that reads it again. Makes the step's .partial
// directory (phase 1) and moves the spare into it (SafetensorsWriter::
// claim). Returns where each piece's data goes, in the pieces' order (the
// pieces' own data pointers are not read); empty when no spare of this
// layout is there, or when a piece's boxes must be repacked (tensor
// parallelism's cut c_attn columns), which only write_checkpoint_shard
// does. The save then goes through write_checkpoint_shard with
// `prewritten`, the same pieces and layout, once the data is written.
std::vector<float*> claim_checkpoint_shard(const std::filesystem::path& root, int64_t step,
                                           int rank, const ParamLayout& layout,
                                           const std::vector<CheckpointPiece>& pieces,
                                           SpareMappings& mappings);

// Returns the shard's size in bytes. The pieces are flat ranges of `layout`'s
// buffers: under tensor parallelism a tp rank's layout (ParamLayout(config,
// tp_rank, tp)), whose shards are written as their boxes of the global
// tensors; its replicated tensors are written by tp rank 0 only, so every
// element is stored once. `rank` numbers the shard (the world rank).
int64_t write_checkpoint_shard(const std::filesystem::path& root, int64_t step, int rank,
                               const ParamLayout& layout,
                               const std::vector<CheckpointPiece>& pieces,
                               const ShardWriting& how = {});
// The same for the whole model's layout, ParamLayout(config).
int64_t write_checkpoint_shard(const std::filesystem::path& root, int64_t step, int rank,
                               const GptConfig& config, const std::vector<CheckpointPiece>& pieces);
// Checks that the shards of ranks [0, num_shards) cover every tensor exactly
// once before anything is committed; returns the step directory.
std::filesystem::path commit_checkpoint(const std::filesystem::path& root, int64_t step,
                                        int num_shards, const GptConfig& config,
                                        const CheckpointHeader& header);

// The lowest rank in [0, num_shards) whose shard of the step is not written
// yet, or -1 when all are (what commit_checkpoint needs).
int missing_checkpoint_shards(const std::filesystem::path& root, int64_t step, int num_shards);

// One process's save: all three flat buffers (ParamLayout(config).size()).
std::filesystem::path save_checkpoint(const std::filesystem::path& root, int64_t step,
                                      const GptConfig& config, const float* params,
                                      const float* adam_m, const float* adam_v,
                                      const CheckpointHeader& header);

// Reads the manifest and checks every shard's size and xxHash64: Error
// naming the file (and the tensors it holds) if one is missing, truncated or
// changed. Shards without a checksum (an in-memory snapshot's) are an Error
// too unless `snapshot` says the caller resumes from the agent's own
// snapshot area: anywhere else such a directory is a copy nothing vouches
// for (a recycled shard may have been overwritten while it was copied).
Manifest verify_checkpoint(const std::filesystem::path& step_dir, bool snapshot = false);

// `path` is a step directory (holds manifest.json; Error if it does not
// verify), or a run or checkpoints directory: then its newest checkpoint that
// verifies. A newer one that does not is reported on stderr (which file,
// why) and skipped. Error if none. Returns it with its verified manifest, so
// callers read the shards' checksums once.
struct ResolvedCheckpoint {
  std::filesystem::path dir;
  Manifest manifest;
};
ResolvedCheckpoint resolve_checkpoint(const std::filesystem::path& path, bool snapshot = false);

// The newest complete (manifest present) step directory under root, unverified.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

// Fills the full flat buffer of `kind` (ParamLayout(config).size() floats)
// from a verified checkpoint, whichever layout saved it. Error if the
// checkpoint was made for another model shape (naming the config key).
void load_checkpoint_state(const std::filesystem::path& step_dir, const Manifest& manifest,
                           const GptConfig& config, StateKind kind, float* out);

// Deletes all but the newest `keep` complete step directories (keep <= 0:
// none). recycle: their shard files are kept in <root>/spare/ for the next
// save to overwrite (ShardWriting).
void prune_checkpoints(const std::filesystem::path& root, int64_t keep, bool recycle = false);

// Removes the shard files pruning kept for recycling under root, freeing
// their memory when no more saves will reuse them.
void release_spares(const std::filesystem::path& root);

// Copies a complete step directory to <dst_root>/step_N (through
// step_N.partial, renamed last), adding the shard checksums an in-memory
// snapshot leaves out: a checkpoint on disk always has them. Returns the copy.
std::filesystem::path copy_checkpoint(const std::filesystem::path& step_dir,
                                      const std::filesystem::path& dst_root);

// Where `rank` writes its shard of an unfinished save of `step`
// (<root>/step_N.partial/shard_R.safetensors): named in errors about it.
std::filesystem::path partial_shard_path(const std::filesystem::path& root, int64_t step, int rank);

// Removes the step's unfinished <root>/step_N.partial: a save that was given
// up leaves the previous checkpoints as they were.
void abandon_checkpoint(const std::filesystem::path& root, int64_t step);

// A run resumed from step k starts a new branch of history; the complete
// steps after k under root belong to the old one. They are moved (never
// deleted) to <root>/abandoned/after_step_<k>[.n]/, where neither a resume
// nor pruning looks, so the directory never mixes the two branches (pruning
// keeps the highest steps, and a later resume from the run directory would
// otherwise pick the abandoned branch). Returns where they went, empty if
// there were none.
std::vector<std::filesystem::path> set_aside_checkpoints_after(const std::filesystem::path& root,
                                                               int64_t step);

}  // namespace brigade
