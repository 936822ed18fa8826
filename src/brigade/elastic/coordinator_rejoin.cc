// The coordinator's part in rejoining (scale up): a job that went on with
// fewer nodes (`--nnodes MIN:MAX`, coordinator_fewer.cc) grows back when a
// joiner is there. Kept apart from coordinator.cc, which runs generations
// the same whether the next one grows or not.
//
// The joiner is a standby (`brigade launch --standby`, elastic/standby.h),
// started on a recovered machine or a new one, as torchrun's nodes join:
// the same agent waits for a node, whether for a lost one's place at the
// same size or a left-out one's. The leader grows the job only when
//   - it runs on fewer nodes than it started with, nothing is reported in
//     its generation, and the train layout scales to one node more;
//   - a free standby has beaten for agent_timeout_ms at least, without a
//     silence (a joiner that just started, or flaps, stops nobody); and
//   - that standby's machine was not lost twice already (quarantine).
// A grow stops every node's workers as a launcher's signal does: SIGTERM
// with the signal's grace, so that they agree on a step boundary and save
// an interrupt checkpoint there, which the next generation resumes from
// (no step is redone; a restart right after the next periodic checkpoint
// would wait up to a checkpoint interval and redo the steps since the one
// before as soon as anything went wrong meanwhile). It is an incident of
// kind "rejoin" (in incidents.jsonl, with the step it resumed from; ETTR
// counts the pause), but no restart: gen/<g>/restarts keeps the count.
//
// Bound: every loss counts against the machine that held the node (its
// --node-id, else its host name: CoordinatorOptions::host); so does a
// joiner that went silent between the decision and the grow (the rejoin
// aborted: the job stopped for nothing). A machine lost twice is
// quarantined and its joiners are refused with the reason, so that a
// machine that keeps failing, or a joiner restarted after every settle,
// cannot stop the job again and again. Only joiners are refused: a
// standby that takes a lost node's place keeps the job at its size, as
// before (the quarantine is not checked there). The holder of a node
// (whose machine a loss counts against) is the leader's memory, which
// dies with it: node 0 cannot be replaced anyway.
//
// A rejoin is one only while it is its generation's sole report
// (rejoin_only()): a crash, a hang or a lost node besides makes the stop a
// failure's. A worker that exited 128 + SIGTERM (or SIGINT) is the
// rejoin's own stop, seen by its workers (agreeing on node 0's step
// boundary) before its agent saw the rejoin: no cause.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdio>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/coordinator_keys.h"
#include "brigade/elastic/standby.h"

namespace brigade::elastic {

namespace detail {

std::string restarts_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/restarts", g));
}
std::string rejoined_key(int node) {
  return coordinator_key(fmt::format("node/{}/rejoined", node));
}

}  // namespace detail

namespace {

// A machine lost this many times is not readmitted.
constexpr int64_t kQuarantineLosses = 2;

std::string rejoin_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/rejoin", g));
}
std::string agent_host_key(int node) {
  return coordinator_key(fmt::format("agent/{}/host", node));
}
std::string standby_host_key(int standby) {
  return coordinator_key(fmt::format("standby/{}/host", standby));
}
std::string losses_key(const std::string& host) {
  return coordinator_key(fmt::format("host/{}/losses", host));
}
std::string refused_key(int standby) {
  return coordinator_key(fmt::format("standby/{}/refused", standby));
}

std::string this_host() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace

using namespace detail;

void check_node_id(const std::string& id) {
  const bool bad = std::any_of(id.begin(), id.end(),
                               [](unsigned char c) { return c == '/' || c <= ' ' || c == 0x7f; });
  if (id.empty() || id.size() > 128 || bad) {
    throw_error(
        "the node id '{}' cannot name a machine: give --node-id (or BRIGADE_NODE_ID) 1 to 128 "
        "characters without '/', spaces or control characters, e.g. the machine's host name",
        id);
  }
}

