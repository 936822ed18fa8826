// Root cause of an incident from its evidence (flight recorders, agent
// views, corruption reports). Over 600 lines: one rule per fault kind, each
// short, all reading the same parsed evidence.
#include "brigade/diag/root_cause.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <utility>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/elastic/incident_evidence.h"

namespace brigade::diag {
namespace fs = std::filesystem;
namespace {

// "shm all_reduce(count 1, f64, max)" -> "all_reduce(count 1, f64, max)":
// the backend is the same on every rank and says nothing about the cause.
std::string without_backend(const std::string& op) {
  const size_t paren = op.find('(');
  if (paren == std::string::npos) return op;
  const size_t space = op.rfind(' ', paren);
  return space == std::string::npos ? op : op.substr(space + 1);
}

// "all_reduce".
std::string op_name(const std::string& op) {
  const std::string bare = without_backend(op);
  return bare.substr(0, bare.find('('));
}

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

std::string plural(int n, const char* noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

const CollectiveRecord* record_at(const GroupDump& dump, uint64_t seq) {
  for (const CollectiveRecord& r : dump.collectives) {
    if (r.seq == seq) return &r;
  }
  return nullptr;
}

const CollectiveRecord* last_record(const GroupDump& dump) {
  return dump.collectives.empty() ? nullptr : &dump.collectives.back();
}

bool unfinished(const CollectiveRecord& r) {
  return r.state != "completed";
}

// A group as the run saw it: its members and each member's dump of it.
struct GroupView {
  std::string name;
  std::vector<int> members;
  std::map<int, const GroupDump*> dumps;  // by world rank
};

std::vector<GroupView> group_views(const IncidentEvidence& evidence) {
  std::map<std::string, GroupView> views;
  for (const RankEvidence& r : evidence.ranks) {
    for (const GroupDump& g : r.groups) {
      GroupView& v = views[g.name];
      v.name = g.name;
      if (v.members.empty()) v.members = g.members;
      v.dumps[r.rank] = &g;
    }
  }
  std::vector<GroupView> out;
  for (auto& [name, view] : views) out.push_back(std::move(view));
  return out;
}

// Where ranks wait: the collective of one group that most of its members
// (other than `culprit`, and only groups holding it when given) have not
// completed.
struct Wait {
  std::string group;
  uint64_t seq = 0;
  std::string op;
  std::vector<int> ranks;
};

std::optional<Wait> where_others_wait(const std::vector<GroupView>& views, int culprit) {
  std::optional<Wait> best;
  for (const GroupView& g : views) {
    if (culprit >= 0 && std::find(g.members.begin(), g.members.end(), culprit) == g.members.end()) {
      continue;
    }
    std::map<uint64_t, Wait> by_seq;
    for (const auto& [rank, dump] : g.dumps) {
      const CollectiveRecord* last = last_record(*dump);
      if (rank == culprit || last == nullptr || !unfinished(*last)) continue;
      Wait& w = by_seq[last->seq];
      w.group = g.name;
      w.seq = last->seq;
      w.op = last->op;
      w.ranks.push_back(rank);
    }
    for (auto& [seq, w] : by_seq) {
      if (!best || w.ranks.size() > best->ranks.size()) best = w;
    }
  }
  return best;
}

const RankEvidence* find_rank(const IncidentEvidence& evidence, int rank) {
  for (const RankEvidence& r : evidence.ranks) {
    if (r.rank == rank) return &r;
  }
  return nullptr;
}

RootCause blame(const RankEvidence& r, std::string kind) {
  RootCause c;
  c.kind = std::move(kind);
  c.rank = r.rank;
  c.node = r.node;
  c.step = r.step;
  return c;
}

std::string who(const IncidentEvidence& evidence, const RootCause& c) {
  return fmt::format("incident {}: rank {} (node {})", evidence.number, c.rank, c.node);
}

// "..., before all_reduce #12 of group world; 3 ranks were waiting for it there".
void add_wait(const std::vector<GroupView>& views, RootCause& c) {
  const std::optional<Wait> wait = where_others_wait(views, c.rank);
  if (!wait) {
    c.line += fmt::format(" after step {}", c.step);
    return;
  }
  c.group = wait->group;
  c.seq = wait->seq;
  c.op = without_backend(wait->op);
  c.waiting = static_cast<int>(wait->ranks.size());
  c.line +=
      fmt::format(" after step {}, before {} #{} of group {}; {} waiting for it there", c.step,
                  op_name(wait->op), wait->seq, wait->group,
                  c.waiting == 1 ? std::string("1 rank was") : plural(c.waiting, "rank") + " were");
}

// Whether `odd` ran at seq what `ref` runs right after its own op there: it
// skipped that one. The group repeats its collectives every step, so ref's
// history holds the pair.
bool skipped_at(const GroupDump& odd, const GroupDump& ref, uint64_t seq) {
  const CollectiveRecord* mine = record_at(odd, seq);
  const CollectiveRecord* theirs = record_at(ref, seq);
  if (mine == nullptr || theirs == nullptr) return false;
  for (size_t i = 1; i < ref.collectives.size(); ++i) {
    const CollectiveRecord& before = ref.collectives[i - 1];
    const CollectiveRecord& after = ref.collectives[i];
    if (after.seq == before.seq + 1 && before.op == theirs->op && after.op == mine->op) return true;
  }
  return false;
}

bool ran_anywhere(const GroupDump& dump, const std::string& op) {
  return std::any_of(dump.collectives.begin(), dump.collectives.end(),
                     [&](const CollectiveRecord& r) { return r.op == op; });
}

// The first sequence number at which a group's ranks disagree, and who the
// odd one out is.
std::optional<RootCause> disagreement(const IncidentEvidence& evidence,
                                      const std::vector<GroupView>& views) {
  for (const GroupView& g : views) {
    std::set<uint64_t> seqs;
    for (const auto& [rank, dump] : g.dumps) {
      for (const CollectiveRecord& r : dump->collectives) seqs.insert(r.seq);
    }
    for (uint64_t seq : seqs) {
      std::map<std::string, std::vector<int>> by_op;
      for (const auto& [rank, dump] : g.dumps) {
        if (const CollectiveRecord* r = record_at(*dump, seq)) by_op[r->op].push_back(rank);
      }
      if (by_op.size() < 2) continue;
      // The odd rank: alone against a majority; with no majority (two
      // ranks), the one whose call the other's history explains as a skip,
      // or whose call the other never made.
      std::vector<std::pair<std::string, std::vector<int>>> ops(by_op.begin(), by_op.end());
      std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) {
        return a.second.size() > b.second.size();
      });
      int odd = -1, ref = -1;
      if (ops[0].second.size() > ops[1].second.size()) {
        ref = ops[0].second.front();
        for (size_t i = 1; i < ops.size() && odd < 0; ++i) odd = ops[i].second.front();
      } else {
        for (size_t a = 0; a < ops.size() && odd < 0; ++a) {
          for (size_t b = 0; b < ops.size() && odd < 0; ++b) {
            if (a == b) continue;
            const GroupDump& da = *g.dumps.at(ops[a].second.front());
            const GroupDump& db = *g.dumps.at(ops[b].second.front());
            if (skipped_at(da, db, seq) || !ran_anywhere(db, ops[a].first)) {
              odd = ops[a].second.front();
              ref = ops[b].second.front();
            }
          }
        }
        if (odd < 0) {
          odd = ops[1].second.front();
          ref = ops[0].second.front();
        }
      }
      const RankEvidence* culprit = find_rank(evidence, odd);
      if (culprit == nullptr) continue;
      const GroupDump& odd_dump = *g.dumps.at(odd);
      const GroupDump& ref_dump = *g.dumps.at(ref);
      const std::string theirs = record_at(ref_dump, seq)->op;
      const std::string mine = record_at(odd_dump, seq)->op;
      const int others = static_cast<int>(by_op.at(theirs).size());
      // Another kind of collective where the others wait is a skip even
      // when the history has no such pair yet (a skip right after the first
      // step); the same kind with another shape is a mismatch.
      const bool skip = skipped_at(odd_dump, ref_dump, seq) || op_name(mine) != op_name(theirs);
      RootCause c = blame(*culprit, skip ? "skip" : "mismatch");
      c.group = g.name;
      c.seq = seq;
      c.op = without_backend(theirs);
      c.waiting = others;
      if (skip) {
        c.line = fmt::format(
            "{} skipped {} #{} of group {} after step {}: it ran the group's next collective, "
            "{}, in its place; {} ran {}",
            who(evidence, c), op_name(theirs), seq, g.name, c.step, without_backend(mine),
            plural(others, "rank"), without_backend(theirs));
      } else {
        c.line = fmt::format(
            "{} called {} #{} of group {} with another shape after step {} (a mismatch): {} "
            "where {} called {}",
            who(evidence, c), op_name(theirs), seq, g.name, c.step, without_backend(mine),
            plural(others, "rank"), without_backend(theirs));
      }
      return c;
    }
  }
  return std::nullopt;
}

bool silent(const RankEvidence& r) {
  return r.running && (r.stopped || (r.beat_age_ms && *r.beat_age_ms > kSilentBeatMs));
}

// Among `candidates`, the agent's own first failure if it is one, else the lowest rank.
const RankEvidence* preferred(const IncidentEvidence& evidence,
                              const std::vector<const RankEvidence*>& candidates) {
  if (candidates.empty()) return nullptr;
  for (const RankEvidence* r : candidates) {
    if (r->rank == evidence.detected_rank) return r;
  }
  return *std::min_element(
      candidates.begin(), candidates.end(),
      [](const RankEvidence* a, const RankEvidence* b) { return a->rank < b->rank; });
}

// A live rank behind the collective the others wait in.
std::optional<RootCause> behind(const IncidentEvidence& evidence,
                                const std::vector<GroupView>& views) {
  const std::optional<Wait> wait = where_others_wait(views, -1);
  if (!wait) return std::nullopt;
  const GroupView& g = *std::find_if(views.begin(), views.end(),
                                     [&](const GroupView& v) { return v.name == wait->group; });
  int64_t waiter_step = 0;
  for (int rank : wait->ranks) {
    if (const RankEvidence* r = find_rank(evidence, rank))
      waiter_step = std::max(waiter_step, r->step);
  }
  for (int member : g.members) {
    if (std::find(wait->ranks.begin(), wait->ranks.end(), member) != wait->ranks.end()) continue;
    const RankEvidence* r = find_rank(evidence, member);
    if (r == nullptr || !r->running) continue;
    const auto dump = g.dumps.find(member);
    const CollectiveRecord* last = dump != g.dumps.end() ? last_record(*dump->second) : nullptr;
    if (last != nullptr && last->seq >= wait->seq) continue;
    // Moved on: waiting in another group's collective, or a step ahead.
    bool waits_elsewhere = false;
    for (const GroupDump& other : r->groups) {
      const CollectiveRecord* l = last_record(other);
      if (other.name != g.name && l != nullptr && unfinished(*l)) waits_elsewhere = true;
    }
    const bool moved_on = waits_elsewhere || r->step > waiter_step;
    RootCause c = blame(*r, moved_on ? "skip" : "hang");
    c.group = g.name;
    c.seq = wait->seq;
    c.op = without_backend(wait->op);
    c.waiting = static_cast<int>(wait->ranks.size());
    const std::string waiting =
        c.waiting == 1 ? std::string("1 rank was") : plural(c.waiting, "rank") + " were";
    if (moved_on) {
      c.line = fmt::format(
          "{} skipped {} #{} of group {} after step {} and went on; {} waiting for it there",
          who(evidence, c), op_name(wait->op), wait->seq, g.name, c.step, waiting);
    } else {
      c.line = fmt::format(
          "{} stopped making progress after step {}, before {} #{} of group {}; {} waiting for it "
          "there",
          who(evidence, c), c.step, op_name(wait->op), wait->seq, g.name, waiting);
    }
    return c;
  }
  return std::nullopt;
}

// "rank 2 (node 0)", "ranks 0 (node 0) and 1 (node 0)".
std::string ranks_with_nodes(const IncidentEvidence& evidence, const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankEvidence* r = find_rank(evidence, ranks[i]);
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out +=
        r != nullptr ? fmt::format("{} (node {})", ranks[i], r->node) : fmt::format("{}", ranks[i]);
  }
  return out;
}

