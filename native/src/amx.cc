#include "rlpar/amx.h"

#include "rlpar/isa.h"

// Compiled for any x86-64 ISA: its own functions switch to AMX and AVX-512 with a target
// pragma, and available() checks the CPU before any of them runs. It includes no C++ library
// header with inline code and instantiates no template, so no function compiled for those ISAs
// can be merged into another translation unit (the -march trap noted in rlpar's CMakeLists.txt).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 12
#define RLPAR_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rlpar::amx {
namespace {

constexpr int64_t kTileRows = 16;  // rows of a tile (M side; K pairs on the B side)
constexpr int64_t kTileK = 32;     // bfloat16 along K in one tile row
constexpr int64_t kTileElems = kTileRows * kTileK;
// Blocking of gemm(): a chunk of K (tiles) and a chunk of A's rows stay in L2 while every column
// tile pair of B's panel over that K chunk is used for each of the chunk's row pairs.
constexpr int64_t kKChunkTiles = 32;  // 1024 of K
constexpr int64_t kMChunkTiles = 8;   // 128 rows

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t packed_a_elems(int64_t m, int64_t k) {
  return 2 * ceil_div(m, kTileRows) * ceil_div(k, kTileK) * kTileElems;
}

int64_t packed_b_elems(int64_t k, int64_t n) {
  return 2 * ceil_div(n, kTileRows) * ceil_div(k, kTileK) * kTileElems;
}

#if defined(RLPAR_AMX)
namespace {

bool detect() {
  // RLPAR_DISABLE_AMX=1 (anything but empty or "0") hides the tiles from rlpar, and so does
  // RLPAR_MAX_ISA below avx512 (the tiles' packing runs AVX-512).
  const char* off = std::getenv("RLPAR_DISABLE_AMX");
  if (off != nullptr && *off != '\0' && std::strcmp(off, "0") != 0) return false;
  if (isa_cap() != Isa::Avx512) return false;
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));  // F, BW, VL
  const bool tiles = (d & (1u << 24)) && (d & (1u << 22));                        // TILE, BF16
  if (!avx512 || !tiles) return false;
  __cpuid_count(7, 1, a, b, c, d);
  if (!(a & (1u << 5))) return false;  // AVX512-BF16
  __cpuid(1, a, b, c, d);
  if (!(c & (1u << 27))) return false;  // OSXSAVE
  // The OS saves the ZMM and tile state (XCR0 bits 5-7 and 17-18).
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const unsigned need = (7u << 5) | (3u << 17);
  if ((lo & need) != need) return false;
  // Linux hands the tile data state to a process that asks (ARCH_REQ_XCOMP_PERM, XTILEDATA).
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

}  // namespace

bool available() {
  static const bool ok = detect();
  return ok;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")
namespace {

// 16 bfloat16 -> the high halves of 16 words (as float32: the same numbers). The maskz forms
// because GCC 12's unmasked ones warn about their own undefined operands.
inline __m512i widen(__m256i h) {
  return _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16);
}

// The 16 float32 at src, the first `n` of them (zeros after).
inline __m512 load16(const float* src, int64_t n) {
  const __mmask16 m =
      n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
  return _mm512_maskz_loadu_ps(m, src);
}

// 32 bfloat16 [bf16(x0) | bf16(x1)], rounded to nearest even.
inline __m512i to_bf16(__m512 x0, __m512 x1) { return (__m512i)_mm512_cvtne2ps_pbh(x1, x0); }

// x0 and x1 as the hi and lo halves of K-ordered tile rows: 32 bfloat16 [x0 | x1] each.
inline void split_k(__m512 x0, __m512 x1, __m512i* hi, __m512i* lo) {
  *hi = to_bf16(x0, x1);
  const __m512 h0 = _mm512_castsi512_ps(widen(_mm512_maskz_extracti64x4_epi64(0xFF, *hi, 0)));
  const __m512 h1 = _mm512_castsi512_ps(widen(_mm512_maskz_extracti64x4_epi64(0xFF, *hi, 1)));
  *lo = to_bf16(_mm512_sub_ps(x0, h0), _mm512_sub_ps(x1, h1));
}

// x0 and x1 (K values 2j and 2j + 1 of 16 columns) as the hi and lo halves of a VNNI tile row:
// word o pairs x0[o] (low half) with x1[o].
inline void split_pairs(__m512 x0, __m512 x1, __m512i* hi, __m512i* lo) {
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
  const __mmask32 all = ~__mmask32(0);
  *hi = _mm512_maskz_permutexvar_epi16(all, pairs, to_bf16(x0, x1));
  const __m512 h0 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, *hi, 16));
  const __m512 h1 = _mm512_castsi512_ps(_mm512_and_si512(*hi, _mm512_set1_epi32(~0xFFFF)));
  const __m512i rest = to_bf16(_mm512_sub_ps(x0, h0), _mm512_sub_ps(x1, h1));
  *lo = _mm512_maskz_permutexvar_epi16(all, pairs, rest);
}

