#include "brigade/ckpt/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/ckpt/manifest.h"
#include "brigade/ckpt/model_weights.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/model/gpt.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;

using testing::TempDir;

void expect_error_mentions(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  TempDir dir;
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> b = {-7, 8};
  SafetensorsWriter w;
  w.add_f32("a", {2, 3}, a.data());
  w.add("b", "I32", {2}, b.data(), 8);
  w.set_metadata("k", "v");
  w.write(dir.path() / "x.safetensors");
  SafetensorsFile f(dir.path() / "x.safetensors");
  EXPECT_EQ(f.metadata().at("k"), "v");
  std::vector<float> back(6);
  f.read_f32("a", {2, 3}, back.data());
  EXPECT_EQ(back, a);
  const TensorEntry* eb = f.find("b");
  ASSERT_NE(eb, nullptr);
  EXPECT_EQ(eb->dtype, "I32");
  EXPECT_EQ(static_cast<const int32_t*>(f.data(*eb))[0], -7);
  // The data section starts 8-byte aligned.
  uint64_t header = 0;
  std::ifstream(dir.path() / "x.safetensors", std::ios::binary)
      .read(reinterpret_cast<char*>(&header), 8);
  EXPECT_EQ(header % 8, 0u);
}

// The in-memory snapshots' write: a spare of the same tensors is overwritten
// in place (its memory reused, which is the point) and becomes the file;
// anything else is replaced by a fresh file and the spare removed.
ino_t inode(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

TEST(Safetensors, ASpareOfTheSameTensorsIsOverwrittenInPlace) {
  TempDir dir;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {7, 8};
  SafetensorsWriter w;
  w.add_f32("a", {2, 3}, a.data());
  w.add_f32("b", {2}, b.data());
  const fs::path spare = dir.path() / "spare.safetensors";
  const uint64_t first = w.write(spare);
  const ino_t spare_inode = inode(spare);
  a = {-1, -2, -3, -4, -5, -6};
  const fs::path file = dir.path() / "x.safetensors";
  const uint64_t second = w.write(file, {.spare = spare, .checksum = true, .read = {}});
  EXPECT_EQ(second, file_xxh64(file));
  EXPECT_NE(file_xxh64(file), first);
  EXPECT_FALSE(fs::exists(spare));
  EXPECT_EQ(inode(file), spare_inode) << "the spare's memory was not reused";
  SafetensorsFile f(file);
  std::vector<float> back(6);
  f.read_f32("a", {2, 3}, back.data());
  EXPECT_EQ(back, a);
  // Without a checksum: 0, and the file is the same.
  fs::rename(file, spare);
  a[0] = 42;
  EXPECT_EQ(w.write(file, {.spare = spare, .checksum = false, .read = {}}), 0u);
  EXPECT_EQ(inode(file), spare_inode);
  SafetensorsFile g(file);
  g.read_f32("a", {2, 3}, back.data());
  EXPECT_EQ(back[0], 42);
}

// The replica check's hash rides on a snapshot's copy (Reuse::read): it
// must be given every byte of the data once, in file order, whether the
// data goes into a spare (in blocks, with streaming stores, at unaligned
// places) or into a fresh file; and the copy must be exact.
TEST(Safetensors, AWriteGivesEveryByteItCopiesToReadOnceInOrder) {
  TempDir dir;
  std::vector<float> a((size_t{300} << 10) + 3), b(7);  // over one 256 KB block; odd sizes
  SafetensorsWriter w;
  w.add_f32("b", {7}, b.data());
  w.add_f32("a", {static_cast<int64_t>(a.size())}, a.data());
  const fs::path spare = dir.path() / "spare.safetensors";
  for (const bool into_spare : {false, true}) {
    // Other values the second time, so a byte the copy missed shows.
    const float scale = into_spare ? -0.25f : 0.5f;
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * scale;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) * scale - 1.0f;
    std::string want(reinterpret_cast<const char*>(b.data()), b.size() * sizeof(float));
    want.append(reinterpret_cast<const char*>(a.data()), a.size() * sizeof(float));
    std::string seen;
    const fs::path file = dir.path() / "x.safetensors";
    const fs::path from = into_spare ? spare : fs::path();
    w.write(into_spare ? file : spare,
            {.spare = from, .checksum = false, .read = [&](const void* data, size_t bytes) {
               seen.append(static_cast<const char*>(data), bytes);
             }});
    EXPECT_EQ(seen, want) << (into_spare ? "into a spare" : "a fresh file");
    SafetensorsFile f(into_spare ? file : spare);
    std::vector<float> back_a(a.size()), back_b(b.size());
    f.read_f32("a", {static_cast<int64_t>(a.size())}, back_a.data());
    f.read_f32("b", {7}, back_b.data());
    EXPECT_EQ(back_a, a);
    EXPECT_EQ(back_b, b);
  }
}

