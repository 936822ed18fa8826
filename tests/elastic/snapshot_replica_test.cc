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
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/comm/store_protocol.h"
#include "brigade/core/error.h"
#include "brigade/model/gpt_config.h"
#include "brigade/model/param_layout.h"
#include "testing/temp_dir.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {
namespace fs = std::filesystem;
namespace sp = store_protocol;

constexpr char kToken[] = "replica-test-token";

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
  explicit Server(const fs::path& root, int64_t max_bytes = int64_t{1} << 30) {
    ReplicaServerOptions o;
    o.token = kToken;
    o.root = root;
    o.max_bytes = max_bytes;
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

std::string handshake(const std::string& token = kToken) {
  return sp::Encoder().str(kReplicaMagic).str(token).frame();
}

std::string put_header(int64_t node, int64_t step, uint32_t files) {
  return sp::Encoder().u8(1).i64(node).i64(step).u32(files).frame();
}

TEST(SnapshotReplica, AReplicaArrivesCompleteAndVerifiesAndIsFetchedBackBitForBit) {
  testing::TempDir dir("brigade_replica");
  const fs::path part = snapshot_step(dir.path() / "node1", 4);
  Server s(dir.path() / "peer");
  send_replica("127.0.0.1", s.server->port(), kToken, 1, 4, part);
  EXPECT_EQ(s.server->kept_step(1), 4);
  EXPECT_EQ(s.server->kept_step(0), -1);
  expect_same_files(part, s.server->kept_dir(1));
  EXPECT_FALSE(fs::exists(dir.path() / "peer" / "node-1" / ".incoming"));

  // The standby's side: the fetched copy is the snapshot, and verifies as
  // one (sizes and the manifest's checksum).
  const fs::path standby = dir.path() / "standby";
  EXPECT_EQ(fetch_replica("127.0.0.1", s.server->port(), kToken, 1, standby), 4);
  expect_same_files(part, step_directory(standby, 4));
  EXPECT_NO_THROW(verify_checkpoint(step_directory(standby, 4), /*snapshot=*/true));
  EXPECT_EQ(latest_checkpoint(standby), step_directory(standby, 4));

  // A node it keeps nothing of: a clear error, and nothing left behind.
  EXPECT_THROW(
      try {
        fetch_replica("127.0.0.1", s.server->port(), kToken, 0, standby);
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
  EXPECT_THROW(send_replica("127.0.0.1", port, "not-the-token", 0, 7, part), Error);
  EXPECT_NE(s.log().find("did not present the job's token"), std::string::npos) << s.log();
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
  send_replica("127.0.0.1", port, kToken, 0, 7, part);
  EXPECT_EQ(s.server->kept_step(0), 7);
  expect_same_files(part, s.server->kept_dir(0));
}

TEST(SnapshotReplica, AnOlderSnapshotNeverReplacesANewerOne) {
  testing::TempDir dir("brigade_replica");
  const fs::path step3 = snapshot_step(dir.path() / "node1", 3);
  const fs::path step5 = snapshot_step(dir.path() / "node1", 5);
  const fs::path step6 = snapshot_step(dir.path() / "node1", 6);
  Server s(dir.path() / "peer");
  const uint16_t port = s.server->port();
  send_replica("127.0.0.1", port, kToken, 1, 5, step5);
  // A late transfer of an older step, and a repeat of the kept one.
  for (const auto& [step, part] : {std::pair{int64_t{3}, step3}, std::pair{int64_t{5}, step5}}) {
    try {
      send_replica("127.0.0.1", port, kToken, 1, step, part);
      ADD_FAILURE() << "step " << step << " replaced step 5";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not newer than the kept step 5"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(s.server->kept_step(1), 5);
  expect_same_files(step5, s.server->kept_dir(1));
  // Another source node's replicas are its own.
  send_replica("127.0.0.1", port, kToken, 2, 3, step3);
  EXPECT_EQ(s.server->kept_step(2), 3);
  // A newer one replaces it, and the older copy is gone.
  send_replica("127.0.0.1", port, kToken, 1, 6, step6);
  EXPECT_EQ(s.server->kept_step(1), 6);
  expect_same_files(step6, s.server->kept_dir(1));
  EXPECT_FALSE(fs::exists(step_directory(dir.path() / "peer" / "node-1", 5)));
  EXPECT_EQ(fetch_replica("127.0.0.1", port, kToken, 1, dir.path() / "standby"), 6);
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
  ReplicaSender sender({"127.0.0.1", port, kToken}, 1, log);
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
  EXPECT_TRUE(sender.wait_sent(6));
  EXPECT_EQ(s.server->kept_step(1), 6);

  // A sender without the job's token, and one whose peer is not there:
  // nothing is kept, the failure is a log line, and nobody throws.
  ReplicaSender stranger({"127.0.0.1", port, "not-the-token"}, 2, log);
  stranger.offer(3, step3);
  EXPECT_FALSE(stranger.wait_sent(3));
  EXPECT_EQ(stranger.sent_step(), -1);
  EXPECT_EQ(s.server->kept_step(2), -1);
  uint16_t closed_port = 0;
  {
    Server gone(dir.path() / "gone");
    closed_port = gone.server->port();
  }
  ReplicaSender nowhere({"127.0.0.1", closed_port, kToken}, 0, log);
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

TEST(SnapshotReplica, AFetchRefusesMoreThanItsLimit) {
  testing::TempDir dir("brigade_replica");
  const int listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listen_fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread server(serve_one_oversized_get, listen_fd, int64_t{1} << 40);
  try {
    fetch_replica("127.0.0.1", ntohs(addr.sin_port), kToken, 1, dir.path() / "standby", 10'000,
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

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic
