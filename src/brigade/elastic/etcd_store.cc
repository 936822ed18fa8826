#include "brigade/elastic/etcd_store.h"

#include <curl/curl.h>
#include <sys/socket.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"
#include "brigade/elastic/etcd_wire.h"

namespace brigade::elastic {
namespace etcd_wire {

using nlohmann::json;

// Between two rounds over the endpoints within one call.
constexpr int64_t kRetryPauseNs = 50 * kNsPerMs;

// Larger replies are not etcd's answer to one key: refused, never buffered.
constexpr size_t kMaxReplyBytes = 1 << 20;

// An endpoint that did not answer (connection refused, timed out, no etcd
// leader): the next one is tried.
class EtcdUnreachable : public Error {
 public:
  using Error::Error;
};

constexpr char kBase64Digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string to_base64(const std::string& in) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kBase64Digits[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += {kBase64Digits[v >> 18], kBase64Digits[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out +=
        {kBase64Digits[v >> 18], kBase64Digits[(v >> 12) & 63], kBase64Digits[(v >> 6) & 63], '='};
  }
  return out;
}

std::optional<std::string> from_base64(const std::string& in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = in[i + j];
      const char* at = c == '\0' ? nullptr : std::strchr(kBase64Digits, c);
      if (c == '=' && i + 4 == in.size() && j >= 2 && (j == 3 || in[i + 3] == '=')) {
        ++pad;
        v <<= 6;
      } else if (at != nullptr && pad == 0) {
        v = (v << 6) | static_cast<uint32_t>(at - kBase64Digits);
      } else {
        return std::nullopt;
      }
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  if (to_base64(out) != in) return std::nullopt;  // stray bits in the padding
  return out;
}

std::string shown_reply(const std::string& text) {
  std::string out;
  for (const char c : text.substr(0, 120)) out += (c >= 32 && c < 127) ? c : '?';
  return text.size() > 120 ? out + "..." : out;
}

}  // namespace etcd_wire

namespace {

using nlohmann::json;
using namespace etcd_wire;

size_t on_etcd_reply_data(char* data, size_t size, size_t count, void* user) {
  auto* reply = static_cast<std::string*>(user);
  if (reply->size() + size * count > kMaxReplyBytes) return 0;  // curl fails the transfer
  reply->append(data, size * count);
  return size * count;
}

// The connection kept open between calls is never inherited by the
// workers the launcher starts.
curl_socket_t open_cloexec_socket(void*, curlsocktype, curl_sockaddr* address) {
  return ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

void init_curl_once() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) throw_error("cannot initialise libcurl: {}", curl_easy_strerror(code));
}

}  // namespace

namespace etcd_wire {

int64_t reply_int(const json& j, const char* field, const std::string& where) {
  const auto it = j.find(field);
  if (it != j.end() && it->is_string()) {
    // Up to int64's largest (lease IDs take all 19 digits); no sign.
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (!s.empty() && s[0] != '-' && error == std::errc() && end == s.data() + s.size()) return v;
  } else if (it != j.end() && it->is_number_integer()) {
    return it->get<int64_t>();
  }
  throw_error("{}: the reply's \"{}\" is not an integer", where, field);
}

json etcd_reply(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("header")) {
    throw_error("{}: the reply is not etcd's: {}", where, shown_reply(text));
  }
  return j;
}

bool txn_succeeded(const json& j, const std::string& where) {
  const auto ok = j.find("succeeded");
  if (ok != j.end() && !ok->is_boolean()) {
    throw_error("{}: \"succeeded\" is not a boolean: {}", where, shown_reply(j.dump()));
  }
  return ok != j.end() && ok->get<bool>();
}

}  // namespace etcd_wire

