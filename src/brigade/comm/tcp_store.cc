#include "brigade/comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>

#include "brigade/comm/socket_io.h"
#include "brigade/comm/store_protocol.h"
#include "brigade/core/clock.h"

namespace brigade {
namespace {

using store_protocol::Decoder;
using store_protocol::Encoder;
using store_protocol::kMagic;
using store_protocol::kMaxFrameBytes;
using store_protocol::load_u32;
using store_protocol::Op;
using store_protocol::Parsed;
using store_protocol::Request;
using store_protocol::Status;

// A peer that connects and never presents a token is dropped after this.
constexpr int64_t kHandshakeTimeoutMs = 10'000;
// A blocking get/wait is timed by the server; the client waits this much
// longer for the answer before it gives up on the connection.
constexpr int64_t kReplyGraceMs = 2'000;
// The serving loop's depth is fixed (answers to parked requests, and the
// frames behind them, are taken up from a work queue, never by recursion),
// so it needs little stack; a regression that recursed once per request
// would overflow this in the tests rather than in a large job.
constexpr size_t kServerStackBytes = 256 * 1024;
constexpr size_t kReadChunkBytes = 64 * 1024;

// ------------------------------------------------------------------ sockets

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string format_address(const sockaddr* addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return fmt::format("[{}]:{}", host, port);
}

// "host:port", "[v6::addr]:port", or "*:port" for every interface.
std::string format_host_port(const std::string& host, uint16_t port) {
  if (host.empty()) return fmt::format("*:{}", port);
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) ::freeaddrinfo(head);
  }
};

// Resolves host:port for TCP; returns the getaddrinfo error text on failure.
std::optional<std::string> resolve(const std::string& host, uint16_t port, bool passive,
                                   AddrInfoList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->head);
  if (rc != 0) return std::string(rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc));
  return std::nullopt;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

using socket_io::Io;
using socket_io::poll_timeout_ms;
using socket_io::read_exact;
using socket_io::same_token;
using socket_io::wait_ready;
using socket_io::write_all;

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string text;
  for (const std::string& key : keys) text += (text.empty() ? "'" : ", '") + key + "'";
  return text;
}

