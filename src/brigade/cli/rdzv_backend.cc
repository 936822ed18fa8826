#include "brigade/cli/rdzv_backend.h"

#include "brigade/core/error.h"
#include "brigade/elastic/etcd_store.h"

namespace brigade::cli {

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
  elastic::parse_etcd_endpoints(o.rdzv_endpoints);
}

CoordinatorBackend::CoordinatorBackend(const LaunchOptions& o, const std::string& token,
                                       int64_t call_timeout_ms)
    : options_(o), token_(token), call_timeout_ms_(call_timeout_ms) {
  if (o.rdzv_backend != "etcd") return;
  auto etcd = std::make_unique<elastic::EtcdCoordinatorStore>(
      elastic::parse_etcd_endpoints(o.rdzv_endpoints), token, call_timeout_ms);
  if (o.node_rank == 0 && !o.standby) etcd->clear();
  etcd_ = std::move(etcd);
}

CoordinatorBackend::~CoordinatorBackend() = default;

void CoordinatorBackend::publish_worker_store(const std::string& host, uint16_t port) {
  if (etcd_) {
    etcd_->set(elastic::coordinator_key("gen/0/worker_store"), fmt::format("{}:{}", host, port));
  }
}

elastic::CoordinatorStore& CoordinatorBackend::open(const std::string& host, uint16_t port) {
  if (etcd_) return *etcd_;
  if (!tcp_) {
    client_.emplace(host, port, token_, call_timeout_ms_);
    tcp_.emplace(*client_);
  }
  return *tcp_;
}

}  // namespace brigade::cli
