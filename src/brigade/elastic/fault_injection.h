// Faults a worker raises on itself, for tests and demos of recovery:
//
//   kill:rank=1:step=5          rank 1 SIGKILLs itself right after step 5
//   stop:rank=2:step=8:gen=1    rank 2 SIGSTOPs itself after step 8, in generation 1
//   skip:rank=1:step=5          rank 1 leaves out the next collective after step 5
//                               (the loop's per-step gather on the world group,
//                               train/rank_stats.h)
//   mismatch:rank=1:step=5      rank 1 calls that collective with another count
//   slow:rank=2:factor=3        rank 2 takes 3x its compute time in every step
//   sdc:rank=1:step=5           rank 1 flips a bit of one of its parameters after
//                               step 5's update (silent data corruption, which
//                               diag.sdc_every's replica check must catch)
//   sdc:rank=1:step=5:when=forward  the same flip at the start of step 5's
//                               forward, while the snapshot of step 4 may be
//                               reading the parameters
//   sdc:rank=1:step=5:what=moment  the flip in an Adam moment instead
//   sdc:rank=1:step=5:what=grad    the flip in rank 1's local gradient of
//                               step 5, after its backward and before the
//                               reduce spreads it into every rank's sum
//                               (caught only in a check step, by its
//                               gradient replay: train/silent_corruption.h;
//                               refused without data parallelism)
//   nan:rank=1:step=5[:times=2] rank 1's loss of step 5 is NaN, on its first
//                               computation only (a passing fault: the step's
//                               re-run is clean) or `times` of them (2: the re-run
//                               too, as bad data would)
//
// skip and mismatch are the bugs diag/root_cause.h tells apart: a rank that
// did not call a collective its group called, and one that called it with
// another shape. They act on the training loop's own collective, so the model
// code stays as it is; what follows is the communicator's to detect.
//
// Several are separated by commas. A fault belongs to one generation (0
// unless gen= says), so the restarted job does not raise it again. The
// worker stamps the time into its heartbeat slot first, which is how the
// agent measures how long detection took.
//
//   chaos:mtbf=S[:kinds=kill+stop+partition+kill-agent][:seed=N]
//
// is the agent's, not a worker's: random faults at exponentially
// distributed intervals of mean S seconds of wall time, each on a random
// worker, of a random kind among `kinds` (kill, stop; both by default; '+'
// separates them, since ',' separates faults), for as long as the job runs
// (restarts included, bounded by max_restarts as any failure). The agent
// sends the signal itself and stamps the worker's heartbeat slot, so a
// chaos fault is recorded and timed as an injected one. Faults that fall
// due while no worker can be struck (the group stopping, the evidence
// gathered, the restart) wait: the first strikes the next generation as it
// starts, the others are dropped; the summary counts chaos_raised and
// chaos_skipped (also those with no worker left to strike). The draws are
// Philox(seed) (ChaosSchedule), so a seed gives the same intervals, ranks
// and kinds on every run; where they land in training depends on timing.
//
// partition and kill-agent are whole-node kinds (NodeFault below, raised at
// once, not at a step) for multi-node jobs (a launch of one node refuses
// them: they could never strike): each node's agent draws its own
// faults, at nnodes times the mean interval, so the job fails at about the
// spec's MTBF: less often while a node has no kind to draw (node 0 under
// whole-node kinds alone), waits as a standby, or is left out of a smaller
// generation, and faults that fall due while a generation restarts wait
// for the next one. The agents draw rather than the leader because a node's own
// agent is the one that can raise a node's fault (signal its workers, take
// its interface down, kill itself) without a message that a partition
// could lose, and because draws per node need no agreement: a node that
// dies takes its stream with it, and the standby that takes its place
// draws a fresh one (the stream is keyed by the node and the generation
// it joined at, so the lost node's faults are not replayed). Node 0 draws
// no whole-node fault: its launcher hosts the job's TCP store (the
// workers' store even with etcd), whose loss ends the job; its faults are
// kill and stop alone, at the same rate.
//
//   kill-agent:node=1:step=4[:gen=G]   node 1's agent SIGKILLs its workers
//                                      and itself once they completed step 4
//   partition:node=1:step=4[:gen=G]    node 1's agent takes its network
//                                      interface down then (the node's cable
//                                      pulled; needs root, never loopback)
//   hold:node=0:step=2[:gen=G]         node 0's workers wait after step 2
//                                      until the generation stops (a rejoin,
//                                      a failure, a signal): a test's way to
//                                      keep a generation running until then,
//                                      however fast its steps
//
// are the agent's too (`brigade launch --inject`, NodeFault): whole-node
// faults, which only a standby node can take the place of. The node's
// workers wait after step 4 until the agent has raised the fault
// (HeartbeatSlot::hold_after_step), so it strikes there even when steps
// are shorter than the agent's tick. The agent
// writes the fault's kind to the coordinator first, so the leader records
// the incident as injected and of that kind when it finds the node silent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace brigade::elastic {

class WorkerHeartbeat;

