// connect_world: the communicator of every worker of a job, built from the
// environment `brigade launch` gives each worker (see cli/launcher.h):
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// BRIGADE_STORE_TOKEN, and BRIGADE_GENERATION when the elastic agent
// restarts workers (elastic/agent.h). A worker calls it once at start-up; every rank must
// call it with the same backend, or the rendezvous times out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "brigade/comm/communicator.h"

namespace brigade {

// What the launcher told this worker, parsed and checked.
struct WorldEnvironment {
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string store_token;
  // Which start of the job's workers this is (0 when not set): the shm
  // segments and store keys of a generation carry it, so a restarted group
  // never opens a segment or reads a key a killed one left behind.
  int64_t generation = 0;
};

// Reads the launcher's variables. Throws Error naming the missing or malformed
// variable and saying to run under `brigade launch`.
WorldEnvironment read_world_environment();

// The POSIX shm name of a job's group: "/brigade-<16 hex>-<group>", and
// "/brigade-<16 hex>-g<generation>-<group>" from generation 1 on. The hex is
// a hash of the token, not the token itself: /dev/shm names are visible to
// every user, and the token is the store's password.
std::string shm_segment_name(const std::string& store_token, const std::string& group_name,
                             int64_t generation = 0);

// backend: "shm" (one node only: WORLD_SIZE must equal LOCAL_WORLD_SIZE),
// "gloo" (TCP, any number of nodes, rendezvous through the launcher's store),
// "hierarchical" (shm within each node, gloo between the nodes' local rank
// 0s), or "auto": shm on one node, hierarchical across nodes.
// timeout_ms bounds the rendezvous and every later operation.
// shm_shared_bytes (shm only, a multiple of 4096): peer-visible memory per rank
// for ShmCommunicator::shared_buffer(), where collectives run zero-copy.
// Gloo listens on 127.0.0.1 in a one-node job; across nodes on the interface
// GLOO_SOCKET_IFNAME names (PyTorch's variable; `brigade launch --iface` sets
// it), else on the address each rank reaches the store from
// (advertised_address.h), never on this host's name.
// Throws Error for an unknown backend, a missing environment, or shm across
// nodes. (shm_shared_bytes applies to the node's shm group in hierarchical.)
std::unique_ptr<Communicator> connect_world(const std::string& backend, int64_t timeout_ms,
                                            int64_t shm_shared_bytes = 0);

// A group of some of the job's workers (a data- or tensor-parallel group of
// a Mesh): members are world ranks in group-rank order, this worker among
// them; name tells the group's shm segment and store keys apart ("dp0",
// "tp1") and must be the same on every member and unique in the job. Over
// shm when every member is on this node (backend shm, auto or
// hierarchical; tp groups are, being consecutive ranks), else over gloo.
// Every member must call it, with the same arguments.
std::unique_ptr<Communicator> connect_group(const std::string& backend, const std::string& name,
                                            const std::vector<int>& members, int64_t timeout_ms,
                                            int64_t shm_shared_bytes = 0);

}  // namespace brigade
