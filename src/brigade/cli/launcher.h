// brigade launch: starts the worker processes of one node and watches them.
//
// Each worker gets the variables torchrun sets, so scripts written for it
// work unchanged:
//   RANK              global rank, node_rank * nproc_per_node + LOCAL_RANK
//   WORLD_SIZE        nnodes * nproc_per_node
//   LOCAL_RANK        rank on this node, 0 .. LOCAL_WORLD_SIZE - 1
//   LOCAL_WORLD_SIZE  workers on this node
//   GROUP_RANK        this node's rank
//   MASTER_ADDR, MASTER_PORT  the rendezvous store (hosted by node 0's launcher)
// and Brigade's own:
//   BRIGADE_STORE_TOKEN      the job's secret; the store refuses connections without it
//   BRIGADE_NODE             this node's rank as the job started (after the job
//                            went on with fewer nodes, GROUP_RANK is its place
//                            among those left): incidents and the straggler
//                            records name nodes by it
//   BRIGADE_STORE_OWNER      "launcher" (the store is up) or "rank0" (under srun
//                            nobody hosts it: rank 0 must)
//   GLOO_SOCKET_IFNAME       with --iface: the interface Gloo listens on across
//                            nodes (by default the one that reaches the store;
//                            see comm/advertised_address.h)
//   OMP_NUM_THREADS          the node's cores split among its workers, unless already set
//
// Before any worker starts, every node's launcher joins the store and waits
// for all nodes, so a missing node or a mismatched --nproc-per-node is an
// error at once rather than a hang inside the first collective.
//
// The workers of the node are supervised by the elastic agent
// (elastic/agent.h): a crash or a hang (elastic/watchdog.h) stops them all;
// with --max-restarts N they are started again as a new generation (each
// worker gets BRIGADE_GENERATION and BRIGADE_HEARTBEAT_FD too), a `brigade
// train` from the newest checkpoint; otherwise the launcher exits 1 naming
// the failure. SIGINT, SIGTERM and SIGHUP are forwarded to the workers and
// never restart them. On a multi-node job the agents follow the coordinator
// (elastic/coordinator.h) through the store: a failure on any node stops
// every node's workers, and a restart starts them all again as one new
// generation (every node must be given the same --max-restarts); a node
// that stops answering is replaced by a waiting standby node (--standby,
// launch_nodes.h) in the next generation, at the same world size, or,
// with none free, ends the job, named. Node 0 cannot be replaced.
// With --rdzv-backend etcd --rdzv-endpoints URL[,URL] the coordinator keeps
// its state in etcd instead (cli/rdzv_backend.h, elastic/etcd_store.h);
// node 0 still hosts the store the launchers and workers meet in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "brigade/elastic/fault_injection.h"

namespace brigade::cli {

struct LaunchOptions {
  int nproc_per_node = 0;  // 0: not given (fine under srun, an error otherwise)
  int nnodes = 1;          // the job starts with this many (--nnodes MAX or MIN:MAX)
  // The fewest it may go on with when nodes are lost and no standby is
  // free (--nnodes MIN:MAX); 0: nnodes.
  int min_nnodes = 0;
  int node_rank = 0;
  // "HOST:PORT" of the store. Empty (one node only): 127.0.0.1 and a free port.
  std::string rdzv;
  // Empty: from BRIGADE_RDZV_TOKEN, else generated (one node only).
  std::string rdzv_token;
  // Where the coordinator keeps its state (cli/rdzv_backend.h): "tcp", the
  // store above, or "etcd" at rdzv_endpoints ("http://h:2379[,...]").
  std::string rdzv_backend = "tcp";
  std::string rdzv_endpoints;
  // The network interface this node's workers listen on for peers on other
  // nodes (passed on as GLOO_SOCKET_IFNAME). Empty: the one they reach the
  // rendezvous store through.
  std::string iface;
  // How long launchers wait for each other, at the start and at the end.
  int64_t rdzv_timeout_ms = 300'000;
  // After a worker fails (here or on another node), how long the others get
  // to exit on SIGTERM before SIGKILL.
  int64_t failure_grace_ms = 5'000;
  // How often the workers may be started again after a failure. 0, as
  // torchrun: an arbitrary program that failed usually fails again the same
  // way (`brigade train --nproc` gives its agent elastic.max_restarts, 3).
  int max_restarts = 0;
  // A worker that beats but completes no step for this long counts as hung.
  int64_t step_timeout_ms = 600'000;
  // Where the agent serves /metrics for Prometheus (diag/metrics_server.h):
  // HOST:PORT, port 0 for a free one (printed), "off", or "auto": a free
  // loopback port for `brigade train` (whose workers report their steps),
  // off for any other program, whose launcher stays as silent as torchrun.
  std::string metrics_address = "auto";
  // Random faults on this node's workers for as long as the job runs
  // (elastic/fault_injection.h's chaos); none when unset.
  std::optional<elastic::ChaosSpec> chaos;
  // Whole-node faults (kill-agent, partition), raised by this node's agent
  // when they name its node (a standby's: the node it takes over).
  std::vector<elastic::NodeFault> node_faults;
  // A standby node (launch_nodes.h): node_rank is not used.
  bool standby = false;
  // This machine's id for the quarantine of machines lost twice (--node-id;
  // empty: its host name).
  std::string node_id;
  // A brigade verb and its arguments (run with this same binary), or any
  // program and its arguments.
  std::vector<std::string> command;
};

// Runs this node's workers and returns the launcher's exit status: 0 when
// every worker exited 0, 1 when one failed (after the restarts allowed),
// 128 + signal when stopped by a
// signal. Throws Error, before any worker starts, for bad options or a failed
// rendezvous. Under srun (SLURM_PROCID, SLURM_NTASKS and SLURM_STEP_ID set,
// no --nproc-per-node) this task is one worker: it sets the variables from
// the step's (SLURM_STEP_NUM_TASKS, SLURM_STEP_TASKS_PER_NODE, ...) and
// replaces this process with the command, never returning. The step must
// put the same number of tasks on every node, numbered node by node (srun's
// default block distribution); otherwise, and in Slurm's batch script itself
// (which is no task of a step), it throws saying how to run it.
int run_launch(const LaunchOptions& options);

}  // namespace brigade::cli
