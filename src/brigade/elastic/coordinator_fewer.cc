// The coordinator's part in going on with fewer nodes (`--nnodes MIN:MAX`):
// the leader leaving lost nodes that no standby replaces out of the next
// generation, and every agent reading where its node stands in it. Kept
// apart from coordinator.cc, which runs generations the same with every
// node or fewer.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/coordinator_keys.h"

namespace brigade::elastic {

namespace detail {

std::string members_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/members", g));
}

std::string members_text(const std::vector<int>& members) {
  std::string text;
  for (const int n : members) text += fmt::format("{}{}", text.empty() ? "" : " ", n);
  return text;
}

std::vector<int> parse_members(const std::string& key, const std::string& value, int nnodes) {
  const std::string expected = fmt::format(
      "the nodes of a generation (increasing node ranks 0..{}, node 0 first, separated by "
      "spaces)",
      nnodes - 1);
  std::vector<int> members;
  std::istringstream in(value);
  for (std::string word; in >> word;) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || n < 0 || n >= nnodes ||
        (!members.empty() && n <= members.back())) {
      throw MalformedValue(key, value, expected);
    }
    members.push_back(static_cast<int>(n));
  }
  if (members.empty() || members.front() != 0) throw MalformedValue(key, value, expected);
  return members;
}

}  // namespace detail

using namespace detail;

bool Coordinator::member(int node) const {
  return std::find(members_.begin(), members_.end(), node) != members_.end();
}

int Coordinator::member_index() const {
  const auto it = std::find(members_.begin(), members_.end(), node_rank());
  return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

bool Coordinator::may_go_on_with_fewer(size_t lost) const {
  return options_.min_nnodes > 0 && options_.min_nnodes < options_.nnodes &&
         members_.size() >= lost + static_cast<size_t>(options_.min_nnodes);
}

void Coordinator::leave_out(const std::vector<int>& nodes, Incident& cause) {
  std::vector<int>& next = next_members_;
  next.clear();
  for (const int n : members_) {
    if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) next.push_back(n);
  }
  // Each surviving node's new rank, where it changed.
  std::string renumbered;
  for (size_t i = 0; i < next.size(); ++i) {
    if (next[i] != static_cast<int>(i)) {
      renumbered += fmt::format("{}node {} -> {}", renumbered.empty() ? "" : ", ", next[i], i);
    }
  }
  const std::string what = fmt::format(
      "; no standby node is free: the job goes on with {} of its {} nodes in generation {}{}",
      next.size(), options_.nnodes, generation_ + 1,
      renumbered.empty() ? "" : fmt::format(" ({})", renumbered));
  for (auto& [n, lost] : lost_) {
    if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) continue;
    lost.what += what;
    lost.nodes = static_cast<int>(next.size());
    if (cause.node == n) cause.what = lost.what;
  }
  cause.nodes = static_cast<int>(next.size());
}

}  // namespace brigade::elastic
