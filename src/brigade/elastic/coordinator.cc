#include "brigade/elastic/coordinator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <tuple>

#include "brigade/comm/tcp_store.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/coordinator_keys.h"
#include "brigade/elastic/standby.h"

namespace brigade::elastic {

namespace detail {

std::string beat_key(int node) {
  return coordinator_key(fmt::format("agent/{}/beat", node));
}
std::string reports_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/reports", g));
}
std::string failure_key(int64_t g, int node) {
  return coordinator_key(fmt::format("gen/{}/failure/{}", g, node));
}
std::string stopped_key(int64_t g, int node) {
  return coordinator_key(fmt::format("gen/{}/stopped/{}", g, node));
}
std::string cause_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/cause", g));
}
std::string open_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/open", g));
}
const std::string& end_key() {
  static const std::string key = coordinator_key("end");
  return key;
}

int64_t parse_count(const std::string& key, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || n < 0) {
    throw MalformedValue(key, value, "a non-negative decimal number");
  }
  return n;
}

nlohmann::json parse_object(const std::string& key, const std::string& value,
                            const char* expected) {
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw MalformedValue(key, value, expected);
  return j;
}

// A failure report as it travels between agents. Times are per node, so
// only the detection delay travels: the reader places it on its own clock.
nlohmann::json report_json(const Incident& i) {
  nlohmann::json j = {{"kind", i.kind},
                      {"rank", i.rank},
                      {"node", i.node},
                      {"pid", i.pid},
                      {"what", i.what},
                      {"injected", i.injected},
                      {"detected_after_ms", i.detected_after_ms()},
                      {"last_step", i.last_step},
                      {"mean_step_ms", i.mean_step_ms}};
  if (i.signal) j["signal"] = *i.signal;
  if (i.exit_code) j["exit_code"] = *i.exit_code;
  if (i.nodes > 0) j["nodes"] = i.nodes;
  return j;
}

Incident parse_report(const std::string& key, const nlohmann::json& j, int64_t now_ns, int nnodes) {
  const char* expected = "a failure report (a JSON object of kind, rank, node, what, ...)";
  auto fail = [&]() -> Incident { throw MalformedValue(key, j.dump(), expected); };
  if (!j.is_object()) return fail();
  const auto has = [&](const char* name, auto check) {
    return j.contains(name) && check(j.at(name));
  };
  const auto is_int = [](const nlohmann::json& v) { return v.is_number_integer(); };
  const auto is_num = [](const nlohmann::json& v) { return v.is_number(); };
  if (!has("kind", [](const nlohmann::json& v) { return v.is_string(); }) ||
      !has("what", [](const nlohmann::json& v) { return v.is_string(); }) ||
      !has("injected", [](const nlohmann::json& v) { return v.is_boolean(); }) ||
      !has("rank", is_int) || !has("node", is_int) || !has("pid", is_int) ||
      !has("last_step", is_int) || !has("detected_after_ms", is_num) ||
      !has("mean_step_ms", is_num)) {
    return fail();
  }
  const std::string kind = j.at("kind");
  const double detected_after_ms = j.at("detected_after_ms");
  if ((kind != "crash" && kind != "hang" && kind != "node_lost" && kind != "partition" &&
       kind != "store_lost" && kind != "rejoin") ||
      !(detected_after_ms >= 0)) {
    return fail();
  }
  if ((j.contains("signal") && !j.at("signal").is_number_integer()) ||
      (j.contains("exit_code") && !j.at("exit_code").is_number_integer()) ||
      (j.contains("nodes") &&
       (!j.at("nodes").is_number_integer() || j.at("nodes").get<int64_t>() < 1 ||
        j.at("nodes").get<int64_t>() > nnodes))) {
    return fail();
  }
  Incident i;
  i.kind = kind;
  i.what = j.at("what");
  i.injected = j.at("injected");
  i.rank = j.at("rank");
  i.node = j.at("node");
  i.pid = j.at("pid");
  i.last_step = j.at("last_step");
  i.mean_step_ms = j.at("mean_step_ms");
  if (j.contains("signal")) i.signal = j.at("signal").get<int>();
  if (j.contains("exit_code")) i.exit_code = j.at("exit_code").get<int>();
  if (j.contains("nodes")) i.nodes = j.at("nodes").get<int>();
  i.detected_ns = now_ns;
  i.fault_ns = now_ns - static_cast<int64_t>(detected_after_ms * 1e6);
  return i;
}

