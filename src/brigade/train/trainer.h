// The trainer: one model replica, its optimizer and its share of the data.
// It owns the flat buffers (parameters, gradients, AdamW moments) and runs
// optimizer steps; reporting, progress and files for the user are the CLI's
// job.
//
// With a data-parallel group (options.parallel.dp ranks), each rank runs
// samples [rank * B * accum, (rank + 1) * B * accum) of every step's global
// batch; gradient buckets are reduced during the last micro-batch's backward
// (parallel/grad_sync.h). ZeRO 1 shards the AdamW moments (each rank updates
// its slices, then the parameters are all-gathered); ZeRO 2 also keeps only
// the rank's slices of the reduced gradients; ZeRO 3 keeps only its slices
// of the parameters too, gathering each block's just before the model reads
// it (parallel/sharded_params.h). The replicas stay equal to a single
// process's on the same global batch, up to float summation order.
//
// With tensor parallelism (options.parallel.tp ranks, Megatron's split,
// model/gpt.h) the trainer holds this tp rank's shards only
// (ParamLayout(model, tp_rank, tp)); its data-parallel group is the ranks
// with the same tp rank, and buckets, ZeRO slices and AdamW work on the
// local buffer unchanged. The global gradient norm counts each parameter
// once: the squares of split tensors are summed over the tp group,
// replicated ones (equal on every tp rank) taken from tp rank 0.
// Checkpoints stay global: each rank writes its boxes of the global tensors.
//
// With pipeline parallelism (options.parallel.pp stages, parallel/
// pipeline_stage.h) the trainer holds its stage's blocks only (the
// embeddings on the first stage, ln_f and the head on the last, the tied
// wte on both; under the interleaved schedule v chunks of them,
// model/gpt_chunks.h) and runs the stage's schedule; losses, the gradient norm and
// evaluation combine over the pipeline group. The data-parallel group is
// then the ranks with the same stage and tp rank.
//
// With data or tensor parallelism every rank must call evaluate() and
// save_checkpoint() at the same points: under ZeRO 3 evaluation gathers
// parameters, tensor parallelism's forward is collective, and a save
// synchronises the ranks' shard writes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "brigade/ckpt/async_writer.h"
#include "brigade/core/aligned_buffer.h"
#include "brigade/model/gpt.h"
#include "brigade/model/gpt_chunks.h"
#include "brigade/optim/adamw.h"
#include "brigade/parallel/grad_buckets.h"
#include "brigade/parallel/grad_sync.h"
#include "brigade/parallel/pipeline_stage.h"
#include "brigade/parallel/replica_check.h"
#include "brigade/parallel/sharded_params.h"
#include "brigade/parallel/tensor_parallel_group.h"
#include "brigade/train/checkpoint_saver.h"
#include "brigade/train/rank_stats.h"
#include "brigade/train/step_breakdown.h"
#include "brigade/train/train_options.h"

namespace brigade {

class Communicator;
class Dataset;
class GlobalSampler;

struct StepMetrics {
  int64_t step = 0;   // 0-based index of the step just taken
  double loss = 0.0;  // mean training loss over the global batch
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double step_ms = 0.0;
  double tokens_per_s = 0.0;  // global batch tokens per second
  double compute_ms = 0.0;    // forward, backward and optimizer
  // Time spent waiting on communication after compute was done: the part
  // that overlap did not hide (tp_comm_ms included).
  double exposed_comm_ms = 0.0;
  // Of that, the tensor-parallel all-reduces inside forward and backward
  // (none of which overlaps compute).
  double tp_comm_ms = 0.0;
  // With data parallelism: when the last micro-batch's backward ended, in
  // the clock of bucket_timings() (GradSync::backward_end_ms).
  double backward_end_ms = 0.0;
  // With pipeline parallelism: the time this stage waited for a peer's
  // activation or gradient, for its sends to leave, and at the step's end
  // for the peers' drain (PipelineStage::sum_losses_at_drain): its bubble,
  // not part of the exposed communication.
  double bubble_ms = 0.0;
  // The most micro-batches whose activations this rank kept at once.
  int64_t live_microbatches = 0;
  // The optimizer's update (part of compute_ms).
  double optimizer_ms = 0.0;
};

// Bytes one rank holds for training state, by kind.
struct MemoryAccount {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t activations = 0;  // estimate, for the micro-batches the schedule keeps alive at once
};

// The process groups of one rank of a dp x tp mesh (parallel/mesh.h), each
// outliving the trainer. dp: the ranks with this tp rank (required when
// parallel.dp > 1); tp: the ranks with this dp rank (required when
// parallel.tp > 1); world: every rank, for checkpoint saves (may be dp
// when tp is 1).
struct TrainerGroups {
  Communicator* world = nullptr;
  Communicator* dp = nullptr;
  Communicator* tp = nullptr;
  // The ranks with this dp and tp rank, one per stage in stage order
  // (required when parallel.pp > 1).
  Communicator* pp = nullptr;
};

class Trainer {
 public:
  // Opens (or prepares) the data, initialises the model, and if
  // options.resume is set, loads that checkpoint. dp_group: the
  // data-parallel communicator, required when options.parallel.dp > 1
  // (its size must equal dp), and outliving the trainer.
  Trainer(const GptConfig& model, const TrainOptions& options, Communicator* dp_group = nullptr);
  // A rank of a dp x tp mesh; Error naming the group if one is missing or
  // of the wrong size.
  Trainer(const GptConfig& model, const TrainOptions& options, const TrainerGroups& groups);
  ~Trainer();

