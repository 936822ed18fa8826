// End-to-end tests of the `brigade` binary: each test runs the real executable
// as a subprocess, the way a user does, and checks what a user relies on: the
// exit status, a one-line error that names the problem, the files a run
// leaves behind, and that a failed command leaves earlier results untouched.
//
// Every model here is tiny (1 layer, n_embd 32, block 16) so the whole binary
// stays within a few seconds per test on a shared 2-core machine.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "brigade/core/config.h"
#include "brigade/model/gpt_config.h"
#include "brigade/train/train_options.h"
#include "brigade/train/trainer.h"
#include "testing/run_records.h"

namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using brigade::testing::read_jsonl;

const char* const kBrigade = BRIGADE_BINARY_DIR "/brigade";

// A command should never take this long; a hung one fails its test instead of
// stalling the whole suite.
constexpr auto kCommandTimeout = std::chrono::seconds(120);

struct RunResult {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_all(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

// Plain ASCII prose, long enough for train and validation windows of 17 tokens
// and for a BPE tokenizer to find a few dozen merges.
std::string ascii_text() {
  std::string text;
  for (int i = 0; i < 60; ++i) {
    text += "The quick brown fox jumps over the lazy dog " + std::to_string(i) +
            " times; then the dog sleeps and the fox runs home.\n";
  }
  return text;
}

// Every regular file under a directory with its bytes and mtime, so a test can
// assert that a failed command changed, created and deleted nothing.
struct FileState {
  std::string bytes;
  fs::file_time_type mtime;
  bool operator==(const FileState&) const = default;
};
using TreeSnapshot = std::map<std::string, FileState>;

TreeSnapshot snapshot(const fs::path& dir) {
  TreeSnapshot files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(entry.path(), dir).string();
    if (entry.is_directory()) {
      files[rel + "/"] = {};  // an empty directory still counts as something created
    } else {
      files[rel] = {read_all(entry.path()), entry.last_write_time()};
    }
  }
  return files;
}

void expect_same_tree(const TreeSnapshot& before, const TreeSnapshot& after) {
  for (const auto& [path, state] : after) {
    auto it = before.find(path);
    if (it == before.end()) {
      ADD_FAILURE() << "created " << path;
    } else if (!(it->second == state)) {
      ADD_FAILURE() << "modified " << path;
    }
  }
  for (const auto& [path, state] : before) {
    if (after.count(path) == 0) ADD_FAILURE() << "deleted " << path;
  }
}

// The metrics lines of training steps (not the validation lines).
std::vector<nlohmann::json> step_lines(const fs::path& metrics_path) {
  std::vector<nlohmann::json> steps;
  for (const nlohmann::json& j : read_jsonl(metrics_path)) {
    if (j.contains("loss")) steps.push_back(j);
  }
  return steps;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("brigade_cli_test_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(root_);
    work_ = root_ / "work";
    fs::create_directories(work_);
    text_path_ = work_ / "text.txt";
    write_all(text_path_, ascii_text());
  }
  void TearDown() override { fs::remove_all(root_); }

  // Starts `brigade args...` in work_, with stdout and stderr captured
  // separately (into files beside work_, so they never show up in it).
  pid_t start(const std::vector<std::string>& args) {
    std::vector<std::string> argv_storage = {kBrigade};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    const fs::path out_path = root_ / "stdout.txt", err_path = root_ / "stderr.txt";
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out_fd < 0 || err_fd < 0 || ::chdir(work_.c_str()) != 0) ::_exit(126);
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(err_fd, STDERR_FILENO);
      ::execv(kBrigade, argv.data());
      ::_exit(127);
    }
    EXPECT_GT(pid, 0) << "fork failed";
    return pid;
  }

  // Waits for a process from start() and collects what it printed.
  RunResult finish(pid_t pid) {
    RunResult result;
    if (pid <= 0) return result;
    int wstatus = 0;
    const int exited = exit_fd(pid);
    if (!wait_readable({exited}, std::chrono::steady_clock::now() + kCommandTimeout)) {
      ::kill(pid, SIGKILL);
      ADD_FAILURE() << "brigade ran past " << kCommandTimeout.count() << " s and was killed";
    }
    ::close(exited);
    ::waitpid(pid, &wstatus, 0);
    result.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    result.out = read_all(root_ / "stdout.txt");
    result.err = read_all(root_ / "stderr.txt");
    return result;
  }

  RunResult run(const std::vector<std::string>& args) { return finish(start(args)); }

  // A descriptor that becomes readable when child `pid` exits (a pidfd).
  static int exit_fd(pid_t pid) {
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    EXPECT_GE(fd, 0) << "pidfd_open: " << std::strerror(errno);
    return fd;
  }

  // Waits until one of `fds` is readable (returns true) or `deadline` passes.
  static bool wait_readable(std::vector<int> fds, std::chrono::steady_clock::time_point deadline) {
    std::vector<pollfd> polled;
    for (const int fd : fds) polled.push_back({fd, POLLIN, 0});
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      const int ready = ::poll(polled.data(), polled.size(), static_cast<int>(left.count()));
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) return false;
    }
  }

  // Waits until what child `pid` (started by start()) printed on stderr
  // contains `needle`: woken by each write (inotify), not by polling.
  // False if the child exited first or the timeout passed.
  bool wait_for_stderr(pid_t pid, int watch, const std::string& needle) {
    const int exited = exit_fd(pid);
    const auto deadline = std::chrono::steady_clock::now() + kCommandTimeout;
    bool found = false;
    while (!(found = read_all(root_ / "stderr.txt").find(needle) != std::string::npos)) {
      if (!wait_readable({watch, exited}, deadline)) break;
      pollfd gone{exited, POLLIN, 0};
      if (::poll(&gone, 1, 0) > 0) {
        found = read_all(root_ / "stderr.txt").find(needle) != std::string::npos;
        break;
      }
      char events[4096];
      if (::read(watch, events, sizeof(events)) < 0 && errno != EAGAIN) break;
    }
    ::close(exited);
    return found;
  }

  // A tiny byte-level model on text_path_, preparing its data in work_/data
  // and writing its run to work_/run. `extra` is appended TOML.
  fs::path write_config(const std::string& name, const std::string& extra = "") {
    const fs::path path = work_ / name;
    write_all(path,
              "[model]\n"
              "n_layer = 1\n"
              "n_head = 2\n"
              "n_embd = 32\n"
              "block_size = 16\n"
              "vocab_size = 256\n"
              "[data]\n"
              "source = \"" +
                  text_path_.string() +
                  "\"\n"
                  "tokenizer = \"byte\"\n"
                  "dir = \"" +
                  data_dir().string() +
                  "\"\n"
                  "[train]\n"
                  "micro_batch = 2\n"
                  "steps = 3\n"
                  "threads = 1\n"
                  "seed = 5\n"
                  "eval_windows = 4\n"
                  "run_dir = \"" +
                  run_dir().string() +
                  "\"\n"
                  "[optim]\n"
                  "lr = 1e-3\n" +
                  extra);
    return path;
  }

  // Replaces the one occurrence of `from` in a config file with `to`.
  static void edit(const fs::path& config, const std::string& from, const std::string& to) {
    std::string text = read_all(config);
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    write_all(config, text);
  }

  // Trains the config and asserts it succeeded.
  void train_ok(const fs::path& config, const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> args = {"train", config.string()};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    const RunResult r = run(args);
    ASSERT_EQ(r.status, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  }

  fs::path data_dir() const { return work_ / "data"; }
  fs::path run_dir() const { return work_ / "run"; }

  fs::path root_, work_, text_path_;
};

