// Releasing memory as zeros and taking it back in one call (core/pages.h):
// what ZeRO 2 and 3 rely on to hold only their shards between uses, and to
// pay one system call rather than a fault per page when the shards come back.
#include "brigade/core/pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <stdexcept>

namespace brigade {
namespace BRIGADE_TEST_FILE {

constexpr int64_t kPage = 4096;
constexpr int64_t kPages = 64;
constexpr int64_t kFloatsPerPage = kPage / 4;

// kPages pages of shared (as training's segment) or private memory, filled with ones.
class Mapping {
 public:
  explicit Mapping(bool shared)
      : data_(::mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE,
                     (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0)) {
    if (data_ == MAP_FAILED) throw std::runtime_error("mmap failed");
    for (int64_t i = 0; i < kPages * kFloatsPerPage; ++i) floats()[i] = 1.0f;
  }
  ~Mapping() { ::munmap(data_, kPages * kPage); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  float* floats() const { return static_cast<float*>(data_); }
  int64_t resident() const { return resident_bytes(floats(), floats() + kPages * kFloatsPerPage); }

 private:
  void* data_;
};

class PagesTest : public ::testing::TestWithParam<bool> {};

TEST_P(PagesTest, ReleasedPagesReadAsZerosAndComeBackWholeInOneCall) {
  if (!populates_in_one_call())
    GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  Mapping m(GetParam());
  ASSERT_EQ(m.resident(), kPages * kPage);
  // A range with partial pages at both ends, as a shard's edges are.
  float* begin = m.floats() + 3 * kFloatsPerPage + 100;
  float* end = m.floats() + 40 * kFloatsPerPage + 7;
  release_as_zeros(begin, end, GetParam());
  // Pages 4..39 are whole inside the range: gone; the edges stay, zeroed in place.
  EXPECT_EQ(m.resident(), (kPages - 36) * kPage);
  populate_for_write(begin, end);
  // Measured before any read or write of the range: the call alone brought them back.
  EXPECT_EQ(m.resident(), kPages * kPage);
  for (int64_t i = 0; i < kPages * kFloatsPerPage; ++i) {
    const bool inside = m.floats() + i >= begin && m.floats() + i < end;
    ASSERT_EQ(m.floats()[i], inside ? 0.0f : 1.0f) << "float " << i;
  }
}

TEST_P(PagesTest, PopulatingResidentPagesKeepsTheirValues) {
  Mapping m(GetParam());
  m.floats()[5 * kFloatsPerPage] = 7.0f;
  populate_for_write(m.floats(), m.floats() + kPages * kFloatsPerPage);
  EXPECT_EQ(m.floats()[5 * kFloatsPerPage], 7.0f);
  EXPECT_EQ(m.floats()[6 * kFloatsPerPage], 1.0f);
  EXPECT_EQ(m.resident(), kPages * kPage);
}

INSTANTIATE_TEST_SUITE_P(Memory, PagesTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "shared" : "private"; });

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
