// Standby nodes: agents that wait, registered with the coordinator
// (elastic/coordinator.h), to take the place of a lost node, or, while the
// job runs on fewer nodes than it started with, to join it as a left-out
// node (a rejoin: elastic/coordinator_rejoin.cc).
//
// A standby's agent (`brigade launch --standby`) registers under
// "brigade/coord/standby/":
//   count                 a counter: adding 1 gives the standby its id s
//   <s>/beat              a counter its agent adds to every 200 ms
//   <s>/node              "<node> <generation>": written by the leader only,
//                         once: the standby runs that node's workers (the
//                         same node rank, local ranks and world size) from
//                         that generation on
//   <s>/host              its machine's name (a rejoin's quarantine)
//   <s>/refused           why the leader will never give it a node (its
//                         machine is quarantined): it leaves
//   release               the job is over: every standby still waiting exits
// The leader watches every standby's beat as it watches the nodes', and
// gives a lost node's rank only to a standby it has seen beating within
// agent_timeout_ms and that has no node yet; a standby whose beat never
// moved while the leader watched (it died before, or never really started)
// is never chosen. A standby keeps beating under its own key once it runs a
// node's workers: the lost node's agent, should it come back, beats under
// the node's old key, which nobody watches any more.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "brigade/elastic/coordinator.h"

namespace brigade::elastic {

std::string standby_count_key();
std::string standby_beat_key(int standby);
std::string standby_node_key(int standby);
std::string standby_release_key();

// A standby's assignment, as the leader wrote it.
struct StandbyAssignment {
  int node = 0;
  int64_t generation = 0;
};

// Reads `<s>/node`: nullopt while unassigned. Throws MalformedValue for a
// value the leader would not write (a node outside 1..nnodes-1; node 0
// too with an electing store, etcd, where another node leads once node 0
// is lost).
std::optional<StandbyAssignment> read_assignment(CoordinatorStore& store, int standby, int nnodes);

// The leader's view of the standbys: whose beat is alive, who is free.
class StandbyPool {
 public:
  StandbyPool(CoordinatorStore& store, int64_t agent_timeout_ms)
      : store_(store), agent_timeout_ms_(agent_timeout_ms) {}

  // Reads how many standbys registered and each one's beat (every poll of
  // the leader, so that a beat's movement is seen as it happens).
  void watch(int64_t now_ns);
  // The `count` lowest free standbys whose beat moved within
  // agent_timeout_ms (and kept moving for `settled_ns` at least: a rejoin
  // takes no joiner that just started); fewer when fewer are.
  std::vector<int> pick(int64_t now_ns, size_t count, int64_t settled_ns = 0) const;
  // A standby that must never be given a node (its machine is quarantined).
  void refuse(int standby) { standbys_.at(static_cast<size_t>(standby)).taken = true; }
  // A leader that took over: every standby an earlier leader gave a node
  // (standby/<s>/node written) is taken.
  void take_assigned(int64_t now_ns);
  // Gives `node` to `standby` from `generation` on. The standby is taken
  // for good, whether or not it ever starts.
  void assign(int standby, int node, int64_t generation);
  int registered() const { return static_cast<int>(standbys_.size()); }
  // Whether a registered standby has no node: one a new leader must see
  // beat before it can tell whether it is free.
  bool any_untaken() const {
    return std::any_of(standbys_.begin(), standbys_.end(),
                       [](const Standby& s) { return !s.taken; });
  }

 private:
  struct Standby {
    int64_t beat = -1;
    int64_t changed_ns = 0;
    bool moved = false;           // seen to move at least once
    int64_t moving_since_ns = 0;  // without a silence of agent_timeout_ms
    bool taken = false;
  };
  CoordinatorStore& store_;
  int64_t agent_timeout_ms_;
  std::vector<Standby> standbys_;
};

}  // namespace brigade::elastic
