// AtomicFileWriter: two writers of one path at once (processes on nodes
// sharing a run directory, whose pids may be equal) each write a temporary
// of their own, so both commit and the file is one of them whole, with no
// temporary left behind. (A failed write: tests/diag/trace_incidents_test.cc.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "brigade/core/files.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

int entries(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(AtomicFile, TwoWritersOfOnePathEachCommitWhole) {
  testing::TempDir dir("brigade_atomic");
  const fs::path path = dir.path() / "trace.json";
  const std::string a(10'000, 'a'), b(5'000, 'b');
  {
    AtomicFileWriter first(path), second(path);
    first.write(a);
    second.write(b);
    first.commit();
    EXPECT_EQ(read_file(path), a);
    second.commit();
  }
  EXPECT_EQ(read_file(path), b);
  EXPECT_EQ(entries(dir.path()), 1);  // no temporary left
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
