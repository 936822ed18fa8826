// The rendezvous store: one server in the test process, clients in forked
// processes (as workers will be) or threads, everything on 127.0.0.1.
#include "brigade/comm/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "brigade/comm/store_protocol.h"
#include "testing/free_port.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {
using testing::free_port;

const std::string kHost = "127.0.0.1";
const std::string kToken = "0123456789abcdef0123456789abcdef";

// Runs fn in a forked process; its exit status is 0 if fn returned and 1 if
// it threw (the message goes to stderr).
pid_t fork_client(const std::function<void()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int status = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "client %d: %s\n", static_cast<int>(::getpid()), e.what());
      status = 1;
    }
    std::fflush(stderr);
    ::_exit(status);  // no gtest teardown, no destructors of the parent's objects
  }
  EXPECT_GT(pid, 0);
  return pid;
}

// Waits for a forked client, killing it if it hangs.
int wait_client(pid_t pid, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "client " << pid << " hung and was killed";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A raw TCP connection, for peers that do not speak the protocol.
int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Polls `ready` until it holds or 30 s pass: the signal a test waits for
// instead of sleeping.
bool wait_until(const std::function<bool()>& ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A client that speaks the wire format itself, so a test can pipeline
// requests or send what TcpStore never would. Blocking socket; every read
// gives up after 30 s so a server that stops answering fails the test.
class RawClient {
 public:
  explicit RawClient(uint16_t port, int receive_buffer_bytes = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer_bytes > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(int));
    }
    const timeval limit{30, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // Presents the token; true if the server accepted it.
  bool authenticate(const std::string& token) {
    send_all(store_protocol::Encoder().str(store_protocol::kMagic).str(token).frame());
    const std::optional<std::string> reply = read_frame();
    return reply && *reply == std::string(1, '\0');
  }

  bool send_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // The next reply frame's body; nullopt at the end of the stream (or after
  // 30 s without one).
  std::optional<std::string> read_frame() {
    char header[4];
    if (!read_exact(header, 4)) return std::nullopt;
    std::string body(store_protocol::load_u32(header), '\0');
    if (!read_exact(body.data(), body.size())) return std::nullopt;
    return body;
  }

  // Whether the server closed the connection (rather than go quiet).
  bool at_end() {
    char byte;
    return ::recv(fd_, &byte, 1, 0) == 0;
  }

 private:
  bool read_exact(char* data, size_t bytes) {
    while (bytes > 0) {
      const ssize_t n = ::recv(fd_, data, bytes, 0);
      if (n <= 0) return false;
      data += n;
      bytes -= static_cast<size_t>(n);
    }
    return true;
  }

  int fd_ = -1;
};

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(TcpStore, SetGetAddWaitAcrossProcesses) {
  TcpStoreServer server(kHost, 0, kToken);
  const uint16_t port = server.port();
  constexpr int kClients = 4;
  std::vector<pid_t> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(fork_client([&, i] {
      TcpStore store(kHost, port, kToken, 5000);
      const int64_t arrival = store.add("arrivals", 1);
      if (arrival < 1 || arrival > kClients) throw Error("bad arrival " + std::to_string(arrival));
      store.set("addr/" + std::to_string(i), "worker-" + std::to_string(i));
      std::vector<std::string> keys;
      for (int j = 0; j < kClients; ++j) keys.push_back("addr/" + std::to_string(j));
      store.wait(keys);
      if (!store.check(keys)) throw Error("check after wait");
      for (int j = 0; j < kClients; ++j) {
        if (store.get(keys[j]) != "worker-" + std::to_string(j)) throw Error("wrong value");
      }
      store.add("finished", 1);
    }));
  }
  for (pid_t pid : clients) EXPECT_EQ(wait_client(pid), 0);

  TcpStore store(kHost, port, kToken, 1000);
  EXPECT_EQ(store.add("arrivals", 0), kClients);
  EXPECT_EQ(store.get("finished"), std::to_string(kClients));
  EXPECT_FALSE(store.check({"addr/0", "addr/nope"}));
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore reader(kHost, server.port(), kToken, 30'000);
  auto value = std::async(std::launch::async, [&] { return reader.get("late"); });
  ASSERT_TRUE(wait_until([&] { return server.stats().parked_requests == 1; }));
  TcpStore writer(kHost, server.port(), kToken, 5000);
  writer.set("late", std::string("a\0b", 3));
  EXPECT_EQ(value.get(), std::string("a\0b", 3));
}

TEST(TcpStore, LargeValuesSurvivePartialReadsAndWrites) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore store(kHost, server.port(), kToken, 5000);
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  store.set("big", big);
  EXPECT_EQ(store.get("big"), big);
}

TEST(TcpStore, GetOfMissingKeyTimesOutNamingKeyStoreAndTimeout) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore store(kHost, server.port(), kToken, 300);
  const auto start = std::chrono::steady_clock::now();
  try {
    store.get("never/set");
    FAIL() << "get of a missing key returned";
  } catch (const StoreTimeoutError& e) {
    const double elapsed_ms = ms_since(start);
    EXPECT_GE(elapsed_ms, 290);
    // The server's 300 ms, not the client's own deadline 2 s later.
    EXPECT_LT(elapsed_ms, 1800);
    const std::string message = e.what();
    EXPECT_NE(message.find("'never/set'"), std::string::npos) << message;
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos)
        << message;
    EXPECT_NE(message.find("300 ms"), std::string::npos) << message;
  }
  // The connection is still good after a timeout.
  store.set("k", "v");
  EXPECT_EQ(store.get("k"), "v");
}