std::string lost_key(int node) {
  return coordinator_key(fmt::format("node/{}/lost", node));
}
std::string replaced_key(int64_t g, int node) {
  return coordinator_key(fmt::format("gen/{}/node/{}", g, node));
}
std::string node_fault_key(int64_t g, int node) {
  return coordinator_key(fmt::format("gen/{}/node_fault/{}", g, node));
}

}  // namespace detail

using namespace detail;

MalformedValue::MalformedValue(const std::string& key, const std::string& value,
                               const std::string& expected)
    : Error(fmt::format(
          "the coordinator key '{}' holds '{}', not {}: refusing it (only this job's agents "
          "write under brigade/coord/; another process holding the job's token wrote it)",
          key, value.size() > 80 ? value.substr(0, 80) + "..." : value, expected)) {}

std::string coordinator_key(const std::string& suffix) {
  return "brigade/coord/" + suffix;
}

void TcpCoordinatorStore::set(const std::string& key, const std::string& value) {
  store_.set(key, value);
}

std::optional<std::string> TcpCoordinatorStore::try_get(const std::string& key) {
  // Keys are never deleted, so one present at check() is there for get().
  if (!store_.check({key})) return std::nullopt;
  return store_.get(key);
}

int64_t TcpCoordinatorStore::add(const std::string& key, int64_t delta) {
  return store_.add(key, delta);
}

std::string TcpCoordinatorStore::address() const {
  return store_.address();
}

int64_t TcpCoordinatorStore::call_timeout_ms() const {
  return store_.timeout_ms();
}

Coordinator::Coordinator(CoordinatorStore& store, CoordinatorOptions options, int64_t now_ns)
    : store_(store),
      options_(options),
      last_beat_(static_cast<size_t>(options.nnodes), -1),
      beat_changed_ns_(static_cast<size_t>(options.nnodes), now_ns),
      holder_(static_cast<size_t>(options.nnodes), -1) {
  for (int n = 0; n < options_.nnodes; ++n) beat_keys_.push_back(beat_key(n));
  for (int n = 0; n < options_.nnodes; ++n) members_.push_back(n);
  if (options_.min_nnodes < 0 || options_.min_nnodes > options_.nnodes) {
    throw_error("the fewest nodes a job may go on with must be in 1..{} (its nodes), got {}",
                options_.nnodes, options_.min_nnodes);
  }
  // A call that takes its whole timeout and then succeeds delays the next
  // beat by as much: past half the silence allowed, a healthy agent could
  // look lost.
  if (store_.call_timeout_ms() * 2 > options_.agent_timeout_ms) {
    throw_error(
        "the coordinator's store client at {} allows {} ms per call, more than half of the {} ms "
        "an agent may stay silent: one slow call would make a healthy node look lost; give it a "
        "timeout of at most {} ms",
        store_.address(), store_.call_timeout_ms(), options_.agent_timeout_ms,
        options_.agent_timeout_ms / 2);
  }
  if (options_.standby) {
    standby_id_ = static_cast<int>(store_.add(standby_count_key(), 1) - 1);
    beat_key_ = standby_beat_key(standby_id_);
  } else {
    beat_key_ = beat_key(options_.node_rank);
  }
  if (leader()) standbys_ = std::make_unique<StandbyPool>(store_, options_.agent_timeout_ms);
  register_host();  // before the first beat: the leader reads it once it sees one
  store_.add(beat_key_, 1);
  next_beat_ns_ = now_ns + options_.beat_interval_ms * kNsPerMs;
  // Node 0 takes the leader key first; the others campaign only once the
  // leader falls silent (watch_leader()).
  if (store_.elects_leader() && !options_.standby && options_.node_rank == 0) {
    const std::optional<int> leading = store_.campaign_for(0, options_.agent_timeout_ms);
    if (!leading || *leading < 0 || *leading >= options_.nnodes) {
      throw_error("the coordinator's store at {} elected no node of 0..{} as the leader",
                  store_.address(), options_.nnodes - 1);
    }
    leader_node_ = *leading;
  }
}

