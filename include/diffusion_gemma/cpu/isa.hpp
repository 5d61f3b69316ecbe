// SPDX-License-Identifier: Apache-2.0
// Which instruction sets this process may use, detected once at run time (cpuid, xgetbv and, for
// AMX, the Linux permission request), so that kernels are chosen by the machine and not by the
// flags a consumer compiled with. Every kernel lives in a function carrying its own target
// attribute; the rest of the program can be built for any baseline.
//
// DG_CPU_ISA=generic|avx2|avx512|amx in the environment forces a lower path (tests and benchmarks
// use it to cover an AVX2-only machine on an AVX-512 one); asking for more than the CPU has is an
// error, never a silent fallback.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <diffusion_gemma/core/status.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DG_X86_KERNELS 1
// Target attributes of the kernel families. AVX2 implies FMA and F16C on every CPU that has it;
// the AVX-512 path uses F/BW/VL/DQ (Skylake-SP, Zen 4 and later), and AVX512-BF16 dot products
// in the fast precision where the CPU has them (Cooper Lake, Zen 4 and later); AMX adds the tiles
// (Sapphire Rapids and later).
#define DG_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define DG_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define DG_TARGET_AMX \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
// The same targets for a whole region of code (templates and all), for kernel bodies written once
// and compiled per instruction set. Lambdas inside a region do not reliably inherit the target:
// kernel code calls named functions only.
#if defined(__clang__)
// Kernel regions never contract a * b + c into an FMA, whatever -ffp-contract the consumer builds
// with: each vector lane must equal the scalar reference bit for bit (cpu/kernels/vector_math.inl),
// and an AVX2 region has FMA available where the default target has not.
#define DG_CLANG_NO_CONTRACT _Pragma("float_control(push)") _Pragma("clang fp contract(off)")
// One string literal per _Pragma: clang refuses adjacent literals there (GCC joins them).
// clang-format off
#define DG_BEGIN_TARGET_AVX2 DG_CLANG_NO_CONTRACT _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c\"))), apply_to = function)")
#define DG_BEGIN_TARGET_AVX512 DG_CLANG_NO_CONTRACT _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq\"))), apply_to = function)")
#define DG_BEGIN_TARGET_AVX512BF16 DG_CLANG_NO_CONTRACT _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16\"))), apply_to = function)")
#define DG_BEGIN_TARGET_AVX512VNNI DG_CLANG_NO_CONTRACT _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni\"))), apply_to = function)")
#define DG_BEGIN_TARGET_AMX DG_CLANG_NO_CONTRACT _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16\"))), apply_to = function)")
#define DG_BEGIN_TARGET_AMX_INT8 DG_CLANG_NO_CONTRACT _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8\"))), apply_to = function)")
// clang-format on
#define DG_END_TARGET _Pragma("clang attribute pop") _Pragma("float_control(pop)")
#else
// GCC 12 reports its own AVX-512 intrinsics (their _mm512_undefined_* pass-through operands) as
// uninitialized once inlined (GCC PR 105593); the kernels are entered from default-target code,
// which cannot inline them, so silencing the two warnings inside the regions is enough.
// GCC's default for C++ is -ffp-contract=fast, which fuses a * b + c inside a region that enables
// FMA; the regions turn it off (see the clang branch) so a consumer's plain -O2 build computes the
// same bits as ours.
#define DG_GCC_KERNEL_DIAGNOSTICS                                                   \
  _Pragma("GCC optimize(\"fp-contract=off\")")                                      \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DG_BEGIN_TARGET_AVX2 \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")") DG_GCC_KERNEL_DIAGNOSTICS
#define DG_BEGIN_TARGET_AVX512                                                                       \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq\")") \
      DG_GCC_KERNEL_DIAGNOSTICS
#define DG_BEGIN_TARGET_AVX512BF16                                                                 \
  _Pragma("GCC push_options")                                                                      \
      _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16\")") \
          DG_GCC_KERNEL_DIAGNOSTICS
#define DG_BEGIN_TARGET_AVX512VNNI                                                                 \
  _Pragma("GCC push_options")                                                                      \
      _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni\")") \
          DG_GCC_KERNEL_DIAGNOSTICS
#define DG_BEGIN_TARGET_AMX                                                                                    \
  _Pragma("GCC push_options")                                                                                 \
      _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16\")") \
          DG_GCC_KERNEL_DIAGNOSTICS
#define DG_BEGIN_TARGET_AMX_INT8                                                                               \
  _Pragma("GCC push_options")                                                                                 \
      _Pragma("GCC target(\"avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8\")") \
          DG_GCC_KERNEL_DIAGNOSTICS
#define DG_END_TARGET _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#endif
#else
#define DG_X86_KERNELS 0
#endif

namespace diffusion_gemma::cpu {

// Kernel families, in increasing order: a CPU that runs one runs all below it.
enum class Isa {
  kGeneric,  // portable C++ (any architecture)
  kAvx2,     // AVX2 + FMA + F16C: 8-wide fp32
  kAvx512,   // AVX-512 F/BW/VL/DQ: 16-wide fp32
  kAmx,      // AVX-512 + AVX512-BF16 + AMX-BF16 tiles (bf16 products in the fast precision)
  kSentinel
};

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
    case Isa::kSentinel: break;
  }
  return "?";
}

inline bool parse_isa(const std::string& s, Isa* out) {
  for (int i = 0; i < static_cast<int>(Isa::kSentinel); ++i) {
    if (s == isa_name(static_cast<Isa>(i))) {
      *out = static_cast<Isa>(i);
      return true;
    }
  }
  return false;
}

