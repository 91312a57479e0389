#include "rlpar/lstm.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <iterator>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "eigen_maps.h"
#include "rlpar/amx.h"
#include "rlpar/layers.h"

namespace rlpar::lstm {
namespace {

// Zeroes row n of an [N, width] block wherever resets[n] is set.
void zero_reset_rows(float* block, const uint8_t* resets, int64_t n_rows, int64_t width) {
  if (resets == nullptr) return;
  for (int64_t n = 0; n < n_rows; ++n) {
    if (resets[n]) std::memset(block + n * width, 0, sizeof(float) * width);
  }
}

// Copies h and c of an [N, 2H] state into [N, H] blocks (zeros for a null state).
void split_state(const float* state, int64_t n_rows, int64_t h, float* h_out, float* c_out) {
  if (state == nullptr) {
    std::memset(h_out, 0, sizeof(float) * n_rows * h);
    std::memset(c_out, 0, sizeof(float) * n_rows * h);
    return;
  }
  for (int64_t n = 0; n < n_rows; ++n) {
    std::memcpy(h_out + n * h, state + n * 2 * h, sizeof(float) * h);
    std::memcpy(c_out + n * h, state + n * 2 * h + h, sizeof(float) * h);
  }
}

#if defined(__AVX512F__)
// The gates and the cell of one step, one pass over each row (the portable versions below make
// seven), with Eigen's own vectorized logistic and tanh. Each row's floats depend on that row
// alone, whatever N.
using Packet = Eigen::internal::Packet16f;

inline Packet logistic(Packet x) { return Eigen::internal::scalar_logistic_op<float>().packetOp(x); }
inline Packet tanh16(Packet x) { return Eigen::internal::ptanh(x); }

// a: [N, 4H] pre-activations -> activated gates (in place); c = f * cp + i * g; tc = tanh(c);
// h = o * tc.
void cell_forward(float* a, const float* cp, float* c, float* tc, float* h, int64_t n_rows,
                  int64_t hidden) {
  const int64_t H = hidden;
  for (int64_t n = 0; n < n_rows; ++n) {
    float* an = a + n * 4 * H;
    const int64_t off = n * H;
    for (int64_t j = 0; j < H; j += 16) {
      const __mmask16 m = H - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (H - j)) - 1);
      const Packet i = logistic(_mm512_maskz_loadu_ps(m, an + j));
      const Packet f = logistic(_mm512_maskz_loadu_ps(m, an + H + j));
      const Packet g = tanh16(_mm512_maskz_loadu_ps(m, an + 2 * H + j));
      const Packet o = logistic(_mm512_maskz_loadu_ps(m, an + 3 * H + j));
      _mm512_mask_storeu_ps(an + j, m, i);
      _mm512_mask_storeu_ps(an + H + j, m, f);
      _mm512_mask_storeu_ps(an + 2 * H + j, m, g);
      _mm512_mask_storeu_ps(an + 3 * H + j, m, o);
      const Packet cv =
          _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(m, cp + off + j), _mm512_mul_ps(i, g));
      const Packet t = tanh16(cv);
      _mm512_mask_storeu_ps(c + off + j, m, cv);
      _mm512_mask_storeu_ps(tc + off + j, m, t);
      _mm512_mask_storeu_ps(h + off + j, m, _mm512_mul_ps(o, t));
    }
  }
}