std::optional<RootCause> corruption(const IncidentEvidence& evidence) {
  if (evidence.corruption.empty()) return std::nullopt;
  // Every rank of the group saw the same hashes; the earliest step's report.
  const CorruptionReport& report = *std::min_element(
      evidence.corruption.begin(), evidence.corruption.end(),
      [](const CorruptionReport& a, const CorruptionReport& b) { return a.step < b.step; });
  if (report.suspects.empty() || report.hashes.size() != report.members.size()) {
    return std::nullopt;
  }
  RootCause c;
  c.kind = "sdc";
  c.suspects = report.suspects;
  c.rank = report.suspects.front();
  if (const RankEvidence* r = find_rank(evidence, c.rank)) c.node = r->node;
  c.step = report.step;
  c.group = report.group;
  const auto hash_of = [&](int rank) {
    for (size_t i = 0; i < report.members.size(); ++i) {
      if (report.members[i] == rank) return report.hashes[i];
    }
    return std::string("?");
  };
  const auto suspect = [&](int rank) {
    return std::find(report.suspects.begin(), report.suspects.end(), rank) != report.suspects.end();
  };
  const std::string head =
      fmt::format("incident {}: {}", evidence.number, ranks_with_nodes(evidence, report.suspects));
  if (!report.finding.empty()) {
    c.line = fmt::format("{}: silent data corruption after step {}: {}", head, report.step,
                         report.finding);
    return c;
  }
  if (report.suspects.size() == report.members.size()) {
    std::string seen;
    for (int rank : report.members) {
      seen += fmt::format("{}{} on rank {}", seen.empty() ? "" : ", ", hash_of(rank), rank);
    }
    c.line = fmt::format(
        "{}: silent data corruption after step {}: the {} replicas of group {} hold different {} "
        "(hashes {}); with no majority (two replicas, or a tie) nothing says which copy is right, "
        "so every one is named",
        head, report.step, report.members.size(), report.group, report.compared, seen);
    return c;
  }
  std::string majority;
  int others = 0;
  for (int rank : report.members) {
    if (suspect(rank)) continue;
    majority = hash_of(rank);
    ++others;
  }
  std::string odd;
  for (int rank : report.suspects) {
    odd += fmt::format("{}{}", odd.empty() ? "" : ", ", hash_of(rank));
  }
  c.waiting = others;
  c.line = fmt::format(
      "{}: silent data corruption after step {}: its {} differ from those of the {} of group "
      "{} (hash {} against {})",
      head, report.step, report.compared, plural(others, "other replica"), report.group, odd,
      majority);
  return c;
}

}  // namespace

