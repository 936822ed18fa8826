// brigade sample --ckpt PATH --prompt TEXT --tokens N
// Autoregressive sampling with temperature and top-k. Each new token reruns
// the forward pass over the last block_size tokens (no KV cache: sampling is
// a demo here, training is the product).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "brigade/cli/commands.h"
#include "brigade/cli/inference_model.h"
#include "brigade/core/error.h"
#include "brigade/core/philox.h"
#include "brigade/core/threads.h"
#include "brigade/data/byte_tokenizer.h"
#include "brigade/data/tokenizer.h"

namespace brigade::cli {
namespace {

struct SampleArgs {
  std::string ckpt, prompt, tokenizer;
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 42;
  int threads = 0;
};

std::unique_ptr<Tokenizer> pick_tokenizer(const SampleArgs& args, const InferenceModel& m) {
  const std::string spec = !args.tokenizer.empty() ? args.tokenizer : m.tokenizer_spec;
  const int64_t vocab = m.model->config().vocab_size;
  if (spec.empty() || spec == "byte") {
    if (spec.empty() && vocab > 256) {
      throw_error(
          "{} does not record its tokenizer and its vocabulary ({}) is not bytes: pass "
          "--tokenizer DIR (a directory with vocab.json and merges.txt)",
          m.weights_path, vocab);
    }
    // A model with fewer than 256 tokens cannot take every byte; ByteTokenizer
    // then rejects the bytes it cannot encode.
    return std::make_unique<ByteTokenizer>(static_cast<uint32_t>(std::min<int64_t>(vocab, 256)));
  }
  auto tokenizer = load_tokenizer(spec);
  if (tokenizer->vocab_size() > static_cast<uint64_t>(vocab)) {
    throw_error(
        "tokenizer {} has {} tokens but the model only {}: pass the tokenizer the model "
        "was trained with (--tokenizer)",
        spec, tokenizer->vocab_size(), vocab);
  }
  return tokenizer;
}

void run_sample(const SampleArgs& args) {
  set_num_threads(args.threads);
  InferenceModel m = load_inference_model(args.ckpt);
  const GptConfig& cfg = m.model->config();
  const std::unique_ptr<Tokenizer> tokenizer = pick_tokenizer(args, m);
  const std::vector<uint32_t> prompt = tokenizer->encode(args.prompt);
  if (prompt.empty()) throw_error("--prompt is empty: give at least one character to start from");
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  const int64_t usable = std::min<int64_t>(cfg.vocab_size, tokenizer->vocab_size());
  std::vector<int32_t> order(static_cast<size_t>(usable));
  std::fputs(args.prompt.c_str(), stdout);
  for (int64_t i = 0; i < args.tokens; ++i) {
    const int64_t t = std::min<int64_t>(static_cast<int64_t>(context.size()), cfg.block_size);
    m.model->forward_last_logits(context.data() + context.size() - t, 1, t, logits.data());
    // A model's vocabulary may be padded past the tokenizer's (50304 for
    // GPT-2's 50257): ids the tokenizer cannot decode are never drawn.
    int32_t next;
    if (args.temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + usable) -
                                  logits.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = args.top_k > 0 ? std::min<int64_t>(args.top_k, usable) : usable;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      const float top = logits[order[0]];
      std::vector<double> weights(static_cast<size_t>(k));
      double total = 0;
      for (int64_t j = 0; j < k; ++j) {
        weights[j] = std::exp((logits[order[j]] - top) / args.temperature);
        total += weights[j];
      }
      const double u =
          static_cast<double>(Philox::u64(Philox::key(args.seed, RngPurpose::kSampling), 0,
                                          static_cast<uint64_t>(i)) >>
                              11) *
          0x1.0p-53 * total;
      double acc = 0;
      next = order[k - 1];
      for (int64_t j = 0; j < k; ++j) {
        acc += weights[j];
        if (u < acc) {
          next = order[j];
          break;
        }
      }
    }
    context.push_back(next);
    // Written token by token: a character split across tokens is completed
    // by the bytes of the next one, so the terminal still sees valid UTF-8.
    const uint32_t token = static_cast<uint32_t>(next);
    const std::string text = tokenizer->decode(std::span<const uint32_t>(&token, 1));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "Write text from a trained model");
  auto args = std::make_shared<SampleArgs>();
  cmd->add_option("--ckpt", args->ckpt, "Weights (.safetensors), checkpoint or run directory")
      ->required();
  cmd->add_option("--prompt", args->prompt, "Text to continue")->required();
  cmd->add_option("--tokens", args->tokens, "How many tokens to generate")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", args->temperature, "Softmax temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", args->top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", args->seed, "Random seed");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "\"byte\" or a directory with vocab.json + merges.txt (default: as recorded "
                  "in the checkpoint)");
  cmd->add_option("--threads", args->threads, "CPU threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([args] { run_sample(*args); });
}

}  // namespace brigade::cli
