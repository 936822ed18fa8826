// Socket reads and writes bounded by an absolute deadline, shared by the
// rendezvous store (comm/tcp_store.cc) and the snapshot replicas
// (elastic/snapshot_replica.cc). The fds are non-blocking: a call waits in
// poll() for the time left until deadline_ns (core/clock.h's now_ns), so a
// peer that sends one byte a second cannot stretch one read past its
// deadline, as a per-recv SO_RCVTIMEO would let it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace brigade::socket_io {

// Milliseconds until deadline_ns, rounded up so a poll never wakes early.
int poll_timeout_ms(int64_t deadline_ns);

// Waits until fd is ready for `events`; false if the deadline passed first.
bool wait_ready(int fd, short events, int64_t deadline_ns);

enum class Io { kOk, kClosed, kTimeout, kFailed };

// Writes or reads every byte before deadline_ns. *err is set to errno for
// kClosed and kFailed when the system said why.
Io write_all(int fd, std::string_view bytes, int64_t deadline_ns, int* err);
Io read_exact(int fd, char* data, size_t bytes, int64_t deadline_ns, int* err);

// Compares without an early exit, so response time says nothing about how
// much of a guessed token was right; a prefix of the token, or an empty
// one, is not the token.
bool same_token(std::string_view a, std::string_view b);

}  // namespace brigade::socket_io
