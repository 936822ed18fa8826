// The /metrics server against well-behaved and hostile clients: the
// exposition text to a GET, status codes for everything else, and a stranger
// that connects and says nothing (or floods, or hangs up) delays no one.
#include "brigade/diag/metrics_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "testing/http_get.h"

namespace brigade::diag {
namespace BRIGADE_TEST_FILE {
using Clock = std::chrono::steady_clock;

class MetricsServerTest : public ::testing::Test {
 protected:
  std::atomic<int> scrapes_{0};
  MetricsServer server_{MetricsAddress{"127.0.0.1", 0}, [this] {
                          ++scrapes_;
                          return std::string("brigade_step{node=\"0\"} 7\n");
                        }};
};

TEST_F(MetricsServerTest, AnswersGetMetricsWithTheRenderedText) {
  ASSERT_GT(server_.port(), 0);
  EXPECT_EQ(server_.url(), "http://127.0.0.1:" + std::to_string(server_.port()) + "/metrics");
  const auto r = testing::http_get(server_.port(), "/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->head;
  EXPECT_EQ(r->body, "brigade_step{node=\"0\"} 7\n");
  EXPECT_NE(r->head.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(r->head.find("Content-Length: 25"), std::string::npos) << r->head;
  // Prometheus's own request: HTTP/1.1, headers, a query string.
  const auto p = testing::http_exchange(server_.port(),
                                        "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: "
                                        "text/plain\r\nUser-Agent: Prometheus\r\n\r\n");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 200);
  const auto head = testing::http_exchange(server_.port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
  EXPECT_EQ(scrapes_.load(), 3);
}

TEST_F(MetricsServerTest, RefusesWhatIsNotAScrape) {
  const std::pair<std::string, int> cases[] = {
      {"GET /other HTTP/1.1\r\n\r\n", 404},
      {"GET /metricsx HTTP/1.1\r\n\r\n", 404},
      {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405},
      {"garbage\r\n\r\n", 400},
      {"GET /metrics\r\n\r\n", 400},
      {"GET /metrics HTTP/2.0\r\n\r\n", 400},
      {"GET  /metrics HTTP/1.1\r\n\r\n", 400},
      {"GET metrics HTTP/1.1\r\n\r\n", 400},
      {std::string("GET /met\x01rics HTTP/1.1\r\n\r\n"), 400},
      {"GET /" + std::string(kMaxRequestBytes, 'a') + " HTTP/1.1\r\n\r\n", 431},
      {"GET /metrics HTTP/1.1\r\nX: " + std::string(kMaxRequestBytes, 'b') + "\r\n\r\n", 431},
      // No end of headers but over the limit: refused without waiting for more.
      {std::string(kMaxRequestBytes + 10, 'c'), 431},
  };
  for (const auto& [request, status] : cases) {
    const auto r = testing::http_exchange(server_.port(), request);
    ASSERT_TRUE(r) << request.substr(0, 40);
    EXPECT_EQ(r->status, status) << request.substr(0, 40);
  }
  EXPECT_EQ(scrapes_.load(), 0);
  const auto ok = testing::http_get(server_.port(), "/metrics");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

int connect_silently(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST_F(MetricsServerTest, SilentAndVanishingStrangersDelayNoScrape) {
  // Strangers holding every connection slot and more, saying nothing or half
  // a request, and one that hangs up mid-request.
  std::vector<int> strangers;
  for (int i = 0; i < kMaxClients + 8; ++i) {
    strangers.push_back(connect_silently(server_.port()));
    if (i % 2 == 1) ::send(strangers.back(), "GET /met", 8, MSG_NOSIGNAL);
  }
  const int quitter = connect_silently(server_.port());
  ::send(quitter, "GET /metrics HT", 15, MSG_NOSIGNAL);
  ::close(quitter);
  // A scrape while they hold every slot: the oldest stranger makes room, and
  // the answer comes at once, not after the strangers' read timeout.
  const auto start = Clock::now();
  const auto r = testing::http_get(server_.port(), "/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(kReadTimeoutMs - 1000));
  for (int fd : strangers) ::close(fd);
  EXPECT_EQ(scrapes_.load(), 1);
}

TEST_F(MetricsServerTest, DropsASilentConnectionAfterTheReadTimeout) {
  const int fd = connect_silently(server_.port());
  const auto start = Clock::now();
  char byte;
  // The server closes it: recv sees the end (no response, nothing was asked).
  timeval tv{kReadTimeoutMs / 1000 + 30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(kReadTimeoutMs - 100));
  ::close(fd);
}

TEST(MetricsServer, ARenderErrorIsA500AndTheServerGoesOn) {
  int calls = 0;
  MetricsServer server(MetricsAddress{"127.0.0.1", 0}, [&]() -> std::string {
    if (calls++ == 0) throw std::runtime_error("no status yet");
    return "up 1\n";
  });
  const auto first = testing::http_get(server.port(), "/metrics");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 500);
  EXPECT_EQ(first->body, "no status yet\n");
  const auto second = testing::http_get(server.port(), "/metrics");
  ASSERT_TRUE(second);
  EXPECT_EQ(second->status, 200);
}

TEST(MetricsServer, ATakenPortIsAnErrorNamingTheFix) {
  MetricsServer first(MetricsAddress{"127.0.0.1", 0}, [] { return std::string(); });
  try {
    MetricsServer second(MetricsAddress{"127.0.0.1", first.port()}, [] { return std::string(); });
    FAIL() << "bound a taken port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--metrics"), std::string::npos) << e.what();
  }
}

TEST(MetricsAddress, ParsesHostAndPortAndRefusesTheRest) {
  EXPECT_EQ(parse_metrics_address("127.0.0.1:9464").host, "127.0.0.1");
  EXPECT_EQ(parse_metrics_address("127.0.0.1:9464").port, 9464);
  EXPECT_EQ(parse_metrics_address("[::1]:0").host, "::1");
  EXPECT_EQ(parse_metrics_address("localhost:80").port, 80);
  for (const char* bad : {"", "9464", ":9464", "host:", "host:x", "host:65536", "host:-1",
                          "::1:9464", "[::1]9464", "host:12 "}) {
    EXPECT_THROW(parse_metrics_address(bad), Error) << bad;
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::diag
