// brigade <verb> ...: see README.md for the list of verbs.
#include <cstdio>
#include <exception>

#include "brigade/cli/commands.h"
#include "brigade/core/error.h"
#include "brigade/core/signals.h"

int main(int argc, char** argv) {
  // Before any thread exists: no signal handler may run on a thread that computes.
  brigade::take_signals_on_a_quiet_thread();
  CLI::App app{"Brigade: train GPT-style language models across many workers"};
  app.require_subcommand(1);
  brigade::cli::add_train_command(app);
  brigade::cli::add_eval_command(app);
  brigade::cli::add_sample_command(app);
  brigade::cli::add_bench_command(app);
  brigade::cli::add_tokenizer_command(app);
  brigade::cli::add_data_command(app);
  brigade::cli::add_launch_command(app);
  brigade::cli::add_ckpt_command(app);
  brigade::cli::add_plan_command(app);
  brigade::cli::add_report_command(app);
  brigade::cli::add_diagnose_command(app);
  brigade::cli::add_ettr_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0: let CLI11 print them.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "brigade: error: %s (see brigade --help)\n", e.what());
    return 2;
  } catch (const brigade::cli::ExitStatus& e) {
    std::fflush(nullptr);
    return e.code;
  } catch (const brigade::Error& e) {
    std::fprintf(stderr, "brigade: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "brigade: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
