#include "brigade/comm/world.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "brigade/comm/gloo_communicator.h"
#include "brigade/comm/hierarchical_communicator.h"
#include "brigade/comm/shm_communicator.h"
#include "brigade/core/error.h"

namespace brigade {
namespace {

constexpr const char* kLaunchHint =
    "run the worker under `brigade launch --nproc-per-node N -- <verb> ...`, which sets it";

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw_error("environment variable {} is not set: {}", name, kLaunchHint);
  }
  return value;
}

int required_int_env(const char* name, int min_value) {
  const std::string text = required_env(name);
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min_value) {
    throw_error("environment variable {}='{}' is not an integer >= {}: {}", name, text, min_value,
                kLaunchHint);
  }
  return value;
}

// FNV-1a, 64 bits: stable across builds and platforms, which std::hash is not
// promised to be, and every rank must derive the same name.
uint64_t fnv1a_64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace

WorldEnvironment read_world_environment() {
  WorldEnvironment world;
  world.world_rank = required_int_env("RANK", 0);
  world.world_size = required_int_env("WORLD_SIZE", 1);
  world.local_rank = required_int_env("LOCAL_RANK", 0);
  world.local_world_size = required_int_env("LOCAL_WORLD_SIZE", 1);
  world.master_addr = required_env("MASTER_ADDR");
  world.master_port = required_int_env("MASTER_PORT", 1);
  world.store_token = required_env("BRIGADE_STORE_TOKEN");
  if (const char* generation = std::getenv("BRIGADE_GENERATION"); generation != nullptr) {
    world.generation = required_int_env("BRIGADE_GENERATION", 0);
  }
  if (world.world_rank >= world.world_size) {
    throw_error("RANK={} is not below WORLD_SIZE={}: {}", world.world_rank, world.world_size,
                kLaunchHint);
  }
  if (world.local_rank >= world.local_world_size || world.local_world_size > world.world_size) {
    throw_error("LOCAL_RANK={}, LOCAL_WORLD_SIZE={}, WORLD_SIZE={} do not fit together: {}",
                world.local_rank, world.local_world_size, world.world_size, kLaunchHint);
  }
  return world;
}

std::string shm_segment_name(const std::string& store_token, const std::string& group_name,
                             int64_t generation) {
  if (generation == 0) return fmt::format("/brigade-{:016x}-{}", fnv1a_64(store_token), group_name);
  return fmt::format("/brigade-{:016x}-g{}-{}", fnv1a_64(store_token), generation, group_name);
}

namespace {

// world_ranks: each group rank's world rank, or empty for the world's own numbering.
std::unique_ptr<ShmCommunicator> connect_shm(const WorldEnvironment& world,
                                             const std::string& group, int rank, int size,
                                             int64_t timeout_ms, int64_t shared_bytes,
                                             std::vector<int> world_ranks = {}) {
  ShmCommunicatorOptions options;
  options.segment_name = shm_segment_name(world.store_token, group, world.generation);
  options.group_name = group;
  options.rank = rank;
  options.size = size;
  options.timeout_ms = timeout_ms;
  options.shared_bytes = shared_bytes;
  options.world_ranks = std::move(world_ranks);
  return std::make_unique<ShmCommunicator>(std::move(options));
}

std::unique_ptr<GlooCommunicator> connect_gloo(const WorldEnvironment& world,
                                               const std::string& group, int rank, int size,
                                               int64_t timeout_ms,
                                               std::vector<int> world_ranks = {}) {
  GlooCommunicatorOptions options;
  options.store_host = world.master_addr;
  if (world.master_port > 65535) {
    throw_error("MASTER_PORT={} is not a TCP port: {}", world.master_port, kLaunchHint);
  }
  options.store_port = static_cast<uint16_t>(world.master_port);
  options.store_token = world.store_token;
  options.generation = world.generation;
  options.group_name = group;
  options.rank = rank;
  options.size = size;
  options.timeout_ms = timeout_ms;
  options.world_ranks = std::move(world_ranks);
  if (world.world_size != world.local_world_size) {
    // Peers on other nodes cannot reach 127.0.0.1, nor, often, this host's
    // name (see advertised_address.h).
    if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
      options.bind_interface = interface;
      options.bind_interface_source = "GLOO_SOCKET_IFNAME, which `brigade launch --iface` sets";
    } else {
      options.bind_hostname.clear();  // the address this rank reaches the store from
    }
  }
  return std::make_unique<GlooCommunicator>(std::move(options));
}

}  // namespace