Coordinator::~Coordinator() = default;

void Coordinator::mark_node_fault(const std::string& kind) {
  if (lost_in()) return;
  store_.set(node_fault_key(generation_, options_.node_rank), kind);
}

void Coordinator::publish_run_dir(const std::string& run_dir) {
  store_.set(coordinator_key("run_dir"), run_dir);
}

void Coordinator::release_standbys() {
  store_.set(standby_release_key(), "1");
}

void Coordinator::report_failure(Incident incident) {
  if (reported_failure_) return;
  if (!pending_report_) {
    incident.node = options_.node_rank;
    pending_report_ = std::move(incident);
  }
  send_report();
}

void Coordinator::send_report() {
  if (!pending_report_) return;
  // A lost node's agent that came back writes nothing (see check_not_lost).
  if (lost_in()) return;
  // The report first, then the count the others poll: a count they see
  // always has its report readable. Sent again after an error, the report
  // is the same and the count only needs to be above 0.
  store_.set(failure_key(generation_, options_.node_rank), report_json(*pending_report_).dump());
  store_.add(reports_key(generation_), 1);
  pending_report_.reset();
  reported_failure_ = true;
}

void Coordinator::report_end(const std::string& why) {
  if (lost_in()) return;
  end_job({{"kind", "signal"},
           {"what", why},
           {"node", options_.node_rank},
           {"generation", generation_}});
}

void Coordinator::report_stopped(bool succeeded) {
  if (reported_stopped_ || lost_in()) return;
  // A node whose workers failed reports the failure before it says so.
  send_report();
  store_.set(stopped_key(generation_, options_.node_rank), succeeded ? "ok" : "failed");
  reported_stopped_ = true;
}

void Coordinator::try_end_job(const std::string& what) {
  if (tried_end_) return;
  tried_end_ = true;
  try {
    if (lost_in()) return;  // the job went on without this node
    end_job({{"kind", "coordinator_lost"},
             {"node", options_.node_rank},
             {"generation", generation_},
             {"what", what}});
  } catch (const Error&) {
    // The store is gone for this node too: the leader, if alive, finds this
    // agent silent and ends the job itself.
  }
}

nlohmann::json Coordinator::signed_end(nlohmann::json end) const {
  // The writer, for end_from_lost_node(): the node an end names may be
  // another (node 0's end names the node it lost).
  end["by"] = options_.node_rank;
  end["by_generation"] = generation_;
  return end;
}

void Coordinator::end_job(const nlohmann::json& end) {
  // The first end wins: the store has no compare-and-set, but add() hands
  // out 1 once. An end that a node wrote before it was declared lost does
  // not count: it is overwritten (two live writers may both do so; either
  // end is the job's).
  const std::string value = signed_end(end).dump();
  if (store_.add(coordinator_key("end/claims"), 1) == 1) {
    store_.set(end_key(), value);
    return;
  }
  if (const auto existing = store_.try_get(end_key()); existing && end_from_lost_node(*existing)) {
    store_.set(end_key(), value);
  }
}

