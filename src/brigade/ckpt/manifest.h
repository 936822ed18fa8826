// The manifest of a distributed checkpoint: what a step directory holds and
// how it fits together. Written last, atomically: a step whose manifest.json
// exists is complete, and one without it does not exist.
//
//   {
//     "format": "brigade-checkpoint-1",
//     "step": 100,
//     "model": {n_layer, n_head, ...},         // GptConfig
//     "mesh": {"dp": 2, "tp": 1, "pp": 1, "zero": 1},   // how it was saved
//     "trainer_state": {...},                   // step, RNG/sampler, schedule
//     "tokenizer": "byte",
//     "tensors": [{"name": "model/h.0.attn.c_attn.weight", "dtype": "F32",
//                  "shape": [768, 2304],
//                  "chunks": [{"file": "shard_00000.safetensors",
//                              "key": "model@0", "offset": 38597376,
//                              "offsets": [0, 0], "sizes": [384, 2304]}, ...]}],
//     "shards": [{"file": "shard_00000.safetensors", "bytes": 123, "xxh64": "9f..."}],
//     "manifest_xxh64": "..."   // of the compact JSON of everything else
//   }
//
// The manifest checks itself: a flipped byte that still parses (a digit of
// the step, say) fails the self-checksum rather than loading wrong state.
//
// Tensor names are global: "model/<Hugging Face GPT-2 name>" for parameters,
// "optim/exp_avg/<name>" and "optim/exp_avg_sq/<name>" for AdamW's moments.
// Each chunk is a box (tensor_box.h) whose elements, in row-major box order,
// are stored in `file` as elements [offset, offset + box size) of the 1-D
// tensor `key`. (A rank writes each flat range it owns as one such tensor,
// so a shard is a few long runs however many model tensors they cross.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "brigade/ckpt/tensor_box.h"

namespace brigade {

struct ChunkRecord {
  std::string file;
  std::string key;
  int64_t offset = 0;  // elements into `key`
  TensorBox box;
};

struct TensorRecord {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::vector<ChunkRecord> chunks;
};

struct ShardRecord {
  std::string file;
  int64_t bytes = 0;
  // Absent ("xxh64": null) only in an in-memory snapshot, which is checked
  // by sizes and the manifest's own checksum (checkpoint.h, ShardWriting).
  std::optional<uint64_t> xxh64;
};

struct Manifest {
  int64_t step = 0;
  nlohmann::json model;  // GptConfig::to_json()
  nlohmann::json mesh;
  nlohmann::json trainer_state;
  std::string tokenizer;
  std::vector<TensorRecord> tensors;
  std::vector<ShardRecord> shards;

  nlohmann::json to_json() const;
  // Adds "manifest_xxh64" to a manifest's JSON (the writer's last step).
  static nlohmann::json sealed(nlohmann::json j);
  // Parses and checks everything a loader relies on: known format, shapes
  // non-negative, every chunk inside its tensor and in a listed shard, the
  // chunks of each tensor disjoint and covering it exactly, no duplicate
  // names. Error naming `where` and the offending entry otherwise.
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
  static Manifest read(const std::filesystem::path& step_dir);

  const TensorRecord* find(const std::string& name) const;
};

// The xxHash64 of a file's bytes, streaming (seed 0).
uint64_t file_xxh64(const std::filesystem::path& path);

}  // namespace brigade
