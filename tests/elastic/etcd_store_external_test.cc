// The coordinator's etcd backend (elastic/etcd_store.h) against a real etcd
// the test starts on loopback with authentication on
// (tests/testing/etcd_server.h); skipped, saying so, without etcd.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
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
constexpr char kRun[] = "0123456789abcdef";  // a run as node 0 draws one (own())

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::etcd_installed()) GTEST_SKIP() << testing::etcd_skip_reason();
    etcd_ = std::make_unique<EtcdServer>();
    ASSERT_TRUE(etcd_->ok());
    ASSERT_TRUE(etcd_->add_job(etcd_user(kToken), kToken, etcd_prefix(kToken)));
  }
  // In run kRun; with an empty run, in none yet. Calls get 5 s: etcd's
  // authentication and disk syncs on a loaded machine can pass one second,
  // and these tests do not measure the timeout.
  std::unique_ptr<EtcdCoordinatorStore> store(const std::string& token = kToken,
                                              int64_t timeout_ms = 5'000,
                                              const std::string& run = kRun) {
    auto s = std::make_unique<EtcdCoordinatorStore>(std::vector<std::string>{etcd_->url()}, token,
                                                    timeout_ms);
    if (!run.empty()) s->use_run(run);
    return s;
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

// Answers every request on one connection at a time through `answer`:
// the request's text in, the reply's HTTP status and body out, or nullopt to
// close the connection without a reply. By default authenticate gets a
// token and anything else `body` (HTTP 200): a peer that is not etcd.
class FakeEtcd {
 public:
  using Answer = std::function<std::optional<std::pair<int, std::string>>(const std::string&)>;
  explicit FakeEtcd(std::string body)
      : FakeEtcd([body](const std::string& request) {
          return std::make_optional(
              std::make_pair(200, is_authenticate(request) ? kTokenReply : body));
        }) {}
  explicit FakeEtcd(Answer answer) : answer_(std::move(answer)) {
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
            const auto answer = answer_(request);
            if (!answer) break;
            const std::string reply =
                fmt::format("HTTP/1.1 {} X\r\nContent-Type: application/json\r\n", answer->first) +
                std::string("Content-Length: ") + std::to_string(answer->second.size()) +
                "\r\n\r\n" + answer->second;
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

  static constexpr char kTokenReply[] = R"({"header":{},"token":"t"})";
  static bool is_authenticate(const std::string& request) {
    return request.find("/v3/auth/authenticate") != std::string::npos;
  }

 private:
  SilentListener listener_;
  Answer answer_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Passes a request on to the etcd at `port` as is (HTTP/1.0, so etcd
// closes once it answered); its status and body.
std::optional<std::pair<int, std::string>> forward(int port, std::string request) {
  const size_t version = request.find(" HTTP/1.1\r\n");
  if (version != std::string::npos) request.replace(version, 11, " HTTP/1.0\r\n");
  const auto r = testing::http_exchange(port, request);
  if (!r) return std::nullopt;
  return std::make_pair(r->status, r->body);
}

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
  // A client without etcd's auth token (no Authorization header): refused,
  // and shown none of the job's values.
  auto s = store();
  s->set("brigade/coord/run_dir", "/runs/a");
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
// this job's keys, even to a client that asks for them by name.
TEST_F(EtcdStoreTest, AnotherJobsUserIsDeniedThisJobsPrefix) {
  const std::string intruder = "intruder-token-of-another-job";
  ASSERT_TRUE(etcd_->add_job(etcd_user(intruder), intruder, etcd_prefix(intruder)));
  store(intruder);  // its own prefix: taken
  store()->set("brigade/coord/run_dir", "/runs/secret");
  const std::string key = etcd_prefix(kToken) + kRun + "/brigade/coord/run_dir";
  std::string text;
  // The job's own user reads it (the key is right)...
  ASSERT_EQ(etcd_->run_etcdctl({"--user=" + etcd_user(kToken) + ":" + kToken, "get", key},
                               /*as_root=*/false, text),
            0)
      << text;
  EXPECT_NE(text.find("/runs/secret"), std::string::npos) << text;
  // ...the other job's user does not.
  EXPECT_NE(etcd_->run_etcdctl({"--user=" + etcd_user(intruder) + ":" + intruder, "get", key},
                               /*as_root=*/false, text),
            0)
      << text;
  EXPECT_NE(text.find("permission denied"), std::string::npos) << text;
  EXPECT_EQ(text.find("/runs/secret"), std::string::npos) << text;
  // A user allowed only part of the job's prefix is refused at the start.
  const std::string partial = "partial-token-of-another-job";
  ASSERT_TRUE(etcd_->add_job(etcd_user(partial), partial, etcd_prefix(partial) + "x/"));
  try {
    store(partial);
    ADD_FAILURE() << "a user without the job's prefix got in";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("denied user " + etcd_user(partial)), std::string::npos)
        << e.what();
  }
}

// One token, one job at a time: while node 0 of a job holds the token's
// prefix a second job's node 0 is refused; after the first ends, a new run
// starts without the older run's keys, and a straggler of the older run
// (a node 1 whose node 0 is gone) writes nothing the new run reads.
TEST_F(EtcdStoreTest, ASecondJobUnderTheTokenIsRefusedAndAnOlderRunNeverReachesTheNewOne) {
  auto first = store(kToken, 5'000, "");
  const std::string run1 = first->own();
  first->set("brigade/coord/run_dir", "/runs/1");
  auto straggler = store(kToken, 5'000, run1);
  EXPECT_EQ(straggler->try_get("brigade/coord/run_dir"), "/runs/1");
  try {
    store(kToken, 5'000, "")->own();
    ADD_FAILURE() << "a second job took the token's prefix while the first runs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another job with this token is running"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(first->try_get("brigade/coord/run_dir"), "/runs/1");  // the refusal wiped nothing
  first.reset();                                                  // the first job ends

  auto next = store(kToken, 5'000, "");
  const std::string run2 = next->own();
  EXPECT_NE(run2, run1);
  EXPECT_EQ(next->try_get("brigade/coord/run_dir"), std::nullopt);
  EXPECT_EQ(straggler->try_get("brigade/coord/run_dir"), std::nullopt);  // older runs deleted
  straggler->set(coordinator_key("end"), R"({"why":"an older run ended"})");
  EXPECT_EQ(straggler->add(coordinator_key("gen/0/reports"), 1), 1);
  EXPECT_EQ(next->try_get(coordinator_key("end")), std::nullopt);
  EXPECT_EQ(next->add(coordinator_key("gen/0/reports"), 0), 0);
  EXPECT_THROW(store(kToken, 5'000, "")->use_run("../other"), Error);
}

// Node 0 gone (its owner key with it) while node 1 leads the run: a
// relaunch under the token is refused, naming the leader key, and deletes
// none of the running job's keys; once that leader is gone too, it starts.
TEST_F(EtcdStoreTest, ARelaunchIsRefusedWhileAnotherNodeLeadsTheRunAfterNodeZeroIsGone) {
  auto node0 = store(kToken, 5'000, "");
  const std::string run = node0->own();
  auto node1 = store(kToken, 5'000, run);
  node1->grant_lease(30);
  ASSERT_TRUE(node1->campaign("1").ours);
  node1->set("brigade/coord/gen/1/open", "1");
  node0.reset();  // node 0's owner key is gone
  try {
    store(kToken, 5'000, "")->own();
    ADD_FAILURE() << "a relaunch took the token's prefix while node 1 leads its job";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("another job with this token is running"), std::string::npos) << what;
    EXPECT_NE(what.find(etcd_prefix(kToken) + run + "/leader"), std::string::npos) << what;
    EXPECT_NE(what.find("stop that job first"), std::string::npos) << what;
  }
  EXPECT_EQ(node1->try_get("brigade/coord/gen/1/open"), "1");  // the refusal wiped nothing
  ASSERT_TRUE(node1->leader().has_value());
  node1->revoke_lease();  // the leader ends: its key goes with its lease
  EXPECT_NO_THROW(store(kToken, 5'000, "")->own());
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
  EXPECT_LT(elapsed_ms, 800 + 4'000);  // a loaded machine's scheduling delay

  EtcdCoordinatorStore s({hung.url(), etcd_->url()}, kToken, 2'000);
  s.use_run(kRun);
  s.set("brigade/coord/run_dir", "/runs/a");
  EXPECT_EQ(s.try_get("brigade/coord/run_dir"), "/runs/a");
}

std::string base64(const std::string& in) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    if (i + 2 < in.size()) v |= uint8_t(in[i + 2]);
    out += kDigits[v >> 18];
    out += kDigits[(v >> 12) & 63];
    out += i + 1 < in.size() ? kDigits[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kDigits[v & 63] : '=';
  }
  return out;
}

TEST_F(EtcdStoreTest, MalformedRepliesAreErrorsNamingTheEndpoint) {
  // What the store reads first: the job's owner key.
  const std::string key = base64(etcd_prefix(kToken) + "owner");
  for (const std::string& body :
       {std::string("not json"), std::string(R"({"kvs":[]})"),
        std::string(R"({"header":{},"kvs":[{"key":"eA==","value":"MQ==","mod_revision":"1"}]})"),
        R"({"header":{},"kvs":[{"key":")" + key + R"(","value":"@@@=","mod_revision":"1"}]})",
        R"({"header":{},"kvs":[{"key":")" + key + R"(","value":"MQ==","mod_revision":"x1"}]})",
        R"({"header":{},"kvs":[{"key":")" + key + R"(","value":"MQ=="}]})",
        std::string(R"({"header":{},"kvs":"x"})")}) {
    FakeEtcd fake(body);
    try {
      EtcdCoordinatorStore s({fake.url()}, kToken, 2'000);
      ADD_FAILURE() << "taken: " << body;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fake.url()), std::string::npos) << e.what();
    }
  }
  // The right key, well formed: taken (so the ones above failed for their fault).
  FakeEtcd good(R"({"header":{},"kvs":[{"key":")" + key +
                R"(","value":"MQ==","mod_revision":"1"}]})");
  EXPECT_NO_THROW(EtcdCoordinatorStore({good.url()}, kToken, 2'000));

  // Replies to a put and a transaction are checked too.
  for (const std::string& reply : {std::string("not json"), std::string(R"({"succeeded":true})"),
                                   std::string(R"({"header":{},"succeeded":"yes"})")}) {
    FakeEtcd fake([&reply](const std::string& request) {
      const bool range = request.find("/v3/kv/range") != std::string::npos;
      return std::make_optional(std::make_pair(200, FakeEtcd::is_authenticate(request)
                                                        ? std::string(FakeEtcd::kTokenReply)
                                                    : range ? std::string(R"({"header":{}})")
                                                            : reply));
    });
    EtcdCoordinatorStore s({fake.url()}, kToken, 2'000);
    s.use_run(kRun);
    if (reply.find("succeeded") == std::string::npos) {
      try {
        s.set("brigade/coord/run_dir", "/runs/a");
        ADD_FAILURE() << "a put's reply taken: " << reply;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("the reply is not etcd's"), std::string::npos)
            << e.what();
      }
    }
    try {
      s.add("brigade/coord/gen/0/reports", 1);
      ADD_FAILURE() << "a transaction's reply taken: " << reply;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fake.url()), std::string::npos) << e.what();
    }
  }
}

// etcd refuses a token issued before its users or roles changed (HTTP 400,
// "revision of auth store is old") or that a restarted member forgot ("user
// name is empty"): the store authenticates again and the call goes through.
// Another 400 is the caller's.
TEST(EtcdAuthTest, AStaleTokenIsRenewedAndTheCallRetriedOnce) {
  for (const std::string why :
       {"etcdserver: revision of auth store is old", "etcdserver: user name is empty",
        "etcdserver: key is not provided"}) {
    std::atomic<int> authenticated{0}, answered{0};
    FakeEtcd fake([&](const std::string& request) {
      if (FakeEtcd::is_authenticate(request)) {
        ++authenticated;
        return std::make_optional(std::make_pair(200, std::string(FakeEtcd::kTokenReply)));
      }
      if (answered++ == 0) {
        return std::make_optional(
            std::make_pair(400, fmt::format(R"({{"error":"{0}","message":"{0}","code":3}})", why)));
      }
      return std::make_optional(std::make_pair(200, std::string(R"({"header":{}})")));
    });
    if (why.find("not provided") != std::string::npos) {
      EXPECT_THROW(EtcdCoordinatorStore({fake.url()}, kToken, 2'000), Error);
      EXPECT_EQ(authenticated, 1);
    } else {
      EXPECT_NO_THROW(EtcdCoordinatorStore({fake.url()}, kToken, 2'000)) << why;
      EXPECT_EQ(authenticated, 2) << why;
      EXPECT_EQ(answered, 2) << why;
    }
  }
}

// Node 0's hold on the token outlives its lease's term (kept alive: etcd
// sees the lease's time left go up again), and ends with it: the next job
// takes the token at once.
TEST_F(EtcdStoreTest, NodeZerosHoldIsKeptAliveAndReleasedAtItsEnd) {
  auto first = store(kToken, 5'000, "");
  first->own();
  std::string text;
  ASSERT_EQ(etcd_->run_etcdctl({"get", etcd_prefix(kToken) + "owner", "-w", "json"},
                               /*as_root=*/true, text),
            0)
      << text;
  const size_t at = text.find("\"lease\":");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string lease = fmt::format("{:x}", std::stoll(text.substr(at + 8)));
  int64_t last = EtcdCoordinatorStore::kOwnerLeaseTtlS + 1;
  bool renewed = false;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::seconds(3 * EtcdCoordinatorStore::kOwnerLeaseTtlS);
  while (!renewed && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(etcd_->run_etcdctl({"lease", "timetolive", lease}, /*as_root=*/true, text), 0)
        << text;
    const size_t left = text.find("remaining(");
    ASSERT_NE(left, std::string::npos) << "the lease ran out: " << text;
    const int64_t remaining = std::stoll(text.substr(left + 10));
    renewed = remaining > last;
    last = remaining;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // polling
  }
  EXPECT_TRUE(renewed) << "etcd's lease on the owner key was never renewed: " << text;
  first.reset();
  EXPECT_NO_THROW(store(kToken, 5'000, "")->own());
}

// An add that etcd applied but whose reply was lost (its endpoint cut off
// after passing the transaction on) is sent again to the next endpoint,
// where the key changed: it is applied once, and returns its sum.
TEST_F(EtcdStoreTest, AnAddWhoseReplyWasLostIsAppliedOnce) {
  std::atomic<bool> drop{false};
  const int port = etcd_->port();
  FakeEtcd proxy([&drop, port](const std::string& request) {
    auto reply = forward(port, request);
    if (request.find("/v3/kv/txn") != std::string::npos && drop.exchange(false)) {
      return std::optional<std::pair<int, std::string>>();
    }
    return reply;
  });
  auto other = store();
  EXPECT_EQ(other->add("brigade/coord/n", 5), 5);
  for (const char* key : {"brigade/coord/n", "brigade/coord/fresh"}) {
    EtcdCoordinatorStore s({proxy.url(), etcd_->url()}, kToken, 5'000);  // the proxy first
    s.use_run(kRun);
    drop = true;
    const int64_t expected = std::string(key) == "brigade/coord/n" ? 6 : 1;
    EXPECT_EQ(s.add(key, 1), expected) << key;
    EXPECT_FALSE(drop) << "the transaction did not go through the proxy";
    EXPECT_EQ(other->try_get(key), std::to_string(expected)) << key;
    EXPECT_EQ(s.add(key, 1), expected + 1) << key;
  }
}

// An etcd electing a new leader answers 503 for a moment ("etcdserver:
// leader changed"): the call is tried again within its time, so that one
// failed call is not taken for lost contact.
TEST_F(EtcdStoreTest, ACallThatFailsDuringAnEtcdElectionIsTriedAgainWithinItsTime) {
  std::atomic<int> failing{0};
  const int port = etcd_->port();
  FakeEtcd proxy([&failing, port](const std::string& request) {
    if (!FakeEtcd::is_authenticate(request) && failing > 0) {
      --failing;
      return std::make_optional(
          std::make_pair(503, std::string(R"({"error":"etcdserver: leader changed","code":14})")));
    }
    return forward(port, request);
  });
  EtcdCoordinatorStore s({proxy.url()}, kToken, 5'000);
  s.use_run(kRun);
  failing = 3;
  EXPECT_NO_THROW(s.set("brigade/coord/run_dir", "/runs/a"));
  EXPECT_EQ(failing, 0);
  EXPECT_EQ(store()->try_get("brigade/coord/run_dir"), "/runs/a");
}

// The connection kept open between calls is closed in the workers the
// launcher starts.
TEST_F(EtcdStoreTest, TheConnectionToEtcdIsNotInheritedAcrossExec) {
  auto s = store();
  s->set("brigade/coord/run_dir", "/runs/a");
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
        peer.sin_family != AF_INET || ntohs(peer.sin_port) != etcd_->port()) {
      continue;
    }
    ++seen;
    EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "fd " << fd;
  }
  EXPECT_GE(seen, 1);
}

TEST(EtcdEndpointsTest, EndpointListsAreCheckedNamingTheFix) {
  EXPECT_EQ(parse_etcd_endpoints("http://a:2379,https://b:2379/"),
            (std::vector<std::string>{"http://a:2379", "https://b:2379"}));
  try {
    parse_etcd_endpoints("http://root:s3cret@a:2379");
    ADD_FAILURE() << "credentials in a URL taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("user:password@ is refused"), std::string::npos);
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
  }
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
    store.use_run(kRun);
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