// Parses a counter's decimal text; nullopt if the value is not a counter.
std::optional<int64_t> parse_counter(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t used = 0;
  try {
    const long long v = std::stoll(text, &used);
    if (used != text.size()) return std::nullopt;
    return static_cast<int64_t>(v);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

// ==================================================================== server

struct TcpStoreServer::Impl {
  // A get or wait whose keys are not all there yet.
  struct Parked {
    Op op;
    std::vector<std::string> keys;
    int64_t deadline_ns;
  };

  struct Connection {
    int fd = -1;
    std::string peer;  // "127.0.0.1:54321"
    bool authenticated = false;
    int64_t accepted_ns = 0;
    std::string in;        // received bytes not yet parsed into frames
    std::string out;       // replies not yet sent
    bool closing = false;  // close once `out` is sent (after a refusal)
    bool dead = false;     // close at the end of this loop turn
    bool queued = false;   // in `ready`
    std::optional<Parked> parked;
  };

  std::string token;
  int listen_fd = -1;
  int wake_read_fd = -1;
  int wake_write_fd = -1;
  uint16_t port = 0;
  pthread_t thread{};
  bool thread_started = false;
  std::mutex stop_mutex;
  bool stopped = false;
  std::atomic<size_t> buffered_high_water{0};
  std::atomic<uint64_t> parked_requests{0};

  // Touched only by the serving thread.
  std::unordered_map<std::string, std::string> data;
  std::vector<std::unique_ptr<Connection>> connections;
  // Connections that may have whole frames to process: answered parked
  // requests, drained replies. Emptied before connections are closed.
  std::deque<Connection*> ready;
  std::vector<char> read_buffer = std::vector<char>(kReadChunkBytes);

  // Closes whatever the constructor opened if it throws halfway; after
  // stop() everything is closed already.
  ~Impl() { close_all(); }
  void close_all();
  void serve();
  void serve_until_stopped();
  void accept_all();
  size_t input_limit(const Connection& c) const;
  bool wants_input(const Connection& c) const;
  void read_from(Connection& c);
  void process_frames(Connection& c);
  void schedule(Connection& c);
  void drain_ready();
  void handle_handshake(Connection& c, const store_protocol::Handshake& handshake);
  void handle_request(Connection& c, Request& request);
  void answer(Connection& c, Op op, const std::vector<std::string>& keys);
  bool all_present(const std::vector<std::string>& keys) const;
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  void wake_parked();
  void expire(int64_t now);
  int next_timeout_ms() const;
  void refuse(Connection& c, const std::string& reason);
  void drop(Connection& c, const std::string& reason);
  void reply(Connection& c, const Encoder& message);
  void flush(Connection& c);
  void note_buffered(const Connection& c);
};

TcpStoreServer::TcpStoreServer(std::string host, uint16_t port, std::string token)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
  const std::string address = format_host_port(host, port);
  AddrInfoList addrs;
  if (auto failure = resolve(host, port, /*passive=*/true, &addrs)) {
    throw_error("cannot listen on {}: {}", address, *failure);
  }
  int last_errno = 0;
  for (addrinfo* a = addrs.head; a != nullptr && impl_->listen_fd < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last_errno = errno;
      close_fd(fd);
      continue;
    }
    impl_->listen_fd = fd;
  }
  if (impl_->listen_fd < 0) {
    throw_error("cannot listen on {}: {}{}", address, errno_text(last_errno),
                last_errno == EADDRINUSE ? " (pick another port)" : "");
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  impl_->port = bound.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                    : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw_error("cannot create the rendezvous store's wake-up pipe: {}", errno_text(errno));
  }
  impl_->wake_read_fd = wake[0];
  impl_->wake_write_fd = wake[1];
  // The serving thread starts with every signal blocked, so SIGINT, SIGCHLD
  // and the like keep going to the application's own threads.
  sigset_t all, previous;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  pthread_attr_t attr;
  ::pthread_attr_init(&attr);
  ::pthread_attr_setstacksize(&attr, kServerStackBytes);
  const int rc = ::pthread_create(
      &impl_->thread, &attr,
      [](void* impl) -> void* {
        static_cast<Impl*>(impl)->serve();
        return nullptr;
      },
      impl_.get());
  ::pthread_attr_destroy(&attr);
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (rc != 0) throw_error("cannot start the rendezvous store's thread: {}", errno_text(rc));
  impl_->thread_started = true;
}

TcpStoreServer::~TcpStoreServer() {
  stop();
}

uint16_t TcpStoreServer::port() const {
  return impl_->port;
}

TcpStoreServer::Stats TcpStoreServer::stats() const {
  return Stats{impl_->buffered_high_water.load(std::memory_order_relaxed),
               impl_->parked_requests.load(std::memory_order_relaxed)};
}

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mutex);
  if (impl_->stopped) return;
  impl_->stopped = true;
  const char byte = 1;
  while (::write(impl_->wake_write_fd, &byte, 1) < 0 && errno == EINTR) {
  }
  if (impl_->thread_started) ::pthread_join(impl_->thread, nullptr);
  impl_->thread_started = false;
  impl_->close_all();
}

void TcpStoreServer::Impl::close_all() {
  ready.clear();
  for (auto& c : connections) close_fd(c->fd);
  connections.clear();
  close_fd(listen_fd);
  close_fd(wake_read_fd);
  close_fd(wake_write_fd);
}

void TcpStoreServer::Impl::serve() {
  // An exception escaping a thread would abort the whole job; a store that
  // stops serving instead makes its clients fail with a clear message.
  try {
    serve_until_stopped();
  } catch (const std::exception& e) {
    fmt::print(stderr, "brigade store: stopped serving after an internal error: {}\n", e.what());
    // Closed connections fail the clients now rather than at their timeouts.
    ready.clear();
    for (auto& c : connections) close_fd(c->fd);
    connections.clear();
    close_fd(listen_fd);
  }
}

