// GlooCommunicator: collectives over TCP through Gloo (Debian's libgloo), the
// backend that works across machines.
//
// Rendezvous goes through our token-protected TcpStore (see tcp_store.h):
// every rank announces itself under "gloo/<group>/joined/<rank>" and waits for
// the others, so a rank that never comes is named; then Gloo's full-mesh
// connect exchanges listening addresses through the same store under
// "gloo/<group>/...". Several groups can share one store as long as their
// names differ; a group re-created under the same name (after a failure) needs
// a fresh store or a new generation (its keys are then "gloo/g<N>/<group>/..."),
// or it would read stale keys.
//
// The collectives are Gloo's (ring all-reduce, all-gather, broadcast,
// barrier), except reduce-scatter: Gloo 0.5 has no reduce-scatter on unbound
// buffers, so each rank sends segment s straight to rank s and reduces what it
// receives, which moves the same bytes as a ring. Avg is a sum divided by the
// group size afterwards; every rank divides the same bits, so results stay
// bit-identical across ranks.
//
// send/recv use Gloo's unbound buffers on their own slots, outside the
// operation queue: a send is copied and posted at once (eager), and each is
// waited for on its own thread, since pipeline schedules post them in orders
// that a single waiting thread could deadlock on.
//
// Failures. Each Gloo wait is bounded by timeout_ms. When an operation fails
// (timeout, a peer's socket closed, any Gloo error) this rank closes all its
// connections, so peers blocked on it fail at once instead of waiting out
// their own timeouts, and posts "gloo/<group>/failed/<rank>" in the store. It
// then gives the others kBlameGraceMs to post theirs: the ranks that never do
// are the ones stopped, hung or dead, and the CommError names them. A Gloo
// error message rarely says which rank it concerns (it names addresses), so
// this store round is what makes peer_ranks() useful. The group stays failed:
// every later operation fails at once, as communicator.h requires.
//
// Gloo writes to sockets whose peer may be gone; the constructor ignores
// SIGPIPE (when it is at its default action) so that is an error, not death.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "brigade/comm/communicator.h"

namespace brigade {

struct GlooCommunicatorOptions {
  // The rendezvous store (a TcpStoreServer, normally the launcher's).
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  std::string store_token;

  std::string group_name = "world";
  // The elastic agent's generation (comm/world.h); from 1 on it prefixes the keys.
  int64_t generation = 0;
  int rank = 0;
  int size = 1;
  // Bounds the rendezvous in the constructor and every wait of an operation.
  int64_t timeout_ms = 300'000;

  // Where this rank listens for its peers: an address or hostname they can
  // reach, or, if bind_interface is set ("eth0"), that interface's address.
  // Both empty: the address this rank reaches the store from (see
  // advertised_address.h), what a multi-node job wants by default.
  std::string bind_hostname = "127.0.0.1";
  std::string bind_interface;
  // How bind_interface was chosen ("GLOO_SOCKET_IFNAME"), for errors.
  std::string bind_interface_source = "bind_interface";

  // The world rank of each group rank, for the flight recorder (its dumps
  // are named by world rank); empty when they are the same.
  std::vector<int> world_ranks;
};

class GlooCommunicator final : public Communicator {
 public:
  // How long a failing rank waits for its peers to report the failure too
  // before it blames the silent ones.
  static constexpr int64_t kBlameGraceMs = 400;

  // Connects to the store, waits for every rank and connects the full mesh.
  // Throws CommError naming the ranks that never joined, or Error for bad
  // options or an unreachable store.
  explicit GlooCommunicator(GlooCommunicatorOptions options);
  // Lets queued operations finish (each bounded by the timeout), then closes
  // the connections.
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& group_name() const override;
  int64_t timeout_ms() const override;

  std::shared_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter(const void* input, void* output, int64_t count, DType dtype,
                                       ReduceOp op) override;
  std::shared_ptr<Work> all_gather(const void* input, void* output, int64_t count,
                                   DType dtype) override;
  std::shared_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root) override;
  std::shared_ptr<Work> barrier() override;
  std::shared_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override;
  std::shared_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer,
                             uint32_t tag) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brigade
