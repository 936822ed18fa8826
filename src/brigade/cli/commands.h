// The `brigade` verbs. Each verb lives in its own cmd_<verb>.cc and adds
// itself to the CLI11 app; main.cc only wires them together and turns errors
// into one line and an exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

namespace brigade::cli {

// Thrown by a verb that ends with a given exit status (a stopped training
// run: 128 + the signal) rather than calling std::exit: the stack unwinds,
// so communicators and writer threads are joined before static destructors
// run. main() returns the status.
struct ExitStatus {
  int code = 0;
};

void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_bench_command(CLI::App& app);
// Under `bench`: `bench comm` and its hidden worker (cmd_bench_comm.cc).
void add_bench_comm_command(CLI::App& bench);
// Under `bench`: `bench calibrate` (cmd_bench_calibrate.cc).
void add_bench_calibrate_command(CLI::App& bench);
// The measurements behind `bench calibrate`, as the JSON it writes (~40 s);
// with `comm`, those all-reduce figures are reused instead of measured.
nlohmann::json measure_this_machine(const nlohmann::json* comm = nullptr);
void add_tokenizer_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_diagnose_command(CLI::App& app);
void add_ettr_command(CLI::App& app);

}  // namespace brigade::cli
