// A trace file (diag/trace.h's trace.json) read without its parse tree:
// the top-level object's members, and traceEvents' elements one at a time,
// as raw JSON text. A trace's tree is about eight times the file; the
// launcher that marks a run's incidents in it (diag/trace_incidents.h)
// holds one event at a time instead.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace brigade::diag {

class TraceScanner {
 public:
  // Error naming the path when it cannot be opened.
  explicit TraceScanner(const std::filesystem::path& path);
  ~TraceScanner();
  TraceScanner(const TraceScanner&) = delete;
  TraceScanner& operator=(const TraceScanner&) = delete;

  // Calls on_member(key, raw) for each member but traceEvents (false: stop
  // reading there) and on_event(raw) for each of its elements, in the
  // file's order. Error when the file is not one JSON object with a
  // traceEvents array (each raw text is whole by its brackets and quotes;
  // the caller's parse of it says whether it is JSON).
  void scan(const std::function<bool(const std::string& key, std::string_view raw)>& on_member,
            const std::function<void(std::string_view raw)>& on_event);

 private:
  [[noreturn]] void malformed(const char* why) const;
  int raw_get();
  int peek();
  int next();
  void expect(char want);
  void capture(std::string& out);

  std::filesystem::path path_;
  int fd_ = -1;
  char buffer_[1 << 16];
  size_t pos_ = 0, len_ = 0;
};

}  // namespace brigade::diag
