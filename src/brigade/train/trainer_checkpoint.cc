// The Trainer's checkpoints and snapshots (train/trainer.h): the state a
// save records, background saves and their polls, the snapshot ring's
// room check, and loading a checkpoint back. Apart from trainer.cc, which
// holds the step itself, to keep each file readable.
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "brigade/ckpt/async_writer.h"
#include "brigade/ckpt/checkpoint.h"
#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"
#include "brigade/data/dataset.h"
#include "brigade/train/trainer.h"

namespace brigade {
namespace fs = std::filesystem;
namespace {

// The bytes of the regular files under the snapshot area that this
// trainer's snapshots replace (0 if it does not exist): not what the
// node's agent keeps there (elastic/snapshot_sync.h: replicas/, another
// node's part it keeps for as long as the job runs, and restore/, a
// restart's staging).
int64_t replaceable_bytes_under(const fs::path& dir) {
  int64_t bytes = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it.depth() == 0 && it->is_directory(ec)) {
      const std::string name = it->path().filename().string();
      if (name == "replicas" || name == "restore") {
        it.disable_recursion_pending();
        continue;
      }
    }
    if (it->is_regular_file(ec)) bytes += static_cast<int64_t>(it->file_size(ec));
  }
  return bytes;
}

}  // namespace

nlohmann::json Trainer::state_json() const {
  return {{"step", step_},
          {"optimizer_step", optimizer_->step_count()},
          {"seed", options_.seed},
          {"global_batch", options_.global_batch()},
          {"lr_schedule",
           {{"lr", options_.lr.lr},
            {"min_lr", options_.lr.min_lr},
            {"warmup_steps", options_.lr.warmup_steps},
            {"total_steps", options_.lr.total_steps}}},
          {"sampler", {{"kind", "philox_windows"}, {"seed", options_.seed}, {"next_step", step_}}},
          {"dataset", dataset_ ? dataset_->dir().string() : "synthetic"}};
}

fs::path Trainer::start_checkpoint() {
  const fs::path root = fs::path(options_.run_dir) / "checkpoints";
  start_save(*saver_, root, options_.keep_checkpoints, /*snapshot=*/false);
  return world_rank() == 0 ? step_directory(root, step_) : fs::path();
}

void Trainer::start_snapshots_if_room() {
  // Parameters and both moments of the whole model, for each snapshot kept
  // and the one being written. What the area
  // already holds (an earlier generation's snapshots and spares) is room
  // for these: they replace it.
  const double needed = static_cast<double>(snapshots_kept() + 1) * 3.0 * sizeof(float) *
                        static_cast<double>(ParamLayout(model_config()).size());
  // 0: room; 1: too small; 2: a rank has no area at all.
  struct statvfs fs_stats {};
  double too_small = options_.snapshot_dir.empty() ? 2 : 1;
  if (!options_.snapshot_dir.empty() && ::statvfs(options_.snapshot_dir.c_str(), &fs_stats) == 0) {
    const double room = static_cast<double>(fs_stats.f_bavail) * fs_stats.f_frsize +
                        static_cast<double>(replaceable_bytes_under(options_.snapshot_dir));
    too_small = room < needed ? 1 : 0;
  }
  // A node's ranks look at their node's file system; they still agree,
  // since the saves are collective.
  if (world_ != nullptr && world_->size() > 1) {
    world_->all_reduce(&too_small, 1, DType::kF64, ReduceOp::kMax)->wait();
  }
  if (too_small == 2) {
    // Nobody's area (not under a launcher that restarts): nothing to say.
    if (world_rank() == 0 && !options_.snapshot_dir.empty()) {
      std::fprintf(stderr,
                   "brigade train: no in-memory snapshots: a node's launcher gave its workers no "
                   "snapshot area (see its log); restarts resume from the newest checkpoint\n");
    }
    return;
  }
  if (too_small != 0) {
    if (world_rank() == 0) {
      std::fprintf(stderr,
                   "brigade train: no in-memory snapshots: %s has less free space than %lld "
                   "snapshots need (%.1f MB); restarts resume from the newest checkpoint\n",
                   options_.snapshot_dir.c_str(), static_cast<long long>(snapshots_kept() + 1),
                   needed / 1e6);
    }
    return;
  }
  snapshot_saver_ =
      std::make_unique<CheckpointSaver>(world_, options_.parallel.timeout_s * 1000, "snapshot");
}

void Trainer::stop_snapshots(const std::string& why) {
  snapshot_saver_.reset();
  drop_snapshot_claim();
  if (world_rank() == 0) {
    // Every rank's writer has stopped (the failure was agreed after they
    // did): the spares would hold a copy of the state in memory for nothing.
    release_spares(options_.snapshot_dir);
    std::fprintf(stderr,
                 "brigade train: in-memory snapshots stop: %s; training goes on, and restarts "
                 "resume from the newest checkpoint\n",
                 why.c_str());
  }
}

