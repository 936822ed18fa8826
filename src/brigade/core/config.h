// Strict TOML configuration.
//
// A Config is a TOML document plus a record of which keys the program read.
// Consumers read every key they understand, each with its default; after all
// of them have read, check_all_used() rejects any key nobody read. So a typo
// ("train.stpes") is an error naming the key and the keys that section does
// know, instead of a silently ignored setting.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace brigade {

class Config {
 public:
  Config() = default;
  // Parses a TOML file; a syntax error names the file, line and column.
  static Config from_file(const std::filesystem::path& path);
  static Config from_string(std::string_view text, std::string origin = "<string>");

  // Applies "section.key=value". The value is read as TOML ("6", "1e-3",
  // "true", "\"text\""); if it is not valid TOML it is taken as a bare string,
  // so `--set data.tokenizer=byte` works without shell-quoted quotes.
  void set(std::string_view assignment);

  // Typed reads of a dotted key. A present key of the wrong type is an Error
  // naming the key, the expected type and the value found.
  int64_t get_int(std::string_view key, int64_t fallback);
  double get_double(std::string_view key, double fallback);  // integers accepted
  bool get_bool(std::string_view key, bool fallback);
  std::string get_string(std::string_view key, std::string fallback);
  // An array of integers ([3, 5]); absent: empty.
  std::vector<int64_t> get_int_list(std::string_view key);
  bool has(std::string_view key) const;

  // Throws Error if any key in the document was never read.
  void check_all_used() const;

  const std::string& origin() const { return origin_; }
  // The whole document as TOML text (for recording a run's effective config).
  std::string to_toml() const;

 private:
  const toml::node* find(std::string_view key);
  [[noreturn]] void wrong_type(std::string_view key, std::string_view expected,
                               const toml::node& found) const;

  toml::table root_;
  std::string origin_;
  std::set<std::string, std::less<>> used_;
};

}  // namespace brigade