RootCause find_root_cause(const IncidentEvidence& evidence) {
  const std::vector<GroupView> views = group_views(evidence);
  if (auto c = corruption(evidence)) return *c;
  // A worker killed by a signal the agent did not send: it crashed.
  std::vector<const RankEvidence*> signalled, exited, quiet;
  for (const RankEvidence& r : evidence.ranks) {
    if (!r.running && r.signal) signalled.push_back(&r);
    if (!r.running && r.exit_code && *r.exit_code != 0) exited.push_back(&r);
    if (silent(r)) quiet.push_back(&r);
  }
  if (const RankEvidence* r = preferred(evidence, signalled)) {
    RootCause c = blame(*r, "crash");
    c.line = fmt::format("{} crashed (killed by {})", who(evidence, c), signal_text(*r->signal));
    add_wait(views, c);
    return c;
  }
  if (!quiet.empty()) {
    // One the kernel holds stopped first, then the longest silent.
    const RankEvidence* r = *std::max_element(quiet.begin(), quiet.end(), [](auto* a, auto* b) {
      return std::pair(a->stopped, a->beat_age_ms.value_or(0)) <
             std::pair(b->stopped, b->beat_age_ms.value_or(0));
    });
    RootCause c = blame(*r, "hang");
    c.line = fmt::format("{} stopped responding", who(evidence, c));
    add_wait(views, c);
    return c;
  }
  if (auto c = disagreement(evidence, views)) return *c;
  if (const RankEvidence* r = preferred(evidence, exited)) {
    RootCause c = blame(*r, "crash");
    c.line = fmt::format("{} crashed (exited with status {})", who(evidence, c), *r->exit_code);
    add_wait(views, c);
    return c;
  }
  if (auto c = behind(evidence, views)) return *c;
  RootCause c;
  c.line = fmt::format("incident {}: no root cause in the evidence; the agent saw: {}",
                       evidence.number, evidence.detected_what);
  return c;
}