// What the CPU and the operating system allow, read once.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false;
  bool avx512vnni = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_avx = false, os_avx512 = false, os_amx = false;  // register state enabled by the OS (XCR0)
  bool amx_permitted = false;                              // Linux granted the tile data state
  std::string brand;

  // The best family this process can run.
  Isa best() const {
    const bool avx2_ok = os_avx && avx2 && fma && f16c;
    const bool avx512_ok = avx2_ok && os_avx512 && avx512f && avx512bw && avx512vl && avx512dq;
    const bool amx_ok = avx512_ok && avx512bf16 && amx_tile && amx_bf16 && os_amx && amx_permitted;
    return amx_ok ? Isa::kAmx : avx512_ok ? Isa::kAvx512 : avx2_ok ? Isa::kAvx2 : Isa::kGeneric;
  }
  // The flags as a readable list, for `dgemma info` and benchmark output.
  std::string flags() const {
    std::string s;
    const auto add = [&](bool on, const char* name) {
      if (!on) return;
      if (!s.empty()) s += ' ';
      s += name;
    };
    add(avx2, "avx2");
    add(fma, "fma");
    add(f16c, "f16c");
    add(avx512f, "avx512f");
    add(avx512bw, "avx512bw");
    add(avx512vl, "avx512vl");
    add(avx512dq, "avx512dq");
    add(avx512bf16, "avx512bf16");
    add(avx512vnni, "avx512vnni");
    add(amx_tile, "amx-tile");
    add(amx_bf16, "amx-bf16");
    add(amx_int8, "amx-int8");
    // A CPU bit the OS has not enabled the registers for (XCR0) is listed but cannot be used.
    if (avx2 && !os_avx) s += " (avx: registers not enabled by the OS)";
    if (avx512f && os_avx && !os_avx512) s += " (avx-512: registers not enabled by the OS)";
    if (amx_tile && !amx_permitted) s += " (amx: no kernel permission)";
    return s.empty() ? std::string("none") : s;
  }
};

namespace detail {

#if DG_X86_KERNELS
inline std::uint64_t read_xcr0() {
  std::uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<std::uint64_t>(edx) << 32) | eax;
}
#endif

inline CpuFeatures detect_features() {
  CpuFeatures f;
#if DG_X86_KERNELS
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
  const unsigned max_leaf = a;
  __get_cpuid(1, &a, &b, &c, &d);
  f.fma = (c >> 12) & 1u;
  f.f16c = (c >> 29) & 1u;
  const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u;
  if (osxsave && avx) {
    const std::uint64_t xcr0 = read_xcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;                    // SSE and AVX state
    f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;   // opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000) == 0x60000;            // XTILECFG, XTILEDATA
  }
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = (b >> 5) & 1u;
    f.avx512f = (b >> 16) & 1u;
    f.avx512dq = (b >> 17) & 1u;
    f.avx512bw = (b >> 30) & 1u;
    f.avx512vl = (b >> 31) & 1u;
    f.avx512vnni = (c >> 11) & 1u;
    f.amx_bf16 = (d >> 22) & 1u;
    f.amx_int8 = (d >> 25) & 1u;
    f.amx_tile = (d >> 24) & 1u;
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    f.avx512bf16 = (a >> 5) & 1u;
  }
  if (f.amx_tile && f.os_amx) {
    // Linux hands out the 8 KiB tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA); without it the first tile instruction would kill the process.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    f.amx_permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
  unsigned brand[12] = {};
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) != 0 && a >= 0x80000004) {
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &brand[4 * leaf], &brand[4 * leaf + 1], &brand[4 * leaf + 2],
                  &brand[4 * leaf + 3]);
    }
    char text[49] = {};
    std::memcpy(text, brand, 48);
    f.brand = text;
    const auto first = f.brand.find_first_not_of(' ');
    f.brand = first == std::string::npos ? std::string() : f.brand.substr(first);
  }
#endif
  return f;
}

}  // namespace detail

inline const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detail::detect_features();
  return f;
}

// The family requested by DG_CPU_ISA, validated against the CPU; the best one when unset.
inline Isa resolve_isa(const char* requested) {
  const Isa best = cpu_features().best();
  if (requested == nullptr || *requested == '\0') return best;
  Isa isa = Isa::kGeneric;
  if (!parse_isa(requested, &isa)) {
    throw_error(StatusCode::kInvalidArgument, "DG_CPU_ISA='", requested,
                "' is not one of generic, avx2, avx512, amx");
  }
  if (static_cast<int>(isa) > static_cast<int>(best)) {
    throw_error(StatusCode::kUnsupported, "DG_CPU_ISA=", requested, " asks for kernels this CPU cannot run (best: ",
                isa_name(best), "; flags: ", cpu_features().flags(), ")");
  }
  return isa;
}

// The family every engine uses unless told otherwise: DG_CPU_ISA if set, else the best.
inline Isa default_isa() {
  static const Isa isa = resolve_isa(std::getenv("DG_CPU_ISA"));
  return isa;
}

// Whether DG_CPU_INT8_TILES asks for the AMX-INT8 form of the int8 products of 4-bit weights
// (cpu/kernels/int8_amx.hpp): "1" yes; unset, empty or "0" no. Off by default: on the AMX machine
// we measured, it was not faster than the bf16 tiles on dequantised blocks (docs/performance.md).
inline bool parse_int8_tiles(const char* requested) {
  if (requested == nullptr || *requested == '\0' || std::string(requested) == "0") return false;
  if (std::string(requested) == "1") return true;
  throw_error(StatusCode::kInvalidArgument, "DG_CPU_INT8_TILES='", requested, "' is not 0 or 1");
}
inline bool int8_tiles_requested() {
  static const bool on = parse_int8_tiles(std::getenv("DG_CPU_INT8_TILES"));
  return on;
}

}  // namespace diffusion_gemma::cpu
