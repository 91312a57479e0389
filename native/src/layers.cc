#include "rlpar/layers.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "eigen_maps.h"

#if defined(__AVX512F__)
#include "avx512_kernels.h"
#define RLPAR_LINEAR_AVX512 1
#endif

namespace rlpar::layers {
namespace {

#if RLPAR_LINEAR_AVX512
// Rows of w per pass of the forward: a 512 x 64 block of the weight (128 KiB) stays in L2 while
// every row tile of the batch uses it.
constexpr int64_t kLinearBlock = 512;

// How a column tile reads w (linear_forward_all chooses).
enum class WeightRead {
  kInPlace,
  kPrefetch,  // in place, fetched ahead (see simd::FwdArgs::prefetch)
  // Each block's columns first copied into a contiguous panel (a thread's own buffer): w's rows
  // 4 KiB apart all map to the same few L1 sets, and a panel's do not. Worth its copy when many
  // row tiles read the panel.
  kPacked,
};

// y[:, oc0 .. oc0 + 16 NV] = x w (+ b, ReLU); b may be nullptr. `add`: y += x w instead.
// Tiles of R rows.
template <int NV, int R = simd::tile_rows<NV>()>
void linear_forward_columns(float* y, const float* x, const float* w, const float* b,
                            int64_t batch, int64_t in, int64_t out, int64_t oc0, bool relu,
                            bool add = false, WeightRead read = WeightRead::kInPlace) {
  const float* a[R];
  simd::FwdArgs g{a, 1, 0, 0, nullptr, b ? b + oc0 : nullptr, out, nullptr,
                  simd::tail_mask(out - oc0 - 16 * (NV - 1)), relu};
  g.prefetch = read == WeightRead::kPrefetch;
  constexpr int64_t kPanelCols = 16 * NV;
  thread_local std::vector<float> panel;
  if (read == WeightRead::kPacked) {
    panel.resize(kLinearBlock * kPanelCols);
    g.ldw = kPanelCols;
    g.ldy = out;
  }
  const int64_t cols = std::min(kPanelCols, out - oc0);
  for (int64_t k0 = 0; k0 < in; k0 += kLinearBlock) {
    g.run = std::min(kLinearBlock, in - k0);
    g.w = w + k0 * out + oc0;
    if (read == WeightRead::kPacked) {
      for (int64_t k = 0; k < g.run; ++k) {
        std::memcpy(panel.data() + k * kPanelCols, g.w + k * out, sizeof(float) * cols);
      }
      g.w = panel.data();
    }
    g.first = k0 == 0 && !add;
    g.final = k0 + g.run == in;
    for (int64_t p0 = 0; p0 < batch; p0 += R) {
      const int64_t rows = std::min<int64_t>(R, batch - p0);
      for (int64_t r = 0; r < rows; ++r) a[r] = x + (p0 + r) * in + k0;
      g.y = y + p0 * out + oc0;
      simd::fwd_tile_n<R, NV>(rows, g);
    }
  }
}

// Samples per pass of the weight gradient: the pass's dy columns (64 x 64 floats, 16 KiB) stay in
// L1 while every row tile of dw uses them (measured: the 1024 -> 128 layer at batch 1024 ran at
// ~70 GFLOP/s streaming all samples per tile).
constexpr int64_t kDwSamples = 64;

// dw[:, oc0 .. oc0 + 16 NV] += x^T dy, KR rows of dw at a time, samples in order (each tile's
// accumulators are stored and reloaded between passes, which changes no float).
// Rows j0 .. j1 of dw only (any slice gives the floats of the whole).
template <int NV>
void linear_weight_grad_columns(float* dw, const float* dy, const float* x, int64_t batch,
                                int64_t in, int64_t out, int64_t oc0, int64_t j0, int64_t j1) {
  constexpr int KR = simd::tile_rows<NV>();
  for (int64_t n0 = 0; n0 < batch; n0 += kDwSamples) {
    simd::DwArgs g{nullptr, dy + n0 * out + oc0, nullptr, out, 1,
                   std::min(kDwSamples, batch - n0), in, 0,
                   simd::tail_mask(out - oc0 - 16 * (NV - 1))};
    for (int64_t j = j0; j < j1; j += KR) {
      g.dw = dw + j * out + oc0;
      g.x = x + n0 * in + j;
      simd::dw_tile_n<KR, NV>(std::min<int64_t>(KR, j1 - j), g);
    }
  }
}

// Calls fn(std::integral_constant<int, NV>, oc0) for each tile of up to 16 MaxNV output columns.
template <int MaxNV = simd::kMaxVectors, typename Fn>
void for_column_tiles(int64_t out, Fn&& fn) {
  static_assert(MaxNV >= 1 && MaxNV <= simd::kMaxVectors);
  for (int64_t oc0 = 0; oc0 < out; oc0 += 16 * MaxNV) {
    switch ((std::min<int64_t>(out - oc0, 16 * MaxNV) + 15) / 16) {
      case 1: fn(std::integral_constant<int, 1>{}, oc0); break;
      case 2: fn(std::integral_constant<int, 2>{}, oc0); break;
      case 3: fn(std::integral_constant<int, 3>{}, oc0); break;
      default: fn(std::integral_constant<int, MaxNV>{}, oc0); break;
    }
  }
}

// Wide weights (rows >= 2 KiB apart) read in place, prefetched, or packed.
constexpr int64_t kWideOut = 512;

// A few rows (an actor's batch) times a wide weight: 8-row tiles of 48 columns, so a batch of 8
// or 16 fills whole tiles, and w prefetched, since its rows lie >= 2 KiB apart. Measured in one
// process, alternating, best of 10 (GFLOP/s, default tiles -> these): the LSTM's 256 -> 1024 at
// batch 8 73-77 -> 132-138, 16 109-113 -> 129-136, 32 103-108 -> 130-139; the Nature torso's
// 3136 -> 512 at batch 16 60-62 -> 77-82 and 32 75 -> 96. At batch 96 both ran at ~93; below
// batch 4 the call is bound by reading w, and neither wins.
constexpr int64_t kFewRows = 32;
// From this many rows on, a wide weight is packed block by block. Measured in one process,
// alternating (GFLOP/s, in place -> packed): 256 -> 1024 at batch 96 114-117 -> 123-129, 256
// 107 -> 125-131, 1024 101-107 -> 119-125, 5120 90-97 -> 110-112; the Nature torso's 3136 -> 512
// at batch 256 104-110 -> 125-128 and 640 109-111 -> 123-128.
constexpr int64_t kPackRows = 64;

// linear_forward / linear_forward_add over every column tile.
void linear_forward_all(float* y, const float* x, const float* w, const float* b, int64_t batch,
                        int64_t in, int64_t out, bool relu, bool add) {
  if (batch >= 4 && batch <= kFewRows && out >= kWideOut) {
    for_column_tiles<3>(out, [&](auto nv, int64_t oc0) {
      linear_forward_columns<decltype(nv)::value, 8>(y, x, w, b, batch, in, out, oc0, relu, add,
                                                     WeightRead::kPrefetch);
    });
    return;
  }
  const WeightRead read =
      batch >= kPackRows && out >= kWideOut ? WeightRead::kPacked : WeightRead::kInPlace;
  for_column_tiles(out, [&](auto nv, int64_t oc0) {
    linear_forward_columns<decltype(nv)::value>(y, x, w, b, batch, in, out, oc0, relu, add, read);
  });
}

// Rows of w per block of the dot-product data gradient: 64 rows of up to a few KiB stay in L2
// while every 4-sample tile of dy passes over them.
constexpr int64_t kDotRows = 64;
// From this many outputs on, the data gradient takes dot products along w's rows; below, a
// transposed copy of w is cheap and the forward kernel is faster.
constexpr int64_t kDotMinOut = 256;

// dx[n][j] = sum_o dy[n][o] w[j][o], in 4 x 4 tiles.
void linear_data_grad_dots(float* dx, const float* dy, const float* w, int64_t batch, int64_t in,
                           int64_t out) {
  for (int64_t j0 = 0; j0 < in; j0 += kDotRows) {
    const int64_t j_end = std::min(in, j0 + kDotRows);
    for (int64_t n = 0; n < batch; n += 4) {
      const int64_t rows = std::min<int64_t>(4, batch - n);
      const float* a[4];
      for (int64_t r = 0; r < 4; ++r) a[r] = dy + std::min(n + r, batch - 1) * out;
      for (int64_t j = j0; j < j_end; j += 4) {
        const int64_t cols = std::min<int64_t>(4, j_end - j);
        const float* b[4];
        for (int64_t c = 0; c < 4; ++c) b[c] = w + std::min(j + c, j_end - 1) * out;
        simd::dot_tile_4x4(dx + n * in + j, in, a, b, out, rows, cols);
      }
    }
  }
}
#endif

// Below this many rows, row-by-row GEMV beats the blocked GEMM (measured: batch 2-8
// took 0.7-1.1 us through GEMM against 0.25 us at batch 1, which Eigen routes to GEMV).
constexpr int64_t kSmallBatch = 8;

}  // namespace

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                    int64_t in, int64_t out, bool relu) {
#if RLPAR_LINEAR_AVX512
  linear_forward_all(y, x, w, b, batch, in, out, relu, false);
#else
  MatMap Y(y, batch, out);
  ConstMatMap X(x, batch, in);
  ConstMatMap W(w, in, out);
  if (batch <= kSmallBatch) {
    // Eigen's blocked GEMM has ~450 ns of fixed cost, more than the work for a few rows: one
    // vector-matrix product (GEMV) per row instead.
    for (int64_t r = 0; r < batch; ++r) Y.row(r).noalias() = X.row(r) * W;
  } else {
    Y.noalias() = X * W;
  }
  Y.rowwise() += ConstRowVec(b, out);
  if (relu) Y = Y.cwiseMax(0.0f);
#endif
}

