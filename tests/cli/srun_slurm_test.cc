// Brigade under a real Slurm: munged, slurmctld and slurmd for one node
// (this machine), started by the test from a generated slurm.conf with every
// file in a temporary directory, and stopped by pid afterwards. Needs root
// and Debian's slurm-wlm and munge (scripts/install_deps.sh --test); skipped
// otherwise.
//
// What they check: `srun --ntasks=4 brigade launch -- train` computes what
// `brigade train --nproc 4` does, step for step; examples/slurm/train.sbatch
// runs as written, in both of its modes; and a worker killed under srun with
// one agent per node is restarted from the newest checkpoint.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/free_port.h"
#include "testing/run_brigade.h"
#include "testing/run_records.h"
#include "testing/temp_dir.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string find_program(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/"}) {
    if (::access((dir + name).c_str(), X_OK) == 0) return dir + name;
  }
  return "";
}

std::string short_hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string host = name;
  return host.substr(0, host.find('.'));
}

// Starts argv in directory `cwd` with `env` added, stdout and stderr into
// `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            const fs::path& log, const fs::path& cwd) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    for (const auto& [key, value] : env) ::setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

struct Result {
  int status = -1;  // exit code, or 128 + signal
  std::string output;
};

// Waits for `pid` to exit; past `limit` kills it, and fails the test.
Result finish(pid_t pid, const fs::path& log, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wait_status, 0);
      ADD_FAILURE() << "pid " << pid << " did not finish within " << limit.count()
                    << " s; its output:\n"
                    << read_all(log);
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  return {WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status),
          read_all(log)};
}

// Processes whose command line contains `needle` or whose working directory
// is inside it (other than this one).
std::vector<std::string> processes_matching(const std::string& needle) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (pid == std::to_string(::getpid())) continue;
    std::string cmdline = read_all(entry.path() / "cmdline");
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    std::error_code ignored;
    const std::string cwd = fs::read_symlink(entry.path() / "cwd", ignored).string();
    if (cmdline.find(needle) != std::string::npos || cwd == needle ||
        cwd.rfind(needle + "/", 0) == 0) {
      found.push_back(pid + ": " + cmdline + " (in " + cwd + ")");
    }
  }
  return found;
}

std::string missing_prerequisite() {
  if (::geteuid() != 0) return "needs root (slurmd starts jobs as their users)";
  for (const char* program : {"munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo"}) {
    if (find_program(program).empty()) {
      return std::string(program) + " is not installed (scripts/install_deps.sh --test)";
    }
  }
  return "";
}

#define SKIP_WITHOUT_SLURM()                                          \
  if (const std::string why = missing_prerequisite(); !why.empty()) { \
    GTEST_SKIP() << "Slurm tests skipped: " << why;                   \
  }

