// Building blocks shared by the shared-memory backend's collectives and its
// point-to-point mailboxes: cross-process atomics on mapped memory, a polite
// spin, and "is that peer process still there".
#pragma once

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

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

// pid 0 means "not attached yet", which is not a death.
inline bool process_exists(uint64_t pid) {
  return pid == 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

}  // namespace brigade::shm
