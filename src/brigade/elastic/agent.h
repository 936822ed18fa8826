// The agent: supervises one node's workers through generations.
//
// Generation g (0, 1, 2, ...) is one start of the node's workers. Each gets
// BRIGADE_GENERATION=g, which keys what a generation creates that a later one
// could trip over (the communicators' shm segments and store keys, see
// comm/world.h), and a fresh heartbeat table (elastic/heartbeat.h). The agent
// watches the generation:
//   - a crash (a worker exits non-zero or dies of a signal) by waitpid, at
//     once (SIGCHLD wakes it);
//   - a hang by the progress watchdog (elastic/watchdog.h): no heartbeat for
//     2 s, or no step for the step timeout.
// On a failure it first gathers the evidence (elastic/incident_evidence.h:
// the live workers' flight recorders and every worker's heartbeat, in
// RUN_DIR/incidents/<N>/, a bounded wait) and has the launcher's diagnose
// hook name the root cause from it. Then, while restarts are left
// (max_restarts), it SIGKILLs every
// worker of the generation at once, waits for each, records an Incident and
// starts generation g+1: the survivors' state is disposable (the restart
// resumes from the newest complete snapshot or checkpoint, and both survive
// a kill at any moment), and a survivor blocked in a collective with a dead
// or stopped peer would otherwise sit out its timeout. A `brigade train`
// worker is restarted with --resume and the newer of its newest in-memory
// snapshot (elastic/snapshots.h) and the run directory's newest checkpoint;
// any other command is simply run again (torchrun's semantics).
// With no restart left, the others get SIGTERM and, after the grace period,
// SIGKILL, and the agent exits 1 naming the failure.
//
// SIGINT, SIGTERM or SIGHUP to the agent is forwarded to the workers (30 s
// grace: they may be saving; a second signal cuts it short), never
// restarts, and the agent exits 128 + signal.
//
// The agent's status (generation, restarts, incidents, each worker's
// heartbeat slot) is published every tick for the launcher's /metrics
// endpoint (diag/metrics_server.h), which reads it from its own thread.
//
// Across nodes (a coordinator store given) the agents follow one job
// through the coordinator (elastic/coordinator.h), which they poll every
// tick: each agent beats, reports its node's first failure, and stops its
// workers as soon as a failure is reported anywhere (SIGKILL when a restart
// follows); once every node's workers are gone, node 0's agent opens
// generation g+1 for all nodes at once while restarts are left
// (max_restarts counts the job's restarts, not one node's), and every
// agent starts its workers again in place, at the same world size, from the
// newer of the run directory's newest checkpoint and the newest in-memory
// snapshot every node assembled (options.snapshot_sync,
// elastic/snapshot_sync.h: each node's part, replicated to a peer agent,
// gathered from the live nodes and a lost one's peer). A node whose agent
// stops beating (dead, or cut off the network) is lost within about 2 s:
// a standby node's agent (options.standby), which runs no workers and
// waits, takes its node rank in the next generation if the coordinator
// gives it (elastic/standby.h), and runs that node's workers from the
// newest checkpoint or snapshot; with none free the job goes on with the live nodes
// if at least options.min_nnodes are left (`--nnodes MIN:MAX`: each agent
// renumbers its workers by its node's place among them, GROUP_RANK, RANK
// and WORLD_SIZE, and a `brigade train` keeps its global batch with dp
// scaled to the world and grad_accum scaled inversely), else it ends,
// naming the node. The
// agent raises the whole-node faults (NodeFault: kill-agent, partition)
// itself, once its workers completed the fault's step. A launcher's
// signal ends the job on every node, whose workers all get the signal's
// grace (an interrupt checkpoint is collective). Node 0's agent
// writes incidents.jsonl and the summary for the whole job: it learns every
// node's incident through the store, and one writer keeps the file whole.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/fault_injection.h"
#include "brigade/elastic/heartbeat.h"
#include "brigade/elastic/incidents.h"
#include "brigade/elastic/snapshots.h"
#include "brigade/elastic/watchdog.h"
#include "brigade/elastic/worker_group.h"

namespace brigade {
class Config;
}  // namespace brigade

