// Snapshot replication to a peer agent (elastic/snapshot_replica.h): a real
// snapshot part sent, kept and fetched back bit for bit; strangers,
// malformed and oversized frames, unsafe names and broken transfers refused
// with a log line while the server keeps serving; and an older snapshot
// never replacing a newer one; the background sender an agent runs. The server and its clients
// share this process; every exchange is over loopback TCP.
#include "brigade/elastic/snapshot_replica.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/comm/store_protocol.h"
#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"
#include "testing/temp_dir.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
namespace sp = store_protocol;

constexpr char kToken[] = "replica-test-token";
constexpr int64_t kLimit = int64_t{1} << 30;

// A real checkpoint-format snapshot of a tiny model at `step` under root;
// returns its step directory.
fs::path snapshot_step(const fs::path& root, int64_t step) {
  GptConfig config;
  config.n_layer = 1;
  config.n_head = 1;
  config.n_embd = 8;
  config.block_size = 4;
  config.vocab_size = 16;
  std::vector<float> state(static_cast<size_t>(ParamLayout(config).size()));
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(step) + 0.001f * i;
  save_checkpoint(root, step, config, state.data(), state.data(), state.data(),
                  CheckpointHeader{{{"dp", 1}}, {{"step", step}}, ""});
  return step_directory(root, step);
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Every regular file of a and b, byte for byte.
void expect_same_files(const fs::path& a, const fs::path& b) {
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(a)) {
    ++files;
    const fs::path other = b / entry.path().filename();
    ASSERT_TRUE(fs::exists(other)) << other;
    EXPECT_EQ(read_bytes(entry.path()), read_bytes(other)) << other;
  }
  EXPECT_EQ(files, static_cast<size_t>(std::distance(fs::directory_iterator(b), {})));
  EXPECT_GT(files, 1u);
}

// A server on loopback whose log lines the test reads.
struct Server {
  explicit Server(const fs::path& root, int64_t max_bytes = int64_t{1} << 30,
                  int64_t io_timeout_ms = 10'000) {
    ReplicaServerOptions o;
    o.token = kToken;
    o.root = root;
    o.max_bytes = max_bytes;
    o.nodes = 4;
    o.io_timeout_ms = io_timeout_ms;
    o.log = [this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    };
    server = std::make_unique<ReplicaServer>(std::move(o));
  }
  std::string log() {
    std::lock_guard lock(mutex);
    std::string all;
    for (const std::string& line : lines) all += line + "\n";
    return all;
  }
  std::mutex mutex;
  std::vector<std::string> lines;
  std::unique_ptr<ReplicaServer> server;
};

// Sends `bytes` on a raw connection and reads until the server closes it:
// the server logs before it closes, so its line is there on return.
std::string raw_exchange(uint16_t port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server refused and closed
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string reply;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) reply.append(buffer, n);
  ::close(fd);
  return reply;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string handshake(const std::string& token = kToken) {
  return sp::Encoder().str(kReplicaMagic).str(token).frame();
}

std::string put_header(int64_t node, int64_t step, uint32_t files, int64_t generation = 0) {
  return sp::Encoder().u8(1).i64(node).i64(generation).i64(step).u32(files).frame();
}

TEST(SnapshotReplica, AReplicaOfAnotherGenerationIsNotServed) {
  testing::TempDir dir("brigade_replica");
  const fs::path part = snapshot_step(dir.path() / "node1", 4);
  Server s(dir.path() / "peer");
  send_replica("127.0.0.1", s.server->port(), kToken, 1, 2, 4, part);
  // Node 1 of generation 3 may be another node's history (a shrink
  // renumbers nodes): generation 2's replica is not its.
  try {
    fetch_replica("127.0.0.1", s.server->port(), kToken, 1, dir.path() / "a", kLimit, 10'000, 4, 0,
                  3);
    ADD_FAILURE() << "generation 2's replica was served for generation 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keeps no replica of node 1 of step 4 from generation 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fetch_replica("127.0.0.1", s.server->port(), kToken, 1, dir.path() / "b", kLimit,
                          10'000, 4, 0, 2),
            4);
}

