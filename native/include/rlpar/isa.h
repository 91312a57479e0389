// rlpar/isa.h — which of rlpar's kernel sets run: the best that the build compiled, the CPU has
// and the environment variable RLPAR_MAX_ISA allows.
//
// RLPAR_MAX_ISA caps the kernel set, for testing every set on one machine:
//   avx512  the AVX-512 kernels for Conv2d, Linear and the LSTM cell (the best there is)
//   avx2    the AVX2 + FMA conv kernels; Linear and the LSTM cell take their Eigen paths; no AMX
//   none    every layer on its portable Eigen path; no AMX
//   unset   no cap (an empty value counts as unset)
// The choice is made once, on the first call, and never runs a kernel the CPU lacks
// (__builtin_cpu_supports). A capped build still runs Eigen with the build's -march (with
// AVX-512 in an AVX-512 build): the cap tests rlpar's own kernels, it does not emulate an older
// CPU. Kept free of inline library code: amx.cc, compiled with no -march of its own, includes it.
#pragma once

namespace rlpar {

enum class Isa { None = 0, Avx2 = 1, Avx512 = 2 };

// The kernel set every layer's dispatch uses: min(compiled_isa(), the CPU's, RLPAR_MAX_ISA).
// Computed on the first call; throws std::invalid_argument (naming the variable, its value and
// the choices) while RLPAR_MAX_ISA holds anything else.
Isa active_isa();

// RLPAR_MAX_ISA's cap: Avx512 when unset (read once; throws like active_isa()). AMX runs only
// when it is Avx512 (amx.h), whatever the build's -march.
Isa isa_cap();

// The best kernel set this build compiled (its -march): Avx512, Avx2 (AVX2 + FMA) or None.
Isa compiled_isa();

// "avx512", "avx2" or "none".
const char* isa_name(Isa isa);

// The -march this build was compiled for ("native", "x86-64-v3", "x86-64", ...).
const char* build_arch();

}  // namespace rlpar
