#include "brigade/core/clock.h"

#include <fstream>

namespace brigade {

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace brigade