void TcpStoreServer::Impl::serve_until_stopped() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_read_fd, POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (const auto& c : connections) {
      // A connection that may not read is still watched for its peer
      // closing (POLLRDHUP), so a parked request of a dead client goes.
      short events = c->out.empty() ? 0 : POLLOUT;
      if (!c->closing) events |= wants_input(*c) ? POLLIN : POLLRDHUP;
      fds.push_back({c->fd, events, 0});
    }
    const int n = ::poll(fds.data(), fds.size(), next_timeout_ms());
    if (n < 0 && errno != EINTR) throw_error("poll failed: {}", errno_text(errno));
    if (n > 0 && fds[0].revents != 0) return;  // stop() was called

    // fds[i + 2] belongs to connections[i]; accepting comes after this loop
    // so the two stay aligned.
    const size_t polled = connections.size();
    for (size_t i = 0; n > 0 && i < polled; ++i) {
      Connection& c = *connections[i];
      const short revents = fds[i + 2].revents;
      if (revents & POLLOUT) {
        flush(c);
        if (!c.in.empty()) schedule(c);  // replies drained: the frames behind may go on
      }
      if (c.dead || (revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
      if (c.closing) {
        c.dead = true;
      } else if (wants_input(c)) {
        read_from(c);  // reads the end of the stream too
      } else {
        c.dead = true;  // gone while it was waiting for an answer
      }
    }
    if (n > 0 && (fds[1].revents & POLLIN)) accept_all();
    expire(now_ns());
    drain_ready();
    std::erase_if(connections, [](const std::unique_ptr<Connection>& c) {
      if (c->dead) close_fd(c->fd);
      return c->dead;
    });
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                             SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EAGAIN: accepted everything queued. EMFILE and the like: leave the
      // rest queued and retry on the next turn rather than stop serving.
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->peer = format_address(reinterpret_cast<const sockaddr*>(&peer));
    c->accepted_ns = now_ns();
    connections.push_back(std::move(c));
  }
}

// How much unprocessed input the connection may hold: kBufferBytes, or the
// whole of the frame at its front if that is larger. Before the token only
// a handshake, so a stranger is refused after its first 4 KiB.
size_t TcpStoreServer::Impl::input_limit(const Connection& c) const {
  if (!c.authenticated) return 4 + size_t{store_protocol::kMaxHandshakeBytes};
  size_t limit = kBufferBytes;
  if (c.in.size() >= 4) {
    limit = std::max(limit, 4 + size_t{std::min(load_u32(c.in.data()), kMaxFrameBytes)});
  }
  return limit;
}

// The server reads only what it can act on: nothing while a request is
// parked (replies must keep their order) or replies wait unsent (the client
// is not reading them), and no more than input_limit(). A client that sends
// faster is held back by TCP, not dropped.
bool TcpStoreServer::Impl::wants_input(const Connection& c) const {
  if (c.dead || c.closing || c.parked || c.out.size() >= kBufferBytes) return false;
  return c.in.size() < input_limit(c);
}

