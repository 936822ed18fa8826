// The agent's /metrics endpoint: a small HTTP/1.1 server that Prometheus
// scrapes (diag/prometheus.h writes the text it serves).
//
// One thread serves every connection through poll(), so a client that
// connects and says nothing delays nobody: it is dropped after
// kReadTimeoutMs. Only `GET /metrics` (and HEAD) is answered, one response
// per connection (Connection: close; Prometheus reconnects at each scrape,
// which at one scrape a second costs nothing). Anything else gets its status
// code and is closed: a request line or header section over kMaxRequestBytes
// (431), a malformed request line or a version other than HTTP/1.x (400), a
// method with a body (405), another path (404). At most kMaxClients
// connections are open at once; a newcomer beyond that closes the one held
// longest, so strangers holding every slot cannot lock a scrape out. The
// listening socket and every connection are close-on-exec, so the workers
// the agent forks hold none of them, and writes use MSG_NOSIGNAL, so a
// client that hangs up cannot kill the agent with SIGPIPE.
//
// The address is loopback by default: the endpoint has no authentication, so
// exposing it to a network is the user's explicit choice (--metrics
// 0.0.0.0:9464).
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace brigade::diag {

inline constexpr size_t kMaxRequestBytes = 8192;
inline constexpr int kReadTimeoutMs = 5000;
inline constexpr int kMaxClients = 32;

struct MetricsAddress {
  std::string host;  // an IPv4 or IPv6 literal, or a name getaddrinfo resolves
  int port = 0;      // 0: the system picks one (MetricsServer::port says which)
};

// Parses "HOST:PORT" or "[IPV6]:PORT". Throws Error naming the expected form.
MetricsAddress parse_metrics_address(const std::string& text);

class MetricsServer {
 public:
  // Called on the server's thread for every scrape: the exposition text.
  using Render = std::function<std::string()>;

  // Binds and listens at once (so a taken port is an error before training
  // starts), then serves on its own thread. Throws Error if it cannot.
  MetricsServer(const MetricsAddress& address, Render render);
  ~MetricsServer();  // stops the thread and closes every connection
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;
  std::string url() const;  // http://HOST:PORT/metrics

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brigade::diag