void Coordinator::register_host() {
  if (!options_.host.empty()) check_node_id(options_.host);
  const std::string host = options_.host.empty() ? this_host() : options_.host;
  store_.set(options_.standby ? standby_host_key(standby_id_) : agent_host_key(options_.node_rank),
             host);
}

void Coordinator::count_loss(int node) {
  const int holder = holder_[static_cast<size_t>(node)];
  const auto host = store_.try_get(holder < 0 ? agent_host_key(node) : standby_host_key(holder));
  if (host && !host->empty()) store_.add(losses_key(*host), 1);
}

std::vector<Incident> Coordinator::read_failures() {
  std::vector<Incident> out;
  for (int n = 0; n < options_.nnodes; ++n) {
    const std::string key = failure_key(generation_, n);
    const auto text = store_.try_get(key);
    if (!text) continue;
    Incident i =
        parse_report(key, parse_object(key, *text, "a failure report"), 0, options_.nnodes);
    if (i.node != n || i.kind == "rejoin") {
      throw MalformedValue(key, *text, fmt::format("a failure report of node {}", n));
    }
    out.push_back(std::move(i));
  }
  return out;
}

bool Coordinator::stopped_by_rejoin(const Incident& i) {
  const auto by = [](int sig) { return sig == SIGTERM || sig == SIGINT; };
  return i.kind == "crash" && ((i.exit_code && *i.exit_code > 128 && by(*i.exit_code - 128)) ||
                               (i.signal && by(*i.signal)));
}

bool Coordinator::rejoin_only() {
  if (!read_rejoin(generation_) || !lost_.empty()) return false;
  for (const int n : members_) {
    const std::string key = lost_key(n);
    const auto lost_in = store_.try_get(key);
    if (lost_in && parse_count(key, *lost_in) == generation_) return false;
  }
  const std::vector<Incident> failures = read_failures();
  return std::all_of(failures.begin(), failures.end(), stopped_by_rejoin);
}

int64_t Coordinator::read_restarts(int64_t g) {
  const std::string key = restarts_key(g);
  const auto text = store_.try_get(key);
  if (!text) return g;
  const int64_t n = parse_count(key, *text);
  if (n > g) throw MalformedValue(key, *text, fmt::format("a count of restarts up to {}", g));
  return n;
}

std::optional<std::pair<int, int>> Coordinator::read_rejoin(int64_t g) {
  const std::string key = rejoin_key(g);
  const auto text = store_.try_get(key);
  if (!text) return std::nullopt;
  int standby = -1, node = -1, consumed = 0;
  if (std::sscanf(text->c_str(), "%d %d%n", &standby, &node, &consumed) != 2 ||
      consumed != static_cast<int>(text->size()) || standby < 0 || node < 1 ||
      node >= options_.nnodes) {
    throw MalformedValue(key, *text,
                         fmt::format("'STANDBY NODE' with NODE in 1..{}", options_.nnodes - 1));
  }
  return std::pair{standby, node};
}

std::optional<JobView> Coordinator::check_refused() {
  const auto why = store_.try_get(refused_key(standby_id_));
  if (!why) return std::nullopt;
  JobView v;
  v.state = JobView::State::kEnded;
  v.lost_coordinator = true;  // nobody waits for this standby
  v.why = *why;
  return v;
}