// A one-node Slurm cluster of this machine. Its node is named after the host,
// so `scontrol show hostnames` gives a name that resolves, as on a real
// cluster. The constructor returns once the node is idle (or has failed the
// test); the destructor stops every daemon by pid, waits for them, and checks
// nothing of the cluster is left running.
class LocalSlurm {
 public:
  LocalSlurm() : dir_("brigade_slurm") {
    // munged wants its socket's directory searchable by everyone.
    fs::permissions(dir_.path(),
                    fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    for (const char* sub : {"state", "spool", "log"}) fs::create_directories(dir_.path() / sub);
    const fs::path key = dir_.path() / "munge.key";
    {
      std::ofstream out(key, std::ios::binary);
      std::random_device random;
      for (int i = 0; i < 1024; ++i) out.put(static_cast<char>(random()));
    }
    fs::permissions(key, fs::perms::owner_read);
    write_config();

    const fs::path socket = dir_.path() / "munge.socket";
    pids_["munged"] =
        spawn({find_program("munged"), "--foreground", "--socket=" + socket.string(),
               "--key-file=" + key.string(), "--pid-file=" + (dir_.path() / "munged.pid").string(),
               "--log-file=" + (dir_.path() / "log/munged.log").string(),
               "--seed-file=" + (dir_.path() / "munged.seed").string()},
              {}, dir_.path() / "log/munged.out", dir_.path());
    if (!wait_until([&] { return fs::exists(socket); }, 60s)) {
      ADD_FAILURE() << "munged did not create its socket:\n"
                    << read_all(dir_.path() / "log/munged.out");
      return;
    }
    pids_["slurmctld"] = spawn({find_program("slurmctld"), "-D", "-f", conf().string()}, {},
                               dir_.path() / "log/slurmctld.out", dir_.path());
    pids_["slurmd"] = spawn({find_program("slurmd"), "-D", "-f", conf().string(), "-N", node_}, {},
                            dir_.path() / "log/slurmd.out", dir_.path());
    up_ = wait_until(
        [&] {
          const std::string state = command_output("sinfo -h -n " + node_ + " -o %t");
          return state.rfind("idle", 0) == 0;
        },
        120s);
    if (!up_) ADD_FAILURE() << "the Slurm node did not become idle within 120 s:\n" << logs();
  }

  ~LocalSlurm() {
    if (up_) {
      // No job may outlive the cluster: its slurmstepd would stay behind.
      std::system(("SLURM_CONF=" + conf().string() + " scancel --full --user=root").c_str());
      if (!wait_until([&] { return command_output("squeue -h -o %i").empty(); }, 60s)) {
        ADD_FAILURE() << "jobs still queued: " << command_output("squeue -h");
      }
    }
    for (const char* daemon : {"slurmd", "slurmctld", "munged"}) {
      const auto it = pids_.find(daemon);
      if (it == pids_.end()) continue;
      ::kill(it->second, SIGTERM);
      int status = 0;
      const auto deadline = Clock::now() + 60s;
      while (::waitpid(it->second, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          ADD_FAILURE() << daemon << " ignored SIGTERM for 60 s; killed";
          ::kill(it->second, SIGKILL);
          ::waitpid(it->second, &status, 0);
          break;
        }
        std::this_thread::sleep_for(10ms);
      }
    }
    // Every daemon's command line names a file in the directory, and every
    // job (so its slurmstepd and tasks) runs in it: the clients are started
    // there. A slurmstepd may take a moment to exit after its job is gone.
    const auto left = [&] { return processes_matching(dir_.path().string()); };
    EXPECT_TRUE(wait_until([&] { return left().empty(); }, 30s))
        << "left running: " << ::testing::PrintToString(left());
  }
  LocalSlurm(const LocalSlurm&) = delete;
  LocalSlurm& operator=(const LocalSlurm&) = delete;

  bool up() const { return up_; }
  const std::string& node() const { return node_; }
  fs::path conf() const { return dir_.path() / "slurm.conf"; }
  const fs::path& dir() const { return dir_.path(); }
  std::string logs() const {
    std::string all;
    for (const auto& entry : fs::directory_iterator(dir_.path() / "log")) {
      all += "== " + entry.path().filename().string() + "\n" + read_all(entry.path());
    }
    return all;
  }

  // Runs a Slurm client (srun, sbatch) against this cluster, to the end.
  Result run(const std::vector<std::string>& argv, std::map<std::string, std::string> env,
             const std::string& name, std::chrono::seconds limit = 180s) {
    env["SLURM_CONF"] = conf().string();
    const fs::path log = dir_.path() / (name + ".log");
    return finish(spawn(argv, env, log, dir_.path()), log, limit);
  }

 private:
  template <typename Predicate>
  static bool wait_until(Predicate done, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(50ms);
    }
    return true;
  }

  std::string command_output(const std::string& command) const {
    std::string out;
    FILE* pipe = ::popen(("SLURM_CONF=" + conf().string() + " " + command + " 2>&1").c_str(), "r");
    if (pipe == nullptr) return out;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
    ::pclose(pipe);
    return out;
  }

