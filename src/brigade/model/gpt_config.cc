#include "brigade/model/gpt_config.h"

#include <nlohmann/json.hpp>

#include "brigade/core/config.h"
#include "brigade/core/error.h"
#include "brigade/model/param_layout.h"

namespace brigade {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kFull:
      return "full";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kNone:
      break;
  }
  return "none";
}

GptConfig GptConfig::from_config(Config& config) {
  GptConfig c;
  c.n_layer = config.get_int("model.n_layer", c.n_layer);
  c.n_head = config.get_int("model.n_head", c.n_head);
  c.n_embd = config.get_int("model.n_embd", c.n_embd);
  c.block_size = config.get_int("model.block_size", c.block_size);
  c.vocab_size = config.get_int("model.vocab_size", c.vocab_size);
  const std::string recompute = config.get_string("model.recompute", "none");
  if (recompute == "none") {
    c.recompute = Recompute::kNone;
  } else if (recompute == "full") {
    c.recompute = Recompute::kFull;
  } else if (recompute == "selective") {
    c.recompute = Recompute::kSelective;
  } else {
    throw_error("model.recompute must be \"none\", \"selective\" or \"full\", got \"{}\"",
                recompute);
  }
  c.validate();
  return c;
}

void GptConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw_error("model.{} must be positive, got {}", name, v);
  };
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  positive("block_size", block_size);
  positive("vocab_size", vocab_size);
  if (n_embd % n_head != 0) {
    throw_error("model.n_embd ({}) must be divisible by model.n_head ({})", n_embd, n_head);
  }
  if (vocab_size > (int64_t{1} << 31) - 1)
    throw_error("model.vocab_size {} is too large", vocab_size);
}

void GptConfig::validate_tensor_parallel(int tp) const {
  if (tp < 1) throw_error("parallel.tp must be at least 1, got {}", tp);
  if (tp == 1) return;
  // Whole heads per rank; n_embd = n_head * head_dim and the MLP's 4 * n_embd
  // then divide too, but name each so the user sees which one failed.
  const auto need = [&](const char* what, int64_t value) {
    if (value % tp != 0) {
      throw_error(
          "parallel.tp = {} does not divide {} = {}: each tensor-parallel rank needs an "
          "equal whole share of it; choose a tp that divides model.n_head ({}) and "
          "model.n_embd ({})",
          tp, what, value, n_head, n_embd);
    }
  };
  need("model.n_head", n_head);
  need("model.n_embd", n_embd);
  need("4 * model.n_embd", 4 * n_embd);
}

void GptConfig::validate_sequence_parallel(int tp) const {
  if (tp > 1 && block_size % tp != 0) {
    throw_error(
        "parallel.sequence_parallel splits each sequence over parallel.tp = {} ranks, but "
        "model.block_size = {} is not a multiple of {}: choose a block_size that tp divides "
        "(e.g. {}) or set parallel.sequence_parallel = false",
        tp, block_size, tp, (block_size + tp - 1) / tp * tp);
  }
}

nlohmann::json GptConfig::to_json() const {
  return {{"n_layer", n_layer},
          {"n_head", n_head},
          {"n_embd", n_embd},
          {"block_size", block_size},
          {"vocab_size", vocab_size}};
}

GptConfig GptConfig::from_json(const nlohmann::json& j) {
  GptConfig c;
  try {
    c.n_layer = j.at("n_layer").get<int64_t>();
    c.n_head = j.at("n_head").get<int64_t>();
    c.n_embd = j.at("n_embd").get<int64_t>();
    c.block_size = j.at("block_size").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw_error("model config {} is incomplete: {}", j.dump(), e.what());
  }
  c.validate();
  return c;
}

double GptConfig::train_flops_per_token(int64_t seq_len) const {
  const double matmul_params = static_cast<double>(n_layer) * 12.0 * n_embd * n_embd +
                               static_cast<double>(n_embd) * vocab_size;
  return 6.0 * matmul_params + 12.0 * n_layer * n_embd * static_cast<double>(seq_len);
}

int64_t GptConfig::num_params() const {
  return ParamLayout(*this).num_params();
}

}  // namespace brigade