// A failed command exits 1 with exactly one line on stderr, "brigade: error:
// ...", that contains every one of `needles`, and prints nothing on stdout.
void expect_one_line_error(const RunResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.status, 1) << "stderr:\n" << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(r.err.starts_with("brigade: error: ")) << r.err;
  EXPECT_TRUE(r.err.ends_with("\n")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const std::string& needle : needles) {
    EXPECT_NE(r.err.find(needle), std::string::npos) << "'" << needle << "' not in: " << r.err;
  }
}

// ---------------------------------------------------------------- bad input

TEST_F(CliTest, UnknownConfigKeyIsNamedAndNothingIsWritten) {
  const fs::path config = write_config("typo.toml");
  edit(config, "steps = 3\n", "steps = 3\nstpes = 10\n");
  const TreeSnapshot before = snapshot(work_);

  expect_one_line_error(run({"train", config.string()}), {"train.stpes", config.string()});
  expect_same_tree(before, snapshot(work_));

  // The same typo through --set on a clean config.
  const fs::path clean = write_config("clean.toml");
  const TreeSnapshot before_set = snapshot(work_);
  expect_one_line_error(run({"train", clean.string(), "--set", "optim.l_r=0.1"}), {"optim.l_r"});
  expect_same_tree(before_set, snapshot(work_));
}