// One step of backward through the cell, one pass over each row: dc += dh * o * (1 - tc^2)
// (dh plus the recurrent dh_in, when not null); the gates' gradients into da; then dc *= f
// (what flows into step t - 1).
void cell_backward(const float* a, const float* cp, const float* tc, const float* dh,
                   const float* dh_in, float* dc, float* da, int64_t n_rows, int64_t hidden) {
  const int64_t H = hidden;
  const Packet one = _mm512_set1_ps(1.0f);
  for (int64_t n = 0; n < n_rows; ++n) {
    const float* an = a + n * 4 * H;
    float* dan = da + n * 4 * H;
    const int64_t off = n * H;
    for (int64_t j = 0; j < H; j += 16) {
      const __mmask16 m = H - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (H - j)) - 1);
      const Packet i = _mm512_maskz_loadu_ps(m, an + j);
      const Packet f = _mm512_maskz_loadu_ps(m, an + H + j);
      const Packet g = _mm512_maskz_loadu_ps(m, an + 2 * H + j);
      const Packet o = _mm512_maskz_loadu_ps(m, an + 3 * H + j);
      const Packet t = _mm512_maskz_loadu_ps(m, tc + off + j);
      Packet dht = _mm512_maskz_loadu_ps(m, dh + off + j);
      if (dh_in != nullptr) dht = _mm512_add_ps(dht, _mm512_maskz_loadu_ps(m, dh_in + off + j));
      Packet dct = _mm512_maskz_loadu_ps(m, dc + off + j);
      dct = _mm512_fmadd_ps(_mm512_mul_ps(dht, o), _mm512_fnmadd_ps(t, t, one), dct);
      const Packet di = _mm512_mul_ps(_mm512_mul_ps(dct, g), _mm512_mul_ps(i, _mm512_sub_ps(one, i)));
      const Packet df = _mm512_mul_ps(_mm512_mul_ps(dct, _mm512_maskz_loadu_ps(m, cp + off + j)),
                                      _mm512_mul_ps(f, _mm512_sub_ps(one, f)));
      const Packet dg = _mm512_mul_ps(_mm512_mul_ps(dct, i), _mm512_fnmadd_ps(g, g, one));
      const Packet dout = _mm512_mul_ps(_mm512_mul_ps(dht, t), _mm512_mul_ps(o, _mm512_sub_ps(one, o)));
      _mm512_mask_storeu_ps(dan + j, m, di);
      _mm512_mask_storeu_ps(dan + H + j, m, df);
      _mm512_mask_storeu_ps(dan + 2 * H + j, m, dg);
      _mm512_mask_storeu_ps(dan + 3 * H + j, m, dout);
      _mm512_mask_storeu_ps(dc + off + j, m, _mm512_mul_ps(dct, f));
    }
  }
}
#else
// The same two functions on Eigen's array expressions (builds without AVX-512).
using Strided = Eigen::Map<Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                           Eigen::OuterStride<>>;
using Arr = Eigen::Map<Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using ConstArr =
    Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// Gate k (0 = i, 1 = f, 2 = g, 3 = o) of `rows` rows of a [rows, 4H] block.
Strided gate(float* block, int64_t rows, int64_t h, int k) {
  return Strided(block + k * h, rows, h, Eigen::OuterStride<>(4 * h));
}

void cell_forward(float* a, const float* cp, float* c, float* tc, float* h, int64_t N,
                  int64_t H) {
  gate(a, N, H, 0) = gate(a, N, H, 0).logistic();
  gate(a, N, H, 1) = gate(a, N, H, 1).logistic();
  gate(a, N, H, 2) = gate(a, N, H, 2).tanh();
  gate(a, N, H, 3) = gate(a, N, H, 3).logistic();
  Arr cv(c, N, H), t(tc, N, H);
  cv = gate(a, N, H, 1) * ConstArr(cp, N, H) + gate(a, N, H, 0) * gate(a, N, H, 2);
  t = cv.tanh();
  Arr(h, N, H) = gate(a, N, H, 3) * t;
}

void cell_backward(const float* a_in, const float* cp, const float* tc_in, const float* dh,
                   const float* dh_in, float* dc, float* da, int64_t N, int64_t H) {
  float* a = const_cast<float*>(a_in);  // read only: Strided maps are mutable
  Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> dht = ConstArr(dh, N, H);
  if (dh_in != nullptr) dht += ConstArr(dh_in, N, H);
  ConstArr tc(tc_in, N, H);
  Arr dct(dc, N, H);
  Strided i = gate(a, N, H, 0), f = gate(a, N, H, 1), g = gate(a, N, H, 2), o = gate(a, N, H, 3);
  dct += dht * o * (1.0f - tc * tc);
  gate(da, N, H, 0) = dct * g * i * (1.0f - i);
  gate(da, N, H, 1) = dct * ConstArr(cp, N, H) * f * (1.0f - f);
  gate(da, N, H, 2) = dct * i * (1.0f - g * g);
  gate(da, N, H, 3) = dht * tc * o * (1.0f - o);
  dct *= f;
}
#endif

}  // namespace

