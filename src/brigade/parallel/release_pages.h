// Handing memory back to the operating system while keeping its meaning:
// ZeRO 2 and 3 drop the parts of the flat buffers a rank does not own.
#pragma once

#include <cstdint>

namespace brigade {

// Afterwards every float in [begin, end) reads as zero. The whole pages
// inside the range go back to the system (MADV_DONTNEED for private memory,
// MADV_REMOVE for a shared mapping, whose backing would otherwise stay), so
// they cost nothing until written again; the partial pages at the edges
// are zeroed in place.
void release_as_zeros(float* begin, float* end, bool shared);

// Bytes of the pages overlapping [begin, end) that are in memory now
// (mincore; for shared memory, whether the page is in the segment). What a
// buffer really costs, which release_as_zeros lowers: the check that ZeRO's
// releases happen. Throws Error if part of the range is not mapped.
int64_t resident_bytes(const void* begin, const void* end);

}  // namespace brigade
