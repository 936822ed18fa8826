#include "brigade/cli/rdzv_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"

namespace brigade::cli {
namespace {
// Where node 0 leaves the etcd run's id in the rendezvous store.
constexpr char kEtcdRunKey[] = "brigade/launch/etcd_run";
// The token is the etcd user's password: guessable ones are refused.
constexpr size_t kMinEtcdTokenChars = 16;
}  // namespace

void check_rdzv_backend(const LaunchOptions& o) {
  if (o.rdzv_backend != "tcp" && o.rdzv_backend != "etcd") {
    throw_error(
        "--rdzv-backend {}: unknown; use tcp (the store node 0 hosts, the default) or etcd "
        "(with --rdzv-endpoints)",
        o.rdzv_backend);
  }
  if (o.rdzv_backend == "tcp") {
    if (!o.rdzv_endpoints.empty()) {
      throw_error("--rdzv-endpoints names etcd's URLs: add --rdzv-backend etcd");
    }
    return;
  }
  if (o.rdzv_endpoints.empty()) {
    throw_error(
        "--rdzv-backend etcd needs --rdzv-endpoints URL[,URL] (etcd's client URLs, for example "
        "http://etcd0:2379)");
  }
  if (o.nnodes < 2) {
    throw_error("--rdzv-backend etcd coordinates several nodes: it needs --nnodes 2 or more");
  }
  // A standby waits for node 0's beat in node 0's store, which with etcd
  // is only in etcd, and after node 0's loss no launcher hosts the
  // rendezvous a joiner would meet in.
  if (o.standby) {
    throw_error(
        "--standby does not work with --rdzv-backend etcd yet: launch the standby with the "
        "default --rdzv-backend tcp job, or restart the etcd job with the replacement machine as "
        "a node");
  }
  elastic::parse_etcd_endpoints(o.rdzv_endpoints);
}

CoordinatorBackend::CoordinatorBackend(const LaunchOptions& o, const std::string& token,
                                       int64_t call_timeout_ms)
    : options_(o), token_(token), call_timeout_ms_(call_timeout_ms) {
  if (o.rdzv_backend != "etcd") return;
  if (token.size() < kMinEtcdTokenChars) {
    throw_error(
        "--rdzv-backend etcd: the job's token is the password of its etcd user and has {} "
        "characters; give one of {} or more (for example BRIGADE_RDZV_TOKEN=$(openssl rand -hex "
        "16)) and set its etcd user up with it",
        token.size(), kMinEtcdTokenChars);
  }
  etcd_ = std::make_unique<elastic::EtcdCoordinatorStore>(
      elastic::parse_etcd_endpoints(o.rdzv_endpoints), token, call_timeout_ms);
  if (o.node_rank == 0 && !o.standby) etcd_->own();
}

CoordinatorBackend::~CoordinatorBackend() = default;

void CoordinatorBackend::publish_worker_store(const std::string& host, uint16_t port) {
  if (etcd_) {
    etcd_->set(elastic::coordinator_key("gen/0/worker_store"), fmt::format("{}:{}", host, port));
  }
}

void CoordinatorBackend::publish_run(TcpStore& rendezvous) {
  if (etcd_ && !etcd_->run_id().empty()) rendezvous.set(kEtcdRunKey, etcd_->run_id());
}

elastic::CoordinatorStore& CoordinatorBackend::open(TcpStore& rendezvous, const std::string& host,
                                                    uint16_t port) {
  if (etcd_) {
    if (etcd_->run_id().empty()) etcd_->use_run(rendezvous.get(kEtcdRunKey));
    return *etcd_;
  }
  if (!tcp_) {
    client_.emplace(host, port, token_, call_timeout_ms_);
    tcp_.emplace(*client_);
  }
  return *tcp_;
}

void CoordinatorBackend::finish(int node, int exit_status, bool led, const std::vector<int>& out) {
  if (!etcd_) return;
  try {
    if (node >= 0) {
      etcd_->set(elastic::coordinator_key(fmt::format("launch/done/{}", node)),
                 std::to_string(exit_status));
    }
    if (!led) return;
    const int64_t deadline_ns = now_ns() + options_.rdzv_timeout_ms * kNsPerMs;
    for (int n = 0; n < options_.nnodes; ++n) {
      if (std::find(out.begin(), out.end(), n) != out.end()) continue;
      while (!etcd_->try_get(elastic::coordinator_key(fmt::format("launch/done/{}", n)))) {
        if (now_ns() >= deadline_ns) {
          fmt::print(stderr,
                     "brigade launch: node {} did not report its workers done within {} ms; "
                     "closing this node's store anyway\n",
                     n, options_.rdzv_timeout_ms);
          return;
        }
        // The launcher blocks SIGINT and SIGTERM: one pending is the
        // user's stop, which this wait must not outlast.
        sigset_t pending;
        if (sigpending(&pending) == 0 &&
            (sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1)) {
          fmt::print(stderr,
                     "brigade launch: signalled while waiting for node {} to report its workers "
                     "done; closing this node's store now\n",
                     n);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "brigade launch: {}\n", e.what());
  }
}

}  // namespace brigade::cli
