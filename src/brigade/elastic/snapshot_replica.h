// Replication of in-memory snapshots to a peer node's agent (issue 14,
// scope 4): node n's agent copies its node's part of snapshot s to node
// (n + 1) % nnodes's agent over TCP, so a standby that takes node n's place
// can fetch n's newest state from that peer instead of reading the newest
// disk checkpoint, which may be hours old.
//
// What is built here is the transfer: a ReplicaServer each agent runs (bound
// to the agent's configured address, as the store is), send_replica (the
// source's push of one snapshot part; ReplicaSender runs it on a thread of
// its own, so it never blocks the workers' steps) and fetch_replica (the
// standby's pull before it starts its workers). The server keeps, per
// source node, the newest complete replica it received, in a directory of
// its SnapshotArea:
//   <root>/node-<n>/step_<s>/<files>     the kept replica of node n
//   <root>/node-<n>/.incoming/           a transfer in progress
// A replica replaces the kept one only once every byte of it arrived and
// every file's xxHash64 matched (then a rename), and only if its
// (generation, step) is newer: a late or replayed older snapshot never
// replaces a newer one, and a transfer cut off half-way leaves the kept
// replica as it was. Node numbers hold within one generation only (a job
// with fewer nodes renumbers them, and may resume from an older step), so
// a transfer of a newer generation drops every older generation's replica
// as it begins, and a transfer of an older generation is refused.
//
// Wire format (frames as the store's: a u32 little-endian length, then the
// payload, encoded with store_protocol's Encoder):
//   handshake  client -> "brigade-replica/1" token
//              server -> status message             (kRefused: then closed)
//   put        client -> u8 1, i64 node, i64 generation, i64 step, u32 files
//              server -> status message    (kRefused: not newer than kept)
//              client -> per file: str name, i64 bytes, i64 xxh64, then
//              `bytes` raw bytes after that frame
//              server -> status message    (kOk: kept)
//   get        client -> u8 2, i64 node, i64 step (-1: the newest)
//              server -> status message i64 step u32 files, then per file
//              as in put; kError when it holds no such part or replica
// A get of the server's own node (serve_own) is served from that node's
// snapshot parts in its area (ckpt/node_part.h), so a restart gathers every
// live node's part from its owner and a lost node's from its peer's
// replica.
// The server reads many connections' handshakes at once, in one poll loop:
// a connection that has not shown the job's token within 2 s is closed,
// however it spaces its bytes, so strangers never hold the server. Once
// shown, the transfer has the thread (an agent receives from one source
// node, and a standby fetches once per recovery), and each frame and each
// chunk of at most 1 MiB must arrive within io_timeout_ms of its start, a
// minimum rate. A connection without the job's token, a malformed frame, a
// source node outside the job, a file name that is not a plain name, a size
// over the server's budget, or a checksum that does not match is refused
// with a log line naming the peer and the problem, and the server goes on
// serving; nothing a peer sends can end it. Its destructor returns
// promptly: the poll loop watches a stop pipe, and a transfer in flight has
// its socket shut down.
//
// The agent's use of it (what is sent when, to whom, and how a restart
// gathers the parts) is elastic/snapshot_sync.h's.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace brigade::elastic {

namespace replica_wire {
struct Link;
}
struct SendControl;

inline constexpr char kReplicaMagic[] = "brigade-replica/1";

struct ReplicaServerOptions {
  std::string host = "127.0.0.1";  // the agent's configured address
  uint16_t port = 0;               // 0: any free port (port() says which)
  std::string token;               // the job's token; required
  std::filesystem::path root;      // where the replicas are kept (in the agent's area)
  // Required: the most bytes all kept replicas may hold together (they are
  // in tmpfs, which is memory): a node's part of a snapshot is its ranks'
  // share of the parameters and both moments, which the agent knows.
  int64_t max_bytes = 0;
  // Required: the job's node count; replicas of other node numbers are
  // refused.
  int nodes = 0;
  // The most one frame or 1 MiB chunk may take; must be positive.
  int64_t io_timeout_ms = 10'000;
  // Where the refusals and the replicas kept are told (stderr when unset).
  std::function<void(const std::string&)> log;
};

class ReplicaServer {
 public:
  // Empties root (the area is this agent's: nothing there was received by
  // this server), binds and starts serving on a thread. Throws Error
  // naming the address if it cannot be bound, root if it cannot be used,
  // or the option when the token, max_bytes or nodes is missing.
  explicit ReplicaServer(ReplicaServerOptions options);
  ~ReplicaServer();
  ReplicaServer(const ReplicaServer&) = delete;
  ReplicaServer& operator=(const ReplicaServer&) = delete;

  uint16_t port() const { return port_; }
  // The step of node's kept replica, -1 when none.
  int64_t kept_step(int node) const;
  // Where node's kept replica is (empty when none).
  std::filesystem::path kept_dir(int node) const;
  // From now on a get of `node` is served from the snapshot parts under
  // parts_root (this agent's area), not from a replica: the agent runs
  // that node (a standby once it took the node's place).
  void serve_own(int node, std::filesystem::path parts_root);