int64_t amx_a_elems(const LstmDims& d) {
  const int64_t R = d.rows(), N = d.seqs, H = d.hidden, G = 4 * d.hidden;
  const int64_t sizes[] = {amx::packed_a_elems(R, d.in), amx::packed_a_elems(N, H),
                           amx::packed_a_elems(N, G),    amx::packed_a_elems(d.in, R),
                           amx::packed_a_elems(H, R),    amx::packed_a_elems(R, G)};
  return *std::max_element(std::begin(sizes), std::end(sizes));
}

int64_t amx_b_elems(const LstmDims& d) {
  const int64_t R = d.rows(), H = d.hidden, G = 4 * d.hidden;
  const int64_t sizes[] = {amx::packed_b_elems(d.in, G), amx::packed_b_elems(H, G),
                           amx::packed_b_elems(G, H), amx::packed_b_elems(R, G),
                           amx::packed_b_elems(G, d.in)};
  return *std::max_element(std::begin(sizes), std::end(sizes));
}

void forward(const LstmDims& d, const float* x, const float* wx, const float* wh, const float* b,
             const float* state0, const uint8_t* resets, float* h, const LstmTape& tape,
             float* state_out, const AmxScratch& amx) {
  const int64_t N = d.seqs, H = d.hidden, G = 4 * H;
  // Input projections of every step in one GEMM: gates = x Wx + b, then + h Wh step by step.
  // The linear kernels read the weights in place (no packed copy per call, which dominated an
  // actor's one-step call) and sum each row in a fixed order whatever the number of rows.
  // bf16x3: gates = b + x Wx, Wx and Wh packed once for every step (or by the caller).
  const uint16_t* wh_tiles = amx.wh;
  if (amx.a != nullptr) {
    const uint16_t* wx_tiles = amx.wx;
    if (wx_tiles == nullptr) {
      amx::pack_b(amx.b, wx, d.in, G, G, false);
      wx_tiles = amx.b;
    }
    amx::pack_a(amx.a, x, d.rows(), d.in, d.in, false);
    amx::gemm(tape.gates, G, amx.a, wx_tiles, d.rows(), G, d.in, amx::Start::kBias, b);
    if (wh_tiles == nullptr) {
      amx::pack_b(amx.b, wh, H, G, G, false);
      wh_tiles = amx.b;
    }
  } else {
    layers::linear_forward(tape.gates, x, wx, b, d.rows(), d.in, G, false);
  }
  for (int64_t t = 0; t < d.steps; ++t) {
    const int64_t r0 = t * N;
    float* hp = tape.h_prev + r0 * H;
    float* cp = tape.c_prev + r0 * H;
    if (t == 0) {
      split_state(state0, N, H, hp, cp);
    } else {
      std::memcpy(hp, h + (r0 - N) * H, sizeof(float) * N * H);
      std::memcpy(cp, tape.c + (r0 - N) * H, sizeof(float) * N * H);
    }
    if (resets != nullptr) {
      zero_reset_rows(hp, resets + r0, N, H);
      zero_reset_rows(cp, resets + r0, N, H);
    }
    float* a = tape.gates + r0 * G;
    if (amx.a != nullptr) {
      amx::pack_a(amx.a, hp, N, H, H, false);
      amx::gemm(a, G, amx.a, wh_tiles, N, G, H);
    } else {
      layers::linear_forward_add(a, hp, wh, N, H, G);
    }
    cell_forward(a, cp, tape.c + r0 * H, tape.tanh_c + r0 * H, h + r0 * H, N, H);
  }
  if (state_out == nullptr) return;
  const int64_t last = (d.steps - 1) * N;
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(state_out + n * 2 * H, h + (last + n) * H, sizeof(float) * H);
    std::memcpy(state_out + n * 2 * H + H, tape.c + (last + n) * H, sizeof(float) * H);
  }
}

