// Where the coordinator of a multi-node `brigade launch` keeps its state
// (elastic/coordinator.h): --rdzv-backend tcp (the default), the store node
// 0's launcher hosts, or --rdzv-backend etcd --rdzv-endpoints URL[,URL], an
// etcd the operator runs (elastic/etcd_store.h: the job's token is the
// password of the job's etcd user). Either way node 0's launcher still hosts
// the rendezvous store the launchers meet in and the workers connect
// through (comm/world.h); with etcd its address is published under
// brigade/coord/gen/0/worker_store, where a later leader can find it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "brigade/cli/launcher.h"
#include "brigade/comm/tcp_store.h"
#include "brigade/elastic/coordinator.h"

namespace brigade::cli {

// Throws Error naming the fix for a backend other than tcp or etcd, etcd
// without endpoints (or on one node), endpoints without etcd, or a
// malformed endpoint list.
void check_rdzv_backend(const LaunchOptions& o);

class CoordinatorBackend {
 public:
  // With etcd: authenticates there now (an unreachable endpoint or a wrong
  // token is one Error naming the fix, before this node joins anything),
  // and on node 0 clears what an earlier job under the same token left.
  CoordinatorBackend(const LaunchOptions& o, const std::string& token, int64_t call_timeout_ms);
  ~CoordinatorBackend();

  // Node 0, once it hosts the rendezvous store at host:port: with etcd,
  // publishes that address. Throws Error if etcd did not take it.
  void publish_worker_store(const std::string& host, uint16_t port);
  // The coordinator's store, over the rendezvous store at host:port for the
  // tcp backend (a client of its own with the short call timeout).
  elastic::CoordinatorStore& open(const std::string& host, uint16_t port);

 private:
  const LaunchOptions& options_;
  std::string token_;
  int64_t call_timeout_ms_;
  std::unique_ptr<elastic::CoordinatorStore> etcd_;
  std::optional<TcpStore> client_;
  std::optional<elastic::TcpCoordinatorStore> tcp_;
};

}  // namespace brigade::cli