TEST(Safetensors, ASpareOfOtherTensorsIsReplacedNotReused) {
  TempDir dir;
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const fs::path spare = dir.path() / "spare.safetensors";
  {
    SafetensorsWriter other;  // another shape, same byte count
    other.add_f32("a", {3, 2}, a.data());
    other.write(spare);
  }
  SafetensorsWriter w;
  w.add_f32("a", {2, 3}, a.data());
  const fs::path file = dir.path() / "x.safetensors";
  const uint64_t hash = w.write(file, {.spare = spare, .checksum = true, .read = {}});
  EXPECT_EQ(hash, file_xxh64(file)) << "the checksum is the file's";
  EXPECT_FALSE(fs::exists(spare)) << "a spare that cannot be reused is not kept";
  SafetensorsFile f(file);
  EXPECT_EQ(f.find("a")->shape, (std::vector<int64_t>{2, 3}));
  // No spare at all: a fresh file.
  EXPECT_EQ(w.write(dir.path() / "y.safetensors",
                    {.spare = dir.path() / "none", .checksum = true, .read = {}}),
            hash);
}

// A snapshot every step keeps its spares' mappings (SpareMappings): found
// again by inode across the renames between a step's directory and the
// spare, let go once the file is removed (a kept mapping would hold its
// memory), at most `capacity` of them.
TEST(Safetensors, KeptMappingsFollowTheFileAndLetGoOfRemovedOnes) {
  TempDir dir;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  SafetensorsWriter w;
  w.add_f32("a", {2, 3}, a.data());
  const fs::path spare = dir.path() / "spare.safetensors", file = dir.path() / "x.safetensors";
  const auto read_a = [&](const fs::path& path) {
    std::vector<float> back(6);
    SafetensorsFile(path).read_f32("a", {2, 3}, back.data());
    return back;
  };
  SpareMappings kept(4);
  w.write(spare);
  for (int round = 0; round < 3; ++round) {
    a[0] = static_cast<float>(10 + round);
    w.write(file, {.spare = spare, .checksum = false, .read = {}, .mappings = &kept});
    EXPECT_EQ(read_a(file), a) << "round " << round;
    EXPECT_EQ(kept.size(), 1u) << "round " << round << ": the same file, mapped again";
    fs::rename(file, spare);
  }
  // A second file: two kept. Removing one lets its mapping go at the next write.
  const fs::path other_spare = dir.path() / "other.safetensors";
  w.write(other_spare);
  w.write(dir.path() / "y.safetensors",
          {.spare = other_spare, .checksum = false, .read = {}, .mappings = &kept});
  EXPECT_EQ(kept.size(), 2u);
  fs::remove(dir.path() / "y.safetensors");
  a[0] = 99;
  w.write(file, {.spare = spare, .checksum = false, .read = {}, .mappings = &kept});
  EXPECT_EQ(read_a(file), a);
  EXPECT_EQ(kept.size(), 1u) << "the removed file's mapping is still kept";
  // A spare of other tensors is removed, and its mapping with it.
  {
    SafetensorsWriter wider;
    const std::vector<float> b(12, 1.0f);
    wider.add_f32("a", {3, 4}, b.data());
    fs::rename(file, spare);
    wider.write(file, {.spare = spare, .checksum = false, .read = {}, .mappings = &kept});
  }
  EXPECT_EQ(kept.size(), 0u);
  // At most `capacity`, the least recently used let go.
  SpareMappings two(2);
  for (int i = 0; i < 3; ++i) {
    const fs::path s = dir.path() / ("s" + std::to_string(i)),
                   f = dir.path() / ("f" + std::to_string(i));
    w.write(s);
    w.write(f, {.spare = s, .checksum = false, .read = {}, .mappings = &two});
    EXPECT_EQ(read_a(f), a);
  }
  EXPECT_EQ(two.size(), 2u);
}

