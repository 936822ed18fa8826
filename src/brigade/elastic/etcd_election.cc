// Leader election over etcd (elastic/etcd_store.h's campaign()): the
// leader key is created in a transaction that succeeds only if the key is
// absent, bound to the candidate's own lease; when that lease runs out
// (the leader's agent died, hung or was cut off, and stopped renewing it)
// etcd deletes the key and the next campaign takes it. Every write of a
// leader is fenced by its leadership: the same transaction compares the
// leader key's create revision with the one it created, so a deposed
// leader that still runs (it was cut off for longer than its lease) has
// every write refused rather than mixed into its successor's decisions.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <string_view>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/etcd_store.h"
#include "brigade/elastic/etcd_wire.h"

namespace brigade::elastic {

using nlohmann::json;
using namespace etcd_wire;

void EtcdCoordinatorStore::grant_lease(int64_t ttl_s) {
  const std::string where = fmt::format("etcd ({}) granting this agent's lease", address());
  const json grant = etcd_reply(call("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}.dump(),
                                     now_ns() + call_timeout_ms_ * kNsPerMs),
                                where);
  member_lease_ = reply_int(grant, "ID", where);
}

bool EtcdCoordinatorStore::renew_lease() {
  if (member_lease_ == 0) throw_error("etcd ({}): renew_lease() before grant_lease()", address());
  const std::string where = fmt::format("etcd ({}) renewing this agent's lease", address());
  const std::string text =
      call("/v3/lease/keepalive", json{{"ID", std::to_string(member_lease_)}}.dump(),
           now_ns() + call_timeout_ms_ * kNsPerMs);
  // The gateway wraps the stream's one reply in "result"; its TTL is left
  // out (0) once the lease expired.
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("result")) {
    throw_error("{}: the reply is not etcd's: {}", where, shown_reply(text));
  }
  const json result = etcd_reply(j.at("result").dump(), where);
  return result.contains("TTL") && reply_int(result, "TTL", where) > 0;
}

void EtcdCoordinatorStore::revoke_lease() {
  if (member_lease_ == 0) return;
  try {
    call("/v3/lease/revoke", json{{"ID", std::to_string(member_lease_)}}.dump(),
         now_ns() + call_timeout_ms_ * kNsPerMs);
  } catch (const Error&) {
  }
  member_lease_ = 0;
}

std::optional<EtcdCoordinatorStore::Leader> EtcdCoordinatorStore::leader() {
  const std::optional<Value> v = range(run_key("leader"), now_ns() + call_timeout_ms_ * kNsPerMs);
  if (!v) return std::nullopt;
  return Leader{v->value, member_lease_ != 0 && v->lease == member_lease_, v->create_revision};
}

EtcdCoordinatorStore::Leader EtcdCoordinatorStore::campaign(const std::string& candidate) {
  if (member_lease_ == 0) throw_error("etcd ({}): campaign() before grant_lease()", address());
  const int64_t deadline_ns = now_ns() + call_timeout_ms_ * kNsPerMs;
  const std::string key = run_key("leader");
  const std::string where = fmt::format("etcd ({}) campaigning for {}", address(), key);
  for (;;) {
    // Created only if absent: two candidates never both lead.
    const json request = {
        {"compare", json::array({json{{"target", "CREATE"},
                                      {"key", to_base64(key)},
                                      {"create_revision", "0"},
                                      {"result", "EQUAL"}}})},
        {"success", json::array({json{{"request_put",
                                       {{"key", to_base64(key)},
                                        {"value", to_base64(candidate)},
                                        {"lease", std::to_string(member_lease_)}}}}})}};
    etcd_reply(call("/v3/kv/txn", request.dump(), deadline_ns), where);
    // Read back whether it succeeded or not: a campaign whose reply was
    // lost (and that call() sent again) finds the key bound to its lease.
    const std::optional<Value> held = range(key, deadline_ns);
    if (held) {
      // Every existing key has one: without it no leadership can be fenced.
      if (held->create_revision <= 0) {
        throw_error("{}: the reply gives the key no create revision", where);
      }
      Leader l{held->value, held->lease == member_lease_, held->create_revision};
      if (l.ours) fence_revision_ = l.revision;
      return l;
    }
    // Its holder's lease ran out between the two calls: campaign again.
    if (now_ns() >= deadline_ns) {
      throw_error("{}: the key kept vanishing for {} ms", where, call_timeout_ms_);
    }
  }
}

namespace {

int leader_rank(const std::string& holder, const std::string& where) {
  int node = -1;
  const auto [end, error] = std::from_chars(holder.data(), holder.data() + holder.size(), node);
  if (holder.empty() || error != std::errc() || end != holder.data() + holder.size() || node < 0) {
    throw_error("{}: the leader key holds '{}', not a node's rank", where, shown_reply(holder));
  }
  return node;
}

}  // namespace

std::optional<int> EtcdCoordinatorStore::campaign_for(int node, int64_t lease_ms) {
  // A lease that expired (this agent was silent) or was never granted:
  // a fresh one, so that the campaign binds the key to a live lease.
  if (member_lease_ == 0 || !renew_lease())
    grant_lease(std::max<int64_t>(1, (lease_ms + 999) / 1000));
  return leader_rank(campaign(std::to_string(node)).holder,
                     fmt::format("etcd ({}) campaigning", address()));
}

std::optional<int> EtcdCoordinatorStore::leading_node() {
  const std::optional<Leader> l = leader();
  if (!l) return std::nullopt;
  return leader_rank(l->holder, fmt::format("etcd ({}) reading the leader", address()));
}

json EtcdCoordinatorStore::fence() const {
  if (fence_revision_ == 0) return json::array();
  return json::array({json{{"target", "CREATE"},
                           {"key", to_base64(run_key("leader"))},
                           {"create_revision", std::to_string(fence_revision_)},
                           {"result", "EQUAL"}}});
}

void EtcdCoordinatorStore::refuse_unfenced(const std::string& key) {
  throw NotLeader(fmt::format(
      "etcd ({}): refused to write {}: this agent no longer leads the job (its leader key of "
      "revision {} expired or was taken over: it was silent for longer than its lease)",
      address(), key, fence_revision_));
}

std::optional<std::string> EtcdCoordinatorStore::live_leader_key(const std::string& end,
                                                                 int64_t deadline_ns) {
  const std::string where =
      fmt::format("etcd ({}) looking for a running job under {}", address(), prefix_);
  const std::string text = call(
      "/v3/kv/range",
      json{{"key", to_base64(prefix_)}, {"range_end", to_base64(end)}, {"keys_only", true}}.dump(),
      deadline_ns);
  const json j = etcd_reply(text, where);
  const auto kvs = j.find("kvs");
  if (kvs == j.end()) return std::nullopt;
  if (!kvs->is_array())
    throw_error("{}: the reply's kvs is not a list: {}", where, shown_reply(text));
  constexpr std::string_view kLeader = "/leader";
  for (const json& kv : *kvs) {
    const auto k = kv.is_object() ? kv.find("key") : kv.end();
    const std::optional<std::string> key =
        k != kv.end() && k->is_string() ? from_base64(k->get<std::string>()) : std::nullopt;
    if (!key) throw_error("{}: a key in the reply is not base64: {}", where, shown_reply(text));
    // brigade/<id>/<run>/leader: a run's, as run_key("leader") names it.
    const std::string_view rest = std::string_view(*key).substr(prefix_.size());
    if (rest.size() > kLeader.size() && rest.ends_with(kLeader) &&
        rest.find('/') == rest.size() - kLeader.size()) {
      return key;
    }
  }
  return std::nullopt;
}

}  // namespace brigade::elastic
