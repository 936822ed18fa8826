#include "brigade/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "brigade/core/error.h"
#include "brigade/core/files.h"
#include "brigade/core/stream_store.h"

namespace brigade {
namespace {

int64_t dtype_width(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            std::vector<int64_t> shape, const void* data, int64_t bytes) {
  tensors_.push_back({name, dtype, std::move(shape), data, bytes});
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                const float* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  add(name, "F32", std::move(shape), data, n * 4);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

uint64_t SafetensorsWriter::write(const std::filesystem::path& path) const {
  return write(path, Reuse{});
}

std::string SafetensorsWriter::file_start(int64_t* data_bytes) const {
  nlohmann::ordered_json header;
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  int64_t offset = 0;
  for (const Pending& t : tensors_) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  // Pad so the data section starts 8-byte aligned, as the format recommends;
  // a large file's data section starts on a block boundary, for write_direct.
  const size_t align = offset >= (int64_t{1} << 20) ? AtomicFileWriter::kDirectAlign : 8;
  text.append((align - (sizeof(uint64_t) + text.size()) % align) % align, ' ');
  const uint64_t header_size = text.size();
  std::string start(reinterpret_cast<const char*>(&header_size), sizeof(header_size));
  *data_bytes = offset;
  return start + text;
}

template <typename Fn>
void SafetensorsWriter::for_each_run(Fn&& fn) const {
  // Tensors that lie back to back in memory go out as one run.
  for (size_t i = 0; i < tensors_.size();) {
    const auto* run = static_cast<const char*>(tensors_[i].data);
    size_t bytes = static_cast<size_t>(tensors_[i].bytes);
    for (++i; i < tensors_.size() && tensors_[i].data == run + bytes; ++i) {
      bytes += static_cast<size_t>(tensors_[i].bytes);
    }
    fn(run, bytes);
  }
}

namespace {

// The spare's mapping, whole, if it is a file of exactly `start` followed by
// `data_bytes`; else null (the caller writes a fresh file). Unmapped here
// unless a SpareMappings keeps it.
struct SpareMapping {
  int fd = -1;
  char* map = nullptr;
  size_t bytes = 0;
  bool kept = false;
  ~SpareMapping() {
    if (map != nullptr && !kept) ::munmap(map, bytes);
    if (fd >= 0) ::close(fd);
  }
};

bool map_matching_spare(const std::filesystem::path& spare, const std::string& start,
                        int64_t data_bytes, SpareMappings* mappings, SpareMapping* out) {
  out->fd = ::open(spare.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (out->fd < 0) return false;
  struct stat st {};
  const size_t total = start.size() + static_cast<size_t>(data_bytes);
  if (::fstat(out->fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<size_t>(st.st_size) != total)
    return false;
  out->bytes = total;
  if (mappings != nullptr) {
    out->map = mappings->map(out->fd, total);
    out->kept = true;
    if (out->map == nullptr) return false;
  } else {
    // MAP_POPULATE: the page table in one go, not a fault per page (half
    // the cost of the copy on the development VM).
    void* map =
        ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, out->fd, 0);
    if (map == MAP_FAILED) return false;
    out->map = static_cast<char*>(map);
  }
  return std::memcmp(out->map, start.data(), start.size()) == 0;
}

}  // namespace

SpareMappings::~SpareMappings() {
  for (const Entry& e : entries_) release(e);
}

void SpareMappings::release(const Entry& e) {
  ::munmap(e.map, e.bytes);
  ::close(e.fd);
}

template <typename Pred>
void SpareMappings::drop_if(Pred&& pred) {
  std::erase_if(entries_, [&](const Entry& e) {
    const bool drop = pred(e);
    if (drop) release(e);
    return drop;
  });
}

char* SpareMappings::map(int fd, size_t bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return nullptr;
  const auto dev = static_cast<uint64_t>(st.st_dev), ino = static_cast<uint64_t>(st.st_ino);
  // Removed files first, and a kept mapping of this file at another size.
  sweep_locked();
  drop_if([&](const Entry& e) { return e.dev == dev && e.ino == ino && e.bytes != bytes; });
  for (Entry& e : entries_) {
    if (e.dev == dev && e.ino == ino) {
      e.last_use = ++uses_;
      return e.map;
    }
  }
  if (!entries_.empty() && entries_.size() >= capacity_) {
    const auto oldest =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
    release(*oldest);
    entries_.erase(oldest);
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) return nullptr;
  const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) {
    ::munmap(map, bytes);
    return nullptr;
  }
  entries_.push_back({dev, ino, own, static_cast<char*>(map), bytes, ++uses_});
  return static_cast<char*>(map);
}

void SpareMappings::sweep() {
  const std::lock_guard<std::mutex> lock(mutex_);
  sweep_locked();
}

void SpareMappings::sweep_locked() {
  drop_if([](const Entry& e) {
    struct stat now {};
    return ::fstat(e.fd, &now) != 0 || now.st_nlink == 0;
  });
}

void SpareMappings::forget(int fd) {
  const std::lock_guard<std::mutex> lock(mutex_);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  drop_if([&](const Entry& e) {
    return e.dev == static_cast<uint64_t>(st.st_dev) && e.ino == static_cast<uint64_t>(st.st_ino);
  });
}

uint64_t SafetensorsWriter::write(const std::filesystem::path& path, const Reuse& reuse) const {
  int64_t data_bytes = 0;
  const std::string start = file_start(&data_bytes);
  // Freed however the writes end (a full disk throws from out.write).
  const std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                         &XXH64_freeState);
  XXH64_state_t* hash = state.get();
  XXH64_reset(hash, 0);
  auto digest = [&](const void* data, size_t bytes) {
    if (reuse.checksum) XXH64_update(hash, data, bytes);
  };
  digest(start.data(), start.size());

  if (!reuse.spare.empty()) {
    SpareMapping spare;
    if (map_matching_spare(reuse.spare, start, data_bytes, reuse.mappings, &spare)) {
      size_t at = start.size();
      for_each_run([&](const char* run, size_t bytes) {
        constexpr size_t kBlock = size_t{256} << 10;
        for (size_t done = 0; done < bytes; done += kBlock) {
          const size_t n = std::min(kBlock, bytes - done);
          copy_nontemporal(spare.map + at + done, run + done, n);
          digest(run + done, n);
          if (reuse.read) reuse.read(run + done, n);
        }
        at += bytes;
      });
      store_fence();
      if (::rename(reuse.spare.c_str(), path.c_str()) != 0) {
        throw_error("cannot rename {} to {}: {}", reuse.spare.string(), path.string(),
                    std::strerror(errno));
      }
      return reuse.checksum ? XXH64_digest(hash) : 0;
    }
    // Another model's or layout's file: its memory is not kept waiting.
    if (reuse.mappings != nullptr && spare.fd >= 0) reuse.mappings->forget(spare.fd);
    ::unlink(reuse.spare.c_str());
  }
  AtomicFileWriter out(path);
  out.write(start);
  for_each_run([&](const char* run, size_t bytes) {
    out.write_direct(run, bytes);
    digest(run, bytes);
    if (reuse.read) reuse.read(run, bytes);
  });
  out.commit();
  return reuse.checksum ? XXH64_digest(hash) : 0;
}

std::vector<char*> SafetensorsWriter::claim(const std::filesystem::path& spare,
                                            const std::filesystem::path& path,
                                            SpareMappings& mappings) const {
  int64_t data_bytes = 0;
  const std::string start = file_start(&data_bytes);
  // The rename first: it takes whatever file is the spare at that instant,
  // which a prune on another thread may replace at any time; the file
  // mapped is then the one at `path`, which nothing else renames.
  if (::rename(spare.c_str(), path.c_str()) != 0) return {};
  SpareMapping mapping;
  if (!map_matching_spare(path, start, data_bytes, &mappings, &mapping)) {
    // Another model's or layout's file: its memory is not kept waiting.
    if (mapping.fd >= 0) mappings.forget(mapping.fd);
    ::unlink(path.c_str());
    return {};
  }
  std::vector<char*> data;
  char* next = mapping.map + start.size();
  for (const Pending& t : tensors_) {
    data.push_back(next);
    next += t.bytes;
  }
  return data;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw_error("cannot open {}: {}", path.string(),
                errno == ENOENT ? "no such file" : std::strerror(errno));
  }
  struct stat st {};
  ::fstat(fd, &st);
  map_bytes_ = static_cast<size_t>(st.st_size);
  if (map_bytes_ < 8) {
    ::close(fd);
    throw_error("{} is not a safetensors file: only {} bytes", path.string(), map_bytes_);
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw_error("cannot map {}: {}", path.string(), std::strerror(errno));
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, map_, 8);
  if (header_size > map_bytes_ - 8 || header_size > (uint64_t{100} << 20)) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw_error("{} is not a safetensors file or is truncated: header size {} but file size {}",
                path.string(), header_size, st.st_size);
  }
  const char* base = static_cast<const char*>(map_);
  data_section_ = base + 8 + header_size;
  const int64_t data_bytes = static_cast<int64_t>(map_bytes_ - 8 - header_size);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + header_size);
  } catch (const nlohmann::json::exception& e) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw_error("{}: corrupt safetensors header: {}", path.string(), e.what());
  }
  try {
    for (auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        for (auto& [k, v] : value.items()) metadata_[k] = v.get<std::string>();
        continue;
      }
      TensorEntry e;
      e.dtype = value.at("dtype").get<std::string>();
      e.shape = value.at("shape").get<std::vector<int64_t>>();
      e.begin = value.at("data_offsets").at(0).get<int64_t>();
      e.end = value.at("data_offsets").at(1).get<int64_t>();
      const int64_t width = dtype_width(e.dtype);
      if (width == 0)
        throw_error("{}: tensor {} has unknown dtype {}", path.string(), name, e.dtype);
      if (e.begin < 0 || e.end < e.begin || e.end > data_bytes) {
        throw_error(
            "{} is truncated or corrupt: tensor {} spans bytes [{}, {}) but the data "
            "section holds {} bytes",
            path.string(), name, e.begin, e.end, data_bytes);
      }
      if (e.end - e.begin != e.numel() * width) {
        throw_error("{}: tensor {} has shape {} of {} but {} bytes", path.string(), name,
                    shape_string(e.shape), e.dtype, e.end - e.begin);
      }
      tensors_.emplace(name, std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw_error("{}: malformed safetensors header: {}", path.string(), e.what());
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const void* SafetensorsFile::data(const TensorEntry& entry) const {
  return data_section_ + entry.begin;
}

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape,
                               float* dst) const {
  const TensorEntry* e = find(name);
  if (e == nullptr) throw_error("{} has no tensor {}", path_.string(), name);
  if (e->shape != shape) {
    throw_error("{}: tensor {} has shape {} but the model expects {}", path_.string(), name,
                shape_string(e->shape), shape_string(shape));
  }
  const int64_t n = e->numel();
  const char* src = data_section_ + e->begin;
  if (e->dtype == "F32") {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (e->dtype == "BF16" || e->dtype == "F16") {
    const bool bf16 = e->dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      if (bf16) {
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(dst + i, &bits, 4);
      } else {
        dst[i] = half_to_float(h);
      }
    }
  } else {
    throw_error("{}: tensor {} has dtype {}; expected F32, F16 or BF16", path_.string(), name,
                e->dtype);
  }
}

}  // namespace brigade