// A claimed spare is the caller's to fill in place: the file moves to its
// new name (a spare made afterwards under the old one is another file), the
// pointers are each tensor's bytes in file order, and what is written
// through them is what the file holds. A spare of other tensors (of the
// same size) is not claimed, and removed as a write removes it.
TEST(Safetensors, AClaimedSpareMovesAndHoldsWhatIsWrittenThroughIt) {
  TempDir dir;
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {7, 8};
  SafetensorsWriter w;
  w.add_f32("a", {2, 3}, a.data());
  w.add_f32("b", {2}, b.data());
  const fs::path spare = dir.path() / "spare.safetensors", file = dir.path() / "x.safetensors";
  SpareMappings kept(4);
  EXPECT_TRUE(w.claim(spare, file, kept).empty()) << "claimed a spare that is not there";
  {
    SafetensorsWriter other;
    other.add_f32("c", {2, 3}, a.data());
    other.add_f32("d", {2}, b.data());
    other.write(spare);
  }
  ASSERT_EQ(fs::file_size(spare), [&] {
    w.write(dir.path() / "same_size");
    return fs::file_size(dir.path() / "same_size");
  }());
  EXPECT_TRUE(w.claim(spare, file, kept).empty()) << "claimed a spare of other tensors";
  EXPECT_FALSE(fs::exists(spare));
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(kept.size(), 0u) << "the other tensors' mapping is kept";
  w.write(spare);
  const std::vector<char*> data = w.claim(spare, file, kept);
  ASSERT_EQ(data.size(), 2u);
  EXPECT_FALSE(fs::exists(spare));
  EXPECT_EQ(data[1] - data[0], static_cast<std::ptrdiff_t>(a.size() * sizeof(float)));
  const std::vector<float> new_a = {-1, -2, -3, -4, -5, -6}, new_b = {-7, -8};
  std::memcpy(data[0], new_a.data(), new_a.size() * sizeof(float));
  std::memcpy(data[1], new_b.data(), new_b.size() * sizeof(float));
  // Another spare under the old name now is no concern of the claimed file.
  w.write(spare);
  const SafetensorsFile f(file);
  std::vector<float> back_a(6), back_b(2);
  f.read_f32("a", {2, 3}, back_a.data());
  f.read_f32("b", {2}, back_b.data());
  EXPECT_EQ(back_a, new_a);
  EXPECT_EQ(back_b, new_b);
}

// SpareMappings as the process sees it (/proc/self/maps): one mapping per
// file however often and under whatever name it is asked for, the least
// recently used let go first, and a removed file's mapping gone at the
// next sweep (while kept it holds the file's memory: "(deleted)").
int mappings_of(const fs::path& path) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(path.string()) != std::string::npos) ++count;
  }
  return count;
}

TEST(Safetensors, SpareMappingsMapEachFileOnceAndLetGoOfTheOldestAndTheRemoved) {
  TempDir dir;
  constexpr size_t kBytes = size_t{1} << 20;
  std::vector<fs::path> files;
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    files.push_back(dir.path() / ("f" + std::to_string(i)));
    std::ofstream(files.back()) << "x";
    fs::resize_file(files.back(), kBytes);
  }
  const auto open_rw = [&](const fs::path& path) {
    fds.push_back(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    return fds.back();
  };
  {
    SpareMappings two(2);
    ASSERT_NE(two.map(open_rw(files[0]), kBytes), nullptr);
    ASSERT_NE(two.map(open_rw(files[0]), kBytes), nullptr);
    EXPECT_EQ(mappings_of(files[0]), 1) << "asked twice, mapped twice";
    // Renamed, as a snapshot's file moves between a step and the spares.
    const fs::path moved = dir.path() / "moved";
    fs::rename(files[0], moved);
    ASSERT_NE(two.map(open_rw(moved), kBytes), nullptr);
    EXPECT_EQ(mappings_of(moved), 1) << "the same file under its new name, mapped again";
    // f1, then the moved f0 again: f1 is the least recently used when f2 comes.
    ASSERT_NE(two.map(open_rw(files[1]), kBytes), nullptr);
    ASSERT_NE(two.map(open_rw(moved), kBytes), nullptr);
    ASSERT_NE(two.map(open_rw(files[2]), kBytes), nullptr);
    EXPECT_EQ(mappings_of(files[1]), 0) << "the least recently used is let go";
    EXPECT_EQ(mappings_of(moved), 1);
    EXPECT_EQ(mappings_of(files[2]), 1);
    // Removed: kept, it holds the memory until the sweep.
    fs::remove(files[2]);
    EXPECT_EQ(mappings_of(files[2]), 1);
    two.sweep();
    EXPECT_EQ(mappings_of(files[2]), 0) << "a removed file's mapping outlived the sweep";
    EXPECT_EQ(mappings_of(moved), 1);
  }
  EXPECT_EQ(mappings_of(dir.path()), 0) << "mappings outlived their SpareMappings";
  for (const int fd : fds) ::close(fd);
}

