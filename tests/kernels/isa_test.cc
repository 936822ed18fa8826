// The CPU's features as CPUID reports them, the level the kernels run at, and
// the GEMM against a plain triple loop. ctest runs this binary three times:
// at the best level (no variable), and with BRIGADE_CPU_ISA=avx2 and =avx512
// (the last is skipped on a CPU without AVX-512): tests/CMakeLists.txt.
#include "brigade/kernels/cpu/isa.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "brigade/core/error.h"
#include "brigade/kernels/cpu/gemm.h"

namespace brigade {
namespace BRIGADE_TEST_FILE {

// What Linux says about CPU 0: its flags and the fields CPUID also gives.
struct ProcCpu {
  std::set<std::string> flags;
  std::string vendor, model_name;
  int family = -1, model = -1;
};

ProcCpu read_proc_cpuinfo() {
  ProcCpu p;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) break;  // the first processor only
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "flags") {
      std::istringstream words(value);
      for (std::string w; words >> w;) p.flags.insert(w);
    } else if (key == "vendor_id") {
      p.vendor = value;
    } else if (key == "model name") {
      p.model_name = value;
    } else if (key == "cpu family") {
      p.family = std::stoi(value);
    } else if (key == "model") {
      p.model = std::stoi(value);
    }
  }
  return p;
}

TEST(CpuFeatures, AgreeWithTheKernelsView) {
  const ProcCpu proc = read_proc_cpuinfo();
  ASSERT_FALSE(proc.flags.empty()) << "no flags line in /proc/cpuinfo";
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const auto has = [&](const char* flag) { return proc.flags.count(flag) > 0; };
  EXPECT_EQ(f.vendor, proc.vendor);
  // The brand is CPUID's own string; the kernel's "model name" usually is
  // the same, but a hypervisor may show another (a VM reporting "AMD EPYC"
  // in /proc/cpuinfo and "Oxide Virtual Turin-like Processor" in CPUID), so
  // only its presence is compared.
  EXPECT_EQ(f.brand.empty(), proc.model_name.empty()) << "CPUID brand: '" << f.brand << "'";
  EXPECT_EQ(f.family, proc.family);
  EXPECT_EQ(f.model, proc.model);
  EXPECT_EQ(f.fma, has("fma"));
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.avx512, has("avx512f") && has("avx512cd") && has("avx512bw") && has("avx512dq") &&
                          has("avx512vl"));
  EXPECT_EQ(f.avx512_bf16, f.avx512 && has("avx512_bf16"));
  EXPECT_EQ(f.amx, has("amx_tile") && has("amx_bf16"));
}

TEST(CpuIsa, ForcedLevelReachesTheKernelsAndTheGemm) {
  const char* env = std::getenv("BRIGADE_CPU_ISA");
  const cpu::Isa want = (env != nullptr && *env != '\0')
                            ? (std::string(env) == "avx2" ? cpu::Isa::kAvx2 : cpu::Isa::kAvx512)
                            : cpu::best_isa(cpu::cpu_features());
  EXPECT_EQ(cpu::active_isa(), want);
  // The compiler's own macros in the build the dispatcher called.
  EXPECT_STREQ(cpu::kernels_compiled_for(), cpu::isa_name(want));
  const std::string backend = cpu::gemm_backend();
  if (want == cpu::Isa::kAvx2) {
    EXPECT_NE(backend.find(", avx2"), std::string::npos) << backend;
    // scripts/install_deps.sh installs OpenBLAS's OpenMP build, so here the
    // weight gradients must have found it.
    EXPECT_NE(backend.find("weight gradients (A^T B): OpenBLAS"), std::string::npos) << backend;
  } else {
    EXPECT_NE(backend.find(", avx512"), std::string::npos) << backend;
  }
  EXPECT_NE(cpu::describe_cpu().find(want == cpu::Isa::kAvx2 ? "AVX2" : "AVX-512"),
            std::string::npos)
      << cpu::describe_cpu();
}

TEST(CpuIsa, RequestsTheCpuCannotServeAreRefusedWithTheFix) {
  cpu::CpuFeatures avx2_only;
  avx2_only.avx2 = avx2_only.fma = true;
  EXPECT_EQ(cpu::choose_isa(avx2_only, nullptr), cpu::Isa::kAvx2);
  EXPECT_EQ(cpu::choose_isa(avx2_only, ""), cpu::Isa::kAvx2);
  cpu::CpuFeatures avx512 = avx2_only;
  avx512.avx512 = true;
  EXPECT_EQ(cpu::choose_isa(avx512, nullptr), cpu::Isa::kAvx512);
  EXPECT_EQ(cpu::choose_isa(avx512, "avx2"), cpu::Isa::kAvx2);
  EXPECT_EQ(cpu::choose_isa(avx512, "avx512"), cpu::Isa::kAvx512);
  const auto message = [](const cpu::CpuFeatures& f, const char* requested) {
    try {
      cpu::choose_isa(f, requested);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(avx2_only, "avx512").find("set it to avx2"), std::string::npos);
  EXPECT_NE(message(avx512, "avx3").find("use avx2 or avx512"), std::string::npos);
  cpu::CpuFeatures old;  // SSE only
  EXPECT_NE(message(old, nullptr).find("lacks AVX2/FMA"), std::string::npos);
}

// C = alpha op(A) op(B) + beta C in double, the reference.
std::vector<float> reference_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                  const std::vector<float>& a, int64_t lda,
                                  const std::vector<float>& b, int64_t ldb, float beta,
                                  std::vector<float> c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float av = ta ? a[p * lda + i] : a[i * lda + p];
        const float bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += static_cast<double>(av) * bv;
      }
      c[i * ldc + j] = static_cast<float>(alpha * sum + beta * c[i * ldc + j]);
    }
  }
  return c;
}

// Run at both levels (tests/CMakeLists.txt). The sizes are not multiples of
// any vector width, and the strides are wider than the rows (a view into a
// larger matrix, as attention's per-head GEMMs use). The second size is a
// weight gradient's: at the AVX2 level its A^T B runs in OpenBLAS.
class Gemm : public ::testing::TestWithParam<std::array<int64_t, 3>> {};

TEST_P(Gemm, MatchesTheReferenceForEveryTransposeAndStride) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  const auto [m, n, k] = GetParam();
  const int64_t pad = 5;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
      std::vector<float> a((ta ? k : m) * lda), b((tb ? n : k) * ldb), c(m * ldc);
      for (auto& x : a) x = u(rng);
      for (auto& x : b) x = u(rng);
      for (auto& x : c) x = u(rng);
      const float alpha = 0.75f, beta = -0.5f;
      const auto want = reference_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      cpu::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < ldc; ++j) {
          // Columns past n belong to someone else: untouched.
          ASSERT_NEAR(c[i * ldc + j], want[i * ldc + j], 1e-4f * static_cast<float>(k) / 131)
              << "ta " << ta << " tb " << tb << " at (" << i << ", " << j << ")";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, Gemm,
                         ::testing::Values(std::array<int64_t, 3>{37, 53, 131},
                                           std::array<int64_t, 3>{131, 203, 517}));

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