int64_t backward_panel_floats(const LstmDims& d) {
  return layers::linear_dx_panel_floats(d.hidden, 4 * d.hidden);
}

void backward(const LstmDims& d, const float* x, const float* wx, const float* wh,
              const uint8_t* resets, const LstmTape& tape, const float* dh, float* dgates,
              float* dstate, float* wh_panels, float* dx, float* dwx, float* dwh, float* db,
              const AmxScratch& amx) {
  const int64_t N = d.seqs, H = d.hidden, G = 4 * H;
  float* dc_next = dstate;  // [N, H]: gradient w.r.t. c_t arriving from step t + 1
  std::memset(dc_next, 0, sizeof(float) * N * H);
  // Every step's recurrent gradient reads Wh's transposed panels: laid out once, here, instead
  // of once per step (rlpar's data-gradient kernel; measured against Eigen's GEMM at [256, 1024]
  // x [1024, 256], 20 steps, in one process: 20-25 ms against 28-32).
  if (d.steps < 2 || amx.a != nullptr) wh_panels = nullptr;  // no recurrent gradient, or AMX's
  if (wh_panels != nullptr) layers::pack_linear_dx_panels(wh_panels, wh, H, G, 0, 1);
  if (amx.a != nullptr && d.steps >= 2) amx::pack_b(amx.b, wh, G, H, G, true);  // Wh^T [4H, H]
  float* dh_prev = dstate + N * H;  // [N, H]: gradient w.r.t. h_t arriving from step t + 1
  for (int64_t t = d.steps; t-- > 0;) {
    const int64_t r0 = t * N;
    float* a = tape.gates + r0 * G;
    float* da = dgates + r0 * G;
    cell_backward(a, tape.c_prev + r0 * H, tape.tanh_c + r0 * H, dh + r0 * H,
                  t + 1 < d.steps ? dh_prev : nullptr, dc_next, da, N, H);
    if (t == 0) break;  // truncated: nothing flows into the initial state
    // Into step t - 1, except where step t started from zeros.
    if (amx.a != nullptr) {
      amx::pack_a(amx.a, da, N, G, G, false);
      amx::gemm(dh_prev, H, amx.a, amx.b, N, H, G, amx::Start::kOverwrite);
    } else {
      layers::linear_data_grad(dh_prev, da, wh, N, H, G, wh_panels);
    }
    if (resets != nullptr) {
      zero_reset_rows(dc_next, resets + r0, N, H);
      zero_reset_rows(dh_prev, resets + r0, N, H);
    }
  }
  const int64_t R = d.rows();
  if (amx.a != nullptr) {  // dG packed once for both weight gradients
    amx::pack_b(amx.b, dgates, R, G, G, false);
    amx::pack_a(amx.a, x, d.in, R, d.in, true);
    amx::gemm(dwx, G, amx.a, amx.b, d.in, G, R);
    amx::pack_a(amx.a, tape.h_prev, H, R, H, true);
    amx::gemm(dwh, G, amx.a, amx.b, H, G, R);
    layers::add_column_sums(db, dgates, R, G, G);
    if (dx == nullptr) return;
    amx::pack_a(amx.a, dgates, R, G, G, false);
    amx::pack_b(amx.b, wx, G, d.in, G, true);
    amx::gemm(dx, d.in, amx.a, amx.b, R, d.in, G, amx::Start::kOverwrite);
    return;
  }
  ConstMatMap DA(dgates, R, G);
  MatMap(dwx, d.in, G).noalias() += ConstMatMap(x, R, d.in).transpose() * DA;
  MatMap(dwh, H, G).noalias() += ConstMatMap(tape.h_prev, R, H).transpose() * DA;
  layers::add_column_sums(db, dgates, R, G, G);
  if (dx != nullptr) layers::linear_data_grad(dx, dgates, wx, R, d.in, G);
}

}  // namespace rlpar::lstm
