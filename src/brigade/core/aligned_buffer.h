// A zero-initialised, 64-byte-aligned array of floats: the flat parameter,
// gradient and optimizer buffers, and the activation arena.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace brigade {

// Frees what FloatBuffer allocated; leaves a view's memory alone.
struct FloatBufferFree {
  bool owned = true;
  void operator()(float* p) const {
    if (owned) std::free(p);
  }
};

class FloatBuffer {
  using Free = FloatBufferFree;

 public:
  FloatBuffer() = default;
  explicit FloatBuffer(int64_t size) : size_(size) {
    if (size == 0) return;
    const size_t bytes = (static_cast<size_t>(size) * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    data_.reset(static_cast<float*>(p));
  }

  // A buffer over memory someone else owns (a shared-memory segment, say);
  // it is not zeroed and never freed here.
  static FloatBuffer view(float* data, int64_t size) {
    FloatBuffer buffer;
    buffer.data_ = std::unique_ptr<float[], Free>(data, Free{false});
    buffer.size_ = size;
    return buffer;
  }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  int64_t size() const { return size_; }
  int64_t bytes() const { return size_ * static_cast<int64_t>(sizeof(float)); }
  void zero() {
    if (size_ > 0) std::memset(data_.get(), 0, static_cast<size_t>(bytes()));
  }

 private:
  std::unique_ptr<float[], Free> data_;
  int64_t size_ = 0;
};

}  // namespace brigade
