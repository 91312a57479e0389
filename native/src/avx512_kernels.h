// Internal: AVX-512 register-blocked micro-kernels shared by the conv and linear layers.
//
// The vector operations on zmm registers (16 floats, a __mmask16 for a row's tail) that the tiles
// of simd_tiles.h are written in: R rows (output positions, samples or patch rows) by NV vectors
// of 16 floats, accumulators in registers. Only for translation units built with AVX-512 (see
// conv.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace rlpar::layers::avx512 {

constexpr int kLanes = 16;      // floats per vector
constexpr int kMaxVectors = 4;  // output channels (or patch columns) per tile: 4 x 16 floats

using Vec = __m512;
using Mask = __mmask16;

inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }

inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// Rows per tile for NV vectors per row: ~24 accumulators of the 32 zmm registers.
template <int NV>
constexpr int tile_rows() {
  return NV == 1 ? 12 : NV == 2 ? 12 : NV == 3 ? 8 : 6;
}

template <int NV>
inline void load_row(__m512* v, const float* p, __mmask16 last) {
#pragma GCC unroll 4
  for (int i = 0; i < NV - 1; ++i) v[i] = _mm512_loadu_ps(p + 16 * i);
  v[NV - 1] = _mm512_maskz_loadu_ps(last, p + 16 * (NV - 1));
}

template <int NV>
inline void store_row(float* p, const __m512* v, __mmask16 last) {
#pragma GCC unroll 4
  for (int i = 0; i < NV - 1; ++i) _mm512_storeu_ps(p + 16 * i, v[i]);
  _mm512_mask_storeu_ps(p + 16 * (NV - 1), last, v[NV - 1]);
}

}  // namespace rlpar::layers::avx512

#define RLPAR_SIMD_NS avx512
#include "simd_tiles.h"
#undef RLPAR_SIMD_NS

namespace rlpar::layers::avx512 {

// dst[j * ldd + i] = src[i * lds + j] for a 16 x 16 block, in registers.
inline void transpose16(float* dst, int64_t ldd, const float* src, int64_t lds) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    _mm512_storeu_ps(dst + j * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
    _mm512_storeu_ps(dst + (8 + j) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd));
  }
}

// The transpose of one kLanes x kLanes block (the name conv.cc uses for either ISA).
inline void transpose_block(float* dst, int64_t ldd, const float* src, int64_t lds) {
  transpose16(dst, ldd, src, lds);
}

}  // namespace rlpar::layers::avx512
