// The coordinator: one job's membership and generations across nodes.
//
// Every node's agent (elastic/agent.h) holds a Coordinator over the job's
// rendezvous store and calls poll() every tick (100 ms). All of its state
// lives in the store, under "brigade/coord/", so that any agent can read
// where the job stands and a store with leases (etcd) can later hold the
// same keys behind the same small CoordinatorStore interface:
//   agent/<node>/beat             a counter each agent adds to every 200 ms
//   gen/<g>/reports               how many nodes reported a failure in g
//   gen/<g>/failure/<node>        that node's failure report (JSON)
//   gen/<g>/stopped/<node>        "ok" or "failed": every worker of the node's
//                                 generation g has exited and been reaped
//   gen/<g>/cause                 the report the job's incident is made of
//   gen/<g+1>/members             the nodes of g+1 (original ranks in order,
//                                 "0 2"): a node's rank in g+1 is its
//                                 position, the node count their number
//   gen/<g+1>/open                "<g+1>": generation g+1 may start
//   end                           why the job ends (JSON), once and for all
//   run_dir                       where the job's workers write (node 0's)
//   end/claims                    a counter: the agent that adds 1 first writes
//                                 `end`; unwritten after agent_timeout_ms (its
//                                 agent died in between), the leader writes its own
// The leader (node 0's agent, or with etcd one elected in its place) watches
// every agent's beat and decides.
//   - A failure reported anywhere in g stops every node's workers (each
//     agent sees reports > 0 on its next poll). Once every node has said its
//     workers of g are gone, the leader picks the likeliest cause among the
//     reports (an injected fault, then a node that lost the store, then a
//     worker killed by a signal, then a hang, then an error exit, which is
//     most often a peer's death seen through a collective), and opens g+1
//     for all nodes at once while
//     restarts are left (g < max_restarts: restarts are counted across the
//     job, never per node), else ends the job with that cause.
//   - An agent whose beat has not moved for agent_timeout_ms (2 s: its
//     agent died, hangs, or its node lost its network) is lost. With a
//     restart left and a standby node free for it besides one for each
//     node already lost in g (elastic/standby.h: one whose beat the leader
//     saw move within agent_timeout_ms), the leader marks
//     the node lost (node/<n>/lost = g), counts a report in g so that every
//     other node stops its workers, and once they are reaped gives the
//     node's rank to the standby (gen/<g+1>/node/<n> = "standby <s>", and
//     the standby's own key) before it opens g+1: the standby runs the lost
//     node's workers, at the same world size, so the result stays the same.
//     The lost node is the generation's cause (its kind "node_lost", or
//     "partition" when its agent said it cut its own network: an injected
//     fault writes gen/<g>/node_fault/<n> first). With no standby free or
//     no restart left the job ends naming the node (and every node lost
//     with it), unless the job may go on with fewer nodes (min_nnodes,
//     `--nnodes MIN:MAX`): with a restart left and at least min_nnodes
//     nodes still live, the leader opens g+1 with the live nodes only
//     (gen/<g+1>/members; the leader stays among them), each agent's
//     workers renumbered by its position there. At the decision every lost
//     node gets a live standby, or, when fewer nodes are allowed, those
//     without one are left out (standbys first); otherwise none does and
//     the job ends: a standby that died meanwhile is not replaced by half a
//     job. A standby given a node that the leader then
//     declared lost again in that generation (it was too slow to start)
//     leaves without starting workers.
//   - The other agents watch the leader's beat the same way, and treat a
//     store that no longer answers (each call is bounded by the store
//     client's timeout, at most half of agent_timeout_ms, so that one slow
//     call cannot make a healthy agent look silent) as its own end
//     (lost_coordinator): it stops its workers at once and writes nothing
//     that could end a healthy job when the store was only slow. If the
//     store answers again while the node is still in the job
//     (regain_store()), the node reports the loss as its failure (kind
//     "store_lost": its peers' deaths are its consequences) and every node
//     restarts in place; a loss once its part is in (its stop being
//     reported, or the generation's decision awaited) is regained without
//     a report: there is nothing more to say. Otherwise it leaves, and the
//     leader finds it silent within agent_timeout_ms and gives its rank to
//     a standby or stops every node, so node 0's workers do not sit in
//     collectives with this node's until the collective timeout. An agent
//     that finds the leader silent still tries once to end the job for
//     everyone.
// With the built-in store node 0 leads for good: its launcher hosts the
// store, so its loss ends the job. With a store that elects a leader
// (etcd: CoordinatorStore::elects_leader()), node 0 campaigns first and
// leads while its lease lives (renewed on its beat); when the leader's
// beat stops for agent_timeout_ms, every other node's agent campaigns
// for the leader key, and the one whose create-if-absent transaction
// lands once the old leader's lease ran out leads from then on
// (take_over()): it reads the job's state where the old leader left it
// in the store (the generation, its members and restarts, nodes already
// declared lost, which standby holds which node), watches every node's
// beat afresh and treats the old leader's node as any silent node: lost,
// a standby in its place or the job going on with fewer nodes. The others
// follow the new leader's beat. A deposed leader that still runs (it was
// cut off for longer than its lease) finds its lease gone on its next
// beat and ends for itself; its writes in between are refused by the
// store (fenced by its leadership), never mixed into its successor's.
//   - Rejoin (scale up, elastic/coordinator_rejoin.cc): while the job runs
//     on fewer nodes than it started with, a joiner (`brigade launch
//     --standby`, started on a recovered or a new machine) that has beaten
//     for agent_timeout_ms grows it back at the next generation: the
//     leader writes gen/<g>/rejoin = "<standby> <node>" and counts a report
//     in g; every agent stops its workers with SIGTERM and the signal's
//     grace (JobView::rejoin), so that they agree on a step boundary and
//     save an interrupt checkpoint there (no step is lost); once all are
//     reaped the leader gives the left-out node rank to the joiner (the
//     lowest first), opens g+1 with it among the members and the layout
//     scaled back up (absent at every node: node 0's own). A rejoin uses no
//     restart: gen/<g>/restarts holds the restarts used up to g (absent:
//     g). It is bounded instead: a machine (--node-id, else its host name:
//     agent/<n>/host or standby/<s>/host) declared lost twice is
//     quarantined (host/<h>/losses), and its joiner is refused
//     (standby/<s>/refused, why) rather than readmitted; a joiner silent
//     by the time every node stopped aborts the rejoin (g+1 as g) and
//     counts as a loss of its machine. A rejoin is one only while it is g's
//     sole report: a node lost or a failure reported in g besides (but a
//     worker that exited 128 + SIGTERM or SIGINT, the rejoin's own stop
//     seen before its agent saw the rejoin) makes g's stop a failure's
//     (SIGKILL, a restart used), and agents that began stopping with the
//     signal's grace escalate.
// A lost node never comes back into the job: its agent, should it come
// back (it was stopped, or its network returns), finds node/<n>/lost at
// or after its generation on its next poll and ends for itself without
// writing anything; an end it wrote before it knew (an end carries its
// writer's node and generation, "by" and "by_generation") is not taken by
// the others, and the next end written overwrites it.
// No agent or worker of generation g can join g+1: the leader opens g+1
// only after every node reported g's workers reaped, and the workers of g
// key their store entries and shm segments by BRIGADE_GENERATION
// (comm/world.h), so a straggler of g meets nobody of g+1.
// Values are checked as they are read: a malformed one (only a holder of
// the job's token can write at all) ends the job with an Error naming the
// key, never taken for a decision.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/elastic/incidents.h"

