#include "rlpar/isa.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifndef RLPAR_BUILD_ARCH
#define RLPAR_BUILD_ARCH "unknown"
#endif

namespace rlpar {
namespace {

// The best set the CPU runs (and the OS saves the registers of: libgcc checks XCR0).
Isa cpu_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
  return Isa::None;
}

// RLPAR_MAX_ISA as a cap (Avx512 when unset or empty).
Isa cap_from_env() {
  const char* value = std::getenv("RLPAR_MAX_ISA");
  if (value == nullptr || *value == '\0') return Isa::Avx512;
  for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::None}) {
    if (std::strcmp(value, isa_name(isa)) == 0) return isa;
  }
  throw std::invalid_argument(std::string("RLPAR_MAX_ISA: expected one of avx512, avx2, none (or "
                                          "unset for the best this build and CPU run), got '") +
                              value + "'");
}

Isa choose() { return std::min({compiled_isa(), cpu_isa(), isa_cap()}); }

}  // namespace

Isa active_isa() {
  static const Isa isa = choose();
  return isa;
}

Isa isa_cap() {
  static const Isa cap = cap_from_env();
  return cap;
}

Isa compiled_isa() {
#if defined(__AVX512F__)
  return Isa::Avx512;
#elif defined(__AVX2__) && defined(__FMA__)
  return Isa::Avx2;
#else
  return Isa::None;
#endif
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    case Isa::None:
      break;
  }
  return "none";
}

const char* build_arch() { return RLPAR_BUILD_ARCH; }

}  // namespace rlpar