TEST_F(CliTest, WrongTypeNamesKeyAndValue) {
  const fs::path config = write_config("typed.toml");
  edit(config, "steps = 3", "steps = \"ten\"");
  const TreeSnapshot before = snapshot(work_);
  expect_one_line_error(run({"train", config.string()}), {"train.steps", "integer", "\"ten\""});
  expect_same_tree(before, snapshot(work_));
}

TEST_F(CliTest, MissingConfigFileIsNamed) {
  const fs::path missing = work_ / "no_such_config.toml";
  const TreeSnapshot before = snapshot(work_);
  expect_one_line_error(run({"train", missing.string()}), {missing.string()});
  expect_same_tree(before, snapshot(work_));
}

TEST_F(CliTest, MissingDataSourceIsNamed) {
  const fs::path config = write_config("nosrc.toml");
  const fs::path missing = work_ / "no_such_text.txt";
  const TreeSnapshot before = snapshot(work_);
  expect_one_line_error(
      run({"train", config.string(), "--set", "data.source=\"" + missing.string() + "\""}),
      {"data.source", missing.string()});
  expect_same_tree(before, snapshot(work_));  // no data dir, no run dir
}

TEST_F(CliTest, EvalRejectsCorruptShards) {
  ASSERT_NO_FATAL_FAILURE(train_ok(write_config("train.toml")));
  const std::string val = read_all(data_dir() / "val.bin");
  ASSERT_GT(val.size(), 64u);

  // Bad magic: the right size, the wrong first bytes.
  std::string bad_magic = val;
  bad_magic.replace(0, 8, "NOTASHRD");
  write_all(work_ / "bad_magic.bin", bad_magic);
  // Truncated: the header promises more tokens than the file holds.
  write_all(work_ / "truncated.bin", val.substr(0, val.size() - 10));
  // Truncated inside the header itself.
  write_all(work_ / "stub.bin", val.substr(0, 20));

  const TreeSnapshot before = snapshot(work_);
  for (const auto& [file, why] :
       std::vector<std::pair<std::string, std::string>>{{"bad_magic.bin", "bad magic"},
                                                        {"truncated.bin", "truncated"},
                                                        {"stub.bin", "truncated"}}) {
    SCOPED_TRACE(file);
    const fs::path path = work_ / file;
    expect_one_line_error(
        run({"eval", "--ckpt", run_dir().string(), "--data", path.string(), "--threads", "1"}),
        {path.string(), why});
  }
  const fs::path missing = work_ / "missing.bin";
  expect_one_line_error(run({"eval", "--ckpt", run_dir().string(), "--data", missing.string()}),
                        {missing.string()});
  expect_same_tree(before, snapshot(work_));
}

TEST_F(CliTest, ResumeWithOtherShapeIsRefusedAndCheckpointKept) {
  const fs::path config = write_config("train.toml");
  ASSERT_NO_FATAL_FAILURE(train_ok(config));
  const TreeSnapshot before = snapshot(work_);
  ASSERT_EQ(before.count("run/checkpoints/step_00000003/manifest.json"), 1u);

  expect_one_line_error(run({"train", config.string(), "--resume", run_dir().string(), "--set",
                             "model.n_embd=64", "--set", "train.steps=5"}),
                        {"model.n_embd", "32", "64"});
  expect_same_tree(before, snapshot(work_));
}

