// End-to-end tests of `brigade launch`: the real binary starts real worker
// processes (small shell scripts), on 127.0.0.1 only. Each test checks what a
// job relies on: the variables every worker sees, that one failed worker
// stops the whole job and is named, and that nothing is left running.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/free_port.h"
#include "testing/temp_dir.h"

namespace BRIGADE_TEST_FILE {
using brigade::testing::free_port;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* const kBrigade = BRIGADE_BINARY_DIR "/brigade";
constexpr auto kCommandTimeout = std::chrono::seconds(30);

struct RunResult {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
  double seconds = 0;
};

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// True while the process exists and is not a zombie waiting to be reaped.
bool is_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

// Variables changed for one launcher; nullopt unsets.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

class LaunchTest : public ::testing::Test {
 protected:
  // Starts `brigade args...` with its output captured under `name`.
  pid_t start(const std::string& name, const std::vector<std::string>& args,
              const EnvChanges& env = {}) {
    std::vector<std::string> argv_storage = {kBrigade};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The outer environment must not leak into the launcher's decisions.
    EnvChanges changes = {{"OMP_NUM_THREADS", std::nullopt},
                          {"BRIGADE_RDZV_TOKEN", std::nullopt},
                          {"MASTER_ADDR", std::nullopt},
                          {"MASTER_PORT", std::nullopt}};
    for (const char* name :
         {"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_STEPID",
          "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
          "SLURM_NTASKS_PER_NODE", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_CPUS_PER_TASK"}) {
      changes[name] = std::nullopt;
    }
    for (const auto& [key, value] : env) changes[key] = value;
    const fs::path out_path = dir_.path() / (name + ".out");
    const fs::path err_path = dir_.path() / (name + ".err");
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (const auto& [key, value] : changes) {
        if (value) {
          ::setenv(key.c_str(), value->c_str(), 1);
        } else {
          ::unsetenv(key.c_str());
        }
      }
      const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out_fd < 0 || err_fd < 0) ::_exit(126);
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(err_fd, STDERR_FILENO);
      ::execv(kBrigade, argv.data());
      ::_exit(127);
    }
    EXPECT_GT(pid, 0) << "fork failed";
    started_[pid] = {name, Clock::now()};
    return pid;
  }

  RunResult finish(pid_t pid) {
    RunResult result;
    if (pid <= 0) return result;
    int wstatus = 0;
    const auto deadline = Clock::now() + kCommandTimeout;
    while (::waitpid(pid, &wstatus, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &wstatus, 0);
        ADD_FAILURE() << "brigade launch ran past " << kCommandTimeout.count() << " s";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto [name, started] = started_.at(pid);
    result.seconds = std::chrono::duration<double>(Clock::now() - started).count();
    result.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    result.out = read_all(dir_.path() / (name + ".out"));
    result.err = read_all(dir_.path() / (name + ".err"));
    return result;
  }

  RunResult run(const std::vector<std::string>& args, const EnvChanges& env = {}) {
    return finish(start("launch", args, env));
  }

  // Waits until `path` exists (a worker wrote it).
  bool wait_for_file(const fs::path& path) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!fs::exists(path)) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  // Pids the workers wrote to files named `prefix`*.
  std::vector<pid_t> pids_in(const std::string& prefix) {
    std::vector<pid_t> pids;
    for (const auto& entry : fs::directory_iterator(dir_.path())) {
      if (entry.path().filename().string().starts_with(prefix)) {
        pids.push_back(static_cast<pid_t>(std::stol(read_all(entry.path()))));
      }
    }
    return pids;
  }

