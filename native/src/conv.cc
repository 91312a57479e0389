// Conv2d forward/backward, channels last. Two paths behind one interface (rlpar/layers.h),
// chosen once per call by rlpar::active_isa() (rlpar/isa.h: the build, the CPU, RLPAR_MAX_ISA):
//
// - SIMD (conv_simd.h, on AVX-512, avx512_kernels.h, or on AVX2 + FMA, avx2_kernels.h: the same
//   kernels on 16-float or 8-float vectors; an AVX-512 build compiles both): implicit GEMM, no
//   im2col matrix.
//   For channels-last data and one kernel row `ky`, the patch of an output position is one
//   contiguous run of K*C floats of the input, so each micro-kernel reads the input in place:
//     forward  y[p, oc]    = sum_{ky, j} x[p @ ky, j] * w[ky, j, oc]   (R positions x NV vectors)
//     weights  dw[ky,j,oc] += sum_p x[p @ ky, j] * dy[p, oc]          (KR patch rows x NV vectors)
//     data     dx[p @ ky, j] += sum_oc dy[p, oc] * w[ky, j, oc]        (R positions x NV vectors)
//   with the accumulators in registers. Bias and ReLU are applied in the forward's epilogue.
//   A padded conv works on a zero-padded copy of one sample at a time.
// - Portable: im2col + one Eigen GEMM per chunk of samples (builds without AVX2 + FMA, and
//   RLPAR_MAX_ISA=none).
//
// Summation order is fixed by the shapes alone (never by alignment or thread), so results are
// bit-identical from call to call and from thread to thread.
#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "eigen_maps.h"
#include "rlpar/isa.h"
#include "rlpar/layers.h"

#if defined(__AVX2__) && defined(__FMA__)
#define RLPAR_CONV_AVX2 1
#endif

namespace rlpar::layers {
namespace {

int64_t sample_size(const ConvShape& s) { return s.h * s.w * s.c; }

// ---------------------------------------------------------------------------------------------
// Portable path: im2col + Eigen GEMM.

// im2col scratch per call is capped near this many floats; larger batches run in chunks.
constexpr int64_t kColBudgetFloats = 1 << 18;

int64_t col_chunk(const ConvShape& s, int64_t batch) {
  const int64_t per = s.positions() * s.patch();
  return std::clamp<int64_t>(kColBudgetFloats / per, 1, std::max<int64_t>(batch, 1));
}

// Rows of `col` are output positions (sample, oy, ox); columns are (ky, kx, c): one GEMM with the
// [K*K*C, OC] weight gives channels-last output directly.
void im2col(float* col, const float* x, int64_t samples, const ConvShape& s) {
  const int64_t patch = s.patch();
  const int64_t run = s.c * sizeof(float);
  for (int64_t n = 0; n < samples; ++n) {
    const float* xn = x + n * sample_size(s);
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        float* row = col + ((n * s.oh + oy) * s.ow + ox) * patch;
        for (int64_t ky = 0; ky < s.k; ++ky) {
          const int64_t iy = oy * s.stride - s.pad + ky;
          for (int64_t kx = 0; kx < s.k; ++kx) {
            const int64_t ix = ox * s.stride - s.pad + kx;
            float* dst = row + (ky * s.k + kx) * s.c;
            if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) {
              std::memset(dst, 0, run);
            } else {
              std::memcpy(dst, xn + (iy * s.w + ix) * s.c, run);
            }
          }
        }
      }
    }
  }
}

// Adds every patch row back onto the input positions it came from (transpose of im2col).
void col2im_add(float* dx, const float* col, int64_t samples, const ConvShape& s) {
  const int64_t patch = s.patch();
  for (int64_t n = 0; n < samples; ++n) {
    float* dxn = dx + n * sample_size(s);
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        const float* row = col + ((n * s.oh + oy) * s.ow + ox) * patch;
        for (int64_t ky = 0; ky < s.k; ++ky) {
          const int64_t iy = oy * s.stride - s.pad + ky;
          if (iy < 0 || iy >= s.h) continue;
          for (int64_t kx = 0; kx < s.k; ++kx) {
            const int64_t ix = ox * s.stride - s.pad + kx;
            if (ix < 0 || ix >= s.w) continue;
            float* dst = dxn + (iy * s.w + ix) * s.c;
            const float* src = row + (ky * s.k + kx) * s.c;
            for (int64_t c = 0; c < s.c; ++c) dst[c] += src[c];
          }
        }
      }
    }
  }
}

void gemm_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                  const ConvShape& s, bool relu, float* col) {
  const int64_t patch = s.patch(), pos = s.positions(), chunk = col_chunk(s, batch);
  ConstMatMap W(w, patch, s.oc);
  ConstRowVec B(b, s.oc);
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t m = std::min(chunk, batch - n0);
    im2col(col, x + n0 * sample_size(s), m, s);
    MatMap Y(y + n0 * pos * s.oc, m * pos, s.oc);
    Y.noalias() = ConstMatMap(col, m * pos, patch) * W;
    Y.rowwise() += B;
    if (relu) Y = Y.cwiseMax(0.0f);
  }
}

