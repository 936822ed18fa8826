// The public kernels (declared in the headers beside this file) call the
// build of the active level: brigade::cpu::avx2 or brigade::cpu::avx512
// (see isa_variant.h). Each line below names a kernel once, with its
// parameters and the arguments it passes on; a line that disagrees with the
// header leaves the header's function undefined, a link error.
#include <cstdint>

#include "brigade/kernels/cpu/attention.h"
#include "brigade/kernels/cpu/embedding.h"
#include "brigade/kernels/cpu/gelu.h"
#include "brigade/kernels/cpu/isa.h"
#include "brigade/kernels/cpu/layernorm.h"
#include "brigade/kernels/cpu/linear.h"
#include "brigade/kernels/cpu/lm_head_loss.h"
#include "brigade/kernels/cpu/vector_ops.h"

// clang-format off
#define BRIGADE_CPU_KERNELS(X)                                                                   \
  X(void, attention_forward, (float* out, float* lse, const float* qkv, int64_t b, int64_t t,    \
    int64_t c, int64_t num_heads, float* scratch), (out, lse, qkv, b, t, c, num_heads, scratch)) \
  X(void, attention_backward, (float* dqkv, const float* dout, const float* qkv,                 \
    const float* out, const float* lse, int64_t b, int64_t t, int64_t c, int64_t num_heads,      \
    float* scratch), (dqkv, dout, qkv, out, lse, b, t, c, num_heads, scratch))                   \
  X(void, embedding_forward, (float* out, const int32_t* tokens, const float* wte,               \
    const float* wpe, int64_t b, int64_t t, int64_t c), (out, tokens, wte, wpe, b, t, c))        \
  X(void, embedding_backward, (float* dwte, float* dwpe, const float* dout,                      \
    const int32_t* tokens, int64_t b, int64_t t, int64_t c), (dwte, dwpe, dout, tokens, b, t, c))\
  X(void, gelu_forward, (float* out, const float* x, int64_t n), (out, x, n))                    \
  X(void, gelu_backward, (float* dx, const float* dout, const float* x, int64_t n),              \
    (dx, dout, x, n))                                                                            \
  X(void, gelu_forward_backward, (float* out, float* dx, const float* dout, const float* x,      \
    int64_t n), (out, dx, dout, x, n))                                                           \
  X(void, layernorm_forward, (float* out, float* mean, float* rstd, const float* x,              \
    const float* w, const float* b, int64_t n, int64_t c), (out, mean, rstd, x, w, b, n, c))     \
  X(void, residual_layernorm_forward, (float* sum, float* out, float* mean, float* rstd,         \
    const float* a, const float* delta, const float* w, const float* b, int64_t n, int64_t c),   \
    (sum, out, mean, rstd, a, delta, w, b, n, c))                                                \
  X(void, layernorm_backward, (float* dx, float* dw, float* db, const float* dout,               \
    const float* x, const float* mean, const float* rstd, const float* w, int64_t n, int64_t c), \
    (dx, dw, db, dout, x, mean, rstd, w, n, c))                                                  \
  X(void, linear_forward, (float* out, const float* in, const float* w, const float* bias,       \
    int64_t n, int64_t in_features, int64_t out_features),                                       \
    (out, in, w, bias, n, in_features, out_features))                                            \
  X(void, linear_backward, (float* din, float* dw, float* dbias, const float* dout,              \
    const float* in, const float* w, int64_t n, int64_t in_features, int64_t out_features,       \
    bool accumulate_din), (din, dw, dbias, dout, in, w, n, in_features, out_features,            \
    accumulate_din))                                                                             \
  X(void, add_column_sums, (float* acc, const float* x, int64_t n, int64_t cols),                \
    (acc, x, n, cols))                                                                           \
  X(void, lm_head_loss, (const LmHeadLossArgs& args), (args))                                    \
  X(double, sum_squares, (const float* x, int64_t n), (x, n))                                    \
  X(void, adamw_update, (float* params, const float* grads, float* m, float* v, int64_t n,       \
    const AdamWStep& s, const AdamWCopy& copy, uint64_t* hash, int64_t first),                   \
    (params, grads, m, v, n, s, copy, hash, first))                                              \
  X(uint64_t, state_hash, (const float* p, const float* m, const float* v, int64_t n,            \
    int64_t first), (p, m, v, n, first))                                                         \
  X(const char*, kernels_compiled_for, (), ())
// clang-format on

namespace brigade::cpu {

#define BRIGADE_DECLARE(ret, name, params, args) ret name params;
namespace avx2 {
BRIGADE_CPU_KERNELS(BRIGADE_DECLARE)
}
namespace avx512 {
BRIGADE_CPU_KERNELS(BRIGADE_DECLARE)
}
#undef BRIGADE_DECLARE

#define BRIGADE_DISPATCH(ret, name, params, args)               \
  ret name params {                                             \
    if (active_isa() == Isa::kAvx512) return avx512::name args; \
    return avx2::name args;                                     \
  }
BRIGADE_CPU_KERNELS(BRIGADE_DISPATCH)
#undef BRIGADE_DISPATCH

}  // namespace brigade::cpu