namespace brigade {
class TcpStore;
}  // namespace brigade

namespace brigade::elastic {

// What the coordinator needs of a key-value store: all of it atomic per key.
class CoordinatorStore {
 public:
  virtual ~CoordinatorStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value, or nullopt when the key does not exist; never waits for it.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Adds delta to the decimal counter under key (absent: 0); returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // "host:port" or the like, for messages.
  virtual std::string address() const = 0;
  // The longest one call may take before it throws Error.
  virtual int64_t call_timeout_ms() const = 0;

  // Leader election, in a store with leases (etcd), so that the job
  // survives the loss of any one node, node 0's included. The built-in
  // store elects nobody: node 0's launcher hosts it, so node 0 leads for
  // good and its loss ends the job.
  virtual bool elects_leader() const { return false; }
  // Makes `node` the leader unless another node leads, bound to this
  // agent's lease of lease_ms (granted afresh unless alive, kept by
  // renew_lease()); returns the node that leads, nullopt while none does.
  virtual std::optional<int> campaign_for(int node, int64_t lease_ms) {
    (void)node;
    (void)lease_ms;
    return 0;
  }
  // The node that leads, without campaigning; nullopt while none does.
  virtual std::optional<int> leading_node() { return 0; }
  // Renews the lease the leader's key is bound to; false once it expired
  // (this agent was silent for longer: another may lead now).
  virtual bool renew_lease() { return true; }
};

// The built-in backend: comm/tcp_store.h, whose every call presents the
// job's token (the connection is refused without it).
class TcpCoordinatorStore : public CoordinatorStore {
 public:
  explicit TcpCoordinatorStore(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string address() const override;
  int64_t call_timeout_ms() const override;

 private:
  TcpStore& store_;
};

// A write refused because this agent no longer leads: with an electing
// store, the leader key it took expired (it was silent for longer than
// its lease) or another node holds it now.
class NotLeader : public Error {
 public:
  using Error::Error;
};

// A value under brigade/coord/ that no agent of this job would write: only
// a holder of the token can have written it, and it is refused rather than
// taken for a decision. Unlike a lost store, the store still answers.
class MalformedValue : public Error {
 public:
  MalformedValue(const std::string& key, const std::string& value, const std::string& expected);
};

class StandbyPool;

struct CoordinatorOptions {
  int nnodes = 1;
  // The fewest nodes the job may go on with when nodes are lost and no
  // standby is free for them; 0: nnodes (never fewer).
  int min_nnodes = 0;
  // Node 0's `brigade train` layout on all nnodes nodes (0: not known). On
  // fewer nodes the leader scales it (dp with the nodes, grad_accum
  // inversely: the same global batch) and writes it for every agent, so
  // that no node computes its own from a config of its own.
  int64_t train_dp = 0;
  int64_t train_grad_accum = 0;
  int node_rank = 0;  // ignored for a standby, until it is given a node
  // A standby node's agent (elastic/standby.h): it registers, beats and
  // waits for a lost node's rank.
  bool standby = false;
  int max_restarts = 0;
  // This machine, for the quarantine of machines lost twice (a rejoin):
  // `brigade launch --node-id` or env BRIGADE_NODE_ID (check_node_id());
  // empty: its host name, which every node on one machine shares (loopback
  // tests, containers), so that two losses there refuse every joiner.
  std::string host;
  // "HOST:PORT" of the store this node's launcher hosts for the workers'
  // rendezvous (comm/world.h), which the leader publishes as
  // gen/<g>/worker_store with every generation it opens; empty: none (the
  // built-in backend: node 0's store serves every generation).
  std::string worker_store;
  int64_t beat_interval_ms = 200;
  // Two seconds without a beat: a loaded machine's agent still beats ten
  // times over, and a lost node is named within the 3 s the issue allows.
  int64_t agent_timeout_ms = 2'000;
};

// Where the job stands for this agent's generation.
struct JobView {
  enum class State {
    kRunning,    // nothing reported
    kFailing,    // a failure was reported: stop the workers, report stopped()
    kRestart,    // generation + 1 is open: enter() it and start the workers;
                 // for a standby: it was given node_rank() from generation()
                 // on, which is open (no enter: start the workers)
    kSucceeded,  // every node's workers of this generation exited 0 (for a
                 // waiting standby: the job is over without needing it)
    kEnded,      // the job ends: `why`
  };
  State state = State::kRunning;
  // kFailing: whether the leader will open the next generation (restarts left).
  bool will_restart = false;
  // kRestart and kEnded (but for a signal): the job's incident. Its
  // detected_ns is 0 and its fault_ns that much earlier: the reader places
  // both on its own clock (nodes' clocks are not compared).
  std::optional<Incident> cause;
  std::string why;
  // kEnded for a lost node: its rank; -1 otherwise.
  int lost_node = -1;
  // kEnded for a lost node: every node the job lost (lost_node among them;
  // more when several were lost at once), whose launchers never say done.
  std::vector<int> lost_nodes;
  // kEnded because this agent lost the store or the leader.
  bool lost_coordinator = false;
  // kEnded (lost_coordinator) because a store call failed: the store may
  // answer again, and this node may still be in the job (regain_store()).
  bool store_unreachable = false;
  // kFailing for a rejoin, not a failure: stop the workers as on a signal
  // (they save a checkpoint at a step boundary), not with SIGKILL.
  bool rejoin = false;
  // A standby's kRestart: the run directory the job's nodes published (its
  // workers resume from its newest checkpoint); empty if none did.
  std::string run_dir;
  // kEnded because a launcher received a signal: the workers may be saving
  // (an interrupt checkpoint is collective), so every node gives them the
  // signal's grace, not the failure's.
  bool signal = false;
};

class Coordinator {
 public:
  // Registers this node's agent (its first beat). Throws Error if the store
  // cannot be reached, or if its calls may take more than half of
  // agent_timeout_ms.
  Coordinator(CoordinatorStore& store, CoordinatorOptions options, int64_t now_ns);
  ~Coordinator();

