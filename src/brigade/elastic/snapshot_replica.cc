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
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/ckpt/manifest.h"
#include "brigade/ckpt/node_part.h"
#include "brigade/comm/socket_io.h"
#include "brigade/comm/store_protocol.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/replica_wire.h"

namespace brigade::elastic {
namespace fs = std::filesystem;
namespace sp = store_protocol;
using socket_io::Io;

using replica_wire::Connection;
using replica_wire::errno_text;
using replica_wire::expect_ok;
using replica_wire::FileEntry;
using replica_wire::format_peer;
using replica_wire::kChunkBytes;
using replica_wire::kMaxFiles;
using replica_wire::kMaxRequestBytes;
using replica_wire::Link;
using replica_wire::list_files;
using replica_wire::open_connection;
using replica_wire::PeerOp;
using replica_wire::read_frame;
using replica_wire::receive_file;
using replica_wire::Refusal;
using replica_wire::send_file;
using replica_wire::send_replica_impl;
using replica_wire::send_status;
using replica_wire::try_send_status;
using replica_wire::write_all;

namespace {

constexpr int64_t kHandshakeTimeoutMs = 2'000;
// Handshakes in progress at once; a connection beyond them is closed.
constexpr size_t kMaxHandshakes = 64;
// After accept fails for want of fds or memory, the server waits this long
// before it accepts again rather than spinning on the pending connection.
constexpr int64_t kAcceptBackoffMs = 100;

// One connection between accept and its handshake frame, read without
// blocking so that many are served at once.
struct Handshake {
  int fd = -1;
  std::string peer;
  int64_t deadline_ns = 0;
  std::string bytes;  // the frame so far
};

}  // namespace

ReplicaServer::ReplicaServer(ReplicaServerOptions options) : options_(std::move(options)) {
  if (options_.token.empty()) {
    throw Error("the snapshot replica server needs the job's token (BRIGADE_STORE_TOKEN)");
  }
  if (options_.max_bytes <= 0 || options_.nodes <= 0) {
    throw Error(fmt::format(
        "the snapshot replica server needs max_bytes (got {}: what all kept replicas may hold "
        "together) and nodes (got {}: the job's node count)",
        options_.max_bytes, options_.nodes));
  }
  BRIGADE_CHECK(options_.io_timeout_ms > 0, "io_timeout_ms {} must be positive",
                options_.io_timeout_ms);
  try {
    // The area is this agent's: what an earlier agent left there is not a
    // replica this server received, and kept_ must match the disk.
    fs::remove_all(options_.root);
    fs::create_directories(options_.root);
  } catch (const fs::filesystem_error& e) {
    throw Error(fmt::format(
        "the snapshot replica server cannot use {} as its directory: {} (give the agent a "
        "writable snapshot area)",
        options_.root.string(), e.code().message()));
  }
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
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
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
  {
    // The handshakes' poll sees the pipe; a transfer in flight sees its fd
    // shut down.
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (active_fd_ >= 0) ::shutdown(active_fd_, SHUT_RDWR);
  }
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
  return it == kept_.end() ? -1 : it->second.step;
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
  std::vector<Handshake> waiting;
  int64_t accept_after_ns = 0;
  const auto refuse = [&](Handshake& h, const std::string& why) {
    log(fmt::format("refused a snapshot replica connection from {}: {}", h.peer, why));
    ::close(std::exchange(h.fd, -1));
  };
  for (;;) {
    std::vector<pollfd> fds{{stop_pipe_[0], POLLIN, 0}, {listen_fd_, 0, 0}};
    int64_t wake_ns = INT64_MAX;
    if (now_ns() >= accept_after_ns) {
      fds[1].events = POLLIN;
    } else {
      wake_ns = accept_after_ns;
    }
    for (const Handshake& h : waiting) {
      fds.push_back({h.fd, POLLIN, 0});
      wake_ns = std::min(wake_ns, h.deadline_ns);
    }
    const int timeout = wake_ns == INT64_MAX ? -1 : socket_io::poll_timeout_ms(wake_ns);
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
      log(fmt::format("the snapshot replica server stops: poll: {}", errno_text()));
      break;
    }
    if (fds[0].revents != 0) break;
    if (fds[1].revents != 0) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0 && waiting.size() < kMaxHandshakes) {
        waiting.push_back({fd, format_peer(addr), now_ns() + kHandshakeTimeoutMs * kNsPerMs, ""});
      } else if (fd >= 0) {
        log(fmt::format("refused a snapshot replica connection from {}: {} others are connecting",
                        format_peer(addr), kMaxHandshakes));
        ::close(fd);
      } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        log(fmt::format("the snapshot replica server cannot accept: {} (retrying in {} ms)",
                        errno_text(), kAcceptBackoffMs));
        accept_after_ns = now_ns() + kAcceptBackoffMs * kNsPerMs;
      }
    }
    // Those polled: a connection accepted just now is read on the next turn.
    for (size_t i = 0; i + 2 < fds.size(); ++i) {
      if (fds[i + 2].revents == 0) continue;
      Handshake& h = waiting[i];
      const size_t want = h.bytes.size() < 4 ? 4 : 4 + sp::load_u32(h.bytes.data());
      char buffer[sp::kMaxHandshakeBytes + 4];
      const ssize_t n = ::recv(h.fd, buffer, want - h.bytes.size(), 0);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        refuse(h, n == 0 ? "the peer closed the connection mid-message"
                         : "the connection broke (" + errno_text() + ")");
        continue;
      }
      h.bytes.append(buffer, static_cast<size_t>(n));
      const uint32_t declared = h.bytes.size() >= 4 ? sp::load_u32(h.bytes.data()) : 0;
      if (declared > sp::kMaxHandshakeBytes) {
        refuse(h, fmt::format("a frame declares {} bytes, over the limit of {}", declared,
                              sp::kMaxHandshakeBytes));
      } else if (h.bytes.size() >= 4 && h.bytes.size() == 4 + declared) {
        const Handshake done = std::exchange(h, Handshake{});
        try {
          handle(done.fd, done.peer, done.bytes.substr(4));
        } catch (const std::exception& e) {
          // A disk error, memory: the transfer fails, the server does not.
          log(fmt::format("snapshot replica from {} failed: {}", done.peer, e.what()));
        } catch (...) {
          log(fmt::format("snapshot replica from {} failed", done.peer));
        }
        ::close(done.fd);
      }
    }
    const int64_t now = now_ns();
    for (Handshake& h : waiting) {
      if (h.fd >= 0 && now >= h.deadline_ns) {
        refuse(h, fmt::format("no handshake within {} ms", kHandshakeTimeoutMs));
      }
    }
    std::erase_if(waiting, [](const Handshake& h) { return h.fd < 0; });
  }
  for (Handshake& h : waiting) ::close(h.fd);
}

void ReplicaServer::handle(int fd, const std::string& peer, const std::string& frame) {
  // The handshake: nothing else is read before the token was shown.
  const Link link{fd, options_.io_timeout_ms * kNsPerMs, nullptr};
  std::string magic, token;
  try {
    sp::Decoder d(frame);
    magic = d.str();
    token = d.str();
    d.end();
  } catch (const Error& e) {
    log(fmt::format("refused a snapshot replica connection from {}: malformed handshake ({})", peer,
                    e.what()));
    return;
  }
  if (magic != kReplicaMagic || !socket_io::same_token(token, options_.token)) {
    log(fmt::format(
        "refused a snapshot replica connection from {}: {}", peer,
        magic != kReplicaMagic ? "not a brigade agent" : "it did not present the job's token"));
    try_send_status(link, sp::Status::kRefused, "the job's token is required");
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    active_fd_ = fd;
  }
  fs::path incoming;
  try {
    send_status(link, sp::Status::kOk, "");
    const std::string request = read_frame(link, kMaxRequestBytes);
    sp::Decoder d(request);
    const uint8_t op = d.u8();
    const int64_t node = d.i64();
    if (node < 0 || node >= options_.nodes) {
      throw Refusal{fmt::format("node {}: this job has nodes 0 to {}", node, options_.nodes - 1)};
    }
    if (op == static_cast<uint8_t>(PeerOp::kGet)) {
      const int64_t step = d.i64();
      const int64_t generation = d.i64();
      d.end();
      serve_get(link, static_cast<int>(node), step, generation, peer);
    } else if (op == static_cast<uint8_t>(PeerOp::kPut)) {
      const int64_t generation = d.i64();
      const int64_t step = d.i64();
      const uint32_t count = d.u32();
      d.end();
      incoming = options_.root / fmt::format("node-{}", node) / ".incoming";
      serve_put(link, static_cast<int>(node), generation, step, count, peer, incoming);
      incoming.clear();
    } else {
      throw Refusal{fmt::format("operation {}", op)};
    }
  } catch (const Refusal& r) {
    log(fmt::format("refused a snapshot replica from {}: {}", peer, r.why));
    try_send_status(link, sp::Status::kRefused, r.why);
  } catch (const Error& e) {
    log(fmt::format("refused a snapshot replica from {}: malformed message ({})", peer, e.what()));
    try_send_status(link, sp::Status::kRefused, "malformed message");
  } catch (const std::exception& e) {
    // A disk error, memory: the transfer fails, the server does not.
    log(fmt::format("snapshot replica from {} failed: {}", peer, e.what()));
  } catch (...) {
    log(fmt::format("snapshot replica from {} failed", peer));
  }
  if (!incoming.empty()) {
    std::error_code ec;
    fs::remove_all(incoming, ec);
  }
  std::lock_guard lock(mutex_);
  active_fd_ = -1;
}

