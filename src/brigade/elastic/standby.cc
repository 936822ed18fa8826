#include "brigade/elastic/standby.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "brigade/core/clock.h"
#include "brigade/elastic/coordinator_keys.h"

namespace brigade::elastic {
namespace {

// How many standbys registered: capped, so that a count no agent would
// reach cannot make the leader watch millions of keys.
int64_t read_standby_count(CoordinatorStore& store) {
  const std::string key = standby_count_key();
  const auto value = store.try_get(key);
  if (!value) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(value->c_str(), &end, 10);
  if (value->empty() || *end != '\0' || n < 0 || n > 1'000'000) {
    throw MalformedValue(key, *value, "a count of standbys from 0 to 1000000");
  }
  return n;
}

}  // namespace

std::string standby_count_key() {
  return coordinator_key("standby/count");
}
std::string standby_beat_key(int standby) {
  return coordinator_key(fmt::format("standby/{}/beat", standby));
}
std::string standby_node_key(int standby) {
  return coordinator_key(fmt::format("standby/{}/node", standby));
}
std::string standby_release_key() {
  return coordinator_key("standby/release");
}

std::optional<StandbyAssignment> read_assignment(CoordinatorStore& store, int standby, int nnodes) {
  const std::string key = standby_node_key(standby);
  const auto value = store.try_get(key);
  if (!value) return std::nullopt;
  // Node 0 leads for good unless the store elects another leader.
  const int lowest = store.elects_leader() ? 0 : 1;
  StandbyAssignment a;
  long long generation = 0;
  int consumed = 0;
  if (std::sscanf(value->c_str(), "%d %lld%n", &a.node, &generation, &consumed) != 2 ||
      consumed != static_cast<int>(value->size()) || a.node < lowest || a.node >= nnodes ||
      generation < 1) {
    throw MalformedValue(key, *value,
                         fmt::format("'NODE GENERATION' with NODE in {}..{} and GENERATION >= 1",
                                     lowest, nnodes - 1));
  }
  a.generation = generation;
  return a;
}

void StandbyPool::take_assigned(int64_t now_ns) {
  watch(now_ns);
  for (size_t s = 0; s < standbys_.size(); ++s) {
    if (store_.try_get(standby_node_key(static_cast<int>(s)))) standbys_[s].taken = true;
  }
}

void StandbyPool::watch(int64_t now_ns) {
  const int64_t count = read_standby_count(store_);
  while (static_cast<int64_t>(standbys_.size()) < count) {
    standbys_.push_back({.beat = -1,
                         .changed_ns = now_ns,
                         .moved = false,
                         .moving_since_ns = now_ns,
                         .taken = false});
  }
  for (size_t s = 0; s < standbys_.size(); ++s) {
    Standby& standby = standbys_[s];
    if (standby.taken) continue;
    // A beat is a counter like the nodes' (5 a second passes a million in
    // 55 hours): no cap.
    const std::string key = standby_beat_key(static_cast<int>(s));
    const auto value = store_.try_get(key);
    const int64_t beat = value ? detail::parse_count(key, *value) : 0;
    if (beat == standby.beat) continue;
    // The first value read is no movement: it may be a dead standby's last.
    const bool was_moving =
        standby.moved && now_ns - standby.changed_ns <= agent_timeout_ms_ * kNsPerMs;
    standby.moved = standby.beat >= 0;
    if (!was_moving) standby.moving_since_ns = now_ns;
    standby.beat = beat;
    standby.changed_ns = now_ns;
  }
}

std::vector<int> StandbyPool::pick(int64_t now_ns, size_t count, int64_t settled_ns) const {
  std::vector<int> free;
  for (size_t s = 0; s < standbys_.size() && free.size() < count; ++s) {
    const Standby& standby = standbys_[s];
    if (standby.taken || !standby.moved) continue;
    if (now_ns - standby.changed_ns > agent_timeout_ms_ * kNsPerMs) continue;
    if (now_ns - standby.moving_since_ns < settled_ns) continue;
    free.push_back(static_cast<int>(s));
  }
  return free;
}

void StandbyPool::assign(int standby, int node, int64_t generation) {
  standbys_.at(static_cast<size_t>(standby)).taken = true;
  store_.set(standby_node_key(standby), fmt::format("{} {}", node, generation));
}

}  // namespace brigade::elastic
