// The coordinator's etcd backend (elastic/etcd_store.h) against a real etcd
// the test starts on loopback with authentication on
// (tests/testing/etcd_server.h); skipped, saying so, without etcd.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/elastic/coordinator.h"
#include "brigade/elastic/etcd_store.h"
#include "testing/etcd_server.h"
#include "testing/http_get.h"

namespace brigade::elastic {
namespace BRIGADE_TEST_FILE {

using testing::EtcdServer;
constexpr char kToken[] = "etcd-store-test-token";
constexpr char kOtherToken[] = "another-jobs-token";

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::etcd_installed()) GTEST_SKIP() << testing::etcd_skip_reason();
    etcd_ = std::make_unique<EtcdServer>();
    ASSERT_TRUE(etcd_->ok());
    ASSERT_TRUE(etcd_->add_job(etcd_user(kToken), kToken, etcd_prefix(kToken)));
  }
  std::unique_ptr<EtcdCoordinatorStore> store(const std::string& token = kToken,
                                              int64_t timeout_ms = 1'000) {
    return std::make_unique<EtcdCoordinatorStore>(std::vector<std::string>{etcd_->url()}, token,
                                                  timeout_ms);
  }
  std::unique_ptr<EtcdServer> etcd_;
};

// A loopback listener that accepts connections and never answers: an etcd
// cut off mid-call, as curl sees it.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(fd_, 16);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Answers every request on one connection at a time: authenticate with a
// token, anything else with `body` (HTTP 200): a peer that is not etcd.
class FakeEtcd {
 public:
  explicit FakeEtcd(std::string body) : body_(std::move(body)) {
    thread_ = std::thread([this] {
      while (true) {
        const int c = ::accept(listener_.fd(), nullptr, nullptr);
        if (c < 0 || stop_) {
          if (c >= 0) ::close(c);
          return;
        }
        std::string request;
        char buf[4096];
        ssize_t n;
        // Reads until the body arrived (curl sends a small POST at once).
        while ((n = ::read(c, buf, sizeof(buf))) > 0) {
          request.append(buf, static_cast<size_t>(n));
          const size_t head = request.find("\r\n\r\n");
          const size_t cl = request.find("Content-Length: ");
          if (head != std::string::npos && cl != std::string::npos &&
              request.size() >= head + 4 + std::stoul(request.substr(cl + 16))) {
            const std::string body = request.find("/v3/auth/authenticate") != std::string::npos
                                         ? std::string(R"({"header":{},"token":"t"})")
                                         : body_;
            const std::string reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" +
                                      std::string("Content-Length: ") +
                                      std::to_string(body.size()) + "\r\n\r\n" + body;
            if (::write(c, reply.data(), reply.size()) < 0) break;
            request.clear();
          }
        }
        ::close(c);
      }
    });
  }
  ~FakeEtcd() {
    stop_ = true;
    ::shutdown(listener_.fd(), SHUT_RDWR);
    thread_.join();
  }
  std::string url() const { return listener_.url(); }

 private:
  SilentListener listener_;
  std::string body_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(EtcdStoreTest, SetGetAndAnAbsentKey) {
  auto s = store();
  EXPECT_EQ(s->try_get("brigade/coord/end"), std::nullopt);
  s->set("brigade/coord/end", R"({"why":"done"})");
  EXPECT_EQ(s->try_get("brigade/coord/end"), R"({"why":"done"})");
  s->set("brigade/coord/empty", "");
  EXPECT_EQ(s->try_get("brigade/coord/empty"), "");
  const std::string bytes("a\0b\xff\n", 5);
  s->set("brigade/coord/bytes", bytes);
  EXPECT_EQ(s->try_get("brigade/coord/bytes"), bytes);
  EXPECT_EQ(s->add("brigade/coord/counter", 0), 0);
  EXPECT_EQ(s->add("brigade/coord/counter", 5), 5);
  EXPECT_EQ(s->add("brigade/coord/counter", -2), 3);
  EXPECT_EQ(s->try_get("brigade/coord/counter"), "3");
  s->set("brigade/coord/text", "seven");
  EXPECT_THROW(s->add("brigade/coord/text", 1), Error);
  EXPECT_NE(s->address().find(etcd_->url()), std::string::npos);
}

// Two agents adding to one counter at once: every add returns a sum no
// other add returned, and the total is all of them.
TEST_F(EtcdStoreTest, ConcurrentAddsFromTwoClientsLoseNoIncrement) {
  constexpr int kAdds = 150;
  auto a = store(), b = store();
  std::vector<int64_t> seen_a, seen_b;
  auto run = [](EtcdCoordinatorStore& s, std::vector<int64_t>& seen) {
    for (int i = 0; i < kAdds; ++i) seen.push_back(s.add("brigade/coord/end/claims", 1));
  };
  std::thread ta(run, std::ref(*a), std::ref(seen_a));
  std::thread tb(run, std::ref(*b), std::ref(seen_b));
  ta.join();
  tb.join();
  std::set<int64_t> all(seen_a.begin(), seen_a.end());
  all.insert(seen_b.begin(), seen_b.end());
  EXPECT_EQ(all.size(), 2u * kAdds);
  EXPECT_EQ(*all.rbegin(), 2 * kAdds);
  EXPECT_EQ(a->try_get("brigade/coord/end/claims"), std::to_string(2 * kAdds));
}

TEST_F(EtcdStoreTest, AWrongTokenOrNoTokenIsRefused) {
  try {
    store("not-the-token");
    ADD_FAILURE() << "a store without the job's token got in";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("refused user " + etcd_user("not-the-token")), std::string::npos) << what;
    EXPECT_NE(what.find("etcdctl user add " + etcd_user("not-the-token")), std::string::npos)
        << what;
  }
  // The same password under the job's user name: refused by etcd too.
  auto s = store();
  s->set("brigade/coord/run_dir", "/runs/a");
  const std::string key = etcd_prefix(kToken) + "brigade/coord/run_dir";
  const auto raw =
      testing::http_exchange(etcd_->port(),
                             "POST /v3/kv/range HTTP/1.0\r\nContent-Type: application/json\r\n"
                             "Content-Length: 2\r\n\r\n{}");
  ASSERT_TRUE(raw);
  EXPECT_NE(raw->status, 200) << raw->body;                      // no Authorization header
  EXPECT_EQ(raw->body.find("L3J1bnMvYQ=="), std::string::npos);  // "/runs/a"
}