JobView Coordinator::poll(int64_t now_ns) {
  try {
    if (options_.standby) return standby_poll(now_ns);
    // A lost node's agent that came back writes nothing more, not even a beat.
    if (const auto lost = check_not_lost()) return *lost;
    send_report();
    if (now_ns >= next_beat_ns_) {
      store_.add(beat_key_, 1);
      next_beat_ns_ = now_ns + options_.beat_interval_ms * kNsPerMs;
      // The leader's lease lives while it beats.
      if (store_.elects_leader() && leader() && !store_.renew_lease()) return deposed_view();
    }
    if (const auto end = store_.try_get(end_key()); end && !end_from_lost_node(*end)) {
      return ended_view(*end);
    }
    JobView state = read_state();
    // Nodes that are done stop beating: success needs no watching.
    if (state.state == JobView::State::kSucceeded) return state;
    if (const auto decided = leader() ? lead(now_ns) : watch_leader(now_ns)) return *decided;
    return state;
  } catch (const MalformedValue& e) {
    JobView v;
    v.state = JobView::State::kEnded;
    v.why = e.what();
    return v;
  } catch (const NotLeader&) {
    return deposed_view();
  } catch (const Error& e) {
    JobView v;
    v.state = JobView::State::kEnded;
    // With an electing store the job may go on under another leader: this
    // node's workers stop at once, as a follower's do.
    v.lost_coordinator = !leader() || store_.elects_leader();
    v.store_unreachable = true;
    v.why = fmt::format("lost contact with the coordinator's store at {}: {}", store_.address(),
                        e.what());
    // This node leaves, and ends no one else: a store that is only slow
    // must not end a healthy job. The leader finds this node silent within
    // agent_timeout_ms and gives its rank to a standby or stops every node.
    return v;
  }
}

bool Coordinator::keep_alive(int64_t now_ns) {
  try {
    if (lost_in()) return false;
    if (now_ns >= next_beat_ns_) {
      store_.add(beat_key_, 1);
      next_beat_ns_ = now_ns + options_.beat_interval_ms * kNsPerMs;
      if (store_.elects_leader() && leader() && !store_.renew_lease()) {
        deposed_view();
        return false;
      }
    }
    const auto end = store_.try_get(end_key());
    return !end || end_from_lost_node(*end);
  } catch (const Error&) {
    return false;  // the next poll() says what went wrong
  }
}

JobView Coordinator::read_state() {
  JobView v;
  const std::string reports = reports_key(generation_);
  const auto count = store_.try_get(reports);
  if (count && parse_count(reports, *count) > 0) {
    const std::string open = open_key(generation_ + 1);
    if (const auto next = store_.try_get(open)) {
      if (*next != std::to_string(generation_ + 1)) {
        throw MalformedValue(open, *next, fmt::format("generation {}", generation_ + 1));
      }
      const std::string cause = cause_key(generation_);
      const auto text = store_.try_get(cause);
      if (!text) throw MalformedValue(open, *next, "an open generation (its cause is missing)");
      // Written before the generation opened; absent, it has every node of this one.
      next_members_ = members_;
      const std::string members = members_key(generation_ + 1);
      if (const auto nodes = store_.try_get(members)) {
        next_members_ = parse_members(members, *nodes, options_.nnodes, store_.elects_leader());
      }
      next_layout_ = read_layout(generation_ + 1);
      next_worker_store_ = read_worker_store(generation_ + 1);
      next_restarts_ = read_restarts(generation_ + 1);
      v.state = JobView::State::kRestart;
      v.cause =
          parse_report(cause, parse_object(cause, *text, "a failure report"), 0, options_.nnodes);
      next_open_ = true;
      return v;
    }
    v.state = JobView::State::kFailing;
    v.rejoin = rejoin_only();
    v.will_restart = restarts_used_ < options_.max_restarts || v.rejoin;
    return v;
  }
  if (reported_stopped_) {
    for (const int n : members_) {
      const std::string key = stopped_key(generation_, n);
      const auto stopped = store_.try_get(key);
      if (!stopped) return v;
      if (*stopped != "ok" && *stopped != "failed") {
        throw MalformedValue(key, *stopped, "'ok' or 'failed'");
      }
      // A node whose workers failed reports the failure before it says so.
      if (*stopped != "ok") return v;
    }
    v.state = JobView::State::kSucceeded;
  }
  return v;
}