// r[i] <- word i of every r[j] (j = 0..15): a 16 x 16 transpose of 32-bit words, in 4 x 4
// blocks (unpacks) and then across the 128-bit lanes.
inline void transpose16(__m512i* r) {
  __m512i u[4][4];
  for (int g = 0; g < 4; ++g) {
    const __m512i* a = r + 4 * g;
    const __m512i t0 = _mm512_maskz_unpacklo_epi32(0xFFFF, a[0], a[1]);
    const __m512i t1 = _mm512_maskz_unpackhi_epi32(0xFFFF, a[0], a[1]);
    const __m512i t2 = _mm512_maskz_unpacklo_epi32(0xFFFF, a[2], a[3]);
    const __m512i t3 = _mm512_maskz_unpackhi_epi32(0xFFFF, a[2], a[3]);
    u[g][0] = _mm512_maskz_unpacklo_epi64(0xFF, t0, t2);  // lane l: word 4l + 0 of rows 4g..4g+3
    u[g][1] = _mm512_maskz_unpackhi_epi64(0xFF, t0, t2);
    u[g][2] = _mm512_maskz_unpacklo_epi64(0xFF, t1, t3);
    u[g][3] = _mm512_maskz_unpackhi_epi64(0xFF, t1, t3);
  }
  for (int c = 0; c < 4; ++c) {  // word 4l + c: lane l of u[0..3][c]
    const __m512i v0 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[0][c], u[1][c], 0x44);
    const __m512i v1 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[0][c], u[1][c], 0xEE);
    const __m512i v2 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[2][c], u[3][c], 0x44);
    const __m512i v3 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[2][c], u[3][c], 0xEE);
    r[c] = _mm512_maskz_shuffle_i32x4(0xFFFF, v0, v2, 0x88);
    r[4 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, v0, v2, 0xDD);
    r[8 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, v1, v3, 0x88);
    r[12 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, v1, v3, 0xDD);
  }
}

// A tile is 16 rows of 16 words (32-bit pairs of bfloat16 along K). `words[r]` below holds row
// r; `transpose` writes words[j][r] to row r instead.
inline void store_tile(uint16_t* hi, uint16_t* lo, __m512i* wh, __m512i* wl, bool transpose) {
  if (transpose) {
    transpose16(wh);
    transpose16(wl);
  }
  for (int r = 0; r < 16; ++r) {
    _mm512_storeu_si512(hi + r * kTileK, wh[r]);
    _mm512_storeu_si512(lo + r * kTileK, wl[r]);
  }
}

// One tile from 16 source lines that each run along K (line i: 32 K values at line0 + i * ld,
// the first `len` valid, `lines` lines valid). Word j of line i is the K pair (2j, 2j + 1).
void tile_from_k_lines(uint16_t* hi, uint16_t* lo, const float* line0, int64_t ld, int64_t lines,
                       int64_t len, bool transpose) {
  __m512i wh[16], wl[16];
  for (int64_t i = 0; i < 16; ++i) {
    if (i >= lines) {
      wh[i] = wl[i] = _mm512_setzero_si512();
      continue;
    }
    split_k(load16(line0 + i * ld, len), load16(line0 + i * ld + 16, len - 16), &wh[i], &wl[i]);
  }
  store_tile(hi, lo, wh, wl, transpose);
}

// One tile from 32 source lines that each run across it (line k: 16 values at line0 + k * ld,
// the first `width` valid, `lines` lines valid): word j of row i pairs lines 2j and 2j + 1.
void tile_from_cross_lines(uint16_t* hi, uint16_t* lo, const float* line0, int64_t ld,
                           int64_t lines, int64_t width, bool transpose) {
  __m512i wh[16], wl[16];
  for (int64_t j = 0; j < 16; ++j) {
    const int64_t k0 = 2 * j, k1 = 2 * j + 1;
    split_pairs(load16(line0 + k0 * ld, k0 < lines ? width : 0),
                load16(line0 + k1 * ld, k1 < lines ? width : 0), &wh[j], &wl[j]);
  }
  store_tile(hi, lo, wh, wl, transpose);
}

