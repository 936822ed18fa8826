// A real etcd (Debian's etcd-server) on loopback for one test: free ports,
// its data in a fresh directory, authentication on (root's password below),
// ready once its /health says so, and stopped by its pid with the test.
// Tests that need it skip, saying so, when etcd is not installed.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/child_process.h"
#include "testing/free_port.h"
#include "testing/http_get.h"
#include "testing/temp_dir.h"

namespace brigade::testing {

inline bool etcd_installed() {
  return !find_program("etcd").empty() && !find_program("etcdctl").empty();
}
inline const char* etcd_skip_reason() {
  return "etcd is not installed (apt-get install etcd-server etcd-client, or "
         "scripts/install_deps.sh --test)";
}

class EtcdServer {
 public:
  static constexpr char kRootPassword[] = "etcd-test-root";

  // Fails the test (ADD_FAILURE) and leaves ok() false when etcd does not
  // come up; with `auth`, authentication is enabled before it returns.
  // `host`: an address it also listens on besides loopback (namespace
  // nodes reach it at their bridge's), which clients are given (url()).
  explicit EtcdServer(bool auth = true, std::string host = "127.0.0.1")
      : dir_("brigade_etcd"), host_(std::move(host)) {
    // Its data in memory: etcd syncs every write, which a loaded disk can
    // hold up past the coordinator's one-second call timeout.
    // Its WAL alone preallocates 64 MiB: on disk where /dev/shm is small.
    static int count = 0;
    sweep_dead_runs();
    std::error_code no_shm;
    const bool shm = std::filesystem::space("/dev/shm", no_shm).available > (256u << 20) && !no_shm;
    data_ = std::filesystem::path(shm ? "/dev/shm" : dir_.path()) /
            ("brigade_etcd_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
    client_port_ = free_port();
    const uint16_t peer_port = free_port();
    const std::string loopback = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string client = url();
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{find_program("etcd"), "--name", "t", "--data-dir", data_.string(),
                                 "--listen-client-urls",
                                 client == loopback ? client : loopback + "," + client,
                                 "--advertise-client-urls", client, "--listen-peer-urls", peer,
                                 "--initial-advertise-peer-urls", peer, "--initial-cluster",
                                 "t=" + peer, "--logger", "zap", "--log-level",
                                 // The least hashing of passwords: each
                                 // authentication costs little CPU.
                                 "error", "--bcrypt-cost", "4"},
        dir_.path() / "etcd.out", dir_.path() / "etcd.log");
    // Ready when /health says so (a leader is elected); 60 s for a loaded machine.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && !process_->wait_for({})) {
      const auto r = http_get(client_port_, "/health");
      if (r && r->status == 200 && r->body.find("\"true\"") != std::string::npos) {
        ok_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!ok_) {
      ADD_FAILURE() << "etcd did not become healthy:\n" << log();
      return;
    }
    if (auth) {
      ok_ = etcdctl({"user", "add", std::string("root:") + kRootPassword}, false) &&
            etcdctl({"user", "grant-role", "root", "root"}, false) &&
            etcdctl({"auth", "enable"}, false);
    }
  }
  ~EtcdServer() {
    process_->stop(SIGTERM, std::chrono::seconds(10));
    std::error_code ignored;
    std::filesystem::remove_all(data_, ignored);
  }

  bool ok() const { return ok_; }
  uint16_t port() const { return client_port_; }
  std::string url() const { return "http://" + host_ + ":" + std::to_string(client_port_); }
  pid_t pid() const { return process_->pid(); }

  // Runs etcdctl against this etcd (as root once authentication is on);
  // false, with a test failure naming its output, if it fails.
  bool etcdctl(std::vector<std::string> args, bool as_root = true) {
    std::string text;
    if (run_etcdctl(args, as_root, text) == 0) return true;
    ADD_FAILURE() << "etcdctl " << args[0] << " failed: " << text;
    return false;
  }
  // The same, for a test that expects either outcome: etcdctl's exit
  // status, its output in `text`.
  int run_etcdctl(const std::vector<std::string>& args, bool as_root, std::string& text) {
    std::vector<std::string> argv = {find_program("etcdctl"), "--endpoints=" + url(),
                                     "--dial-timeout=30s", "--command-timeout=30s"};
    if (as_root) argv.push_back(std::string("--user=root:") + kRootPassword);
    argv.insert(argv.end(), args.begin(), args.end());
    const auto out = dir_.path() / ("etcdctl" + std::to_string(calls_++));
    ChildProcess p(argv, out, out);
    const auto status = p.wait_for(std::chrono::seconds(90));
    std::ifstream in(out);
    std::stringstream read;
    read << in.rdbuf();
    text = read.str();
    return status ? *status : -1;
  }

  // What an operator does for a job (elastic/etcd_store.h): its user with
  // the token as password, allowed the job's prefix only.
  bool add_job(const std::string& user, const std::string& token, const std::string& prefix) {
    return etcdctl({"user", "add", user, "--new-user-password=" + token}) &&
           etcdctl({"role", "add", user}) &&
           etcdctl({"role", "grant-permission", user, "readwrite", "--prefix=true", prefix}) &&
           etcdctl({"user", "grant-role", user, user});
  }

  std::string log() const {
    std::ifstream in(dir_.path() / "etcd.log");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  // Data of test etcds whose test process died before it cleaned up
  // (brigade_etcd_<pid>_<n>, that pid gone).
  static void sweep_dead_runs() {
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ignored)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with("brigade_etcd_")) continue;
      const pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + 13));
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
        std::filesystem::remove_all(entry.path(), ignored);
      }
    }
  }

  TempDir dir_;
  std::string host_;
  std::filesystem::path data_;
  uint16_t client_port_ = 0;
  std::unique_ptr<ChildProcess> process_;
  bool ok_ = false;
  int calls_ = 0;
};

}  // namespace brigade::testing
