#include "brigade/kernels/cpu/gemm.h"

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>

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

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  ensure_limited();
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  BRIGADE_CHECK(status == dnnl_success, "dnnl_sgemm({}x{}x{}, lda {}, ldb {}, ldc {}) failed: {}",
                m, n, k, lda, ldb, ldc, static_cast<int>(status));
}

std::string gemm_backend() {
  ensure_limited();
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}, {}", v->major, v->minor, v->patch,
                     dnnl_isa_name(dnnl_get_effective_cpu_isa()));
}

int64_t gemm_isa() {
  ensure_limited();
  return static_cast<int64_t>(dnnl_get_effective_cpu_isa());
}

}  // namespace brigade::cpu