// Packs an operand of `outer` x K into K tiles [kt, kt + K / 32) of tiles [outer / 16][kb]
// (hi tiles, then lo tiles). `along_k`: element (o, k) is src[o * ld + k]; otherwise
// src[k * ld + o]. `vnni`: tile rows are K pairs (B), else outer (A).
void pack(uint16_t* dst, const float* src, int64_t outer, int64_t k, int64_t ld, bool along_k,
          bool vnni, int64_t kt, int64_t kb) {
  const int64_t ob = ceil_div(outer, kTileRows), kn = ceil_div(k, kTileK);
  uint16_t* lo_base = dst + ob * kb * kTileElems;
  // Tiles in the source's row order: along its rows first (one pass over each cache line and
  // page, which a walk down a column at a large row stride is not).
  const int64_t n0 = along_k ? ob : kn, n1 = along_k ? kn : ob;
  for (int64_t i0 = 0; i0 < n0; ++i0) {
    for (int64_t i1 = 0; i1 < n1; ++i1) {
      const int64_t o = along_k ? i0 : i1, t = along_k ? i1 : i0;
      uint16_t* hi = dst + (o * kb + kt + t) * kTileElems;
      uint16_t* lo = lo_base + (o * kb + kt + t) * kTileElems;
      const int64_t o0 = o * kTileRows, k0 = t * kTileK;
      const int64_t outer_n = outer - o0 < kTileRows ? outer - o0 : kTileRows;
      const int64_t k_n = k - k0 < kTileK ? k - k0 : kTileK;
      if (along_k) {
        tile_from_k_lines(hi, lo, src + o0 * ld + k0, ld, outer_n, k_n, vnni);
      } else {
        tile_from_cross_lines(hi, lo, src + k0 * ld + o0, ld, k_n, outer_n, !vnni);
      }
    }
  }
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// C tile (r, c) of the current block: loaded from and stored into c, through a 16 x 16 bounce
// buffer at the matrix's edges.
struct CTile {
  float* c;
  int64_t ldc, rows, cols;
  const float* bias;  // offset to the tile's first column (Start::kBias)
  bool full() const { return rows == 16 && cols == 16; }
};

// A C tile's starting value: c's (kAccumulate), zeros (kOverwrite), or the bias in every row
// (kBias: a row stride of 0).
#define RLPAR_AMX_LOAD_C(T, ct, buf, start)                                              \
  do {                                                                                   \
    if ((start) == Start::kOverwrite) {                                                  \
      _tile_zero(T);                                                                     \
    } else if ((start) == Start::kBias && (ct).cols == 16) {                             \
      _tile_loadd(T, (ct).bias, 0);                                                      \
    } else if ((start) == Start::kBias) {                                                \
      std::memset(buf, 0, sizeof(buf));                                                  \
      for (int r_ = 0; r_ < 16; ++r_)                                                    \
        std::memcpy(buf + r_ * 16, (ct).bias, sizeof(float) * (ct).cols);                \
      _tile_loadd(T, buf, 64);                                                           \
    } else if ((ct).full()) {                                                            \
      _tile_loadd(T, (ct).c, (ct).ldc * 4);                                              \
    } else {                                                                             \
      std::memset(buf, 0, sizeof(buf));                                                  \
      for (int64_t r_ = 0; r_ < (ct).rows; ++r_)                                         \
        std::memcpy(buf + r_ * 16, (ct).c + r_ * (ct).ldc, sizeof(float) * (ct).cols);   \
      _tile_loadd(T, buf, 64);                                                           \
    }                                                                                    \
  } while (0)

#define RLPAR_AMX_STORE_C(T, ct, buf)                                                  \
  do {                                                                                 \
    if ((ct).full()) {                                                                 \
      _tile_stored(T, (ct).c, (ct).ldc * 4);                                           \
    } else {                                                                           \
      _tile_stored(T, buf, 64);                                                        \
      for (int64_t r_ = 0; r_ < (ct).rows; ++r_)                                       \
        std::memcpy((ct).c + r_ * (ct).ldc, buf + r_ * 16, sizeof(float) * (ct).cols); \
    }                                                                                  \
  } while (0)

// The dot products of one K tile for the block's 1-2 x 1-2 C tiles (tiles 0-3), A in tiles
// 4-5 and B in 6-7.
#define RLPAR_AMX_DOTS(two_m, two_n) \
  do {                               \
    _tile_dpbf16ps(0, 4, 6);         \
    if (two_n) _tile_dpbf16ps(1, 4, 7); \
    if (two_m) {                     \
      _tile_dpbf16ps(2, 5, 6);       \
      if (two_n) _tile_dpbf16ps(3, 5, 7); \
    }                                \
  } while (0)

}  // namespace

void pack_a(uint16_t* dst, const float* src, int64_t m, int64_t k, int64_t ld, bool transposed) {
  pack(dst, src, m, k, ld, !transposed, false, 0, ceil_div(k, kTileK));
}

void pack_b(uint16_t* dst, const float* src, int64_t k, int64_t n, int64_t ld, bool transposed) {
  pack(dst, src, n, k, ld, transposed, true, 0, ceil_div(k, kTileK));
}

void pack_a_part(uint16_t* dst, const float* src, int64_t m, int64_t k, int64_t ld,
                 bool transposed, int64_t kt, int64_t kb) {
  pack(dst, src, m, k, ld, !transposed, false, kt, kb);
}