TEST_F(EtcdStoreTest, TwoJobsOnOneEtcdNeverMeet) {
  ASSERT_TRUE(etcd_->add_job(etcd_user(kOtherToken), kOtherToken, etcd_prefix(kOtherToken)));
  auto a = store(), b = store(kOtherToken);
  a->set("brigade/coord/run_dir", "/runs/a");
  EXPECT_EQ(b->try_get("brigade/coord/run_dir"), std::nullopt);
  b->set("brigade/coord/run_dir", "/runs/b");
  EXPECT_EQ(a->add("brigade/coord/gen/0/reports", 1), 1);
  EXPECT_EQ(b->add("brigade/coord/gen/0/reports", 1), 1);
  EXPECT_EQ(a->try_get("brigade/coord/run_dir"), "/runs/a");
  EXPECT_EQ(b->try_get("brigade/coord/run_dir"), "/runs/b");
  EXPECT_NE(etcd_prefix(kToken), etcd_prefix(kOtherToken));
}

// Another job's user is allowed its own prefix only: etcd itself refuses it
// this job's keys, even by a client that asks for them by name.
TEST_F(EtcdStoreTest, AnotherJobsUserIsDeniedThisJobsPrefix) {
  const std::string intruder = "intruder-token";
  ASSERT_TRUE(etcd_->add_job(etcd_user(intruder), intruder, etcd_prefix(kToken) + "x/"));
  try {
    store(intruder);
    ADD_FAILURE() << "a user without the job's prefix got in";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("denied user " + etcd_user(intruder)), std::string::npos)
        << e.what();
  }
}

TEST_F(EtcdStoreTest, AnEtcdWithoutAuthenticationIsRefused) {
  EtcdServer open(/*auth=*/false);
  ASSERT_TRUE(open.ok());
  try {
    EtcdCoordinatorStore s({open.url()}, kToken, 1'000);
    ADD_FAILURE() << "an etcd anyone may write was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has authentication off"), std::string::npos) << e.what();
  }
}