 private:
  struct Kept {
    int64_t generation = -1;
    int64_t step = -1;
    int64_t bytes = 0;
  };
  void serve();
  // One connection whose handshake frame (its payload) arrived.
  void handle(int fd, const std::string& peer, const std::string& frame);
  void serve_get(const replica_wire::Link& link, int node, int64_t step, int64_t generation,
                 const std::string& peer);
  void serve_put(const replica_wire::Link& link, int node, int64_t generation, int64_t step,
                 uint32_t count, const std::string& peer, const std::filesystem::path& incoming);
  void log(const std::string& line) const;

  ReplicaServerOptions options_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  uint16_t port_ = 0;
  mutable std::mutex mutex_;
  std::map<int, Kept> kept_;        // node -> its kept replica
  int64_t newest_generation_ = -1;  // of any replica kept
  bool stopping_ = false;
  int active_fd_ = -1;  // the transfer in flight, shut down by the destructor
  int own_node_ = -1;
  std::filesystem::path own_parts_;
  std::thread thread_;
};

// Sends `dir`'s regular files (node `node`'s part of the snapshot of
// `step` in `generation`) to the server at host:port, presenting `token`. Throws Error
// naming the server and its reason when it refuses (an older step than the
// one it keeps, a wrong token, ...) or cannot be reached within timeout_ms.
void send_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                  int64_t generation, int64_t step, const std::filesystem::path& dir,
                  int64_t timeout_ms = 10'000);

// Fetches node `node`'s replica (or, from the node's own server, its part)
// of `step` (-1: the newest) from the server and returns its step; every file's checksum is checked
// as it arrives. The files arrive in a directory of their own under dest_root, then join
// step_directory(dest_root, step) (ckpt/checkpoint.h), which may hold other
// nodes' parts of that step already: nothing there is deleted or replaced.
// Throws Error when the server has none, refuses, sends more than max_bytes
// (a node's part is known to be smaller; the copy goes to tmpfs), a file's
// name exists in the step's directory already, or the transfer breaks off
// (nothing of it is left in dest_root then). connect_timeout_ms > 0 bounds
// the connect alone (a server cut off the network), timeout_ms the rest.
// generation >= 0: a replica only if it was sent in that generation (node
// numbers hold within one; an older generation's replica is another
// history).
int64_t fetch_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                      const std::filesystem::path& dest_root, int64_t max_bytes,
                      int64_t timeout_ms = 10'000, int64_t step = -1,
                      int64_t connect_timeout_ms = 0, int64_t generation = -1);

// Sends this node's newest snapshot part to its peer's ReplicaServer on a
// thread of its own, so the workers' steps never wait for the network:
// offer() only records the part and returns. A part offered while another
// is on its way replaces any still waiting, so a slow link carries the
// newest state rather than a backlog. A failed send (the peer refused it,
// or is down) is logged and the next offer tries again: replication is
// best effort, and recovery falls back to the disk checkpoint.
//
// The part in flight is pinned (ckpt/node_part.h, <root>/sending): its
// node's committer neither prunes nor recycles it until the send is over,
// so a send slower than a few steps still completes. A part pruned before
// its send began (a pruned step's shards move to <root>/spare/ and the save
// after next overwrites them in place, ckpt/checkpoint.h) is still caught:
// every file's checksum is taken before its bytes are read again to go
// out, by path, so a recycled file either cannot be opened or no longer
// matches, and the server refuses the torn copy rather than keeping it;
// the newer part is offered next anyway.
class ReplicaSender {
 public:
  struct Peer {
    std::string host;
    uint16_t port = 0;
    std::string token;
    int64_t timeout_ms = 10'000;
  };
  // One sender per generation: node numbers and peers hold within one.
  ReplicaSender(Peer peer, int node, int64_t generation,
                std::function<void(const std::string&)> log = {});
  // Returns promptly: the send in flight stops between chunks, and its
  // socket is shut down, so a peer that never answers holds nobody.
  ~ReplicaSender();
  ReplicaSender(const ReplicaSender&) = delete;
  ReplicaSender& operator=(const ReplicaSender&) = delete;

  void offer(int64_t step, std::filesystem::path dir);
  // The newest step the peer confirmed it keeps; -1 before the first.
  int64_t sent_step() const;
  // Blocks until sent_step() >= step or every offered part was tried;
  // true in the first case.
  bool wait_sent(int64_t step);

 private:
  void run();

  Peer peer_;
  int node_;
  int64_t generation_;
  std::function<void(const std::string&)> log_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int64_t pending_step_ = -1;
  std::filesystem::path pending_dir_;
  bool busy_ = false;
  bool stop_ = false;
  int64_t sent_step_ = -1;
  std::unique_ptr<SendControl> control_;
  std::thread thread_;
};

}  // namespace brigade::elastic
