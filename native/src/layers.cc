#include "rlpar/layers.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <cstring>
#include <type_traits>
#include <vector>

#include "eigen_maps.h"
#include "rlpar/isa.h"

#if defined(__AVX512F__)
#include "avx512_kernels.h"
#define RLPAR_LINEAR_AVX512 1
#endif

namespace rlpar::layers {
namespace {

#if RLPAR_LINEAR_AVX512
namespace simd = avx512;

// True when this call runs the AVX-512 kernels below (active_isa(): see rlpar/isa.h); otherwise
// Eigen's GEMM. Each public function asks once per call.
bool linear_avx512() { return active_isa() == Isa::Avx512; }

// Rows of w per pass of the forward: a 512 x 64 block of the weight (128 KiB) stays in L2 while
// every row tile of the batch uses it.
constexpr int64_t kLinearBlock = 512;

// Runs g over `batch` rows of x (rows ldx floats apart) into the same rows of y (ldy floats
// apart), R rows a tile; `a` is the array g.a points to.
template <int R, int NV>
void fwd_row_tiles(simd::FwdArgs& g, const float** a, const float* x, int64_t ldx, int64_t batch,
                   float* y, int64_t ldy) {
  for (int64_t p0 = 0; p0 < batch; p0 += R) {
    const int64_t rows = std::min<int64_t>(R, batch - p0);
    for (int64_t r = 0; r < rows; ++r) a[r] = x + (p0 + r) * ldx;
    g.y = y + p0 * ldy;
    simd::fwd_tile_n<R, NV>(rows, g);
  }
}

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
  // A packed panel is prefetched too: its 64-column rows are contiguous, but the tiles stream
  // 256 B a row from L2 (measured in one process, alternating, best of 5, GFLOP/s, without ->
  // with: the Nature torso's 3136 -> 512 at 640 rows 125-130 -> 140-141, the LSTM's 256 -> 1024
  // at 256 rows 133-137 -> 143-148 and at 5120 rows 117-120 -> 123-128).
  g.prefetch = read != WeightRead::kInPlace;
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
    fwd_row_tiles<R, NV>(g, a, x + k0, in, batch, y + oc0, out);
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

// From this many outputs on, the weight gradient copies each pass's dy into column panels.
// Measured in one process, alternating, best of 6 (GFLOP/s, per column tile -> panels): the Nature
// torso's 3136 -> 512 at batch 640 85-92 -> 123-125 and 256 63-67 -> 85-91 (a slower phase of
// the VM), the LSTM's 256 -> 1024 at 5120 rows 61-63 -> 78-95, 256 -> 256 102-108 -> 114-118;
// 1600 -> 128 (MinAtar) 125-128 either way, 64 -> 64 121-124 -> 112-115.
constexpr int64_t kPanelDyOut = 256;

constexpr int64_t kDyCols = 16 * simd::kMaxVectors;  // columns of one dy panel

int64_t dy_panels_of(int64_t out) { return (out + kDyCols - 1) / kDyCols; }

// Floats of one pass's panels: [panels][kDwSamples][kDyCols].
int64_t dy_pass_floats(int64_t out) { return dy_panels_of(out) * kDwSamples * kDyCols; }

// Copies the pass of samples n0 .. n0 + samples of dy into its panels.
void pack_dy_pass(float* panel, const float* dy, int64_t n0, int64_t samples, int64_t out) {
  for (int64_t p = 0; p < dy_panels_of(out); ++p) {
    const int64_t cols = std::min(kDyCols, out - p * kDyCols);
    for (int64_t n = 0; n < samples; ++n) {
      std::memcpy(panel + (p * kDwSamples + n) * kDyCols, dy + (n0 + n) * out + p * kDyCols,
                  sizeof(float) * cols);
    }
  }
}

// Rows j0 .. j1 of dw += x^T dy with the loops turned around: for each pass of kDwSamples
// samples, the pass's dy is copied into contiguous 64-column panels (rows of dy >= 1 KiB apart
// share few L1 sets), then each tile of KR rows of dw runs over every column panel while its x
// values stay in L1. Each dw float sums the samples in the order of linear_weight_grad_columns,
// so the result is the same bit for bit. `packed`: every pass's panels, packed once for all
// the calls of a split backward (pack_linear_dy_panels); nullptr: each pass is copied into a
// thread's own buffer here.
void linear_weight_grad_panels(float* dw, const float* dy, const float* x, int64_t batch,
                               int64_t in, int64_t out, int64_t j0, int64_t j1,
                               const float* packed) {
  constexpr int KR = simd::tile_rows<simd::kMaxVectors>();
  thread_local std::vector<float> own;
  if (packed == nullptr) own.resize(dy_pass_floats(out));
  for (int64_t n0 = 0; n0 < batch; n0 += kDwSamples) {
    const int64_t samples = std::min(kDwSamples, batch - n0);
    const float* panel;
    if (packed != nullptr) {
      panel = packed + n0 / kDwSamples * dy_pass_floats(out);
    } else {
      pack_dy_pass(own.data(), dy, n0, samples, out);
      panel = own.data();
    }
    for (int64_t j = j0; j < j1; j += KR) {
      const int64_t rows = std::min<int64_t>(KR, j1 - j);
      for_column_tiles(out, [&](auto nv, int64_t oc0) {
        constexpr int NV = decltype(nv)::value;
        simd::DwArgs g{dw + j * out + oc0, panel + (oc0 / kDyCols) * kDwSamples * kDyCols,
                       x + n0 * in + j, out, 1, samples, in, 0,
                       simd::tail_mask(out - oc0 - 16 * (NV - 1))};
        g.ldd = kDyCols;
        simd::dw_tile_n<KR, NV>(rows, g);
      });
    }
  }
}

// panel[k][c] = w[j0 + c][k0 + k] for k < run, c < cols (rows kCols floats apart).
void pack_dx_block(float* panel, int64_t kcols, const float* w, int64_t out, int64_t j0,
                   int64_t cols, int64_t k0, int64_t run) {
  const int64_t c16 = cols / 16 * 16, k16 = run / 16 * 16;
  for (int64_t c = 0; c < c16; c += 16) {
    for (int64_t k = 0; k < k16; k += 16) {
      simd::transpose16(panel + k * kcols + c, kcols, w + (j0 + c) * out + k0 + k, out);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t k = (c < c16 ? k16 : 0); k < run; ++k) {
      panel[k * kcols + c] = w[(j0 + c) * out + k0 + k];
    }
  }
}

// Where pack_linear_dx_panels puts the block of outputs k0 .. k0 + kLinearBlock of the column
// tile j0 .. j0 + kcols: each tile owns kcols x out floats from j0 x out on.
int64_t dx_block_offset(int64_t j0, int64_t kcols, int64_t out, int64_t k0) {
  return j0 * out + k0 * kcols;
}

// dx[:, j0 .. j0 + 16 NV] = dy w^T by the forward's tiles: each block of kLinearBlock outputs is
// transposed from w's rows j0 .. j0 + 16 NV into a contiguous panel, which the tiles read as the
// forward reads a packed w. Each dx float sums the outputs in order, whatever the batch.
// Measured in one process, alternating (GFLOP/s, against the dot products along w's rows used
// before for >= 256 outputs): Nature's 3136 <- 512 at 640 rows 66-70 -> 121-129, 256 rows 54 ->
// 112, 32 rows 67 -> 82, 16 rows 62 -> 58; the LSTM's 256 <- 1024 at 80 rows 78 -> 120; and
// against a whole transposed copy plus the forward (< 256 outputs, the same floats): MinAtar's
// 1600 <- 128 at 256 rows 89-94 -> 120-134, 64 <- 64 97-138 -> 94-131.
// `packed`: every block's panel, packed once for many calls (pack_linear_dx_panels: the parts
// of a backward split in many parts, which would each transpose the whole weight for their own
// rows, or an LSTM's steps); nullptr: each block is transposed into a thread's own buffer here.
template <int NV>
void linear_data_grad_columns(float* dx, const float* dy, const float* w, int64_t batch,
                              int64_t in, int64_t out, int64_t j0, const float* packed) {
  constexpr int R = simd::tile_rows<NV>();
  constexpr int64_t kCols = 16 * NV;
  thread_local std::vector<float> own;
  if (packed == nullptr) own.resize(kLinearBlock * kCols);
  const int64_t cols = std::min(kCols, in - j0);
  const float* a[R];
  simd::FwdArgs g{a, 1, 0, 0, nullptr, nullptr, kCols, nullptr,
                  simd::tail_mask(in - j0 - 16 * (NV - 1)), false};
  g.ldy = in;
  // Prefetched as the forward's packed panels (measured as above, data gradient, without ->
  // with: Nature's 3136 <- 512 at 640 rows 123-135 -> 145-147, the LSTM's 256 <- 1024 at 5120
  // rows 128-133 -> 144-146, MinAtar's 1600 <- 128 at 256 rows 117-145 -> 142-145).
  g.prefetch = true;
  for (int64_t k0 = 0; k0 < out; k0 += kLinearBlock) {
    g.run = std::min(kLinearBlock, out - k0);
    if (packed != nullptr) {
      g.w = packed + dx_block_offset(j0, kCols, out, k0);
    } else {
      pack_dx_block(own.data(), kCols, w, out, j0, cols, k0, g.run);
      g.w = own.data();
    }
    g.first = k0 == 0;
    g.final = k0 + g.run == out;
    fwd_row_tiles<R, NV>(g, a, dy + k0, out, batch, dx + j0, in);
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
  if (linear_avx512()) {
    linear_forward_all(y, x, w, b, batch, in, out, relu, false);
    return;
  }
#endif
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
}

void linear_forward_add(float* y, const float* x, const float* w, int64_t batch, int64_t in,
                        int64_t out) {
#if RLPAR_LINEAR_AVX512
  if (linear_avx512()) {
    linear_forward_all(y, x, w, nullptr, batch, in, out, false, true);
    return;
  }
#endif
  MatMap Y(y, batch, out);
  ConstMatMap X(x, batch, in);
  ConstMatMap W(w, in, out);
  if (batch <= kSmallBatch) {
    for (int64_t r = 0; r < batch; ++r) Y.row(r).noalias() += X.row(r) * W;  // GEMV, as above
  } else {
    Y.noalias() += X * W;
  }
}

void linear_weight_grad(float* dw, float* db, const float* dy, const float* x, int64_t batch,
                        int64_t in, int64_t out, int64_t part, int64_t parts,
                        const float* dy_panels) {
#if RLPAR_LINEAR_AVX512
  if (linear_avx512()) {
    int64_t j0, j1, o0, o1;
    split_range(in, parts, part, &j0, &j1);
    split_range(out, parts, part, &o0, &o1);
    if (j1 > j0 && out >= kPanelDyOut) {
      linear_weight_grad_panels(dw, dy, x, batch, in, out, j0, j1, dy_panels);
    } else if (j1 > j0) {
      for_column_tiles(out, [&](auto nv, int64_t oc0) {
        linear_weight_grad_columns<decltype(nv)::value>(dw, dy, x, batch, in, out, oc0, j0, j1);
      });
    }
    if (o1 > o0) add_column_sums(db + o0, dy + o0, batch, o1 - o0, out);
    return;
  }
#endif
  (void)parts;
  (void)dy_panels;
  if (part != 0) return;  // Eigen's GEMM computes the whole gradient in one part
  MatMap(dw, in, out).noalias() += ConstMatMap(x, batch, in).transpose() * ConstMatMap(dy, batch, out);
  add_column_sums(db, dy, batch, out, out);
}

void linear_data_grad(float* dx, const float* dy, const float* w, int64_t batch, int64_t in,
                      int64_t out, const float* w_panels) {
#if RLPAR_LINEAR_AVX512
  if (linear_avx512()) {
    for_column_tiles(in, [&](auto nv, int64_t j0) {
      linear_data_grad_columns<decltype(nv)::value>(dx, dy, w, batch, in, out, j0, w_panels);
    });
    return;
  }
#endif
  (void)w_panels;
  MatMap(dx, batch, in).noalias() =
      ConstMatMap(dy, batch, out) * ConstMatMap(w, in, out).transpose();
}

int64_t linear_dx_panel_floats(int64_t in, int64_t out) {
#if RLPAR_LINEAR_AVX512
  if (linear_avx512()) {
    return (in + 15) / 16 * 16 * out;  // each column tile's kCols x out floats (dx_block_offset)
  }
#endif
  (void)in;
  (void)out;
  return 0;
}

void pack_linear_dx_panels(float* panels, const float* w, int64_t in, int64_t out, int64_t part,
                           int64_t parts) {
#if RLPAR_LINEAR_AVX512
  if (linear_avx512()) {
    // The parts take contiguous runs of the column tiles (for_column_tiles' tiles of 64 columns).
    constexpr int64_t kTile = 16 * simd::kMaxVectors;
    int64_t t0, t1;
    split_range((in + kTile - 1) / kTile, parts, part, &t0, &t1);
    for (int64_t j0 = t0 * kTile; j0 < std::min(in, t1 * kTile); j0 += kTile) {
      const int64_t cols = std::min(kTile, in - j0), kcols = (cols + 15) / 16 * 16;
      for (int64_t k0 = 0; k0 < out; k0 += kLinearBlock) {
        pack_dx_block(panels + dx_block_offset(j0, kcols, out, k0), kcols, w, out, j0, cols, k0,
                      std::min(kLinearBlock, out - k0));
      }
    }
    return;
  }
#endif
  (void)panels, (void)w, (void)in, (void)out, (void)part, (void)parts;
}

int64_t linear_dy_panel_floats(int64_t batch, int64_t out) {
#if RLPAR_LINEAR_AVX512
  if (linear_avx512()) {
    if (out < kPanelDyOut) return 0;
    return (batch + kDwSamples - 1) / kDwSamples * dy_pass_floats(out);
  }
#endif
  (void)batch;
  (void)out;
  return 0;
}

void pack_linear_dy_panels(float* panels, const float* dy, int64_t batch, int64_t out,
                           int64_t part, int64_t parts) {
#if RLPAR_LINEAR_AVX512
  if (linear_avx512()) {
    if (out < kPanelDyOut) return;
    int64_t p0, p1;  // passes of kDwSamples samples
    split_range((batch + kDwSamples - 1) / kDwSamples, parts, part, &p0, &p1);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kDwSamples;
      pack_dy_pass(panels + p * dy_pass_floats(out), dy, n0, std::min(kDwSamples, batch - n0),
                   out);
    }
    return;
  }
#endif
  (void)panels, (void)dy, (void)batch, (void)out, (void)part, (void)parts;
}

namespace {

// sum[j] += x[r * stride + j] for j < W, r < rows, each column in row order. A compile-time W
// keeps the sums in registers.
template <int W>
void column_sums_fixed(float* sum, const float* x, int64_t rows, int64_t stride) {
  float s[W];
  for (int j = 0; j < W; ++j) s[j] = sum[j];
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * stride;
    for (int j = 0; j < W; ++j) s[j] += row[j];
  }
  for (int j = 0; j < W; ++j) sum[j] = s[j];
}

}  // namespace

void add_column_sums(float* acc, const float* x, int64_t rows, int64_t cols, int64_t stride) {
  // Blocks of 64, 32, 16 or 8 columns summed in registers (a plain loop reloaded acc on every
  // row, since it might alias x: 5 % of a MinAtar learner step), the rest column by column.
  // Every column sums its rows in order, as before.
  int64_t j = 0;
  for (; j + 64 <= cols; j += 64) column_sums_fixed<64>(acc + j, x + j, rows, stride);
  if (j + 32 <= cols) column_sums_fixed<32>(acc + j, x + j, rows, stride), j += 32;
  if (j + 16 <= cols) column_sums_fixed<16>(acc + j, x + j, rows, stride), j += 16;
  if (j + 8 <= cols) column_sums_fixed<8>(acc + j, x + j, rows, stride), j += 8;
  for (; j < cols; ++j) {
    float s = acc[j];
    for (int64_t r = 0; r < rows; ++r) s += x[r * stride + j];
    acc[j] = s;
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

namespace {
// fn(b, o, y0, y1, x0, x1) for output pixel o (of all B OH OW) of sample b and the input rows
// [y0, y1) and columns [x0, x1) its window covers, padding left out.
template <typename Fn>
void each_window(const ConvShape& s, int64_t batch, Fn fn) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      const int64_t y0 = std::max<int64_t>(0, oy * s.stride - s.pad);
      const int64_t y1 = std::min(s.h, oy * s.stride - s.pad + s.k);
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        const int64_t x0 = std::max<int64_t>(0, ox * s.stride - s.pad);
        const int64_t x1 = std::min(s.w, ox * s.stride - s.pad + s.k);
        fn(b, (b * s.oh + oy) * s.ow + ox, y0, y1, x0, x1);
      }
    }
  }
}