nlohmann::json read_evidence_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw_error("cannot read {}", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw_error("{} is not valid JSON ({}): the evidence is damaged", path.string(), e.what());
  }
}

namespace {

template <typename T>
std::optional<T> optional_field(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return j.at(key).get<T>();
}

GroupDump read_dump(const nlohmann::json& j) {
  GroupDump g;
  g.name = j.at("group").at("name").get<std::string>();
  g.members = j.at("group").at("members").get<std::vector<int>>();
  for (const nlohmann::json& r : j.at("records")) {
    if (r.at("kind") != "collective") continue;
    g.collectives.push_back({r.at("seq").get<uint64_t>(), r.at("op").get<std::string>(),
                             r.at("state").get<std::string>()});
  }
  // Oldest first by number: the ring is in id order, which a group's own
  // numbering follows, but a dump is data from outside.
  std::stable_sort(
      g.collectives.begin(), g.collectives.end(),
      [](const CollectiveRecord& a, const CollectiveRecord& b) { return a.seq < b.seq; });
  return g;
}

}  // namespace

IncidentEvidence read_incident(const fs::path& dir) {
  // Every node's agent writes its own view, agent_node<k>.json (agent.json
  // before runs spanned nodes); the lowest node's detection leads.
  std::vector<std::pair<int, fs::path>> views;
  if (fs::is_directory(dir)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name == "agent.json") {
        views.emplace_back(-1, entry.path());
        continue;
      }
      constexpr std::string_view kPrefix = "agent_node";
      if (!name.starts_with(kPrefix) || !name.ends_with(".json")) continue;
      const std::string digits = name.substr(
          kPrefix.size(), name.size() - kPrefix.size() - std::string_view(".json").size());
      if (digits.empty() || digits.size() > 6 ||
          !std::all_of(digits.begin(), digits.end(),
                       [](char ch) { return ch >= '0' && ch <= '9'; })) {
        continue;
      }
      views.emplace_back(std::stoi(digits), entry.path());
    }
  }
  if (views.empty()) {
    throw_error(
        "{} has no agent_node<k>.json: it is not the evidence of an incident (each node's agent "
        "writes its view first)",
        dir.string());
  }
  std::sort(views.begin(), views.end());
  IncidentEvidence e;
  int per_node = 1;
  for (size_t v = 0; v < views.size(); ++v) {
    const fs::path& agent_path = views[v].second;
    const nlohmann::json agent = read_evidence_json(agent_path);
    try {
      if (v == 0) {
        e.number = agent.at("incident").get<int64_t>();
        const nlohmann::json& detected = agent.at("detected");
        e.detected_rank = detected.at("rank").get<int>();
        e.detected_what = detected.at("what").get<std::string>();
        per_node = std::max(1, agent.value("nproc_per_node", 1));
      }
      for (const nlohmann::json& w : agent.at("workers")) {
        RankEvidence r;
        r.rank = w.at("rank").get<int>();
        r.node = w.at("node").get<int>();
        r.running = w.at("running").get<bool>();
        r.exit_code = optional_field<int>(w, "exit_code");
        r.signal = optional_field<int>(w, "signal");
        r.beat_age_ms = optional_field<double>(w, "beat_age_ms");
        r.stopped = w.value("stopped", false);
        r.step = w.at("step").get<int64_t>();
        const bool seen = std::any_of(e.ranks.begin(), e.ranks.end(),
                                      [&](const RankEvidence& o) { return o.rank == r.rank; });
        if (!seen) e.ranks.push_back(std::move(r));
      }
    } catch (const nlohmann::json::exception& ex) {
      throw_error("{} lacks what the agent writes ({}): the evidence is damaged",
                  agent_path.string(), ex.what());
    }
  }
  std::vector<fs::path> dumps, reports;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("flight_recorder_rank") && name.ends_with(".json")) {
      dumps.push_back(entry.path());
    }
    if (name.starts_with("sdc_rank") && name.ends_with(".json")) reports.push_back(entry.path());
  }
  std::sort(reports.begin(), reports.end());
  for (const fs::path& path : reports) {
    const nlohmann::json j = read_evidence_json(path);
    try {
      CorruptionReport r;
      r.reporter = j.at("world_rank").get<int>();
      r.step = j.at("step").get<int64_t>();
      r.group = j.at("group").get<std::string>();
      r.compared = j.at("compared").get<std::string>();
      r.members = j.at("members").get<std::vector<int>>();
      r.hashes = j.at("hashes").get<std::vector<std::string>>();
      r.suspects = j.at("suspects").get<std::vector<int>>();
      r.finding = j.value("finding", std::string());
      e.corruption.push_back(std::move(r));
    } catch (const nlohmann::json::exception& ex) {
      throw_error("{} is not a replica check's report ({}): the evidence is damaged", path.string(),
                  ex.what());
    }
  }
  std::sort(dumps.begin(), dumps.end());
  for (const fs::path& path : dumps) {
    const nlohmann::json j = read_evidence_json(path);
    try {
      const int rank = j.at("world_rank").get<int>();
      auto it = std::find_if(e.ranks.begin(), e.ranks.end(),
                             [&](const RankEvidence& r) { return r.rank == rank; });
      if (it == e.ranks.end()) {
        // Another node's rank: its agent saw it, this one did not.
        RankEvidence r;
        r.rank = rank;
        r.node = rank / per_node;
        e.ranks.push_back(std::move(r));
        it = std::prev(e.ranks.end());
      }
      it->groups.push_back(read_dump(j));
    } catch (const nlohmann::json::exception& ex) {
      throw_error("{} is not a flight recorder dump ({}): the evidence is damaged", path.string(),
                  ex.what());
    }
  }
  return e;
}

