// The coordinator's state in etcd (`brigade launch --rdzv-backend etcd
// --rdzv-endpoints URL[,URL]`), through etcd's v3 JSON gateway over HTTP
// (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn; libcurl does the HTTP).
//
// Only holders of the job's token get in, through etcd's own
// authentication: the token is the password of the job's etcd user,
// etcd_user(token) ("brigade-" and 16 hex digits of the token's hash), whose
// role may read and write only the job's prefix, etcd_prefix(token)
// ("brigade/<same digits>/"). Every key lives under that prefix, so two jobs
// on one etcd never meet. An operator sets a job up once, as etcd's root:
//   etcdctl user add brigade-<id> --new-user-password="$BRIGADE_RDZV_TOKEN"
//   etcdctl role add brigade-<id>
//   etcdctl role grant-permission brigade-<id> readwrite --prefix=true brigade/<id>/
//   etcdctl user grant-role brigade-<id> brigade-<id>
// (`brigade launch` prints these lines with <id> filled in when etcd refuses
// the user). An etcd without authentication is refused: anyone who reaches
// it could change the job's decisions.
//
// Every call, retries included, ends within call_timeout_ms or throws
// Error: each endpoint is tried in turn with a share of the time left (one
// that is down or cut off costs its share, not the whole call). add() is a
// compare-and-swap loop (read the counter and its mod_revision, write the
// sum in a transaction only if the key has not changed since), so no
// increment is lost between agents. Replies are checked as they are read: a
// malformed one is an Error naming the endpoint and what was wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "brigade/elastic/coordinator.h"

namespace brigade::elastic {

// The job's id in etcd, its user and its key prefix (see above).
std::string etcd_job_id(const std::string& token);
std::string etcd_user(const std::string& token);
std::string etcd_prefix(const std::string& token);

// "http://h:2379,http://h2:2379" -> the URLs; throws Error naming the fix for
// an empty list or an entry that is not http(s)://HOST:PORT.
std::vector<std::string> parse_etcd_endpoints(const std::string& text);

class EtcdCoordinatorStore : public CoordinatorStore {
 public:
  // Authenticates as the job's user at the first endpoint that answers.
  // Throws Error naming the fix when none answers within call_timeout_ms,
  // when etcd refuses the user or its password, or has authentication off.
  EtcdCoordinatorStore(std::vector<std::string> endpoints, const std::string& token,
                       int64_t call_timeout_ms);
  ~EtcdCoordinatorStore() override;
  EtcdCoordinatorStore(const EtcdCoordinatorStore&) = delete;
  EtcdCoordinatorStore& operator=(const EtcdCoordinatorStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string address() const override;
  int64_t call_timeout_ms() const override { return call_timeout_ms_; }
  // Deletes every key under the job's prefix: what an earlier job under the
  // same token left (its `end` would end this one at once). Node 0 calls it
  // before it hosts the launchers' rendezvous, so before any agent writes.
  void clear();

  struct Connection;  // one endpoint's curl handle and auth token

 private:
  struct Value {
    std::string value;
    int64_t mod_revision = 0;
  };
  std::optional<Value> range(const std::string& key, int64_t deadline_ns);
  // POSTs `body` to `path` at the endpoints in turn (the one that answered
  // last first), authenticating where needed, within the deadline; returns
  // the reply's JSON text. Throws Error if none answered.
  std::string call(const std::string& path, const std::string& body, int64_t deadline_ns);

  std::vector<std::string> endpoints_;
  std::string user_;
  std::string password_;
  std::string prefix_;
  int64_t call_timeout_ms_;
  std::mutex mutex_;  // one call at a time over the connections
  std::vector<std::unique_ptr<Connection>> connections_;
  size_t current_ = 0;  // the endpoint that answered last
};

}  // namespace brigade::elastic
