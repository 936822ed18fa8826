// The coordinator's part in who leads: the other nodes watching the
// leader's beat and, with a store that elects (etcd: elastic/etcd_store.h's
// campaign), taking over from a silent leader, rebuilding its state from
// the store, or following the node that did (elastic/coordinator.h). Kept
// apart from coordinator.cc, which runs generations the same whoever leads.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "brigade/core/clock.h"
#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/coordinator_keys.h"
#include "brigade/elastic/standby.h"

namespace brigade::elastic {

using namespace detail;

std::optional<JobView> Coordinator::watch_leader(int64_t now_ns) {
  const int old = leader_node_;
  const int64_t timeout_ns = options_.agent_timeout_ms * kNsPerMs;
  if (beat_moved(old, now_ns) || now_ns - beat_changed_ns_[old] <= timeout_ns) {
    return std::nullopt;
  }
  if (store_.elects_leader()) {
    // The silent leader's lease runs out within about agent_timeout_ms of
    // its last beat; until then its key stands and every campaign loses.
    const std::optional<int> leading =
        options_.standby ? store_.leading_node()
                         : store_.campaign_for(options_.node_rank, options_.agent_timeout_ms);
    if (leading && (*leading < 0 || *leading >= options_.nnodes)) {
      throw MalformedValue("leader", std::to_string(*leading),
                           fmt::format("a node's rank in 0..{}", options_.nnodes - 1));
    }
    if (leading && *leading != old) {
      if (*leading == options_.node_rank && !options_.standby) {
        leader_node_ = *leading;
        take_over(old, now_ns);
      } else {
        follow(*leading, now_ns);
      }
      return std::nullopt;
    }
    // Twice the lease and then some: etcd expires a lease a little late.
    if (now_ns - beat_changed_ns_[old] <= 3 * timeout_ns) return std::nullopt;
  }
  JobView v;
  v.state = JobView::State::kEnded;
  v.lost_coordinator = true;
  v.why = fmt::format(
      "lost the coordinator: node {}'s agent sent no heartbeat through the store at {} for {:.1f} "
      "s{}",
      old, store_.address(), (now_ns - beat_changed_ns_[old]) * 1e-9,
      store_.elects_leader() ? " and no other node took over" : "");
  // Node 0's agent may be alive but slow or cut off from this node only:
  // its workers must not wait on this node's in a collective. A standby
  // runs no workers: nobody waits on it.
  if (!options_.standby) try_end_job(fmt::format("node {} {}", options_.node_rank, v.why));
  return v;
}

void Coordinator::follow(int node, int64_t now_ns) {
  leader_node_ = node;
  // A standby that took the node beats under its own key: only the leader
  // that gave it the node learnt so, the store holds it for the others.
  read_holder(node);
  last_beat_[node] = -1;
  beat_changed_ns_[node] = now_ns;
}

void Coordinator::read_holder(int n) {
  for (int64_t h = generation_; h >= 1; --h) {
    const std::string key = replaced_key(h, n);
    const auto text = store_.try_get(key);
    if (!text) continue;
    int standby = -1;
    if (std::sscanf(text->c_str(), "standby %d", &standby) != 1 || standby < 0) {
      throw MalformedValue(key, *text, "'standby <id>'");
    }
    holder_[static_cast<size_t>(n)] = standby;
    beat_keys_[n] = standby_beat_key(standby);
    return;
  }
}

void Coordinator::take_over(int old, int64_t now_ns) {
  const int64_t g = generation_;
  if (!standbys_) standbys_ = std::make_unique<StandbyPool>(store_, options_.agent_timeout_ms);
  // The old leader's memory is gone; the store holds what it decided.
  // Which standby holds each node (the key its agent beats under): the
  // latest gen/<g>/node/<n> up to this generation.
  // A standby the old leader gave a node (standby/<s>/node) is not free,
  // though it still beats under its standby key.
  standbys_->take_assigned(now_ns);
  for (int n = 0; n < options_.nnodes; ++n) {
    read_holder(n);
    // Every node's beat is watched from now (a follower watched the
    // leader's only); the old leader's silence stands as it was seen.
    if (n != old) {
      last_beat_[n] = -1;
      beat_changed_ns_[n] = now_ns;
    }
  }
  // Nodes the old leader declared lost in this generation stay lost.
  for (const int n : members_) {
    const std::string key = lost_key(n);
    const auto in = store_.try_get(key);
    if (n != old && in && parse_count(key, *in) == g) {
      lost_.emplace(n, lost_incident(n, now_ns));
      inherited_lost_.insert(n);
    }
  }
  // A few of the standbys' beats before a decision on the old leader's
  // node: a standby never seen beating is not free. With none that could
  // be, nothing to wait for.
  settle_until_ns_ =
      standbys_->any_untaken() ? now_ns + 3 * options_.beat_interval_ms * kNsPerMs : now_ns;
  taken_from_ = old;
  taken_over_ns_ = now_ns;
}

std::optional<JobView> Coordinator::regain_store(std::optional<Incident> incident, int64_t now_ns) {
  // Out of the job: declared lost, or the job ended without this node.
  auto out = [this]() -> std::optional<JobView> {
    if (const auto lost = check_not_lost()) return *lost;
    if (const auto end = store_.try_get(end_key()); end && !end_from_lost_node(*end)) {
      return ended_view(*end);
    }
    return std::nullopt;
  };
  try {
    if (auto view = out()) return view;
    if (store_.elects_leader() && leader() && !store_.renew_lease()) return deposed_view();
    // A leader's silence clocks ran on while it saw nothing (under etcd a
    // blip cuts every node at once): from now, as after a takeover.
    for (int n = 0; n < options_.nnodes; ++n) {
      last_beat_[n] = -1;
      beat_changed_ns_[n] = now_ns;
    }
    if (incident) report_failure(std::move(*incident));
    store_.add(beat_key_, 1);
    next_beat_ns_ = now_ns + options_.beat_interval_ms * kNsPerMs;
    // Declared lost (or the job ended) between the first look and the
    // report, which send_report() then left out: leave all the same.
    return out();
  } catch (const MalformedValue& e) {
    JobView v;
    v.state = JobView::State::kEnded;
    v.lost_coordinator = true;
    v.why = e.what();
    return v;
  } catch (const NotLeader&) {
    return deposed_view();
  }
}

JobView Coordinator::deposed_view() {
  deposed_ = true;
  JobView v;
  v.state = JobView::State::kEnded;
  v.lost_coordinator = true;  // another node leads: nobody waits for this one
  v.why = fmt::format(
      "node {} led the job but its lease in the store at {} ran out (its agent was silent for "
      "longer than {} ms): another node leads now, so this node stops its workers and leaves",
      options_.node_rank, store_.address(), options_.agent_timeout_ms);
  return v;
}

}  // namespace brigade::elastic
