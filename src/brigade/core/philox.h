// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator. The n-th random number is a pure function
// of (key, counter), so any worker can produce any element of a random stream
// without replaying the ones before it. That is what makes initialisation and
// the data sampler independent of how many workers there are.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace brigade {

// What a random stream is for. Each purpose gets its own Philox key derived
// from the run's seed, so e.g. the data order is not made of the same random
// blocks as the weight initialisation.
enum class RngPurpose : uint64_t {
  kWeightInit = 1,
  kDataOrder = 2,
  kSyntheticTokens = 3,
  kSampling = 4,
};

class Philox {
 public:
  // The key for one purpose under a seed: splitmix64 of the two, which
  // spreads nearby seeds and purposes across the whole key space.
  static uint64_t key(uint64_t seed, RngPurpose purpose) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(purpose) + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  using Block = std::array<uint32_t, 4>;

  // Four 32-bit random words for counter (c_hi, c_lo) under `seed`.
  static Block block(uint64_t seed, uint64_t c_hi, uint64_t c_lo) {
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    Block x = {static_cast<uint32_t>(c_lo), static_cast<uint32_t>(c_lo >> 32),
               static_cast<uint32_t>(c_hi), static_cast<uint32_t>(c_hi >> 32)};
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t{0xD2511F53} * x[0];
      const uint64_t p1 = uint64_t{0xCD9E8D57} * x[2];
      x = {static_cast<uint32_t>(p1 >> 32) ^ x[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ x[3] ^ k1, static_cast<uint32_t>(p0)};
      k0 += 0x9E3779B9;
      k1 += 0xBB67AE85;
    }
    return x;
  }

  // A uniform 64-bit integer for counter (stream, index).
  static uint64_t u64(uint64_t seed, uint64_t stream, uint64_t index) {
    const Block b = block(seed, stream, index);
    return (uint64_t{b[0]} << 32) | b[1];
  }

  // A uniform integer in [0, n), n > 0. The modulo bias is below 2^-32 for
  // n < 2^32, far under anything a training run could notice.
  static uint64_t below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n) {
    return u64(seed, stream, index) % n;
  }

  // Two standard normal samples for counter (stream, index), by Box-Muller.
  static std::array<float, 2> normal2(uint64_t seed, uint64_t stream, uint64_t index) {
    const Block b = block(seed, stream, index);
    // (0, 1]: never log(0).
    const double u1 = (static_cast<double>(b[0]) + 1.0) / 4294967296.0;
    const double u2 = static_cast<double>(b[1]) / 4294967296.0;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 6.283185307179586 * u2;
    return {static_cast<float>(r * std::cos(theta)), static_cast<float>(r * std::sin(theta))};
  }
};

}  // namespace brigade