bool Coordinator::beat_moved(int node, int64_t now_ns) {
  const std::string& key = beat_keys_[node];
  const auto value = store_.try_get(key);
  if (!value) return false;  // not registered yet: counts as silent
  const int64_t beat = parse_count(key, *value);
  if (beat == last_beat_[node]) return false;
  last_beat_[node] = beat;
  beat_changed_ns_[node] = now_ns;
  return true;
}

std::optional<JobView> Coordinator::lead(int64_t now_ns) {
  const int64_t timeout_ns = options_.agent_timeout_ms * kNsPerMs;
  standbys_->watch(now_ns);
  // A new leader first sees the standbys beat (take_over()).
  if (now_ns < settle_until_ns_) return std::nullopt;
  for (int n = 0; n < options_.nnodes; ++n) {
    if (n == options_.node_rank || lost_.contains(n) || !member(n)) continue;
    if (beat_moved(n, now_ns) || now_ns - beat_changed_ns_[n] <= timeout_ns) continue;
    if (const auto ended = on_silent_node(n, now_ns)) return ended;
  }
  const std::string reports = reports_key(generation_);
  const auto count = store_.try_get(reports);
  if (!count || parse_count(reports, *count) == 0) {
    maybe_grow(now_ns);
    return std::nullopt;
  }
  if (store_.try_get(open_key(generation_ + 1))) return std::nullopt;
  for (const int n : members_) {
    if (!lost_.contains(n) && !store_.try_get(stopped_key(generation_, n))) return std::nullopt;
  }
  // Every node's workers of this generation are gone: decide. A lost node
  // is the cause: the other nodes' failures are its consequences.
  std::optional<Incident> cause = lost_.empty() ? choose_cause() : lost_.begin()->second;
  // A rejoin with nothing else reported: no failure, no restart.
  if (const auto rejoin = read_rejoin(generation_); !cause && rejoin) {
    grow(now_ns, rejoin->first, rejoin->second);
    return std::nullopt;
  }
  if (!cause) {
    throw MalformedValue(reports, *count, "a count of reports that exist (none does)");
  }
  next_members_ = members_;  // unless lost nodes are left out
  if (restarts_used_ < options_.max_restarts && replace_lost_nodes(now_ns, *cause)) {
    // Before the generation opens: every agent reads it there.
    store_.set(members_key(generation_ + 1), members_text(next_members_));
    store_.set(restarts_key(generation_ + 1), std::to_string(restarts_used_ + 1));
    write_next_layout();
    write_worker_store(generation_ + 1);
    store_.set(cause_key(generation_), report_json(*cause).dump());
    store_.set(open_key(generation_ + 1), std::to_string(generation_ + 1));
    return std::nullopt;  // read_state() sees it on the next poll, as everyone does
  }
  if (!lost_.empty()) {
    std::vector<int> lost_nodes;
    for (const auto& [n, lost] : lost_) lost_nodes.push_back(n);
    return lead_end({{"kind", "node_lost"},
                     {"node", cause->node},
                     {"lost_nodes", lost_nodes},
                     {"generation", generation_},
                     {"what", cause->what},
                     {"silent_ms", cause->detected_after_ms()}},
                    now_ns);
  }
  nlohmann::json report = report_json(*cause);
  return lead_end(
      {{"kind", "failure"},
       {"node", cause->node},
       {"generation", generation_},
       {"what", options_.max_restarts == 0
                    ? cause->what
                    : fmt::format("{} (no restart left: {} used)", cause->what, restarts_used_)},
       {"cause", report}},
      now_ns);
}

std::optional<JobView> Coordinator::lead_end(const nlohmann::json& end, int64_t now_ns) {
  end_job(end);
  if (const auto written = store_.try_get(end_key()); written && !end_from_lost_node(*written)) {
    return ended_view(*written);
  }
  // Another agent claimed the end first and has not written it yet: a later
  // poll reads it. Not written within agent_timeout_ms, its agent died or
  // lost the store between its two calls, and the leader's end stands.
  if (!end_unwritten_since_ns_) {
    end_unwritten_since_ns_ = now_ns;
  } else if (now_ns - *end_unwritten_since_ns_ > options_.agent_timeout_ms * kNsPerMs) {
    const std::string value = signed_end(end).dump();
    store_.set(end_key(), value);
    return ended_view(value);
  }
  return std::nullopt;
}