TEST(SnapshotReplica, AReplicaArrivesCompleteAndVerifiesAndIsFetchedBackBitForBit) {
  testing::TempDir dir("brigade_replica");
  const fs::path part = snapshot_step(dir.path() / "node1", 4);
  Server s(dir.path() / "peer");
  send_replica("127.0.0.1", s.server->port(), kToken, 1, 0, 4, part);
  EXPECT_EQ(s.server->kept_step(1), 4);
  EXPECT_EQ(s.server->kept_step(0), -1);
  expect_same_files(part, s.server->kept_dir(1));
  EXPECT_FALSE(fs::exists(dir.path() / "peer" / "node-1" / ".incoming"));

  // The standby's side: the fetched copy is the snapshot, and verifies as
  // one (sizes and the manifest's checksum).
  const fs::path standby = dir.path() / "standby";
  EXPECT_EQ(fetch_replica("127.0.0.1", s.server->port(), kToken, 1, standby, kLimit), 4);
  expect_same_files(part, step_directory(standby, 4));
  EXPECT_NO_THROW(verify_checkpoint(step_directory(standby, 4), /*snapshot=*/true));
  EXPECT_EQ(latest_checkpoint(standby), step_directory(standby, 4));

  // A node it keeps nothing of: a clear error, and nothing left behind.
  EXPECT_THROW(
      try {
        fetch_replica("127.0.0.1", s.server->port(), kToken, 0, standby, kLimit);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("keeps no replica of node 0"), std::string::npos)
            << e.what();
        throw;
      },
      Error);
  EXPECT_EQ(std::distance(fs::directory_iterator(standby), {}), 1);
}