void Trainer::start_snapshot() {
  BRIGADE_CHECK(snapshot_saver_ != nullptr);
  try {
    start_save(*snapshot_saver_, options_.snapshot_dir, snapshots_kept(), /*snapshot=*/true);
  } catch (const CommError&) {
    throw;  // the group is broken: not the snapshot's business
  } catch (const Error& e) {
    stop_snapshots(e.what());
  }
}

std::optional<AsyncCheckpointWriter::Stats> Trainer::poll_snapshot() {
  if (!snapshot_saver_) return std::nullopt;
  try {
    return snapshot_saver_->poll();
  } catch (const CommError&) {
    throw;
  } catch (const Error& e) {
    stop_snapshots(e.what());
    return std::nullopt;
  }
}

SaveStates Trainer::save_states() const {
  return {saver_->state(), snapshot_saver_ ? snapshot_saver_->state() : 0};
}

std::optional<AsyncCheckpointWriter::Stats> Trainer::poll_checkpoint(
    const std::vector<int32_t>& states) {
  return saver_->poll(states);
}

std::optional<AsyncCheckpointWriter::Stats> Trainer::poll_snapshot(
    const std::vector<int32_t>& states) {
  if (!snapshot_saver_) return std::nullopt;
  try {
    return snapshot_saver_->poll(states);
  } catch (const CommError&) {
    throw;
  } catch (const Error& e) {
    stop_snapshots(e.what());
    return std::nullopt;
  }
}

std::vector<CheckpointPiece> Trainer::state_pieces() {
  // Every rank writes its slices of every bucket, whatever the ZeRO stage:
  // its moments are exactly those (or, replicated, include them), and its
  // parameter slices are current on it. So the writes are spread evenly and
  // nothing is gathered.
  const int64_t size = layout().size();
  std::vector<CheckpointPiece> pieces;
  int64_t compact = 0;
  for (const FlatRange& slice : plan_->owned(dp_rank())) {
    const int64_t end = std::min(slice.end, size);
    if (slice.begin < end) {
      const int64_t moment = zero_ >= 1 ? compact : slice.begin;
      pieces.push_back({StateKind::kParams, slice.begin, end, params_.data() + slice.begin});
      pieces.push_back({StateKind::kExpAvg, slice.begin, end, optimizer_->m().data() + moment});
      pieces.push_back({StateKind::kExpAvgSq, slice.begin, end, optimizer_->v().data() + moment});
    }
    compact += slice.size();
  }
  return pieces;
}

AsyncCheckpointWriter::Save Trainer::save_of(const fs::path& root, int64_t keep, bool snapshot,
                                             int64_t step) const {
  AsyncCheckpointWriter::Save save;
  save.root = root;
  save.step = step;
  save.rank = world_rank();
  save.num_shards = dp_size() * tp_size() * pp_size();
  save.config = model_config();
  save.tp_rank = tp_rank();
  save.tp_size = tp_size();
  save.layers = layout().parts();
  save.keep = keep;
  if (snapshot) {
    // Unstaged and recycled: one copy, straight from the live state into
    // the last-but-one snapshot's memory, while the next step's forward and
    // backward run (train_step waits for it before the update), or none at
    // all when that update wrote it (claim_snapshot): ckpt/checkpoint.h,
    // ShardWriting.
    save.writing = {.recycle = true, .checksum = false, .read = {}};
    save.staged = false;
    if (options_.snapshot_part.ranks > 0) {
      NodePart part;
      part.node = options_.snapshot_part.node;
      part.first_rank = options_.snapshot_part.first_rank;
      part.ranks = options_.snapshot_part.ranks;
      save.part = part;
      // The nodes commit their parts at slightly different times: a
      // restart assembles the newest step every node holds, which may be
      // the one before a node's newest.
      save.keep = keep + 1;
    }
  }
  return save;
}

void Trainer::drop_snapshot_claim() {
  if (snapshot_claim_.step < 0) return;
  // The memory of a shard whose save never started goes at once, not at
  // the next generation's clearing.
  std::error_code ignored;
  fs::remove(partial_shard_path(options_.snapshot_dir, snapshot_claim_.step, world_rank()),
             ignored);
  snapshot_claim_ = {};
}

