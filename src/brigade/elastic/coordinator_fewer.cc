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

std::string train_layout_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/train_layout", g));
}

std::string worker_store_key(int64_t g) {
  return coordinator_key(fmt::format("gen/{}/worker_store", g));
}

std::string members_text(const std::vector<int>& members) {
  std::string text;
  for (const int n : members) text += fmt::format("{}{}", text.empty() ? "" : " ", n);
  return text;
}

std::vector<int> parse_members(const std::string& key, const std::string& value, int nnodes,
                               bool node0_optional) {
  const std::string expected =
      fmt::format("the nodes of a generation (increasing node ranks 0..{}{}, separated by spaces)",
                  nnodes - 1, node0_optional ? "" : ", node 0 first");
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
  if (members.empty() || (!node0_optional && members.front() != 0)) {
    throw MalformedValue(key, value, expected);
  }
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

std::vector<int> Coordinator::nodes_lost_unreplaced() const {
  std::vector<int> out;
  for (int n = 0; n < options_.nnodes; ++n) {
    const std::string key = lost_key(n);
    const auto lost_in = store_.try_get(key);
    if (!lost_in) continue;
    const int64_t g = parse_count(key, *lost_in);
    // A joiner that took the node back later (coordinator_rejoin.cc).
    const std::string rejoined = rejoined_key(n);
    const auto back = store_.try_get(rejoined);
    if (back && parse_count(rejoined, *back) > g) continue;
    if (!store_.try_get(replaced_key(g + 1, n))) {
      out.push_back(n);
    }
  }
  return out;
}

bool Coordinator::may_go_on_with_fewer(size_t lost) const {
  return options_.min_nnodes > 0 && options_.min_nnodes < options_.nnodes &&
         members_.size() >= lost + static_cast<size_t>(options_.min_nnodes) &&
         // The launcher refused node counts the layout does not scale to.
         (options_.train_dp == 0 || scaled_layout(members_.size() - lost));
}

std::optional<Coordinator::TrainLayout> Coordinator::scaled_layout(size_t nodes) const {
  const int64_t dp = options_.train_dp, accum = options_.train_grad_accum;
  const auto k = static_cast<int64_t>(nodes);
  if (dp < 1 || accum < 1 || dp * k % options_.nnodes != 0) return std::nullopt;
  const int64_t fewer_dp = dp * k / options_.nnodes;
  if (fewer_dp < 1 || dp * accum % fewer_dp != 0) return std::nullopt;
  return TrainLayout{fewer_dp, dp * accum / fewer_dp};
}

void Coordinator::write_next_layout() {
  next_layout_.reset();
  if (options_.train_dp == 0 || next_members_.size() == static_cast<size_t>(options_.nnodes)) {
    return;
  }
  next_layout_ = scaled_layout(next_members_.size());
  if (!next_layout_) {
    throw_error("node 0's parallel.dp {} and train.grad_accum {} do not scale to {} of {} nodes",
                options_.train_dp, options_.train_grad_accum, next_members_.size(),
                options_.nnodes);
  }
  store_.set(train_layout_key(generation_ + 1),
             fmt::format("{} {}", next_layout_->dp, next_layout_->grad_accum));
}

std::optional<Coordinator::TrainLayout> Coordinator::read_layout(int64_t g) {
  const std::string key = train_layout_key(g);
  const auto text = store_.try_get(key);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  TrainLayout layout;
  std::string rest;
  if (!(in >> layout.dp >> layout.grad_accum) || (in >> rest) || layout.dp < 1 ||
      layout.grad_accum < 1) {
    throw MalformedValue(key, *text,
                         "a train layout (parallel.dp and train.grad_accum, both at least 1, "
                         "separated by a space)");
  }
  return layout;
}

std::optional<Coordinator::WorkerStore> Coordinator::read_worker_store(int64_t g) {
  const std::string key = worker_store_key(g);
  const auto text = store_.try_get(key);
  if (!text) return std::nullopt;
  const size_t colon = text->rfind(':');
  char* end = nullptr;
  errno = 0;
  const long port =
      colon == std::string::npos ? 0 : std::strtol(text->c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || end == nullptr || *end != '\0' || errno != 0 ||
      port < 1 || port > 65535) {
    throw MalformedValue(key, *text, "a store's address (HOST:PORT)");
  }
  return WorkerStore{text->substr(0, colon), static_cast<uint16_t>(port)};
}

void Coordinator::write_worker_store(int64_t g) {
  if (!options_.worker_store.empty()) store_.set(worker_store_key(g), options_.worker_store);
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
