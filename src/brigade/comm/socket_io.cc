#include "brigade/comm/socket_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "brigade/core/clock.h"

namespace brigade::socket_io {

int poll_timeout_ms(int64_t deadline_ns) {
  const int64_t left_ns = deadline_ns - now_ns();
  if (left_ns <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((left_ns + kNsPerMs - 1) / kNsPerMs, 1 << 30));
}

bool wait_ready(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, poll_timeout_ms(deadline_ns));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;  // let the read or write report the error
  }
}

Io write_all(int fd, std::string_view bytes, int64_t deadline_ns, int* err) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline_ns)) return Io::kTimeout;
    } else {
      *err = errno;
      return errno == EPIPE || errno == ECONNRESET ? Io::kClosed : Io::kFailed;
    }
  }
  return Io::kOk;
}

Io read_exact(int fd, char* data, size_t bytes, int64_t deadline_ns, int* err) {
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, data, bytes, 0);
    if (n > 0) {
      data += n;
      bytes -= static_cast<size_t>(n);
    } else if (n == 0) {
      return Io::kClosed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, deadline_ns)) return Io::kTimeout;
    } else {
      *err = errno;
      return errno == ECONNRESET ? Io::kClosed : Io::kFailed;
    }
  }
  return Io::kOk;
}

bool same_token(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace brigade::socket_io
