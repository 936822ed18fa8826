// What the agents of a multi-node job agree on about in-memory snapshots
// (issue 14, scope 4), through the coordinator's store:
//   gen/<g>/replica/<node>    "host:port" of node's ReplicaServer in g
//                             (elastic/snapshot_replica.h)
//   gen/<g>/snapshot/<node>   the newest step of node's snapshot part
//                             (ckpt/node_part.h) that is written in its
//                             area AND kept by its peer, in generation g
//   gen/<g>/written/<node>    the newest part written, once g's workers
//                             are gone (its owner serves it, kept or not)
//   gen/<g>/restore/<node>    the step node assembled for its restart
//                             into generation g, or "none"
//   gen/<g>/restore/decision  what every member of g resumes from: a step
//                             or "none", written once (restore_decision_key)
// Nodes are named by their original ranks (a standby that took node n's
// place is node n). Each agent writes only its own node's keys.
//
// Step s is complete everywhere in g once every member's record is at least
// s: every node then holds its part of s (a node keeps its two newest parts:
// the nodes snapshot in lockstep, at most one part apart) and its peer the
// replica. A restart resumes from the newest step complete everywhere in
// the generation that failed, assembled from every member's part; a lost
// member's part comes from the replica its peer keeps.
//
// The restart's agreement (gen/<g>/restore/<node>, then one decision)
// keeps every node's workers on the same state: they resume from the
// snapshot only when every member of g assembled the same step, else every
// one from the newest disk checkpoint (the run directory is shared, so they
// find the same one). A node's own part that its owner says it no longer
// holds (discarded after a silent corruption) is never taken from the
// peer's replica: only a lost owner's part is.
//
// Replication peers: node n's peer is the member after n in the
// generation's members (cyclic), never n + 1: after a shrink the members
// are renumbered, and a node left out (or a standby that holds no node yet)
// is nobody's peer. A value no agent of the job would write is refused
// (MalformedValue, naming the key).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/snapshot_replica.h"

namespace brigade::elastic {

std::string snapshot_key(int64_t generation, int node);
std::string replica_address_key(int64_t generation, int node);

// The member after `node` in `members` (cyclic); -1 when `node` is not a
// member or is the only one (nobody to replicate to).
int replica_peer(const std::vector<int>& members, int node);
// The member whose replica `node` keeps (the one before it); -1 as above.
int replica_source(const std::vector<int>& members, int node);

struct ReplicaAddress {
  std::string host;
  uint16_t port = 0;
};

void publish_replica_address(CoordinatorStore& store, int64_t generation, int node,
                             const ReplicaAddress& address);
// Null when the node published none in that generation; MalformedValue
// unless the value is "host:port" with a port in 1..65535.
std::optional<ReplicaAddress> read_replica_address(CoordinatorStore& store, int64_t generation,
                                                   int node);

// Records that node's part of `step` is written and replicated in
// `generation`. Steps only go forward: an older step than the one recorded
// is not written.
void publish_snapshot_step(CoordinatorStore& store, int64_t generation, int node, int64_t step);
// The node's record in `generation`, null when none; MalformedValue unless
// a non-negative decimal step.
std::optional<int64_t> read_snapshot_step(CoordinatorStore& store, int64_t generation, int node);

// The newest step whose every member's part is written and replicated in
// `generation`: the least of their records. Null when a member has none.
std::optional<int64_t> newest_complete_step(CoordinatorStore& store, int64_t generation,
                                            const std::vector<int>& members);

std::string restore_key(int64_t generation, int node);
// gen/<g>/restore/decision: the step every member of g resumes from, or
// "none", written once by the first member that heard from every member
// or gave up waiting (the one whose add to gen/<g>/restore/deciding gave 1).
std::string restore_decision_key(int64_t generation);
std::string restore_deciding_key(int64_t generation);
// gen/<g>/written/<node>: the newest part the node's workers committed in
// g, written by its agent once g's workers are gone (its owner serves it
// at the restart even if no peer keeps it yet).
std::string written_key(int64_t generation, int node);

// The nodes of generation g: gen/<k>/members of the newest k <= g that has
// one, else all nnodes (no generation left a node out).
std::vector<int> members_of(CoordinatorStore& store, int64_t generation, int nnodes);

// The address this host reaches host:port from (the store's): where the
// other nodes reach this agent's ReplicaServer. Error when there is no route.
std::string local_address_towards(const std::string& host, uint16_t port);

// One agent's side of it: its ReplicaServer (serving replicas of its
// source node and its own node's parts), the sender to its peer, its
// records, and the restart's gathering and agreement. Used by the agent's
// thread only (the server and the sender have threads of their own).
class SnapshotSync {
 public:
  struct Options {
    std::filesystem::path area;  // the agent's SnapshotArea, where the workers' parts are
    std::string host;            // this agent's address (local_address_towards)
    std::string token;           // the job's
    int nnodes = 0;
    CoordinatorStore* store = nullptr;
    // The most a replica kept, and a part fetched, may hold (they go to
    // tmpfs); 0: half of the area's free space when the server starts.
    int64_t max_bytes = 0;
    int64_t io_timeout_ms = 10'000;
    // How long the restore waits for a source's server to accept: a node
    // cut off the network costs this once per restore, not io_timeout_ms,
    // unless the coordinator declared it lost (node/<n>/lost), as it does
    // before a standby takes its place or the job goes on without it: then
    // only its peer is asked. (Cut off after that verdict was read, it
    // still costs the timeout once.)
    int64_t connect_timeout_ms = 2'000;
    // How long the restart waits for every member's assembled step.
    int64_t agree_timeout_ms = 60'000;
    std::function<void(const std::string&)> log;  // stderr when unset
  };
  // Starts the server (Error naming the address if it cannot bind).
  explicit SnapshotSync(Options options);
  ~SnapshotSync();
  SnapshotSync(const SnapshotSync&) = delete;
  SnapshotSync& operator=(const SnapshotSync&) = delete;

