#include "brigade/cli/load_config.h"

namespace brigade::cli {

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config config = Config::from_file(path);
  for (const std::string& assignment : overrides) config.set(assignment);
  return config;
}

}  // namespace brigade::cli