  int64_t generation() const { return generation_; }
  // The job's restarts so far: its generations less its rejoins.
  int64_t restarts_used() const { return restarts_used_; }
  // This agent leads: node 0's, or with an electing store the one that
  // took over from a lost leader.
  // A deposed leader (its lease ran out, deposed_view()) leads no more.
  bool leader() const {
    return !options_.standby && !deposed_ && options_.node_rank == leader_node_;
  }
  // With an electing store the job may go on without this node once it
  // lost the coordinator, so it writes nothing into the shared run directory.
  bool elects_leader() const { return store_.elects_leader(); }
  // This agent led, but its lease ran out (or the store refused a write as
  // not the leader's): from now it is not the leader, and it leaves.
  JobView deposed_view();
  // The node whose agent leads (node 0 until another took over).
  int leader_node() const { return leader_node_; }
  // A standby still waiting for a node.
  bool standby() const { return options_.standby; }
  // This agent's node: a standby's once given one, -1 before.
  int node_rank() const { return options_.standby ? -1 : options_.node_rank; }
  // A standby's id (elastic/standby.h), given or not a node; -1 for a node's agent.
  int standby_id() const { return standby_id_; }
  // The nodes of this generation (their original ranks, in order): every
  // node until the job went on with fewer. A node's workers are numbered
  // by member_index() of member_count() nodes.
  const std::vector<int>& members() const { return members_; }
  int member_index() const;
  int member_count() const { return static_cast<int>(members_.size()); }
  // The nodes the leader declared lost and gave no standby (lost/<n>
  // without gen/<g+1>/replaced/<n>), read from the store: out of the job
  // even before this agent entered the generation that leaves them out.
  // Throws Error when the store does not answer.
  std::vector<int> nodes_lost_unreplaced() const;
  // The `brigade train` layout the leader wrote for this generation
  // (gen/<g>/train_layout), when it runs on fewer nodes than the job
  // started with; nullopt otherwise. Every agent passes it to its workers.
  struct TrainLayout {
    int64_t dp = 0;
    int64_t grad_accum = 0;
  };
  const std::optional<TrainLayout>& train_layout() const { return layout_; }
  // Where this generation's workers meet (gen/<g>/worker_store: the
  // leader's store, when it opened the generation with one); nullopt: the
  // launch's own (MASTER_ADDR, MASTER_PORT as given).
  struct WorkerStore {
    std::string host;
    uint16_t port = 0;
  };
  const std::optional<WorkerStore>& worker_store() const { return worker_store_; }

