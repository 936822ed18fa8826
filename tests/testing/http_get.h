// A blocking HTTP/1.0 GET on loopback, for tests that read a server's
// answer (the agent's /metrics, Prometheus's query API).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <optional>
#include <string>

namespace brigade::testing {

struct HttpResponse {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// Sends `request` as is (a whole request, or any bytes) to 127.0.0.1:port
// and reads until the server closes; nullopt if it cannot connect, or on
// no answer within the timeout.
inline std::optional<HttpResponse> http_exchange(int port, const std::string& request,
                                                 int timeout_s = 30) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string all;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      if (n < 0 && all.empty()) {
        ::close(fd);
        return std::nullopt;
      }
      break;
    }
    all.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  HttpResponse r;
  const size_t end = all.find("\r\n\r\n");
  if (end == std::string::npos) return std::nullopt;
  r.head = all.substr(0, end);
  r.body = all.substr(end + 4);
  if (r.head.size() < 12 || !r.head.starts_with("HTTP/1.")) return std::nullopt;
  r.status = std::stoi(r.head.substr(9, 3));
  return r;
}

inline std::optional<HttpResponse> http_get(int port, const std::string& target) {
  return http_exchange(port, "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

}  // namespace brigade::testing
