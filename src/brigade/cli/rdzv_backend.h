// Where the coordinator of a multi-node `brigade launch` keeps its state
// (elastic/coordinator.h): --rdzv-backend tcp (the default), the store node
// 0's launcher hosts, or --rdzv-backend etcd --rdzv-endpoints URL[,URL], an
// etcd the operator runs (elastic/etcd_store.h: the job's token is the
// password of the job's etcd user). Either way node 0's launcher hosts the
// rendezvous store the launchers meet in and generation 0's workers
// connect through (comm/world.h); with etcd its address is published under
// the run's brigade/coord/gen/0/worker_store, every other launcher hosts a
// store too, and the leader names its own for every generation it opens
// (gen/<g>/worker_store), so that a node elected after node 0 was lost
// hosts the next generation's. The run's id (elastic/etcd_store.h) goes to
// the other launchers through node 0's store.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "brigade/cli/launcher.h"
#include "brigade/comm/tcp_store.h"
#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/etcd_store.h"

namespace brigade::cli {

// Throws Error naming the fix for a backend other than tcp or etcd, etcd
// without endpoints (or on one node), endpoints without etcd, or a
// malformed endpoint list.
void check_rdzv_backend(const LaunchOptions& o);

class CoordinatorBackend {
 public:
  // With etcd: authenticates there now (an unreachable endpoint, a wrong
  // token or one under 16 characters is one Error naming the fix, before
  // this node joins anything), and node 0 takes the token's prefix for a
  // new run (Error if another job under the token holds it).
  CoordinatorBackend(const LaunchOptions& o, const std::string& token, int64_t call_timeout_ms);
  ~CoordinatorBackend();

  // Node 0, once it hosts the rendezvous store at host:port: with etcd,
  // publishes that address. Throws Error if etcd did not take it.
  void publish_worker_store(const std::string& host, uint16_t port);
  // Node 0, before it joins the rendezvous: with etcd, the run's id for
  // the other launchers.
  void publish_run(TcpStore& rendezvous);
  // The coordinator's store, once this node joined `rendezvous` (host:port):
  // with etcd the run node 0 published there; for the tcp backend the
  // rendezvous store itself (a client of its own with the short call
  // timeout).
  elastic::CoordinatorStore& open(TcpStore& rendezvous, const std::string& host, uint16_t port);

  // With etcd any node may come to lead (elastic/coordinator.h), so every
  // node's launcher hosts a store for its workers, which the leader names
  // for each generation it opens.
  bool etcd() const { return etcd_ != nullptr; }
  // With etcd, the end of the job: this node's launcher says it is done
  // (its workers no longer use any node's store), and the launcher of the
  // node that led at the end, whose store the last generation's workers
  // used, waits until every node still in the job said so (`out`: the
  // nodes out of it, never to say), up to the rendezvous timeout. `node`:
  // the node this launcher ran (-1: a standby never given one).
  void finish(int node, int exit_status, bool led, const std::vector<int>& out);

 private:
  const LaunchOptions& options_;
  std::string token_;
  int64_t call_timeout_ms_;
  std::unique_ptr<elastic::EtcdCoordinatorStore> etcd_;
  std::optional<TcpStore> client_;
  std::optional<elastic::TcpCoordinatorStore> tcp_;
};

}  // namespace brigade::cli
