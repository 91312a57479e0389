// Internal: the register-blocked GEMM tiles shared by the conv and linear layers, written once
// for both vector widths. Include it only through avx512_kernels.h or avx2_kernels.h, which
// define, in namespace rlpar::layers::avx512 or ::avx2 (RLPAR_SIMD_NS while they include this
// file; both in one translation unit of an AVX-512 build), the vector type `Vec` (kLanes floats),
// the tail `Mask` of a row's last vector, vzero/vbroadcast/vfmadd/vadd/vmax and
// load_row/store_row. No include guard: each of those headers has one.
//
// Each tile computes one block of a GEMM with its accumulators in registers: R rows (output
// positions, samples or patch rows) by NV vectors; the last vector of a row is masked, so any
// column count works.
#include <cstdint>

namespace rlpar::layers::RLPAR_SIMD_NS {

struct FwdArgs {
  const float* const* a;  // [R] patch starts
  int64_t k, run, row_stride;  // kernel rows, floats per kernel row (K*C), floats per input row
  const float* w;  // [patch, ldw], already offset to the tile's first channel
  const float* b;  // [oc], offset likewise; nullptr: no bias
  int64_t ldw;
  float* y;  // first row of the tile, offset to the first channel; row stride ldw
  Mask last;
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
  Vec acc[R][NV];
  const int64_t ldy = g.ldy > 0 ? g.ldy : g.ldw;
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    if (g.first) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = vzero();
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
          _mm_prefetch(reinterpret_cast<const char*>(wk + (j + kPrefetchRows) * g.ldw + kLanes * v),
                       _MM_HINT_T0);
        }
      }
      Vec bv[NV];
      load_row<NV>(bv, wk + j * g.ldw, g.last);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const Vec av = vbroadcast(a[r] + j);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = vfmadd(av, bv[v], acc[r][v]);
      }
    }
  }
  if (g.final && g.b != nullptr) {
    Vec bias[NV];
    load_row<NV>(bias, g.b, g.last);
    const Vec zero = vzero();
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        acc[r][v] = vadd(acc[r][v], bias[v]);
        if (g.relu) acc[r][v] = vmax(acc[r][v], zero);
      }
    }
  }
  if (g.final && g.b == nullptr && g.relu) {
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = vmax(acc[r][v], vzero());
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
  Mask last;
  int64_t ldd = 0;  // floats between rows of dy; 0: ldw (dy's rows are as long as dw's)
};

template <int KR, int NV>
inline void dw_tile(const DwArgs& g) {
  Vec acc[KR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < KR; ++r) load_row<NV>(acc[r], g.dw + r * g.ldw, g.last);
  const float* d = g.dy;
  const int64_t ldd = g.ldd > 0 ? g.ldd : g.ldw;
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const float* a = g.x + oy * g.step_y;
    for (int64_t ox = 0; ox < g.ow; ++ox, a += g.step_x, d += ldd) {
      Vec dv[NV];
      load_row<NV>(dv, d, g.last);
#pragma GCC unroll 12
      for (int r = 0; r < KR; ++r) {
        const Vec av = vbroadcast(a + r);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = vfmadd(av, dv[v], acc[r][v]);
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
  Mask last;
};

template <int R, int NV>
inline void dx_tile(const DxArgs& g) {
  Vec acc[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = vzero();
  for (int64_t o = 0; o < g.oc; ++o) {
    Vec wv[NV];
    load_row<NV>(wv, g.wt + o * g.ldwt, g.last);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const Vec dv = vbroadcast(g.dy[r] + o);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = vfmadd(dv, wv[v], acc[r][v]);
    }
  }
  // In position order: patches of neighbouring positions overlap when stride < kernel.
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    Vec cur[NV];
    load_row<NV>(cur, g.dx[r], g.last);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) cur[v] = vadd(cur[v], acc[r][v]);
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

}  // namespace rlpar::layers::RLPAR_SIMD_NS
