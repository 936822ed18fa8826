// The job both tests of a lost etcd leader run (tests/cli/etcd_leader_*):
// appended to the tiny model, one worker on each of 3 nodes, dp 3 x
// grad_accum 2, a checkpoint every step, 8 steps; on 2 of the nodes it goes
// on as dp 2 x grad_accum 3, the same global batch.
#pragma once

namespace brigade::testing {

inline constexpr char kEtcdLeaderTraining[] = R"(
[train]
micro_batch = 2
grad_accum = 2
steps = 8
seed = 5
checkpoint_every = 1
[optim]
lr = 3e-3
min_lr = 3e-3
[data]
synthetic = true
[parallel]
dp = 3
timeout_s = 30
)";

}  // namespace brigade::testing
