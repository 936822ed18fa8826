#include "brigade/elastic/snapshot_replica.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/ckpt/manifest.h"
#include "brigade/comm/store_protocol.h"
#include "brigade/core/error.h"

namespace brigade::elastic {
namespace fs = std::filesystem;
namespace sp = store_protocol;

namespace {

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

std::string errno_text() {
  return std::strerror(errno);
}

void set_timeouts(int fd, int64_t ms) {
  timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      throw Refusal{n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)
                        ? std::string("timed out sending")
                        : "the connection broke while sending (" + errno_text() + ")"};
    }
  }
}

void read_exact(int fd, char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, data, bytes, 0);
    if (n > 0) {
      data += n;
      bytes -= static_cast<size_t>(n);
    } else if (n == 0) {
      throw Refusal{"the peer closed the connection mid-message"};
    } else if (errno != EINTR) {
      throw Refusal{errno == EAGAIN || errno == EWOULDBLOCK
                        ? std::string("timed out waiting for the peer")
                        : "the connection broke while receiving (" + errno_text() + ")"};
    }
  }
}

std::string read_frame(int fd, uint32_t limit) {
  char head[4];
  read_exact(fd, head, sizeof(head));
  const uint32_t size = sp::load_u32(head);
  if (size > limit) {
    throw Refusal{fmt::format("a frame declares {} bytes, over the limit of {}", size, limit)};
  }
  std::string payload(size, '\0');
  read_exact(fd, payload.data(), size);
  return payload;
}

void send_status(int fd, sp::Status status, const std::string& message) {
  write_all(fd, sp::Encoder().status(status).str(message).frame());
}

// A file name a peer may make this node write: one plain name in the
// replica's directory, never a path out of it.
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos &&
         name[0] != '.';
}

struct FileEntry {
  std::string name;
  int64_t bytes = 0;
  uint64_t xxh64 = 0;
};

void send_file(int fd, const fs::path& dir, const FileEntry& file) {
  write_all(
      fd,
      sp::Encoder().str(file.name).i64(file.bytes).i64(static_cast<int64_t>(file.xxh64)).frame());
  std::ifstream in(dir / file.name, std::ios::binary);
  std::vector<char> buffer(kChunkBytes);
  int64_t left = file.bytes;
  while (left > 0) {
    const auto n = static_cast<std::streamsize>(std::min<int64_t>(left, kChunkBytes));
    if (!in.read(buffer.data(), n)) {
      throw Error(fmt::format("cannot read {}: it changed while it was being sent",
                              (dir / file.name).string()));
    }
    write_all(fd, std::string_view(buffer.data(), static_cast<size_t>(n)));
    left -= n;
  }
}

// Reads a file header and its bytes into dir, checking name, size (at most
// `budget` bytes) and checksum; returns its size.
int64_t receive_file(int fd, const fs::path& dir, int64_t budget) {
  const std::string header = read_frame(fd, kMaxRequestBytes);
  sp::Decoder d(header);
  FileEntry file;
  file.name = d.str();
  file.bytes = d.i64();
  file.xxh64 = static_cast<uint64_t>(d.i64());
  d.end();
  if (!plain_name(file.name)) throw Refusal{fmt::format("a file named \"{}\"", file.name)};
  if (file.bytes < 0 || file.bytes > budget) {
    throw Refusal{fmt::format("file {} declares {} bytes, over the {} bytes left of the limit",
                              file.name, file.bytes, budget)};
  }
  std::ofstream out(dir / file.name, std::ios::binary | std::ios::trunc);
  if (!out) throw Refusal{fmt::format("cannot create {}", (dir / file.name).string())};
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> buffer(kChunkBytes);
  int64_t left = file.bytes;
  try {
    while (left > 0) {
      const auto n = static_cast<size_t>(std::min<int64_t>(left, kChunkBytes));
      read_exact(fd, buffer.data(), n);
      XXH64_update(state, buffer.data(), n);
      out.write(buffer.data(), static_cast<std::streamsize>(n));
      left -= static_cast<int64_t>(n);
    }
  } catch (...) {
    XXH64_freeState(state);
    throw;
  }
  const uint64_t got = XXH64_digest(state);
  XXH64_freeState(state);
  out.close();
  if (!out) throw Refusal{fmt::format("cannot write {}", (dir / file.name).string())};
  if (got != file.xxh64) {
    throw Refusal{fmt::format("file {} arrived with xxh64 {:016x}, not the {:016x} it declared",
                              file.name, got, file.xxh64)};
  }
  return file.bytes;
}

