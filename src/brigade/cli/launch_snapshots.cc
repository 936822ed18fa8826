#include "brigade/cli/launch_snapshots.h"

#include <fmt/format.h>

#include <cstdio>

#include "brigade/core/error.h"

namespace brigade::cli {

LaunchSnapshots set_up_snapshots(const LaunchOptions& o, elastic::AgentOptions& agent,
                                 const std::string& store_host, uint16_t store_port,
                                 const std::string& token) {
  LaunchSnapshots s;
  // Only the agent's own area, never one the user's environment names.
  agent.environment.unset(elastic::kSnapshotDirVariable);
  agent.environment.unset(elastic::kSnapshotPartsVariable);
  // In-memory snapshots exist to be restarted from: only with restarts.
  if (!agent.brigade_train || o.max_restarts <= 0) return s;
  std::optional<elastic::SnapshotArea> area = elastic::SnapshotArea::create();
  if (!area) return s;
  s.area.emplace(std::move(*area));
  if (o.nnodes > 1) {
    try {
      elastic::SnapshotSync::Options sync;
      sync.area = s.area->path();
      sync.host = elastic::local_address_towards(store_host, store_port);
      sync.token = token;
      sync.nnodes = o.nnodes;
      sync.store = agent.store;
      s.sync = std::make_unique<elastic::SnapshotSync>(std::move(sync));
    } catch (const Error& e) {
      fmt::print(stderr,
                 "brigade launch: no in-memory snapshots across nodes: {}; restarts resume from "
                 "the newest disk checkpoint\n",
                 e.what());
      s.area.reset();
      return s;
    }
    agent.snapshot_sync = s.sync.get();
    agent.environment.set(elastic::kSnapshotPartsVariable, "1");
  }
  agent.snapshot_dir = s.area->path().string();
  agent.environment.set(elastic::kSnapshotDirVariable, agent.snapshot_dir);
  return s;
}

}  // namespace brigade::cli