TEST_F(CliTest, FreshTrainIntoUsedRunDirIsRefused) {
  const fs::path config = write_config("train.toml");
  ASSERT_NO_FATAL_FAILURE(train_ok(config));
  const TreeSnapshot before = snapshot(work_);

  expect_one_line_error(run({"train", config.string()}), {run_dir().string(), "--resume"});
  expect_same_tree(before, snapshot(work_));
}

TEST_F(CliTest, SampleRejectsBytesOutsideVocabulary) {
  // A 128-token byte model, so "é" (0xc3 0xa9) cannot be encoded. It trains
  // on synthetic tokens: a prepared byte dataset always declares 256 tokens,
  // so `brigade train` refuses vocab_size 128 on it even for ASCII-only text.
  const fs::path config = write_config("train.toml");
  ASSERT_NO_FATAL_FAILURE(
      train_ok(config, {"--set", "model.vocab_size=128", "--set", "data.synthetic=true"}));
  const TreeSnapshot before = snapshot(work_);
  expect_one_line_error(run({"sample", "--ckpt", run_dir().string(), "--prompt", "caf\xc3\xa9",
                             "--tokens", "5", "--threads", "1"}),
                        {"0xc3", "offset 3"});
  expect_same_tree(before, snapshot(work_));
}

// Disabled: fails today. A dataset whose validation split is shorter than
// block_size + 1 tokens trains every step, then the final evaluation throws
// before the final checkpoint is saved, so all the steps are lost. Either
// refusing before the first step or saving before evaluating passes.
TEST_F(CliTest, TooShortValidationSplitIsRefusedBeforeTraining) {
  const RunResult prepared = run({"data", "prepare", text_path_.string(), "--tokenizer", "byte",
                                  "--out", "ds", "--val-fraction", "0"});
  ASSERT_EQ(prepared.status, 0) << prepared.err;
  const RunResult r = run({"train", write_config("train.toml").string(), "--set",
                           "data.dir=\"" + (work_ / "ds").string() + "\""});
  // Refused before the first step, not after the last.
  expect_one_line_error(r, {"validation", "block_size"});
  EXPECT_FALSE(fs::exists(run_dir() / "metrics.jsonl"));
}

TEST_F(CliTest, DataPrepareRefusesToOverwriteADataset) {
  const RunResult first =
      run({"data", "prepare", text_path_.string(), "--tokenizer", "byte", "--out", "ds"});
  ASSERT_EQ(first.status, 0) << first.err;
  const TreeSnapshot before = snapshot(work_);
  expect_one_line_error(
      run({"data", "prepare", text_path_.string(), "--tokenizer", "byte", "--out", "ds"}),
      {"ds", "--overwrite"});
  expect_same_tree(before, snapshot(work_));
}

// ---------------------------------------------------------------- happy paths

// write_config's model on ascii_text(), 3 steps: the losses and gradient
// norms of its steps, and the validation loss `brigade eval` prints after
// (to 4 decimals). Recorded from this build, whose model matches PyTorch
// (reference.torch); float summation order may differ in the last bits on
// another CPU, far inside the tolerances.
constexpr double kRecordedLosses[] = {5.5464415550231934, 5.5351519584655762, 5.5023446083068848};
constexpr double kRecordedGradNorms[] = {2.3815893943350246, 2.6062263838263418,
                                         2.3461954197560302};
constexpr double kRecordedValLoss = 5.4684;

