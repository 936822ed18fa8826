// The GEMM candidates of issue 16 on the shapes Brigade's training step runs
// (docs/PERFORMANCE.md, "GEMM backends"): OpenBLAS as loaded (its core type
// is whatever it detected, or OPENBLAS_CORETYPE), oneDNN's row-major
// dnnl_sgemm, oneDNN's matmul primitive (created once per shape, as a
// backend that caches primitives would), and BLIS.
//
//   gemm_backends [--threads N] [--model tiny|gpt2|all|tn-grid] [--backends a,b,...]
//
// Prints one line per shape and backend: GFLOP/s, best of several timed
// batches of at least 50 ms each. BLIS is loaded with dlopen(RTLD_DEEPBIND)
// because it exports the same cblas_/sgemm_ symbols as OpenBLAS, which is
// linked: linking both would make one silently answer for the other.
#include <cblas.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

// C (m,n) = op(A) op(B), row-major; ta: A stored (k,m); tb: B stored (n,k).
struct Shape {
  std::string model;
  std::string what;
  int64_t m, n, k;
  bool ta, tb;
};

std::vector<Shape> shapes_for(const std::string& model, int64_t c, int64_t rows, int64_t v,
                              int64_t head_rows) {
  const int64_t f = 4 * c;
  std::vector<Shape> s = {
      {model, "attn qkv fwd", rows, 3 * c, c, false, false},
      {model, "attn qkv dX", rows, c, 3 * c, false, true},
      {model, "attn qkv dW", c, 3 * c, rows, true, false},
      {model, "attn proj fwd", rows, c, c, false, false},
      {model, "mlp fc fwd", rows, f, c, false, false},
      {model, "mlp fc dX", rows, c, f, false, true},
      {model, "mlp fc dW", c, f, rows, true, false},
      {model, "mlp proj fwd", rows, c, f, false, false},
      {model, "mlp proj dX", rows, f, c, false, true},
      {model, "mlp proj dW", f, c, rows, true, false},
      {model, "lm head logits", head_rows, v, c, false, true},
      {model, "lm head dX", head_rows, c, v, false, false},
      {model, "lm head dW", v, c, head_rows, true, false},
  };
  return s;
}

using Gemm = std::function<void(const Shape&, const float*, const float*, float*)>;

void openblas(const Shape& s, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
              s.m, s.n, s.k, 1.0f, a, s.ta ? s.m : s.k, b, s.tb ? s.k : s.n, 0.0f, c, s.n);
}

void onednn_sgemm(const Shape& s, const float* a, const float* b, float* c) {
  dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a, s.ta ? s.m : s.k, b,
             s.tb ? s.k : s.n, 0.0f, c, s.n);
}

// One matmul primitive per shape, as a backend would keep in a cache.
class DnnlMatmul {
 public:
  void operator()(const Shape& s, const float* a, const float* b, float* c) {
    using namespace dnnl;
    using tag = memory::format_tag;
    auto& p = cache_[key(s)];
    if (!p) {
      p = std::make_unique<Entry>();
      memory::desc ad({s.m, s.k}, memory::data_type::f32, s.ta ? tag::ba : tag::ab);
      memory::desc bd({s.k, s.n}, memory::data_type::f32, s.tb ? tag::ba : tag::ab);
      memory::desc cd({s.m, s.n}, memory::data_type::f32, tag::ab);
      p->pd = matmul::primitive_desc(matmul::desc(ad, bd, cd), engine_);
      p->prim = matmul(p->pd);
    }
    memory am(p->pd.src_desc(), engine_, const_cast<float*>(a));
    memory bm(p->pd.weights_desc(), engine_, const_cast<float*>(b));
    memory cm(p->pd.dst_desc(), engine_, c);
    p->prim.execute(stream_, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream_.wait();
  }

 private:
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
  };
  static std::string key(const Shape& s) {
    return fmt::format("{}x{}x{}{}{}", s.m, s.n, s.k, s.ta, s.tb);
  }
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::map<std::string, std::unique_ptr<Entry>> cache_;
};

