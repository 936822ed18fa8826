// The coordinator's state in etcd (`brigade launch --rdzv-backend etcd
// --rdzv-endpoints URL[,URL]`), through etcd's v3 JSON gateway over HTTP
// (POST /v3/kv/range, /v3/kv/put, /v3/kv/txn; libcurl does the HTTP).
//
// Only holders of the job's token get in, through etcd's own
// authentication: the token is the password of the job's etcd user,
// etcd_user(token) ("brigade-" and 16 hex digits of the token's hash), whose
// role may read and write only the job's prefix, etcd_prefix(token)
// ("brigade/<same digits>/"). Every key lives under that prefix, so two jobs
// on one etcd never meet. An operator sets a job up once, as etcd's root
// (the token piped in, never on a command line `ps` shows):
//   printf %s "$BRIGADE_RDZV_TOKEN" | etcdctl user add brigade-<id> --interactive=false
//   etcdctl role add brigade-<id>
//   etcdctl role grant-permission brigade-<id> readwrite --prefix=true brigade/<id>/
//   etcdctl user grant-role brigade-<id> brigade-<id>
// (`brigade launch` prints these lines with <id> filled in when etcd refuses
// the user). An etcd without authentication is refused: anyone who reaches
// it could change the job's decisions.
//
// One token, one job at a time: node 0 owns the prefix while its job runs,
// through brigade/<id>/owner, created only if absent and attached to a lease
// it keeps alive (own()); a second job under the same token is refused
// until the first ends (its lease is revoked) or its node 0 dies (the lease
// runs out, kOwnerLeaseTtlS) and no other node leads it (no run's leader
// key is left, etcd_election.cc). Each run keeps its keys under
// brigade/<id>/<run id>/, a run id node 0 draws and the other launchers get
// through the rendezvous (use_run()), so a dead run's straggling agent
// (its `end`, its beats) never writes into a later run's keys; node 0
// deletes older runs' keys as it takes the prefix.
//
// etcd keeps every revision until compacted: run it with auto-compaction
// (--auto-compaction-mode periodic --auto-compaction-retention 1h), else
// the agents' beats grow its database until it hits its quota and refuses
// writes.
//
// Every call, retries included, ends within call_timeout_ms or throws
// Error: each endpoint is tried in turn with a share of the time left (one
// that is down or cut off costs its share, not the whole call). The time
// starts when the call is made: a call that waits for another thread's
// (calls go one at a time) spends its own time waiting. A host name is
// resolved within the share too, and a lookup still hanging at its end is
// abandoned, not waited for (CURLOPT_QUICK_EXIT, libcurl 7.87 or newer;
// older ones wait for the system's resolver). Endpoints that failed at
// once (refused, or an etcd without a leader for a moment) are tried again,
// 50 ms apart, while the call's time lasts, so that an etcd election
// shorter than a call timeout is ridden out; a call that fails all the
// same ends the job as lost contact (coordinator.h's poll). add() is a
// compare-and-swap loop (read the counter and its mod_revision, write the
// sum in a transaction only if the key has not changed since), so no
// increment is lost between agents; the same transaction writes the sum
// and the add's sequence number under <key>/last/<client>, which tells an
// add whose reply was lost (and that call() sent again to the next
// endpoint) that it landed, so it is applied once. Replies are checked as
// they are read: a malformed one is an Error naming the endpoint and what
// was wrong.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
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

  static constexpr int64_t kOwnerLeaseTtlS = 10;

  // Node 0: takes the job's prefix for a new run (a fresh run id, returned)
  // and keeps it until destroyed; deletes older runs' keys. Throws Error if
  // another job under this token holds it.
  std::string own();
  // Every other launcher: the run node 0 drew (use_run's id from own(),
  // through the rendezvous). Throws Error for an id own() cannot have drawn.
  void use_run(const std::string& run_id);
  const std::string& run_id() const { return run_id_; }

  // Keys are the run's: set, try_get and add throw Error before own() or
  // use_run().
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string address() const override;
  int64_t call_timeout_ms() const override { return call_timeout_ms_; }
  struct Connection;  // one endpoint's curl handle and auth token

  // Leader election (elastic/etcd_election.cc), so that any node's agent
  // may lead the job, not node 0's only.
  // This client's own lease, which its leadership is bound to: granted
  // once for ttl_s (etcd raises it to its minimum, about 2 s), renewed by
  // renew_lease() on the agent's beat. An agent that stops beating (dead,
  // hung, cut off) loses it within its TTL, and its leadership with it.
  // Throws Error if etcd does not answer.
  void grant_lease(int64_t ttl_s);
  // False once the lease expired (etcd forgot it): whatever this client
  // led, another may lead now. Throws Error if etcd does not answer.
  bool renew_lease() override;
  // Gives the lease up (an agent leaving): the next leader need not wait
  // out its TTL. Errors are ignored: the lease then runs out by itself.
  void revoke_lease();
  struct Leader {
    std::string holder;    // the leader key's value: the candidate that took it
    bool ours = false;     // bound to this client's lease
    int64_t revision = 0;  // the key's create revision: one per leadership
  };
  // Makes `candidate` the run's leader (its key "leader", created only if
  // absent, bound to this client's lease: grant_lease() first) unless
  // another leads; returns who leads. Once this client leads, every later
  // set() and add() of it is fenced by that leadership: applied only while
  // the leader key is still the one it created (the same create revision,
  // in the same transaction), else refused with NotLeader, so that a
  // leader that was cut off and replaced cannot overwrite its successor's
  // decisions. Throws Error if etcd does not answer.
  Leader campaign(const std::string& candidate);
  // Who leads now; nullopt while nobody does.
  std::optional<Leader> leader();
  // The coordinator's election (CoordinatorStore): the leader key holds
  // the node's rank; its lease is granted for lease_ms rounded up to whole
  // seconds.
  bool elects_leader() const override { return true; }
  std::optional<int> campaign_for(int node, int64_t lease_ms) override;
  std::optional<int> leading_node() override;

 private:
  struct Value {
    std::string value;
    int64_t mod_revision = 0;
    int64_t create_revision = 0;
    int64_t lease = 0;
  };
  // The compare a fenced write adds (an empty array when not fenced), and
  // the NotLeader a refused one throws.
  nlohmann::json fence() const;
  [[noreturn]] void refuse_unfenced(const std::string& key);
  std::optional<Value> range(const std::string& key, int64_t deadline_ns);
  // The leader key of a run under the prefix (keys before end), if any: a
  // job that still runs after its node 0 (and owner key) is gone.
  std::optional<std::string> live_leader_key(const std::string& end, int64_t deadline_ns);
  // POSTs `body` to `path` at the endpoints in turn (the one that answered
  // last first), authenticating where needed, within the deadline; returns
  // the reply's JSON text. Throws Error if none answered.
  std::string call(const std::string& path, const std::string& body, int64_t deadline_ns);
  // The run's full key; throws Error before a run is chosen.
  std::string run_key(const std::string& key) const;
  void keep_lease_alive();

  std::vector<std::string> endpoints_;
  std::string user_;
  std::string password_;
  std::string prefix_;  // the job's
  std::string run_id_;
  std::string client_id_;  // random: names this client's add() marks
  std::atomic<uint64_t> adds_{0};
  int64_t call_timeout_ms_;
  std::mutex mutex_;  // one call at a time over the connections
  std::vector<std::unique_ptr<Connection>> connections_;
  size_t current_ = 0;  // the endpoint that answered last
  // own()'s lease, kept alive by keepalive_ until the destructor revokes it.
  int64_t lease_ = 0;
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread keepalive_;
  // grant_lease()'s, and the leadership the writes are fenced by (0: none).
  int64_t member_lease_ = 0;
  int64_t fence_revision_ = 0;
};

}  // namespace brigade::elastic