void TcpStoreServer::Impl::read_from(Connection& c) {
  while (wants_input(c)) {
    const size_t room = std::min(input_limit(c) - c.in.size(), read_buffer.size());
    const ssize_t n = ::recv(c.fd, read_buffer.data(), room, 0);
    if (n > 0) {
      c.in.append(read_buffer.data(), static_cast<size_t>(n));
      note_buffered(c);
      process_frames(c);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // The peer closed (n == 0) or the connection broke.
    if (!c.authenticated) {
      refuse(c, c.in.empty() ? "missing token (closed without sending one)"
                             : "closed before completing the handshake");
    }
    c.dead = true;
    return;
  }
}

// Acts on the whole frames at the front of c.in, in order, until one parks,
// the replies pile up, or the input runs out. Never calls itself, directly
// or through an answer: a connection woken later goes through `ready`.
void TcpStoreServer::Impl::process_frames(Connection& c) {
  size_t used = 0;
  while (!c.dead && !c.closing && !c.parked && c.out.size() < kBufferBytes) {
    Parsed p = store_protocol::parse_frame(std::string_view(c.in).substr(used), c.authenticated);
    if (p.kind == Parsed::Kind::kNeedMore) break;
    if (p.kind == Parsed::Kind::kOversized) {
      if (!c.authenticated) {
        refuse(c, "not a brigade store client (oversized handshake)");
      } else {
        drop(c, fmt::format("a {} byte request is over the store's limit of {} bytes", p.declared,
                            p.limit));
      }
      break;
    }
    if (p.kind == Parsed::Kind::kMalformed) {
      if (!c.authenticated) {
        refuse(c, "not a brigade store client");
      } else {
        drop(c, p.error);
      }
      break;
    }
    used += p.consumed;
    if (p.kind == Parsed::Kind::kHandshake) {
      handle_handshake(c, p.handshake);
    } else {
      handle_request(c, p.request);
    }
  }
  c.in.erase(0, std::min(used, c.in.size()));  // refuse() and drop() empty it
}

void TcpStoreServer::Impl::schedule(Connection& c) {
  if (c.queued || c.dead) return;
  c.queued = true;
  ready.push_back(&c);
}

void TcpStoreServer::Impl::drain_ready() {
  while (!ready.empty()) {
    Connection& c = *ready.front();
    ready.pop_front();
    c.queued = false;
    process_frames(c);  // may schedule others, never itself recursively
  }
}

void TcpStoreServer::Impl::handle_handshake(Connection& c,
                                            const store_protocol::Handshake& handshake) {
  if (handshake.magic != store_protocol::kMagic) {
    refuse(c, "not a brigade store client");
  } else if (handshake.token.empty()) {
    refuse(c, "missing token");
  } else if (!same_token(handshake.token, token)) {
    refuse(c, "bad token");
  } else {
    c.authenticated = true;
    reply(c, Encoder().status(Status::kOk));
  }
}

void TcpStoreServer::Impl::handle_request(Connection& c, Request& request) {
  switch (request.op) {
    case Op::kSet: {
      std::string& key = request.keys[0];  // parse_frame gives kSet, kGet and kAdd one
      data[std::move(key)] = std::move(request.value);
      reply(c, Encoder().status(Status::kOk));
      wake_parked();
      return;
    }
    case Op::kAdd: {
      std::string& key = request.keys[0];
      auto it = data.find(key);
      std::optional<int64_t> value = it == data.end() ? 0 : parse_counter(it->second);
      if (!value) {
        reply(c, Encoder()
                     .status(Status::kError)
                     .str(fmt::format(
                         "key '{}' holds a value that is not a counter: add() needs decimal text",
                         key)));
        return;
      }
      *value += request.delta;
      data[std::move(key)] = std::to_string(*value);
      reply(c, Encoder().status(Status::kOk).i64(*value));
      wake_parked();
      return;
    }
    case Op::kCheck:
      reply(c, Encoder().status(Status::kOk).u8(all_present(request.keys) ? 1 : 0));
      return;
    case Op::kGet:
    case Op::kWait:
      if (all_present(request.keys)) {
        answer(c, request.op, request.keys);
      } else {
        c.parked =
            Parked{request.op, std::move(request.keys), now_ns() + request.timeout_ms * kNsPerMs};
        parked_requests.fetch_add(1, std::memory_order_relaxed);
      }
      return;
  }
}

void TcpStoreServer::Impl::answer(Connection& c, Op op, const std::vector<std::string>& keys) {
  Encoder message;
  message.status(Status::kOk);
  if (op == Op::kGet) message.str(data.at(keys[0]));
  reply(c, message);
}

bool TcpStoreServer::Impl::all_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return data.count(key) != 0; });
}

std::vector<std::string> TcpStoreServer::Impl::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> absent;
  for (const std::string& key : keys) {
    if (data.count(key) == 0) absent.push_back(key);
  }
  return absent;
}