  // One optimizer step over the global batch of step `step()`. A loss or
  // gradient norm that is NaN or infinite runs the step's forward and
  // backward once more on the same batch: a passing fault (a flipped bit,
  // a faulty unit) gives finite numbers the second time, and the step goes
  // on as if nothing happened; bad data or divergence repeats, and the step
  // throws Error naming the samples of the batch (their data windows) and
  // the fix.
  StepMetrics train_step();
  // Collective over the data-parallel group (dp > 1, ZeRO 0-2): compares
  // the hash of what every replica must hold bit for bit
  // (parallel/replica_check.h): the whole parameter buffer, the same on
  // every rank between updates (after ZeRO 1/2's gather), and under ZeRO 0
  // both Adam moments too (ZeRO 1/2 shard them: each slice exists once).
  // ZeRO 3 holds no replica at all, so there is nothing to compare.
  //
  // Not a second pass over the buffers where one already saw this very
  // state (`fused` says so): under ZeRO 0 the update that computed it
  // hashed it from L1 as it went (cpu::state_hash, when on_before_update's
  // `due` asked for the check), under ZeRO 1/2 an in-memory snapshot's copy
  // of it (take_snapshot_hash). Either counts only while state_version_
  // says nothing wrote the state since; a bit flipped in between without
  // a write of ours is then in neither the hash nor that state's snapshot,
  // and the next check sees it (take_snapshot_hash says why that is safe).
  ReplicaComparison compare_replicas();
  // Whether diag.sdc_every's checks run (train/silent_corruption.h): dp > 1
  // and sdc_every > 0 (replicas compared under ZeRO 0-2; under ZeRO 3,
  // which holds no replica, each rank's own slices against themselves).
  bool replica_checks_on() const;
  // ZeRO 3: a hash of what exists on this rank only between steps: its
  // slices of the parameters and of both Adam moments.
  uint64_t owned_state_hash() const;
  // Collective over the data-parallel group, called between a check step's
  // backward and its reduce (on_local_gradients). Before that backward,
  // forward_backward recomputed dp rank (r + 1) % dp's micro-batches of the
  // step from the same parameters into the gradient buffer and kept their
  // hash (replay_peer_gradient); this compares each rank's own gradient's
  // hash with its replayer's. A disagreement is settled by a third
  // computation (GradientReplay), which overwrites the local gradient: the
  // caller then either stops the step (throws) or calls
  // restore_local_gradient() before the reduce.
  GradientReplay replay_gradients() { return replay_gradients(replayed_peer_); }
  // Recomputes this rank's own local gradient after replay_gradients
  // overwrote it (collective under ZeRO 3, like every forward); no-op when
  // it did not.
  void restore_local_gradient();
  // Whether the replay can run: data parallelism without tensor or
  // pipeline parallelism (their forward is collective over other groups).
  bool gradient_replay_supported() const {
    return dp_size() > 1 && tp_size() == 1 && pp_size() == 1;
  }
  // The snapshots kept: 1, or 2 while diag.sdc_every's checks run (ZeRO 3's
  // own-slice check included, so ZeRO 3 with checks needs room for three
  // copies in the snapshot area, not two), since a failed check discards
  // the newest (discard_saves) and the rollback needs the one before.
  int64_t snapshots_kept() const { return replica_checks_on() ? 2 : 1; }
  // After a failed replica check of the state after `step` steps, on every
  // rank: gives up the saves in flight, and (world rank 0) removes that
  // step's snapshot and checkpoint if they committed already (an unstaged
  // snapshot's commit does not wait for the check), so no rollback resumes
  // from a state the check did not pass. Not collective.
  void discard_saves(int64_t step);
  // Runs `check` in every train_step right before the update, once an
  // unstaged snapshot has been read (train/silent_corruption.h). Empty: none.
  // `due(done)`: whether a check of the state after `done` steps is coming
  // (compare_replicas, in `check` or before a save), so that the update
  // writing that state hashes it on its way (ZeRO 0).
  void on_before_update(std::function<void()> check, std::function<bool(int64_t)> due = {}) {
    before_update_ = std::move(check);
    check_due_ = std::move(due);
  }
  // Runs `record` right after every update (ZeRO 1/2: after the gather).
  void on_after_update(std::function<void()> record) { after_update_ = std::move(record); }
  // In every forward_backward where due() says so: the peer's micro-batches
  // are replayed first (replay_peer_gradient), the own gradients are not
  // reduced during the backward but after it, and `check` runs in between
  // (replay_gradients; it throws or leaves the own gradient in place).
  // Empty: none.
  void on_local_gradients(std::function<bool()> due, std::function<void()> check) {
    local_gradients_due_ = std::move(due);
    local_gradients_check_ = std::move(check);
  }
  // Fault injection (elastic/fault_injection.h): flips a bit of one
  // parameter this rank owns, or of its first Adam moment (returns its name
  // and offset), now or at the
  // start of step `step`'s forward (0-based), and makes the next `times`
  // losses of step `step` on this rank NaN.
  std::string flip_parameter_bit(bool in_moment = false);
  void flip_bit_before_forward(int64_t step) { flip_step_ = step; }
  // ... or of this rank's local gradient of step `step` (0-based) before
  // the reduce (that step's backward then reduces after it ends).
  void flip_gradient_before_reduce(int64_t step) { flip_grad_step_ = step; }
  void poison_loss(int64_t step, int times);
  // Mean validation loss over options.eval_windows windows (all if 0).
  double evaluate();

