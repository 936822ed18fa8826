// The in-memory snapshots of a `brigade launch` (elastic/snapshots.h): a
// restartable `brigade train` (--max-restarts > 0) gets a SnapshotArea for
// its workers' snapshots; across nodes also a SnapshotSync
// (elastic/snapshot_sync.h), whose ReplicaServer listens on the address this
// node reaches the store from, so every node's agent can reach it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "brigade/cli/launcher.h"
#include "brigade/elastic/agent.h"
#include "brigade/elastic/snapshot_sync.h"
#include "brigade/elastic/snapshots.h"

namespace brigade::cli {

struct LaunchSnapshots {
  std::optional<elastic::SnapshotArea> area;
  std::unique_ptr<elastic::SnapshotSync> sync;  // multi-node only
};

// Sets agent.snapshot_dir, the workers' variables and agent.snapshot_sync
// (agent.store must be set for a multi-node job); none when the job
// cannot be restarted, or the area or the server cannot be had (the reason
// on stderr: restarts then resume from the newest disk checkpoint).
LaunchSnapshots set_up_snapshots(const LaunchOptions& o, elastic::AgentOptions& agent,
                                 const std::string& store_host, uint16_t store_port,
                                 const std::string& token);

}  // namespace brigade::cli