namespace {

std::string setup_help(const std::string& user, const std::string& prefix) {
  return fmt::format(
      "to set the job up, as etcd's root run: printf %s \"$BRIGADE_RDZV_TOKEN\" | etcdctl user "
      "add {0} --interactive=false; etcdctl role add {0}; etcdctl role "
      "grant-permission {0} readwrite --prefix=true {1}; etcdctl user grant-role {0} {0} (and run "
      "etcd with --auto-compaction-mode periodic --auto-compaction-retention 1h, else the "
      "agents' beats fill its database)",
      user, prefix);
}

}  // namespace

using namespace etcd_wire;

struct EtcdCoordinatorStore::Connection {
  explicit Connection(std::string url) : endpoint(std::move(url)), curl(curl_easy_init()) {
    if (curl == nullptr) throw_error("cannot make a libcurl handle for etcd at {}", endpoint);
  }
  ~Connection() { curl_easy_cleanup(curl); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // POSTs the body; returns the HTTP status and fills `reply`. Throws
  // EtcdUnreachable when no HTTP answer came before the deadline.
  long post(const std::string& path, const std::string& body, const std::string& auth,
            int64_t deadline_ns, std::string& reply) {
    const int64_t left_ms = std::max<int64_t>(1, (deadline_ns - now_ns()) / kNsPerMs);
    reply.clear();
    const std::string url = endpoint + path;
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    if (!auth.empty()) headers = curl_slist_append(headers, ("Authorization: " + auth).c_str());
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_etcd_reply_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(left_ms));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(left_ms));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
    curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");  // the job's etcd, never a proxy
    curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, open_cloexec_socket);
#if LIBCURL_VERSION_NUM >= 0x075700
    // A name lookup still hanging at the timeout is left to its thread, not
    // joined: the call ends on time.
    curl_easy_setopt(curl, CURLOPT_QUICK_EXIT, 1L);
#endif
    const CURLcode code = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    if (code != CURLE_OK) {
      throw EtcdUnreachable(fmt::format("{}: {}", endpoint, curl_easy_strerror(code)));
    }
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    return status;
  }

  std::string endpoint;
  CURL* curl;
  std::string token;  // etcd's auth token for this member (simple tokens are per member)
};

std::string etcd_job_id(const std::string& token) {
  return fmt::format("{:016x}", XXH3_64bits(token.data(), token.size()));
}
std::string etcd_user(const std::string& token) {
  return "brigade-" + etcd_job_id(token);
}
std::string etcd_prefix(const std::string& token) {
  return "brigade/" + etcd_job_id(token) + "/";
}

std::vector<std::string> parse_etcd_endpoints(const std::string& text) {
  if (text.find('@') != std::string::npos) {
    // Not echoed: errors and logs would show the credentials.
    throw_error(
        "--rdzv-endpoints: a URL with user:password@ is refused (errors and logs would show it); "
        "give etcd's plain client URLs (http://etcd0:2379): the job's token is its etcd password");
  }
  std::vector<std::string> urls;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    std::string url = text.substr(start, end - start);
    while (!url.empty() && url.back() == '/') url.pop_back();
    const size_t scheme = url.find("://");
    const std::string rest = scheme == std::string::npos ? "" : url.substr(scheme + 3);
    const size_t colon = rest.rfind(':');
    const bool ok = (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) &&
                    colon != std::string::npos && colon > 0 && colon + 1 < rest.size() &&
                    rest.find('/') == std::string::npos &&
                    std::all_of(rest.begin() + static_cast<long>(colon) + 1, rest.end(), ::isdigit);
    if (!ok) {
      throw_error(
          "--rdzv-endpoints wants etcd's client URLs, comma-separated (for example "
          "http://etcd0:2379,http://etcd1:2379), got '{}'",
          text);
    }
    urls.push_back(url);
    start = end + 1;
  }
  return urls;
}