namespace brigade::elastic {

class SnapshotSync;

// The longest the agent's loop sleeps before it looks around again: the
// watchdog's resolution, and how often the coordinator is polled.
inline constexpr int64_t kAgentTickMs = 100;

// The [elastic] section of a training config: what `brigade train --nproc`
// hands its agent, and the faults its workers inject.
struct ElasticConfig {
  // Three restarts ride out the occasional crash or hang of a long job,
  // while a fault that recurs (a bad node, a bug at a given step) still ends
  // the job after four attempts instead of looping.
  int max_restarts = 3;
  double step_timeout_s = 600;
  std::string inject;  // elastic/fault_injection.h's form; empty: none

  // Reads elastic.max_restarts, elastic.step_timeout_s, elastic.inject;
  // throws Error for values out of range or a malformed inject.
  static ElasticConfig from_config(Config& config);
};

struct AgentOptions {
  Program program;
  // Every worker's variables except RANK, LOCAL_RANK and the agent's own
  // (BRIGADE_GENERATION, BRIGADE_HEARTBEAT_FD).
  Environment environment;
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  int max_restarts = 0;
  // The command is `brigade train`: restarts add --resume.
  bool brigade_train = false;
  // Where the workers write in-memory snapshots (elastic/snapshots.h), also
  // in `environment`; empty: none.
  std::string snapshot_dir;
  // Multi-node: replicates this node's snapshot parts and gathers every
  // node's at a restart (elastic/snapshot_sync.h); null: no snapshots
  // across nodes. The launcher owns it.
  SnapshotSync* snapshot_sync = nullptr;
  // After a failure with no restart left, how long the others get to exit
  // on SIGTERM before SIGKILL.
  int64_t failure_grace_ms = 5'000;
  // After the user's signal: longer, since the workers may be saving.
  int64_t signal_grace_ms = 30'000;
  WatchdogOptions watchdog;
  // Multi-node: the store the job's coordinator keeps its state in
  // (elastic/coordinator.h). Null on one node.
  CoordinatorStore* store = nullptr;
  // Names an incident's root cause from its evidence directory, one line
  // (the launcher passes diag/root_cause.h's, a layer above); empty: none.
  // Its line goes to stderr and into the incident's `cause`.
  std::function<std::string(const std::filesystem::path&)> diagnose;
  // Called with an incident's evidence directory once the incident is
  // resolved and its record written (node 0's agent): the launcher writes
  // the incident's timeline then (diag/incident_trace.h), off the restart's
  // path and once every node's evidence is in; empty: none.
  std::function<void(const std::filesystem::path&)> resolved;
  // Random faults on this node's workers (elastic/fault_injection.h's
  // chaos), for as long as the job runs; none when unset.
  std::optional<ChaosSpec> chaos;
  // The fewest nodes the job may go on with (`--nnodes MIN:MAX`) when
  // nodes are lost and no standby is free; 0: nnodes.
  int min_nnodes = 0;
  // A `brigade train` job's parallel.dp and train.grad_accum on all nnodes
  // nodes (0: not known). On fewer nodes its workers run with dp scaled to
  // the world and grad_accum scaled inversely, so that every step still
  // sums the same global batch: node 0's, scaled by the leader and read by
  // every agent from the store (a standby's and a follower's own are not
  // used).
  int train_dp = 0;
  int64_t train_grad_accum = 0;
  // A standby node's agent (multi-node only): node_rank is not used; it
  // waits until the coordinator gives it a lost node's.
  bool standby = false;
  // This machine's id for the quarantine (CoordinatorOptions::host); empty:
  // its host name.
  std::string node_id;
  // "HOST:PORT" of the workers' store this node's launcher hosts
  // (CoordinatorOptions::worker_store): with etcd, whichever node leads
  // a generation has its workers meet there. Empty: MASTER_ADDR and
  // MASTER_PORT of `environment` serve every generation.
  std::string worker_store;
  // Whole-node faults (kill-agent, partition) this agent raises when they
  // are its node's and generation's.
  std::vector<NodeFault> node_faults;
  // The interface a partition takes down: the one that carries this node's
  // traffic to the others (the launcher checks it is no loopback).
  std::string partition_iface;
};

// What the agent saw at its last look (every 100 ms or sooner), for the
// metrics endpoint (diag/prometheus.h), which reads it from its own thread.
struct AgentStatus {
  struct Worker {
    int rank = 0;
    int local_rank = 0;
    bool running = false;
    WorkerProgress progress;
  };
  int node_rank = 0;
  int64_t generation = 0;
  int restarts = 0;
  int incidents = 0;
  int64_t taken_ns = 0;         // when (core/clock.h's now_ns, the heartbeats' clock)
  std::vector<Worker> workers;  // this node's, by local rank; empty between generations
};

class Agent {
 public:
  explicit Agent(AgentOptions options);