TEST(SnapshotReplica, StrangersAndMalformedMessagesAreRefusedAndLoggedAndTheServerKeepsServing) {
  testing::TempDir dir("brigade_replica");
  const fs::path part = snapshot_step(dir.path() / "node0", 7);
  Server s(dir.path() / "peer", /*max_bytes=*/1 << 20);
  const uint16_t port = s.server->port();

  // A client with the wrong token, through the real client.
  EXPECT_THROW(send_replica("127.0.0.1", port, "not-the-token", 0, 0, 7, part), Error);
  EXPECT_NE(s.log().find("did not present the job's token"), std::string::npos) << s.log();
  // A prefix of the token, and an empty one, are not the token; the token
  // with another protocol's magic is not an agent.
  raw_exchange(port, handshake(std::string(kToken).substr(0, 7)));
  raw_exchange(port, handshake(""));
  EXPECT_EQ(count(s.log(), "did not present the job's token"), 3) << s.log();
  raw_exchange(port, sp::Encoder().str("brigade-replica/0").str(kToken).frame());
  EXPECT_NE(s.log().find("not a brigade agent"), std::string::npos) << s.log();
  // Strangers: garbage, a handshake frame declaring 1 GiB, an empty one.
  raw_exchange(port, "GET / HTTP/1.1\r\n\r\n");
  raw_exchange(port, std::string("\x00\x00\x00\x40", 4));
  EXPECT_NE(s.log().find("over the limit of 4096"), std::string::npos) << s.log();
  raw_exchange(port, std::string("\x00\x00\x00\x00", 4));
  EXPECT_NE(s.log().find("malformed handshake"), std::string::npos) << s.log();
  // Token holders that send what no agent sends: an unknown operation, a
  // request frame of 16 MiB, a file name out of the replica's directory, a
  // file over the size limit, a checksum that does not match, a transfer
  // cut off half-way.
  raw_exchange(port, handshake() + sp::Encoder().u8(9).i64(0).frame());
  EXPECT_NE(s.log().find("operation 9"), std::string::npos) << s.log();
  raw_exchange(port, handshake() + std::string("\x00\x00\x00\x01", 4));
  EXPECT_NE(s.log().find("declares 16777216 bytes"), std::string::npos) << s.log();
  raw_exchange(port, handshake() + put_header(0, 8, 1) +
                         sp::Encoder().str("../escaped").i64(1).i64(0).frame() + "x");
  EXPECT_NE(s.log().find("a file named \"../escaped\""), std::string::npos) << s.log();
  EXPECT_FALSE(fs::exists(dir.path() / "peer" / "node-0" / "escaped"));
  raw_exchange(port, handshake() + put_header(0, 8, 1) +
                         sp::Encoder().str("shard").i64(int64_t{2} << 20).i64(0).frame());
  EXPECT_NE(s.log().find("over the 1048576 bytes left"), std::string::npos) << s.log();
  raw_exchange(port, handshake() + put_header(0, 8, 1) +
                         sp::Encoder().str("shard").i64(3).i64(12345).frame() + "abc");
  EXPECT_NE(s.log().find("arrived with xxh64"), std::string::npos) << s.log();
  raw_exchange(port, handshake() + put_header(0, 8, 1) +
                         sp::Encoder().str("shard").i64(1000).i64(0).frame() + "only a part");
  EXPECT_NE(s.log().find("closed the connection mid-message"), std::string::npos) << s.log();
  // None of it was kept, nothing is left half-written, and the server still
  // serves the job's agents.
  EXPECT_EQ(s.server->kept_step(0), -1);
  EXPECT_FALSE(fs::exists(dir.path() / "peer" / "node-0" / ".incoming"));
  send_replica("127.0.0.1", port, kToken, 0, 0, 7, part);
  EXPECT_EQ(s.server->kept_step(0), 7);
  expect_same_files(part, s.server->kept_dir(0));
  // A newer step cut off half-way, or with a wrong checksum, leaves the
  // kept one as it was.
  raw_exchange(port, handshake() + put_header(0, 8, 1) +
                         sp::Encoder().str("shard").i64(1000).i64(0).frame() + "only a part");
  raw_exchange(port, handshake() + put_header(0, 8, 1) +
                         sp::Encoder().str("shard").i64(3).i64(12345).frame() + "abc");
  EXPECT_EQ(count(s.log(), "closed the connection mid-message"), 2) << s.log();
  EXPECT_EQ(s.server->kept_step(0), 7);
  expect_same_files(part, s.server->kept_dir(0));
  EXPECT_FALSE(fs::exists(dir.path() / "peer" / "node-0" / ".incoming"));
}

