// brigade ckpt inspect PATH            what a checkpoint holds, and whether it verifies
// brigade ckpt hash PATH               one hash of the global tensors, the same whatever
//                                      layout (dp, ZeRO stage) saved them
// brigade ckpt export --to hf OUT PATH one Hugging Face GPT-2 safetensors file + config.json
//
// PATH is a step directory or a run directory (its newest checkpoint that verifies).
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/ckpt/model_weights.h"
#include "brigade/cli/commands.h"
#include "brigade/core/aligned_buffer.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"

namespace brigade::cli {
namespace fs = std::filesystem;
namespace {

constexpr StateKind kKinds[] = {StateKind::kParams, StateKind::kExpAvg, StateKind::kExpAvgSq};

ResolvedCheckpoint resolve(const std::string& path) {
  if (!fs::exists(path)) throw_error("{}: no such file or directory", path);
  return resolve_checkpoint(path);
}

// A step directory given directly is inspected as it is, even when it does
// not verify (that is what inspect reports); a run directory resolves to its
// newest good checkpoint.
int run_inspect(const std::string& path) {
  if (!fs::exists(path)) throw_error("{}: no such file or directory", path);
  const fs::path dir =
      fs::exists(fs::path(path) / "manifest.json") ? fs::path(path) : resolve(path).dir;
  const Manifest manifest = Manifest::read(dir);
  std::printf("checkpoint %s\n", dir.string().c_str());
  std::printf("  step %lld, saved under %s, tokenizer %s\n", static_cast<long long>(manifest.step),
              manifest.mesh.dump().c_str(),
              manifest.tokenizer.empty() ? "(none)" : manifest.tokenizer.c_str());
  std::printf("  model %s\n", manifest.model.dump().c_str());
  int64_t elements = 0;
  size_t chunks = 0;
  for (const TensorRecord& t : manifest.tensors) {
    chunks += t.chunks.size();
    int64_t n = 1;
    for (const int64_t d : t.shape) n *= d;
    elements += n;
  }
  std::printf("  %zu tensors, %lld elements, in %zu chunks\n", manifest.tensors.size(),
              static_cast<long long>(elements), chunks);
  bool valid = true;
  for (const ShardRecord& shard : manifest.shards) {
    std::string state = "ok";
    std::error_code ec;
    const auto bytes = fs::file_size(dir / shard.file, ec);
    if (ec) {
      state = "MISSING";
    } else if (static_cast<int64_t>(bytes) != shard.bytes) {
      state = fmt::format("WRONG SIZE ({} bytes)", bytes);
    } else if (!shard.xxh64) {
      state = "NO CHECKSUM (an in-memory snapshot's: only its agent resumes from it)";
    } else if (file_xxh64(dir / shard.file) != *shard.xxh64) {
      state = "CHECKSUM MISMATCH";
    }
    valid = valid && state == "ok";
    const std::string hash = shard.xxh64 ? fmt::format("{:016x}", *shard.xxh64) : "none";
    std::printf("  shard %s  %lld bytes  xxh64 %s  %s\n", shard.file.c_str(),
                static_cast<long long>(shard.bytes), hash.c_str(), state.c_str());
  }
  std::printf("%s\n", valid ? "valid" : "INVALID: do not resume from it");
  return valid ? 0 : 1;
}

// Every global tensor, in name order: its name, shape and float32 bytes.
void run_hash(const std::string& path) {
  const auto [dir, manifest] = resolve(path);
  const GptConfig config = GptConfig::from_json(manifest.model);
  const ParamLayout layout(config);
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<std::pair<std::string, const ParamInfo*>> names;
  for (const StateKind kind : kKinds) {
    for (const ParamInfo& p : layout.params())
      names.push_back({state_tensor_name(kind, p.name), &p});
  }
  std::sort(names.begin(), names.end());
  FloatBuffer buffers[3] = {FloatBuffer(layout.size()), FloatBuffer(layout.size()),
                            FloatBuffer(layout.size())};
  for (int k = 0; k < 3; ++k) {
    load_checkpoint_state(dir, manifest, config, kKinds[k], buffers[k].data());
  }
  for (const auto& [name, param] : names) {
    const int k = name.starts_with("model/") ? 0 : name.starts_with("optim/exp_avg_sq/") ? 2 : 1;
    XXH64_update(state, name.data(), name.size() + 1);
    XXH64_update(state, param->shape.data(), param->shape.size() * sizeof(int64_t));
    XXH64_update(state, buffers[k].data() + param->offset,
                 static_cast<size_t>(param->numel) * sizeof(float));
  }
  std::printf("%016llx\n", static_cast<unsigned long long>(XXH64_digest(state)));
  XXH64_freeState(state);
}

void run_export(const std::string& to, const std::string& out, const std::string& path) {
  if (to != "hf") throw_error("--to {}: the only export format is hf", to);
  const auto [dir, manifest] = resolve(path);
  const GptConfig config = GptConfig::from_json(manifest.model);
  FloatBuffer params(ParamLayout(config).size());
  load_checkpoint_state(dir, manifest, config, StateKind::kParams, params.data());
  fs::create_directories(out);
  std::map<std::string, std::string> extra;
  if (!manifest.tokenizer.empty()) extra["tokenizer"] = manifest.tokenizer;
  save_model_weights(fs::path(out) / "model.safetensors", config, params.data(), extra);
  // What transformers' GPT2Config reads, so the directory loads there too.
  const nlohmann::json hf = {{"model_type", "gpt2"},
                             {"architectures", {"GPT2LMHeadModel"}},
                             {"n_layer", config.n_layer},
                             {"n_head", config.n_head},
                             {"n_embd", config.n_embd},
                             {"n_positions", config.block_size},
                             {"n_ctx", config.block_size},
                             {"vocab_size", config.vocab_size},
                             {"activation_function", "gelu_new"},
                             {"layer_norm_epsilon", 1e-5},
                             {"tie_word_embeddings", true}};
  write_file_atomic(fs::path(out) / "config.json", hf.dump(2) + "\n");
  std::printf("wrote %s/model.safetensors and config.json (step %lld)\n", out.c_str(),
              static_cast<long long>(manifest.step));
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect, hash and export training checkpoints");
  ckpt->require_subcommand(1);

  auto path = std::make_shared<std::string>();
  CLI::App* inspect =
      ckpt->add_subcommand("inspect", "Tensors, shards, mesh and step; verifies every shard");
  inspect->add_option("path", *path, "Step directory or run directory")->required();
  inspect->callback([path] {
    const int status = run_inspect(*path);
    if (status != 0) {
      throw ExitStatus{status};
    }
  });

  CLI::App* hash = ckpt->add_subcommand(
      "hash", "One xxHash64 over every global tensor, independent of the saving layout");
  hash->add_option("path", *path, "Step directory or run directory")->required();
  hash->callback([path] { run_hash(*path); });

  auto to = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  CLI::App* exp = ckpt->add_subcommand(
      "export", "Write the parameters as one Hugging Face GPT-2 safetensors file + config.json");
  exp->add_option("--to", *to, "Format: hf")->required();
  exp->add_option("out", *out, "Output directory")->required();
  exp->add_option("path", *path, "Step directory or run directory")->required();
  exp->callback([to, out, path] { run_export(*to, *out, *path); });
}

}  // namespace brigade::cli
