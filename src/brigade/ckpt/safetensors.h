// The safetensors format (Hugging Face): an 8-byte little-endian header size
// N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {string: string}}, then the tensor bytes, offsets relative
// to the end of the header. Chosen because every tool in the ecosystem reads
// it and it cannot execute code on load.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace brigade {

struct TensorEntry {
  std::string dtype;  // "F32", "F16", "BF16", "I32", "I64", "U8", ...
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte offsets into the data section
  int64_t end = 0;
  int64_t numel() const;
};

// The shared mappings of recycled spare files (SafetensorsWriter::Reuse),
// kept from one write to the next. Mapping a 743 MB tmpfs file with its
// page table filled (MAP_POPULATE) and unmapping it again take 70 ms of CPU
// on the development VM, more than the copy through the mapping (47 ms),
// and a snapshot every step would pay that every step. A mapping is found
// again by its file's inode, so it survives the renames that move a file
// between a step's directory and the spares. A kept mapping holds its
// file's memory even once the file is removed: map() and sweep() let go
// of the mappings of removed files, and at most `capacity` are kept (the
// least recently used goes). The kept pages count in the process's RSS
// (up to `capacity` shards' worth while snapshots run). Thread-safe: the
// writer thread maps the spares it copies into, the training thread the
// one an update writes into (SafetensorsWriter::claim).
class SpareMappings {
 public:
  explicit SpareMappings(size_t capacity = 4) : capacity_(capacity) {}
  ~SpareMappings();
  SpareMappings(const SpareMappings&) = delete;
  SpareMappings& operator=(const SpareMappings&) = delete;
  // The file open as `fd`, all `bytes` of it, mapped shared and writable:
  // the kept mapping of the same file and size, else a new one; null if it
  // cannot be mapped.
  char* map(int fd, size_t bytes);
  // Lets go of the file's mapping, if one is kept (before the file is
  // removed, so its memory goes with it).
  void forget(int fd);
  // Lets go of the mappings of files removed since (a cleared area, a
  // prune that left no spare): their memory is freed only once unmapped.
  void sweep();
  // Keeps at least `capacity` mappings from now on (the files a save
  // rotates through: the kept saves and the one being written).
  void reserve(size_t capacity) {
    const std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = std::max(capacity_, capacity);
  }
  // Mappings kept.
  size_t size() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  struct Entry {
    uint64_t dev = 0, ino = 0;
    int fd = -1;  // a duplicate: fstat tells when the file is removed
    char* map = nullptr;
    size_t bytes = 0;
    uint64_t last_use = 0;
  };
  static void release(const Entry& e);
  // Unmaps and forgets the entries `pred` picks.
  template <typename Pred>
  void drop_if(Pred&& pred);
  void sweep_locked();
  mutable std::mutex mutex_;
  size_t capacity_;
  uint64_t uses_ = 0;
  std::vector<Entry> entries_;
};

// Builds a file in memory-order of add() calls and writes it atomically.
class SafetensorsWriter {
 public:
  // Records the tensor; `data` must stay valid until write().
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const void* data, int64_t bytes);
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data);
  void set_metadata(const std::string& key, const std::string& value);
  // Returns the xxHash64 (seed 0) of the file's bytes, computed as they are
  // written, so a checksum costs no second pass over the file.
  uint64_t write(const std::filesystem::path& path) const;

  // How an in-memory snapshot is written every step. `spare` names an
  // earlier file of the same tensors (the same header, byte for byte): it is
  // overwritten in place through a shared mapping and renamed to `path`, so
  // the pages it already holds are reused. On tmpfs that is one memcpy of
  // the data; a fresh file costs five times that in page allocation, zeroing
  // and freeing (743 MB: 75 ms against 350 + 65 ms on the development VM).
  // Without a spare that matches, a fresh file is written as write() does.
  // checksum = false skips the xxHash64 (which costs more than the copy)
  // and returns 0.
  //
  // Into a spare, the data goes in blocks of 256 KB with non-temporal
  // stores (the copy is never read back by this process, so it need not
  // evict the training's working set from the caches), and `read`, if set,
  // is called on each block's source right after it is copied, while it is
  // still in cache; when a fresh file is written, on each run of tensors
  // adjacent in memory. Every byte of data is passed once, in file order.
  // `mappings`, if set, keeps the spare's mapping for the next write.
  struct Reuse {
    std::filesystem::path spare;
    bool checksum = true;
    std::function<void(const void* data, size_t bytes)> read;
    SpareMappings* mappings = nullptr;
  };
  uint64_t write(const std::filesystem::path& path, const Reuse& reuse) const;

  // Claims `spare` for the caller to write the data in place: it is
  // renamed to `path` (the rename makes it the caller's, whatever renames
  // another spare to `spare` before or after), and if it matches (as for
  // write(): the same header) mapped through `mappings`, which keeps the
  // mapping. Returns where each tensor's data starts in the mapping, in
  // add() order; empty if there is no spare, or it does not match (then it
  // is removed, as write() removes one). The caller then writes every
  // tensor's bytes and fences its stores (core/stream_store.h). The `data`
  // pointers given to add() are not read.
  std::vector<char*> claim(const std::filesystem::path& spare, const std::filesystem::path& path,
                           SpareMappings& mappings) const;

 private:
  // The 8-byte size, the header and its padding; *data_bytes: the data's size.
  std::string file_start(int64_t* data_bytes) const;
  // fn(data, bytes) for each run of tensors adjacent in memory, in file order.
  template <typename Fn>
  void for_each_run(Fn&& fn) const;

  struct Pending {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    const void* data;
    int64_t bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A safetensors file opened read-only through mmap. The header is validated
// on open (size, JSON, every offset inside the file, bytes = numel * width),
// so a truncated or corrupt file is an Error naming the file and the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorEntry* find(const std::string& name) const;
  const void* data(const TensorEntry& entry) const;
  const std::filesystem::path& path() const { return path_; }

  // Copies tensor `name` into dst as float32, converting F16/BF16; the shape
  // must equal `shape` (Error otherwise, naming both).
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const char* data_section_ = nullptr;
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace brigade