TEST(TcpStore, WaitTimeoutNamesTheMissingKeys) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore store(kHost, server.port(), kToken, 5000);
  store.set("here", "1");
  try {
    store.wait({"here", "absent"}, 100);
    FAIL() << "wait returned";
  } catch (const StoreTimeoutError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'absent'"), std::string::npos) << message;
    EXPECT_EQ(message.find("'here'"), std::string::npos) << message;
  }
}

TEST(TcpStore, AddRefusesAValueThatIsNotACounter) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore store(kHost, server.port(), kToken, 5000);
  store.set("name", "alice");
  EXPECT_THROW(store.add("name", 1), Error);
  EXPECT_EQ(store.add("n", -5), -5);
  EXPECT_EQ(store.add("n", 7), 2);
}

// A refused client gets an Error saying where the token comes from, and the
// server logs one line naming the peer.
void expect_refused(const std::string& token, const std::string& reason) {
  TcpStoreServer server(kHost, 0, kToken);
  ::testing::internal::CaptureStderr();
  std::string message;
  try {
    TcpStore store(kHost, server.port(), token, 2000);
  } catch (const Error& e) {
    message = e.what();
  }
  server.stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find("refused our token"), std::string::npos) << message;
  EXPECT_NE(message.find("BRIGADE_STORE_TOKEN"), std::string::npos) << message;
  EXPECT_TRUE(std::regex_search(
      log, std::regex("^brigade store: refused connection from 127\\.0\\.0\\.1:[0-9]+: " + reason +
                      "\n$")))
      << log;
}

TEST(TcpStore, WrongTokenIsRefusedAndLogged) {
  expect_refused("not-the-token", "bad token");
}

TEST(TcpStore, MissingTokenIsRefusedAndLogged) {
  expect_refused("", "missing token");
}

TEST(TcpStore, PeerThatDoesNotSpeakTheProtocolIsRefused) {
  TcpStoreServer server(kHost, 0, kToken);
  ::testing::internal::CaptureStderr();
  const int fd = raw_connect(server.port());
  const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  char buffer[64];
  // The server answers with a refusal and closes: read until EOF.
  while (::recv(fd, buffer, sizeof(buffer), 0) > 0) {
  }
  ::close(fd);
  server.stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refused connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("not a brigade store client"), std::string::npos) << log;
}