void ReplicaServer::serve_own(int node, fs::path parts_root) {
  std::lock_guard lock(mutex_);
  own_node_ = node;
  own_parts_ = std::move(parts_root);
}

void ReplicaServer::serve_get(const Link& link, int node, int64_t step, int64_t generation,
                              const std::string& peer) {
  fs::path dir, own_parts;
  int64_t kept_generation = -1;
  {
    std::lock_guard lock(mutex_);
    if (node == own_node_) own_parts = own_parts_;
    if (const auto it = kept_.find(node); it != kept_.end())
      kept_generation = it->second.generation;
  }
  if (!own_parts.empty()) {
    const std::vector<int64_t> steps = node_part_steps(own_parts);
    const int64_t wanted = step >= 0 ? step : steps.empty() ? -1 : steps.back();
    if (wanted >= 0 && std::find(steps.begin(), steps.end(), wanted) != steps.end()) {
      dir = node_part_directory(own_parts, wanted);
    }
  } else {
    dir = kept_dir(node);
    if (!dir.empty() && ((step >= 0 && checkpoint_step(dir) != step) ||
                         (generation >= 0 && kept_generation != generation))) {
      dir.clear();
    }
  }
  if (dir.empty()) {
    std::string of_step = step >= 0 ? fmt::format(" of step {}", step) : "";
    if (own_parts.empty() && generation >= 0)
      of_step += fmt::format(" from generation {}", generation);
    send_status(link, sp::Status::kError,
                own_parts.empty()
                    ? fmt::format("it keeps no replica of node {}{}", node, of_step)
                    : fmt::format("it holds no part of its own node {}{}", node, of_step));
    return;
  }
  const std::vector<FileEntry> files = list_files(dir);
  write_all(link, sp::Encoder()
                      .status(sp::Status::kOk)
                      .str("")
                      .i64(step >= 0 ? step : checkpoint_step(fs::path(dir).replace_extension()))
                      .u32(static_cast<uint32_t>(files.size()))
                      .frame());
  try {
    for (const FileEntry& file : files) send_file(link, dir, file);
  } catch (const Error& e) {
    // Mid-stream, where no status frame can follow: the peer sees the
    // connection close and fetches nothing.
    log(fmt::format("node {}'s replica could not be sent to {}: {}", node, peer, e.what()));
  }
}

void ReplicaServer::serve_put(const Link& link, int node, int64_t generation, int64_t step,
                              uint32_t count, const std::string& peer, const fs::path& incoming) {
  if (generation < 0 || step < 0 || count == 0 || count > kMaxFiles) {
    throw Refusal{fmt::format("generation {} step {} with {} files", generation, step, count)};
  }
  int64_t budget = options_.max_bytes;
  std::vector<fs::path> older;
  {
    std::lock_guard lock(mutex_);
    if (generation < newest_generation_) {
      throw Refusal{fmt::format("generation {} is older than generation {} it keeps", generation,
                                newest_generation_)};
    }
    const auto it = kept_.find(node);
    if (it != kept_.end() &&
        std::pair{generation, step} <= std::pair{it->second.generation, it->second.step}) {
      // A late or repeated transfer: the newer replica stays.
      throw Refusal{fmt::format("step {} of node {} is not newer than the kept step {}", step, node,
                                it->second.step)};
    }
    if (generation > newest_generation_) {
      // Node numbers hold within one generation: the older ones' replicas
      // are no node's state any more.
      newest_generation_ = generation;
      for (auto it = kept_.begin(); it != kept_.end();) {
        if (it->second.generation < generation) {
          older.push_back(options_.root / fmt::format("node-{}", it->first));
          it = kept_.erase(it);
        } else {
          ++it;
        }
      }
    }
    // Every replica kept counts, but node's own, which this one replaces.
    for (const auto& [other, kept] : kept_) {
      if (other != node) budget -= kept.bytes;
    }
  }
  for (const fs::path& dir : older) fs::remove_all(dir);
  older.clear();
  fs::remove_all(incoming);
  fs::create_directories(incoming);
  send_status(link, sp::Status::kOk, "");
  const int64_t limit = budget;
  for (uint32_t i = 0; i < count; ++i) budget -= receive_file(link, incoming, budget);
  // Complete and verified: it replaces the older replica.
  const fs::path node_dir = options_.root / fmt::format("node-{}", node);
  const fs::path dest = step_directory(node_dir, step);
  fs::remove_all(dest);
  fs::rename(incoming, dest);
  for (const auto& entry : fs::directory_iterator(node_dir)) {
    if (entry.path() != dest && entry.path().filename().string().rfind("step_", 0) == 0) {
      older.push_back(entry.path());
    }
  }
  {
    std::lock_guard lock(mutex_);
    kept_[node] = {generation, step, limit - budget};
  }
  for (const fs::path& dir : older) fs::remove_all(dir);
  log(fmt::format("kept the replica of node {} generation {} step {} from {}", node, generation,
                  step, peer));
  send_status(link, sp::Status::kOk, "");
}