std::vector<StateCopy> Trainer::claim_snapshot() {
  drop_snapshot_claim();
  const int64_t next = step_ + 1;
  if (!snapshot_saver_ || options_.snapshot_every <= 0 || next % options_.snapshot_every != 0 ||
      next >= options_.steps) {
    return {};
  }
  const std::vector<CheckpointPiece> pieces = state_pieces();
  const std::vector<float*> places = snapshot_saver_->claim(
      save_of(options_.snapshot_dir, snapshots_kept(), /*snapshot=*/true, next), pieces);
  if (places.empty()) return {};
  // Each owned slice is three pieces, its parameters and two moments.
  std::vector<StateCopy> copies;
  for (size_t i = 0; i + 2 < pieces.size(); i += 3) {
    copies.push_back({pieces[i].begin, pieces[i].end, {places[i], places[i + 1], places[i + 2]}});
  }
  std::sort(copies.begin(), copies.end(),
            [](const StateCopy& a, const StateCopy& b) { return a.begin < b.begin; });
  // The update and ZeRO 1/2's gather are the one write start_snapshot expects.
  snapshot_claim_ = {next, state_version_ + 1};
  return copies;
}

void Trainer::start_save(CheckpointSaver& saver, const fs::path& root, int64_t keep,
                         bool snapshot) {
  AsyncCheckpointWriter::Save save = save_of(root, keep, snapshot, step_);
  if (snapshot) {
    // The update wrote it, unless something wrote the state since.
    save.writing.prewritten =
        snapshot_claim_.step == step_ && snapshot_claim_.state_version == state_version_;
    snapshot_claim_ = {};
    hash_while_snapshotting(save);
  }
  if (world_rank() == 0) {
    save.header = {{{"dp", dp_size()}, {"tp", tp_size()}, {"pp", pp_size()}, {"zero", zero_}},
                   state_json(),
                   dataset_ ? dataset_->tokenizer_spec() : ""};
  }
  saver.start(std::move(save), state_pieces());
}

void Trainer::wait_for_checkpoint() {
  saver_->wait();
}

void Trainer::abandon_checkpoint() {
  saver_->abandon();
  if (snapshot_saver_) snapshot_saver_->abandon();
}

fs::path Trainer::save_checkpoint() {
  const fs::path dir = start_checkpoint();
  wait_for_checkpoint();
  return dir;
}

void Trainer::load_checkpoint(const fs::path& path) {
  load_checkpoint(resolve_checkpoint(path));
}

void Trainer::load_checkpoint(const ResolvedCheckpoint& checkpoint) {
  const auto& [dir, manifest] = checkpoint;
  // Load into fresh buffers first, so a failure leaves this trainer intact:
  // the whole model's tensors, then this tp rank's shards of them.
  const int64_t size = params_.size();
  FloatBuffer p(size), m(size), v(size);
  {
    const ParamLayout whole(model_config());
    FloatBuffer global(whole.size());
    const std::pair<StateKind, FloatBuffer*> kinds[] = {
        {StateKind::kParams, &p}, {StateKind::kExpAvg, &m}, {StateKind::kExpAvgSq, &v}};
    for (const auto& [kind, local] : kinds) {
      load_checkpoint_state(dir, manifest, model_config(), kind, global.data());
      global_to_local(layout(), whole, global.data(), local->data());
    }
  }
  const nlohmann::json& state = manifest.trainer_state;
  const auto field = [&](const char* key) {
    if (!state.contains(key) || !state[key].is_number_integer()) {
      throw_error("checkpoint {} lacks trainer_state.{}: it was not written by brigade train",
                  dir.string(), key);
    }
    return state[key].get<int64_t>();
  };
  const auto seed = static_cast<uint64_t>(field("seed"));
  const int64_t step = field("step"), optimizer_step = field("optimizer_step");
  if (state.contains("global_batch") && field("global_batch") != options_.global_batch()) {
    throw_error(
        "checkpoint {} was trained with a global batch of {} sequences but the config gives "
        "train.micro_batch * train.grad_accum = {}: the data order and learning-rate schedule "
        "assume the same global batch; choose micro_batch and grad_accum whose product is {}",
        dir.string(), field("global_batch"), options_.global_batch(), field("global_batch"));
  }
  if (seed != options_.seed) {
    throw_error(
        "checkpoint {} was trained with train.seed = {} but the config says {}: the data "
        "order would change; set train.seed = {}",
        dir.string(), seed, options_.seed, seed);
  }
  std::copy(p.data(), p.data() + size, params_.data());
  // ZeRO 3 keeps only the owned slices of what was just loaded.
  if (sharded_params_) sharded_params_->release_unheld();
  // Whole moments, or this rank's slices of them back to back.
  int64_t compact = 0;
  for (const Slice& slice : optimizer_->slices()) {
    std::copy(m.data() + slice.begin, m.data() + slice.end, optimizer_->m().data() + compact);
    std::copy(v.data() + slice.begin, v.data() + slice.end, optimizer_->v().data() + compact);
    compact += slice.end - slice.begin;
  }
  step_ = step;
  ++state_version_;
  optimizer_->set_step_count(optimizer_step);
}

}  // namespace brigade