struct InjectedFault {
  enum class Kind { kKill, kStop, kSkip, kMismatch, kSlow, kSdc, kNan } kind = Kind::kKill;
  int rank = 0;
  int64_t step = 0;  // after this step completes (counted from 1); slow: none
  int64_t generation = 0;
  int64_t factor = 1;       // slow: this many times the compute time
  int64_t times = 1;        // nan: how many of the step's loss computations are NaN
  bool in_forward = false;  // sdc: during step's forward, not after its update
  bool in_moment = false;   // sdc: in an Adam moment, not a parameter
  bool in_grad = false;     // sdc: in the step's local gradient, before the reduce
};

// Throws Error naming the malformed part and the expected form. A chaos
// part is checked and left out (parse_chaos gives it).
std::vector<InjectedFault> parse_faults(std::string_view spec);

struct ChaosSpec {
  double mtbf_s = 0;
  bool kill = true;
  bool stop = true;
  bool partition = false;   // whole-node: the node's interface taken down
  bool kill_agent = false;  // whole-node: the agent SIGKILLs its workers and itself
  uint64_t seed = 0;
};

// The chaos part of an inject spec, if any. Throws Error for a malformed
// one, or for more than one.
std::optional<ChaosSpec> parse_chaos(std::string_view spec);

// The chaos faults one agent raises, in order. Fault i's interval, kind and
// victim are pure functions of (seed, node, incarnation, i): reproducible,
// and each node of a multi-node job draws its own stream at nnodes times
// the mean interval (the job as a whole at about the spec's MTBF, above).
// `incarnation` is 0 for a node's first agent, the generation it joined at
// for a standby that took the node's place. Node 0 draws its kind among
// the spec's worker kinds only; a node with no kind to draw never falls due.
class ChaosSchedule {
 public:
  enum class Kind { kKill, kStop, kPartition, kKillAgent };
  struct Fault {
    int64_t after_ns = 0;  // since the previous fault (or the job's start)
    Kind kind = Kind::kKill;
    uint64_t victim = 0;  // uniform 64 bits: the caller takes it modulo its candidates
    bool kill() const { return kind == Kind::kKill; }
    bool whole_node() const { return kind == Kind::kPartition || kind == Kind::kKillAgent; }
  };
  ChaosSchedule(const ChaosSpec& spec, int node, int nnodes, int64_t incarnation = 0);
  Fault next();

  // The schedule in time, from `start_ns` (the job's start).
  void start(int64_t start_ns);
  // When the next fault falls due (after start()).
  int64_t due_ns() const { return due_ns_; }
  // The fault due at `now_ns`, if any: the first overdue one. The others
  // overdue with it (they fell due while no worker ran to strike: between
  // generations, or while one stopped) are dropped and counted in *dropped,
  // or they would all strike at once, unlike the faults they stand for.
  std::optional<Fault> take_due(int64_t now_ns, int* dropped);

 private:
  ChaosSpec spec_;
  std::vector<Kind> kinds_;  // this node's, in a fixed order
  uint64_t stream_ = 0;
  double mean_s_ = 0;
  int64_t index_ = 0;
  Fault pending_;
  int64_t due_ns_ = 0;
};

// A whole node's fault, raised by its agent.
struct NodeFault {
  enum class Kind { kKillAgent, kPartition, kHold } kind = Kind::kKillAgent;
  int node = 0;
  int64_t step = 0;  // once every worker of the node completed it (from 1)
  int64_t generation = 0;
  // "kill-agent", "partition" or "hold", as in the spec.
  const char* name() const {
    return kind == Kind::kKillAgent   ? "kill-agent"
           : kind == Kind::kPartition ? "partition"
                                      : "hold";
  }
};

// The kill-agent and partition parts of an inject spec for `brigade
// launch`, whose only other part may be chaos. Throws Error naming a
// malformed part, or a worker's fault (kill, stop, ...: brigade train's).
std::vector<NodeFault> parse_node_faults(std::string_view spec);

// The kill, stop, skip, mismatch or sdc (not when=forward nor what=grad) planned for
// `rank` right after `step` in `generation`, or null.
const InjectedFault* fault_after_step(const std::vector<InjectedFault>& faults, int rank,
                                      int64_t generation, int64_t step);

// The slow fault's factor for `rank` in `generation`: 1 when none.
int64_t slow_factor(const std::vector<InjectedFault>& faults, int rank, int64_t generation);

// The faults the trainer raises inside a step (nan, sdc with when=forward or
// what=grad) planned for `rank` in `generation`.
std::vector<InjectedFault> in_step_faults(const std::vector<InjectedFault>& faults, int rank,
                                          int64_t generation);

// Says so on stderr, stamps the heartbeat (if any) and raises a kill or stop
// on this process. Returns only after a stop, once continued. A skip,
// mismatch or sdc is the caller's to carry out (it owns the collective, or
// the parameters); this only says so, and stamps an sdc (its detection time
// is the check's to show).
void raise_fault(const InjectedFault& fault, WorkerHeartbeat* heartbeat);

}  // namespace brigade::elastic
