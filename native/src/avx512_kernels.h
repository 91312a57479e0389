// Internal: AVX-512 register-blocked micro-kernels shared by the conv and linear layers.
//
// Each kernel computes one tile of a GEMM with its accumulators in zmm registers: R rows (output
// positions, samples or patch rows) by NV vectors of 16 floats; the last vector is masked so any
// column count works. Only for translation units built with AVX-512 (see conv.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace rlpar::layers::simd {

constexpr int kMaxVectors = 4;  // output channels (or patch columns) per tile: 4 x 16 floats

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

struct FwdArgs {
  const float* const* a;  // [R] patch starts
  int64_t k, run, row_stride;  // kernel rows, floats per kernel row (K*C), floats per input row
  const float* w;  // [patch, ldw], already offset to the tile's first channel
  const float* b;  // [oc], offset likewise; nullptr: no bias
  int64_t ldw;
  float* y;  // first row of the tile, offset to the first channel; row stride ldw
  __mmask16 last;
  bool relu;
  // A GEMM split along its inner dimension runs one tile per block: the first block starts from
  // zero, later ones from y; only the final block adds the bias (and applies the ReLU).
  bool first = true, final = true;
  // Fetch w's rows kPrefetchRows ahead into L1: rows 2 KiB or more apart defeat the hardware's
  // stride prefetcher, and each w row of a tile is then a cache miss waited for; a packed
  // panel's rows, read from L2, also arrive sooner.
  bool prefetch = false;
  int64_t ldy = 0;  // floats between rows of y; 0: ldw (y's rows are as long as w's)
};

constexpr int64_t kPrefetchRows = 8;

template <int R, int NV>
inline void fwd_tile(const FwdArgs& g) {
  __m512 acc[R][NV];
  const int64_t ldy = g.ldy > 0 ? g.ldy : g.ldw;
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    if (g.first) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    } else {
      load_row<NV>(acc[r], g.y + r * ldy, g.last);
    }
  }
  for (int64_t ky = 0; ky < g.k; ++ky) {
    const float* wk = g.w + ky * g.run * g.ldw;
    const int64_t off = ky * g.row_stride;
    const float* a[R];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) a[r] = g.a[r] + off;
    for (int64_t j = 0; j < g.run; ++j) {
      if (g.prefetch) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          _mm_prefetch(reinterpret_cast<const char*>(wk + (j + kPrefetchRows) * g.ldw + 16 * v),
                       _MM_HINT_T0);
        }
      }
      __m512 bv[NV];
      load_row<NV>(bv, wk + j * g.ldw, g.last);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_set1_ps(a[r][j]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
      }
    }
  }
  if (g.final && g.b != nullptr) {
    __m512 bias[NV];
    load_row<NV>(bias, g.b, g.last);
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = _mm512_add_ps(acc[r][v], bias[v]);
        if (g.relu) acc[r][v] = _mm512_max_ps(acc[r][v], zero);
      }
    }
  }
  if (g.final && g.b == nullptr && g.relu) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_max_ps(acc[r][v], _mm512_setzero_ps());
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) store_row<NV>(g.y + r * ldy, acc[r], g.last);
}

// Calls fwd_tile<rows, NV> for a runtime `rows` <= R (the last, partial tile).
template <int R, int NV>
inline void fwd_tile_n(int64_t rows, const FwdArgs& g) {
  if constexpr (R > 0) {
    if (rows == R) return fwd_tile<R, NV>(g);
    fwd_tile_n<R - 1, NV>(rows, g);
  }
}

struct DwArgs {
  float* dw;        // first patch row of the tile, offset to the first channel; row stride ldw
  const float* dy;  // [positions, ldw] of one sample, offset likewise
  const float* x;   // the sample's input, offset by ky * row_stride + j (first patch column)
  int64_t ldw, oh, ow, step_x, step_y;  // floats between neighbouring patches along ox and oy
  __mmask16 last;
  int64_t ldd = 0;  // floats between rows of dy; 0: ldw (dy's rows are as long as dw's)
};

template <int KR, int NV>
inline void dw_tile(const DwArgs& g) {
  __m512 acc[KR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < KR; ++r) load_row<NV>(acc[r], g.dw + r * g.ldw, g.last);
  const float* d = g.dy;
  const int64_t ldd = g.ldd > 0 ? g.ldd : g.ldw;
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const float* a = g.x + oy * g.step_y;
    for (int64_t ox = 0; ox < g.ow; ++ox, a += g.step_x, d += ldd) {
      __m512 dv[NV];
      load_row<NV>(dv, d, g.last);
#pragma GCC unroll 12
      for (int r = 0; r < KR; ++r) {
        const __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, dv[v], acc[r][v]);
      }
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < KR; ++r) store_row<NV>(g.dw + r * g.ldw, acc[r], g.last);
}

template <int KR, int NV>
inline void dw_tile_n(int64_t rows, const DwArgs& g) {
  if constexpr (KR > 0) {
    if (rows == KR) return dw_tile<KR, NV>(g);
    dw_tile_n<KR - 1, NV>(rows, g);
  }
}

struct DxArgs {
  float* const* dx;         // [R] where each position's patch starts in dx, + ky row + column
  const float* const* dy;   // [R] each position's gradient row [OC]
  const float* wt;          // transposed weight [OC, patch], offset to (ky, column)
  int64_t oc, ldwt;
  __mmask16 last;
};

template <int R, int NV>
inline void dx_tile(const DxArgs& g) {
  __m512 acc[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t o = 0; o < g.oc; ++o) {
    __m512 wv[NV];
    load_row<NV>(wv, g.wt + o * g.ldwt, g.last);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 dv = _mm512_set1_ps(g.dy[r][o]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(dv, wv[v], acc[r][v]);
    }
  }
  // In position order: patches of neighbouring positions overlap when stride < kernel.
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    __m512 cur[NV];
    load_row<NV>(cur, g.dx[r], g.last);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) cur[v] = _mm512_add_ps(cur[v], acc[r][v]);
    store_row<NV>(g.dx[r], cur, g.last);
  }
}

template <int R, int NV>
inline void dx_tile_n(int64_t rows, const DxArgs& g) {
  if constexpr (R > 0) {
    if (rows == R) return dx_tile<R, NV>(g);
    dx_tile_n<R - 1, NV>(rows, g);
  }
}

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

}  // namespace rlpar::layers::simd
