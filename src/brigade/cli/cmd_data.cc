// brigade data prepare INPUT --tokenizer byte|DIR --out DIR [--val-fraction F] [--overwrite]
#include <cstdio>
#include <memory>
#include <string>

#include "brigade/cli/commands.h"
#include "brigade/core/clock.h"
#include "brigade/data/dataset.h"
#include "brigade/data/tokenizer.h"

namespace brigade::cli {
namespace {

struct PrepareOptions {
  std::string input_path;
  std::string tokenizer_spec;
  std::string out_dir;
  double val_fraction = 0.1;
  bool overwrite = false;
};

void run_data_prepare(const PrepareOptions& options) {
  Stopwatch stopwatch;
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer_spec);
  const DatasetManifest manifest = prepare_dataset(options.input_path, *tokenizer, options.out_dir,
                                                   options.val_fraction, options.overwrite);
  std::printf("tokenizer %s, vocabulary %u\n", manifest.tokenizer_spec.c_str(),
              manifest.vocab_size);
  std::printf("train: %llu tokens in %zu shard(s)\n",
              static_cast<unsigned long long>(manifest.train_tokens()),
              manifest.train_shards.size());
  std::printf("val:   %llu tokens\n",
              static_cast<unsigned long long>(manifest.val_shard.num_tokens));
  std::printf("wrote %s/dataset.json in %.2f s\n", options.out_dir.c_str(), stopwatch.elapsed_s());
}

}  // namespace

void add_data_command(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Prepare token datasets");
  data->require_subcommand(1);

  auto options = std::make_shared<PrepareOptions>();
  CLI::App* prepare = data->add_subcommand(
      "prepare", "Tokenize a text file into train/val token shards and dataset.json");
  prepare->add_option("input", options->input_path, "Text file to tokenize")->required();
  prepare
      ->add_option("--tokenizer", options->tokenizer_spec,
                   "\"byte\" or a directory holding vocab.json and merges.txt")
      ->required();
  prepare->add_option("--out", options->out_dir, "Directory to write the dataset into")->required();
  prepare
      ->add_option("--val-fraction", options->val_fraction,
                   "Fraction of tokens, taken from the end, held out for validation")
      ->capture_default_str();
  prepare->add_flag("--overwrite", options->overwrite,
                    "Replace a dataset already prepared in --out");
  prepare->callback([options] { run_data_prepare(*options); });
}

}  // namespace brigade::cli
