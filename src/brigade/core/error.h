// Errors. Two kinds, on purpose:
//  - brigade::Error is for the user: bad input, missing files, shapes that do
//    not fit. Its message says what is wrong and what to do about it. The CLI
//    prints it as one line and exits non-zero.
//  - BRIGADE_CHECK is for invariants of our own code. A failing check is a bug
//    in Brigade, not in the user's input; it throws too (so tests can see it),
//    naming the file and line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace brigade {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Formats and throws a user-facing error: throw_error("no such file: {}", path).
template <typename... Args>
[[noreturn]] void throw_error(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

namespace detail {
[[noreturn]] inline void check_failed(const char* expr, const char* file, int line,
                                      const std::string& message) {
  throw Error(fmt::format("internal check failed: {} ({}:{}){}{}", expr, file, line,
                          message.empty() ? "" : ": ", message));
}

// BRIGADE_CHECK's optional message: none, or a format and its arguments.
inline std::string check_message() {
  return {};
}
template <typename... Args>
std::string check_message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
}  // namespace detail

}  // namespace brigade

// BRIGADE_CHECK(cond) or BRIGADE_CHECK(cond, "format {}", args...).
#define BRIGADE_CHECK(cond, ...)                                                      \
  do {                                                                                \
    if (!(cond)) [[unlikely]] {                                                       \
      ::brigade::detail::check_failed(#cond, __FILE__, __LINE__,                      \
                                      ::brigade::detail::check_message(__VA_ARGS__)); \
    }                                                                                 \
  } while (0)