  void expect_all_gone(const std::vector<pid_t>& pids) {
    // An orphan is reaped by init a moment after it dies (a long moment on a
    // loaded machine).
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (pid_t pid : pids) {
      while (is_alive(pid) && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (is_alive(pid)) {
        ADD_FAILURE() << "process " << pid << " is still running";
        ::kill(pid, SIGKILL);
      }
    }
  }

  brigade::testing::TempDir dir_{"brigade_launch_test"};
  std::map<pid_t, std::pair<std::string, Clock::time_point>> started_;
};

TEST_F(LaunchTest, ThreeWorkersGetTorchrunVariables) {
  const RunResult r =
      run({"launch", "--nproc-per-node", "3", "--", "sh", "-c",
           "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
           "${#BRIGADE_STORE_TOKEN}\""});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::vector<std::string> lines = sorted_lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream fields(lines[rank]);
    std::string got_rank, world, local_rank, local_world, addr, token_chars;
    std::string got_port;
    fields >> got_rank >> world >> local_rank >> local_world >> addr >> got_port >> token_chars;
    EXPECT_EQ(got_rank, std::to_string(rank));
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local_rank, std::to_string(rank));
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_EQ(token_chars, "32");  // 128 bits in hex
    EXPECT_GT(std::stoi(got_port), 0);
    if (rank == 0) port = got_port;
    EXPECT_EQ(got_port, port) << "every worker must see the same store";
  }
}

TEST_F(LaunchTest, ThreadsAreSplitAmongWorkersUnlessTheUserChose) {
  const std::vector<std::string> args = {"launch", "--nproc-per-node",     "2", "--", "sh",
                                         "-c",     "echo $OMP_NUM_THREADS"};
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  const std::string split = std::to_string(std::max(1, CPU_COUNT(&cpus) / 2));
  RunResult r = run(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{split, split}));
  r = run(args, {{"OMP_NUM_THREADS", "7"}});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"7", "7"}));
}

// Brigade's own workers run with glibc's malloc cache off (PipelineMemory,
// WorkerGroup tests); any other program launched gets the environment as
// the user set it.
TEST_F(LaunchTest, AnotherProgramKeepsTheUsersMallocSettings) {
  const std::vector<std::string> args = {"launch", "--nproc-per-node",          "1", "--", "sh",
                                         "-c",     "echo \"[$GLIBC_TUNABLES]\""};
  RunResult r = run(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[]\n");
  r = run(args, {{"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"}});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[glibc.malloc.arena_max=2]\n");
}

TEST_F(LaunchTest, BrigadeVerbRunsWithThisBinary) {
  const RunResult r = run({"launch", "--nproc-per-node", "1", "--", "tokenizer", "--help"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("tokenizer"), std::string::npos) << r.out;
}

TEST_F(LaunchTest, FailingWorkerStopsTheOthersAndIsNamed) {
  // Ranks 0 and 1 start a child and wait; rank 2 fails once they are up.
  // The children show that a worker's whole process group is stopped.
  const std::string script = R"(
    if [ $RANK = 2 ]; then
      while [ ! -e $DIR/ready.0 ] || [ ! -e $DIR/ready.1 ]; do sleep 0.02; done
      exit 3
    fi
    sleep 30 & echo $! > $DIR/pid.child.$RANK
    echo $$ > $DIR/pid.worker.$RANK
    touch $DIR/ready.$RANK
    wait)";
  // A grace period far beyond the bound: workers that needed SIGKILL would
  // make the launcher miss it by a wide margin.
  const RunResult r =
      run({"launch", "--nproc-per-node", "3", "--grace-period-s", "60", "--", "sh", "-c", script},
          {{"DIR", dir_.path().string()}});
  EXPECT_EQ(r.status, 1);
  EXPECT_LT(r.seconds, 20.0) << "the others should stop at SIGTERM, without the grace period";
  EXPECT_EQ(r.err,
            "brigade launch: worker rank 2 (local 2, node 0) exited with status 3; stopped the "
            "other 2 workers\n");
  const std::vector<pid_t> pids = pids_in("pid.");
  EXPECT_EQ(pids.size(), 4u);
  expect_all_gone(pids);
}

// A worker that ignores SIGTERM is killed once --grace-period-s has passed,
// and not before. The period is longer than the default (5 s), so the launch
// taking at least that long shows the option is what counts.
TEST_F(LaunchTest, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  const std::string script = R"(
    if [ $RANK = 1 ]; then
      while [ ! -e $DIR/ready.0 ]; do sleep 0.02; done
      exit 3
    fi
    trap '' TERM
    echo $$ > $DIR/pid.worker.0
    touch $DIR/ready.0
    while :; do sleep 0.05; done)";
  const RunResult r =
      run({"launch", "--nproc-per-node", "2", "--grace-period-s", "6", "--", "sh", "-c", script},
          {{"DIR", dir_.path().string()}});
  EXPECT_EQ(r.status, 1);
  EXPECT_GE(r.seconds, 6.0) << "the worker was killed before its grace period ended";
  EXPECT_EQ(r.err,
            "brigade launch: worker rank 1 (local 1, node 0) exited with status 3; stopped the "
            "other 1 worker\n");
  expect_all_gone(pids_in("pid."));
}

