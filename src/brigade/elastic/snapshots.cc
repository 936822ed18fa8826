#include "brigade/elastic/snapshots.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

#include "brigade/ckpt/checkpoint.h"

namespace brigade::elastic {
namespace fs = std::filesystem;

std::optional<SnapshotArea> SnapshotArea::create(const fs::path& parent) {
  // mkdtemp: a fresh name, created 0700, so no other user's process can
  // plant or read state there.
  std::string name = (parent / "brigade-snapshots-XXXXXX").string();
  if (::mkdtemp(name.data()) == nullptr) {
    std::fprintf(stderr,
                 "brigade launch: no in-memory snapshots: cannot create a directory in %s (%s); "
                 "restarts resume from the newest disk checkpoint\n",
                 parent.c_str(), std::strerror(errno));
    return std::nullopt;
  }
  return SnapshotArea(fs::path(name));
}

SnapshotArea::SnapshotArea(SnapshotArea&& other) noexcept : path_(std::move(other.path_)) {
  other.path_.clear();
}

SnapshotArea::~SnapshotArea() {
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (ec) {
    std::fprintf(stderr, "brigade launch: could not remove the snapshots in %s: %s\n",
                 path_.c_str(), ec.message().c_str());
  }
}

int64_t step_of(const fs::path& step_dir) {
  const std::string name = step_dir.filename().string();
  return std::strtoll(name.c_str() + name.find('_') + 1, nullptr, 10);
}

std::optional<ResumePoint> newest_resume_point(const fs::path& run_dir, const fs::path& snapshots) {
  std::optional<ResumePoint> best;
  if (auto dir = latest_checkpoint(run_dir / "checkpoints"))
    best = ResumePoint{*dir, step_of(*dir)};
  if (!snapshots.empty()) {
    if (auto dir = latest_checkpoint(snapshots)) {
      const int64_t step = step_of(*dir);
      if (!best || step > best->step) best = ResumePoint{*dir, step, true};
    }
  }
  return best;
}

}  // namespace brigade::elastic
