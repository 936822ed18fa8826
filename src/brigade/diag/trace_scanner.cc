#include "brigade/diag/trace_scanner.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"

namespace brigade::diag {

TraceScanner::TraceScanner(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_error("cannot open {}: {}", path.string(), std::strerror(errno));
}

TraceScanner::~TraceScanner() {
  ::close(fd_);
}

void TraceScanner::scan(
    const std::function<bool(const std::string& key, std::string_view raw)>& on_member,
    const std::function<void(std::string_view raw)>& on_event) {
  expect('{');
  bool events_seen = false;
  std::string key, raw;
  if (peek() == '}') malformed("no traceEvents");
  for (;;) {
    raw.clear();
    capture(raw);
    const nlohmann::json name = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (!name.is_string()) malformed("a member's name is not a string");
    key = name.get<std::string>();
    expect(':');
    if (key == "traceEvents") {
      events_seen = true;
      expect('[');
      if (peek() == ']') {
        next();
      } else {
        for (;;) {
          raw.clear();
          capture(raw);
          on_event(std::string_view(raw));
          const int c = next();
          if (c == ']') break;
          if (c != ',') malformed("traceEvents is cut short");
        }
      }
    } else {
      raw.clear();
      capture(raw);
      if (!on_member(key, std::string_view(raw))) return;
    }
    const int c = next();
    if (c == '}') break;
    if (c != ',') malformed("its object is cut short");
  }
  if (peek() != -1) malformed("something follows its object");
  if (!events_seen) malformed("no traceEvents");
}

void TraceScanner::malformed(const char* why) const {
  throw_error("{} is not a whole trace: {}", path_.string(), why);
}

int TraceScanner::raw_get() {
  if (pos_ == len_) {
    ssize_t n;
    do {
      n = ::read(fd_, buffer_, sizeof buffer_);
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw_error("cannot read {}: {}", path_.string(), std::strerror(errno));
    if (n == 0) return -1;
    pos_ = 0;
    len_ = static_cast<size_t>(n);
  }
  return static_cast<unsigned char>(buffer_[pos_++]);
}

// The next character that is not white space, left unread (-1: the end).
int TraceScanner::peek() {
  for (;;) {
    const int c = raw_get();
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c != -1) --pos_;
    return c;
  }
}

int TraceScanner::next() {
  const int c = peek();
  if (c != -1) ++pos_;
  return c;
}

void TraceScanner::expect(char want) {
  if (next() != want) malformed("not the trace format");
}

// One value's text: a string, an object or array (to its matching bracket,
// strings skipped), or a scalar (to what ends it, left unread).
void TraceScanner::capture(std::string& out) {
  int depth = 0;
  bool in_string = false, escaped = false;
  if (peek() == -1) malformed("cut short");
  for (;;) {
    const int c = raw_get();
    if (c == -1) {
      if (depth == 0 && !in_string && !out.empty()) return;  // a scalar at the end
      malformed("cut short");
    }
    if (in_string) {
      out.push_back(static_cast<char>(c));
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        if (depth == 0) return;
      }
      continue;
    }
    if (depth == 0 && (c == ',' || c == ']' || c == '}' || c == ':' || c == ' ' || c == '\n' ||
                       c == '\r' || c == '\t')) {
      if (out.empty()) malformed("a value is missing");
      --pos_;  // what ends a scalar is the caller's
      return;
    }
    out.push_back(static_cast<char>(c));
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth < 0) malformed("unbalanced brackets");
      if (depth == 0) return;
    }
  }
}

}  // namespace brigade::diag
