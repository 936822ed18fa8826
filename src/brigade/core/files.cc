#include "brigade/core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "brigade/core/error.h"

namespace brigade {
namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw_error("cannot open {}: {}", path.string(),
                fs::exists(path) ? std::strerror(errno) : "no such file");
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw_error("cannot read {}: {}", path.string(), std::strerror(errno));
  return std::move(buffer).str();
}

void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void fsync_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw_error("cannot fsync {}: {}", path.string(), std::strerror(err));
  }
  ::close(fd);
}

AtomicFileWriter::AtomicFileWriter(fs::path path) : path_(std::move(path)) {
  if (path_.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path_.parent_path(), ec);
    if (ec)
      throw_error("cannot create directory {}: {}", path_.parent_path().string(), ec.message());
  }
  // Unique across writers: processes on several nodes may share the
  // directory (their pids collide) and one process may write the same path
  // from two threads; O_EXCL makes sure.
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::random_device random;
  tmp_path_ = path_;
  tmp_path_ += fmt::format(".tmp.{}.{}.{:08x}{:08x}", host, ::getpid(), random(), random());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_error("cannot write {}: {}", tmp_path_.string(), std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  written_ += bytes;
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_error("cannot write {}: {}", tmp_path_.string(), std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::write_direct(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  const size_t blocks = bytes / kDirectAlign * kDirectAlign;
  const int flags = ::fcntl(fd_, F_GETFL);
  if (blocks == 0 || written_ % kDirectAlign != 0 ||
      reinterpret_cast<uintptr_t>(p) % kDirectAlign != 0 || flags < 0 ||
      ::fcntl(fd_, F_SETFL, flags | O_DIRECT) != 0) {
    write(data, bytes);
    return;
  }
  size_t done = 0;
  while (done < blocks) {
    // Whole blocks at a time; a short write stays block-aligned.
    const size_t chunk = std::min<size_t>(blocks - done, size_t{64} << 20);
    const ssize_t n = ::write(fd_, p + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || static_cast<size_t>(n) % kDirectAlign != 0) {
      // The file system took less than it promised: finish buffered.
      ::fcntl(fd_, F_SETFL, flags);
      written_ += done + (n > 0 ? static_cast<size_t>(n) : 0);
      const size_t taken = n > 0 ? static_cast<size_t>(n) : 0;
      write(p + done + taken, bytes - done - taken);
      return;
    }
    done += static_cast<size_t>(n);
  }
  ::fcntl(fd_, F_SETFL, flags);
  written_ += blocks;
  write(p + blocks, bytes - blocks);
}

void AtomicFileWriter::commit() {
  BRIGADE_CHECK(fd_ >= 0, "commit() called twice");
  if (::fsync(fd_) != 0)
    throw_error("cannot fsync {}: {}", tmp_path_.string(), std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp_path_.c_str());
    throw_error("cannot rename {} to {}: {}", tmp_path_.string(), path_.string(), reason);
  }
  fsync_directory(path_.parent_path());
}

// The constructor's name: TARGET.tmp.HOST.PID.HEX (HOST may be empty or
// hold dots, HEX is 16 digits).
bool is_atomic_temp_of(std::string_view file_name, std::string_view target_name) {
  const auto all_of = [](std::string_view text, auto is) {
    return !text.empty() && std::all_of(text.begin(), text.end(), is);
  };
  if (!file_name.starts_with(target_name)) return false;
  std::string_view rest = file_name.substr(target_name.size());
  if (!rest.starts_with(".tmp.")) return false;
  rest.remove_prefix(5);
  const size_t hex_dot = rest.rfind('.');
  if (hex_dot == std::string_view::npos) return false;
  const std::string_view hex = rest.substr(hex_dot + 1);
  const size_t pid_dot = rest.rfind('.', hex_dot == 0 ? 0 : hex_dot - 1);
  if (pid_dot == std::string_view::npos || pid_dot >= hex_dot) return false;
  const std::string_view pid = rest.substr(pid_dot + 1, hex_dot - pid_dot - 1);
  const std::string_view host = rest.substr(0, pid_dot);
  return hex.size() == 16 &&
         all_of(hex, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }) &&
         all_of(pid, [](char c) { return c >= '0' && c <= '9'; }) &&
         host.find('/') == std::string_view::npos;
}

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes);
  writer.commit();
}

AppendFile::AppendFile(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_error("cannot append to {}: {}", path.string(), std::strerror(errno));
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append_line(std::string_view line) {
  std::string bytes;
  bytes.reserve(line.size() + 1);
  bytes.append(line).push_back('\n');
  const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
  if (n != static_cast<ssize_t>(bytes.size())) {
    // A short write to a regular file means the disk is full (or a quota).
    throw_error("cannot append to {}: {}", path_.string(),
                n < 0 ? std::strerror(errno) : "short write (disk full?)");
  }
}

}  // namespace brigade