// dw += the weight gradient (dx == nullptr), or dx = the data gradient (dw == nullptr).
void gemm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                   int64_t batch, const ConvShape& s, float* col) {
  const int64_t patch = s.patch(), pos = s.positions(), chunk = col_chunk(s, batch);
  if (dx != nullptr) std::memset(dx, 0, sizeof(float) * batch * sample_size(s));
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t m = std::min(chunk, batch - n0);
    ConstMatMap DY(dy + n0 * pos * s.oc, m * pos, s.oc);
    if (dw != nullptr) {
      im2col(col, x + n0 * sample_size(s), m, s);
      MatMap(dw, patch, s.oc).noalias() += ConstMatMap(col, m * pos, patch).transpose() * DY;
    }
    if (dx != nullptr) {
      ConstMatMap W(w, patch, s.oc);
      MatMap(col, m * pos, patch).noalias() = DY * W.transpose();
      col2im_add(dx + n0 * sample_size(s), col, m, s);
    }
  }
}


}  // namespace
}  // namespace rlpar::layers

// The SIMD path once per kernel set this build compiles (conv_simd.h).
#if defined(__AVX512F__)
#include "avx512_kernels.h"
#define RLPAR_SIMD_NS avx512
#include "conv_simd.h"
#undef RLPAR_SIMD_NS
#endif
#if RLPAR_CONV_AVX2
#include "avx2_kernels.h"
#define RLPAR_SIMD_NS avx2
#include "conv_simd.h"
#undef RLPAR_SIMD_NS
#endif

namespace rlpar::layers {

const char* conv2d_simd_kernels() {
  const Isa isa = active_isa();
  return isa == Isa::None ? "" : isa_name(isa);
}

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  if (stride <= 0) return 0;
  const int64_t span = in + 2 * pad - k;
  if (span < 0) return 0;
  return span / stride + 1;
}

// Each function below switches on active_isa() once per call; active_isa() never exceeds what
// the build compiled, so the cases a build lacks are never taken.

int64_t conv2d_scratch_floats(const ConvShape& s, int64_t batch, bool backward) {
  switch (active_isa()) {
#if defined(__AVX512F__)
    case Isa::Avx512:
      return avx512::conv_scratch_floats(s, backward);
#endif
#if RLPAR_CONV_AVX2
    case Isa::Avx2:
      return avx2::conv_scratch_floats(s, backward);
#endif
    default:
      (void)backward;  // im2col's scratch is the same both ways
      return col_chunk(s, batch) * s.positions() * s.patch();
  }
}

void conv2d_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                    const ConvShape& s, bool relu, float* scratch) {
  switch (active_isa()) {
#if defined(__AVX512F__)
    case Isa::Avx512:
      return avx512::conv_forward(y, x, w, b, batch, s, relu, scratch);
#endif
#if RLPAR_CONV_AVX2
    case Isa::Avx2:
      return avx2::conv_forward(y, x, w, b, batch, s, relu, scratch);
#endif
    default:
      return gemm_forward(y, x, w, b, batch, s, relu, scratch);
  }
}

void conv2d_weight_grad(float* dw, float* db, const float* dy, const float* x, int64_t batch,
                        const ConvShape& s, int64_t part, int64_t parts, float* scratch) {
  switch (active_isa()) {
#if defined(__AVX512F__)
    case Isa::Avx512:
      return avx512::conv_weight_grad(dw, db, dy, x, batch, s, part, parts, scratch);
#endif
#if RLPAR_CONV_AVX2
    case Isa::Avx2:
      return avx2::conv_weight_grad(dw, db, dy, x, batch, s, part, parts, scratch);
#endif
    default:
      (void)parts;
      if (part != 0) return;  // the GEMM path computes the whole gradient in one part
      add_column_sums(db, dy, batch * s.positions(), s.oc, s.oc);
      return gemm_backward(nullptr, dw, dy, x, nullptr, batch, s, scratch);
  }
}

void conv2d_data_grad(float* dx, const float* dy, const float* w, int64_t batch,
                      const ConvShape& s, float* scratch) {
  switch (active_isa()) {
#if defined(__AVX512F__)
    case Isa::Avx512:
      return avx512::conv_data_grad(dx, dy, w, batch, s, scratch);
#endif
#if RLPAR_CONV_AVX2
    case Isa::Avx2:
      return avx2::conv_data_grad(dx, dy, w, batch, s, scratch);
#endif
    default:
      return gemm_backward(dx, nullptr, dy, nullptr, w, batch, s, scratch);
  }
}

}  // namespace rlpar::layers