TEST_F(LaunchTest, WorkerKilledBySignalIsNamed) {
  const RunResult r = run({"launch", "--nproc-per-node", "2", "--", "sh", "-c",
                           "if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 30"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("worker rank 1 (local 1, node 0) was killed by SIGKILL"), std::string::npos)
      << r.err;
}

TEST_F(LaunchTest, SigtermIsForwardedToTheWorkers) {
  const pid_t launcher =
      start("launch",
            {"launch", "--nproc-per-node", "2", "--", "sh", "-c",
             "echo $$ > $DIR/tmp.$RANK && mv $DIR/tmp.$RANK $DIR/pid.$RANK && exec sleep 30"},
            {{"DIR", dir_.path().string()}});
  ASSERT_TRUE(wait_for_file(dir_.path() / "pid.0"));
  ASSERT_TRUE(wait_for_file(dir_.path() / "pid.1"));
  ::kill(launcher, SIGTERM);
  const RunResult r = finish(launcher);
  EXPECT_EQ(r.status, 128 + SIGTERM);
  EXPECT_EQ(r.err, "brigade launch: received SIGTERM; stopped 2 workers\n");
  expect_all_gone(pids_in("pid."));
}

TEST_F(LaunchTest, UnderSrunEachTaskIsOneWorker) {
  const std::string print =
      "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
      "$MASTER_PORT $BRIGADE_STORE_TOKEN\"";
  // What a real `srun --nodes 3 --ntasks-per-node 4` task sees (an srun
  // inside an sbatch job of 16 tasks: the plain names describe the job, the
  // SLURM_STEP_* ones the step).
  EnvChanges slurm = {{"SLURM_JOB_ID", "7"},
                      {"SLURM_STEP_ID", "0"},
                      {"SLURM_PROCID", "9"},
                      {"SLURM_NTASKS", "16"},
                      {"SLURM_STEP_NUM_TASKS", "12"},
                      {"SLURM_LOCALID", "1"},
                      {"SLURM_NODEID", "2"},
                      {"SLURM_TASKS_PER_NODE", "8(x2)"},
                      {"SLURM_STEP_TASKS_PER_NODE", "4(x3)"}};
  RunResult r = run(
      {"launch", "--rdzv", "127.0.0.1:29555", "--rdzv-token", "secret", "--", "sh", "-c", print},
      slurm);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "9 12 1 4 2 127.0.0.1 29555 secret\n");
  // The task becomes the command with the signal mask the launcher started
  // with (this test's: nothing blocked), not its threads' (core/signals.h):
  // else scancel's SIGTERM would never reach it.
  // (grep itself: a shell would unblock everything as it starts.)
  r = run({"launch", "--rdzv", "127.0.0.1:29555", "--rdzv-token", "secret", "--", "grep", "SigBlk",
           "/proc/self/status"},
          slurm);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "SigBlk:\t0000000000000000\n");

  // An older srun without the step's names: the plain ones, and the token
  // from the environment.
  for (const char* name : {"SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE"}) {
    slurm[name] = std::nullopt;
  }
  slurm["SLURM_NTASKS"] = "12";
  slurm["SLURM_TASKS_PER_NODE"] = "4,4,4";
  slurm["BRIGADE_RDZV_TOKEN"] = "from-env";
  r = run({"launch", "--rdzv", "127.0.0.1:29555", "--", "sh", "-c", print}, slurm);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "9 12 1 4 2 127.0.0.1 29555 from-env\n");

  // Every task needs the same token, so none may invent one.
  slurm["BRIGADE_RDZV_TOKEN"] = std::nullopt;
  r = run({"launch", "--rdzv", "127.0.0.1:29555", "--", "sh", "-c", print}, slurm);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("BRIGADE_RDZV_TOKEN"), std::string::npos) << r.err;
}