  // Saves to <run_dir>/checkpoints/step_<N> and prunes old ones. Every
  // data-parallel rank must call these at the same points: each writes its
  // own shard (its slices of the parameters and moments), rank 0 commits
  // the manifest, and the ranks agree on the outcome (train/checkpoint_saver.h).
  // start_checkpoint returns once this rank's state is copied to memory and
  // writes in the background (it first waits for the previous save);
  // poll_checkpoint(states), once per step with every rank's save_states()
  // (below), returns what a save that has completed on every rank cost
  // this rank, and throws if a rank's part failed (the step is then dropped
  // and the previous checkpoint stays the newest);
  // wait_for_checkpoint blocks until the save is committed or throws;
  // save_checkpoint is start and wait. They return the step directory on
  // rank 0, an empty path on the others.
  std::filesystem::path start_checkpoint();
  void wait_for_checkpoint();
  std::filesystem::path save_checkpoint();
  // Not collective: gives up a save in flight when the group is broken (a
  // peer died) and cannot agree on it any more.
  void abandon_checkpoint();
  // In-memory snapshots (elastic/snapshots.h): the same save into
  // options.snapshot_dir, keeping the newest (two under replica checks:
  // snapshots_kept); collective like the
  // above, and on their own saver, so a snapshot never waits for a disk
  // checkpoint. Enabled when snapshot_dir is set, snapshot_every > 0 and the
  // tmpfs has room for two (the newest stays until the next commits). A
  // snapshot that fails (the tmpfs filled up) fails on every rank at the
  // same call: snapshots stop, with one line, and training goes on. A
  // snapshot costs this rank one copy of its state into memory the last
  // snapshot but one used, made while the next step's forward and backward
  // run: the step's update waits for it.
  bool snapshots_enabled() const { return snapshot_saver_ != nullptr; }
  void start_snapshot();
  // With a collective of its own (tests; the loop uses the one below).
  std::optional<AsyncCheckpointWriter::Stats> poll_snapshot();
  // The polls without a collective of their own: from every rank's
  // save_states(), which the training loop gathers with its per-step rank
  // stats (train/rank_stats.h), by world rank (the savers' group is the
  // world, in every layout).
  SaveStates save_states() const;
  std::optional<AsyncCheckpointWriter::Stats> poll_checkpoint(const std::vector<int32_t>& states);
  std::optional<AsyncCheckpointWriter::Stats> poll_snapshot(const std::vector<int32_t>& states);
  // Loads a checkpoint or the newest one in a run directory.
  void load_checkpoint(const std::filesystem::path& path);
  void load_checkpoint(const ResolvedCheckpoint& checkpoint);

