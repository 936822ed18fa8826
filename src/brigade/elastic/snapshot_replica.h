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
// every file's xxHash64 matched (then a rename), and only if its step is
// newer: a late or replayed older snapshot never replaces a newer one, and
// a transfer cut off half-way leaves the kept replica as it was.
//
// Wire format (frames as the store's: a u32 little-endian length, then the
// payload, encoded with store_protocol's Encoder):
//   handshake  client -> "brigade-replica/1" token
//              server -> status message             (kRefused: then closed)
//   put        client -> u8 1, i64 node, i64 step, u32 files
//              server -> status message    (kRefused: not newer than kept)
//              client -> per file: str name, i64 bytes, i64 xxh64, then
//              `bytes` raw bytes after that frame
//              server -> status message    (kOk: kept)
//   get        client -> u8 2, i64 node
//              server -> status message i64 step u32 files, then per file
//              as in put
// The server serves one connection at a time: an agent receives from one
// source node, and a standby fetches once per recovery. A peer gets
// io_timeout_ms for every read and write, so a stalled one (or a stranger
// who connects and says nothing) delays the others by at most that. A
// connection without the job's token, a malformed frame, a file name that
// is not a plain name, a size over the server's limit, or a checksum that
// does not match is refused with a log line naming the peer and the
// problem, and the server goes on serving; nothing a peer sends can end it.
//
// Not wired into the agent yet: multi-node jobs take no snapshots at all
// (cli/launcher.cc creates a SnapshotArea for one node only), since the
// commit protocol has rank 0 wait for every shard in its own directory and
// each node's area is its own memory. Loading needs every rank's shard (each
// rank holds a slice of every bucket), so a restart from snapshot s needs
// every node's part of s on every node: its own from its area, the others'
// from their nodes' servers, and a lost node's from the replica its peer
// keeps. The job's step s is complete once every node's part of s is
// written and replicated; a restart resumes from the newest step complete
// everywhere, or the newest disk checkpoint if that is newer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace brigade::elastic {

inline constexpr char kReplicaMagic[] = "brigade-replica/1";

struct ReplicaServerOptions {
  std::string host = "127.0.0.1";  // the agent's configured address
  uint16_t port = 0;               // 0: any free port (port() says which)
  std::string token;               // the job's token; required
  std::filesystem::path root;      // where the replicas are kept (in the agent's area)
  // The most bytes one replica may hold: a node's part of a snapshot is its
  // ranks' share of the parameters and both moments, which the agent knows;
  // anything larger is not a snapshot part of this job.
  int64_t max_bytes = int64_t{64} << 30;
  int64_t io_timeout_ms = 10'000;
  // Where the refusals and the replicas kept are told (stderr when unset).
  std::function<void(const std::string&)> log;
};

class ReplicaServer {
 public:
  // Binds and starts serving on a thread. Throws Error naming the address
  // if it cannot be bound, or if the token is empty.
  explicit ReplicaServer(ReplicaServerOptions options);
  ~ReplicaServer();
  ReplicaServer(const ReplicaServer&) = delete;
  ReplicaServer& operator=(const ReplicaServer&) = delete;

  uint16_t port() const { return port_; }
  // The step of node's kept replica, -1 when none.
  int64_t kept_step(int node) const;
  // Where node's kept replica is (empty when none).
  std::filesystem::path kept_dir(int node) const;

 private:
  void serve();
  void handle(int fd, const std::string& peer);
  void log(const std::string& line) const;

  ReplicaServerOptions options_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  uint16_t port_ = 0;
  mutable std::mutex mutex_;
  std::map<int, int64_t> kept_;  // node -> step
  std::thread thread_;
};

// Sends `dir`'s regular files (node `node`'s part of the snapshot of
// `step`) to the server at host:port, presenting `token`. Throws Error
// naming the server and its reason when it refuses (an older step than the
// one it keeps, a wrong token, ...) or cannot be reached within timeout_ms.
void send_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                  int64_t step, const std::filesystem::path& dir, int64_t timeout_ms = 10'000);

// Fetches node `node`'s newest replica from the server into
// step_directory(dest_root, step) (ckpt/checkpoint.h) and returns the step;
// every file's checksum is checked as it arrives. Throws Error when the
// server has none, refuses, sends more than max_bytes (a node's part is
// known to be smaller; the copy goes to tmpfs) or the transfer breaks off
// (nothing is left in dest_root then).
int64_t fetch_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                      const std::filesystem::path& dest_root, int64_t timeout_ms = 10'000,
                      int64_t max_bytes = int64_t{64} << 30);

// Sends this node's newest snapshot part to its peer's ReplicaServer on a
// thread of its own, so the workers' steps never wait for the network:
// offer() only records the part and returns. A part offered while another
// is on its way replaces any still waiting, so a slow link carries the
// newest state rather than a backlog. A failed send (the peer refused it,
// or is down) is logged and the next offer tries again: replication is
// best effort, and recovery falls back to the disk checkpoint.
//
// The part's files may be recycled while they are sent (a pruned step's
// shards move to <root>/spare/ and the save after next overwrites them in
// place, ckpt/checkpoint.h): every file's checksum is taken before its bytes
// are read again to go out, by path, so a recycled file either cannot be
// opened or no longer matches, and the server refuses the torn copy rather
// than keeping it; the newer part is offered next anyway.
class ReplicaSender {
 public:
  struct Peer {
    std::string host;
    uint16_t port = 0;
    std::string token;
    int64_t timeout_ms = 10'000;
  };
  ReplicaSender(Peer peer, int node, std::function<void(const std::string&)> log = {});
  // Waits for the send in flight (at most the peer's timeout).
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
  std::function<void(const std::string&)> log_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int64_t pending_step_ = -1;
  std::filesystem::path pending_dir_;
  bool busy_ = false;
  bool stop_ = false;
  int64_t sent_step_ = -1;
  std::thread thread_;
};

}  // namespace brigade::elastic
