// The rendezvous store: one server in the test process, clients in forked
// processes (as workers will be) or threads, everything on 127.0.0.1.
#include "brigade/comm/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "testing/free_port.h"

namespace brigade {
namespace {
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
  TcpStore reader(kHost, server.port(), kToken, 5000);
  auto value = std::async(std::launch::async, [&] { return reader.get("late"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
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
    EXPECT_LT(elapsed_ms, 1300);
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
  const pid_t client = fork_client([&] {
    TcpStore store(kHost, port, kToken, 5000);
    store.set("hello", "from a client that came early");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  TcpStoreServer server(kHost, port, kToken);
  EXPECT_EQ(wait_client(client), 0);
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
    EXPECT_LT(ms_since(start), 1200);
    EXPECT_NE(std::string(e.what()).find("cannot reach the rendezvous store at 127.0.0.1:"),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, StoppingTheServerFailsABlockedGetInsteadOfHangingIt) {
  TcpStoreServer server(kHost, 0, kToken);
  TcpStore store(kHost, server.port(), kToken, 10'000);
  auto blocked = std::async(std::launch::async, [&] { return store.get("never"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  server.stop();
  EXPECT_THROW(blocked.get(), Error);
  EXPECT_LT(ms_since(start), 1000);
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

}  // namespace
}  // namespace brigade