std::unique_ptr<Communicator> connect_world(const std::string& backend, int64_t timeout_ms,
                                            int64_t shm_shared_bytes) {
  if (backend != "auto" && backend != "shm" && backend != "gloo" && backend != "hierarchical") {
    throw_error(
        "unknown communication backend '{}': use auto, shm (one node), gloo (TCP) or "
        "hierarchical (shm within nodes, gloo between them)",
        backend);
  }
  const WorldEnvironment world = read_world_environment();
  const bool one_node = world.world_size == world.local_world_size;
  if (backend == "shm" && !one_node) {
    throw_error(
        "the shm backend works within one node, but this job has {} workers of which {} are on "
        "this node: use --backend gloo or hierarchical for a multi-node job",
        world.world_size, world.local_world_size);
  }
  if (backend == "shm" || (backend == "auto" && one_node)) {
    return connect_shm(world, "world", world.world_rank, world.world_size, timeout_ms,
                       shm_shared_bytes);
  }
  if (backend == "gloo") {
    return connect_gloo(world, "world", world.world_rank, world.world_size, timeout_ms);
  }
  // Hierarchical: brigade launch numbers ranks node by node.
  const int node = world.world_rank / world.local_world_size;
  const int num_nodes = world.world_size / world.local_world_size;
  std::vector<int> leader_ranks, node_ranks;  // as world ranks, for the flight recorder
  for (int n = 0; n < num_nodes; ++n) leader_ranks.push_back(n * world.local_world_size);
  for (int l = 0; l < world.local_world_size; ++l) {
    node_ranks.push_back(node * world.local_world_size + l);
  }
  std::unique_ptr<Communicator> leaders;
  if (world.local_rank == 0) {
    leaders = connect_gloo(world, "world.leaders", node, num_nodes, timeout_ms, leader_ranks);
  }
  auto node_group = connect_shm(world, fmt::format("world.node{}", node), world.local_rank,
                                world.local_world_size, timeout_ms, shm_shared_bytes, node_ranks);
  // Pipeline neighbours on different nodes talk directly, not through leaders.
  auto cross_node =
      connect_gloo(world, "world.p2p", world.world_rank, world.world_size, timeout_ms);
  return std::make_unique<HierarchicalCommunicator>(
      "world", std::move(node_group), std::move(leaders), num_nodes, std::move(cross_node));
}

std::unique_ptr<Communicator> connect_group(const std::string& backend, const std::string& name,
                                            const std::vector<int>& members, int64_t timeout_ms,
                                            int64_t shm_shared_bytes) {
  const WorldEnvironment world = read_world_environment();
  const auto me = std::find(members.begin(), members.end(), world.world_rank);
  BRIGADE_CHECK(me != members.end(), "connect_group: this worker is not a member of the group");
  const int rank = static_cast<int>(me - members.begin());
  const int size = static_cast<int>(members.size());
  const int node = world.world_rank / world.local_world_size;
  const bool one_node = std::all_of(members.begin(), members.end(),
                                    [&](int r) { return r / world.local_world_size == node; });
  if (backend == "shm" && !one_node) {
    throw_error(
        "the shm backend works within one node, but group {} spans nodes: use gloo or "
        "hierarchical for a multi-node job",
        name);
  }
  if (backend != "gloo" && one_node) {
    return connect_shm(world, name, rank, size, timeout_ms, shm_shared_bytes, members);
  }
  return connect_gloo(world, name, rank, size, timeout_ms, members);
}

}  // namespace brigade