  // cons_tres with oversubscription, so four single-CPU tasks fit whatever
  // this machine's core count; linuxproc and task/none need no cgroups.
  void write_config() {
    const fs::path d = dir_.path();
    std::ofstream(d / "plugstack.conf") << "";
    std::ofstream(conf()) << "ClusterName=brigadetest\n"
                          << "SlurmctldHost=" << node_ << "(127.0.0.1)\n"
                          << "SlurmctldPort=" << testing::free_port() << "\n"
                          << "SlurmdPort=" << testing::free_port() << "\n"
                          << "SlurmUser=root\nSlurmdUser=root\n"
                          << "AuthType=auth/munge\nCredType=cred/munge\n"
                          << "AuthInfo=socket=" << (d / "munge.socket").string() << "\n"
                          << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                          << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
                          << "JobAcctGatherType=jobacct_gather/none\n"
                          << "AccountingStorageType=accounting_storage/none\n"
                          << "MpiDefault=none\nSlurmdParameters=config_overrides\n"
                          << "ReturnToService=2\n"
                          << "StateSaveLocation=" << (d / "state").string() << "\n"
                          << "SlurmdSpoolDir=" << (d / "spool").string() << "\n"
                          << "SlurmctldPidFile=" << (d / "slurmctld.pid").string() << "\n"
                          << "SlurmdPidFile=" << (d / "slurmd.pid").string() << "\n"
                          << "SlurmctldLogFile=" << (d / "log/slurmctld.log").string() << "\n"
                          << "SlurmdLogFile=" << (d / "log/slurmd.log").string() << "\n"
                          << "PlugStackConfig=" << (d / "plugstack.conf").string() << "\n"
                          << "NodeName=" << node_
                          << " NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN\n"
                          << "PartitionName=debug Nodes=" << node_
                          << " Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
  }

  testing::TempDir dir_;  // first member: removed after the daemons are stopped
  std::string node_ = short_hostname();
  std::map<std::string, pid_t> pids_;
  bool up_ = false;
};

constexpr char kTraining[] = R"(
[train]
micro_batch = 2
steps = 8
checkpoint_every = 2
[data]
synthetic = true
[parallel]
dp = 4
bucket_mb = 0.01
)";

// The loss of every step, the last record of each (a restarted run repeats
// the steps after its checkpoint).
std::map<int, double> losses(const fs::path& run_dir) {
  std::map<int, double> by_step;
  std::ifstream metrics(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("loss")) by_step[row.at("step").get<int>()] = row.at("loss").get<double>();
  }
  return by_step;
}

struct Reference {
  std::map<int, double> losses;
  std::string hash;
};

// `brigade train --nproc 4` of the same config: what every Slurm run must give.
Reference train_nproc_4(const fs::path& config, const fs::path& run_dir) {
  const auto r = testing::run_brigade({"train", "--nproc", "4", config.string(), "--set",
                                       "train.run_dir=\"" + run_dir.string() + "\""},
                                      120s);
  EXPECT_EQ(r.status, 0) << r.err;
  const auto hash = testing::run_brigade({"ckpt", "hash", run_dir.string()});
  EXPECT_EQ(hash.status, 0) << hash.err;
  return {losses(run_dir), hash.out};
}

void expect_same_run(const fs::path& run_dir, const Reference& reference, const std::string& what) {
  const std::map<int, double> got = losses(run_dir);
  ASSERT_EQ(got.size(), 8u) << what << ": " << read_all(run_dir / "metrics.jsonl");
  for (const auto& [step, loss] : reference.losses) {
    ASSERT_TRUE(got.count(step)) << what << " has no step " << step;
    EXPECT_EQ(got.at(step), loss) << what << ", step " << step;
  }
  const auto hash = testing::run_brigade({"ckpt", "hash", run_dir.string()});
  ASSERT_EQ(hash.status, 0) << hash.err;
  EXPECT_EQ(hash.out, reference.hash) << what << " ended with other parameters";
}

fs::path write_config(const fs::path& dir) {
  const fs::path config = dir / "config.toml";
  std::ofstream(config) << testing::kTinyModelToml << kTraining;
  return config;
}

std::string run_dir_flag(const fs::path& run_dir) {
  return "train.run_dir=\"" + run_dir.string() + "\"";
}