  // The leader: node `node`'s loss as it declared it in this generation,
  // on this agent's clock (fault_ns the beat's last move, detected_ns the
  // verdict); null when it declared no such loss, or when a leader before
  // it did (taken over: no stamps of this agent's own).
  const Incident* declared_lost(int node) const {
    const auto it = lost_.find(node);
    if (it == lost_.end() || inherited_lost_.contains(node)) return nullptr;
    return &it->second;
  }

  // This node raises a whole-node fault now (elastic/fault_injection.h's
  // NodeFault: "kill-agent" or "partition"), so that the leader records
  // the node's loss as that. Throws Error if the store did not take it.
  void mark_node_fault(const std::string& kind);
  // The leader, at the end of the job: every standby still waiting exits.
  void release_standbys();
  // The leader, once its workers said where they write: a standby that takes a
  // node's place resumes from there. Throws Error if the store did not take it.
  void publish_run_dir(const std::string& run_dir);

  // This node's first failure in the current generation (later ones are
  // consequences); `incident.node` is set here. Throws Error if the store
  // did not take it; the report is then sent again by the next call of
  // report_failure(), report_stopped() or poll().
  void report_failure(Incident incident);
  // Ends the job now, with no restart (a launcher received a signal).
  void report_end(const std::string& why);
  // Every worker of this node's current generation has exited and been
  // reaped; all of them exited 0 when `succeeded`.
  void report_stopped(bool succeeded);