std::vector<FileEntry> list_files(const fs::path& dir) {
  std::vector<FileEntry> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    files.push_back({entry.path().filename().string(), static_cast<int64_t>(entry.file_size()),
                     file_xxh64(entry.path())});
  }
  std::sort(files.begin(), files.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.name < b.name; });
  return files;
}

std::string format_peer(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

// Compares without an early exit, so timing says nothing of how much of a
// guessed token was right.
bool same_token(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

struct Connection {
  int fd = -1;
  std::string where;
  ~Connection() {
    if (fd >= 0) ::close(fd);
  }
};

// Connects to host:port and authenticates with token; throws Error naming
// the server otherwise.
void open_connection(Connection& c, const std::string& host, uint16_t port,
                     const std::string& token, int64_t timeout_ms) {
  c.where = fmt::format("the snapshot replica server at {}:{}", host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
      rc != 0) {
    throw Error(fmt::format("cannot resolve {}: {}", c.where, ::gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* a = list; a != nullptr && c.fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    set_timeouts(fd, timeout_ms);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      c.fd = fd;
    } else {
      last = errno_text();
      ::close(fd);
    }
  }
  ::freeaddrinfo(list);
  if (c.fd < 0) throw Error(fmt::format("cannot connect to {}: {}", c.where, last));
  const int one = 1;
  ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  try {
    write_all(c.fd, sp::Encoder().str(kReplicaMagic).str(token).frame());
  } catch (const Refusal& r) {
    throw Error(fmt::format("{}: {}", c.where, r.why));
  }
}

// Reads the server's status frame; throws Error with its message unless ok.
sp::Decoder expect_ok(const Connection& c, std::string& payload) {
  try {
    payload = read_frame(c.fd, kMaxRequestBytes);
  } catch (const Refusal& r) {
    throw Error(fmt::format("{}: {}", c.where, r.why));
  }
  sp::Decoder d(payload);
  const auto status = static_cast<sp::Status>(d.u8());
  const std::string message = d.str();
  if (status != sp::Status::kOk) {
    throw Error(fmt::format("{} refused: {}", c.where, message));
  }
  return d;
}

}  // namespace

ReplicaServer::ReplicaServer(ReplicaServerOptions options) : options_(std::move(options)) {
  if (options_.token.empty()) {
    throw Error("the snapshot replica server needs the job's token (BRIGADE_STORE_TOKEN)");
  }
  fs::create_directories(options_.root);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* list = nullptr;
  const std::string where = fmt::format("{}:{}", options_.host, options_.port);
  if (const int rc = ::getaddrinfo(options_.host.c_str(), std::to_string(options_.port).c_str(),
                                   &hints, &list);
      rc != 0) {
    throw Error(fmt::format("the snapshot replica server cannot resolve {}: {}", where,
                            ::gai_strerror(rc)));
  }
  std::string last = "no address";
  for (addrinfo* a = list; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      listen_fd_ = fd;
    } else {
      last = errno_text();
      ::close(fd);
    }
  }
  ::freeaddrinfo(list);
  if (listen_fd_ < 0) {
    throw Error(fmt::format(
        "the snapshot replica server cannot listen on {}: {} (give the agent a free port or "
        "another address)",
        where, last));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw Error(fmt::format("the snapshot replica server: pipe: {}", errno_text()));
  }
  thread_ = std::thread([this] { serve(); });
}

ReplicaServer::~ReplicaServer() {
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = ::write(stop_pipe_[1], &byte, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_pipe_[0]);
  ::close(stop_pipe_[1]);
}

int64_t ReplicaServer::kept_step(int node) const {
  std::lock_guard lock(mutex_);
  const auto it = kept_.find(node);
  return it == kept_.end() ? -1 : it->second;
}

fs::path ReplicaServer::kept_dir(int node) const {
  const int64_t step = kept_step(node);
  if (step < 0) return {};
  return step_directory(options_.root / fmt::format("node-{}", node), step);
}

void ReplicaServer::log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "brigade launch: %s\n", line.c_str());
  }
}

void ReplicaServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log(fmt::format("the snapshot replica server stops: poll: {}", errno_text()));
      return;
    }
    if (fds[1].revents != 0) return;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the peer went away before accept, or EMFILE: retry
    set_timeouts(fd, options_.io_timeout_ms);
    const std::string peer = format_peer(addr);
    try {
      handle(fd, peer);
    } catch (const std::exception& e) {
      // A disk error, memory: the transfer fails, the server does not.
      log(fmt::format("snapshot replica from {} failed: {}", peer, e.what()));
    }
    ::close(fd);
  }
}