void pack_b_part(uint16_t* dst, const float* src, int64_t k, int64_t n, int64_t ld,
                 bool transposed, int64_t kt, int64_t kb) {
  pack(dst, src, n, k, ld, transposed, true, kt, kb);
}

void gemm(float* c, int64_t ldc, const uint16_t* a, const uint16_t* b, int64_t m, int64_t n,
          int64_t k, Start start, const float* bias) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // no products: only the start
    for (int64_t i = 0; i < m && start != Start::kAccumulate; ++i) {
      if (start == Start::kBias) std::memcpy(c + i * ldc, bias, sizeof(float) * n);
      if (start == Start::kOverwrite) std::memset(c + i * ldc, 0, sizeof(float) * n);
    }
    return;
  }
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  const int64_t mb = ceil_div(m, kTileRows), nb = ceil_div(n, kTileRows), kb = ceil_div(k, kTileK);
  const uint16_t* a_lo = a + mb * kb * kTileElems;
  const uint16_t* b_lo = b + nb * kb * kTileElems;
  alignas(64) float buf[256];
  auto tile_of = [&](int64_t i, int64_t j) {
    const int64_t r0 = i * 16, c0 = j * 16;
    return CTile{c + r0 * ldc + c0, ldc, m - r0 < 16 ? m - r0 : 16, n - c0 < 16 ? n - c0 : 16,
                 bias != nullptr ? bias + c0 : nullptr};
  };
  for (int64_t k0 = 0; k0 < kb; k0 += kKChunkTiles) {
    const int64_t k1 = k0 + kKChunkTiles < kb ? k0 + kKChunkTiles : kb;
    const Start from = k0 == 0 ? start : Start::kAccumulate;
    for (int64_t m0 = 0; m0 < mb; m0 += kMChunkTiles) {
      const int64_t m1 = m0 + kMChunkTiles < mb ? m0 + kMChunkTiles : mb;
      for (int64_t j = 0; j < nb; j += 2) {
        const bool two_n = j + 1 < nb;
        for (int64_t i = m0; i < m1; i += 2) {
          const bool two_m = i + 1 < m1;
          const CTile c00 = tile_of(i, j);
          RLPAR_AMX_LOAD_C(0, c00, buf, from);
          if (two_n) RLPAR_AMX_LOAD_C(1, tile_of(i, j + 1), buf, from);
          if (two_m) RLPAR_AMX_LOAD_C(2, tile_of(i + 1, j), buf, from);
          if (two_m && two_n) RLPAR_AMX_LOAD_C(3, tile_of(i + 1, j + 1), buf, from);
          for (int64_t t = k0; t < k1; ++t) {
            const int64_t a0 = (i * kb + t) * kTileElems, a1 = a0 + kb * kTileElems;
            const int64_t b0 = (j * kb + t) * kTileElems, b1 = b0 + kb * kTileElems;
            // Each of the 8 operand tiles loaded once: hi lo, then hi hi, then lo hi.
            _tile_loadd(4, a + a0, 64);
            if (two_m) _tile_loadd(5, a + a1, 64);
            _tile_loadd(6, b_lo + b0, 64);
            if (two_n) _tile_loadd(7, b_lo + b1, 64);
            RLPAR_AMX_DOTS(two_m, two_n);  // hi lo
            _tile_loadd(6, b + b0, 64);
            if (two_n) _tile_loadd(7, b + b1, 64);
            RLPAR_AMX_DOTS(two_m, two_n);  // hi hi
            _tile_loadd(4, a_lo + a0, 64);
            if (two_m) _tile_loadd(5, a_lo + a1, 64);
            RLPAR_AMX_DOTS(two_m, two_n);  // lo hi
          }
          RLPAR_AMX_STORE_C(0, c00, buf);
          if (two_n) RLPAR_AMX_STORE_C(1, tile_of(i, j + 1), buf);
          if (two_m) RLPAR_AMX_STORE_C(2, tile_of(i + 1, j), buf);
          if (two_m && two_n) RLPAR_AMX_STORE_C(3, tile_of(i + 1, j + 1), buf);
        }
      }
    }
  }
  _tile_release();
}
#pragma GCC pop_options

#else  // no AMX build: available() is false and nothing else may be called

bool available() { return false; }
void pack_a(uint16_t*, const float*, int64_t, int64_t, int64_t, bool) {}
void pack_b(uint16_t*, const float*, int64_t, int64_t, int64_t, bool) {}
void pack_a_part(uint16_t*, const float*, int64_t, int64_t, int64_t, bool, int64_t, int64_t) {}
void pack_b_part(uint16_t*, const float*, int64_t, int64_t, int64_t, bool, int64_t, int64_t) {}
void gemm(float*, int64_t, const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, Start,
          const float*) {}

#endif

}  // namespace rlpar::amx