  // Beats, leads (the leader), and says where the job stands, at time now_ns
  // (core/clock.h's clock; only differences are used, never compared across
  // nodes). Store errors and malformed values come back as kEnded with the
  // error in `why`: the agent must stop its workers either way.
  JobView poll(int64_t now_ns);
  // While the agent is busy with something that may take longer than
  // agent_timeout_ms (a snapshot restore between generations, an
  // incident's evidence and root cause at a failure): only beats, so
  // nobody takes this agent for lost, and decides nothing (the next poll()
  // does). False once there is no point going on: the job's end is written,
  // this node was declared lost, or the store is gone.
  bool keep_alive(int64_t now_ns);

  // After poll() said the store did not answer (store_unreachable) and the
  // agent stopped its workers: the store is tried again. When it answers
  // and this node is still in the job (not declared lost, the job not
  // ended, its lease alive if it led), `incident` becomes this node's
  // failure report (unless one of its own came first) and the agent beats
  // again: the leader stops every node and restarts them in place, the
  // same world size, rather than finding this node silent and going on
  // without it. Without an incident (the loss came once this node's part
  // was in: its stop reported, the decision awaited) it only beats again.
  // Its view of the other agents' beats starts afresh: it saw none while
  // it was cut off. Returns nullopt then, or the view to leave by (kEnded);
  // throws Error while the store still does not answer.
  std::optional<JobView> regain_store(std::optional<Incident> incident, int64_t now_ns);
  int64_t agent_timeout_ms() const { return options_.agent_timeout_ms; }

  // Moves to the generation the last poll() said is open. Throws Error if
  // none is (an agent that did not take part in the previous generation
  // never joins the next).
  void enter_next_generation();

 private:
  JobView read_state();
  // A standby waiting: its assignment, the job's end, or the leader's loss.
  JobView standby_poll(int64_t now_ns);
  // The generation this node's agent was declared lost in, if it was at
  // or after its own (it came back too late); never for the leader or a
  // standby still waiting.
  std::optional<int64_t> lost_in();
  std::optional<JobView> check_not_lost();
  // Whether `end` was written by a node declared lost after it wrote it
  // (too late to stop the job, which went on without it).
  bool end_from_lost_node(const std::string& value);
  // The leader: a silent node is lost; with a standby free and a restart left
  // the job goes on without it.
  std::optional<JobView> on_silent_node(int node, int64_t now_ns);
  Incident lost_incident(int node, int64_t now_ns);
  // The leader: gives every lost node of the generation to a free standby;
  // false when none is free for one of them.
  bool replace_lost_nodes(int64_t now_ns, Incident& cause);
  // The leader: whether the job may go on without `lost` of its nodes.
  bool may_go_on_with_fewer(size_t lost) const;
  // Node 0's train layout scaled to `nodes` nodes; nullopt when not known
  // or not whole there.
  std::optional<TrainLayout> scaled_layout(size_t nodes) const;
  // The leader: writes gen/<g+1>/train_layout for next_members_ (fewer nodes).
  void write_next_layout();
  // Reads gen/<g>/train_layout (absent: every node's own layout).
  std::optional<TrainLayout> read_layout(int64_t g);
  // Reads gen/<g>/worker_store; the leader writes its own before it opens g.
  std::optional<WorkerStore> read_worker_store(int64_t g);
  void write_worker_store(int64_t g);
  // The leader: leaves the lost nodes without a standby out of generation g+1.
  void leave_out(const std::vector<int>& nodes, Incident& cause);
  bool member(int node) const;
  // elastic/coordinator_rejoin.cc. Writes this agent's host name.
  void register_host();
  // The leader: counts a loss against the machine that held `node`.
  void count_loss(int node);
  // The leader, while nothing is reported: grows the job when a settled joiner
  // and a left-out node are there (a report in g with gen/<g>/rejoin).
  void maybe_grow(int64_t now_ns);
  // The leader, every node stopped for a rejoin: the joiner takes its node,
  // g+1 opens with it (as it was, if the joiner went silent meanwhile).
  void grow(int64_t now_ns, int standby, int node);
  // The rejoin of generation g (standby, node), once the leader decided it.
  std::optional<std::pair<int, int>> read_rejoin(int64_t g);
  // gen/<g>/restarts (absent: g).
  int64_t read_restarts(int64_t g);
  // A standby whose machine was quarantined: refused, why.
  std::optional<JobView> check_refused();
  // The leader: checks the agents' beats and turns reports into decisions.
  std::optional<JobView> lead(int64_t now_ns);
  // The leader's beat, seen from the other nodes; with an electing store,
  // a silent leader is replaced (a node's agent campaigns, a standby
  // follows whoever won) rather than ending the job.
  std::optional<JobView> watch_leader(int64_t now_ns);
  // This agent won the leader key from `old`, silent: it leads from the
  // job's state in the store, `old` a silent node.
  void take_over(int old, int64_t now_ns);
  // Another node leads now: its beat is watched from now_ns.
  void follow(int node, int64_t now_ns);
  // Which standby holds node n (the key its agent beats under): the latest
  // gen/<g>/node/<n> up to this generation; none leaves the node's own.
  void read_holder(int n);
  bool beat_moved(int node, int64_t now_ns);
  std::optional<Incident> choose_cause();
  // Every node's failure report in this generation (a node's own report
  // never has kind "rejoin": that is the leader's cause only).
  std::vector<Incident> read_failures();
  // A failure report that a rejoin's stop explains: a worker that exited
  // on SIGTERM or SIGINT (128 + the signal: `brigade train` after its
  // interrupt checkpoint).
  static bool stopped_by_rejoin(const Incident& i);
  // The rejoin is this generation's only report: no node lost in it, no
  // failure but those the rejoin's stop explains.
  bool rejoin_only();
  nlohmann::json signed_end(nlohmann::json end) const;
  void end_job(const nlohmann::json& end);
  // The leader ends the job with `end`, unless another agent's end came first.
  std::optional<JobView> lead_end(const nlohmann::json& end, int64_t now_ns);
  JobView ended_view(const std::string& value);
  void send_report();
  // A non-leader that lost the coordinator tells the other nodes, once, if
  // the store still takes it.
  void try_end_job(const std::string& what);

