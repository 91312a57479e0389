// Internal: AVX2 + FMA register-blocked micro-kernels for the conv layer, for CPUs without
// AVX-512 (AMD Zen 2/3, Intel client cores; an -march=x86-64-v3 build).
//
// The vector operations on ymm registers (8 floats, a lane mask for a row's tail) that the tiles
// of simd_tiles.h are written in, the same tiles as avx512_kernels.h's: R rows by NV vectors of
// 8 floats. With 16 ymm registers a tile holds at most 12 accumulators (6 x 16 or 12 x 8),
// beside the NV vectors of the shared operand and one broadcast. For translation units built
// with AVX2 and FMA: the kernels of a build without AVX-512, and in an AVX-512 build those that
// RLPAR_MAX_ISA=avx2 picks (see conv.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace rlpar::layers::avx2 {

constexpr int kLanes = 8;       // floats per vector
constexpr int kMaxVectors = 2;  // output channels (or patch columns) per tile: 2 x 8 floats

using Vec = __m256;

inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vbroadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }

// The last vector of a row: its lanes below the column count. `full` lets a whole vector take a
// plain load and store (a masked store costs many micro-ops on AMD Zen 2/3).
struct Mask {
  __m256i lanes;
  bool full;
};

inline Mask tail_mask(int64_t n) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int count = n >= kLanes ? kLanes : static_cast<int>(n);
  return {_mm256_cmpgt_epi32(_mm256_set1_epi32(count), index), n >= kLanes};
}

// Rows per tile for NV vectors per row: 12 accumulators of the 16 ymm registers.
template <int NV>
constexpr int tile_rows() {
  return NV == 1 ? 12 : 6;
}

template <int NV>
inline void load_row(__m256* v, const float* p, const Mask& last) {
#pragma GCC unroll 4
  for (int i = 0; i < NV - 1; ++i) v[i] = _mm256_loadu_ps(p + kLanes * i);
  const float* q = p + kLanes * (NV - 1);
  v[NV - 1] = last.full ? _mm256_loadu_ps(q) : _mm256_maskload_ps(q, last.lanes);
}

template <int NV>
inline void store_row(float* p, const __m256* v, const Mask& last) {
#pragma GCC unroll 4
  for (int i = 0; i < NV - 1; ++i) _mm256_storeu_ps(p + kLanes * i, v[i]);
  float* q = p + kLanes * (NV - 1);
  if (last.full) {
    _mm256_storeu_ps(q, v[NV - 1]);
  } else {
    _mm256_maskstore_ps(q, last.lanes, v[NV - 1]);
  }
}

}  // namespace rlpar::layers::avx2

#define RLPAR_SIMD_NS avx2
#include "simd_tiles.h"
#undef RLPAR_SIMD_NS

namespace rlpar::layers::avx2 {

// dst[j * ldd + i] = src[i * lds + j] for a kLanes x kLanes (8 x 8) block, in registers.
inline void transpose_block(float* dst, int64_t ldd, const float* src, int64_t lds) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(dst + j * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
    _mm256_storeu_ps(dst + (4 + j) * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
  }
}

}  // namespace rlpar::layers::avx2
