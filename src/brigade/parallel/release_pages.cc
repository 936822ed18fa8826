#include "brigade/parallel/release_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>

namespace brigade {

void release_as_zeros(float* begin, float* end, bool shared) {
  if (begin >= end) return;
  constexpr uintptr_t kPage = 4096;
  const auto first = reinterpret_cast<uintptr_t>(begin);
  const auto last = reinterpret_cast<uintptr_t>(end);
  const uintptr_t page_begin = (first + kPage - 1) / kPage * kPage;
  const uintptr_t page_end = last / kPage * kPage;
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

}  // namespace brigade
