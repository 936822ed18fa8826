// The parts of `brigade launch` (launcher.h) that only a job over several
// nodes has: standby nodes, whole-node faults and going on with fewer nodes.
//
// A standby (`brigade launch --nnodes N --standby ...`, no --node-rank)
// joins the job's store without claiming a node rank, after checking it
// runs the workers the nodes do (--nproc-per-node, --max-restarts, compared
// with node 0's), and its agent waits (elastic/standby.h). Node 0's
// launcher, at the end of the job, gives the standbys that still wait a
// moment to see they are released before it closes the store.
#pragma once

#include <string>

#include "brigade/cli/launcher.h"

namespace brigade {
class TcpStore;
}  // namespace brigade

namespace brigade::cli {

// Waits (the rendezvous timeout) for node 0 to join, refuses a standby
// whose workers would not match the nodes', then waits (within the same
// timeout) for node 0's agent to beat, which it does once every node
// joined. Throws Error naming the fix.
void join_as_standby(TcpStore& store, const LaunchOptions& o);

// A standby's launcher says it is done (whether or not it ran a node).
void standby_done(TcpStore& store, int standby_id);

// Node 0: waits, at most `limit_ms`, for every registered standby's done.
// A dead standby never says it; it costs `limit_ms` at the end, no more.
void wait_for_standbys(TcpStore& store, int64_t limit_ms);

// brigade/launch/node/<r>/nnodes: the --nnodes MIN:MAX node r was given.
std::string nnodes_key(int node_rank);
// Its value: "MIN:MAX" (plain --nnodes N is N:N).
std::string nnodes_text(const LaunchOptions& o);
// Refuses, naming the fix, a node r (its nnodes_key written) given another
// --nnodes MIN:MAX than this launcher (`who`: "this node (rank 1)", "this
// standby"): every node must agree on how few the job may go on with.
void check_same_nnodes(TcpStore& store, const LaunchOptions& o, int r, const std::string& who);

// Refuses, naming the fix, --standby without restarts, --nnodes MIN:MAX
// under srun's tasks per worker, and a kill-agent or partition fault no
// standby could answer: one node alone, node 0 (it
// hosts the store and leads), a node outside the job, or a launch as one
// of srun's tasks per worker (`srun_tasks`: no agent follows the
// coordinator there).
void check_standby_and_node_faults(const LaunchOptions& o, bool srun_tasks);

// A `brigade train` job's layout on all its nodes, which it scales when it
// goes on with fewer (elastic/agent.h); zeros when not known.
struct TrainLayoutOnAllNodes {
  int dp = 0;
  int64_t grad_accum = 0;
};

// Refuses, naming the fix, a --nnodes MIN:MAX whose MIN is out of 1..MAX or
// that lets the job go on with fewer nodes without --max-restarts (going on
// is a restart). For `brigade train` it reads the config (and its --set
// overrides), and refuses a MIN that allows a node count K (MIN <= K < MAX)
// on which parallel.dp * K / MAX or train.grad_accum * MAX / K is not whole:
// there the job could not sum the same global batch. Returns the layout the
// agent scales (zeros for another command, or MIN = MAX).
TrainLayoutOnAllNodes check_fewer_nodes(const LaunchOptions& o);

// The interface a partition fault of this node takes down: --iface, else
// the one the node reaches the store's host through. Throws Error if that
// is a loopback interface (cutting it would cut every node on this
// machine, and the machine's own loopback), if this process cannot take
// an interface down (it needs root), or if it runs in the machine's own
// network namespace (the host's real network: CI runs as root on one).
std::string partition_interface(const LaunchOptions& o, const std::string& store_host,
                                int store_port);

}  // namespace brigade::cli