std::vector<fs::path> incident_dirs(const fs::path& run_dir) {
  if (!fs::is_directory(run_dir)) {
    throw_error("{} is not a directory: give the run directory of a job (train.run_dir)",
                run_dir.string());
  }
  std::vector<std::pair<int64_t, fs::path>> numbered;
  const fs::path root = run_dir / "incidents";
  if (fs::is_directory(root)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
      if (!entry.is_directory()) continue;
      if (const auto n = elastic::incident_number(entry.path().filename().string())) {
        numbered.emplace_back(*n, entry.path());
      }
    }
  }
  if (numbered.empty()) {
    throw_error(
        "{} holds no incident evidence (no {}/<N>/): the agent of `brigade train --nproc N` "
        "writes it there when a worker crashes, hangs or fails; a run without incidents has none",
        run_dir.string(), root.string());
  }
  std::sort(numbered.begin(), numbered.end());
  std::vector<fs::path> dirs;
  for (auto& [n, path] : numbered) dirs.push_back(std::move(path));
  return dirs;
}

std::string diagnose_incident(const fs::path& dir) {
  const RootCause cause = find_root_cause(read_incident(dir));
  write_file_atomic(dir / "cause.txt", cause.line + "\n");
  return cause.line;
}

}  // namespace brigade::diag