// A hung endpoint costs one call at most its timeout; listed first, it
// costs its share and the next endpoint answers.
TEST_F(EtcdStoreTest, AHungEndpointTimesOutWithinTheCallTimeoutAndTheNextOneAnswers) {
  SilentListener hung;
  const auto start = std::chrono::steady_clock::now();
  try {
    EtcdCoordinatorStore s({hung.url()}, kToken, 800);
    ADD_FAILURE() << "a silent endpoint was taken for etcd";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no etcd endpoint answered"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(hung.url()), std::string::npos) << e.what();
  }
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(elapsed_ms, 700);
  EXPECT_LT(elapsed_ms, 800 + 1'500);  // a loaded machine's scheduling delay

  EtcdCoordinatorStore s({hung.url(), etcd_->url()}, kToken, 2'000);
  s.set("brigade/coord/run_dir", "/runs/a");
  EXPECT_EQ(s.try_get("brigade/coord/run_dir"), "/runs/a");
}

TEST_F(EtcdStoreTest, MalformedRepliesAreErrorsNamingTheEndpoint) {
  for (const std::string& body :
       {std::string("not json"), std::string(R"({"kvs":[]})"),
        std::string(R"({"header":{},"kvs":[{"key":"eA==","value":"MQ==","mod_revision":"1"}]})"),
        std::string(R"({"header":{},"kvs":[{"key":"eA==","value":"@@@=","mod_revision":"1"}]})"),
        std::string(R"({"header":{},"kvs":"x"})")}) {
    FakeEtcd fake(body);
    try {
      EtcdCoordinatorStore s({fake.url()}, kToken, 2'000);
      ADD_FAILURE() << "taken: " << body;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fake.url()), std::string::npos) << e.what();
    }
  }
}

TEST(EtcdEndpointsTest, EndpointListsAreCheckedNamingTheFix) {
  EXPECT_EQ(parse_etcd_endpoints("http://a:2379,https://b:2379/"),
            (std::vector<std::string>{"http://a:2379", "https://b:2379"}));
  for (const char* bad : {"", "a:2379", "http://a", "http://a:2379,", "ftp://a:1", "http://a:x"}) {
    try {
      parse_etcd_endpoints(bad);
      ADD_FAILURE() << "taken: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--rdzv-endpoints wants etcd's client URLs"),
                std::string::npos);
    }
  }
}

// The coordinator's decisions over etcd, as over the built-in store
// (coordinator_test.cc): a failure anywhere stops every node, all restart
// together, and a silent agent is named lost.
constexpr int64_t kMs = 1'000'000;

struct EtcdNode {
  EtcdNode(const std::string& url, int nnodes, int rank)
      : store(std::vector<std::string>{url}, kToken, 1'000) {
    CoordinatorOptions o;
    o.nnodes = nnodes;
    o.node_rank = rank;
    o.max_restarts = 3;
    coordinator = std::make_unique<Coordinator>(store, o, 0);
  }
  EtcdCoordinatorStore store;
  std::unique_ptr<Coordinator> coordinator;
};

TEST_F(EtcdStoreTest, TheCoordinatorRestartsEveryNodeTogetherOverEtcd) {
  EtcdNode n0(etcd_->url(), 2, 0), n1(etcd_->url(), 2, 1);
  int64_t t = 50 * kMs;
  EXPECT_EQ(n0.coordinator->poll(t).state, JobView::State::kRunning);
  EXPECT_EQ(n1.coordinator->poll(t).state, JobView::State::kRunning);
  Incident i;
  i.kind = "crash";
  i.rank = 3;
  i.signal = 9;
  i.what = "worker rank 3 was killed";
  n1.coordinator->report_failure(i);
  for (auto* n : {&n0, &n1}) {
    EXPECT_EQ(n->coordinator->poll(t += 100 * kMs).state, JobView::State::kFailing);
  }
  n1.coordinator->report_stopped(false);
  EXPECT_EQ(n0.coordinator->poll(t += 100 * kMs).state, JobView::State::kFailing);
  n0.coordinator->report_stopped(false);
  n0.coordinator->poll(t += 100 * kMs);
  for (auto* n : {&n0, &n1}) {
    const JobView v = n->coordinator->poll(t += 100 * kMs);
    ASSERT_EQ(v.state, JobView::State::kRestart);
    ASSERT_TRUE(v.cause);
    EXPECT_EQ(v.cause->node, 1);
    n->coordinator->enter_next_generation();
    EXPECT_EQ(n->coordinator->generation(), 1);
  }
  n0.coordinator->report_stopped(true);
  n1.coordinator->report_stopped(true);
  EXPECT_EQ(n0.coordinator->poll(t += 100 * kMs).state, JobView::State::kSucceeded);
  EXPECT_EQ(n1.coordinator->poll(t += 100 * kMs).state, JobView::State::kSucceeded);
}

TEST_F(EtcdStoreTest, TheCoordinatorNamesASilentAgentLostOverEtcd) {
  EtcdNode n0(etcd_->url(), 2, 0), n1(etcd_->url(), 2, 1);
  int64_t t = 0;
  for (; t <= 1'000 * kMs; t += 100 * kMs) {
    n1.coordinator->poll(t);
    EXPECT_EQ(n0.coordinator->poll(t).state, JobView::State::kRunning);
  }
  for (; t <= 3'000 * kMs; t += 100 * kMs) {
    EXPECT_EQ(n0.coordinator->poll(t).state, JobView::State::kRunning) << t / kMs;
  }
  const JobView v = n0.coordinator->poll(t);
  ASSERT_EQ(v.state, JobView::State::kEnded);
  EXPECT_EQ(v.lost_node, 1);
  EXPECT_EQ(n1.coordinator->poll(t).state, JobView::State::kEnded);
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade::elastic
