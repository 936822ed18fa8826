// Shared by the verbs that take a config file: parse it, apply --set
// overrides in order, and hand it back for the consumers to read.
#pragma once

#include <string>
#include <vector>

#include "brigade/core/config.h"

namespace brigade::cli {

Config load_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace brigade::cli