  // The clock train_step charges its sections to (train/step_breakdown.h);
  // the training loop charges what it does around the steps to it too and
  // closes each step's window.
  StepClock& step_clock() { return clock_; }

  int64_t step() const { return step_; }  // steps completed
  const GptConfig& model_config() const { return model_->config(); }
  const TrainOptions& options() const { return options_; }
  const FloatBuffer& params() const { return params_; }
  const AdamW& optimizer() const { return *optimizer_; }
  // Under ZeRO 2 and 3 only this rank's slices hold values between steps,
  // and the rest of the buffer is released (see resident_bytes()).
  const FloatBuffer& grads() const { return grads_; }
  // ZeRO 3's parameter residency (its peak of gathered bytes); null otherwise.
  const ShardedParams* sharded_params() const { return sharded_params_.get(); }
  int dp_rank() const;
  int dp_size() const { return options_.parallel.dp; }
  int tp_rank() const;
  int tp_size() const { return options_.parallel.tp; }
  int pp_stage() const { return stage_->stage(); }
  int pp_size() const { return options_.parallel.pp; }
  int world_rank() const;
  Communicator* dp_group() const { return dp_group_; }  // null without data parallelism
  // What this rank holds, for the start-up report and the ZeRO tests.
  MemoryAccount memory() const;
  // The last step's bucket reductions (empty without data parallelism).
  std::vector<BucketTiming> bucket_timings() const;
  GptChunks& model() { return *model_; }
  const Dataset* dataset() const { return dataset_.get(); }  // null when synthetic
  int64_t tokens_per_step() const { return options_.global_batch() * model_config().block_size; }

  // This rank's tensors (its tp shards of its pipeline stage's blocks).
  const ParamLayout& layout() const { return model_->layout(); }
  // State for checkpoints beyond the buffers: step, seed, schedule.
  nlohmann::json state_json() const;

 private:
  // Fills inputs_/targets_ with samples [first, first+num) of this step's
  // global batch.
  void fill_batch(int64_t first_sample, int64_t num_samples);
  // The flat buffers: in the communicator's shared region when they fit
  // (zero-copy collectives), else on the heap.
  void allocate_buffers(int64_t size);
  // After a resume at step_: the run directory's later checkpoints belong
  // to the history it branches from; they move aside (checkpoint.h).
  void set_aside_abandoned_branch();
  // Sum over the data-parallel group (a no-op alone).
  double sum_over_ranks(double value);
  double global_grad_norm();
  // Forward and backward of this step's batch, the gradients reduced; the
  // metrics' loss and gradient norm filled in, nothing updated.
  StepMetrics forward_backward();
  // The error for a loss or norm that stayed non-finite on the re-run.
  [[noreturn]] void throw_non_finite(const StepMetrics& m, double local_loss);