TEST_F(CliTest, TrainWritesMetricsConfigAndCheckpoint) {
  const fs::path config = write_config("train.toml");
  const RunResult r = run({"train", config.string()});
  ASSERT_EQ(r.status, 0) << r.err;

  const std::vector<nlohmann::json> steps = step_lines(run_dir() / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 3u);
  // The reference: the same config trained in this process reports the same
  // numbers, bit for bit (one thread, the same batches).
  brigade::Config reference_config = brigade::Config::from_file(config);
  const brigade::GptConfig model = brigade::GptConfig::from_config(reference_config);
  brigade::TrainOptions options = brigade::TrainOptions::from_config(reference_config);
  options.run_dir = (root_ / "reference_run").string();
  brigade::Trainer reference(model, options);
  for (size_t i = 0; i < steps.size(); ++i) {
    const nlohmann::json& m = steps[i];
    EXPECT_EQ(m.at("step").get<int64_t>(), static_cast<int64_t>(i) + 1);
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "step_ms"}) {
      ASSERT_TRUE(m.contains(key) && m.at(key).is_number()) << key << " in " << m.dump();
      EXPECT_TRUE(std::isfinite(m.at(key).get<double>())) << key;
    }
    const brigade::StepMetrics expected = reference.train_step();
    EXPECT_EQ(m.at("loss").get<double>(), expected.loss) << "step " << i + 1;
    EXPECT_EQ(m.at("grad_norm").get<double>(), expected.grad_norm) << "step " << i + 1;
    EXPECT_EQ(m.at("lr").get<double>(), expected.lr) << "step " << i + 1;
    // And the model itself: the losses and gradient norms this model gives
    // (which the reference.torch test checks against PyTorch, gradient by
    // gradient) when this test was written. A broken forward or backward
    // moves them far more than 1e-5; a change of initialisation, sampler or
    // data preparation moves them too, and then they are recorded anew.
    EXPECT_NEAR(m.at("loss").get<double>(), kRecordedLosses[i], 1e-5 * kRecordedLosses[i])
        << "step " << i + 1;
    EXPECT_NEAR(m.at("grad_norm").get<double>(), kRecordedGradNorms[i],
                1e-5 * kRecordedGradNorms[i])
        << "step " << i + 1;
    EXPECT_GT(m.at("tokens_per_s").get<double>(), 0.0);
    EXPECT_GT(m.at("step_ms").get<double>(), 0.0);
    EXPECT_GT(m.at("lr").get<double>(), 0.0);
    // Against the machine's peak (kernels/cpu/fma_peak.h), never above it.
    EXPECT_GT(m.at("mfu").get<double>(), 0.0);
    EXPECT_LE(m.at("mfu").get<double>(), 1.0);
  }
  // The start-up summary says which peak MFU is against ("MFU is against FMA
  // peak: 1 thread x ... x 2.90 GHz = 186 GFLOP/s", the figure after the
  // first " = "), and it is that one.
  const size_t against = r.err.find("MFU is against ");
  ASSERT_NE(against, std::string::npos) << r.err;
  const std::string peak_line = r.err.substr(against, r.err.find('\n', against) - against);
  ASSERT_NE(peak_line.find(" GHz"), std::string::npos) << peak_line;
  const size_t equals = peak_line.find(" = ");
  ASSERT_NE(equals, std::string::npos) << peak_line;
  const double peak_gflops = std::stod(peak_line.substr(equals + 3));
  for (const nlohmann::json& m : steps) {
    const double achieved_gflops =
        model.train_flops_per_token(model.block_size) * m.at("tokens_per_s").get<double>() * 1e-9;
    EXPECT_NEAR(m.at("mfu").get<double>(), achieved_gflops / peak_gflops,
                0.01 * m.at("mfu").get<double>())
        << peak_line;
  }
  // The effective config is recorded, and it is a config `brigade train` reads back.
  const std::string recorded = read_all(run_dir() / "config.toml");
  EXPECT_NE(recorded.find("n_embd = 32"), std::string::npos) << recorded;
  const fs::path ckpt = run_dir() / "checkpoints" / "step_00000003";
  EXPECT_GT(fs::file_size(ckpt / "manifest.json"), 0u);
  EXPECT_GT(fs::file_size(ckpt / "shard_00000.safetensors"), 0u);
  EXPECT_TRUE(fs::exists(data_dir() / "dataset.json"));  // prepared on first use

  const RunResult rerun =
      run({"train", (run_dir() / "config.toml").string(), "--set",
           "train.run_dir=\"" + (work_ / "run2").string() + "\"", "--set", "train.steps=1"});
  EXPECT_EQ(rerun.status, 0) << rerun.err;
}