// Answers every parked get/wait whose keys are all present now; the requests
// its client sent behind it are taken up from `ready`.
void TcpStoreServer::Impl::wake_parked() {
  for (const auto& c : connections) {
    if (!c->parked || c->dead || !all_present(c->parked->keys)) continue;
    answer(*c, c->parked->op, c->parked->keys);
    c->parked.reset();
    schedule(*c);
  }
}

void TcpStoreServer::Impl::expire(int64_t now) {
  for (const auto& c : connections) {
    if (c->dead) continue;
    if (!c->authenticated && !c->closing &&
        now - c->accepted_ns >= kHandshakeTimeoutMs * kNsPerMs) {
      refuse(*c, fmt::format("no token within {} ms", kHandshakeTimeoutMs));
    } else if (c->parked && now >= c->parked->deadline_ns) {
      const std::vector<std::string> absent = missing(c->parked->keys);
      c->parked.reset();
      reply(*c, Encoder().status(Status::kTimeout).strs(absent));
      schedule(*c);
    }
  }
}

int TcpStoreServer::Impl::next_timeout_ms() const {
  int64_t deadline_ns = INT64_MAX;
  for (const auto& c : connections) {
    if (!c->authenticated && !c->closing) {
      deadline_ns = std::min(deadline_ns, c->accepted_ns + kHandshakeTimeoutMs * kNsPerMs);
    }
    if (c->parked) deadline_ns = std::min(deadline_ns, c->parked->deadline_ns);
  }
  return deadline_ns == INT64_MAX ? -1 : poll_timeout_ms(deadline_ns);
}

// Logs the refusal, tells the client (so it can say why), and closes.
void TcpStoreServer::Impl::refuse(Connection& c, const std::string& reason) {
  fmt::print(stderr, "brigade store: refused connection from {}: {}\n", c.peer, reason);
  c.closing = true;
  c.in.clear();
  reply(c, Encoder().status(Status::kRefused));
}

// Like refuse(), for a client that had shown the token: the replies it is
// owed go first, then the reason, then the connection closes.
void TcpStoreServer::Impl::drop(Connection& c, const std::string& reason) {
  fmt::print(stderr, "brigade store: dropped {}: {}\n", c.peer, reason);
  c.closing = true;
  c.in.clear();
  reply(c, Encoder().status(Status::kError).str(reason));
}

void TcpStoreServer::Impl::reply(Connection& c, const Encoder& message) {
  c.out += message.frame();
  note_buffered(c);
  flush(c);
}

void TcpStoreServer::Impl::flush(Connection& c) {
  size_t sent = 0;
  while (sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;  // poll asks for POLLOUT while `out` is not empty
    } else {
      c.dead = true;  // the peer is gone; nothing to tell it
      break;
    }
  }
  c.out.erase(0, sent);
  if (c.closing && c.out.empty()) c.dead = true;
}

void TcpStoreServer::Impl::note_buffered(const Connection& c) {
  const size_t bytes = c.in.size() + c.out.size();
  if (bytes > buffered_high_water.load(std::memory_order_relaxed)) {
    buffered_high_water.store(bytes, std::memory_order_relaxed);
  }
}

// ==================================================================== client

TcpStore::TcpStore(std::string host, uint16_t port, std::string token, int64_t timeout_ms)
    : host_(std::move(host)),
      port_(port),
      token_(std::move(token)),
      timeout_ms_(timeout_ms),
      address_(format_host_port(host_, port_)) {
  BRIGADE_CHECK(timeout_ms_ > 0, "timeout_ms must be positive, got {}", timeout_ms_);
  std::lock_guard<std::mutex> lock(mutex_);
  connect_and_authenticate();
}

TcpStore::~TcpStore() {
  disconnect();
}

std::string TcpStore::local_address() {
  std::lock_guard<std::mutex> lock(mutex_);
  return local_address_;
}

void TcpStore::disconnect() {
  close_fd(fd_);
}

