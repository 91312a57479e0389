// rlpar/amx.h — float32 matrix products on Intel AMX tiles in "bf16x3" precision: the LSTM
// core's products when its spec asks for them (NetSpec::lstm_bf16x3).
//
// Each float32 operand x is split into two bfloat16 halves, hi = bf16(x) and lo = bf16(x - hi),
// so hi + lo carries 16 of x's 24 significand bits, and a product is summed as
//
//     a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi        (the a_lo b_lo term, ~2^-16 a b, is dropped)
//
// with float32 accumulation in the tiles: a relative error near 1e-5 per product, against 6e-8 in
// float32 and 4e-3 in one bf16 pass (PyTorch's "high" float32 matmul precision describes the
// same split).
//
// Operands are packed first, into tiles of 16 x 32 bfloat16 (hi tiles, then lo tiles), padded
// with zeros to whole tiles. Every function here reads and writes only its arguments: any number
// of threads may run them at once (each loads its own tile configuration). Each output float is
// summed in an order fixed by K alone, so a row's results do not depend on how many rows a call
// has.
#pragma once

#include <cstdint>

namespace rlpar::amx {

// True when this CPU has AMX-BF16 and AVX512-BF16 and the OS lets this process use the tiles
// (asked once, on the first call), unless the environment variable RLPAR_DISABLE_AMX is set
// (to anything but "" or "0"). Only then may the functions below run.
bool available();

// K tiles of an operand with k along K.
inline int64_t k_tiles(int64_t k) { return (k + 31) / 32; }

// bfloat16 elements of a packed operand (hi and lo halves together).
int64_t packed_a_elems(int64_t m, int64_t k);  // A: [M, K]
int64_t packed_b_elems(int64_t k, int64_t n);  // B: [K, N]

// Packs A [M, K]: A[m][k] = src[m * ld + k], or src[k * ld + m] when `transposed`.
void pack_a(uint16_t* dst, const float* src, int64_t m, int64_t k, int64_t ld, bool transposed);
// Packs B [K, N]: B[k][n] = src[k * ld + n], or src[n * ld + k] when `transposed`.
void pack_b(uint16_t* dst, const float* src, int64_t k, int64_t n, int64_t ld, bool transposed);

// Operands side by side along K (A = [A1 | A2], B = [B1; B2]): each part packed into its own K
// tiles [kt, kt + ceil(k / 32)) of an operand kb K tiles wide (packed_a_elems(m, 32 kb) or
// packed_b_elems(32 kb, n) elements), zeros padding each part to whole tiles; gemm then takes
// k = 32 kb. pack_a and pack_b are these with kt = 0 and kb = ceil(k / 32).
void pack_a_part(uint16_t* dst, const float* src, int64_t m, int64_t k, int64_t ld,
                 bool transposed, int64_t kt, int64_t kb);
void pack_b_part(uint16_t* dst, const float* src, int64_t k, int64_t n, int64_t ld,
                 bool transposed, int64_t kt, int64_t kb);

// How gemm starts each output: c += A B, c = A B, or c = bias + A B (bias [N], every row).
enum class Start { kAccumulate, kOverwrite, kBias };

// c [M, N] (row stride ldc) (+)= A B, from operands packed with the same m, k, n; `bias` only
// with Start::kBias.
void gemm(float* c, int64_t ldc, const uint16_t* a, const uint16_t* b, int64_t m, int64_t n,
          int64_t k, Start start = Start::kAccumulate, const float* bias = nullptr);

}  // namespace rlpar::amx
