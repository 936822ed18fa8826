#include "brigade/kernels/cpu/isa.h"

#include <cpuid.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "brigade/core/error.h"

namespace brigade::cpu {
namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

bool bit(unsigned reg, int n) {
  return (reg >> n) & 1u;
}

// XCR0: which register states the OS saves on a context switch. A CPU can
// have AVX-512 and still be unusable for it (an OS or hypervisor that does
// not enable the ZMM state).
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs vendor = cpuid(0);
  char name[13] = {};
  std::memcpy(name, &vendor.b, 4);
  std::memcpy(name + 4, &vendor.d, 4);
  std::memcpy(name + 8, &vendor.c, 4);
  f.vendor = name;

  const Regs leaf1 = cpuid(1);
  const int base_family = (leaf1.a >> 8) & 0xf;
  f.family = base_family + (base_family == 0xf ? (leaf1.a >> 20) & 0xff : 0);
  f.model = ((leaf1.a >> 4) & 0xf) |
            ((base_family == 0x6 || base_family == 0xf) ? ((leaf1.a >> 16) & 0xf) << 4 : 0);

  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    std::string_view text(brand);
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
    f.brand = std::string(text);
  }

  const bool osxsave = bit(leaf1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool ymm_state = (xcr & 0x6) == 0x6;    // SSE + AVX
  const bool zmm_state = (xcr & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  const Regs leaf7 = cpuid(7, 0);
  const Regs leaf7_1 = cpuid(7, 1);
  f.fma = bit(leaf1.c, 12) && ymm_state;
  f.avx2 = bit(leaf1.c, 28) && bit(leaf7.b, 5) && ymm_state;
  f.avx512 = zmm_state && bit(leaf7.b, 16) /*F*/ && bit(leaf7.b, 17) /*DQ*/ &&
             bit(leaf7.b, 28) /*CD*/ && bit(leaf7.b, 30) /*BW*/ && bit(leaf7.b, 31) /*VL*/;
  f.avx512_bf16 = f.avx512 && bit(leaf7_1.a, 5);
  f.amx = bit(leaf7.d, 24) && bit(leaf7.d, 22);
  return f;
}

struct Choice {
  Isa isa;
  bool forced;
};

const Choice& choice() {
  static const Choice c = [] {
    const char* env = std::getenv("BRIGADE_CPU_ISA");
    return Choice{choose_isa(cpu_features(), env), env != nullptr && *env != '\0'};
  }();
  return c;
}

}  // namespace

Isa choose_isa(const CpuFeatures& f, const char* requested) {
  if (!f.avx2 || !f.fma) {
    throw_error(
        "this CPU ({} '{}') lacks AVX2/FMA, which this build of Brigade needs (x86-64-v3); "
        "run it on a CPU from 2015 or later",
        f.vendor, f.brand);
  }
  if (requested == nullptr || *requested == '\0') return best_isa(f);
  const std::string_view want(requested);
  if (want == "avx2") return Isa::kAvx2;
  if (want == "avx512") {
    if (!f.avx512) {
      throw_error(
          "BRIGADE_CPU_ISA=avx512, but this CPU (or its OS) does not offer AVX-512 F/CD/BW/DQ/VL; "
          "unset BRIGADE_CPU_ISA or set it to avx2");
    }
    return Isa::kAvx512;
  }
  throw_error("BRIGADE_CPU_ISA={} is not a level Brigade knows; use avx2 or avx512, or unset it",
              want);
}
const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Isa best_isa(const CpuFeatures& features) {
  return features.avx512 ? Isa::kAvx512 : Isa::kAvx2;
}

Isa active_isa() {
  return choice().isa;
}

const char* isa_name(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : "avx2";
}

std::string describe_cpu() {
  const CpuFeatures& f = cpu_features();
  const Choice& c = choice();
  std::string extras;
  if (f.avx512) extras += f.avx512_bf16 ? "; the CPU also has AVX-512 BF16" : "";
  if (f.amx) extras += "; the CPU also has AMX";
  return fmt::format("{} kernels{} on {} '{}' family {} model {}{}",
                     c.isa == Isa::kAvx512 ? "AVX-512" : "AVX2",
                     c.forced ? " (forced by BRIGADE_CPU_ISA)" : "", f.vendor,
                     f.brand.empty() ? "no model name" : f.brand, f.family, f.model, extras);
}

}  // namespace brigade::cpu
