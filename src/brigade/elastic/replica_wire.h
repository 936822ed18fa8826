// The snapshot replicas' wire (elastic/snapshot_replica.h has the format):
// frames and files over a Link whose every read and write has a deadline,
// shared by the server, the sender and the fetch. Internal to elastic/.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "brigade/comm/store_protocol.h"

namespace brigade::elastic {

// What a ReplicaSender's destructor reaches into: the fd of the transfer in
// flight, shut down so that a peer that never answers releases it at once.
struct SendControl {
  std::atomic<bool> stop{false};
  std::mutex mutex;
  int fd = -1;
};

namespace replica_wire {
namespace fs = std::filesystem;
namespace sp = store_protocol;

enum class PeerOp : uint8_t { kPut = 1, kGet = 2 };

// A request frame (put, get, a file's header) names a node, a step and at
// most a file name: anything larger is not from a brigade agent.
constexpr uint32_t kMaxRequestBytes = 64u << 10;
// A node's part of a snapshot is a shard per rank and a manifest.
constexpr uint32_t kMaxFiles = 4096;
constexpr size_t kChunkBytes = size_t{1} << 20;
// Why a transfer stops: the peer is told (when it still listens) and the
// line is logged.
struct Refusal {
  std::string why;
};

// One side of a transfer. Every frame and every chunk of at most
// kChunkBytes gets `timeout_ns` from its start: a peer slower than a chunk
// per timeout (100 KiB/s at the default 10 s) is cut off, however it
// spaces its bytes.
struct Link {
  int fd = -1;
  int64_t timeout_ns = 0;
  // Set by a ReplicaSender: read between chunks; true ends the transfer.
  const std::atomic<bool>* stop = nullptr;
};

struct FileEntry {
  std::string name;
  int64_t bytes = 0;
  uint64_t xxh64 = 0;
};

std::string errno_text(int err = errno);

// The I/O below throws Refusal saying what went wrong (a timeout, the peer
// gone, a frame over `limit`).
void write_all(const Link& link, std::string_view bytes);

void read_exact(const Link& link, char* data, size_t bytes);

std::string read_frame(const Link& link, uint32_t limit);

void send_status(const Link& link, sp::Status status, const std::string& message);

// Tells the peer why, if it still listens.
void try_send_status(const Link& link, sp::Status status, const std::string& message);

// A file name a peer may make this node write: one plain name in the
// replica's directory, never a path out of it.
bool plain_name(const std::string& name);

// Sends file's header and bytes, read again by path; throws Error when the
// file changed since it was listed, Refusal when link.stop is set.
void send_file(const Link& link, const fs::path& dir, const FileEntry& file);

// Reads a file header and its bytes into dir, checking name, size (at most
// `budget` bytes) and checksum; returns its size.
int64_t receive_file(const Link& link, const fs::path& dir, int64_t budget);

// dir's regular files with sizes and checksums, by name.
std::vector<FileEntry> list_files(const fs::path& dir);

std::string format_peer(const sockaddr_storage& addr);

// A client's connection: closed (and no longer reachable through its
// SendControl) when it goes.
struct Connection {
  Link link;
  std::string where;
  SendControl* control = nullptr;
  Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();
};

// Connects (non-blocking, within connect_timeout_ms, else timeout_ms,
// giving up early once control says stop) and presents the token; throws
// Error naming the server.
void open_connection(Connection& c, const std::string& host, uint16_t port,
                     const std::string& token, int64_t timeout_ms, SendControl* control,
                     int64_t connect_timeout_ms = 0);
// Reads the server's status frame; throws Error with its message unless ok.
sp::Decoder expect_ok(const Connection& c, std::string& payload);
// send_replica, stopped early when control (may be null) says stop.
void send_replica_impl(const std::string& host, uint16_t port, const std::string& token, int node,
                       int64_t generation, int64_t step, const fs::path& dir, int64_t timeout_ms,
                       SendControl* control);

}  // namespace replica_wire
}  // namespace brigade::elastic
