#include "rlpar/layers.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

namespace rlpar::layers {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstRowVec = Eigen::Map<const Eigen::RowVectorXf>;
using ArrMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrMap = Eigen::Map<const Eigen::ArrayXf>;

// Rows of `col` are output positions (sample, oy, ox); columns are (ky, kx, c): one GEMM with the
// [K*K*C, OC] weight gives channels-last output directly.
void im2col(float* col, const float* x, int64_t samples, const ConvShape& s) {
  const int64_t patch = s.patch();
  const int64_t run = s.c * sizeof(float);
  for (int64_t n = 0; n < samples; ++n) {
    const float* xn = x + n * s.h * s.w * s.c;
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
    float* dxn = dx + n * s.h * s.w * s.c;
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

// Below this many rows, row-by-row GEMV beats the blocked GEMM (measured: batch 2-8
// took 0.7-1.1 us through GEMM against 0.25 us at batch 1, which Eigen routes to GEMV).
constexpr int64_t kSmallBatch = 8;

}  // namespace

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                    int64_t in, int64_t out) {
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
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t batch, int64_t in, int64_t out) {
  ConstMatMap DY(dy, batch, out);
  ConstMatMap X(x, batch, in);
  MatMap DW(dw, in, out);
  DW.noalias() += X.transpose() * DY;
  add_column_sums(db, dy, batch, out, out);
  if (dx != nullptr) {
    MatMap DX(dx, batch, in);
    DX.noalias() = DY * ConstMatMap(w, in, out).transpose();
  }
}

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  if (stride <= 0) return 0;
  const int64_t span = in + 2 * pad - k;
  if (span < 0) return 0;
  return span / stride + 1;
}

void conv2d_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                    const ConvShape& s, float* col, int64_t chunk) {
  const int64_t patch = s.patch(), pos = s.positions();
  ConstMatMap W(w, patch, s.oc);
  ConstRowVec B(b, s.oc);
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t m = std::min(chunk, batch - n0);
    im2col(col, x + n0 * s.h * s.w * s.c, m, s);
    MatMap Y(y + n0 * pos * s.oc, m * pos, s.oc);
    Y.noalias() = ConstMatMap(col, m * pos, patch) * W;
    Y.rowwise() += B;
  }
}

void conv2d_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t batch, const ConvShape& s, float* col, int64_t chunk) {
  const int64_t patch = s.patch(), pos = s.positions();
  MatMap DW(dw, patch, s.oc);
  ConstMatMap W(w, patch, s.oc);
  if (dx != nullptr) std::memset(dx, 0, sizeof(float) * batch * s.h * s.w * s.c);
  for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
    const int64_t m = std::min(chunk, batch - n0);
    ConstMatMap DY(dy + n0 * pos * s.oc, m * pos, s.oc);
    im2col(col, x + n0 * s.h * s.w * s.c, m, s);
    DW.noalias() += ConstMatMap(col, m * pos, patch).transpose() * DY;
    add_column_sums(db, dy + n0 * pos * s.oc, m * pos, s.oc, s.oc);
    if (dx != nullptr) {
      MatMap(col, m * pos, patch).noalias() = DY * W.transpose();
      col2im_add(dx + n0 * s.h * s.w * s.c, col, m, s);
    }
  }
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