TEST(SnapshotReplica, AnOlderSnapshotNeverReplacesANewerOne) {
  testing::TempDir dir("brigade_replica");
  const fs::path step3 = snapshot_step(dir.path() / "node1", 3);
  const fs::path step5 = snapshot_step(dir.path() / "node1", 5);
  const fs::path step6 = snapshot_step(dir.path() / "node1", 6);
  Server s(dir.path() / "peer");
  const uint16_t port = s.server->port();
  send_replica("127.0.0.1", port, kToken, 1, 0, 5, step5);
  // A late transfer of an older step, and a repeat of the kept one.
  for (const auto& [step, part] : {std::pair{int64_t{3}, step3}, std::pair{int64_t{5}, step5}}) {
    try {
      send_replica("127.0.0.1", port, kToken, 1, 0, step, part);
      ADD_FAILURE() << "step " << step << " replaced step 5";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not newer than the kept step 5"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(s.server->kept_step(1), 5);
  expect_same_files(step5, s.server->kept_dir(1));
  // Another source node's replicas are its own.
  send_replica("127.0.0.1", port, kToken, 2, 0, 3, step3);
  EXPECT_EQ(s.server->kept_step(2), 3);
  // A newer one replaces it, and the older copy is gone.
  send_replica("127.0.0.1", port, kToken, 1, 0, 6, step6);
  EXPECT_EQ(s.server->kept_step(1), 6);
  expect_same_files(step6, s.server->kept_dir(1));
  EXPECT_FALSE(fs::exists(step_directory(dir.path() / "peer" / "node-1", 5)));
  EXPECT_EQ(fetch_replica("127.0.0.1", port, kToken, 1, dir.path() / "standby", kLimit), 6);
}

TEST(SnapshotReplica, TheSenderCarriesTheNewestPartInTheBackgroundAndLogsWhatItCouldNotSend) {
  testing::TempDir dir("brigade_replica");
  const fs::path step3 = snapshot_step(dir.path() / "node1", 3);
  const fs::path step6 = snapshot_step(dir.path() / "node1", 6);
  Server s(dir.path() / "peer");
  const uint16_t port = s.server->port();
  std::mutex mutex;
  std::string failures;
  const auto log = [&](const std::string& line) {
    std::lock_guard lock(mutex);
    failures += line + "\n";
  };
  ReplicaSender sender({"127.0.0.1", port, kToken}, 1, 0, log);
  EXPECT_EQ(sender.sent_step(), -1);
  sender.offer(3, step3);
  ASSERT_TRUE(sender.wait_sent(3)) << failures;
  EXPECT_EQ(s.server->kept_step(1), 3);
  sender.offer(6, step6);
  ASSERT_TRUE(sender.wait_sent(6)) << failures;
  EXPECT_EQ(s.server->kept_step(1), 6);
  expect_same_files(step6, s.server->kept_dir(1));
  // An older part offered late is refused by the peer: logged, not sent.
  sender.offer(3, step3);
  EXPECT_FALSE(sender.wait_sent(7));
  EXPECT_EQ(s.server->kept_step(1), 6);
  {
    std::lock_guard lock(mutex);
    EXPECT_NE(failures.find("step 3 was not replicated: the snapshot replica server at 127.0.0.1:" +
                            std::to_string(port) +
                            " refused: step 3 of node 1 is not newer than the kept step 6"),
              std::string::npos)
        << failures;
  }

  // A sender without the job's token, and one whose peer is not there:
  // nothing is kept, the failure is a log line, and nobody throws.
  ReplicaSender stranger({"127.0.0.1", port, "not-the-token"}, 2, 0, log);
  stranger.offer(3, step3);
  EXPECT_FALSE(stranger.wait_sent(3));
  EXPECT_EQ(stranger.sent_step(), -1);
  EXPECT_EQ(s.server->kept_step(2), -1);
  uint16_t closed_port = 0;
  {
    Server gone(dir.path() / "gone");
    closed_port = gone.server->port();
  }
  ReplicaSender nowhere({"127.0.0.1", closed_port, kToken}, 0, 0, log);
  nowhere.offer(3, step3);
  EXPECT_FALSE(nowhere.wait_sent(3));
  std::lock_guard lock(mutex);
  EXPECT_NE(failures.find("the snapshot of step 3 was not replicated"), std::string::npos)
      << failures;
  EXPECT_NE(failures.find("the job's token is required"), std::string::npos) << failures;
  EXPECT_NE(failures.find("cannot connect"), std::string::npos) << failures;
}

// A token holder's server that answers a get with one file of `bytes`
// bytes (sending none of them): what a fetch must refuse to believe.
void serve_one_oversized_get(int listen_fd, int64_t bytes) {
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  std::string request(4096, '\0');
  ::recv(fd, request.data(), request.size(), 0);  // the handshake
  const std::string ok = sp::Encoder().status(sp::Status::kOk).str("").frame();
  ::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
  ::recv(fd, request.data(), request.size(), 0);  // the get
  const std::string reply = sp::Encoder().status(sp::Status::kOk).str("").i64(2).u32(1).frame() +
                            sp::Encoder().str("shard").i64(bytes).i64(0).frame();
  ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
  char byte;
  ::recv(fd, &byte, 1, 0);  // until the client hangs up
  ::close(fd);
}

// A listening socket on a free loopback port (for a fake peer); -1 if none.
int listen_on_loopback(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

TEST(SnapshotReplica, AFetchRefusesMoreThanItsLimit) {
  testing::TempDir dir("brigade_replica");
  uint16_t port = 0;
  const int listen_fd = listen_on_loopback(&port);
  ASSERT_GE(listen_fd, 0);
  std::thread server(serve_one_oversized_get, listen_fd, int64_t{1} << 40);
  try {
    fetch_replica("127.0.0.1", port, kToken, 1, dir.path() / "standby",
                  /*max_bytes=*/1 << 20);
    ADD_FAILURE() << "a fetch accepted a 1 TiB file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("over the 1048576 bytes left"), std::string::npos)
        << e.what();
  }
  server.join();
  ::close(listen_fd);
  EXPECT_TRUE(!fs::exists(dir.path() / "standby") ||
              fs::directory_iterator(dir.path() / "standby") == fs::directory_iterator());
}

int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Reads one status frame from the server (blocking).
sp::Status read_status(int fd) {
  char head[4];
  EXPECT_EQ(::recv(fd, head, 4, MSG_WAITALL), 4);
  std::string payload(sp::load_u32(head), '\0');
  EXPECT_EQ(::recv(fd, payload.data(), payload.size(), MSG_WAITALL),
            static_cast<ssize_t>(payload.size()));
  return static_cast<sp::Status>(payload.empty() ? 255 : payload[0]);
}

// Waits (at most timeout_ms) until the server closes fd; true if it did.
bool closed_by_server(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

// A token holder whose put stalls before its first file: it holds the
// server's thread for the server's io timeout.
int stalled_put(uint16_t port, int64_t node) {
  const int fd = raw_connect(port);
  const std::string bytes = handshake() + put_header(node, 1, 1);
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  EXPECT_EQ(read_status(fd), sp::Status::kOk);  // the handshake
  EXPECT_EQ(read_status(fd), sp::Status::kOk);  // the put: the server waits for the file
  return fd;
}

TEST(SnapshotReplica, SilentAndTricklingStrangersDoNotHoldTheServer) {
  testing::TempDir dir("brigade_replica");
  const fs::path part = snapshot_step(dir.path() / "node1", 4);
  Server s(dir.path() / "peer");
  const uint16_t port = s.server->port();
  const int silent = raw_connect(port);
  const int trickler = raw_connect(port);
  // One byte of a valid handshake a second: each read is quick, the
  // handshake takes ~45 s unless its deadline cuts it off.
  std::atomic<bool> cut_off{false};
  std::thread trickle([&] {
    const std::string bytes = handshake();
    for (const char byte : bytes) {
      if (::send(trickler, &byte, 1, MSG_NOSIGNAL) != 1 || closed_by_server(trickler, 1000)) {
        cut_off = true;
        return;
      }
    }
  });
  Stopwatch watch;
  send_replica("127.0.0.1", port, kToken, 1, 0, 4, part, /*timeout_ms=*/60'000);
  // A loaded machine needs well under a second; a server held by either
  // stranger would need its handshake's 2 s at least (10 s before).
  EXPECT_LT(watch.elapsed_s(), 1.9);
  EXPECT_EQ(s.server->kept_step(1), 4);
  trickle.join();
  EXPECT_TRUE(cut_off.load());
  EXPECT_TRUE(closed_by_server(silent, 30'000));
  EXPECT_EQ(count(s.log(), "no handshake within 2000 ms"), 2) << s.log();
  ::close(silent);
  ::close(trickler);
}

TEST(SnapshotReplica, DestroyingTheServerIsPromptWhileStrangersAndAStalledTransferAreConnected) {
  testing::TempDir dir("brigade_replica");
  auto s = std::make_unique<Server>(dir.path() / "peer", kLimit, /*io_timeout_ms=*/60'000);
  const int silent = raw_connect(s->server->port());
  const int holder = stalled_put(s->server->port(), 0);
  Stopwatch watch;
  s.reset();
  EXPECT_LT(watch.elapsed_s(), 1.0);
  ::close(silent);
  ::close(holder);
}

fs::path make_part(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
  return dir;
}

TEST(SnapshotReplica, FetchesOfSeveralNodesJoinOneStepAndReplaceNothing) {
  testing::TempDir dir("brigade_replica");
  Server s(dir.path() / "peer");
  const uint16_t port = s.server->port();
  send_replica("127.0.0.1", port, kToken, 0, 0, 4, make_part(dir.path() / "n0", "shard_0", "zero"));
  send_replica("127.0.0.1", port, kToken, 1, 0, 4, make_part(dir.path() / "n1", "shard_1", "one"));
  send_replica("127.0.0.1", port, kToken, 2, 0, 4, make_part(dir.path() / "n2", "shard_2", "two"));
  // A survivor's area holds its own part of step 4 already.
  const fs::path area = dir.path() / "area";
  const fs::path step4 = step_directory(area, 4);
  make_part(step4, "shard_3", "mine");
  EXPECT_EQ(fetch_replica("127.0.0.1", port, kToken, 0, area, kLimit), 4);
  EXPECT_EQ(fetch_replica("127.0.0.1", port, kToken, 1, area, kLimit), 4);
  EXPECT_EQ(read_bytes(step4 / "shard_0"), "zero");
  EXPECT_EQ(read_bytes(step4 / "shard_1"), "one");
  EXPECT_EQ(read_bytes(step4 / "shard_3"), "mine");
  // A name that is there already is refused, and nothing is replaced.
  make_part(step4, "shard_2", "mine too");
  try {
    fetch_replica("127.0.0.1", port, kToken, 2, area, kLimit);
    ADD_FAILURE() << "a fetch replaced a file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exists already"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_bytes(step4 / "shard_2"), "mine too");
  EXPECT_EQ(read_bytes(step4 / "shard_0"), "zero");
  EXPECT_EQ(std::distance(fs::directory_iterator(step4), {}), 4);
  EXPECT_EQ(std::distance(fs::directory_iterator(area), {}), 1);  // no fetch left behind
}

TEST(SnapshotReplica, ANewerGenerationDropsOlderOnesAndAnOlderOneIsRefused) {
  testing::TempDir dir("brigade_replica");
  const fs::path root = dir.path() / "peer";
  // What an earlier agent left in the area is not this server's.
  make_part(step_directory(root / "node-0", 3), "shard", "stale");
  Server s(root);
  const uint16_t port = s.server->port();
  EXPECT_FALSE(fs::exists(root / "node-0"));
  const fs::path a = make_part(dir.path() / "a", "shard", "a");
  send_replica("127.0.0.1", port, kToken, 0, 1, 10, a);
  send_replica("127.0.0.1", port, kToken, 1, 1, 10, a);
  // The job shrank: generation 2 resumes from an older step, and its node
  // 0 is not generation 1's.
  send_replica("127.0.0.1", port, kToken, 0, 2, 5, make_part(dir.path() / "b", "shard", "b"));
  EXPECT_EQ(s.server->kept_step(0), 5);
  EXPECT_EQ(read_bytes(s.server->kept_dir(0) / "shard"), "b");
  EXPECT_EQ(s.server->kept_step(1), -1);
  EXPECT_FALSE(fs::exists(root / "node-1"));
  EXPECT_FALSE(fs::exists(step_directory(root / "node-0", 10)));
  const auto refused = [&](int node, int64_t generation, int64_t step, const std::string& why) {
    try {
      send_replica("127.0.0.1", port, kToken, node, generation, step, a);
      ADD_FAILURE() << "generation " << generation << " step " << step << " was kept";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(1, 1, 20, "generation 1 is older than generation 2");
  refused(0, 2, 4, "not newer than the kept step 5");
  EXPECT_EQ(s.server->kept_step(1), -1);
  EXPECT_EQ(s.server->kept_step(0), 5);
}

TEST(SnapshotReplica, TheServerKeepsWithinItsNodeCountAndOneByteBudget) {
  testing::TempDir dir("brigade_replica");
  const fs::path part = make_part(dir.path() / "p", "shard", std::string(1000, 'x'));
  Server s(dir.path() / "peer", /*max_bytes=*/1500);
  const uint16_t port = s.server->port();
  send_replica("127.0.0.1", port, kToken, 0, 0, 1, part);
  EXPECT_THROW(send_replica("127.0.0.1", port, kToken, 1, 0, 1, part), Error);
  EXPECT_NE(s.log().find("over the 500 bytes left"), std::string::npos) << s.log();
  // A newer replica of the same node replaces its own: its old bytes go.
  send_replica("127.0.0.1", port, kToken, 0, 0, 2, part);
  EXPECT_EQ(s.server->kept_step(0), 2);
  EXPECT_THROW(send_replica("127.0.0.1", port, kToken, 4, 0, 1, part), Error);
  EXPECT_NE(s.log().find("node 4: this job has nodes 0 to 3"), std::string::npos) << s.log();
  EXPECT_EQ(s.server->kept_step(1), -1);

  const auto fails = [&](ReplicaServerOptions o, const std::string& why) {
    try {
      ReplicaServer server(std::move(o));
      ADD_FAILURE() << "a server started without " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  ReplicaServerOptions o;
  o.token = kToken;
  o.root = dir.path() / "other";
  o.max_bytes = 1 << 20;
  o.nodes = 2;
  fails(
      [&] {
        auto c = o;
        c.max_bytes = 0;
        return c;
      }(),
      "needs max_bytes (got 0");
  fails(
      [&] {
        auto c = o;
        c.nodes = 0;
        return c;
      }(),
      "nodes (got 0");
  fails(
      [&] {
        auto c = o;
        c.io_timeout_ms = 0;
        return c;
      }(),
      "io_timeout_ms > 0");
  fails(
      [&] {
        auto c = o;
        c.root = part / "shard" / "sub";
        return c;
      }(),
      "cannot use " + (part / "shard" / "sub").string());
}

TEST(SnapshotReplica, ASenderStuckOnAPeerCarriesOnlyTheNewestPartAndStopsPromptly) {
  testing::TempDir dir("brigade_replica");
  std::vector<fs::path> parts;
  for (int64_t step = 3; step <= 5; ++step) parts.push_back(snapshot_step(dir.path() / "n1", step));
  Server s(dir.path() / "peer", kLimit, /*io_timeout_ms=*/60'000);
  const uint16_t port = s.server->port();
  std::mutex mutex;
  std::string failures;
  const auto log = [&](const std::string& line) {
    std::lock_guard lock(mutex);
    failures += line + "\n";
  };
  // The peer accepts and does not answer while a stalled transfer holds it.
  const int holder = stalled_put(port, 0);
  ReplicaSender sender({"127.0.0.1", port, kToken, 60'000}, 1, 0, log);
  Stopwatch watch;
  for (int64_t step = 3; step <= 5; ++step) sender.offer(step, parts[step - 3]);
  EXPECT_LT(watch.elapsed_s(), 0.5);
  ::close(holder);  // the peer is free again
  ASSERT_TRUE(sender.wait_sent(5)) << failures;
  // The newest, and at most the part already on its way when 4 and 5
  // came (3, or 4 if it replaced 3 first): never the whole backlog.
  const std::string kept = s.log();
  EXPECT_EQ(count(kept, "kept the replica of node 1 generation 0 step 5"), 1) << kept;
  EXPECT_LE(count(kept, "step 3 from") + count(kept, "step 4 from"), 1) << kept;

  // A peer that accepts and never answers: destruction does not wait for it.
  uint16_t silent_port = 0;
  const int listen_fd = listen_on_loopback(&silent_port);
  ASSERT_GE(listen_fd, 0);
  auto stuck = std::make_unique<ReplicaSender>(
      ReplicaSender::Peer{"127.0.0.1", silent_port, kToken, 60'000}, 1, 0, log);
  stuck->offer(5, parts[2]);
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  std::string hello(handshake().size(), '\0');
  EXPECT_EQ(::recv(fd, hello.data(), hello.size(), MSG_WAITALL),
            static_cast<ssize_t>(hello.size()));  // it waits for our answer now
  watch.reset();
  stuck.reset();
  EXPECT_LT(watch.elapsed_s(), 1.0);
  ::close(fd);
  ::close(listen_fd);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic
