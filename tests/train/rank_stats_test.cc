// RankStats' per-step gather over forked ranks (shm backend): what each
// rank passes comes back to every rank under its world rank, the save
// states included, since the training loop decides a save's outcome from
// them (train/checkpoint_saver.h, poll(states)), and every rank gets the
// same stop signal when one rank alone was sent one, since the loop stops
// on it.
#include "brigade/train/rank_stats.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "brigade/comm/shm_communicator.h"
#include "testing/forked_ranks.h"
#include "testing/shm_ranks.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
using testing::require;

TEST(RankStats, EveryRanksSaveStatesAndStopSignalReachEveryRank) {
  testing::run_shm_ranks(3, 0, /*shared=*/false, [&](Communicator& comm, float*) {
    const int rank = comm.rank();
    RankStats stats(&comm, /*node=*/0, /*stage=*/0, /*counts_runqueue=*/false);
    StepBreakdown mine;
    // Rank 1 alone was sent SIGTERM (15).
    const RankStepStats out =
        stats.gather(1, mine, 1000.0 * (rank + 1), 0.0, SaveStates{rank + 1, 10 * (rank + 1)},
                     rank == 1 ? 15 : 0);
    require(out.stop_signal == 15, "rank {} stops on signal {}", rank, out.stop_signal);
    require(out.checkpoint_states == std::vector<int32_t>{1, 2, 3}, "checkpoint states {}",
            fmt::join(out.checkpoint_states, ","));
    require(out.snapshot_states == std::vector<int32_t>{10, 20, 30}, "snapshot states {}",
            fmt::join(out.snapshot_states, ","));
    require(out.peak_rss_bytes == std::vector<double>{1000, 2000, 3000}, "RSS {}",
            fmt::join(out.peak_rss_bytes, ","));
    // The next step: nobody was sent anything.
    const RankStepStats next = stats.gather(2, mine, 0.0, 0.0, SaveStates{}, 0);
    require(next.stop_signal == 0, "rank {} stops on signal {}", rank, next.stop_signal);
  });
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
