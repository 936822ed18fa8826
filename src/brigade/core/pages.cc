#include "brigade/core/pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "brigade/core/error.h"

namespace brigade {

WholePages whole_pages(const void* begin, const void* end) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return {(reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page,
          reinterpret_cast<uintptr_t>(end) / page * page};
}

void release_as_zeros(float* begin, float* end, bool shared) {
  if (begin >= end) return;
  const auto first = reinterpret_cast<uintptr_t>(begin);
  const auto last = reinterpret_cast<uintptr_t>(end);
  const auto [page_begin, page_end] = whole_pages(begin, end);
  if (page_begin >= page_end) {
    std::memset(begin, 0, (last - first));
    return;
  }
  std::memset(begin, 0, page_begin - first);
  std::memset(reinterpret_cast<void*>(page_end), 0, last - page_end);
  // MADV_REMOVE frees a shared mapping's backing; DONTNEED private memory.
  if (::madvise(reinterpret_cast<void*>(page_begin), page_end - page_begin,
                shared ? MADV_REMOVE : MADV_DONTNEED) != 0) {
    std::memset(reinterpret_cast<void*>(page_begin), 0, page_end - page_begin);
  }
}

void populate_for_write(void* begin, void* end) {
#ifdef MADV_POPULATE_WRITE
  const auto [first, last] = whole_pages(begin, end);
  if (first < last) {
    // EINVAL on kernels before 5.14: the copy's faults do the same work.
    (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
  }
#else
  (void)begin;
  (void)end;
#endif
}

bool populates_in_one_call() {
#ifdef MADV_POPULATE_WRITE
  static const bool populates = [] {
    const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* probe = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED) return false;
    const bool ok = ::madvise(probe, page, MADV_POPULATE_WRITE) == 0;
    ::munmap(probe, page);
    return ok;
  }();
  return populates;
#else
  return false;
#endif
}

int64_t resident_bytes(const void* begin, const void* end) {
  if (begin >= end) return 0;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(end) + page - 1) / page * page;
  std::vector<unsigned char> in_core((last - first) / page);
  if (::mincore(reinterpret_cast<void*>(first), last - first, in_core.data()) != 0) {
    throw_error("mincore over {} bytes failed: {}", last - first, std::strerror(errno));
  }
  int64_t pages = 0;
  for (const unsigned char flags : in_core) pages += flags & 1;
  return pages * static_cast<int64_t>(page);
}

}  // namespace brigade