void ReplicaServer::handle(int fd, const std::string& peer) {
  // The handshake: nothing else is read before the token was shown.
  std::string magic, token;
  try {
    const std::string frame = read_frame(fd, sp::kMaxHandshakeBytes);
    sp::Decoder d(frame);
    magic = d.str();
    token = d.str();
    d.end();
  } catch (const Refusal& r) {
    log(fmt::format("refused a snapshot replica connection from {}: {}", peer, r.why));
    return;
  } catch (const Error& e) {
    log(fmt::format("refused a snapshot replica connection from {}: malformed handshake ({})", peer,
                    e.what()));
    return;
  }
  if (magic != kReplicaMagic || !same_token(token, options_.token)) {
    log(fmt::format(
        "refused a snapshot replica connection from {}: {}", peer,
        magic != kReplicaMagic ? "not a brigade agent" : "it did not present the job's token"));
    try {
      send_status(fd, sp::Status::kRefused, "the job's token is required");
    } catch (const Refusal&) {
    }
    return;
  }
  fs::path incoming;
  try {
    send_status(fd, sp::Status::kOk, "");
    const std::string request = read_frame(fd, kMaxRequestBytes);
    sp::Decoder d(request);
    const uint8_t op = d.u8();
    const int64_t node = d.i64();
    if (node < 0 || node > (int64_t{1} << 20)) throw Refusal{fmt::format("node {}", node)};
    const fs::path node_dir = options_.root / fmt::format("node-{}", node);
    if (op == static_cast<uint8_t>(PeerOp::kGet)) {
      d.end();
      const fs::path dir = kept_dir(static_cast<int>(node));
      if (dir.empty()) {
        send_status(fd, sp::Status::kError, fmt::format("it keeps no replica of node {}", node));
        return;
      }
      const std::vector<FileEntry> files = list_files(dir);
      write_all(fd, sp::Encoder()
                        .status(sp::Status::kOk)
                        .str("")
                        .i64(checkpoint_step(dir))
                        .u32(static_cast<uint32_t>(files.size()))
                        .frame());
      for (const FileEntry& file : files) send_file(fd, dir, file);
      return;
    }
    if (op != static_cast<uint8_t>(PeerOp::kPut)) throw Refusal{fmt::format("operation {}", op)};
    const int64_t step = d.i64();
    const uint32_t count = d.u32();
    d.end();
    if (step < 0 || count == 0 || count > kMaxFiles) {
      throw Refusal{fmt::format("step {} with {} files", step, count)};
    }
    const int64_t kept = kept_step(static_cast<int>(node));
    if (step <= kept) {
      // A late or repeated transfer: the newer replica stays.
      log(fmt::format("refused the replica of node {} step {} from {}: step {} is kept already",
                      node, step, peer, kept));
      send_status(
          fd, sp::Status::kRefused,
          fmt::format("step {} of node {} is not newer than the kept step {}", step, node, kept));
      return;
    }
    incoming = node_dir / ".incoming";
    fs::remove_all(incoming);
    fs::create_directories(incoming);
    send_status(fd, sp::Status::kOk, "");
    int64_t budget = options_.max_bytes;
    for (uint32_t i = 0; i < count; ++i) budget -= receive_file(fd, incoming, budget);
    // Complete and verified: it replaces the older replica.
    const fs::path dest = step_directory(node_dir, step);
    fs::remove_all(dest);
    fs::rename(incoming, dest);
    incoming.clear();
    std::vector<fs::path> older;
    for (const auto& entry : fs::directory_iterator(node_dir)) {
      if (entry.path() != dest && entry.path().filename().string().rfind("step_", 0) == 0) {
        older.push_back(entry.path());
      }
    }
    {
      std::lock_guard lock(mutex_);
      kept_[static_cast<int>(node)] = step;
    }
    for (const fs::path& dir : older) fs::remove_all(dir);
    send_status(fd, sp::Status::kOk, "");
  } catch (const Refusal& r) {
    log(fmt::format("refused a snapshot replica from {}: {}", peer, r.why));
    try {
      send_status(fd, sp::Status::kRefused, r.why);
    } catch (const Refusal&) {
    }
  } catch (const Error& e) {
    log(fmt::format("refused a snapshot replica from {}: malformed message ({})", peer, e.what()));
    try {
      send_status(fd, sp::Status::kRefused, "malformed message");
    } catch (const Refusal&) {
    }
  } catch (const std::exception& e) {
    log(fmt::format("snapshot replica from {} failed: {}", peer, e.what()));
  }
  if (!incoming.empty()) {
    std::error_code ec;
    fs::remove_all(incoming, ec);
  }
}