void linear_forward_add(float* y, const float* x, const float* w, int64_t batch, int64_t in,
                        int64_t out) {
#if RLPAR_LINEAR_AVX512
  linear_forward_all(y, x, w, nullptr, batch, in, out, false, true);
#else
  MatMap Y(y, batch, out);
  ConstMatMap X(x, batch, in);
  ConstMatMap W(w, in, out);
  if (batch <= kSmallBatch) {
    for (int64_t r = 0; r < batch; ++r) Y.row(r).noalias() += X.row(r) * W;  // GEMV, as above
  } else {
    Y.noalias() += X * W;
  }
#endif
}

int64_t linear_scratch_floats(int64_t in, int64_t out) {
#if RLPAR_LINEAR_AVX512
  return out >= kDotMinOut ? 0 : in * out;
#else
  (void)in;
  (void)out;
  return 0;
#endif
}

void linear_weight_grad(float* dw, float* db, const float* dy, const float* x, int64_t batch,
                        int64_t in, int64_t out, int64_t part, int64_t parts) {
#if RLPAR_LINEAR_AVX512
  int64_t j0, j1, o0, o1;
  split_range(in, parts, part, &j0, &j1);
  split_range(out, parts, part, &o0, &o1);
  if (j1 > j0) {
    for_column_tiles(out, [&](auto nv, int64_t oc0) {
      linear_weight_grad_columns<decltype(nv)::value>(dw, dy, x, batch, in, out, oc0, j0, j1);
    });
  }
  if (o1 > o0) add_column_sums(db + o0, dy + o0, batch, o1 - o0, out);
#else
  (void)parts;
  if (part != 0) return;  // Eigen's GEMM computes the whole gradient in one part
  MatMap(dw, in, out).noalias() += ConstMatMap(x, batch, in).transpose() * ConstMatMap(dy, batch, out);
  add_column_sums(db, dy, batch, out, out);
#endif
}

