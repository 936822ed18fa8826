#include "brigade/train/checkpoint_saver.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "brigade/comm/communicator.h"
#include "brigade/core/error.h"

namespace brigade {
namespace fs = std::filesystem;
using State = AsyncCheckpointWriter::State;

void require_shared_directory(Communicator* group, const fs::path& root) {
  if (group == nullptr || group->size() < 2) return;
  const int rank = group->rank();
  const int size = group->size();
  // Rank 0's nonce names the file: a file left by an earlier job (or by
  // another job in the same directory) can never pass for this one's.
  std::random_device entropy;
  const int64_t mine = (static_cast<int64_t>(entropy()) << 32) ^ entropy();
  std::vector<int64_t> nonces(static_cast<size_t>(size));
  group->all_gather(&mine, nonces.data(), 1, DType::kI64)->wait();
  const fs::path probe = root / fmt::format(".shared_by_every_rank_{:016x}", nonces[0]);
  // Rank 0 says first whether it could write the file at all.
  int64_t written = 1;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    std::ofstream(probe) << "written by rank 0 to check that every rank sees this directory\n";
    written = fs::exists(probe, ec) ? 1 : 0;
  }
  group->broadcast(&written, 1, DType::kI64, 0)->wait();
  if (written == 0) {
    throw_error("rank 0 cannot write into {}: make train.run_dir a directory it may create",
                root.string());
  }
  std::error_code ec;
  const int32_t sees = fs::exists(probe, ec) ? 1 : 0;
  std::vector<int32_t> seen(static_cast<size_t>(size));
  group->all_gather(&sees, seen.data(), 1, DType::kI32)->wait();
  if (rank == 0) fs::remove(probe, ec);
  std::vector<int> blind;
  for (int r = 0; r < size; ++r) {
    if (seen[static_cast<size_t>(r)] == 0) blind.push_back(r);
  }
  if (!blind.empty()) {
    throw_error(
        "the run directory is not shared by every node: rank{} {} cannot see {}, which rank 0 "
        "just wrote (checkpoints are written by every rank into one directory that rank 0 "
        "commits). Put train.run_dir on a file system every node mounts (NFS, Lustre, ...)",
        blind.size() == 1 ? "" : "s", fmt::join(blind, ", "), root.string());
  }
}

CheckpointSaver::CheckpointSaver(Communicator* group, int64_t commit_timeout_ms, std::string what)
    : group_(group != nullptr && group->size() > 1 ? group : nullptr),
      what_(std::move(what)),
      rank_(group_ ? group_->rank() : 0),
      size_(group_ ? group_->size() : 1),
      writer_(commit_timeout_ms) {}

CheckpointSaver::~CheckpointSaver() {
  abandon();
}

void CheckpointSaver::start(AsyncCheckpointWriter::Save save,
                            const std::vector<CheckpointPiece>& pieces) {
  wait();
  if (!cleared_) clear_leftovers(save);
  // No collective from here: each rank's writer makes the step's directory
  // (checkpoint.h, phase 1), and one that cannot make it fails its part,
  // which every rank learns from the states at the next gather.
  root_ = save.root;
  step_ = save.step;
  committer_ = save.commits();
  in_flight_ = true;
  writer_.start(std::move(save), pieces);
}

void CheckpointSaver::clear_leftovers(const AsyncCheckpointWriter::Save& save) {
  // Once, before this saver's first save (checkpoint.h, phase 0): the committers clear what earlier
  // processes left, and no rank writes before every committer is done. The ranks agree on whether
  // they could: one rank throwing alone would leave the others waiting.
  double failed = 0;
  std::string why;
  if (save.commits()) {
    try {
      clear_checkpoint_leftovers(save.root);
    } catch (const Error& e) {
      failed = 1;
      why = e.what();
    }
  }
  if (group_) group_->all_reduce(&failed, 1, DType::kF64, ReduceOp::kMax)->wait();
  if (failed != 0) {
    throw_error("{} of step {} could not start: {}", what_, save.step,
                save.commits() ? why
                               : "a committer could not clear the leftovers of earlier saves "
                                 "under its root (its own error names the directory)");
  }
  cleared_ = true;
}

