// libFuzzer target: any bytes as a safetensors file. SafetensorsFile must
// either reject them with brigade::Error or open them such that every
// tensor it lists can be read in full; anything else (a crash, an
// out-of-bounds read under ASan, another exception type) is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "brigade/ckpt/safetensors.h"
#include "brigade/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/brigade_fuzz_" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const brigade::SafetensorsFile file(path);
    for (const auto& [name, entry] : file.tensors()) {
      // Touch every byte the header claims: ASan reports a read past the map.
      const auto* bytes = static_cast<const uint8_t*>(file.data(entry));
      volatile uint8_t sink = 0;
      for (int64_t i = 0; i < entry.end - entry.begin; ++i) sink = sink ^ bytes[i];
      if (entry.dtype == "F32" || entry.dtype == "F16" || entry.dtype == "BF16") {
        std::vector<float> out(static_cast<size_t>(entry.numel()));
        file.read_f32(name, entry.shape, out.data());
      }
    }
  } catch (const brigade::Error&) {
    // Rejected with a message: what malformed input must get.
  }
  return 0;
}