// Layouts the hierarchical backend would get wrong are refused by every task,
// with the srun options that fix them.
TEST_F(LaunchTest, UnderSrunOnlyNodeByNodeNumberingWithEqualNodesIsAccepted) {
  const EnvChanges base = {{"SLURM_JOB_ID", "7"},
                           {"SLURM_STEP_ID", "0"},
                           {"SLURM_NTASKS", "4"},
                           {"SLURM_STEP_NUM_TASKS", "4"},
                           {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                           {"BRIGADE_RDZV_TOKEN", "t"}};
  const std::vector<std::string> args = {"launch", "--rdzv", "127.0.0.1:29555", "--", "true"};
  // --distribution=cyclic: node 0 holds tasks 0 and 2.
  EnvChanges cyclic = base;
  cyclic.insert({{"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"}});
  RunResult r = run(args, cyclic);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("srun task 2 of 4 is task 1 of 2 on node 0, which is not Brigade's "
                       "numbering"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--distribution=block"), std::string::npos) << r.err;
  // Three tasks on one node, one on the other: refused on the even node too.
  EnvChanges uneven = base;
  uneven["SLURM_STEP_TASKS_PER_NODE"] = "3,1";
  uneven.insert({{"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"}});
  r = run(args, uneven);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("srun put different numbers of tasks on the nodes "
                       "(SLURM_STEP_TASKS_PER_NODE=3,1): give srun --ntasks-per-node=N"),
            std::string::npos)
      << r.err;
  uneven["SLURM_STEP_TASKS_PER_NODE"] = "2(x";
  r = run(args, uneven);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("cannot read SLURM_STEP_TASKS_PER_NODE='2(x'"), std::string::npos) << r.err;
}

// Slurm's batch script has SLURM_PROCID=0 and the job's SLURM_NTASKS but is
// no srun task: taking it for task 0 would wait for three tasks that never
// start.
TEST_F(LaunchTest, SlurmBatchScriptItselfIsNotTakenForTaskZero) {
  const RunResult r =
      run({"launch", "--rdzv", "127.0.0.1:29555", "--", "true"}, {{"SLURM_JOB_ID", "7"},
                                                                  {"SLURM_PROCID", "0"},
                                                                  {"SLURM_NTASKS", "4"},
                                                                  {"SLURM_TASKS_PER_NODE", "4"},
                                                                  {"BRIGADE_RDZV_TOKEN", "t"}});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("this is Slurm's batch script (or salloc's shell), not a task srun "
                       "started: run `srun brigade launch -- ...`"),
            std::string::npos)
      << r.err;
}

TEST_F(LaunchTest, TwoNodesOnOneMachineShareOneJob) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  const std::vector<std::string> common = {"--nnodes", "2",  "--nproc-per-node", "2",
                                           "--rdzv",   rdzv, "--rdzv-token",     "shared-secret"};
  auto node_args = [&](int node_rank) {
    std::vector<std::string> args = {"launch", "--node-rank", std::to_string(node_rank)};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), {"--", "sh", "-c",
                             "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_ADDR "
                             "${#BRIGADE_STORE_TOKEN}\""});
    return args;
  };
  // Node 1 first, so its launcher usually has to wait for node 0's store
  // to come up. (That a client retries until the store is up is checked
  // deterministically by TcpStore.ClientStartedBeforeTheServerConnectsOnceItIsUp.)
  const pid_t node1 = start("node1", node_args(1));
  const pid_t node0 = start("node0", node_args(0));
  const RunResult r0 = finish(node0);
  const RunResult r1 = finish(node1);
  ASSERT_EQ(r0.status, 0) << r0.err;
  ASSERT_EQ(r1.status, 0) << r1.err;
  EXPECT_EQ(sorted_lines(r0.out),
            (std::vector<std::string>{"0 4 0 0 127.0.0.1 13", "1 4 1 0 127.0.0.1 13"}));
  EXPECT_EQ(sorted_lines(r1.out),
            (std::vector<std::string>{"2 4 0 1 127.0.0.1 13", "3 4 1 1 127.0.0.1 13"}));
}

