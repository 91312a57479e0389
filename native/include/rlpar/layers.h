// rlpar/layers.h — forward/backward kernels over raw pointers (row-major, batch first).
//
// A parametrised layer's backward is two calls: *_weight_grad *adds* parameter gradients into
// dw/db (the caller zeroes the flat gradient once), *_data_grad *writes* the input gradient dx
// (skipped when it is not needed, e.g. for the first layer, whose input is data).
#pragma once

#include <cstdint>

namespace rlpar::layers {

// [begin, end) of part `i` when `n` items are split into `parts` contiguous parts whose sizes
// differ by at most one (the split of the *_weight_grad calls, and of the net's batch rows).
inline void split_range(int64_t n, int64_t parts, int64_t i, int64_t* begin, int64_t* end) {
  *begin = n * i / parts;
  *end = n * (i + 1) / parts;
}

// x: [B, in], w: [in, out], b: [out] -> y: [B, out], then max(y, 0) if `relu`.
void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                    int64_t in, int64_t out, bool relu);
// y: [B, out] += x: [B, in] w: [in, out] (no bias). With the AVX-512 kernels each row's sums run
// in a fixed order of the inputs whatever the batch (a row gives the same floats in a batch of 1
// or of 1000), as in linear_forward.
void linear_forward_add(float* y, const float* x, const float* w, int64_t batch, int64_t in,
                        int64_t out);
// The backward of dy: [B, out] is linear_weight_grad (all parts) and linear_data_grad.
// Part `part` of `parts` of dw += x^T dy and db += sum_b dy: a contiguous slice of dw's rows and
// of db, summing the samples in order (the parts together give the floats of the whole; the
// Eigen path computes everything in part 0). `dy_panels`: dy as pack_linear_dy_panels laid it
// out, or nullptr (each call then copies the panels it needs itself).
void linear_weight_grad(float* dw, float* db, const float* dy, const float* x, int64_t batch,
                        int64_t in, int64_t out, int64_t part, int64_t parts,
                        const float* dy_panels = nullptr);
// dx: [B, in] = dy w^T (rows independent; with the AVX-512 kernels each row's sums run over the
// outputs in order, whatever the batch). `w_panels`: w as pack_linear_dx_panels laid it out, or
// nullptr (the call then transposes w itself, block by block). Same floats either way.
void linear_data_grad(float* dx, const float* dy, const float* w, int64_t batch, int64_t in,
                      int64_t out, const float* w_panels = nullptr);

// Packing shared by many backward calls: the parts of a split backward, each of which would
// otherwise copy the whole weight (or dy) for its own rows, or an LSTM's steps, which all read
// one recurrent weight. The sizes are 0 where the kernels read no panels (builds without
// AVX-512; dy of fewer than 256 columns), and the packs then do nothing. Part `part` of
// `parts` packs its own slice, so the parts may run at once.
int64_t linear_dx_panel_floats(int64_t in, int64_t out);
void pack_linear_dx_panels(float* panels, const float* w, int64_t in, int64_t out, int64_t part,
                           int64_t parts);
int64_t linear_dy_panel_floats(int64_t batch, int64_t out);
void pack_linear_dy_panels(float* panels, const float* dy, int64_t batch, int64_t out,
                           int64_t part, int64_t parts);

struct ConvShape {
  int64_t h, w, c;        // input, channels last
  int64_t oh, ow, oc;     // output, channels last
  int64_t k, stride, pad;
  int64_t patch() const { return k * k * c; }     // columns of the im2col matrix
  int64_t positions() const { return oh * ow; }   // rows per sample
};

// Output spatial size, or <= 0 when the kernel does not fit.
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad);

// Floats of scratch that conv2d_forward (backward = false) or the backward calls need for
// `batch` samples (may be 0).
int64_t conv2d_scratch_floats(const ConvShape& s, int64_t batch, bool backward);
// Which micro-kernels the conv layer runs (rlpar::active_isa(), rlpar/isa.h): "avx512" (Linear
// and the LSTM cell run AVX-512 kernels too), "avx2" (AVX2 + FMA: a build without AVX-512, or
// RLPAR_MAX_ISA=avx2; Linear stays on Eigen), or "" for the portable im2col + Eigen GEMM path.
const char* conv2d_simd_kernels();

// x: [B, H, W, C], w: [K, K, C, OC], b: [OC] -> y: [B, OH, OW, OC], then max(y, 0) if `relu`.
void conv2d_forward(float* y, const float* x, const float* w, const float* b, int64_t batch,
                    const ConvShape& s, bool relu, float* scratch);
