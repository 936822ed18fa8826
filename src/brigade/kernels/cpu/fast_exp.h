// exp(x) for float, written so loops over it vectorise. libm's expf is a
// call the compiler cannot turn into SIMD without -ffast-math, and -ffast-math
// would also let it assume no NaN/Inf, which our divergence checks rely on.
//
// Method: exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in
// [-ln2/2, ln2/2] (ln 2 split in two parts so r is exact), exp(r) by its
// degree-6 Taylor polynomial (relative error < 3e-7 there), 2^n written into
// the exponent bits. The rounding uses the 1.5 * 2^23 trick: adding it leaves
// round(x / ln 2) in the low mantissa bits, with no call to a rounding
// function. Inputs below -87.3 give 0 (true exp is subnormal there), above
// 88.37 +inf; NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace brigade::cpu {

inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
  constexpr float kMin = -87.33654f;          // exp(kMin) = FLT_MIN, the smallest normal
  constexpr float kMax = 88.37626f;           // 2^n stays below 2^128
  const float xc = x < kMin ? kMin : (x > kMax ? kMax : x);
  const float shifted = xc * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRoundMagic);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  float result = p * std::bit_cast<float>((ni + 127) << 23);
  result = x < kMin ? 0.0f : result;
  result = x > kMax ? __builtin_inff() : result;
  return x != x ? x : result;
}

}  // namespace brigade::cpu