  // Runs generations until one ends: 0 when every worker exited 0, 1 for a
  // failure with no restart left (or on another node), 128 + signal when
  // stopped by a signal. Call with the watched signals blocked
  // (BlockedSignals); `child_mask` is the mask workers start with.
  int run(const sigset_t& child_mask);

  const std::vector<Incident>& incidents() const { return incidents_; }
  int restarts() const { return restarts_; }
  // Safe to call from any thread while run() runs.
  AgentStatus status() const;
  // After run(), multi-node: the nodes whose loss ended the job (none: empty),
  // and whether this agent lost the coordinator itself (its store no
  // longer answers in time, so the launcher should not wait on it).
  const std::vector<int>& lost_nodes() const { return lost_nodes_; }
  bool lost_coordinator() const { return lost_coordinator_; }
  // After run(), multi-node: every node that is out of the job, lost at its
  // end or left out of a generation before (the job went on with fewer).
  std::vector<int> nodes_out() const;
  // The node this agent ran (a standby's once given one; -1 before), and a
  // standby's id (-1 for a node's agent).
  int node_rank() const { return options_.node_rank; }
  int standby_id() const { return coordinator_ ? coordinator_->standby_id() : -1; }
  // Multi-node: this agent led the job at its end (node 0's, or with etcd
  // the one elected in its place).
  bool led() const { return coordinator_ && coordinator_->leader(); }
  // The run directory the workers named (empty: not brigade train, or none).
  const std::string& run_dir() const { return run_dir_; }
  // This agent writes the run's records (incidents.jsonl, the summary, the
  // marks in the run's traces): one node's, so that one writer keeps each
  // file whole. Alone, node 0's; across nodes the leader's at the end,
  // unless it was cut off from the job (an electing store may have a new
  // leader writing there). False before the run directory is known.
  bool writes_run_records() const;
  // The last generation this agent ran (0: the first; its workers' trace is
  // trace.json, generation G's trace.gen<G>.json).
  int64_t generation() const { return generation_; }
  // The signal that stopped the job (0: none): the launcher's end is then
  // bounded (someone is waiting for it to go).
  int received_signal() const { return received_signal_; }