void linear_data_grad(float* dx, const float* dy, const float* w, int64_t batch, int64_t in,
                      int64_t out, float* scratch) {
#if RLPAR_LINEAR_AVX512
  if (out >= kDotMinOut) return linear_data_grad_dots(dx, dy, w, batch, in, out);
  // dx = dy w^T: the forward kernel over the transposed weight.
  simd::transpose(scratch, w, in, out);
  for_column_tiles(in, [&](auto nv, int64_t j0) {
    linear_forward_columns<decltype(nv)::value>(dx, dy, scratch, nullptr, batch, out, in, j0,
                                                false);
  });
#else
  (void)scratch;
  MatMap(dx, batch, in).noalias() =
      ConstMatMap(dy, batch, out) * ConstMatMap(w, in, out).transpose();
#endif
}

void add_column_sums(float* acc, const float* x, int64_t rows, int64_t cols, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * stride;
    for (int64_t j = 0; j < cols; ++j) acc[j] += row[j];
  }
}

void relu_forward(float* y, const float* x, int64_t n) {
  ArrMap(y, n) = ConstArrMap(x, n).max(0.0f);
}

void relu_backward(float* dx, const float* dy, const float* y, int64_t n) {
  ArrMap(dx, n) = (ConstArrMap(y, n) > 0.0f).select(ConstArrMap(dy, n), 0.0f);
}

void tanh_forward(float* y, const float* x, int64_t n) {
  ArrMap(y, n) = ConstArrMap(x, n).tanh();
}

void tanh_backward(float* dx, const float* dy, const float* y, int64_t n) {
  ConstArrMap Y(y, n);
  ArrMap(dx, n) = ConstArrMap(dy, n) * (1.0f - Y * Y);
}

}  // namespace rlpar::layers