// A later value replaces the maximum only when strictly greater, or when it is the first NaN
// (torch's rule): the first maximum in the scan wins ties.
inline bool beats(float v, float m) { return v > m || (std::isnan(v) && !std::isnan(m)); }
}  // namespace

void maxpool2d_forward(float* y, const float* x, int64_t batch, const ConvShape& s) {
  each_window(s, batch, [&](int64_t b, int64_t o, int64_t y0, int64_t y1, int64_t x0, int64_t x1) {
    const float* xb = x + b * s.h * s.w * s.c;
    float* out = y + o * s.c;
    for (int64_t ch = 0; ch < s.c; ++ch) out[ch] = -std::numeric_limits<float>::infinity();
    // Channels innermost (contiguous); per channel the window is scanned row-major.
    for (int64_t iy = y0; iy < y1; ++iy) {
      for (int64_t ix = x0; ix < x1; ++ix) {
        const float* in = xb + (iy * s.w + ix) * s.c;
        for (int64_t ch = 0; ch < s.c; ++ch) {
          if (beats(in[ch], out[ch])) out[ch] = in[ch];
        }
      }
    }
  });
}

void maxpool2d_backward(float* dx, const float* dy, const float* x, int64_t batch,
                        const ConvShape& s) {
  std::memset(dx, 0, sizeof(float) * batch * s.h * s.w * s.c);
  constexpr int64_t kBlock = 64;  // channels whose maxima are tracked at once, innermost
  each_window(s, batch, [&](int64_t b, int64_t o, int64_t y0, int64_t y1, int64_t x0, int64_t x1) {
    const float* xb = x + b * s.h * s.w * s.c;
    float* dxb = dx + b * s.h * s.w * s.c;
    const float* g = dy + o * s.c;
    for (int64_t c0 = 0; c0 < s.c; c0 += kBlock) {
      const int64_t n = std::min(kBlock, s.c - c0);
      // The forward's scan, so each argmax is the input the forward returned.
      float m[kBlock];
      int64_t arg[kBlock];
      const int64_t first = (y0 * s.w + x0) * s.c + c0;
      for (int64_t ch = 0; ch < n; ++ch) m[ch] = xb[first + ch], arg[ch] = first + ch;
      for (int64_t iy = y0; iy < y1; ++iy) {
        for (int64_t ix = x0; ix < x1; ++ix) {
          const int64_t at = (iy * s.w + ix) * s.c + c0;
          for (int64_t ch = 0; ch < n; ++ch) {
            if (beats(xb[at + ch], m[ch])) m[ch] = xb[at + ch], arg[ch] = at + ch;
          }
        }
      }
      for (int64_t ch = 0; ch < n; ++ch) dxb[arg[ch]] += g[c0 + ch];
    }
  });
}