namespace {

// One connection attempt to each address of host:port, each given at most
// attempt_ms; the connected socket (non-blocking), or -1 with *error saying
// why not.
int try_connect(const std::string& host, uint16_t port, int64_t deadline_ns, int64_t attempt_ms,
                std::string* error) {
  AddrInfoList addrs;
  if (auto failure = resolve(host, port, /*passive=*/false, &addrs)) {
    *error = *failure;
    return -1;
  }
  for (addrinfo* a = addrs.head; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      *error = errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        // An unreachable host can hold a connect for minutes: the retry
        // loop keeps its own pace.
        const int64_t attempt_deadline_ns = std::min(deadline_ns, now_ns() + attempt_ms * kNsPerMs);
        socklen_t len = sizeof(err);
        if (!wait_ready(fd, POLLOUT, attempt_deadline_ns)) {
          err = ETIMEDOUT;
        } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    if (err == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    *error = errno_text(err);
    close_fd(fd);
  }
  return -1;
}

}  // namespace

void TcpStore::connect_and_authenticate() {
  const int64_t deadline_ns = now_ns() + timeout_ms_ * kNsPerMs;
  std::string last_error = "no address";
  int64_t backoff_ms = 10;
  // A SYN lost to a link that was down is sent again only after 1 s (then
  // 3 s, ...): a fresh attempt every few hundred ms reaches a store whose
  // link came back at once, as an agent cut off for a moment must, before
  // the leader takes it for lost (elastic/coordinator.h). Growing to 1 s,
  // a store farther away than the first attempt's 200 ms is reached too.
  int64_t attempt_ms = 200;
  while ((fd_ = try_connect(host_, port_, deadline_ns, attempt_ms, &last_error)) < 0) {
    attempt_ms = std::min<int64_t>(attempt_ms * 2, 1000);
    const int64_t left_ms = (deadline_ns - now_ns()) / kNsPerMs;
    if (left_ms <= 0) {
      throw_error(
          "cannot reach the rendezvous store at {} within {} ms ({}): is the launcher on node 0 "
          "running, and do MASTER_ADDR/MASTER_PORT (--rdzv) name it?",
          address_, timeout_ms_, last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff_ms, left_ms)));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 500);
  }

  sockaddr_storage local{};
  socklen_t local_len = sizeof(local);
  char text[INET6_ADDRSTRLEN] = {};
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &local_len) == 0 &&
      ::getnameinfo(reinterpret_cast<const sockaddr*>(&local), local_len, text, sizeof(text),
                    nullptr, 0, NI_NUMERICHOST) == 0) {
    local_address_ = text;
  }

  // The server answers a handshake at once; the connect may have used up the
  // whole timeout, so allow a moment beyond it.
  const int64_t reply_deadline_ns = std::max(deadline_ns, now_ns() + kReplyGraceMs * kNsPerMs);
  int err = 0;
  char reply[5];
  const Io sent =
      write_all(fd_, Encoder().str(kMagic).str(token_).frame(), reply_deadline_ns, &err);
  const Io got =
      sent == Io::kOk ? read_exact(fd_, reply, sizeof(reply), reply_deadline_ns, &err) : sent;
  if (got != Io::kOk) {
    disconnect();
    throw_error("the rendezvous store at {} {} during the handshake", address_,
                got == Io::kTimeout  ? "did not answer"
                : got == Io::kClosed ? "closed the connection"
                                     : "failed (" + errno_text(err) + ")");
  }
  const auto status = static_cast<Status>(reply[4]);
  if (load_u32(reply) != 1 || status != Status::kOk) {
    disconnect();
    throw_error(
        "the rendezvous store at {} refused our token{}: workers get it from the environment "
        "variable BRIGADE_STORE_TOKEN, which `brigade launch` sets; every node of a multi-node "
        "launch must be given the same --rdzv-token (or BRIGADE_RDZV_TOKEN)",
        address_, token_.empty() ? " (none was given)" : "");
  }
}