TEST_F(CliTest, EvalPrintsLossOnDatasetAndShard) {
  ASSERT_NO_FATAL_FAILURE(train_ok(write_config("train.toml")));
  double losses[2] = {};
  int i = 0;
  for (const fs::path& data : {data_dir(), data_dir() / "val.bin"}) {
    SCOPED_TRACE(data.string());
    const RunResult r =
        run({"eval", "--ckpt", run_dir().string(), "--data", data.string(), "--threads", "1"});
    ASSERT_EQ(r.status, 0) << r.err;
    // One line: "loss 2.3456 nats/token (perplexity ...) over ...".
    ASSERT_TRUE(r.out.starts_with("loss ") && r.out.ends_with("\n")) << r.out;
    ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    ASSERT_NE(r.out.find(" nats/token "), std::string::npos) << r.out;
    losses[i] = std::stod(r.out.substr(5));
    // The trained model, against its recorded loss: one unit of the 4th
    // decimal for rounding on another CPU.
    EXPECT_NEAR(losses[i], kRecordedValLoss, 1.01e-4);
    ++i;
  }
  // The dataset directory means its validation split.
  EXPECT_EQ(losses[0], losses[1]);
}

TEST_F(CliTest, SampleContinuesThePromptDeterministically) {
  ASSERT_NO_FATAL_FAILURE(train_ok(write_config("train.toml")));
  const std::vector<std::string> args = {"sample",   "--ckpt", run_dir().string(), "--prompt", "ab",
                                         "--tokens", "10",     "--threads",        "1"};
  const RunResult r = run(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("ab")) << r.out;
  EXPECT_EQ(r.out.size(), 2u + 10u + 1u) << r.out;  // prompt, 10 byte tokens, newline
  EXPECT_TRUE(r.out.ends_with("\n"));
  // The default seed is fixed, so the same command writes the same text.
  EXPECT_EQ(run(args).out, r.out);
}

TEST_F(CliTest, ResumeContinuesFromTheSavedStep) {
  const fs::path config = write_config("train.toml");
  ASSERT_NO_FATAL_FAILURE(train_ok(config));
  const RunResult r =
      run({"train", config.string(), "--resume", run_dir().string(), "--set", "train.steps=5"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("resumed at step 3"), std::string::npos) << r.err;

  const std::vector<nlohmann::json> steps = step_lines(run_dir() / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 5u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i].at("step"), i + 1);
  EXPECT_TRUE(fs::exists(run_dir() / "checkpoints" / "step_00000005" / "manifest.json"));
}

TEST_F(CliTest, ResumeFromMidRunCheckpointRepeatsTheSameSteps) {
  // One run of 5 steps that checkpoints at step 3, and a second run resumed
  // from that checkpoint: steps 4 and 5 see the same weights, optimizer state,
  // learning rate and batches, so they report the same losses.
  const fs::path config = write_config("train.toml");
  edit(config, "steps = 3\n", "steps = 5\ncheckpoint_every = 3\n");
  ASSERT_NO_FATAL_FAILURE(train_ok(config));
  const fs::path mid = run_dir() / "checkpoints" / "step_00000003";
  ASSERT_TRUE(fs::exists(mid / "manifest.json"));

  const fs::path run_b = work_ / "run_b";
  ASSERT_NO_FATAL_FAILURE(train_ok(
      config, {"--resume", mid.string(), "--set", "train.run_dir=\"" + run_b.string() + "\""}));
  const std::vector<nlohmann::json> a = step_lines(run_dir() / "metrics.jsonl");
  const std::vector<nlohmann::json> b = step_lines(run_b / "metrics.jsonl");
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i].at("step"), a[3 + i].at("step"));
    EXPECT_EQ(b[i].at("loss").get<double>(), a[3 + i].at("loss").get<double>()) << "step " << 4 + i;
    EXPECT_EQ(b[i].at("lr").get<double>(), a[3 + i].at("lr").get<double>());
  }
}