TEST(TcpStore, ClientStartedBeforeTheServerConnectsOnceItIsUp) {
  const uint16_t port = free_port();
  // The client shows it is up by being turned away from the port once
  // itself; the server starts only then.
  int started[2];
  ASSERT_EQ(::pipe(started), 0);
  const pid_t client = fork_client([&] {
    ::close(started[0]);
    const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    const bool refused = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
                         errno == ECONNREFUSED;
    ::close(probe);
    if (!refused) throw Error("something already listens on the test's port");
    if (::write(started[1], "1", 1) != 1) throw Error("cannot signal the test");
    ::close(started[1]);
    TcpStore store(kHost, port, kToken, 30'000);
    store.set("hello", "from a client that came early");
  });
  ::close(started[1]);
  char byte = 0;
  ASSERT_EQ(::read(started[0], &byte, 1), 1);
  ::close(started[0]);
  TcpStoreServer server(kHost, port, kToken);
  EXPECT_EQ(wait_client(client, std::chrono::seconds(60)), 0);
  TcpStore store(kHost, port, kToken, 1000);
  EXPECT_EQ(store.get("hello"), "from a client that came early");
}

TEST(TcpStore, NoServerIsAnErrorAfterTheTimeout) {
  const uint16_t port = free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    TcpStore store(kHost, port, kToken, 200);
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_LT(ms_since(start), 10'000) << "the client should give up after its 200 ms";
    EXPECT_NE(std::string(e.what()).find("cannot reach the rendezvous store at 127.0.0.1:"),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, StoppingTheServerFailsABlockedGetInsteadOfHangingIt) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore store(kHost, server.port(), kToken, 120'000);
  auto blocked = std::async(std::launch::async, [&] { return store.get("never"); });
  ASSERT_TRUE(wait_until([&] { return server.stats().parked_requests == 1; }));
  const auto start = std::chrono::steady_clock::now();
  server.stop();
  EXPECT_THROW(blocked.get(), Error);
  EXPECT_LT(ms_since(start), 30'000) << "the get should fail at once, not at its 120 s timeout";
}

TEST(TcpStore, BindingABusyPortIsAnErrorNamingIt) {
  TcpStoreServer first(kHost, 0, kToken);
  try {
    TcpStoreServer second(kHost, first.port(), kToken);
    FAIL() << "bound a busy port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}

// A token holder may pipeline requests without reading the replies: the
// server answers them all, in order, holding back (not buffering) what it
// cannot act on yet. Some gets park on keys another client sets only once
// the server reports them parked; each answer lets the requests queued behind
// it go on, thousands deep, without the serving thread's stack growing.
TEST(TcpStore, PipelinedGetsAreAnsweredInOrderWithBoundedBuffers) {
  using store_protocol::Encoder;
  using store_protocol::Op;
  TcpStoreServer server(kHost, 0, kToken);
  constexpr int kGets = 10'000;
  // Gets of these wait for a set that comes after they are parked.
  const std::vector<int> late = {1000, 2500, 5000, 7777, kGets - 1};
  auto key = [](int i) { return "pipelined/" + std::to_string(i) + "/...................."; };
  auto value = [](int i) { return "v" + std::to_string(i); };

  // The other keys are set up front, pipelined too.
  {
    RawClient setter(server.port());
    ASSERT_TRUE(setter.authenticate(kToken));
    std::string sets;
    int count = 0;
    for (int i = 0; i < kGets; ++i) {
      if (std::find(late.begin(), late.end(), i) != late.end()) continue;
      sets += Encoder().op(Op::kSet).str(key(i)).str(value(i)).frame();
      ++count;
    }
    std::thread sender([&] { EXPECT_TRUE(setter.send_all(sets)); });
    for (int i = 0; i < count; ++i) {
      const std::optional<std::string> reply = setter.read_frame();
      ASSERT_TRUE(reply && *reply == std::string(1, '\0')) << "set reply " << i;
    }
    sender.join();
  }

  // Room for every reply in the client's own buffer, so the client's not
  // reading cannot stall the server for good.
  RawClient getter(server.port(), 1 << 20);
  ASSERT_TRUE(getter.authenticate(kToken));
  std::string gets;
  for (int i = 0; i < kGets; ++i) {
    gets += Encoder().op(Op::kGet).str(key(i)).i64(120'000).frame();
  }
  ASSERT_GT(gets.size(), 2 * TcpStoreServer::kBufferBytes + 100'000)
      << "the requests must be more than the server may buffer";
  std::thread sender([&] { EXPECT_TRUE(getter.send_all(gets)); });
  TcpStore writer(kHost, server.port(), kToken, 30'000);
  for (size_t j = 0; j < late.size(); ++j) {
    ASSERT_TRUE(wait_until([&] { return server.stats().parked_requests >= j + 1; }))
        << "the get of key " << late[j] << " was never parked";
    writer.set(key(late[j]), value(late[j]));
  }
  sender.join();
  for (int i = 0; i < kGets; ++i) {
    const std::optional<std::string> reply = getter.read_frame();
    ASSERT_TRUE(reply.has_value()) << "no reply to get " << i;
    store_protocol::Decoder d(*reply);
    ASSERT_EQ(d.u8(), 0) << "reply " << i;
    ASSERT_EQ(d.str(), value(i)) << "reply " << i;
  }
  const TcpStoreServer::Stats stats = server.stats();
  EXPECT_EQ(stats.parked_requests, late.size());
  EXPECT_LE(stats.buffered_high_water_bytes, 2 * TcpStoreServer::kBufferBytes + 1024);
  writer.set("still", "serving");
  EXPECT_EQ(writer.get("still"), "serving");
}

// A client that pipelines gets and does not read the replies yet: the server
// stops taking requests once its unsent replies reach the bound, and sends
// them all, in order, when the client reads.
TEST(TcpStore, ClientNotReadingItsRepliesIsHeldBackNotBuffered) {
  using store_protocol::Encoder;
  using store_protocol::Op;
  TcpStoreServer server(kHost, 0, kToken);
  constexpr int kKeys = 100;
  constexpr int kGets = 4000;  // 4 MB of replies
  auto value = [](int k) { return fmt::format("{}/{}", std::string(1000, 'a' + k % 26), k); };
  TcpStore writer(kHost, server.port(), kToken, 30'000);
  for (int k = 0; k < kKeys; ++k) writer.set(fmt::format("k{}", k), value(k));

  RawClient getter(server.port(), 4096);  // little room for replies on our side
  ASSERT_TRUE(getter.authenticate(kToken));
  std::string gets;
  for (int i = 0; i < kGets; ++i) {
    gets += Encoder().op(Op::kGet).str(fmt::format("k{}", i % kKeys)).i64(30'000).frame();
  }
  std::thread sender([&] { EXPECT_TRUE(getter.send_all(gets)); });
  // The signal that the server has filled its share and stopped: replies
  // waiting unsent.
  ASSERT_TRUE(wait_until(
      [&] { return server.stats().buffered_high_water_bytes >= TcpStoreServer::kBufferBytes; }));
  for (int i = 0; i < kGets; ++i) {
    const std::optional<std::string> reply = getter.read_frame();
    ASSERT_TRUE(reply.has_value()) << "no reply to get " << i;
    store_protocol::Decoder d(*reply);
    ASSERT_EQ(d.u8(), 0) << "reply " << i;
    ASSERT_EQ(d.str(), value(i % kKeys)) << "reply " << i;
  }
  sender.join();
  EXPECT_LE(server.stats().buffered_high_water_bytes, 2 * TcpStoreServer::kBufferBytes + 2048);
}

// A token holder announcing a frame over the limit is told why and dropped,
// before the server buffers any of it; everyone else is served on.
TEST(TcpStore, OversizedFrameIsRefusedAndOthersAreServedOn) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore other(kHost, server.port(), kToken, 30'000);
  other.set("before", "1");
  ::testing::internal::CaptureStderr();
  RawClient big(server.port());
  ASSERT_TRUE(big.authenticate(kToken));
  const uint32_t declared = store_protocol::kMaxFrameBytes + 1;
  std::string header = store_protocol::Encoder().u32(declared).bytes();
  ASSERT_TRUE(big.send_all(header + std::string(1000, 'x')));
  const std::optional<std::string> reply = big.read_frame();
  const bool closed = big.at_end();
  EXPECT_EQ(other.get("before"), "1");
  other.set("after", "2");
  EXPECT_EQ(other.get("after"), "2");
  server.stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(reply.has_value()) << "no reply before the close";
  store_protocol::Decoder d(*reply);
  EXPECT_EQ(d.u8(), static_cast<uint8_t>(store_protocol::Status::kError));
  const std::string reason = "a 67108865 byte request is over the store's limit of 67108864 bytes";
  EXPECT_EQ(d.str(), reason);
  EXPECT_TRUE(closed) << "the connection should be closed";
  EXPECT_TRUE(std::regex_search(
      log, std::regex("^brigade store: dropped 127\\.0\\.0\\.1:[0-9]+: " + reason + "\n$")))
      << log;
}

TEST(TcpStore, ClientRefusesToSendAValueOverTheLimit) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore store(kHost, server.port(), kToken, 30'000);
  const std::string huge(store_protocol::kMaxFrameBytes, 'x');
  try {
    store.set("huge", huge);
    FAIL() << "sent a value over the limit";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("set('huge') is a 67108877 byte request, over the rendezvous store's "
                           "limit of 67108864 bytes"),
              std::string::npos)
        << message;
  }
  store.set("small", "fine");  // the connection is still good
  EXPECT_EQ(store.get("small"), "fine");
}

// Before the token, the server reads no more than a handshake's worth.
TEST(TcpStore, StrangerAnnouncingAHugeHandshakeIsRefused) {
  TcpStoreServer server(kHost, 0, kToken);
  ::testing::internal::CaptureStderr();
  RawClient stranger(server.port());
  ASSERT_TRUE(stranger.send_all(store_protocol::Encoder().u32(1 << 20).bytes()));
  const std::optional<std::string> reply = stranger.read_frame();
  const bool closed = stranger.at_end();
  server.stop();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(reply, std::string(1, static_cast<char>(store_protocol::Status::kRefused)));
  EXPECT_TRUE(closed);
  EXPECT_NE(log.find("not a brigade store client (oversized handshake)"), std::string::npos) << log;
}

// A wait on 70,000 empty keys fits a frame (4 bytes each) but would cost the
// server ~32 bytes a key and a scan of them on every set: refused as
// malformed; the most a request may name still parses.
TEST(StoreProtocol, AKeyListOverTheLimitIsRefused) {
  using namespace store_protocol;
  auto wait_on = [](uint32_t keys) {
    return Encoder().op(Op::kWait).strs(std::vector<std::string>(keys)).i64(1000).frame();
  };
  const Parsed ok = parse_frame(wait_on(kMaxKeysPerRequest), true);
  ASSERT_EQ(ok.kind, Parsed::Kind::kRequest) << ok.error;
  EXPECT_EQ(ok.request.keys.size(), kMaxKeysPerRequest);
  const Parsed refused = parse_frame(wait_on(kMaxKeysPerRequest + 1), true);
  EXPECT_EQ(refused.kind, Parsed::Kind::kMalformed);
  EXPECT_NE(refused.error.find("keys in one request"), std::string::npos) << refused.error;
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