namespace {
// Mean and 1 / sqrt(var + eps) of one row, in double (the same floats in forward and backward).
void row_stats(const float* x, int64_t d, float* mean, float* rstd) {
  double sum = 0;
  for (int64_t j = 0; j < d; ++j) sum += x[j];
  const double mu = sum / static_cast<double>(d);
  double sq = 0;
  for (int64_t j = 0; j < d; ++j) sq += (x[j] - mu) * (x[j] - mu);
  *mean = static_cast<float>(mu);
  *rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(d) + kLayerNormEps));
}
}  // namespace

void layernorm_stats(float* stats, const float* x, int64_t n, int64_t d) {
  for (int64_t r = 0; r < n; ++r) row_stats(x + r * d, d, stats + 2 * r, stats + 2 * r + 1);
}

void layernorm_forward(float* y, const float* x, const float* gain, const float* bias, int64_t n,
                       int64_t d) {
  for (int64_t r = 0; r < n; ++r) {
    float mean, rstd;
    row_stats(x + r * d, d, &mean, &rstd);
    const float* xr = x + r * d;
    float* yr = y + r * d;
    for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - mean) * rstd * gain[j] + bias[j];
  }
}

void layernorm_weight_grad(float* dgain, float* dbias, const float* dy, const float* x,
                           const float* stats, int64_t n, int64_t d, int64_t part, int64_t parts) {
  int64_t c0, c1;
  split_range(d, parts, part, &c0, &c1);
  for (int64_t r = 0; r < n; ++r) {
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    const float* xr = x + r * d;
    const float* gr = dy + r * d;
    for (int64_t j = c0; j < c1; ++j) {
      dgain[j] += gr[j] * ((xr[j] - mean) * rstd);
      dbias[j] += gr[j];
    }
  }
}

void layernorm_data_grad(float* dx, const float* dy, const float* x, const float* gain,
                         const float* stats, int64_t n, int64_t d) {
  // dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat)), xhat = (x - mean) rstd.
  for (int64_t r = 0; r < n; ++r) {
    const float mean = stats[2 * r], rstd = stats[2 * r + 1];
    const float* xr = x + r * d;
    const float* gr = dy + r * d;
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double g = static_cast<double>(gr[j]) * gain[j];
      s1 += g;
      s2 += g * ((xr[j] - mean) * rstd);
    }
    const auto m1 = static_cast<float>(s1 / static_cast<double>(d));
    const auto m2 = static_cast<float>(s2 / static_cast<double>(d));
    float* dr = dx + r * d;
    for (int64_t j = 0; j < d; ++j) {
      const float xhat = (xr[j] - mean) * rstd;
      dr[j] = rstd * (gr[j] * gain[j] - m1 - xhat * m2);
    }
  }
}

void add_forward(float* y, const float* x, const float* skip, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + skip[i];
}

void copy_columns(float* y, const float* x, int64_t rows, int64_t cols, int64_t stride,
                  int64_t off) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(y + r * cols, x + r * stride + off, sizeof(float) * cols);
  }
}

void put_columns(float* x, const float* y, int64_t rows, int64_t cols, int64_t stride,
                 int64_t off) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(x + r * stride + off, y + r * cols, sizeof(float) * cols);
  }
}

