// The chaos the agent raises itself (`--inject chaos:mtbf=S`): a fault
// falls due on the seeded ChaosSchedule (elastic/fault_injection.h), and
// the agent strikes one of its workers (SIGKILL or SIGSTOP) or, across
// nodes, its whole node (a partition or its own end). Kept apart from
// agent.cc, whose loop only asks when the next one is due.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <vector>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/agent.h"
#include "brigade/elastic/fault_injection.h"
#include "brigade/elastic/heartbeat.h"

namespace brigade::elastic {

int64_t Agent::inject_chaos(WorkerGroup& group, const HeartbeatTable& table) {
  if (!chaos_ || chaos_node_struck_) return kAgentTickMs;
  // Faults that fall due while the generation stops (and between
  // generations: evidence, settling, the restart) wait here: none is
  // raised on workers that are going anyway.
  if (group.stopping()) return kAgentTickMs;
  const int64_t now = now_ns();
  // The first overdue fault strikes this generation (one that fell due
  // during a restart restarts it); the others overdue with it are dropped.
  const std::optional<ChaosSchedule::Fault> due = chaos_->take_due(now, &chaos_skipped_);
  if (!due)
    return std::min<int64_t>(kAgentTickMs, (chaos_->due_ns() - now + kNsPerMs - 1) / kNsPerMs);
  const ChaosSchedule::Fault fault = *due;
  if (fault.whole_node()) {
    NodeFault node;
    node.kind = fault.kind == ChaosSchedule::Kind::kPartition ? NodeFault::Kind::kPartition
                                                              : NodeFault::Kind::kKillAgent;
    node.node = options_.node_rank;
    node.generation = generation_;
    std::fprintf(stderr, "brigade launch: chaos fault %d: %s of node %d (generation %lld)\n",
                 ++chaos_raised_, node.name(), node.node, static_cast<long long>(generation_));
    std::fflush(stderr);
    chaos_node_struck_ = true;
    // Not cut off, yet the coordinator was told it is: this node cannot go
    // on as if nothing happened (it would never draw a fault again), so
    // the agent ends and the node is lost, with the reason.
    if (const std::string error = strike_node(node, group); !error.empty()) {
      throw_error(
          "chaos fault {}: the partition could not cut node {} ({}); it takes down the "
          "interface that reaches --rdzv, which needs the launcher to run as root: this agent "
          "ends rather than run on uncut",
          chaos_raised_, options_.node_rank, error);
    }
    return kAgentTickMs;
  }
  // A stop is detected by the silence of the heartbeat, so only a worker
  // that beats can be stopped; one that does not yet is killed instead.
  // A worker already struck (stopped, not yet detected) keeps its first
  // fault's time stamp: it is not struck again.
  std::vector<const Worker*> beating, running;
  for (const Worker& w : group.workers()) {
    const WorkerProgress p = table.read(w.local_rank);
    // An exit not reaped yet is no worker to strike: the incident would
    // blame the fault for it.
    if (!w.running || p.fault_ns > 0 || WorkerGroup::exited_unreaped(w.pid)) continue;
    running.push_back(&w);
    if (p.beat_ns > 0) beating.push_back(&w);
  }
  const bool kill = fault.kill() || beating.empty();
  const std::vector<const Worker*>& candidates = kill ? running : beating;
  if (candidates.empty()) {
    ++chaos_skipped_;
  } else {
    const Worker& victim = *candidates[fault.victim % candidates.size()];
    table.stamp_fault(victim.local_rank, now);
    std::fprintf(stderr,
                 "brigade launch: chaos fault %d: %s to worker rank %d (pid %d, node %d, "
                 "generation %lld)\n",
                 ++chaos_raised_, kill ? "SIGKILL" : "SIGSTOP", victim.rank,
                 static_cast<int>(victim.pid), options_.node_rank,
                 static_cast<long long>(generation_));
    std::fflush(stderr);
    ::kill(victim.pid, kill ? SIGKILL : SIGSTOP);
  }
  return std::min<int64_t>(kAgentTickMs, (chaos_->due_ns() - now + kNsPerMs - 1) / kNsPerMs);
}

}  // namespace brigade::elastic