void send_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                  int64_t step, const fs::path& dir, int64_t timeout_ms) {
  const std::vector<FileEntry> files = list_files(dir);
  if (files.empty()) throw Error(fmt::format("no files to replicate in {}", dir.string()));
  Connection c;
  open_connection(c, host, port, token, timeout_ms);
  std::string payload;
  expect_ok(c, payload);
  try {
    write_all(c.fd, sp::Encoder()
                        .u8(static_cast<uint8_t>(PeerOp::kPut))
                        .i64(node)
                        .i64(step)
                        .u32(static_cast<uint32_t>(files.size()))
                        .frame());
  } catch (const Refusal& r) {
    throw Error(fmt::format("{}: {}", c.where, r.why));
  }
  expect_ok(c, payload);
  try {
    for (const FileEntry& file : files) send_file(c.fd, dir, file);
  } catch (const Refusal& r) {
    // The server may have said why before it closed.
    expect_ok(c, payload);
    throw Error(fmt::format("{}: {}", c.where, r.why));
  }
  expect_ok(c, payload);
}

int64_t fetch_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                      const fs::path& dest_root, int64_t timeout_ms, int64_t max_bytes) {
  Connection c;
  open_connection(c, host, port, token, timeout_ms);
  std::string payload;
  expect_ok(c, payload);
  const fs::path incoming = dest_root / fmt::format(".fetching-node-{}", node);
  try {
    write_all(c.fd, sp::Encoder().u8(static_cast<uint8_t>(PeerOp::kGet)).i64(node).frame());
    std::string reply;
    sp::Decoder d = expect_ok(c, reply);
    const int64_t step = d.i64();
    const uint32_t count = d.u32();
    d.end();
    if (step < 0 || count == 0 || count > kMaxFiles) {
      throw Error(fmt::format("{} sent step {} with {} files", c.where, step, count));
    }
    fs::remove_all(incoming);
    fs::create_directories(incoming);
    int64_t budget = max_bytes;
    for (uint32_t i = 0; i < count; ++i) budget -= receive_file(c.fd, incoming, budget);
    const fs::path dest = step_directory(dest_root, step);
    fs::remove_all(dest);
    fs::rename(incoming, dest);
    return step;
  } catch (const Refusal& r) {
    std::error_code ec;
    fs::remove_all(incoming, ec);
    throw Error(fmt::format("fetching node {}'s replica from {}: {}", node, c.where, r.why));
  } catch (...) {
    std::error_code ec;
    fs::remove_all(incoming, ec);
    throw;
  }
}

ReplicaSender::ReplicaSender(Peer peer, int node, std::function<void(const std::string&)> log)
    : peer_(std::move(peer)), node_(node), log_(std::move(log)) {
  thread_ = std::thread([this] { run(); });
}

ReplicaSender::~ReplicaSender() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ReplicaSender::offer(int64_t step, fs::path dir) {
  {
    std::lock_guard lock(mutex_);
    pending_step_ = step;
    pending_dir_ = std::move(dir);
  }
  cv_.notify_all();
}

int64_t ReplicaSender::sent_step() const {
  std::lock_guard lock(mutex_);
  return sent_step_;
}

bool ReplicaSender::wait_sent(int64_t step) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return sent_step_ >= step || (!busy_ && pending_step_ < 0); });
  return sent_step_ >= step;
}

void ReplicaSender::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || pending_step_ >= 0; });
    if (stop_) return;
    const int64_t step = std::exchange(pending_step_, -1);
    const fs::path dir = std::move(pending_dir_);
    busy_ = true;
    lock.unlock();
    std::string failure;
    try {
      send_replica(peer_.host, peer_.port, peer_.token, node_, step, dir, peer_.timeout_ms);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (!failure.empty()) {
      const std::string line =
          fmt::format("the snapshot of step {} was not replicated: {}", step, failure);
      if (log_) {
        log_(line);
      } else {
        std::fprintf(stderr, "brigade launch: %s\n", line.c_str());
      }
    }
    lock.lock();
    busy_ = false;
    if (failure.empty()) sent_step_ = std::max(sent_step_, step);
    cv_.notify_all();
  }
}

}  // namespace brigade::elastic
