// The agent's status in Prometheus's text exposition format (version 0.0.4),
// what its /metrics endpoint serves (diag/metrics_server.h).
//
// Every series carries node="N"; per-rank series also rank="R" (this node's
// workers only: each node's agent is scraped on its own, and Prometheus adds
// the instance). The values come from the workers' heartbeat slots
// (elastic/heartbeat.h), as the agent last read them:
//
//   brigade_step                     steps completed (the fewest among this node's workers)
//   brigade_loss                     the last step's training loss (the same on every rank)
//   brigade_tokens_per_second        the global batch's tokens over the last step's time
//   brigade_mfu                      model FLOPs utilisation, on the node of rank 0
//   brigade_comm_wait_fraction{rank} the step's comm part over its time
//                                    (train/step_breakdown.h): collective waits
//                                    nothing overlapped, the stop agreement and
//                                    the per-step metrics gather included
//   brigade_step_seconds{rank}       the last step's time
//   brigade_step_part_seconds{rank,part}  the last step's time by part (compute,
//                                    optimizer, comm, bubble, data, ckpt, eval,
//                                    other: train/step_breakdown.h); they add up
//                                    to the loop's whole window for the step
//                                    (saves, evaluation and agreements
//                                    included), of which brigade_step_seconds
//                                    is the training step itself
//   brigade_heartbeat_age_seconds{rank}  since the worker last beat
//   brigade_worker_up{rank}          1 while the worker runs
//   brigade_generation, brigade_restarts_total, brigade_incidents_total
//
// A value a worker has not reported yet (before the first step, or MFU on
// ranks that do not measure it) is left out rather than written as NaN, so
// queries and alerts see no series instead of a poisoned one.
#pragma once

#include <string>

#include "brigade/elastic/agent.h"

namespace brigade::diag {

std::string prometheus_text(const elastic::AgentStatus& status);

}  // namespace brigade::diag
