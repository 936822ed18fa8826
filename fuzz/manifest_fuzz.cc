// libFuzzer target: any bytes as a checkpoint's manifest.json. Manifest::read
// must reject them with brigade::Error (bad JSON, a failed self-checksum, a
// field of the wrong type, chunks outside their tensor, overlapping, or not
// covering it) or accept a manifest whose every chunk lies inside its tensor.
// The self-checksum would stop almost every mutation at the door, so the
// input is also tried re-sealed, to reach the structural checks behind it.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "brigade/ckpt/manifest.h"
#include "brigade/core/error.h"

namespace {

void try_read(const std::filesystem::path& dir, const std::string& text) {
  FILE* f = std::fopen((dir / "manifest.json").c_str(), "wb");
  if (f == nullptr) return;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  try {
    const brigade::Manifest m = brigade::Manifest::read(dir);
    for (const auto& tensor : m.tensors) {
      for (const auto& chunk : tensor.chunks) {
        if (!brigade::box_inside(chunk.box, tensor.shape)) __builtin_trap();
      }
    }
  } catch (const brigade::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    const auto d = std::filesystem::temp_directory_path() /
                   ("brigade_fuzz_manifest_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  try_read(dir, text);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_discarded() && j.is_object()) try_read(dir, brigade::Manifest::sealed(j).dump());
  return 0;
}
