#include "brigade/elastic/snapshots.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include "brigade/ckpt/checkpoint.h"
#include "brigade/core/error.h"

namespace brigade::elastic {
namespace fs = std::filesystem;

namespace {

constexpr char kPrefix[] = "brigade-snapshots-";

// Areas of agents that died without removing theirs (SIGKILL, the OOM
// killer): this user's, not locked by a live agent, and not brand new (an
// agent locks its area just after creating it). They hold whole copies of
// a model's state in RAM, so they must not pile up.
void remove_stale_areas(const fs::path& parent) {
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid()) {
      continue;
    }
    std::error_code time_ec;
    if (now - fs::last_write_time(entry.path(), time_ec) < std::chrono::minutes(1) || time_ec) {
      continue;
    }
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::error_code rm_ec;
      fs::remove_all(entry.path(), rm_ec);
      if (!rm_ec) {
        std::fprintf(stderr, "brigade launch: removed the snapshots of an agent that is gone: %s\n",
                     entry.path().c_str());
      }
    }
    ::close(fd);
  }
}

}  // namespace

std::optional<SnapshotArea> SnapshotArea::create(const fs::path& parent) {
  remove_stale_areas(parent);
  // mkdtemp: a fresh name, created 0700, so no other user's process can
  // plant or read state there.
  std::string name = (parent / (std::string(kPrefix) + "XXXXXX")).string();
  if (::mkdtemp(name.data()) == nullptr) {
    std::fprintf(stderr,
                 "brigade launch: no in-memory snapshots: cannot create a directory in %s (%s); "
                 "restarts resume from the newest disk checkpoint\n",
                 parent.c_str(), std::strerror(errno));
    return std::nullopt;
  }
  SnapshotArea area{fs::path(name)};
  // Held until this agent ends, however it ends: the kernel drops the lock
  // of a dead process, which is how the next agent knows the area is stale.
  area.lock_fd_ = ::open(name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (area.lock_fd_ >= 0) ::flock(area.lock_fd_, LOCK_EX | LOCK_NB);
  return area;
}

SnapshotArea::SnapshotArea(SnapshotArea&& other) noexcept
    : path_(std::move(other.path_)), lock_fd_(std::exchange(other.lock_fd_, -1)) {
  other.path_.clear();
}

SnapshotArea::~SnapshotArea() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
  if (path_.empty()) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
  if (ec) {
    std::fprintf(stderr, "brigade launch: could not remove the snapshots in %s: %s\n",
                 path_.c_str(), ec.message().c_str());
  }
}

std::optional<ResumePoint> newest_resume_point(const fs::path& run_dir, const fs::path& snapshots) {
  std::optional<ResumePoint> best;
  if (auto dir = latest_checkpoint(run_dir / "checkpoints"))
    best = ResumePoint{*dir, checkpoint_step(*dir)};
  if (!snapshots.empty()) {
    if (auto dir = latest_checkpoint(snapshots)) {
      const int64_t step = checkpoint_step(*dir);
      if (!best || step > best->step) {
        // A snapshot that does not verify (sizes, the manifest's own
        // checksum; its shards carry none) would fail every restart that
        // tried it.
        try {
          verify_checkpoint(*dir, /*snapshot=*/true);
          best = ResumePoint{*dir, step, true};
        } catch (const Error& e) {
          std::fprintf(stderr, "brigade launch: not resuming from the in-memory snapshot: %s\n",
                       e.what());
        }
      }
    }
  }
  return best;
}

}  // namespace brigade::elastic