  TrainOptions options_;
  Communicator* dp_group_ = nullptr;
  Communicator* tp_group_ = nullptr;
  Communicator* world_ = nullptr;
  Communicator* pp_group_ = nullptr;
  std::unique_ptr<TensorParallelGroup> tp_;  // tp > 1
  // Runs each step's micro-batches: the stage's schedule (with one stage,
  // forward and backward of each micro-batch in turn).
  std::unique_ptr<PipelineStage> stage_;
  // The tied wte's copy on the first and last of several stages: its
  // gradient is summed across them before the data-parallel reduction may
  // take it, so buckets below this offset wait for the step's end. 0: none.
  int64_t tied_end_ = 0;
  // The local ranges whose gradient squares this rank adds to the global
  // norm: every tensor on tp rank 0, the split ones elsewhere.
  std::vector<Slice> norm_ranges_;
  std::unique_ptr<BucketPlan> plan_;
  FloatBuffer params_, grads_;
  int zero_ = 0;  // the ZeRO stage in effect (0 without data parallelism)
  bool buffers_in_shared_memory_ = false;
  std::unique_ptr<GptChunks> model_;  // this stage's chunks (one but under interleaving)
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradSync> grad_sync_;
  std::unique_ptr<ShardedParams> sharded_params_;  // ZeRO 3
  std::unique_ptr<CheckpointSaver> saver_;
  std::unique_ptr<CheckpointSaver> snapshot_saver_;
  void start_snapshots_if_room();
  void stop_snapshots(const std::string& why);
  // Starts this rank's part of a save of the current step under root; a
  // snapshot's is unstaged and recycled (see save_of).
  void start_save(CheckpointSaver& saver, const std::filesystem::path& root, int64_t keep,
                  bool snapshot);
  // What a save of `step` records: this rank's owned slices of the
  // parameters and moments (three pieces a slice), and the save's settings.
  std::vector<CheckpointPiece> state_pieces();
  AsyncCheckpointWriter::Save save_of(const std::filesystem::path& root, int64_t keep,
                                      bool snapshot, int64_t step) const;
  // Right before an update whose state the training loop snapshots next:
  // claims this rank's spare shard file, and says where the update writes
  // each owned element's new value (AdamW::step), so the snapshot costs a
  // streaming store of each element the update computes and no pass of
  // its own over 3 x 4 bytes a parameter. Empty (the snapshot copies as
  // before) when there is no spare yet, or under tensor parallelism's
  // repacked shards (claim_checkpoint_shard).
  std::vector<StateCopy> claim_snapshot();
  // The step and state (state_version_) the claimed shard holds once the
  // update wrote it; start_save takes it as written only if both still hold.
  struct SnapshotClaim {
    int64_t step = -1;
    uint64_t state_version = 0;
  };
  SnapshotClaim snapshot_claim_;
  // Removes a claimed shard whose save never started (a stop the ranks
  // agreed on after the update, snapshots stopped by a failure, the end).
  void drop_snapshot_claim();
  std::unique_ptr<Dataset> dataset_;
  std::unique_ptr<GlobalSampler> sampler_;
  std::vector<int32_t> inputs_, targets_;  // one micro-batch, (B,T) each
  int64_t step_ = 0;
  StepClock clock_;
  std::function<void()> before_update_;
  std::function<bool(int64_t)> check_due_;
  std::function<void()> after_update_;
  std::function<bool()> local_gradients_due_;
  std::function<void()> local_gradients_check_;
  int64_t flip_grad_step_ = -1;
  // Forward and backward of dp rank `rank`'s micro-batches of this step into
  // grads_, zeroed first, without reducing; returns their hash.
  uint64_t local_gradient_hash_of(int rank);
  uint64_t replay_peer_gradient();
  GradientReplay replay_gradients(uint64_t replayed);
  uint64_t replayed_peer_ = 0;  // this check step's replay_peer_gradient()
  // replay_gradients' third computation overwrote this rank's own gradient.
  bool local_gradient_spoiled_ = false;
  // Flips the top mantissa bit of the first non-zero local gradient element.
  std::string flip_gradient_bit();
  double local_loss_ = 0;  // this dp rank's loss sum of the last forward_backward
  int64_t flip_step_ = -1;
  // What the replica check's hash of a snapshot's state needs (start_save,
  // take_snapshot_hash): the hash fed by the snapshot's copy and finished
  // on the writer's thread, of which state.
  struct SnapshotHash {
    ChunkedHash hash;
    int64_t step = 0;
    uint64_t state_version = 0;
  };
  std::shared_ptr<SnapshotHash> snapshot_hash_;
  // Counts the writes of the parameters and moments: each update (and ZeRO
  // 1/2's gather after it), each load, each injected flip. Equal counts
  // mean the same state.
  uint64_t state_version_ = 0;
  // Between the snapshot's wait and the update only: the snapshot's hash
  // of this very state, for compare_replicas (ZeRO 1/2).
  std::optional<uint64_t> fused_hash_;
  // The snapshot's hash once its copy is complete, if it is of the state
  // the check is about to compare; consumed.
  std::optional<uint64_t> take_snapshot_hash();
  // Makes a snapshot's save (start_save) hash the parameters as it copies,
  // under the replica checks of ZeRO 1/2.
  void hash_while_snapshotting(AsyncCheckpointWriter::Save& save);
  // ZeRO 0: the last update's AdamW::state_hash of what it wrote, and
  // state_version_ right after it.
  struct UpdateHash {
    uint64_t state_version = 0;
    uint64_t hash = 0;
  };
  std::optional<UpdateHash> update_hash_;
  int64_t poisoned_step_ = -1;
  int poisoned_losses_ = 0;
};

// The shared-memory bytes per rank that let a Trainer for `model` place its
// flat gradient and parameter buffers in the shm backend's shared region
// (pass to connect_world).
int64_t shared_bytes_for_training(const GptConfig& model);

// Which ranges of the flat buffer get weight decay: matmul weights and the
// token embedding (it is also the LM head's matrix); not biases, not
// LayerNorm, and the position table only if asked.
std::vector<DecayRange> decay_ranges(const ParamLayout& layout, bool decay_position_embedding);

}  // namespace brigade