  uint16_t port() const { return server_->port(); }
  const ReplicaServer& server() const { return *server_; }

  // Generation g starts with this agent running `node` (its original rank)
  // among `members`: publishes the server's address, serves the node's own
  // parts, and replicates them to the node's peer from now on.
  void enter_generation(int64_t generation, int node, const std::vector<int>& members);
  // Every tick while the workers run; never blocks on the network: offers
  // the newest part the workers committed to the sender, and records the
  // newest the peer keeps.
  void tick();
  // The generation's workers are gone: nothing more is offered or recorded,
  // so every agent reads the same records at the restart; the newest part
  // written is published (written_key).
  void freeze();
  // The newest step recorded for this node in the current generation (-1).
  int64_t recorded_step() const { return recorded_; }
  // For a whole-node fault due after `step` (the agent holds its workers
  // there, before the step's own snapshot starts): true once every part
  // written so far is recorded, up to step - 1's; at once when no part was
  // written in this generation (snapshots are off); after a bounded wait
  // otherwise (1 s with every part written so far recorded: with
  // snapshot_every > 1 step - 1's is not due; 10 s in all).
  bool caught_up(int64_t step, int64_t now_ns);

  // Before generation g's workers start (g - 1 failed), on every member of
  // g: gathers every g - 1 member's part of the newest step whose every
  // part can be had (a node's own from its area, the others' from their
  // owners' servers, a lost node's from its peer's replica; the steps
  // tried run from the newest any member recorded or wrote down to the
  // least of the members' newest), assembles it into the area as a checkpoint, and agrees
  // with the other members of g. Returns the step when every one of them
  // assembled that step; otherwise null, with the reason in one log line,
  // and no assembled snapshot left in the area, so the workers resume from
  // the newest disk checkpoint. Either way the area's parts go (after
  // every member said it is done with them): they are the old branch's.
  //
  // It can take long (a timeout per unreachable source, seconds per large
  // part, up to agree_timeout_ms for the others): with `keep_alive` set it
  // runs on a thread of its own while the calling thread calls keep_alive
  // at least every 100 ms (the agent beats through it, or it is taken for
  // lost after 2 s); once keep_alive returns false (the job ended) the
  // restore gives up at its next source, step or look at the agreement,
  // and resumes from no snapshot.
  //
  // When g - 1 left no step every part of which can be had (it failed
  // during its own restart, before its first snapshot), the step g - 1
  // resumed from is taken instead: every node that resumed with it keeps
  // that assembled copy in its area until the next restore, so a fault
  // during a recovery does not send the job back to the disk checkpoint.
  // A node without the copy (a standby new to g) says "none", and every
  // node resumes from disk.
  //
  // `disk_step`: the step of the newest disk checkpoint (the run directory
  // is shared: every node sees the same; -1 none). When it is at least the
  // newest step any member wrote, no snapshot can be newer (a rejoin's
  // interrupt checkpoint, a checkpoint just before the failure): nothing
  // is fetched, and the node says "none" at once.
  std::optional<int64_t> restore(int64_t generation, int node, const std::vector<int>& members,
                                 const std::function<bool()>& keep_alive = {},
                                 int64_t disk_step = -1);

 private:
  // Gathers and assembles step `step` of `members`' parts; the reason on failure.
  std::string assemble(int64_t failed, int64_t step, const std::vector<int>& members, int node);
  // When generation `failed` left no step to assemble (a fault during its
  // restart, before its first snapshot): the step it resumed from, whose
  // assembled copy every node that resumed with it kept in its area, if it
  // is newer than the disk checkpoint; null (a reason added to `why`) else.
  std::optional<int64_t> resumed_copy(int64_t failed, int node, int64_t disk_step,
                                      std::string& why);
  std::optional<int64_t> restore_here(int64_t generation, int node, const std::vector<int>& members,
                                      int64_t disk_step);
  void log(const std::string& line) const;

  Options options_;
  std::unique_ptr<ReplicaServer> server_;
  std::unique_ptr<ReplicaSender> sender_;
  int64_t generation_ = -1;
  int node_ = -1;
  int peer_ = -1;
  int64_t offered_ = -1;
  int64_t recorded_ = -1;
  bool frozen_ = true;
  bool replication_off_ = false;  // the peer's address is malformed: said once
  int64_t waiting_since_ns_ = 0;
  std::set<int> unreachable_;          // within one restore: sources that did not answer, or lost
  std::atomic<bool> given_up_{false};  // within one restore: keep_alive said so
};

}  // namespace brigade::elastic