void Coordinator::maybe_grow(int64_t now_ns) {
  if (members_.size() >= static_cast<size_t>(options_.nnodes)) return;
  int node = -1;
  for (int n = 1; n < options_.nnodes && node < 0; ++n) {
    if (!member(n)) node = n;
  }
  if (node < 0) return;
  // A member whose workers are done: the job is finishing, not worth a stop.
  for (const int n : members_) {
    if (store_.try_get(stopped_key(generation_, n))) return;
  }
  // On all the nodes the layout is node 0's own; on fewer it must scale.
  if (options_.train_dp != 0 && members_.size() + 1 < static_cast<size_t>(options_.nnodes) &&
      !scaled_layout(members_.size() + 1)) {
    return;
  }
  const int64_t settled_ns = options_.agent_timeout_ms * kNsPerMs;
  for (const int s : standbys_->pick(now_ns, SIZE_MAX, settled_ns)) {
    const auto host = store_.try_get(standby_host_key(s));
    if (host && !host->empty()) {
      const std::string key = losses_key(*host);
      const auto losses = store_.try_get(key);
      if (losses && parse_count(key, *losses) >= kQuarantineLosses) {
        store_.set(refused_key(s),
                   fmt::format("standby {} is refused: its machine '{}' was declared lost {} times "
                               "in this job, so it is quarantined and not readmitted (start the "
                               "joiner on another machine)",
                               s, *host, parse_count(key, *losses)));
        standbys_->refuse(s);
        continue;
      }
    }
    // The decision first, then the report the others poll: an agent that
    // sees the report always finds it a rejoin.
    store_.set(rejoin_key(generation_), fmt::format("{} {}", s, node));
    store_.add(reports_key(generation_), 1);
    return;
  }
}

void Coordinator::grow(int64_t now_ns, int standby, int node) {
  const std::vector<int> alive = standbys_->pick(now_ns, SIZE_MAX);
  const bool joins = std::find(alive.begin(), alive.end(), standby) != alive.end();
  next_members_ = members_;
  Incident cause;
  cause.kind = "rejoin";
  cause.node = node;
  cause.rank = -1;
  cause.generation = generation_;
  cause.last_step = -1;
  if (joins) {
    next_members_.push_back(node);
    std::sort(next_members_.begin(), next_members_.end());
    standbys_->assign(standby, node, generation_ + 1);
    store_.set(replaced_key(generation_ + 1, node), fmt::format("standby {}", standby));
    store_.set(rejoined_key(node), std::to_string(generation_ + 1));
    // Watched from now on under the joiner's own key.
    beat_keys_[node] = standby_beat_key(standby);
    last_beat_[node] = -1;
    beat_changed_ns_[node] = now_ns;
    holder_[static_cast<size_t>(node)] = standby;
  }
  // A joiner that went silent stopped the job for nothing: a loss of its
  // machine, so that one that keeps doing so is quarantined as one lost
  // twice (a joiner restarted after every settle would stop the job forever).
  int64_t losses = 0;
  std::string host;
  if (!joins) {
    if (const auto h = store_.try_get(standby_host_key(standby)); h && !h->empty()) {
      host = *h;
      losses = store_.add(losses_key(host), 1);
    }
  }
  write_next_layout();
  const std::string layout =
      next_layout_ ? fmt::format(" (parallel.dp {}, train.grad_accum {}: the same global batch)",
                                 next_layout_->dp, next_layout_->grad_accum)
                   : "";
  cause.what =
      joins ? fmt::format(
                  "node {} rejoins: standby {} takes its place from generation {}, the job grows "
                  "back to {} of its {} nodes{}; no restart used",
                  node, standby, generation_ + 1, next_members_.size(), options_.nnodes, layout)
            : fmt::format(
                  "rejoin aborted: standby {} went silent before it could rejoin as node {}, "
                  "which stays out; counted as a loss of its machine '{}' ({} of the {} that "
                  "quarantine it); the job goes on with its {} of {} nodes; no restart used",
                  standby, node, host, losses, kQuarantineLosses, next_members_.size(),
                  options_.nnodes);
  cause.nodes = static_cast<int>(next_members_.size());
  // Before the generation opens: every agent reads them there.
  store_.set(members_key(generation_ + 1), members_text(next_members_));
  store_.set(restarts_key(generation_ + 1), std::to_string(restarts_used_));
  write_worker_store(generation_ + 1);
  store_.set(cause_key(generation_), report_json(cause).dump());
  store_.set(open_key(generation_ + 1), std::to_string(generation_ + 1));
}

}  // namespace brigade::elastic
