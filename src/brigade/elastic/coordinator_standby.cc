// The coordinator's part in standby nodes (elastic/standby.h): the leader
// giving a lost node's rank to a standby, a standby waiting for one, and a
// lost node's agent kept out. Kept apart from coordinator.cc, which runs
// generations the same with standbys or without.
#include <fmt/format.h>

#include "brigade/core/clock.h"
#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/coordinator_keys.h"
#include "brigade/elastic/standby.h"

namespace brigade::elastic {

using namespace detail;

std::optional<int64_t> Coordinator::lost_in() {
  if (leader() || options_.standby) return std::nullopt;
  const std::string key = lost_key(options_.node_rank);
  const auto value = store_.try_get(key);
  if (!value) return std::nullopt;
  const int64_t lost_in = parse_count(key, *value);
  // A standby that took this node's rank later is not the one declared lost.
  if (lost_in < generation_) return std::nullopt;
  return lost_in;
}

std::optional<JobView> Coordinator::check_not_lost() {
  const std::optional<int64_t> lost = lost_in();
  if (!lost) return std::nullopt;
  const int64_t lost_in = *lost;
  JobView v;
  v.state = JobView::State::kEnded;
  v.lost_coordinator = true;  // nobody waits for this node any more
  v.why = fmt::format(
      "the coordinator declared node {} lost in generation {} (its agent sent no heartbeat for "
      "too long) and the job went on without it (a standby node in its place, or fewer nodes): "
      "this agent stops its workers and does not rejoin",
      options_.node_rank, lost_in);
  return v;
}

bool Coordinator::end_from_lost_node(const std::string& value) {
  const nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  // The writer, not the node the end names: node 0's end names the lost node.
  if (!j.is_object() || !j.contains("by") || !j.at("by").is_number_integer() ||
      !j.contains("by_generation") || !j.at("by_generation").is_number_integer()) {
    return false;  // ended_view() says what is wrong with it
  }
  const int by = j.at("by");
  // With the built-in store node 0 is never declared lost (it leads for
  // good); with an electing one, a lost leader's end is a lost node's.
  if (by < 0 || by >= options_.nnodes) return false;
  const std::string key = lost_key(by);
  const auto lost_in = store_.try_get(key);
  return lost_in && parse_count(key, *lost_in) >= j.at("by_generation").get<int64_t>();
}

JobView Coordinator::standby_poll(int64_t now_ns) {
  if (now_ns >= next_beat_ns_) {
    store_.add(beat_key_, 1);
    next_beat_ns_ = now_ns + options_.beat_interval_ms * kNsPerMs;
  }
  if (const auto end = store_.try_get(end_key()); end && !end_from_lost_node(*end)) {
    return ended_view(*end);
  }
  JobView v;
  if (const auto refused = check_refused()) return *refused;
  if (store_.try_get(standby_release_key())) {
    v.state = JobView::State::kSucceeded;
    return v;
  }
  if (const auto given = read_assignment(store_, standby_id_, options_.nnodes)) {
    // The leader gives the node, then opens the generation once the other
    // nodes' workers are gone: until then this standby waits.
    if (store_.try_get(open_key(given->generation))) {
      // Too late: the leader found this standby silent as that node, and
      // the node went to another standby.
      const std::string lost = lost_key(given->node);
      if (const auto lost_in = store_.try_get(lost);
          lost_in && parse_count(lost, *lost_in) >= given->generation) {
        v.state = JobView::State::kEnded;
        v.lost_coordinator = true;  // nobody waits for this standby
        v.why = fmt::format(
            "standby {} was given node {} in generation {} but started too late: the coordinator "
            "declared the node lost again in generation {}; this standby leaves",
            standby_id_, given->node, given->generation, parse_count(lost, *lost_in));
        return v;
      }
      options_.standby = false;
      options_.node_rank = given->node;
      generation_ = given->generation;
      // With an electing store the leader may be another node than 0.
      if (store_.elects_leader()) {
        if (const auto leading = store_.leading_node();
            leading && *leading >= 0 && *leading < options_.nnodes && *leading != leader_node_) {
          follow(*leading, now_ns);
        }
      }
      // The job may have gone on with fewer nodes before: the standby's
      // workers are numbered among the generation's nodes.
      const std::string members = members_key(generation_);
      if (const auto text = store_.try_get(members)) {
        members_ = parse_members(members, *text, options_.nnodes, store_.elects_leader());
      }
      layout_ = read_layout(generation_);
      // The latest generation that moved the workers' store, if any did.
      for (int64_t g = generation_; g >= 1 && !worker_store_; --g)
        worker_store_ = read_worker_store(g);
      restarts_used_ = read_restarts(generation_);
      v.state = JobView::State::kRestart;
      v.run_dir = store_.try_get(coordinator_key("run_dir")).value_or("");
      return v;
    }
  }
  if (const auto lost = watch_leader(now_ns)) return *lost;
  return v;
}

Incident Coordinator::lost_incident(int n, int64_t now_ns) {
  Incident lost;
  lost.kind = "node_lost";
  lost.node = n;
  lost.rank = -1;
  lost.generation = generation_;
  // The node this leader took over from was known lost at the takeover,
  // while the silence counted is still the one seen then (not counted
  // afresh since: a regained store, a beat that moved).
  lost.detected_ns =
      n == taken_from_ && beat_changed_ns_[n] < taken_over_ns_ ? taken_over_ns_ : now_ns;
  lost.fault_ns = beat_changed_ns_[n];
  lost.last_step = -1;
  const std::string key = node_fault_key(generation_, n);
  if (const auto fault = store_.try_get(key)) {
    if (*fault != "kill-agent" && *fault != "partition") {
      throw MalformedValue(key, *fault, "'kill-agent' or 'partition'");
    }
    lost.injected = true;
    if (*fault == "partition") lost.kind = "partition";
  }
  const double silent_s = (lost.detected_ns - lost.fault_ns) * 1e-9;
  lost.what = fmt::format(
      "node {} is lost: its agent sent no heartbeat for {:.1f} s (the agent died, or the node "
      "lost its network{})",
      n, silent_s,
      lost.injected
          ? fmt::format("; injected: {}", lost.kind == "partition" ? "partition" : "kill-agent")
          : "");
  return lost;
}

std::optional<JobView> Coordinator::on_silent_node(int n, int64_t now_ns) {
  Incident lost = lost_incident(n, now_ns);
  const int standbys = standbys_->registered();
  // A standby for this node besides one for each node already lost, or
  // the job may go on without the lost nodes no standby is free for.
  const size_t lost_now = lost_.size() + 1;
  const size_t free = standbys_->pick(now_ns, lost_now).size();
  if (restarts_used_ < options_.max_restarts &&
      (free >= lost_now || may_go_on_with_fewer(lost_now - free))) {
    // Marked before the others hear of it: its agent, should it come back,
    // finds itself out before it can see the next generation open.
    store_.set(lost_key(n), std::to_string(generation_));
    count_loss(n);
    lost_.emplace(n, std::move(lost));
    store_.add(reports_key(generation_), 1);
    return std::nullopt;
  }
  std::string why;
  const bool fewer_allowed = options_.min_nnodes > 0 && options_.min_nnodes < options_.nnodes;
  if (fewer_allowed && restarts_used_ < options_.max_restarts) {
    std::string nodes = std::to_string(n);
    for (const auto& [other, incident] : lost_) nodes += fmt::format(", {}", other);
    why = fmt::format(
        "with no standby node free, going on without node{} {} would leave {} of the job's {} "
        "nodes, fewer than the {} that --nnodes {}:{} allows, so the job ends",
        lost_.empty() ? "" : "s", nodes, members_.size() - lost_.size() - 1, options_.nnodes,
        options_.min_nnodes, options_.min_nnodes, options_.nnodes);
  } else if (standbys == 0) {
    why =
        "with no standby node the job cannot go on at the same world size, so it ends (to go on "
        "with fewer nodes instead, launch every node with --nnodes MIN:MAX)";
  } else if (restarts_used_ >= options_.max_restarts) {
    why = fmt::format("no restart left ({} used), so the job ends", restarts_used_);
  } else {
    why = fmt::format(
        "no standby node is free (of {} registered, none unused with a heartbeat in the last "
        "{} ms), so the job ends",
        standbys, options_.agent_timeout_ms);
  }
  lost.what += "; " + why;
  // The nodes already lost in this generation are gone too.
  std::vector<int> lost_nodes = {n};
  for (const auto& [other, incident] : lost_) lost_nodes.push_back(other);
  return lead_end({{"kind", "node_lost"},
                   {"node", n},
                   {"lost_nodes", lost_nodes},
                   {"generation", generation_},
                   {"what", lost.what},
                   {"silent_ms", (lost.detected_ns - lost.fault_ns) * 1e-6}},
                  now_ns);
}

bool Coordinator::replace_lost_nodes(int64_t now_ns, Incident& cause) {
  // Checked again: a standby may have died while the others stopped. One
  // for every lost node, or none is given: half a replacement ends the job
  // all the same, with a standby taken for nothing.
  const std::vector<int> free = standbys_->pick(now_ns, lost_.size());
  // Those without one are left out when the job may go on with fewer nodes.
  if (free.size() < lost_.size() && !may_go_on_with_fewer(lost_.size() - free.size())) {
    std::string nodes;
    for (const auto& [n, lost] : lost_) nodes += fmt::format("{}{}", nodes.empty() ? "" : ", ", n);
    cause.what += fmt::format(
        "; {} of the {} lost nodes ({}) can have a standby (the others unused with a heartbeat in "
        "the last {} ms), so the job ends",
        free.size(), lost_.size(), nodes, options_.agent_timeout_ms);
    return false;
  }
  size_t next = 0;
  std::vector<int> left_out;
  for (auto& [n, lost] : lost_) {
    if (next == free.size()) {
      left_out.push_back(n);
      continue;
    }
    const int standby = free[next++];
    standbys_->assign(standby, n, generation_ + 1);
    store_.set(replaced_key(generation_ + 1, n), fmt::format("standby {}", standby));
    lost.what += fmt::format("; standby {} takes its place as node {} in generation {}", standby, n,
                             generation_ + 1);
    if (cause.node == n) cause.what = lost.what;
    // Watched from now on under the standby's own key.
    beat_keys_[n] = standby_beat_key(standby);
    holder_[static_cast<size_t>(n)] = standby;
    last_beat_[n] = -1;
    beat_changed_ns_[n] = now_ns;
  }
  if (!left_out.empty()) leave_out(left_out, cause);
  return true;
}

}  // namespace brigade::elastic
