#include "brigade/elastic/etcd_store.h"

#include <curl/curl.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "brigade/core/clock.h"
#include "brigade/core/error.h"

namespace brigade::elastic {
namespace {

using nlohmann::json;

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

// nullopt for anything but canonical padded base64.
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

// A reply quoted in an error: printable, short.
std::string shown_reply(const std::string& text) {
  std::string out;
  for (const char c : text.substr(0, 120)) out += (c >= 32 && c < 127) ? c : '?';
  return text.size() > 120 ? out + "..." : out;
}

size_t on_etcd_reply_data(char* data, size_t size, size_t count, void* user) {
  auto* reply = static_cast<std::string*>(user);
  if (reply->size() + size * count > kMaxReplyBytes) return 0;  // curl fails the transfer
  reply->append(data, size * count);
  return size * count;
}

void init_curl_once() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) throw_error("cannot initialise libcurl: {}", curl_easy_strerror(code));
}

// A JSON integer as the gateway writes it: int64 as a decimal string.
int64_t reply_int(const json& j, const char* field, const std::string& where) {
  const auto it = j.find(field);
  if (it != j.end() && it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    if (!s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), ::isdigit)) {
      return std::stoll(s);
    }
  } else if (it != j.end() && it->is_number_integer()) {
    return it->get<int64_t>();
  }
  throw_error("{}: the reply's \"{}\" is not an integer", where, field);
}

std::string setup_help(const std::string& user, const std::string& prefix) {
  return fmt::format(
      "to set the job up, as etcd's root run: etcdctl user add {0} "
      "--new-user-password=\"$BRIGADE_RDZV_TOKEN\"; etcdctl role add {0}; etcdctl role "
      "grant-permission {0} readwrite --prefix=true {1}; etcdctl user grant-role {0} {0}",
      user, prefix);
}

}  // namespace

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
  for (const std::string& e : endpoints_) connections_.push_back(std::make_unique<Connection>(e));
  // Authenticates, and checks the user may use the job's prefix.
  range("", now_ns() + call_timeout_ms_ * kNsPerMs);
}

EtcdCoordinatorStore::~EtcdCoordinatorStore() = default;

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
        if (status == 401 && attempt == 0) {  // the auth token expired: authenticate again
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
  throw_error("no etcd endpoint answered {} within {} ms ({}): is etcd running at {}?", path,
              call_timeout_ms_, unreachable.empty() ? "no time left" : unreachable,
              address().substr(5));
}

std::optional<EtcdCoordinatorStore::Value> EtcdCoordinatorStore::range(const std::string& key,
                                                                       int64_t deadline_ns) {
  const std::string full = prefix_ + key;
  const std::string text = call("/v3/kv/range", json{{"key", to_base64(full)}}.dump(), deadline_ns);
  const std::string where = fmt::format("etcd ({}) reading {}", address(), full);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("header")) {
    throw_error("{}: the reply is not etcd's: {}", where, shown_reply(text));
  }
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
  return Value{*value, reply_int(kv, "mod_revision", where)};
}

void EtcdCoordinatorStore::set(const std::string& key, const std::string& value) {
  const std::string text = call(
      "/v3/kv/put", json{{"key", to_base64(prefix_ + key)}, {"value", to_base64(value)}}.dump(),
      now_ns() + call_timeout_ms_ * kNsPerMs);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("header")) {
    throw_error("etcd ({}) writing {}: the reply is not etcd's: {}", address(), prefix_ + key,
                shown_reply(text));
  }
}

void EtcdCoordinatorStore::clear() {
  std::string end = prefix_;
  ++end.back();  // "brigade/<id>/" -> "brigade/<id>0": every key with the prefix
  const std::string text = call(
      "/v3/kv/deleterange", json{{"key", to_base64(prefix_)}, {"range_end", to_base64(end)}}.dump(),
      now_ns() + call_timeout_ms_ * kNsPerMs);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("header")) {
    throw_error("etcd ({}) clearing {}: the reply is not etcd's: {}", address(), prefix_,
                shown_reply(text));
  }
}

std::optional<std::string> EtcdCoordinatorStore::try_get(const std::string& key) {
  auto v = range(key, now_ns() + call_timeout_ms_ * kNsPerMs);
  if (!v) return std::nullopt;
  return std::move(v->value);
}

int64_t EtcdCoordinatorStore::add(const std::string& key, int64_t delta) {
  const int64_t deadline_ns = now_ns() + call_timeout_ms_ * kNsPerMs;
  const std::string full = prefix_ + key;
  for (;;) {
    const std::optional<Value> current = range(key, deadline_ns);
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
    const json put = {
        {"request_put",
         {{"key", to_base64(full)}, {"value", to_base64(std::to_string(base + delta))}}}};
    const json request = {{"compare", json::array({compare})}, {"success", json::array({put})}};
    const std::string text = call("/v3/kv/txn", request.dump(), deadline_ns);
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("header")) {
      throw_error("etcd ({}) adding to {}: the reply is not etcd's: {}", address(), full,
                  shown_reply(text));
    }
    const auto ok = j.find("succeeded");  // absent when false
    if (ok != j.end() && !ok->is_boolean()) {
      throw_error("etcd ({}) adding to {}: \"succeeded\" is not a boolean: {}", address(), full,
                  shown_reply(text));
    }
    if (ok != j.end() && ok->get<bool>()) return base + delta;
    if (now_ns() >= deadline_ns) {
      throw_error("etcd ({}): adding to {} did not succeed within {} ms (the key kept changing)",
                  address(), full, call_timeout_ms_);
    }
  }
}

}  // namespace brigade::elastic