void send_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                  int64_t generation, int64_t step, const fs::path& dir, int64_t timeout_ms) {
  send_replica_impl(host, port, token, node, generation, step, dir, timeout_ms, nullptr);
}

int64_t fetch_replica(const std::string& host, uint16_t port, const std::string& token, int node,
                      const fs::path& dest_root, int64_t max_bytes, int64_t timeout_ms,
                      int64_t step, int64_t connect_timeout_ms, int64_t generation) {
  Connection c;
  open_connection(c, host, port, token, timeout_ms, nullptr, connect_timeout_ms);
  std::string payload;
  expect_ok(c, payload);
  const fs::path incoming = dest_root / fmt::format(".fetching-node-{}", node);
  try {
    write_all(c.link, sp::Encoder()
                          .u8(static_cast<uint8_t>(PeerOp::kGet))
                          .i64(node)
                          .i64(step)
                          .i64(generation)
                          .frame());
    std::string reply;
    sp::Decoder d = expect_ok(c, reply);
    const int64_t sent = d.i64();
    const uint32_t count = d.u32();
    d.end();
    if (sent < 0 || (step >= 0 && sent != step) || count == 0 || count > kMaxFiles) {
      throw Error(fmt::format("{} sent step {} with {} files (asked for step {})", c.where, sent,
                              count, step));
    }
    step = sent;
    fs::remove_all(incoming);
    fs::create_directories(incoming);
    int64_t budget = max_bytes;
    for (uint32_t i = 0; i < count; ++i) budget -= receive_file(c.link, incoming, budget);
    // The step's directory may hold other nodes' parts already (this node's
    // own, fetched ones): the files join them, and none is replaced.
    const fs::path dest = step_directory(dest_root, step);
    fs::create_directories(dest);
    std::vector<fs::path> arrived;
    for (const auto& entry : fs::directory_iterator(incoming)) {
      if (fs::exists(fs::symlink_status(dest / entry.path().filename()))) {
        throw Error(fmt::format(
            "fetching node {}'s replica: {} exists already (is node {}'s part there, or another "
            "node's under the same name?); nothing was replaced",
            node, (dest / entry.path().filename()).string(), node));
      }
      arrived.push_back(entry.path());
    }
    for (const fs::path& file : arrived) fs::rename(file, dest / file.filename());
    fs::remove_all(incoming);
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

ReplicaSender::ReplicaSender(Peer peer, int node, int64_t generation,
                             std::function<void(const std::string&)> log)
    : peer_(std::move(peer)),
      node_(node),
      generation_(generation),
      log_(std::move(log)),
      control_(std::make_unique<SendControl>()) {
  thread_ = std::thread([this] { run(); });
}

ReplicaSender::~ReplicaSender() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  control_->stop.store(true);
  {
    std::lock_guard lock(control_->mutex);
    if (control_->fd >= 0) ::shutdown(control_->fd, SHUT_RDWR);
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
    // The committer keeps the part while it goes out (ckpt/node_part.h).
    const fs::path root = dir.parent_path();
    try {
      pin_node_part(root, step);
      send_replica_impl(peer_.host, peer_.port, peer_.token, node_, generation_, step, dir,
                        peer_.timeout_ms, control_.get());
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an unknown exception";
    }
    unpin_node_part(root, step);
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
