// Handing memory back to the operating system while keeping its meaning
// (ZeRO 2 and 3 drop the parts of the flat buffers a rank does not own),
// and taking it back in one call rather than a fault per page.
#pragma once

#include <cstdint>

namespace brigade {

// The whole pages of this system inside [begin, end): [first, last), empty
// (first >= last) if none. What the calls below act on, and what can be
// protected or advised without touching the bytes around the range.
struct WholePages {
  uintptr_t first = 0;
  uintptr_t last = 0;
};
WholePages whole_pages(const void* begin, const void* end);

// Afterwards every float in [begin, end) reads as zero. The whole pages
// inside the range go back to the system (MADV_DONTNEED for private memory,
// MADV_REMOVE for a shared mapping, whose backing would otherwise stay), so
// they cost nothing until written again; the partial pages at the edges
// are zeroed in place.
void release_as_zeros(float* begin, float* end, bool shared);

// Makes the whole pages inside [begin, end) present and writable before a
// copy fills them (MADV_POPULATE_WRITE, Linux 5.14): one system call instead
// of a page fault per 4 KiB, which the kernel pays for with an exception
// entry and exit each, dear in a virtual machine (about 2x faster than the
// faults on the KVM guest of docs/PERFORMANCE.md, "ZeRO 2 and 3 where page
// faults are dear"). Contents are unchanged (a released page still reads
// as zero).
// Only an optimisation: on an older kernel, or if the call fails, the
// writes fault the pages in as before.
void populate_for_write(void* begin, void* end);

// Whether populate_for_write takes pages back on this kernel (probed once).
bool populates_in_one_call();

// Bytes of the pages overlapping [begin, end) that are in memory now
// (mincore; for shared memory, whether the page is in the segment). What a
// buffer really costs, which release_as_zeros lowers: the check that ZeRO's
// releases happen. Throws Error if part of the range is not mapped.
int64_t resident_bytes(const void* begin, const void* end);

}  // namespace brigade