// The backward of dy: [B, OH, OW, OC] is conv2d_weight_grad (all parts) and conv2d_data_grad.
// Part `part` of `parts` of dw += ... and db += ... over all `batch` samples: a contiguous slice
// of the weight's patch rows and of the bias. With the AVX-512 kernels every weight sums the
// samples and positions in order, so the parts together give the floats of the whole (the GEMM
// path computes everything in part 0). Parts touch disjoint memory and may run at once, each
// with its own scratch.
void conv2d_weight_grad(float* dw, float* db, const float* dy, const float* x, int64_t batch,
                        const ConvShape& s, int64_t part, int64_t parts, float* scratch);
// dx: [B, H, W, C] = the data gradient of `batch` samples (samples independent: any split by
// samples gives the same floats).
void conv2d_data_grad(float* dx, const float* dy, const float* w, int64_t batch,
                      const ConvShape& s, float* scratch);

// acc[j] += sum_r x[r * stride + j] for j < cols, summing rows in order. Written out instead of
// Eigen's colwise().sum(), whose summation order depends on the alignment of `acc` (a caller's
// buffer), which would break bit-identical gradients across calls and threads.
void add_column_sums(float* acc, const float* x, int64_t rows, int64_t cols, int64_t stride);

// In-place safe: y may equal x.
void relu_forward(float* y, const float* x, int64_t n);
// dx = dy * (y > 0); dx may equal dy.
void relu_backward(float* dx, const float* dy, const float* y, int64_t n);
void tanh_forward(float* y, const float* x, int64_t n);
// dx = dy * (1 - y^2); dx may equal dy.
void tanh_backward(float* dx, const float* dy, const float* y, int64_t n);

// Max pooling, channels last: x [B, H, W, C] -> y [B, OH, OW, C] (s.oc == s.c), each output
// the largest input of its k x k window; padded positions count as -inf (they never win), as in
// torch.nn.MaxPool2d. A NaN in a window wins (the first one), as in torch.
void maxpool2d_forward(float* y, const float* x, int64_t batch, const ConvShape& s);
// dx [B, H, W, C] = 0, then each dy is added at its window's argmax: the first input (row-major
// over the window) equal to the maximum, the index torch's CPU kernel picks on ties.
void maxpool2d_backward(float* dx, const float* dy, const float* x, int64_t batch,
                        const ConvShape& s);

// Layer normalization over the last dimension: x [N, D] (N rows: every position of the batch),
// y = (x - mean) / sqrt(var + eps) * gain + bias, mean and (biased) var over each row's D values.
constexpr float kLayerNormEps = 1e-5f;
void layernorm_forward(float* y, const float* x, const float* gain, const float* bias, int64_t n,
                       int64_t d);
// stats [N, 2] = (mean, 1 / sqrt(var + eps)) of each row, as layernorm_forward computes them.
void layernorm_stats(float* stats, const float* x, int64_t n, int64_t d);
// Part `part` of `parts` of dgain += sum_rows dy * xhat and dbias += sum_rows dy: a contiguous
// slice of the D columns over all N rows, summed in row order (any split gives the same floats).
void layernorm_weight_grad(float* dgain, float* dbias, const float* dy, const float* x,
                           const float* stats, int64_t n, int64_t d, int64_t part, int64_t parts);
// dx [N, D] of dy [N, D] (rows independent; dx may not alias dy).
void layernorm_data_grad(float* dx, const float* dy, const float* x, const float* gain,
                         const float* stats, int64_t n, int64_t d);

// y = x + skip, elementwise (y may equal x).
void add_forward(float* y, const float* x, const float* skip, int64_t n);

// copy_columns: columns [off, off + cols) of each row of x [rows, stride] -> y [rows, cols];
// put_columns: y [rows, cols] -> those columns of x. A Concat's slices and its join.
void copy_columns(float* y, const float* x, int64_t rows, int64_t cols, int64_t stride,
                  int64_t off);
void put_columns(float* x, const float* y, int64_t rows, int64_t cols, int64_t stride,
                 int64_t off);

// Embedding: x [rows, k] holds indices into the table w [num, dim]; y [rows, k dim] gets row
// x[r, j] of w at columns [j dim, (j + 1) dim). Checks every index first: one that is not an
// integer in [0, num) throws (std::out_of_range when an integer out of range, else
// std::invalid_argument) naming `where`, the value, its row (first_row + r) and its column.
void embedding_forward(float* y, const float* x, const float* w, int64_t rows, int64_t k,
                       int64_t num, int64_t dim, int64_t first_row, const char* where);
// dw[i] += the dy vectors of every index equal to i, over all rows in row order (indices
// checked by the forward). Part p of `parts` does the table rows [split_range(num)], so the
// split sums in the order of the whole call.
void embedding_weight_grad(float* dw, const float* dy, const float* x, int64_t rows, int64_t k,
                           int64_t num, int64_t dim, int64_t part, int64_t parts);

}  // namespace rlpar::layers
