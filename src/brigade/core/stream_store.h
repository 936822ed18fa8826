// Copies into memory this process never reads back (an in-memory
// snapshot's shard file): non-temporal stores bypass the caches, so the
// copy neither evicts the training's working set nor reads each
// destination line for ownership first. Header-only and baseline code: the
// kernels include it before their instruction-set switch (isa_variant.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace brigade {

// memcpy(dst, src, n) with streaming stores where dst is 16-byte aligned
// (the unaligned head and the tail go through memcpy). Call store_fence()
// before another thread or process may read dst.
inline void copy_nontemporal(void* dst_bytes, const void* src_bytes, size_t n) {
  auto* dst = static_cast<char*>(dst_bytes);
  const auto* src = static_cast<const char*>(src_bytes);
#if defined(__x86_64__)
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

// Orders this thread's streaming stores before whatever it does next.
inline void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace brigade