std::vector<int32_t> CheckpointSaver::gather_states() {
  const int32_t mine = static_cast<int32_t>(writer_.state());
  std::vector<int32_t> states(static_cast<size_t>(size_), mine);
  if (group_) {
    // An all-reduce (each rank's slot, the others -1, the maximum), not an
    // all-gather: it runs right after the loop's all-gather of RankStats
    // (start()'s wait()), and a rank that skipped that one would meet this
    // at the same sequence number as an all-gather of another shape, which
    // the root cause cannot tell from a mismatch (diag/root_cause.h).
    std::vector<double> slots(static_cast<size_t>(size_), -1.0);
    slots[static_cast<size_t>(rank_)] = mine;
    group_->all_reduce(slots.data(), size_, DType::kF64, ReduceOp::kMax)->wait();
    for (int r = 0; r < size_; ++r)
      states[static_cast<size_t>(r)] = static_cast<int32_t>(slots[static_cast<size_t>(r)]);
  }
  return states;
}

bool CheckpointSaver::settle(const std::vector<int32_t>& states) {
  std::vector<int> failed;
  for (int r = 0; r < size_; ++r) {
    if (states[static_cast<size_t>(r)] == static_cast<int32_t>(State::kFailed)) failed.push_back(r);
  }
  // Complete when every rank's part is finished (rank 0's includes the
  // commit): a rank still finishing its shard could yet fail alone.
  if (failed.empty()) {
    return std::all_of(states.begin(), states.end(),
                       [](int32_t s) { return s == static_cast<int32_t>(State::kDone); });
  }

  const std::string own_error = writer_.error_message();
  // Every rank's write has stopped before rank 0 removes the step, so
  // nothing writes into it afterwards.
  writer_.abort();
  if (group_) group_->barrier()->wait();
  if (committer_) abandon_checkpoint(root_, step_);
  in_flight_ = false;
  std::string who;
  for (int r : failed) {
    if (!who.empty()) who += ", ";
    who += fmt::format("rank {} ({})", r, partial_shard_path(root_, step_, r).string());
  }
  if (what_ != "checkpoint") {
    throw_error("{} of step {} failed on {}{}; the step was dropped", what_, step_, who,
                own_error.empty() ? "" : ": " + own_error);
  }
  const std::optional<fs::path> newest = latest_checkpoint(root_);
  throw_error(
      "checkpoint of step {} failed on {}{}; the step was dropped, {}: fix the cause (a full "
      "disk?) and resume with --resume {}",
      step_, who, own_error.empty() ? "" : ": " + own_error,
      newest ? newest->filename().string() + " is still the newest checkpoint"
             : "there is no earlier checkpoint",
      root_.parent_path().string());
}

std::optional<AsyncCheckpointWriter::Stats> CheckpointSaver::poll() {
  return poll(in_flight_ ? gather_states() : std::vector<int32_t>(static_cast<size_t>(size_)));
}

std::optional<AsyncCheckpointWriter::Stats> CheckpointSaver::poll(
    const std::vector<int32_t>& states) {
  BRIGADE_CHECK(states.size() == static_cast<size_t>(size_));
  // The save in flight is settled whenever the states allow, even while a
  // save that start()'s wait() completed is still to be reported: left
  // unsettled, every later start would have to settle it with gathers of
  // its own. The stats queue (every rank's the same) and go out one a call.
  if (in_flight_ && settle(states)) {
    in_flight_ = false;
    if (auto stats = writer_.take_finished()) completed_.push_back(*stats);
  }
  if (completed_.empty()) return std::nullopt;
  AsyncCheckpointWriter::Stats done = completed_.front();
  completed_.pop_front();
  return done;
}

void CheckpointSaver::wait() {
  if (!in_flight_) return;
  for (;;) {
    // A rank whose shard is still being written has nothing to say yet.
    writer_.wait_until_written();
    if (settle(gather_states())) break;
    // Rank 0 is still waiting for the shard files or committing.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  in_flight_ = false;
  if (auto stats = writer_.take_finished()) completed_.push_back(*stats);
}

void CheckpointSaver::abandon() {
  if (!in_flight_) return;
  writer_.abort();
  if (committer_) abandon_checkpoint(root_, step_);
  in_flight_ = false;
}

}  // namespace brigade
