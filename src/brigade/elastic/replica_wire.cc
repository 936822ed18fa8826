#include "brigade/elastic/replica_wire.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "brigade/ckpt/manifest.h"
#include "brigade/comm/socket_io.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/snapshot_replica.h"

namespace brigade::elastic::replica_wire {
using socket_io::Io;

std::string errno_text(int err) {
  return std::strerror(err);
}

void write_all(const Link& link, std::string_view bytes) {
  int err = 0;
  switch (socket_io::write_all(link.fd, bytes, now_ns() + link.timeout_ns, &err)) {
    case Io::kOk:
      return;
    case Io::kTimeout:
      throw Refusal{"timed out sending"};
    default:
      throw Refusal{"the connection broke while sending (" + errno_text(err) + ")"};
  }
}

void read_exact(const Link& link, char* data, size_t bytes) {
  int err = 0;
  switch (socket_io::read_exact(link.fd, data, bytes, now_ns() + link.timeout_ns, &err)) {
    case Io::kOk:
      return;
    case Io::kTimeout:
      throw Refusal{"timed out waiting for the peer"};
    case Io::kClosed:
      throw Refusal{"the peer closed the connection mid-message"};
    default:
      throw Refusal{"the connection broke while receiving (" + errno_text(err) + ")"};
  }
}

std::string read_frame(const Link& link, uint32_t limit) {
  char head[4];
  read_exact(link, head, sizeof(head));
  const uint32_t size = sp::load_u32(head);
  if (size > limit) {
    throw Refusal{fmt::format("a frame declares {} bytes, over the limit of {}", size, limit)};
  }
  std::string payload(size, '\0');
  read_exact(link, payload.data(), size);
  return payload;
}

void send_status(const Link& link, sp::Status status, const std::string& message) {
  write_all(link, sp::Encoder().status(status).str(message).frame());
}

// Tells the peer why, if it still listens.
void try_send_status(const Link& link, sp::Status status, const std::string& message) {
  try {
    send_status(link, status, message);
  } catch (const Refusal&) {
  }
}

// A file name a peer may make this node write: one plain name in the
// replica's directory, never a path out of it.
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos &&
         name[0] != '.';
}

void send_file(const Link& link, const fs::path& dir, const FileEntry& file) {
  write_all(
      link,
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
    if (link.stop != nullptr && link.stop->load()) throw Refusal{"the sender is stopping"};
    write_all(link, std::string_view(buffer.data(), static_cast<size_t>(n)));
    left -= n;
  }
}

// Reads a file header and its bytes into dir, checking name, size (at most
// `budget` bytes) and checksum; returns its size.
int64_t receive_file(const Link& link, const fs::path& dir, int64_t budget) {
  const std::string header = read_frame(link, kMaxRequestBytes);
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
      read_exact(link, buffer.data(), n);
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

// How often a sender's connect looks whether its owner is stopping it.
constexpr int64_t kConnectSliceMs = 100;

Connection::~Connection() {
  if (link.fd < 0) return;
  if (control != nullptr) {
    std::lock_guard lock(control->mutex);
    control->fd = -1;
  }
  ::close(link.fd);
}

void open_connection(Connection& c, const std::string& host, uint16_t port,
                     const std::string& token, int64_t timeout_ms, SendControl* control,
                     int64_t connect_timeout_ms) {
  c.where = fmt::format("the snapshot replica server at {}:{}", host, port);
  c.link.timeout_ns = timeout_ms * kNsPerMs;
  c.control = control;
  if (control != nullptr) c.link.stop = &control->stop;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
      rc != 0) {
    throw Error(fmt::format("cannot resolve {}: {}", c.where, ::gai_strerror(rc)));
  }
  const int64_t deadline_ns =
      now_ns() + (connect_timeout_ms > 0
                      ? std::min(connect_timeout_ms * kNsPerMs, c.link.timeout_ns)
                      : c.link.timeout_ns);
  std::string last = "no address";
  for (addrinfo* a = list; a != nullptr && c.link.fd < 0; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      while (!(control != nullptr && control->stop.load()) && now_ns() < deadline_ns &&
             !socket_io::wait_ready(fd, POLLOUT,
                                    std::min(deadline_ns, now_ns() + kConnectSliceMs * kNsPerMs))) {
      }
      int err = ETIMEDOUT;
      socklen_t len = sizeof(err);
      if (socket_io::wait_ready(fd, POLLOUT, now_ns())) {
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      connected = err == 0;
      errno = err;
    }
    if (connected) {
      c.link.fd = fd;
    } else {
      last = errno_text();
      ::close(fd);
    }
  }
  ::freeaddrinfo(list);
  if (c.link.fd < 0) throw Error(fmt::format("cannot connect to {}: {}", c.where, last));
  if (control != nullptr) {
    std::lock_guard lock(control->mutex);
    if (control->stop.load()) throw Error(fmt::format("{}: the sender is stopping", c.where));
    control->fd = c.link.fd;
  }
  const int one = 1;
  ::setsockopt(c.link.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  try {
    write_all(c.link, sp::Encoder().str(kReplicaMagic).str(token).frame());
  } catch (const Refusal& r) {
    throw Error(fmt::format("{}: {}", c.where, r.why));
  }
}

sp::Decoder expect_ok(const Connection& c, std::string& payload) {
  try {
    payload = read_frame(c.link, kMaxRequestBytes);
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

void send_replica_impl(const std::string& host, uint16_t port, const std::string& token, int node,
                       int64_t generation, int64_t step, const fs::path& dir, int64_t timeout_ms,
                       SendControl* control) {
  const std::vector<FileEntry> files = list_files(dir);
  if (files.empty()) throw Error(fmt::format("no files to replicate in {}", dir.string()));
  Connection c;
  open_connection(c, host, port, token, timeout_ms, control);
  std::string payload;
  expect_ok(c, payload);
  try {
    write_all(c.link, sp::Encoder()
                          .u8(static_cast<uint8_t>(PeerOp::kPut))
                          .i64(node)
                          .i64(generation)
                          .i64(step)
                          .u32(static_cast<uint32_t>(files.size()))
                          .frame());
  } catch (const Refusal& r) {
    throw Error(fmt::format("{}: {}", c.where, r.why));
  }
  expect_ok(c, payload);
  try {
    for (const FileEntry& file : files) send_file(c.link, dir, file);
  } catch (const Refusal& r) {
    // The server may have said why before it closed.
    if (control == nullptr || !control->stop.load()) expect_ok(c, payload);
    throw Error(fmt::format("{}: {}", c.where, r.why));
  }
  expect_ok(c, payload);
}

}  // namespace brigade::elastic::replica_wire
