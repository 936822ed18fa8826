// Handing memory back to the operating system while keeping its meaning:
// ZeRO 2 and 3 drop the parts of the flat buffers a rank does not own.
#pragma once

namespace brigade {

// Afterwards every float in [begin, end) reads as zero. The whole pages
// inside the range go back to the system (MADV_DONTNEED for private memory,
// MADV_REMOVE for a shared mapping, whose backing would otherwise stay), so
// they cost nothing until written again; the partial pages at the edges
// are zeroed in place.
void release_as_zeros(float* begin, float* end, bool shared);

}  // namespace brigade
