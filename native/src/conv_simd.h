// Internal: conv.cc's SIMD path (implicit-GEMM micro-kernels), written once for both vector
// widths. conv.cc includes it once per kernel set, after that set's header (avx512_kernels.h or
// avx2_kernels.h), with RLPAR_SIMD_NS naming the set's namespace (avx512 or avx2): the functions
// below then see that set's Vec, kLanes, kMaxVectors and tiles. No include guard, on purpose.
#ifndef RLPAR_SIMD_NS
#error "define RLPAR_SIMD_NS (the kernel set's namespace) before including conv_simd.h"
#endif

namespace rlpar::layers::RLPAR_SIMD_NS {
namespace {

// The same conv on an input already padded: what the kernels see after `pad_sample`.
ConvShape unpadded(const ConvShape& s) {
  ConvShape q = s;
  q.h += 2 * s.pad;
  q.w += 2 * s.pad;
  q.pad = 0;
  return q;
}

// dst: [H + 2P, W + 2P, C] <- src: [H, W, C] with a zero border.
void pad_sample(float* dst, const float* src, const ConvShape& s) {
  const ConvShape q = unpadded(s);
  std::memset(dst, 0, sizeof(float) * sample_size(q));
  for (int64_t iy = 0; iy < s.h; ++iy) {
    std::memcpy(dst + ((iy + s.pad) * q.w + s.pad) * s.c, src + iy * s.w * s.c,
                sizeof(float) * s.w * s.c);
  }
}

// dst: [H, W, C] <- the interior of src: [H + 2P, W + 2P, C].
void crop_sample(float* dst, const float* src, const ConvShape& s) {
  const ConvShape q = unpadded(s);
  for (int64_t iy = 0; iy < s.h; ++iy) {
    std::memcpy(dst + iy * s.w * s.c, src + ((iy + s.pad) * q.w + s.pad) * s.c,
                sizeof(float) * s.w * s.c);
  }
}

// Calls fn(std::integral_constant<int, NV>) with NV = the vectors that `n` columns need, at most
// kMaxVectors (a tile's width).
template <int NV = 1, typename Fn>
void with_vectors(int64_t n, Fn&& fn) {
  if constexpr (NV < kMaxVectors) {
    if (n > NV * kLanes) return with_vectors<NV + 1>(n, fn);
  }
  fn(std::integral_constant<int, NV>{});
}

// Where the patch of each output position starts in an unpadded input, for `count` positions
// from flat position `p0` (over samples, then oy, then ox).
void patch_starts(const float** a, const float* x, int64_t p0, int64_t count, const ConvShape& s) {
  // One division for the first position, then a step along ox (integer divisions per row cost
  // as much as the tile's arithmetic for a small conv).
  const int64_t pos = s.positions(), n = p0 / pos, q = p0 % pos;
  int64_t oy = q / s.ow, ox = q % s.ow;
  const float* sample = x + n * sample_size(s);
  for (int64_t r = 0; r < count; ++r) {
    a[r] = sample + (oy * s.stride * s.w + ox * s.stride) * s.c;
    if (++ox == s.ow) {
      ox = 0;
      if (++oy == s.oh) {
        oy = 0;
        sample += sample_size(s);
      }
    }
  }
}

template <int NV>
void fwd_positions(float* y, const float* x, const float* w, const float* b, int64_t oc0,
                   int64_t m, const ConvShape& s, bool relu) {
  constexpr int R = tile_rows<NV>();
  const float* a[R];
  FwdArgs g{a, s.k, s.k * s.c, s.w * s.c, w + oc0, b + oc0, s.oc, nullptr,
            tail_mask(s.oc - oc0 - kLanes * (NV - 1)), relu};
  for (int64_t p0 = 0; p0 < m; p0 += R) {
    const int64_t rows = std::min<int64_t>(R, m - p0);
    patch_starts(a, x, p0, rows, s);
    g.y = y + p0 * s.oc + oc0;
    fwd_tile_n<R, NV>(rows, g);
  }
}

// y: [m positions, OC] for the unpadded conv `s` over `x` (m = samples x positions).
void fast_forward(float* y, const float* x, const float* w, const float* b, int64_t m,
                  const ConvShape& s, bool relu) {
  for (int64_t oc0 = 0; oc0 < s.oc; oc0 += kLanes * kMaxVectors) {
    with_vectors(s.oc - oc0, [&](auto nv) {
      fwd_positions<decltype(nv)::value>(y, x, w, b, oc0, m, s, relu);
    });
  }
}

// dw += the weight gradient of one unpadded sample, for channels oc0 .. oc0 + kLanes NV and the
// patch rows (ky * K * C + j) in [r0, r1). Each weight sums the positions in order, so a slice
// of rows gives the same floats as the whole.
template <int NV>
void dw_sample(float* dw, const float* dy, const float* x, int64_t oc0, const ConvShape& s,
               int64_t r0, int64_t r1) {
  constexpr int KR = tile_rows<NV>();
  const int64_t run = s.k * s.c;
  DwArgs g{nullptr, dy + oc0, nullptr, s.oc, s.oh, s.ow, s.stride * s.c, s.stride * s.w * s.c,
           tail_mask(s.oc - oc0 - kLanes * (NV - 1))};
  for (int64_t ky = r0 / run; ky < s.k && ky * run < r1; ++ky) {
    const int64_t j_end = std::min(run, r1 - ky * run);
    for (int64_t j = std::max<int64_t>(0, r0 - ky * run); j < j_end; j += KR) {
      g.dw = dw + (ky * run + j) * s.oc + oc0;
      g.x = x + ky * s.w * s.c + j;
      dw_tile_n<KR, NV>(std::min<int64_t>(KR, j_end - j), g);
    }
  }
}

void fast_weight_grad(float* dw, const float* dy, const float* x, const ConvShape& s, int64_t r0,
                      int64_t r1) {
  for (int64_t oc0 = 0; oc0 < s.oc; oc0 += kLanes * kMaxVectors) {
    with_vectors(s.oc - oc0, [&](auto nv) {
      dw_sample<decltype(nv)::value>(dw, dy, x, oc0, s, r0, r1);
    });
  }
}

// The data gradient reads the weight as panels: for each kernel row ky and each block of up to
// kDxCols columns of that row's run (K * C floats; 64 with AVX-512, 16 with AVX2), an
// [OC, width] block, contiguous (width rounded up to whole vectors). A plain transposed weight
// [OC, patch] has rows >= 2 KiB apart for the Nature torso's convs, which defeats the stride
// prefetcher. Measured with AVX-512 in one process, alternating, best of 6
// (GFLOP/s, transposed weight -> panels): 20x20x32 -> 64 4x4/2 at batch 32 102-104 -> 117-119
// and 256 89-90 -> 101; 9x9x64 -> 64 3x3/1 104-106 -> 117-120 and 98-103 -> 110-116; a first
// layer (84x84x4, 8x8/4) and a padded 3x3 within 4 % either way. The same floats.
constexpr int64_t kDxCols = kLanes * kMaxVectors;

int64_t round_lanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

int64_t dx_panel_floats(const ConvShape& s) { return s.k * s.oc * round_lanes(s.k * s.c); }

// Where the panel of kernel row ky, columns col0 .. col0 + kDxCols of its run, starts, and its
// row length.
int64_t dx_panel(const ConvShape& s, int64_t ky, int64_t col0, int64_t* ld) {
  const int64_t run = s.k * s.c;
  *ld = std::min(kDxCols, round_lanes(run - col0));
  return ky * s.oc * round_lanes(run) + col0 * s.oc;
}

// panel[o][j] = w[ky * run + col0 + j][o] for every panel.
void pack_dx_panels(float* wtp, const float* w, const ConvShape& s) {
  const int64_t run = s.k * s.c;
  for (int64_t ky = 0; ky < s.k; ++ky) {
    for (int64_t col0 = 0; col0 < run; col0 += kDxCols) {
      int64_t ld;
      float* dst = wtp + dx_panel(s, ky, col0, &ld);
      const float* src = w + (ky * run + col0) * s.oc;
      const int64_t width = std::min(kDxCols, run - col0);
      const int64_t w16 = width / kLanes * kLanes, o16 = s.oc / kLanes * kLanes;
      for (int64_t j = 0; j < w16; j += kLanes) {
        for (int64_t o = 0; o < o16; o += kLanes) {
          transpose_block(dst + o * ld + j, ld, src + j * s.oc + o, s.oc);
        }
      }
      for (int64_t j = 0; j < width; ++j) {
        for (int64_t o = (j < w16 ? o16 : 0); o < s.oc; ++o) dst[o * ld + j] = src[j * s.oc + o];
      }
    }
  }
}

template <int NV>
void dx_columns(const float* dy, const float* wtp, int64_t p0, int64_t rows, int64_t col0,
                float* const* base, const ConvShape& s) {
  constexpr int R = tile_rows<NV>();
  const int64_t run = s.k * s.c, width = std::min<int64_t>(kLanes * NV, run - col0);
  float* starts[R];
  const float* dys[R];
  for (int64_t r = 0; r < rows; ++r) dys[r] = dy + (p0 + r) * s.oc;
  DxArgs g{starts, dys, nullptr, s.oc, 0, tail_mask(width - kLanes * (NV - 1))};
  for (int64_t ky = 0; ky < s.k; ++ky) {
    for (int64_t r = 0; r < rows; ++r) starts[r] = base[r] + ky * s.w * s.c + col0;
    g.wt = wtp + dx_panel(s, ky, col0, &g.ldwt);
    dx_tile_n<R, NV>(rows, g);
  }
}

// dx (zeroed by the caller) += the data gradient of m unpadded positions; wt: pack_dx_panels'.
void fast_data_grad(float* dx, const float* dy, const float* wt, int64_t m, const ConvShape& s) {
  constexpr int R = tile_rows<kMaxVectors>();
  static_assert(tile_rows<1>() >= R && tile_rows<kMaxVectors - 1>() >= R);
  const int64_t run = s.k * s.c;
  float* base[R];
  for (int64_t p0 = 0; p0 < m; p0 += R) {
    const int64_t rows = std::min<int64_t>(R, m - p0);
    const float* starts[R];
    patch_starts(starts, dx, p0, rows, s);
    for (int64_t r = 0; r < rows; ++r) base[r] = const_cast<float*>(starts[r]);
    for (int64_t col0 = 0; col0 < run; col0 += kLanes * kMaxVectors) {
      with_vectors(run - col0, [&](auto nv) {
        dx_columns<decltype(nv)::value>(dy, wt, p0, rows, col0, base, s);
      });
    }
  }
}

// conv.cc's public functions on this kernel set (see rlpar/layers.h).

int64_t conv_scratch_floats(const ConvShape& s, bool backward) {
  const int64_t padded = s.pad > 0 ? sample_size(unpadded(s)) : 0;
  return backward ? dx_panel_floats(s) + 2 * padded : padded;
}

void conv_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                  const ConvShape& s, bool relu, float* scratch) {
  if (s.pad == 0) return fast_forward(y, x, w, b, batch * s.positions(), s, relu);
  const ConvShape q = unpadded(s);
  for (int64_t n = 0; n < batch; ++n) {
    pad_sample(scratch, x + n * sample_size(s), s);
    fast_forward(y + n * s.positions() * s.oc, scratch, w, b, s.positions(), q, relu);
  }
}

void conv_weight_grad(float* dw, float* db, const float* dy, const float* x, int64_t batch,
                      const ConvShape& s, int64_t part, int64_t parts, float* scratch) {
  const int64_t pos = s.positions();
  int64_t c0, c1, r0, r1;
  split_range(s.oc, parts, part, &c0, &c1);
  split_range(s.patch(), parts, part, &r0, &r1);
  if (c1 > c0) add_column_sums(db + c0, dy + c0, batch * pos, c1 - c0, s.oc);
  if (r1 <= r0) return;
  if (s.pad == 0) {
    for (int64_t n = 0; n < batch; ++n) {
      fast_weight_grad(dw, dy + n * pos * s.oc, x + n * sample_size(s), s, r0, r1);
    }
    return;
  }
  const ConvShape q = unpadded(s);
  float* xp = scratch + dx_panel_floats(s);
  for (int64_t n = 0; n < batch; ++n) {
    pad_sample(xp, x + n * sample_size(s), s);
    fast_weight_grad(dw, dy + n * pos * s.oc, xp, q, r0, r1);
  }
}

void conv_data_grad(float* dx, const float* dy, const float* w, int64_t batch, const ConvShape& s,
                    float* scratch) {
  const int64_t pos = s.positions();
  float* wt = scratch;  // dx_panel_floats(s)
  pack_dx_panels(wt, w, s);
  // Sample by sample (tiles never straddle two samples), so that any split of the batch by
  // samples adds the same contributions in the same order.
  if (s.pad == 0) {
    std::memset(dx, 0, sizeof(float) * batch * sample_size(s));
    for (int64_t n = 0; n < batch; ++n) {
      fast_data_grad(dx + n * sample_size(s), dy + n * pos * s.oc, wt, pos, s);
    }
    return;
  }
  const ConvShape q = unpadded(s);
  float* dxp = scratch + dx_panel_floats(s) + sample_size(q);
  for (int64_t n = 0; n < batch; ++n) {
    std::memset(dxp, 0, sizeof(float) * sample_size(q));
    fast_data_grad(dxp, dy + n * pos * s.oc, wt, pos, q);
    crop_sample(dx + n * sample_size(s), dxp, s);
  }
}

}  // namespace
}  // namespace rlpar::layers::RLPAR_SIMD_NS