void embedding_forward(float* y, const float* x, const float* w, int64_t rows, int64_t k,
                       int64_t num, int64_t dim, int64_t first_row, const char* where) {
  for (int64_t i = 0; i < rows * k; ++i) {
    const float v = x[i];
    if (v >= 0.0f && v < static_cast<float>(num) && v == std::floor(v)) continue;
    std::ostringstream o;
    o << where << ": index " << v << " at row " << first_row + i / k << ", column " << i % k
      << " is not an integer in [0, " << num << ")";
    if (std::isfinite(v) && v == std::floor(v)) throw std::out_of_range(o.str());
    throw std::invalid_argument(o.str());
  }
  for (int64_t i = 0; i < rows * k; ++i) {
    std::memcpy(y + i * dim, w + static_cast<int64_t>(x[i]) * dim, sizeof(float) * dim);
  }
}

void embedding_weight_grad(float* dw, const float* dy, const float* x, int64_t rows, int64_t k,
                           int64_t num, int64_t dim, int64_t part, int64_t parts) {
  int64_t lo, hi;
  split_range(num, parts, part, &lo, &hi);
  for (int64_t i = 0; i < rows * k; ++i) {
    const auto e = static_cast<int64_t>(x[i]);
    if (e < lo || e >= hi) continue;
    float* row = dw + e * dim;
    const float* d = dy + i * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += d[j];
  }
}

}  // namespace rlpar::layers