// BLIS's cblas, private to this handle (RTLD_DEEPBIND: its own symbols first).
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
CblasSgemm load_blis() {
  void* h = dlopen("/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so",
                   RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) return nullptr;
  return reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
}

double gflops(const Gemm& gemm, const Shape& s) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 2; ++i) gemm(s, a.data(), b.data(), c.data());
  double best = 0;
  for (int batch = 0; batch < 5; ++batch) {
    int reps = 0;
    const auto t0 = Clock::now();
    double secs = 0;
    do {
      gemm(s, a.data(), b.data(), c.data());
      ++reps;
      secs = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (secs < 0.05);
    best = std::max(best, 2.0 * s.m * s.n * s.k * reps / secs / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  std::string model = "all";
  std::string backends = "openblas,dnnl,dnnl-matmul,blis";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (flag == "--model")
      model = argv[i + 1];
    else if (flag == "--backends")
      backends = argv[i + 1];
    else {
      fmt::print(stderr, "unknown flag {}\n", flag);
      return 2;
    }
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  // BLIS sizes its team from its own variable, read when it initialises.
  setenv("BLIS_NUM_THREADS", std::to_string(threads).c_str(), 1);
  std::vector<Shape> shapes;
  // tiny: C 256, B 8 x T 128 rows, vocabulary 256; GPT-2 small: C 768,
  // B 4 x T 256 rows, vocabulary 50257, LM-head chunks of 667 rows.
  if (model == "tiny" || model == "all") {
    auto s = shapes_for("tiny", 256, 1024, 256, 1024);
    shapes.insert(shapes.end(), s.begin(), s.end());
  }
  if (model == "gpt2" || model == "all") {
    auto s = shapes_for("gpt2", 768, 1024, 50257, 667);
    shapes.insert(shapes.end(), s.begin(), s.end());
  }
  // A^T B over a grid of outputs: where each backend's weight-gradient
  // product is fast (gemm.cc's choice at the AVX2 level is read off it).
  if (model == "tn-grid") {
    for (const int64_t k : {256, 1024, 4096}) {
      for (const int64_t m : {64, 128, 256, 512, 1024, 3072}) {
        for (const int64_t n : {64, 128, 256, 512, 1024, 3072}) {
          shapes.push_back({"grid", "A^T B", m, n, k, true, false});
        }
      }
    }
  }
  std::map<std::string, Gemm> all;
  all["openblas"] = openblas;
  all["dnnl"] = onednn_sgemm;
  auto matmul = std::make_shared<DnnlMatmul>();
  all["dnnl-matmul"] = [matmul](const Shape& s, const float* a, const float* b, float* c) {
    (*matmul)(s, a, b, c);
  };
  if (CblasSgemm blis = load_blis()) {
    all["blis"] = [blis](const Shape& s, const float* a, const float* b, float* c) {
      blis(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m,
           s.n, s.k, 1.0f, a, s.ta ? s.m : s.k, b, s.tb ? s.k : s.n, 0.0f, c, s.n);
    };
  }
  std::vector<std::string> chosen;
  std::stringstream list(backends);
  for (std::string name; std::getline(list, name, ',');) {
    if (!all.count(name)) {
      fmt::print(stderr, "backend {} is not available here\n", name);
      return 2;
    }
    chosen.push_back(name);
  }
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  fmt::print("threads {}; OpenBLAS core {} ({}); oneDNN ISA {}\n", threads, openblas_get_corename(),
             core ? "OPENBLAS_CORETYPE" : "detected",
             static_cast<int>(dnnl::get_effective_cpu_isa()));
  fmt::print("{:<6} {:<16} {:>6} {:>6} {:>6}", "model", "gemm", "m", "n", "k");
  for (const auto& name : chosen) fmt::print(" {:>12}", name);
  fmt::print("\n");
  for (const Shape& s : shapes) {
    fmt::print("{:<6} {:<16} {:>6} {:>6} {:>6}", s.model, s.what, s.m, s.n, s.k);
    for (const auto& name : chosen) fmt::print(" {:>12.1f}", gflops(all[name], s));
    fmt::print("\n");
    std::fflush(stdout);
  }
}
