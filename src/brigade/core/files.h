// Whole-file reads and crash-safe writes.
//
// Every file Brigade writes for a user (checkpoints, token shards, tokenizer
// files) goes through write_file_atomic: the bytes land in a temporary file
// next to the target, are fsynced, and only then renamed over it. A crash or a
// failed write leaves either the old file or the new one, never half of one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace brigade {

// Reads the whole file; throws Error naming the path if it cannot.
std::string read_file(const std::filesystem::path& path);

// Writes `bytes` to `path` atomically (temp file, fsync, rename, fsync dir).
// Creates missing parent directories.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

// Makes a directory's entries (a rename, a new file) durable.
void fsync_directory(const std::filesystem::path& dir);
// fsyncs a file written by other means (a copy); Error if it cannot be.
void fsync_file(const std::filesystem::path& path);

// Streams data into a temporary file and renames it into place on commit().
// If the object is destroyed without commit(), the temporary is removed and
// the target is untouched.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Like write, but when the file position and `data` are both aligned to
  // kDirectAlign, the whole aligned blocks bypass the page cache (O_DIRECT):
  // no copy into kernel memory and no cache pushed out, which is what a
  // checkpoint written in the background while training needs. Falls back
  // to write() where the file system refuses direct I/O.
  static constexpr size_t kDirectAlign = 4096;
  void write_direct(const void* data, size_t bytes);
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path tmp_path_;
  int fd_ = -1;
  size_t written_ = 0;  // the file position
};

// Whether `file_name` is a temporary that an AtomicFileWriter of
// `target_name` (in the same directory) made: what a writer killed before
// it could remove its temporary leaves behind, for whoever knows that no
// writer of that target is alive to sweep it.
bool is_atomic_temp_of(std::string_view file_name, std::string_view target_name);

// A log of lines (metrics.jsonl, incidents.jsonl): each line goes out in
// one write() on an O_APPEND descriptor, so a process killed between lines
// leaves whole lines (a buffered stream writes a long line in pieces, and a
// kill between them left half of one, which the resumed run then appended
// to), and lines from several processes never interleave.
class AppendFile {
 public:
  // Creates the file if missing; throws Error naming it if it cannot be opened.
  explicit AppendFile(const std::filesystem::path& path);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  // Appends `line` and a newline; throws Error naming the file on failure.
  void append_line(std::string_view line);

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace brigade
