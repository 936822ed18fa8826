// Whether two saved steps (checkpoints or in-memory snapshots, any layout)
// hold the same training state: the whole model's parameters and both Adam
// moments, bit for bit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/model/param_layout.h"

namespace brigade::testing {

// The first of parameters, m and v in which the two step directories
// differ; none when all three are equal. A snapshot's shards (no checksum)
// are accepted.
inline std::optional<StateKind> first_differing_state(const GptConfig& model,
                                                      const std::filesystem::path& a,
                                                      const std::filesystem::path& b) {
  const Manifest manifest_a = verify_checkpoint(a, /*snapshot=*/true);
  const Manifest manifest_b = verify_checkpoint(b, /*snapshot=*/true);
  const auto size = static_cast<size_t>(ParamLayout(model).size());
  for (StateKind kind : {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq}) {
    std::vector<float> x(size), y(size);
    load_checkpoint_state(a, manifest_a, model, kind, x.data());
    load_checkpoint_state(b, manifest_b, model, kind, y.data());
    if (x != y) return kind;
  }
  return std::nullopt;
}

}  // namespace brigade::testing