  CoordinatorStore& store_;
  CoordinatorOptions options_;
  int standby_id_ = -1;
  std::string beat_key_;  // this agent's own
  // The leader: the standbys, and the nodes lost in this generation (the
  // incident each is, by node).
  std::unique_ptr<StandbyPool> standbys_;
  std::map<int, Incident> lost_;
  // Of lost_, the nodes a deposed leader declared lost (take_over rebuilt
  // them with the takeover's time as both stamps).
  std::set<int> inherited_lost_;
  // Per node: the key its agent beats under (a standby that took a node's
  // place keeps its own).
  std::vector<std::string> beat_keys_;
  // The nodes of this generation and, once the leader opened the next, of
  // that one (original ranks, in order).
  std::vector<int> members_;
  std::vector<int> next_members_;
  std::optional<TrainLayout> layout_;
  std::optional<TrainLayout> next_layout_;
  std::optional<WorkerStore> worker_store_;
  std::optional<WorkerStore> next_worker_store_;
  int64_t generation_ = 0;
  int64_t next_beat_ns_ = 0;
  bool reported_failure_ = false;
  std::optional<Incident> pending_report_;  // not in the store yet
  bool tried_end_ = false;
  // Since when the leader has found the end claimed but not written.
  std::optional<int64_t> end_unwritten_since_ns_;
  bool reported_stopped_ = false;
  bool next_open_ = false;
  // Per node: the last beat value seen and when it changed (this agent's clock).
  std::vector<int64_t> last_beat_;
  std::vector<int64_t> beat_changed_ns_;
  int64_t restarts_used_ = 0;
  int64_t next_restarts_ = 0;
  // The leader: per node, the standby holding it (-1: the node's own agent),
  // whose machine a loss counts against.
  std::vector<int> holder_;
  // The node that leads, and (a new leader) until when it watches the
  // standbys' beats before it decides on a silent node: a standby it has
  // not yet seen beating would not be free.
  int leader_node_ = 0;
  bool deposed_ = false;
  int64_t settle_until_ns_ = 0;
  // A new leader: the node it took over from and when. That node's loss was
  // known then (silent past agent_timeout_ms, its lease gone); the settling
  // after it is the recovery's, not the detection's.
  int taken_from_ = -1;
  int64_t taken_over_ns_ = 0;
};

// Throws Error unless `id` can name a machine (CoordinatorOptions::host):
// 1..128 characters, none of them '/', a space or a control character (it
// is part of a store key).
void check_node_id(const std::string& id);

// Key names, for the agent's messages and the tests.
std::string coordinator_key(const std::string& suffix);

}  // namespace brigade::elastic
