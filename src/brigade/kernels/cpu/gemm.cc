#include "brigade/kernels/cpu/gemm.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "brigade/core/error.h"
#include "brigade/kernels/cpu/isa.h"

namespace brigade::cpu {
namespace {

const char* dnnl_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

// Holds oneDNN to Brigade's level before it generates any code: with
// BRIGADE_CPU_ISA=avx2 on an AVX-512 machine, the GEMMs must run the AVX2
// path too. oneDNN refuses the call once it has generated code, which only
// Brigade's own first GEMM does.
bool limit_onednn() {
  const dnnl_cpu_isa_t max = active_isa() == Isa::kAvx2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_all;
  BRIGADE_CHECK(dnnl_set_max_cpu_isa(max) == dnnl_success,
                "oneDNN generated code before Brigade set its ISA");
  return true;
}

void ensure_limited() {
  static const bool limited = limit_onednn();
  (void)limited;
}

// OpenBLAS's Haswell kernels, for the A^T B products oneDNN runs slowly at
// the AVX2 level (gemm.h). Loaded at run time, not linked: OpenBLAS picks
// its kernels by CPU model when it initialises, and on a CPU it does not
// know (a VM hiding the model, a newer generation) it falls back to generic
// SSE3 code; naming the core for it is only possible before that, through
// OPENBLAS_CORETYPE. The OpenMP build by its own path, whatever the system's
// alternative names: it must share Brigade's OpenMP team, not start its own
// threads.
struct OpenBlas {
  using Sgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
  Sgemm sgemm = nullptr;
  std::string description;  // "OpenBLAS 0.3.21 Haswell"
};

constexpr const char* kOpenBlasPath = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0";

std::optional<OpenBlas> load_openblas() {
  const char* prior = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = prior != nullptr ? prior : "";
  // Only this process's loader reads it: restored at once, so workers this
  // process starts see the user's value.
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  void* lib = dlopen(kOpenBlasPath, RTLD_NOW | RTLD_LOCAL);
  if (prior != nullptr)
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  if (lib == nullptr) return std::nullopt;
  using Name = char* (*)();
  auto sgemm = reinterpret_cast<OpenBlas::Sgemm>(dlsym(lib, "cblas_sgemm"));
  auto core = reinterpret_cast<Name>(dlsym(lib, "openblas_get_corename"));
  auto config = reinterpret_cast<Name>(dlsym(lib, "openblas_get_config"));
  // Loaded earlier by someone else with another core: its results would
  // differ from every other rank's, so it is not used.
  if (sgemm == nullptr || core == nullptr || std::strcmp(core(), "Haswell") != 0) {
    return std::nullopt;
  }
  std::string version = config != nullptr ? config() : "";  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  version = version.substr(0, version.find(' ', std::strlen("OpenBLAS ")));
  return OpenBlas{sgemm, version.empty() ? "OpenBLAS" : version + " Haswell"};
}

const OpenBlas* avx2_weight_gradients() {
  static const std::optional<OpenBlas> lib =
      active_isa() == Isa::kAvx2 ? load_openblas() : std::nullopt;
  return lib ? &*lib : nullptr;
}

// The products gemm.h sends to OpenBLAS: A^T B whose output is at least 128
// on each side (attention's per-head products, 64 wide, stay with oneDNN)
// and at most 2^20 elements (larger ones run as fast in oneDNN).
bool openblas_shape(bool trans_a, bool trans_b, int64_t m, int64_t n) {
  return trans_a && !trans_b && std::min(m, n) >= 128 && m * n <= (int64_t{1} << 20);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  ensure_limited();
  if (openblas_shape(trans_a, trans_b, m, n)) {
    if (const OpenBlas* blas = avx2_weight_gradients()) {
      constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // cblas.h's enums
      blas->sgemm(kRowMajor, kTrans, kNoTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                  beta, c, static_cast<int>(ldc));
      return;
    }
  }
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  BRIGADE_CHECK(status == dnnl_success, "dnnl_sgemm({}x{}x{}, lda {}, ldb {}, ldc {}) failed: {}",
                m, n, k, lda, ldb, ldc, static_cast<int>(status));
}

std::string gemm_backend() {
  ensure_limited();
  const dnnl_version_t* v = dnnl_version();
  std::string backend = fmt::format("oneDNN {}.{}.{}, {}", v->major, v->minor, v->patch,
                                    dnnl_isa_name(dnnl_get_effective_cpu_isa()));
  if (const OpenBlas* blas = avx2_weight_gradients()) {
    backend += fmt::format("; weight gradients (A^T B): {}", blas->description);
  } else if (active_isa() == Isa::kAvx2) {
    backend += fmt::format(
        "; weight gradients in oneDNN, up to half as fast ({} missing, or loaded with "
        "another core; install libopenblas0-openmp)",
        kOpenBlasPath);
  }
  return backend;
}

int64_t gemm_isa() {
  ensure_limited();
  // Bit 32: OpenBLAS runs the weight gradients (a different reduction order).
  return static_cast<int64_t>(dnnl_get_effective_cpu_isa()) |
         (avx2_weight_gradients() != nullptr ? int64_t{1} << 32 : 0);
}

}  // namespace brigade::cpu