TEST_F(CliTest, InterruptSavesACheckpointThatResumes) {
  const fs::path config = write_config("train.toml");
  // Interrupt once training is under way: the first progress line, which
  // follows the first metrics line, has reached stderr. The watch is set on
  // the file before the child can write it (start() truncates, not replaces).
  write_all(root_ / "stderr.txt", "");
  const int watch = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  ASSERT_GE(watch, 0);
  ASSERT_GE(::inotify_add_watch(watch, (root_ / "stderr.txt").c_str(), IN_MODIFY), 0);
  const pid_t pid = start({"train", config.string(), "--set", "train.steps=1000000"});
  const fs::path metrics = run_dir() / "metrics.jsonl";
  EXPECT_TRUE(wait_for_stderr(pid, watch, "| loss ")) << read_all(root_ / "stderr.txt");
  ::close(watch);
  ::kill(pid, SIGINT);
  const RunResult r = finish(pid);
  EXPECT_EQ(r.status, 130) << r.err;
  EXPECT_NE(r.err.find("interrupted at step"), std::string::npos) << r.err;

  // The checkpoint holds exactly the steps that metrics.jsonl reports.
  const size_t done = step_lines(metrics).size();
  ASSERT_GT(done, 0u);
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08zu", done);
  ASSERT_TRUE(fs::exists(run_dir() / "checkpoints" / name / "manifest.json")) << name;

  ASSERT_NO_FATAL_FAILURE(train_ok(config, {"--resume", run_dir().string(), "--set",
                                            "train.steps=" + std::to_string(done + 1)}));
  const std::vector<nlohmann::json> steps = step_lines(metrics);
  ASSERT_EQ(steps.size(), done + 1);
  EXPECT_EQ(steps.back().at("step"), done + 1);
}

TEST_F(CliTest, BenchTrainPrintsOneJsonLineAndWritesNothing) {
  const fs::path config = write_config("bench.toml");
  const TreeSnapshot before = snapshot(work_);
  const RunResult r = run({"bench", "train", config.string(), "--json", "--steps", "2", "--warmup",
                           "1", "--threads", "1"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GT(j.at("tokens_per_s").get<double>(), 0.0);
  EXPECT_GT(j.at("step_ms").get<double>(), 0.0);
  EXPECT_EQ(j.at("seq_len"), 16);
  EXPECT_EQ(j.at("micro_batch"), 2);
  // Benchmarks run on synthetic tokens: no dataset prepared, no run written.
  expect_same_tree(before, snapshot(work_));
}

TEST_F(CliTest, BpeTokenizerAndPreparedDataFeedTraining) {
  const fs::path tok = work_ / "tok", ds = work_ / "bpe_data";
  RunResult r = run(
      {"tokenizer", "train", text_path_.string(), "--vocab-size", "300", "--out", tok.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(fs::exists(tok / "vocab.json") && fs::exists(tok / "merges.txt"));

  // The trained tokenizer compresses its own text: fewer ids than bytes, all in range.
  r = run({"tokenizer", "encode", "--tokenizer", tok.string(), "the quick brown fox"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream ids(r.out);
  int id = 0, count = 0;
  while (ids >> id) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 300);
    ++count;
  }
  EXPECT_GT(count, 0);
  EXPECT_LT(count, 19);

  r = run(
      {"data", "prepare", text_path_.string(), "--tokenizer", tok.string(), "--out", ds.string()});
  ASSERT_EQ(r.status, 0) << r.err;

  // data.source unset: the run must use the prepared directory as is.
  const fs::path config = write_config("bpe.toml");
  edit(config, "source = \"" + text_path_.string() + "\"\n", "");
  const std::vector<std::string> data_args = {"--set", "data.dir=\"" + ds.string() + "\"", "--set",
                                              "data.tokenizer=\"" + tok.string() + "\""};

  // A model too small for the tokenizer's vocabulary is refused, naming the key.
  std::vector<std::string> args = {"train", config.string(), "--set", "model.vocab_size=256"};
  args.insert(args.end(), data_args.begin(), data_args.end());
  const TreeSnapshot before = snapshot(work_);
  expect_one_line_error(run(args), {"model.vocab_size", "300"});
  expect_same_tree(before, snapshot(work_));

  args = {"train", config.string(), "--set", "model.vocab_size=300"};
  args.insert(args.end(), data_args.begin(), data_args.end());
  r = run(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(step_lines(run_dir() / "metrics.jsonl").size(), 3u);
  EXPECT_FALSE(fs::exists(data_dir())) << "trained on its own data instead of the prepared set";

  // The checkpoint records its tokenizer, so sampling needs no --tokenizer.
  r = run({"sample", "--ckpt", run_dir().string(), "--prompt", "the", "--tokens", "5", "--threads",
           "1"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("the")) << r.out;
}

}  // namespace BRIGADE_TEST_FILE
