// brigade eval --ckpt PATH --data PATH
// PATH for --data is a token shard (.bin) or a prepared dataset directory
// (its validation split). The loss is the mean over non-overlapping windows
// of block_size tokens, each predicting its next token.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "brigade/cli/commands.h"
#include "brigade/cli/inference_model.h"
#include "brigade/core/error.h"
#include "brigade/core/threads.h"
#include "brigade/data/dataset.h"
#include "brigade/data/token_shard.h"
#include "brigade/data/tokenizer.h"
#include "brigade/train/evaluate.h"

namespace brigade::cli {
namespace fs = std::filesystem;
namespace {

struct EvalArgs {
  std::string ckpt, data;
  int64_t batch = 8;
  int64_t max_windows = 0;
  int threads = 0;
};

void run_eval(const EvalArgs& args) {
  set_num_threads(args.threads);
  InferenceModel m = load_inference_model(args.ckpt);
  const GptConfig& cfg = m.model->config();
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<TokenShard> own_shard;
  const TokenShard* shard = nullptr;
  if (!fs::exists(args.data)) throw_error("--data {}: no such file or directory", args.data);
  if (fs::is_directory(args.data)) {
    dataset = std::make_unique<Dataset>(args.data);
    if (!m.tokenizer_spec.empty() &&
        !same_tokenizer_spec(m.tokenizer_spec, dataset->tokenizer_spec())) {
      throw_error(
          "{} was tokenized with {} but the model was trained with {}: the loss would "
          "mean nothing; prepare the data with the model's tokenizer",
          args.data, dataset->tokenizer_spec(), m.tokenizer_spec);
    }
    shard = &dataset->val_shard();
  } else {
    own_shard = std::make_unique<TokenShard>(args.data);
    shard = own_shard.get();
  }
  const EvalResult r = evaluate_windows(*m.model, *shard, args.batch, args.max_windows, args.data);
  const double loss = r.loss;
  const int64_t total = r.windows;
  std::printf("loss %.4f nats/token (perplexity %.2f) over %lld tokens in %lld windows of %lld\n",
              loss, std::exp(loss), static_cast<long long>(total * cfg.block_size),
              static_cast<long long>(total), static_cast<long long>(cfg.block_size));
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Print the loss of a checkpoint on a token file");
  auto args = std::make_shared<EvalArgs>();
  cmd->add_option("--ckpt", args->ckpt, "Weights (.safetensors), checkpoint or run directory")
      ->required();
  cmd->add_option("--data", args->data, "Token shard (.bin) or prepared dataset directory")
      ->required();
  cmd->add_option("--batch", args->batch, "Windows per forward pass")->check(CLI::PositiveNumber);
  cmd->add_option("--max-windows", args->max_windows, "Evaluate at most this many windows (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", args->threads, "CPU threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([args] { run_eval(*args); });
}

}  // namespace brigade::cli
