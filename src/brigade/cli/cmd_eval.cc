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
#include "brigade/data/sampler.h"
#include "brigade/data/token_shard.h"

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
    shard = &dataset->val_shard();
  } else {
    own_shard = std::make_unique<TokenShard>(args.data);
    shard = own_shard.get();
  }
  if (shard->vocab_size() > static_cast<uint64_t>(cfg.vocab_size)) {
    throw_error(
        "{} was tokenized with a vocabulary of {} but the model has {}: evaluate on data "
        "prepared with the model's tokenizer",
        args.data, shard->vocab_size(), cfg.vocab_size);
  }
  const EvalWindows windows(*shard, static_cast<int>(cfg.block_size));
  int64_t total = static_cast<int64_t>(windows.num_windows());
  if (args.max_windows > 0) total = std::min(total, args.max_windows);
  if (total == 0) {
    throw_error("{} holds {} tokens, fewer than block_size+1 = {}: nothing to evaluate", args.data,
                shard->size(), cfg.block_size + 1);
  }
  std::vector<int32_t> in(static_cast<size_t>(args.batch * cfg.block_size)), tg(in.size());
  double sum = 0.0;
  for (int64_t w = 0; w < total; w += args.batch) {
    const int64_t count = std::min(args.batch, total - w);
    windows.fill(w, count, in.data(), tg.data());
    // forward_loss rejects ids outside the model's vocabulary with a clear error.
    sum += m.model->forward_loss(in.data(), tg.data(), count, cfg.block_size) *
           static_cast<double>(count);
  }
  const double loss = sum / static_cast<double>(total);
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
  cmd->add_option("--max-windows", args->max_windows, "Evaluate at most this many windows");
  cmd->add_option("--threads", args->threads, "CPU threads (0: all cores)");
  cmd->callback([args] { run_eval(*args); });
}

}  // namespace brigade::cli
