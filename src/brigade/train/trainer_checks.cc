// The Trainer's checks against silent corruption and non-finite losses
// (trainer.h: compare_replicas, train_step's re-run) and the faults tests
// inject to exercise them; kept apart from the training step itself.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/ckpt/node_part.h"
#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"
#include "brigade/data/dataset.h"
#include "brigade/data/sampler.h"
#include "brigade/train/trainer.h"

namespace brigade {
namespace fs = std::filesystem;

bool Trainer::replica_checks_on() const {
  return options_.sdc_every > 0 && dp_size() > 1;
}

uint64_t Trainer::owned_state_hash() const {
  std::vector<uint64_t> hashes;
  for (const FlatRange& slice : plan_->owned(dp_rank())) {
    hashes.push_back(hash_floats(params_.data() + slice.begin, slice.size()));
  }
  hashes.push_back(hash_floats(optimizer_->m().data(), optimizer_->m().size()));
  hashes.push_back(hash_floats(optimizer_->v().data(), optimizer_->v().size()));
  return combine_hashes(hashes);
}

uint64_t Trainer::local_gradient_hash_of(int rank) {
  const int64_t b = options_.micro_batch, t = model_config().block_size;
  const int64_t first = rank * b * options_.grad_accum;
  const float loss_scale = 1.0f / static_cast<float>(options_.global_batch() * t);
  grads_.zero();
  stage_->run([&](int64_t micro) { fill_batch(first + micro * b, b); }, inputs_.data(),
              targets_.data(), b, t, loss_scale, {}, {});
  return hash_floats(grads_.data(), grads_.size());
}

uint64_t Trainer::replay_peer_gradient() {
  BRIGADE_CHECK(gradient_replay_supported());
  return local_gradient_hash_of((dp_rank() + 1) % dp_size());
}

GradientReplay Trainer::replay_gradients(uint64_t replayed) {
  BRIGADE_CHECK(gradient_replay_supported());
  const int n = dp_size(), me = dp_rank();
  const uint64_t mine[2] = {hash_floats(grads_.data(), grads_.size()), replayed};
  std::vector<uint64_t> all(2 * static_cast<size_t>(n));
  dp_group_->all_gather(mine, all.data(), 2, DType::kI64)->wait();
  std::vector<uint64_t> own, replays;
  for (int r = 0; r < n; ++r) {
    own.push_back(all[2 * static_cast<size_t>(r)]);
    replays.push_back(all[2 * static_cast<size_t>(r) + 1]);
  }
  GradientReplay g = gradient_disputes(std::move(own), std::move(replays));
  if (g.clean()) return g;
  // The third computation, into grads_: the step is given up on a settled
  // dispute, and restore_local_gradient() recomputes this rank's own where
  // it goes on. Every rank computes one, disputed or not (under ZeRO 3 each
  // forward gathers over the group).
  const uint64_t third = local_gradient_hash_of(gradient_settling_target(me, n));
  local_gradient_spoiled_ = true;
  std::vector<uint64_t> thirds(static_cast<size_t>(n));
  dp_group_->all_gather(&third, thirds.data(), 1, DType::kI64)->wait();
  settle_gradient_disputes(g, thirds);
  return g;
}

void Trainer::restore_local_gradient() {
  if (!local_gradient_spoiled_) return;
  local_gradient_hash_of(dp_rank());
  local_gradient_spoiled_ = false;
}

std::string Trainer::flip_gradient_bit() {
  for (const ParamInfo& p : layout().params()) {
    for (int64_t i = 0; i < p.numel; ++i) {
      float* value = grads_.data() + p.offset + i;
      if (*value == 0.0f) continue;
      uint32_t bits = 0;
      std::memcpy(&bits, value, sizeof(bits));
      bits ^= 1u << 22;
      std::memcpy(value, &bits, sizeof(bits));
      return fmt::format("the local gradient of {} element {} (flat offset {})", p.name, i,
                         p.offset + i);
    }
  }
  throw_error("rank {} has no non-zero local gradient element to corrupt", dp_rank());
}

void Trainer::discard_saves(int64_t step) {
  abandon_checkpoint();
  std::error_code ec;
  // Across nodes, each node's committer drops its node's part.
  if (snapshot_saver_ && options_.snapshot_part.ranks > 0 &&
      world_rank() == options_.snapshot_part.first_rank) {
    fs::remove_all(node_part_directory(options_.snapshot_dir, step), ec);
  }
  if (world_rank() != 0) return;
  if (snapshot_saver_) fs::remove_all(step_directory(options_.snapshot_dir, step), ec);
  fs::remove_all(step_directory(fs::path(options_.run_dir) / "checkpoints", step), ec);
}

void Trainer::hash_while_snapshotting(AsyncCheckpointWriter::Save& save) {
  snapshot_hash_.reset();
  if (!replica_checks_on() || (zero_ != 1 && zero_ != 2)) return;
  auto h = std::make_shared<SnapshotHash>();
  h->hash.add(params_.data(), params_.size());
  h->step = step_;
  h->state_version = state_version_;
  save.writing.read = [h](const void* data, size_t bytes) { h->hash.feed(data, bytes); };
  save.written = [h] { h->hash.finish(); };
  snapshot_hash_ = std::move(h);
}

std::optional<uint64_t> Trainer::take_snapshot_hash() {
  // Called once the snapshot's writer reported its shard written
  // (train_step's wait): its thread finished the hash before that, or the
  // write failed and it never will. The hash is of the state right before
  // this update when (1) it is of this step's state, (2) the copy
  // completed (finished: set after the whole shard was written, the rest
  // of each buffer hashed from memory then), and (3) nothing wrote the
  // buffers since the snapshot started: everything that does (the update
  // and ZeRO 1/2's gather, a load, an injected flip such as
  // sdc:...:when=forward at the start of this step's forward) counts in
  // state_version_, and no other code writes them while a step runs (the
  // forward and backward read them; the gradient replay writes gradients
  // only). A bit the hardware flips in that window, after the copy read
  // it, is not in the snapshot either, so every save still passes a check
  // of what it holds; the replicas then differ after this update, which the
  // next check catches (as a flip right after a pass of the check's own
  // would have been), discarding the saves of the state it fails on.
  // Otherwise the check makes its own pass.
  std::shared_ptr<SnapshotHash> h = std::move(snapshot_hash_);
  if (!h || !snapshot_saver_ || h->step != step_ || h->state_version != state_version_ ||
      !h->hash.finished()) {
    return std::nullopt;
  }
  return h->hash.hashes().front();
}

ReplicaComparison Trainer::compare_replicas() {
  BRIGADE_CHECK(dp_group_ != nullptr && dp_size() > 1 && zero_ < 3);
  uint64_t mine = 0;
  bool fused = false;
  if (zero_ == 0) {
    // Every rank's update covers the same elements, so the hashes compare.
    fused = update_hash_ && update_hash_->state_version == state_version_;
    mine = fused ? update_hash_->hash : optimizer_->state_hash(params_.data());
  } else {
    fused = fused_hash_.has_value();
    mine = fused ? *fused_hash_ : hash_floats(params_.data(), params_.size());
  }
  ReplicaComparison c = brigade::compare_replicas(*dp_group_, mine);
  c.compared = zero_ == 0
                   ? fmt::format("parameters and Adam moments (3 x {} floats)", params_.size())
                   : fmt::format("parameters ({} floats)", params_.size());
  c.fused = fused;
  return c;
}

std::string Trainer::flip_parameter_bit(bool in_moment) {
  // A real tensor element in a slice this rank owns: under ZeRO 3 the only
  // parameters it holds between steps, and everywhere else as good as any.
  int64_t compact = 0;
  for (const FlatRange& slice : plan_->owned(dp_rank())) {
    for (const ParamInfo& p : layout().params()) {
      const int64_t at = std::max(slice.begin, p.offset);
      if (at >= std::min(slice.end, p.offset + p.numel)) continue;
      // The top mantissa bit: the value changes by up to half, stays finite,
      // and the difference survives the next updates.
      // The moments are compact under ZeRO 1/2: the slice's own offset.
      float* value = in_moment ? optimizer_->m().data() + (zero_ >= 1 ? compact : slice.begin) +
                                     (at - slice.begin)
                               : params_.data() + at;
      uint32_t bits = 0;
      std::memcpy(&bits, value, sizeof(bits));
      bits ^= 1u << 22;
      std::memcpy(value, &bits, sizeof(bits));
      ++state_version_;
      return fmt::format("{}{} element {} (flat offset {})",
                         in_moment ? "the first moment of " : "", p.name, at - p.offset, at);
    }
    compact += slice.size();
  }
  throw_error("rank {} owns no parameter element to corrupt", dp_rank());
}

void Trainer::poison_loss(int64_t step, int times) {
  poisoned_step_ = step;
  poisoned_losses_ = times;
}

void Trainer::throw_non_finite(const StepMetrics& m, double local_loss) {
  // Every rank of the mesh comes here (the re-run was agreed). Within a
  // data-parallel group the ranks agree on whether the group's own numbers
  // are bad, and which replicas' samples gave a non-finite loss (each knows
  // its own), in one all-reduce: a rank's own view could differ from its
  // peers' and leave them waiting.
  std::vector<double> bad(static_cast<size_t>(dp_size()) + 1, 0.0);
  bad[static_cast<size_t>(dp_rank())] = std::isfinite(local_loss) ? 0.0 : 1.0;
  bad.back() = std::isfinite(m.loss) && std::isfinite(m.grad_norm) ? 0.0 : 1.0;
  if (dp_size() > 1) {
    dp_group_->all_reduce(bad.data(), dp_size() + 1, DType::kF64, ReduceOp::kMax)->wait();
  }
  if (bad.back() == 0.0) {
    throw_error(
        "step {}: another data-parallel group of the mesh got a NaN or infinite loss again after "
        "re-running the step on the same batch (its ranks' errors name the data); stopping with "
        "it",
        step_ + 1);
  }
  bad.pop_back();
  const int64_t per_rank = options_.micro_batch * options_.grad_accum;
  std::string where;
  for (int r = 0; r < dp_size(); ++r) {
    if (bad[static_cast<size_t>(r)] == 0.0) continue;
    const int64_t first = r * per_rank;
    where += fmt::format("{}samples [{}, {}) of the step's global batch (dp rank {})",
                         where.empty() ? "" : "; ", first, first + per_rank, r);
    if (sampler_) {
      std::string windows;
      const int64_t shown = std::min<int64_t>(per_rank, 4);
      for (int64_t j = first; j < first + shown; ++j) {
        const auto [shard, offset] =
            sampler_->window_start(static_cast<uint64_t>(step_), static_cast<uint64_t>(j));
        windows += fmt::format("{}{} tokens [{}, {})", windows.empty() ? "" : ", ",
                               dataset_->train_shards()[shard].path().string(), offset,
                               offset + static_cast<uint64_t>(model_config().block_size) + 1);
      }
      where += fmt::format(": {}{}", windows, per_rank > shown ? ", ..." : "");
    } else {
      where += " (data.synthetic: random tokens from train.seed)";
    }
  }
  if (where.empty()) {
    where = fmt::format("the whole batch (samples [0, {}); no single replica's loss was)",
                        options_.global_batch());
  }
  throw_error(
      "step {}: the loss is {:.6g} and the gradient norm {:.6g} again after re-running the step on "
      "the "
      "same batch, so it is not a passing fault; the batch's data: {}. Check those tokens, "
      "or skip the window (cut it from the source and prepare the data again, or change "
      "train.seed); if the data is sound, training diverged: lower optim.lr or resume from an "
      "earlier checkpoint",
      step_ + 1, m.loss, m.grad_norm, where);
}

}  // namespace brigade
