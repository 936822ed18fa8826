// AppendFile: every line lands whole, in one write, also a line longer than
// a stream's buffer and lines from two writers on one file; a file that
// cannot be opened is named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(AppendFile, LinesLandWholeAndAfterWhatWasThere) {
  testing::TempDir dir("brigade_append");
  const fs::path path = dir.path() / "log.jsonl";
  std::ofstream(path) << "earlier\n";
  const std::string long_line(100'000, 'x');  // > any stream buffer
  {
    AppendFile a(path), b(path);
    a.append_line("a1");
    b.append_line(long_line);
    a.append_line("a2");
  }
  EXPECT_EQ(lines_of(path), (std::vector<std::string>{"earlier", "a1", long_line, "a2"}));
  EXPECT_EQ(fs::file_size(path), 8 + 3 + long_line.size() + 1 + 3);
}

// Two writers at once, lines far longer than a stream's buffer: each line
// is one write, so none is cut into by the other's.
TEST(AppendFile, TwoWritersAtOnceNeverInterleaveTheirLines) {
  testing::TempDir dir("brigade_append");
  const fs::path path = dir.path() / "log.jsonl";
  constexpr int kLines = 40;
  const auto writer = [&](char c) {
    AppendFile f(path);
    const std::string line(64'000, c);
    for (int i = 0; i < kLines; ++i) f.append_line(line);
  };
  std::thread a(writer, 'a'), b(writer, 'b');
  a.join();
  b.join();
  const std::vector<std::string> lines = lines_of(path);
  ASSERT_EQ(lines.size(), 2u * kLines);
  for (const std::string& line : lines) {
    ASSERT_EQ(line.size(), 64'000u);
    EXPECT_EQ(line.find_first_not_of(line[0]), std::string::npos) << "a line was cut into";
  }
}

TEST(AppendFile, AFileThatCannotBeOpenedIsNamed) {
  testing::TempDir dir("brigade_append");
  const fs::path path = dir.path() / "missing" / "log.jsonl";
  try {
    AppendFile f(path);
    FAIL() << "opened " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
