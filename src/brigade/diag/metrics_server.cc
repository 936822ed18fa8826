#include "brigade/diag/metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>
#include <vector>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"

namespace brigade::diag {
namespace {

std::string response(int code, const char* reason, const std::string& body, bool head,
                     const char* extra_headers = "") {
  std::string r = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
      "Content-Length: {}\r\n{}Connection: close\r\n\r\n",
      code, reason, body.size(), extra_headers);
  if (!head) r += body;
  return r;
}

bool printable(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 127; });
}

}  // namespace

MetricsAddress parse_metrics_address(const std::string& text) {
  MetricsAddress a;
  std::string_view port_text;
  bool ok = false;
  if (text.starts_with("[")) {
    const size_t close = text.find("]:");
    if (close != std::string::npos) {
      a.host = text.substr(1, close - 1);
      port_text = std::string_view(text).substr(close + 2);
      ok = true;
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') == colon) {
      a.host = text.substr(0, colon);
      port_text = std::string_view(text).substr(colon + 1);
      ok = true;
    }
  }
  if (ok) {
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), a.port);
    ok = !a.host.empty() && !port_text.empty() && ec == std::errc() &&
         end == port_text.data() + port_text.size() && a.port >= 0 && a.port <= 65535;
  }
  if (!ok) {
    throw_error(
        "metrics address '{}' is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464, or port 0 for "
        "a free one; 'off' turns the endpoint off)",
        text);
  }
  return a;
}

struct MetricsServer::Impl {
  // One scraper's connection.
  struct Client {
    int fd = -1;
    std::string in;
    std::string out;
    size_t sent = 0;
    int64_t deadline_ns = 0;
    bool responding = false;
  };

  MetricsAddress address;
  Render render;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // a pipe: the destructor's write ends the loop
  int port = 0;
  std::vector<Client> clients;
  std::thread thread;

  void serve();
  void accept_all();
  // Reads what the client sent; false when the connection is to be closed.
  bool read_from(Client& c);
  bool write_to(Client& c);
  std::string answer(const std::string& head_section);
};

MetricsServer::MetricsServer(const MetricsAddress& address, Render render)
    : impl_(std::make_unique<Impl>()) {
  impl_->address = address;
  impl_->render = std::move(render);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const std::string port_text = std::to_string(address.port);
  const int rc = ::getaddrinfo(address.host.c_str(), port_text.c_str(), &hints, &addrs);
  if (rc != 0) {
    throw_error("cannot serve metrics on {}:{}: {}", address.host, address.port,
                ::gai_strerror(rc));
  }
  int last_errno = 0;
  for (addrinfo* a = addrs; a != nullptr && impl_->listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      last_errno = errno;
      ::close(fd);
      continue;
    }
    impl_->listen_fd = fd;
  }
  ::freeaddrinfo(addrs);
  if (impl_->listen_fd < 0) {
    throw_error(
        "cannot serve metrics on {}:{}: {}; choose another address with --metrics HOST:PORT (port "
        "0 picks a free one) or turn the endpoint off with --metrics off",
        address.host, address.port, std::strerror(last_errno));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  impl_->port = bound.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                    : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(impl_->listen_fd);
    throw_error("cannot start the metrics server: pipe: {}", std::strerror(err));
  }
  impl_->thread = std::thread([impl = impl_.get()] { impl->serve(); });
}

MetricsServer::~MetricsServer() {
  const char byte = 0;
  while (::write(impl_->wake[1], &byte, 1) < 0 && errno == EINTR) {
  }
  impl_->thread.join();
  for (Impl::Client& c : impl_->clients) ::close(c.fd);
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int MetricsServer::port() const {
  return impl_->port;
}

std::string MetricsServer::url() const {
  const bool v6 = impl_->address.host.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}/metrics", v6 ? "[" : "", impl_->address.host, v6 ? "]" : "",
                     impl_->port);
}

void MetricsServer::Impl::serve() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake[0], POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    int64_t next_deadline = now_ns() + 1000 * kNsPerMs;
    for (const Client& c : clients) {
      fds.push_back({c.fd, static_cast<short>(c.responding ? POLLOUT : POLLIN), 0});
      next_deadline = std::min(next_deadline, c.deadline_ns);
    }
    const int64_t wait_ms = std::max<int64_t>(0, (next_deadline - now_ns()) / kNsPerMs + 1);
    if (::poll(fds.data(), fds.size(), static_cast<int>(wait_ms)) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    // Connections first: the clients' entries in `fds` match `clients` as it
    // was before accept_all adds to it.
    const int64_t now = now_ns();
    std::vector<Client> kept;
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      const short ev = fds[i + 2].revents;
      bool keep = now < c.deadline_ns;
      if (keep && ev != 0) keep = c.responding ? write_to(c) : read_from(c);
      if (keep) {
        kept.push_back(std::move(c));
      } else {
        ::close(c.fd);
      }
    }
    clients = std::move(kept);
    if (fds[1].revents != 0) accept_all();
  }
}

void MetricsServer::Impl::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left; anything else: try again at the next poll
    if (clients.size() >= static_cast<size_t>(kMaxClients)) {
      // Room for the newcomer at the expense of the connection held longest:
      // strangers holding every slot cannot lock a scrape out.
      const auto oldest = std::min_element(
          clients.begin(), clients.end(),
          [](const Client& a, const Client& b) { return a.deadline_ns < b.deadline_ns; });
      ::close(oldest->fd);
      clients.erase(oldest);
    }
    Client c;
    c.fd = fd;
    c.deadline_ns = now_ns() + kReadTimeoutMs * kNsPerMs;
    clients.push_back(std::move(c));
  }
}

bool MetricsServer::Impl::read_from(Client& c) {
  char buffer[4096];
  const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
  if (n == 0) return false;  // closed before a whole request
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  c.in.append(buffer, static_cast<size_t>(n));
  const size_t end = c.in.find("\r\n\r\n");
  if (end == std::string::npos && c.in.size() < kMaxRequestBytes) return true;
  if (end == std::string::npos || end + 4 > kMaxRequestBytes) {
    c.out = response(431, "Request Header Fields Too Large",
                     fmt::format("request over {} bytes\n", kMaxRequestBytes), false);
  } else {
    c.out = answer(c.in.substr(0, end));
  }
  c.in.clear();
  c.responding = true;
  return write_to(c);
}

bool MetricsServer::Impl::write_to(Client& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c.sent += static_cast<size_t>(n);
  }
  ::shutdown(c.fd, SHUT_WR);
  return false;  // all sent: close
}

std::string MetricsServer::Impl::answer(const std::string& head_section) {
  const std::string line = head_section.substr(0, head_section.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos) {
    return response(400, "Bad Request", "malformed request line\n", false);
  }
  const std::string method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string version = line.substr(sp2 + 1);
  if (!printable(method) || !printable(target) || !target.starts_with("/") ||
      (version != "HTTP/1.1" && version != "HTTP/1.0")) {
    return response(400, "Bad Request", "malformed request line\n", false);
  }
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    return response(405, "Method Not Allowed", "only GET /metrics\n", false,
                    "Allow: GET, HEAD\r\n");
  }
  if (target != "/metrics" && !target.starts_with("/metrics?")) {
    return response(404, "Not Found", "only /metrics is served here\n", head);
  }
  try {
    return response(200, "OK", render(), head);
  } catch (const std::exception& e) {
    return response(500, "Internal Server Error", std::string(e.what()) + "\n", head);
  }
}

}  // namespace brigade::diag
