#include "brigade/core/config.h"

#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "brigade/core/error.h"

namespace brigade {
namespace {

std::vector<std::string> split_dotted(std::string_view key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.emplace_back(key.substr(start, dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string describe(const toml::node& node) {
  std::ostringstream out;
  switch (node.type()) {
    case toml::node_type::string:
      out << "string \"" << *node.value<std::string>() << "\"";
      break;
    case toml::node_type::integer:
      out << "integer " << *node.value<int64_t>();
      break;
    case toml::node_type::floating_point:
      out << "float " << *node.value<double>();
      break;
    case toml::node_type::boolean:
      out << "boolean " << (*node.value<bool>() ? "true" : "false");
      break;
    case toml::node_type::table:
      out << "a table";
      break;
    case toml::node_type::array:
      out << "an array";
      break;
    default:
      out << "a date/time";
      break;
  }
  return out.str();
}

void collect_leaf_keys(const toml::table& table, const std::string& prefix,
                       std::vector<std::string>& out) {
  for (const auto& [k, node] : table) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) {
      collect_leaf_keys(*sub, key, out);
    } else {
      out.push_back(key);
    }
  }
}

}  // namespace

Config Config::from_string(std::string_view text, std::string origin) {
  Config config;
  config.origin_ = std::move(origin);
  try {
    config.root_ = toml::parse(text, config.origin_);
  } catch (const toml::parse_error& e) {
    throw_error("{} line {}, column {}: {}", config.origin_, e.source().begin.line,
                e.source().begin.column, e.description());
  }
  return config;
}

Config Config::from_file(const std::filesystem::path& path) {
  std::ifstream probe(path);
  if (!probe) throw_error("config file {} does not exist or cannot be read", path.string());
  std::stringstream text;
  text << probe.rdbuf();
  return from_string(text.str(), path.string());
}

void Config::set(std::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw_error("--set expects section.key=value, got '{}'", assignment);
  }
  const std::string key(assignment.substr(0, eq));
  const std::string value(assignment.substr(eq + 1));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);
  }
  const std::vector<std::string> parts = split_dotted(key);
  toml::table* table = &root_;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* child = table->get(parts[i]);
    if (child == nullptr) {
      table->insert(parts[i], toml::table{});
      child = table->get(parts[i]);
    }
    table = child->as_table();
    if (table == nullptr) throw_error("--set {}: '{}' is not a table", key, parts[i]);
  }
  table->insert_or_assign(parts.back(), *parsed.get("v"));
}

const toml::node* Config::find(std::string_view key) {
  used_.insert(std::string(key));
  return root_.at_path(key).node();
}

bool Config::has(std::string_view key) const {
  return root_.at_path(key).node() != nullptr;
}

void Config::wrong_type(std::string_view key, std::string_view expected,
                        const toml::node& found) const {
  throw_error("config key {} in {} must be {}, got {}", key, origin_, expected, describe(found));
}

int64_t Config::get_int(std::string_view key, int64_t fallback) {
  const toml::node* node = find(key);
  if (node == nullptr) return fallback;
  if (auto v = node->value_exact<int64_t>()) return *v;
  wrong_type(key, "an integer", *node);
}

double Config::get_double(std::string_view key, double fallback) {
  const toml::node* node = find(key);
  if (node == nullptr) return fallback;
  if (node->is_integer() || node->is_floating_point()) return *node->value<double>();
  wrong_type(key, "a number", *node);
}

bool Config::get_bool(std::string_view key, bool fallback) {
  const toml::node* node = find(key);
  if (node == nullptr) return fallback;
  if (auto v = node->value_exact<bool>()) return *v;
  wrong_type(key, "true or false", *node);
}

std::vector<int64_t> Config::get_int_list(std::string_view key) {
  const toml::node* node = find(key);
  if (node == nullptr) return {};
  std::vector<int64_t> values;
  if (const toml::array* array = node->as_array()) {
    for (const toml::node& item : *array) {
      const auto v = item.value_exact<int64_t>();
      if (!v) wrong_type(key, "an array of integers", *node);
      values.push_back(*v);
    }
    return values;
  }
  wrong_type(key, "an array of integers", *node);
}

std::string Config::get_string(std::string_view key, std::string fallback) {
  const toml::node* node = find(key);
  if (node == nullptr) return fallback;
  if (auto v = node->value_exact<std::string>()) return *v;
  wrong_type(key, "a string", *node);
}

void Config::check_all_used() const {
  std::vector<std::string> keys;
  collect_leaf_keys(root_, "", keys);
  for (const std::string& key : keys) {
    if (used_.count(key) != 0) continue;
    const size_t dot = key.rfind('.');
    const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
    std::string known;
    for (const std::string& u : used_) {
      const size_t udot = u.rfind('.');
      if ((udot == std::string::npos ? "" : u.substr(0, udot)) == section) {
        known += (known.empty() ? "" : ", ") + u.substr(udot + 1);
      }
    }
    if (known.empty()) {
      throw_error("unknown config key '{}' in {}: no section [{}] exists", key, origin_, section);
    }
    throw_error("unknown config key '{}' in {}: [{}] knows {}", key, origin_, section, known);
  }
}

std::string Config::to_toml() const {
  std::ostringstream out;
  out << root_;
  return out.str();
}

}  // namespace brigade