std::string TcpStore::round_trip(const std::string& request, int64_t reply_timeout_ms,
                                 const std::string& what) {
  if (request.size() - 4 > kMaxFrameBytes) {
    throw_error(
        "{} is a {} byte request, over the rendezvous store's limit of {} bytes: the store is for "
        "addresses and small records; pass bulk data another way (a file, a collective)",
        what, request.size() - 4, kMaxFrameBytes);
  }
  if (fd_ < 0) connect_and_authenticate();
  const int64_t deadline_ns = now_ns() + reply_timeout_ms * kNsPerMs;
  int err = 0;
  Io io = write_all(fd_, request, deadline_ns, &err);
  char header[4];
  if (io == Io::kOk) io = read_exact(fd_, header, sizeof(header), deadline_ns, &err);
  std::string reply;
  if (io == Io::kOk) {
    const uint32_t bytes = load_u32(header);
    if (bytes == 0 || bytes > kMaxFrameBytes) {
      disconnect();
      throw_error("malformed reply from the rendezvous store at {} to {}", address_, what);
    }
    reply.resize(bytes);
    io = read_exact(fd_, reply.data(), bytes, deadline_ns, &err);
  }
  if (io == Io::kOk) return reply;
  // A reply may still arrive on this connection later and would answer the
  // wrong request, so the connection goes; the next call opens a new one.
  disconnect();
  if (io == Io::kTimeout) {
    throw StoreTimeoutError(fmt::format("the rendezvous store at {} did not answer {} within {} ms",
                                        address_, what, reply_timeout_ms));
  }
  throw_error(
      "lost the connection to the rendezvous store at {} during {}{}: the launcher hosting it "
      "(node 0) has probably exited",
      address_, what, io == Io::kFailed ? " (" + errno_text(err) + ")" : "");
}

void TcpStore::set(const std::string& key, std::string_view value) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string what = fmt::format("set('{}')", key);
  const std::string reply =
      round_trip(Encoder().op(Op::kSet).str(key).str(value).frame(), timeout_ms_, what);
  Decoder d(reply);
  BRIGADE_CHECK(static_cast<Status>(d.u8()) == Status::kOk, "unexpected reply to {}", what);
}

std::string TcpStore::get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string what = fmt::format("get('{}')", key);
  const std::string reply = round_trip(Encoder().op(Op::kGet).str(key).i64(timeout_ms_).frame(),
                                       timeout_ms_ + kReplyGraceMs, what);
  Decoder d(reply);
  const auto status = static_cast<Status>(d.u8());
  if (status == Status::kTimeout) {
    throw StoreTimeoutError(
        fmt::format("timed out after {} ms waiting for key '{}' in the rendezvous store at {}",
                    timeout_ms_, key, address_));
  }
  BRIGADE_CHECK(status == Status::kOk, "unexpected reply to {}", what);
  return d.str();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string what = fmt::format("add('{}', {})", key, delta);
  const std::string reply =
      round_trip(Encoder().op(Op::kAdd).str(key).i64(delta).frame(), timeout_ms_, what);
  Decoder d(reply);
  const auto status = static_cast<Status>(d.u8());
  if (status == Status::kError) throw_error("{} in the rendezvous store at {}", d.str(), address_);
  BRIGADE_CHECK(status == Status::kOk, "unexpected reply to {}", what);
  return d.i64();
}

void TcpStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_ms_);
}

void TcpStore::wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string what = fmt::format("wait({})", quote_keys(keys));
  const std::string reply = round_trip(Encoder().op(Op::kWait).strs(keys).i64(timeout_ms).frame(),
                                       timeout_ms + kReplyGraceMs, what);
  Decoder d(reply);
  const auto status = static_cast<Status>(d.u8());
  if (status == Status::kTimeout) {
    throw StoreTimeoutError(fmt::format(
        "timed out after {} ms waiting for keys in the rendezvous store at {}; still missing: {}",
        timeout_ms, address_, quote_keys(d.strs())));
  }
  BRIGADE_CHECK(status == Status::kOk, "unexpected reply to {}", what);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string what = fmt::format("check({})", quote_keys(keys));
  const std::string reply =
      round_trip(Encoder().op(Op::kCheck).strs(keys).frame(), timeout_ms_, what);
  Decoder d(reply);
  BRIGADE_CHECK(static_cast<Status>(d.u8()) == Status::kOk, "unexpected reply to {}", what);
  return d.u8() != 0;
}

}  // namespace brigade