EtcdCoordinatorStore::EtcdCoordinatorStore(std::vector<std::string> endpoints,
                                           const std::string& token, int64_t call_timeout_ms)
    : endpoints_(std::move(endpoints)),
      user_(etcd_user(token)),
      password_(token),
      prefix_(etcd_prefix(token)),
      call_timeout_ms_(call_timeout_ms) {
  if (endpoints_.empty()) throw_error("the etcd backend needs --rdzv-endpoints URL[,URL]");
  init_curl_once();
  std::random_device entropy;
  client_id_ = fmt::format("{:08x}{:08x}", entropy(), entropy());
  for (const std::string& e : endpoints_) connections_.push_back(std::make_unique<Connection>(e));
  // Authenticates, and checks the user may use the job's prefix.
  range(prefix_ + "owner", now_ns() + call_timeout_ms_ * kNsPerMs);
}

EtcdCoordinatorStore::~EtcdCoordinatorStore() {
  revoke_lease();
  if (!keepalive_.joinable()) return;
  {
    const std::lock_guard lock(stop_mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  keepalive_.join();
  // The next job under this token may start at once; if etcd does not
  // answer, the lease runs out by itself.
  try {
    call("/v3/lease/revoke", json{{"ID", std::to_string(lease_)}}.dump(),
         now_ns() + call_timeout_ms_ * kNsPerMs);
  } catch (const Error&) {
  }
}

std::string EtcdCoordinatorStore::own() {
  const int64_t deadline_ns = now_ns() + call_timeout_ms_ * kNsPerMs;
  std::random_device entropy;
  const std::string run = fmt::format("{:08x}{:08x}", entropy(), entropy());
  const std::string where = fmt::format("etcd ({}) taking {} for a new run", address(), prefix_);
  const json grant = etcd_reply(
      call("/v3/lease/grant", json{{"TTL", std::to_string(kOwnerLeaseTtlS)}}.dump(), deadline_ns),
      where);
  const int64_t lease = reply_int(grant, "ID", where);
  const std::string owner = prefix_ + "owner";
  std::string end = prefix_;
  ++end.back();  // "brigade/<id>/" -> "brigade/<id>0": every key with the prefix
  // The owner key lives on node 0's lease only: once node 0 is gone another
  // node may lead the run (etcd_election.cc), whose leader key lives while
  // that leader beats. Taking the prefix would delete that run's keys.
  if (const std::optional<std::string> live = live_leader_key(end, deadline_ns)) {
    throw_error(
        "another job with this token is running on etcd {} (its leader holds {}; its node 0 is "
        "gone and another node leads it): use another token, or stop that job first",
        address().substr(5), *live);
  }
  // The owner, if there is none, and every key but it deleted: older runs'.
  const json request = {
      {"compare", json::array({json{{"target", "CREATE"},
                                    {"key", to_base64(owner)},
                                    {"create_revision", "0"},
                                    {"result", "EQUAL"}}})},
      {"success",
       json::array({json{{"request_put",
                          {{"key", to_base64(owner)},
                           {"value", to_base64(run)},
                           {"lease", std::to_string(lease)}}}},
                    json{{"request_delete_range",
                          {{"key", to_base64(prefix_)}, {"range_end", to_base64(owner)}}}},
                    json{{"request_delete_range",
                          {{"key", to_base64(owner + '\0')}, {"range_end", to_base64(end)}}}}})}};
  if (!txn_succeeded(etcd_reply(call("/v3/kv/txn", request.dump(), deadline_ns), where), where)) {
    // Ours all the same if it landed and only the reply was lost (the
    // endpoint after retried it).
    const std::optional<Value> holder = range(owner, deadline_ns);
    if (!holder || holder->value != run) {
      throw_error(
          "another job with this token is running on etcd {} (it holds {}): use another token (or "
          "wait for it to end; a job whose node 0 died holds it {} s more)",
          address().substr(5), owner, kOwnerLeaseTtlS);
    }
  }
  lease_ = lease;
  run_id_ = run;
  keepalive_ = std::thread([this] { keep_lease_alive(); });
  return run;
}

void EtcdCoordinatorStore::keep_lease_alive() {
  bool warned = false;
  std::unique_lock lock(stop_mutex_);
  // Four tries per lease term: one etcd that does not answer for a call
  // timeout still leaves three.
  while (!stop_cv_.wait_for(lock, std::chrono::seconds(kOwnerLeaseTtlS) / 4,
                            [this] { return stop_; })) {
    lock.unlock();
    try {
      const std::string text =
          call("/v3/lease/keepalive", json{{"ID", std::to_string(lease_)}}.dump(),
               now_ns() + call_timeout_ms_ * kNsPerMs);
      const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
      const bool alive = j.is_object() && j.contains("result") && j["result"].is_object() &&
                         j["result"].contains("TTL") &&  // left out when 0: expired
                         reply_int(j["result"], "TTL", "etcd's lease keepalive") > 0;
      if (!alive && !warned) {
        fmt::print(stderr,
                   "brigade launch: etcd ({}) let this job's hold on {}owner run out (etcd did not "
                   "hear from node 0 for {} s): another job under the same token could start\n",
                   address(), prefix_, kOwnerLeaseTtlS);
        warned = true;
      }
    } catch (const Error&) {
      // Tried again within the lease's term.
    }
    lock.lock();
  }
}

void EtcdCoordinatorStore::use_run(const std::string& run_id) {
  if (run_id.size() != 16 || !std::all_of(run_id.begin(), run_id.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
      })) {
    throw_error("node 0 gave '{}' as the job's etcd run id, not 16 hex digits: is it brigade's?",
                shown_reply(run_id));
  }
  run_id_ = run_id;
}

std::string EtcdCoordinatorStore::run_key(const std::string& key) const {
  if (run_id_.empty()) {
    throw_error("etcd ({}): {} read or written before the run is known (own() or use_run())",
                address(), key);
  }
  return prefix_ + run_id_ + "/" + key;
}

std::string EtcdCoordinatorStore::address() const {
  std::string text = "etcd ";
  for (size_t i = 0; i < endpoints_.size(); ++i) text += (i > 0 ? "," : "") + endpoints_[i];
  return text;
}

std::string EtcdCoordinatorStore::call(const std::string& path, const std::string& body,
                                       int64_t deadline_ns) {
  const std::lock_guard lock(mutex_);
  std::string unreachable;
  const size_t n = connections_.size();
  // Every endpoint that failed at once (refused, or etcd without a leader
  // for a moment: an election) is tried again while the call's time lasts:
  // one failed round is not lost contact.
  for (int round = 0; round == 0 || now_ns() + kRetryPauseNs < deadline_ns; ++round) {
    if (round > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(kRetryPauseNs));
    unreachable.clear();
    for (size_t i = 0; i < n; ++i) {
      Connection& c = *connections_[(current_ + i) % n];
      const int64_t left_ns = deadline_ns - now_ns();
      if (left_ns <= 0) break;
      // An endpoint that hangs costs its share of the time, not the whole call.
      const int64_t attempt_deadline_ns = now_ns() + left_ns / static_cast<int64_t>(n - i);
      try {
        std::string reply;
        for (int attempt = 0; attempt < 2; ++attempt) {
          if (c.token.empty()) {
            const json request = {{"name", user_}, {"password", password_}};
            const long status =
                c.post("/v3/auth/authenticate", request.dump(), "", attempt_deadline_ns, reply);
            json j = json::parse(reply, nullptr, /*allow_exceptions=*/false);
            if (status == 200 && j.is_object() && j.contains("token") && j["token"].is_string() &&
                !j["token"].get_ref<const std::string&>().empty()) {
              c.token = j["token"].get<std::string>();
            } else if (status >= 500) {
              throw EtcdUnreachable(fmt::format("{}: {}", c.endpoint, shown_reply(reply)));
            } else if (reply.find("authentication is not enabled") != std::string::npos) {
              throw_error(
                  "etcd at {} has authentication off, so any client could change the job: enable "
                  "it (etcdctl user add root; etcdctl user grant-role root root; etcdctl auth "
                  "enable) and give the job its user",
                  c.endpoint);
            } else if (status == 200) {
              throw_error("etcd at {}: malformed reply to authenticate: {}", c.endpoint,
                          shown_reply(reply));
            } else {
              throw_error("etcd at {} refused user {} with the job's token ({}): {}", c.endpoint,
                          user_, shown_reply(reply), setup_help(user_, prefix_));
            }
          }
          const long status = c.post(path, body, c.token, attempt_deadline_ns, reply);
          if (status == 200) {
            current_ = (current_ + i) % n;
            return reply;
          }
          // The auth token expired (401), or etcd's auth store changed since it
          // was issued (a user or role was changed: 400, "revision of auth
          // store is old"; "user name is empty" after a restart forgot it):
          // the request was refused, not applied, so authenticate again.
          const bool stale_token =
              status == 401 ||
              (status == 400 && (reply.find("revision of auth store is old") != std::string::npos ||
                                 reply.find("user name is empty") != std::string::npos));
          if (stale_token && attempt == 0) {
            c.token.clear();
            continue;
          }
          if (status >= 500)
            throw EtcdUnreachable(fmt::format("{}: {}", c.endpoint, shown_reply(reply)));
          if (status == 403) {
            throw_error("etcd at {} denied user {} the job's keys {} ({}): {}", c.endpoint, user_,
                        prefix_, shown_reply(reply), setup_help(user_, prefix_));
          }
          throw_error("etcd at {} refused {} (HTTP {}): {}", c.endpoint, path, status,
                      shown_reply(reply));
        }
      } catch (const EtcdUnreachable& e) {
        unreachable += (unreachable.empty() ? "" : "; ") + std::string(e.what());
      }
    }
  }
  throw_error("no etcd endpoint answered {} within {} ms ({}): is etcd running at {}?", path,
              call_timeout_ms_, unreachable.empty() ? "no time left" : unreachable,
              address().substr(5));
}

std::optional<EtcdCoordinatorStore::Value> EtcdCoordinatorStore::range(const std::string& full,
                                                                       int64_t deadline_ns) {
  const std::string text = call("/v3/kv/range", json{{"key", to_base64(full)}}.dump(), deadline_ns);
  const std::string where = fmt::format("etcd ({}) reading {}", address(), full);
  const json j = etcd_reply(text, where);
  const auto kvs = j.find("kvs");
  if (kvs == j.end()) return std::nullopt;
  if (!kvs->is_array() || kvs->size() != 1 || !(*kvs)[0].is_object()) {
    throw_error("{}: expected one key in the reply, got {}", where, shown_reply(text));
  }
  const json& kv = (*kvs)[0];
  const auto k = kv.find("key");
  const auto v = kv.find("value");  // absent for an empty value
  std::optional<std::string> got_key =
      k != kv.end() && k->is_string() ? from_base64(k->get<std::string>()) : std::nullopt;
  std::optional<std::string> value = v == kv.end()    ? std::optional<std::string>("")
                                     : v->is_string() ? from_base64(v->get<std::string>())
                                                      : std::nullopt;
  if (got_key != full || !value) {
    throw_error("{}: the reply's key or value is not the key asked for in base64: {}", where,
                shown_reply(text));
  }
  // "lease" is left out for a key without one; "create_revision" is
  // checked where it is used (the leader key's, by the election).
  return Value{*value, reply_int(kv, "mod_revision", where),
               kv.contains("create_revision") ? reply_int(kv, "create_revision", where) : 0,
               kv.contains("lease") ? reply_int(kv, "lease", where) : 0};
}

void EtcdCoordinatorStore::set(const std::string& key, const std::string& value) {
  const std::string full = run_key(key);
  const std::string where = fmt::format("etcd ({}) writing {}", address(), full);
  const json put = {{"key", to_base64(full)}, {"value", to_base64(value)}};
  const int64_t deadline_ns = now_ns() + call_timeout_ms_ * kNsPerMs;
  if (fence_revision_ == 0) {
    etcd_reply(call("/v3/kv/put", put.dump(), deadline_ns), where);
    return;
  }
  // A put is idempotent: sent again after a lost reply, it lands the same.
  const json request = {{"compare", fence()}, {"success", json::array({{{"request_put", put}}})}};
  if (!txn_succeeded(etcd_reply(call("/v3/kv/txn", request.dump(), deadline_ns), where), where)) {
    refuse_unfenced(full);
  }
}

std::optional<std::string> EtcdCoordinatorStore::try_get(const std::string& key) {
  auto v = range(run_key(key), now_ns() + call_timeout_ms_ * kNsPerMs);
  if (!v) return std::nullopt;
  return std::move(v->value);
}

int64_t EtcdCoordinatorStore::add(const std::string& key, int64_t delta) {
  const int64_t deadline_ns = now_ns() + call_timeout_ms_ * kNsPerMs;
  const std::string full = run_key(key);
  // The last add this client applied to the key, "<seq>:<sum>", written in
  // the same transaction as the sum.
  const std::string mark = full + "/last/" + client_id_;
  const uint64_t seq = ++adds_;
  for (;;) {
    const std::optional<Value> current = range(full, deadline_ns);
    int64_t base = 0;
    if (current) {
      const std::string& s = current->value;
      const size_t digits = s.size() - (!s.empty() && s[0] == '-' ? 1 : 0);
      if (digits == 0 || digits > 18 ||
          !std::all_of(s.end() - static_cast<long>(digits), s.end(), ::isdigit)) {
        throw_error("etcd ({}): {} holds '{}', not a counter", address(), full, shown_reply(s));
      }
      base = std::stoll(s);
      if (delta == 0) return base;
    }
    // Written only if nobody wrote the key since it was read.
    const json compare = current ? json{{"target", "MOD"},
                                        {"key", to_base64(full)},
                                        {"mod_revision", std::to_string(current->mod_revision)},
                                        {"result", "EQUAL"}}
                                 : json{{"target", "CREATE"},
                                        {"key", to_base64(full)},
                                        {"create_revision", "0"},
                                        {"result", "EQUAL"}};
    const int64_t sum = base + delta;
    const json put = {
        {"request_put", {{"key", to_base64(full)}, {"value", to_base64(std::to_string(sum))}}}};
    const json put_mark = {
        {"request_put",
         {{"key", to_base64(mark)}, {"value", to_base64(fmt::format("{}:{}", seq, sum))}}}};
    json compares = fence();
    compares.push_back(compare);
    const json request = {{"compare", compares}, {"success", json::array({put, put_mark})}};
    const std::string text = call("/v3/kv/txn", request.dump(), deadline_ns);
    const std::string where = fmt::format("etcd ({}) adding to {}", address(), full);
    if (txn_succeeded(etcd_reply(text, where), where)) return sum;
    // The key changed since it was read: by another client, or by this add
    // itself, when an endpoint applied it and its reply was lost (call()
    // sent it again to the next). This client's mark says which.
    const std::optional<Value> marked = range(mark, deadline_ns);
    const std::string ours = fmt::format("{}:", seq);
    if (marked && marked->value.starts_with(ours)) {
      const std::string landed = marked->value.substr(ours.size());
      if (landed.empty() || landed.size() > 19 ||
          !std::all_of(landed.begin() + (landed[0] == '-' ? 1 : 0), landed.end(), ::isdigit)) {
        throw_error("{}: its mark {} holds '{}', not this client's", where, mark,
                    shown_reply(marked->value));
      }
      return std::stoll(landed);
    }
    if (fence_revision_ != 0) {
      const std::optional<Value> leader = range(run_key("leader"), deadline_ns);
      if (!leader || leader->create_revision != fence_revision_) refuse_unfenced(full);
    }
    if (now_ns() >= deadline_ns) {
      throw_error("etcd ({}): adding to {} did not succeed within {} ms (the key kept changing)",
                  address(), full, call_timeout_ms_);
    }
  }
}

}  // namespace brigade::elastic