TEST_F(LaunchTest, FailureOnOneNodeStopsTheOtherNode) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  // Rank 3 fails once node 0's workers are up, so node 0 has workers to stop.
  const std::string script = R"(
    if [ $RANK = 3 ]; then
      while [ ! -e $DIR/ready.0 ] || [ ! -e $DIR/ready.1 ]; do sleep 0.02; done
      exit 4
    fi
    touch $DIR/ready.$RANK
    exec sleep 30)";
  auto node_args = [&](int node_rank) {
    // A grace period far beyond the bound below, as in
    // FailingWorkerStopsTheOthersAndIsNamed.
    return std::vector<std::string>{"launch",
                                    "--nnodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(node_rank),
                                    "--nproc-per-node",
                                    "2",
                                    "--rdzv",
                                    rdzv,
                                    "--rdzv-token",
                                    "t",
                                    "--grace-period-s",
                                    "60",
                                    "--",
                                    "sh",
                                    "-c",
                                    script};
  };
  const EnvChanges env = {{"DIR", dir_.path().string()}};
  const pid_t node0 = start("node0", node_args(0), env);
  const pid_t node1 = start("node1", node_args(1), env);
  const RunResult r1 = finish(node1);
  const RunResult r0 = finish(node0);
  EXPECT_EQ(r1.status, 1);
  EXPECT_NE(r1.err.find("worker rank 3 (local 1, node 1) exited with status 4"), std::string::npos)
      << r1.err;
  EXPECT_EQ(r0.status, 1);
  EXPECT_EQ(r0.err,
            "brigade launch: stopped 2 workers on node 0: worker rank 3 (local 1, node 1) exited "
            "with status 4\n");
  EXPECT_LT(r0.seconds, 20.0)
      << "node 0's workers should stop at SIGTERM, without the grace period";
}

TEST_F(LaunchTest, MissingNodeIsAnErrorSayingHowManyArrived) {
  const RunResult r = run({"launch", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                           "--rdzv", "127.0.0.1:" + std::to_string(free_port()), "--rdzv-token",
                           "t", "--rdzv-timeout-s", "1", "--", "true"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("only 1 of 2 nodes joined"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("missing node ranks: 1"), std::string::npos) << r.err;
}

TEST_F(LaunchTest, OtherNodesNeedTheToken) {
  const RunResult r = run({"launch", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1",
                           "--rdzv", "127.0.0.1:29555", "--", "true"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("BRIGADE_RDZV_TOKEN"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--rdzv-token"), std::string::npos) << r.err;
}

// --iface reaches the workers as GLOO_SOCKET_IFNAME (what comm/world.cc
// reads); a name this node does not have is refused before any worker starts.
TEST_F(LaunchTest, IfaceIsPassedOnAndAnUnknownOneRefused) {
  RunResult r = run({"launch", "--nproc-per-node", "1", "--iface", "lo", "--", "sh", "-c",
                     "echo \"$GLOO_SOCKET_IFNAME\""},
                    {{"GLOO_SOCKET_IFNAME", std::nullopt}});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "lo\n");
  r = run({"launch", "--nproc-per-node", "1", "--iface", "nosuchif0", "--", "sh", "-c",
           "echo started"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "") << "no worker may start";
  EXPECT_NE(r.err.find("--iface nosuchif0: this node has no network interface of that name"),
            std::string::npos)
      << r.err;
}

TEST_F(LaunchTest, UnknownProgramIsOneErrorBeforeAnyWorkerStarts) {
  const RunResult r = run({"launch", "--nproc-per-node", "2", "--", "no-such-program-xyz"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "brigade: error: cannot find 'no-such-program-xyz' on PATH: give its path, or a "
            "brigade verb (train, eval, sample, bench, tokenizer, data)\n");
}

}  // namespace BRIGADE_TEST_FILE
