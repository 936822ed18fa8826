#include "brigade/core/trace.h"

#include <unistd.h>

#include <mutex>
#include <utility>

namespace brigade::trace {
namespace detail {
std::atomic<bool> g_on{false};
}

namespace {

struct Store {
  std::mutex mutex;
  std::vector<Event> events;
  int64_t dropped = 0;
};

Store& store() {
  static Store s;
  return s;
}

int this_thread() {
  thread_local const int id = static_cast<int>(::gettid());
  return id;
}

}  // namespace

void start() {
  Store& s = store();
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.events.clear();
    s.dropped = 0;
  }
  detail::g_on.store(true, std::memory_order_relaxed);
}

void stop() {
  detail::g_on.store(false, std::memory_order_relaxed);
}

void record(const Event& event) {
  Event e = event;
  e.thread = this_thread();
  Store& s = store();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (s.events.size() >= kMaxEvents) {
    ++s.dropped;
    return;
  }
  s.events.push_back(e);
}

void instant(const char* category, const char* name, int64_t index) {
  if (!on()) return;
  Event e;
  e.category = category;
  e.name = name;
  e.index = index;
  e.begin_ns = e.end_ns = now_ns();
  record(e);
}

Recorded take() {
  Store& s = store();
  const std::lock_guard<std::mutex> lock(s.mutex);
  Recorded r;
  r.events = std::exchange(s.events, {});
  r.dropped = std::exchange(s.dropped, 0);
  return r;
}

}  // namespace brigade::trace
