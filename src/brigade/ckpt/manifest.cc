#include "brigade/ckpt/manifest.h"

#include <xxhash.h>

#include <fstream>
#include <map>
#include <set>

#include "brigade/core/error.h"

namespace brigade {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "brigade-checkpoint-1";

std::string hex64(uint64_t value) {
  return fmt::format("{:016x}", value);
}

// Reading helpers that turn a missing or mistyped field into an Error
// naming it, instead of a JSON library exception.
const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw_error("{}: missing \"{}\"", where, key);
  return j.at(key);
}

std::string string_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_string()) throw_error("{}: \"{}\" must be a string", where, key);
  return v.get<std::string>();
}

int64_t int_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_number_integer()) throw_error("{}: \"{}\" must be an integer", where, key);
  return v.get<int64_t>();
}

std::vector<int64_t> ints_field(const nlohmann::json& j, const char* key,
                                const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_array()) throw_error("{}: \"{}\" must be an array of integers", where, key);
  std::vector<int64_t> out;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0) {
      throw_error("{}: \"{}\" must hold non-negative integers", where, key);
    }
    out.push_back(x.get<int64_t>());
  }
  return out;
}

const nlohmann::json& array_field(const nlohmann::json& j, const char* key,
                                  const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_array()) throw_error("{}: \"{}\" must be an array", where, key);
  return v;
}

uint64_t json_xxh64(const nlohmann::json& j) {
  const std::string text = j.dump();
  return XXH64(text.data(), text.size(), 0);
}

}  // namespace

nlohmann::json Manifest::sealed(nlohmann::json j) {
  j.erase("manifest_xxh64");
  const uint64_t hash = json_xxh64(j);
  j["manifest_xxh64"] = hex64(hash);
  return j;
}

nlohmann::json Manifest::to_json() const {
  nlohmann::json tensors_json = nlohmann::json::array();
  for (const TensorRecord& t : tensors) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const ChunkRecord& c : t.chunks) {
      chunks.push_back({{"file", c.file},
                        {"key", c.key},
                        {"offset", c.offset},
                        {"offsets", c.box.offsets},
                        {"sizes", c.box.sizes}});
    }
    tensors_json.push_back(
        {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"chunks", chunks}});
  }
  nlohmann::json shards_json = nlohmann::json::array();
  for (const ShardRecord& s : shards) {
    shards_json.push_back({{"file", s.file},
                           {"bytes", s.bytes},
                           {"xxh64", s.xxh64 ? nlohmann::json(hex64(*s.xxh64)) : nullptr}});
  }
  return {{"format", kFormat},
          {"step", step},
          {"model", model},
          {"mesh", mesh},
          {"trainer_state", trainer_state},
          {"tokenizer", tokenizer},
          {"tensors", tensors_json},
          {"shards", shards_json}};
}

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw_error("{}: not a JSON object", where);
  const std::string format = string_field(j, "format", where);
  if (format != kFormat) {
    throw_error("{}: format \"{}\" is not {} (written by another version?)", where, format,
                kFormat);
  }
  Manifest m;
  m.step = int_field(j, "step", where);
  m.model = field(j, "model", where);
  m.mesh = field(j, "mesh", where);
  m.trainer_state = field(j, "trainer_state", where);
  m.tokenizer = string_field(j, "tokenizer", where);
  if (!m.trainer_state.is_object()) throw_error("{}: \"trainer_state\" must be an object", where);

  std::set<std::string> shard_files;
  for (const auto& s : array_field(j, "shards", where)) {
    ShardRecord shard;
    shard.file = string_field(s, "file", where + " shard");
    const std::string context = where + " shard " + shard.file;
    if (shard.file.empty() || shard.file.find('/') != std::string::npos || shard.file[0] == '.') {
      throw_error("{}: a shard file must be a plain name in the step directory", context);
    }
    shard.bytes = int_field(s, "bytes", context);
    if (!field(s, "xxh64", context).is_null()) {
      const std::string hash = string_field(s, "xxh64", context);
      size_t parsed = 0;
      try {
        shard.xxh64 = std::stoull(hash, &parsed, 16);
      } catch (const std::exception&) {
        parsed = 0;
      }
      if (hash.size() != 16 || parsed != hash.size()) {
        throw_error("{}: xxh64 \"{}\" is not 16 hex digits", context, hash);
      }
    }
    if (!shard_files.insert(shard.file).second) throw_error("{}: listed twice", context);
    m.shards.push_back(shard);
  }

  std::set<std::string> names;
  for (const auto& t : array_field(j, "tensors", where)) {
    TensorRecord tensor;
    tensor.name = string_field(t, "name", where + " tensor");
    const std::string context = where + " tensor " + tensor.name;
    if (!names.insert(tensor.name).second) throw_error("{}: listed twice", context);
    tensor.dtype = string_field(t, "dtype", context);
    if (tensor.dtype != "F32")
      throw_error("{}: dtype {} is not supported (F32)", context, tensor.dtype);
    tensor.shape = ints_field(t, "shape", context);
    if (tensor.shape.empty()) throw_error("{}: shape must have at least one dimension", context);
    int64_t numel = 1;
    for (const int64_t d : tensor.shape) {
      if (d > (int64_t{1} << 40) / std::max<int64_t>(numel, 1)) {
        throw_error("{}: shape is implausibly large", context);
      }
      numel *= d;
    }
    int64_t covered = 0;
    for (const auto& c : array_field(t, "chunks", context)) {
      ChunkRecord chunk;
      chunk.file = string_field(c, "file", context + " chunk");
      chunk.key = string_field(c, "key", context + " chunk");
      chunk.offset = int_field(c, "offset", context + " chunk " + chunk.key);
      if (chunk.offset < 0) throw_error("{}: chunk {} has a negative offset", context, chunk.key);
      const std::string label = fmt::format("{}+{}", chunk.key, chunk.offset);
      chunk.box.offsets = ints_field(c, "offsets", context + " chunk " + label);
      chunk.box.sizes = ints_field(c, "sizes", context + " chunk " + label);
      if (!shard_files.count(chunk.file)) {
        throw_error("{}: chunk {} is in {}, which is not a listed shard", context, label,
                    chunk.file);
      }
      if (!box_inside(chunk.box, tensor.shape)) {
        throw_error("{}: chunk {} lies outside the tensor's shape", context, label);
      }
      for (const ChunkRecord& other : tensor.chunks) {
        if (boxes_overlap(other.box, chunk.box)) {
          throw_error("{}: chunks {}+{} and {} overlap", context, other.key, other.offset, label);
        }
      }
      covered += chunk.box.numel();
      tensor.chunks.push_back(std::move(chunk));
    }
    // Disjoint boxes inside the tensor whose sizes add up to it cover it.
    if (covered != numel) {
      throw_error("{}: its chunks hold {} of its {} elements", context, covered, numel);
    }
    m.tensors.push_back(std::move(tensor));
  }
  return m;
}

Manifest Manifest::read(const fs::path& step_dir) {
  const fs::path path = step_dir / "manifest.json";
  std::ifstream in(path);
  if (!in) throw_error("{}: cannot open", path.string());
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw_error("{}: not valid JSON (truncated or corrupt)", path.string());
  }
  const std::string recorded = string_field(j, "manifest_xxh64", path.string());
  j.erase("manifest_xxh64");
  if (recorded != hex64(json_xxh64(j))) {
    throw_error("{}: fails its own xxHash64 check (corrupt)", path.string());
  }
  return from_json(j, path.string());
}

const TensorRecord* Manifest::find(const std::string& name) const {
  for (const TensorRecord& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

uint64_t file_xxh64(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error("{}: cannot open", path.string());
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    XXH64_update(state, buffer.data(), static_cast<size_t>(in.gcount()));
  }
  const uint64_t hash = XXH64_digest(state);
  XXH64_freeState(state);
  return hash;
}

}  // namespace brigade