TEST(Safetensors, TruncatedFileIsAnErrorNamingTheTensor) {
  TempDir dir;
  std::vector<float> a(100, 1.0f);
  SafetensorsWriter w;
  w.add_f32("weights", {100}, a.data());
  w.write(dir.path() / "x.safetensors");
  fs::resize_file(dir.path() / "x.safetensors", fs::file_size(dir.path() / "x.safetensors") - 10);
  expect_error_mentions([&] { SafetensorsFile f(dir.path() / "x.safetensors"); }, "weights");
}

TEST(Safetensors, GarbageIsNotASafetensorsFile) {
  TempDir dir;
  write_file_atomic(dir.path() / "junk", "this is not a safetensors file at all");
  expect_error_mentions([&] { SafetensorsFile f(dir.path() / "junk"); }, "junk");
  expect_error_mentions([&] { SafetensorsFile f(dir.path() / "missing"); }, "no such file");
}

TEST(Safetensors, WidensHalfAndBfloat16) {
  TempDir dir;
  const uint16_t half[] = {0x3C00, 0xC000, 0x3555};  // 1, -2, ~0.33325
  const uint16_t bf16[] = {0x3F80, 0xC040};          // 1, -3
  SafetensorsWriter w;
  w.add("h", "F16", {3}, half, 6);
  w.add("b", "BF16", {2}, bf16, 4);
  w.write(dir.path() / "x.safetensors");
  SafetensorsFile f(dir.path() / "x.safetensors");
  float h[3], b[2];
  f.read_f32("h", {3}, h);
  f.read_f32("b", {2}, b);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_NEAR(h[2], 0.33325f, 1e-4);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -3.0f);
}

GptConfig small_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 6;
  c.vocab_size = 5;
  return c;
}

TEST(ModelWeights, SaveLoadRoundTripWithConfigInMetadata) {
  TempDir dir;
  const GptConfig c = small_config();
  ParamLayout layout(c);
  FloatBuffer p(layout.size()), q(layout.size());
  init_gpt2_weights(layout, c.n_layer, 3, p.data());
  save_model_weights(dir.path() / "m.safetensors", c, p.data());
  SafetensorsFile f(dir.path() / "m.safetensors");
  const GptConfig back = read_weights_config(f);
  EXPECT_EQ(back.n_head, 2);
  EXPECT_EQ(back.vocab_size, 5);
  load_model_weights(f, layout, q.data());
  for (int64_t i = 0; i < layout.size(); ++i) ASSERT_EQ(p.data()[i], q.data()[i]);
  EXPECT_EQ(f.find("h.1.attn.c_attn.weight")->shape, (std::vector<int64_t>{8, 24}));
}

TEST(ModelWeights, LoadsHuggingFaceStyleFiles) {
  // No config metadata, "transformer." prefixes, extra buffers and a tied
  // lm_head, with config.json beside the file: the shape of a GPT-2
  // checkpoint exported by the transformers library.
  TempDir dir;
  const GptConfig c = small_config();
  ParamLayout layout(c);
  FloatBuffer p(layout.size()), q(layout.size());
  init_gpt2_weights(layout, c.n_layer, 4, p.data());
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const ParamInfo& info : layout.params()) {
    w.add_f32("transformer." + info.name, info.shape, p.data() + info.offset);
  }
  std::vector<float> mask(36, 1.0f);
  w.add_f32("transformer.h.0.attn.bias", {1, 1, 6, 6}, mask.data());
  w.add_f32("lm_head.weight", {5, 8}, p.data() + layout.wte());
  w.write(dir.path() / "model.safetensors");
  expect_error_mentions(
      [&] { read_weights_config(SafetensorsFile(dir.path() / "model.safetensors")); },
      "config.json");
  write_file_atomic(
      dir.path() / "config.json",
      nlohmann::json{
          {"n_layer", 2}, {"n_head", 2}, {"n_embd", 8}, {"n_positions", 6}, {"vocab_size", 5}}
          .dump());
  SafetensorsFile f(dir.path() / "model.safetensors");
  const GptConfig back = read_weights_config(f);
  EXPECT_EQ(back.block_size, 6);
  load_model_weights(f, ParamLayout(back), q.data());
  for (int64_t i = 0; i < layout.size(); ++i) ASSERT_EQ(p.data()[i], q.data()[i]);
}

TEST(ModelWeights, ShapeMismatchNamesTheTensor) {
  TempDir dir;
  const GptConfig c = small_config();
  ParamLayout layout(c);
  FloatBuffer p(layout.size());
  save_model_weights(dir.path() / "m.safetensors", c, p.data());
  GptConfig wider = c;
  wider.vocab_size = 7;
  ParamLayout other(wider);
  FloatBuffer q(other.size());
  expect_error_mentions(
      [&] { load_model_weights(SafetensorsFile(dir.path() / "m.safetensors"), other, q.data()); },
      "wte.weight");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
