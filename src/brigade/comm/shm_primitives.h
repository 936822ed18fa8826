// Building blocks shared by the shared-memory backend's collectives and its
// point-to-point mailboxes: cross-process atomics on mapped memory, a polite
// spin, and "is that peer process still there".
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace brigade::shm {

// Two cache lines: x86 prefetches lines in pairs, so words written by
// different ranks are kept 128 bytes apart to avoid false sharing.
constexpr int64_t kLineBytes = 128;

// The segment is zero-filled by ftruncate, and plain uint64_t fields accessed
// through atomic_ref need no construction, whichever process maps them first.
using AtomicU64 = std::atomic_ref<uint64_t>;
static_assert(AtomicU64::is_always_lock_free, "shared-memory atomics must be lock-free");

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// pid 0 means "not attached yet", which is not a death. A zombie is dead:
// kill(pid, 0) still succeeds on it until its parent reaps it, and a
// launcher that is busy, stopped or hung may not do so for a long time.
inline bool process_exists(uint64_t pid) {
  if (pid == 0) return true;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%llu/stat", static_cast<unsigned long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // no /proc: trust kill()
  char stat[256];
  const ssize_t n = ::read(fd, stat, sizeof(stat) - 1);
  ::close(fd);
  if (n <= 0) return true;
  stat[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')'.
  const char* close_paren = std::strrchr(stat, ')');
  return close_paren == nullptr || close_paren[1] == '\0' || close_paren[2] != 'Z';
}

}  // namespace brigade::shm
