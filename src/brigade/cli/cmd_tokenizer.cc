// brigade tokenizer train INPUT --vocab-size N --out DIR
// brigade tokenizer encode --tokenizer SPEC TEXT
#include <cstdio>
#include <memory>
#include <string>

#include "brigade/cli/commands.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/data/bpe_tokenizer.h"
#include "brigade/data/tokenizer.h"

namespace brigade::cli {
namespace {

struct TokenizerTrainArgs {
  std::string input_path;
  uint32_t vocab_size = 0;
  std::string out_dir;
};

void run_tokenizer_train(const TokenizerTrainArgs& options) {
  const std::string text = read_file(options.input_path);
  Stopwatch stopwatch;
  BpeTokenizer tokenizer = BpeTokenizer::train(text, options.vocab_size);
  const double train_s = stopwatch.elapsed_s();
  tokenizer.save(options.out_dir);
  const size_t num_tokens = tokenizer.encode(text).size();
  std::printf("trained a BPE tokenizer of %u tokens (256 bytes + %zu merges) in %.2f s\n",
              tokenizer.vocab_size(), tokenizer.num_merges(), train_s);
  if (tokenizer.vocab_size() < options.vocab_size) {
    std::printf("note: the text ran out of pairs to merge before %u tokens\n", options.vocab_size);
  }
  std::printf("compression on %s: %.3f bytes/token (%zu bytes -> %zu tokens)\n",
              options.input_path.c_str(),
              num_tokens == 0 ? 0.0 : static_cast<double>(text.size()) / num_tokens, text.size(),
              num_tokens);
  std::printf("wrote %s/vocab.json and %s/merges.txt\n", tokenizer.spec().c_str(),
              tokenizer.spec().c_str());
}

struct EncodeOptions {
  std::string tokenizer_spec;
  std::string text;
};

void run_tokenizer_encode(const EncodeOptions& options) {
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer_spec);
  const std::vector<uint32_t> tokens = tokenizer->encode(options.text);
  std::string line;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(tokens[i]);
  }
  std::printf("%s\n", line.c_str());
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  CLI::App* tokenizer = app.add_subcommand("tokenizer", "Train or try out a tokenizer");
  tokenizer->require_subcommand(1);

  auto train_options = std::make_shared<TokenizerTrainArgs>();
  CLI::App* train = tokenizer->add_subcommand(
      "train", "Learn a GPT-2-style byte-level BPE tokenizer from a text file");
  train->add_option("input", train_options->input_path, "Text file to learn merges from")
      ->required();
  train
      ->add_option("--vocab-size", train_options->vocab_size,
                   "Tokens in the vocabulary: 256 byte tokens plus the merges")
      ->required();
  train
      ->add_option("--out", train_options->out_dir,
                   "Directory to write vocab.json and merges.txt into")
      ->required();
  train->callback([train_options] { run_tokenizer_train(*train_options); });

  auto encode_options = std::make_shared<EncodeOptions>();
  CLI::App* encode = tokenizer->add_subcommand("encode", "Print the token ids of a text");
  encode
      ->add_option("--tokenizer", encode_options->tokenizer_spec,
                   "\"byte\" or a directory holding vocab.json and merges.txt")
      ->required();
  encode->add_option("text", encode_options->text, "The text to encode")->required();
  encode->callback([encode_options] { run_tokenizer_encode(*encode_options); });
}

}  // namespace brigade::cli