 private:
  enum class Outcome { kSucceeded, kFailed, kSignalled, kRemoteFailure };
  Outcome supervise(WorkerGroup& group, const HeartbeatTable& table);
  void on_failure(WorkerGroup& group, const HeartbeatTable& table, Incident incident);
  void check_watchdog(WorkerGroup& group, const HeartbeatTable& table);
  // Raises the chaos fault that is due, if any; returns the ms until the next.
  int64_t inject_chaos(WorkerGroup& group, const HeartbeatTable& table);
  void gather_evidence(const WorkerGroup& group, const HeartbeatTable& table, Incident& incident);
  void check_recovery(const HeartbeatTable& table);
  void publish_status(const WorkerGroup& group, const HeartbeatTable& table);
  void end_generation(const HeartbeatTable& table);
  Program program_for_generation() const;
  std::optional<ResumePoint> resume_point() const;
  // On the way out after a failure: a snapshot newer than every checkpoint
  // becomes a checkpoint, so the user can resume from it.
  void keep_newest_snapshot() const;
  // Lost the coordinator where the job may go on without this node (an
  // electing store: deposed, or declared lost): its run directory is the
  // new leader's, so this node writes nothing there.
  bool cut_off_from_job() const;
  // Multi-node: acts on where the job stands (stops `group`, if any, for a
  // failure anywhere or the job's end), and after a generation waits for
  // the coordinator's decision: kFailed with will_restart_ to restart.
  void follow_job(const JobView& view, WorkerGroup* group);
  // Keeps when the store last answered; at the poll that found it gone,
  // what this node's failure is should the store answer again in time
  // (store_lost_).
  void note_store_loss(const JobView& view, const HeartbeatTable& table);
  Outcome settle_generation(Outcome outcome);
  // The store lost, the workers stopped: tries it again until the leader
  // has surely declared this node lost (twice agent_timeout_ms after it
  // last answered). True once it answered (and, with `report`, took
  // store_lost_ as this node's failure: the job restarts in place). False
  // to leave (remote_failure_ says why), on a signal (received_signal_), or
  // when the store answered with the job's end (lost_coordinator_ false:
  // the end is read as any node's).
  bool regain_store(bool report);
  // A standby: waits for a node (true: options_.node_rank and generation_
  // are set), or returns false with *status the launcher's exit status.
  bool wait_for_a_node(int* status);
  // This node's workers wait after the step of its next node fault in this
  // generation (none: they do not wait), so that it strikes at that step.
  void hold_for_node_faults(const HeartbeatTable& table) const;
  // Raises this node's whole-node fault once its workers completed its step.
  void raise_node_fault(WorkerGroup& group, const HeartbeatTable& table);
  // Tells the coordinator the fault's kind, then raises it on this node
  // now: a kill-agent does not return; a partition returns why the
  // interface could not be taken down (empty once it is down).
  std::string strike_node(const NodeFault& fault, WorkerGroup& group);
  void record_job_incident(const JobView& view);
  // The last step the node's workers completed and their mean step time.
  void measure_progress(const HeartbeatTable& table, Incident& incident);
  // Numbers this node's workers among the nodes of the generation the
  // coordinator opened (fewer after a node was left out).
  void take_membership();
  // Multi-node, before a restarted generation's workers start: every
  // node's part of the newest snapshot complete everywhere, assembled in
  // this node's area (options_.snapshot_sync), if every node could. The
  // agent keeps beating meanwhile (Coordinator::keep_alive). A node without
  // snapshots (its area could not be set up) says "none" at once.
  void restore_snapshot();
  // A `brigade train` on fewer nodes than it started on: the --set
  // arguments that keep its global batch (empty on every node).
  std::vector<std::string> fewer_nodes_args() const;
  void report_end(const std::string& why);
  void write_incidents(bool final);
  // Learns run_dir_ (and incident_base_) from the workers' heartbeats.
  void learn_run_dir(const HeartbeatTable& table);
  int finish(Outcome outcome, int stopped);

  AgentOptions options_;
  // This node's rank among the generation's nodes, and their number.
  int group_rank_ = 0;
  int group_nodes_ = 1;
  int64_t generation_ = 0;
  int restarts_ = 0;
  int64_t start_ns_ = 0;
  std::string run_dir_;             // as the workers said; empty for other programs
  bool run_dir_published_ = false;  // node 0: the coordinator has it
  // Incident numbers this launch gives are this plus the generation's
  // (from 1): the same on every node sharing the run directory, after a
  // resumed run's earlier incidents. Read once, when the run directory is
  // learned (generation 0's set-up, before this launch's first incident).
  std::optional<int64_t> incident_base_;
  std::vector<Incident> incidents_;
  std::vector<GenerationRecord> generations_;
  // The generation now running failed (the first failure wins).
  std::optional<Incident> failure_;
  // How this generation's ended workers ended (wait status), by rank.
  std::map<int, int> exits_;
  bool will_restart_ = false;
  // The workers are stopping for a rejoin, with the signal's grace.
  bool stopping_for_rejoin_ = false;
  int received_signal_ = 0;
  std::string remote_failure_;
  int stopped_count_ = 0;
  std::optional<Coordinator> coordinator_;
  // When this agent first saw the current generation failing.
  int64_t failing_seen_ns_ = 0;
  std::vector<int> lost_nodes_;
  bool lost_coordinator_ = false;
  // When a poll last reached the store, and (this generation) the failure
  // this node reports if it reaches the store again after losing it.
  int64_t store_answered_ns_ = 0;
  std::optional<Incident> store_lost_;
  std::optional<ChaosSchedule> chaos_;
  int chaos_raised_ = 0;
  JobProgress progress_;            // the highest step this agent's generations completed
  double machine_peak_gflops_ = 0;  // rank 0's, once measured
  // A whole-node chaos fault struck this node (cut off): it raises no more.
  bool chaos_node_struck_ = false;
  int chaos_skipped_ = 0;  // overdue together with a raised one, or no worker to strike
  std::vector<bool> node_fault_raised_;
  mutable std::mutex status_mutex_;
  AgentStatus status_;
};

}  // namespace brigade::elastic