// Scope 1 of issue 17: one srun task per worker, each `brigade launch`
// mapping Slurm's variables, rank 0 hosting the store on the job's first
// node.
TEST(Slurm, SrunTasksTrainLikeTrainNproc) {
  SKIP_WITHOUT_SLURM();
  LocalSlurm slurm;
  ASSERT_TRUE(slurm.up());
  const fs::path config = write_config(slurm.dir());
  const Reference reference = train_nproc_4(config, slurm.dir() / "reference");
  ASSERT_EQ(reference.losses.size(), 8u);

  const fs::path run_dir = slurm.dir() / "srun";
  const Result r =
      slurm.run({find_program("srun"), "--ntasks=4", "--kill-on-bad-exit=1", testing::kBrigade,
                 "launch", "--", "train", config.string(), "--set", run_dir_flag(run_dir)},
                {{"MASTER_ADDR", slurm.node()},
                 {"MASTER_PORT", std::to_string(testing::free_port())},
                 {"BRIGADE_RDZV_TOKEN", "slurm-test-token"}},
                "srun");
  ASSERT_EQ(r.status, 0) << r.output << slurm.logs();
  EXPECT_NE(r.output.find("dp 4"), std::string::npos) << r.output;
  expect_same_run(run_dir, reference, "srun --ntasks=4");
}

const std::string kSbatchScript = BRIGADE_SOURCE_DIR "/examples/slurm/train.sbatch";

// sbatch --wait of the example script with `env` added; its output in
// dir/NAME.out.
Result sbatch(LocalSlurm& slurm, const std::string& name, std::map<std::string, std::string> env,
              const std::vector<std::string>& train_args) {
  env["BRIGADE"] = testing::kBrigade;
  // The script's default port (20000 + job id) could be taken on a CI machine.
  env["MASTER_PORT"] = std::to_string(testing::free_port());
  const fs::path output = slurm.dir() / (name + ".out");
  std::vector<std::string> argv = {
      find_program("sbatch"),        "--wait",     "--nodes=1", "--ntasks-per-node=4",
      "--output=" + output.string(), kSbatchScript};
  argv.insert(argv.end(), train_args.begin(), train_args.end());
  Result r = slurm.run(argv, env, name);
  r.output += "\n== job output\n" + read_all(output);
  return r;
}

// The example batch script as a user submits it, one task per worker.
TEST(Slurm, ExampleBatchScriptTrainsLikeTrainNproc) {
  SKIP_WITHOUT_SLURM();
  LocalSlurm slurm;
  ASSERT_TRUE(slurm.up());
  const fs::path config = write_config(slurm.dir());
  const Reference reference = train_nproc_4(config, slurm.dir() / "reference");
  const fs::path run_dir = slurm.dir() / "tasks";
  const Result r = sbatch(slurm, "tasks", {}, {config.string(), "--set", run_dir_flag(run_dir)});
  ASSERT_EQ(r.status, 0) << r.output << slurm.logs();
  EXPECT_NE(
      r.output.find("brigade on 1 node(s) x 4 worker(s) (tasks), rendezvous " + slurm.node() + ":"),
      std::string::npos)
      << r.output;
  expect_same_run(run_dir, reference, "sbatch (tasks)");
}

// One agent per node under srun: the worker killed at step 5 is restarted
// with the others from step 4's checkpoint, and the run ends as one without
// the fault does.
TEST(Slurm, KilledWorkerUnderSrunIsRecoveredByTheNodeAgent) {
  SKIP_WITHOUT_SLURM();
  LocalSlurm slurm;
  ASSERT_TRUE(slurm.up());
  const fs::path config = write_config(slurm.dir());
  const Reference reference = train_nproc_4(config, slurm.dir() / "reference");
  const fs::path run_dir = slurm.dir() / "agents";
  const Result r =
      sbatch(slurm, "agents", {{"BRIGADE_SLURM_MODE", "agents"}, {"BRIGADE_MAX_RESTARTS", "1"}},
             {config.string(), "--set", run_dir_flag(run_dir), "--inject", "kill:rank=1:step=5"});
  ASSERT_EQ(r.status, 0) << r.output << slurm.logs();
  EXPECT_NE(r.output.find("1 incident, 1 restart"), std::string::npos) << r.output;
  const auto failures = testing::read_failures(run_dir / "incidents.jsonl");
  ASSERT_FALSE(failures.empty()) << "no incident in incidents.jsonl";
  EXPECT_EQ(failures.front().at("rank"), 1) << failures.front();
  expect_same_run(run_dir, reference, "sbatch (agents) with a killed worker");
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