std::optional<Incident> Coordinator::choose_cause() {
  std::optional<Incident> best;
  // The likeliest cause first: an injected fault, a node that lost the
  // store (its own agent killed its workers: any peer's death, by a signal
  // or an error, follows from it), a worker killed by a signal, a hang,
  // then an error exit (most often a peer's death seen through a
  // collective); then by node.
  auto rank_of = [](const Incident& i) {
    return std::make_tuple(!i.injected, i.kind != "store_lost", !i.signal.has_value(),
                           i.kind != "hang", i.node);
  };
  const bool rejoin = read_rejoin(generation_).has_value();
  for (Incident& i : read_failures()) {
    // Workers that saved and exited on a rejoin's SIGTERM before their
    // agent saw it: its consequence, not a cause.
    if (rejoin && stopped_by_rejoin(i)) continue;
    if (!best || rank_of(i) < rank_of(*best)) best = std::move(i);
  }
  return best;
}

JobView Coordinator::ended_view(const std::string& value) {
  const std::string& key = end_key();
  const char* expected = "the end of the job (a JSON object of kind, what, node)";
  const nlohmann::json j = parse_object(key, value, expected);
  if (!j.contains("what") || !j.at("what").is_string() || !j.contains("kind") ||
      !j.at("kind").is_string() || !j.contains("node") || !j.at("node").is_number_integer()) {
    throw MalformedValue(key, value, expected);
  }
  JobView v;
  v.state = JobView::State::kEnded;
  v.why = j.at("what");
  v.signal = j.at("kind") == "signal";
  const int node = j.at("node");
  if (j.at("kind") == "node_lost") {
    if (node < 0 || node >= options_.nnodes) throw MalformedValue(key, value, expected);
    v.lost_node = node;
    v.lost_nodes = {node};
    if (j.contains("lost_nodes")) {
      if (!j.at("lost_nodes").is_array()) throw MalformedValue(key, value, expected);
      for (const nlohmann::json& n : j.at("lost_nodes")) {
        // Over TCP node 0 holds the store: a lost node 0 writes no end.
        const int lowest = store_.elects_leader() ? 0 : 1;
        if (!n.is_number_integer() || n.get<int>() < lowest || n.get<int>() >= options_.nnodes) {
          throw MalformedValue(key, value, expected);
        }
        if (n.get<int>() != node) v.lost_nodes.push_back(n.get<int>());
      }
    }
    Incident lost;
    lost.kind = "node_lost";
    lost.node = node;
    lost.rank = -1;
    lost.what = v.why;
    lost.generation = generation_;
    lost.detected_ns = 0;  // placed on the reader's clock by the agent
    if (j.contains("silent_ms") && j.at("silent_ms").is_number()) {
      lost.fault_ns = -static_cast<int64_t>(j.at("silent_ms").get<double>() * 1e6);
    }
    v.cause = lost;
  } else if (j.contains("cause")) {
    v.cause = parse_report(key, j.at("cause"), 0, options_.nnodes);
  }
  return v;
}

void Coordinator::enter_next_generation() {
  if (!next_open_) {
    throw_error(
        "the coordinator has not opened generation {}: an agent joins the next generation only "
        "after the job's failure in generation {} stopped it",
        generation_ + 1, generation_);
  }
  ++generation_;
  members_ = next_members_;
  layout_ = next_layout_;
  if (next_worker_store_) worker_store_ = next_worker_store_;
  restarts_used_ = next_restarts_;
  lost_.clear();
  inherited_lost_.clear();
  taken_from_ = -1;  // a later silence of that node is a new loss
  reported_failure_ = false;
  pending_report_.reset();
  reported_stopped_ = false;
  next_open_ = false;
}

}  // namespace brigade::elastic
