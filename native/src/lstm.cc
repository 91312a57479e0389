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
#include "rlpar/isa.h"
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
void cell_forward_avx512(float* a, const float* cp, float* c, float* tc, float* h,
                         int64_t n_rows, int64_t hidden) {
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
void cell_backward_avx512(const float* a, const float* cp, const float* tc, const float* dh,
                          const float* dh_in, float* dc, float* da, int64_t n_rows,
                          int64_t hidden) {
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
#endif

// The same two functions on Eigen's array expressions (builds without AVX-512, and
// RLPAR_MAX_ISA below avx512).
using Strided = Eigen::Map<Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                           Eigen::OuterStride<>>;
using Arr = Eigen::Map<Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using ConstArr =
    Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// Gate k (0 = i, 1 = f, 2 = g, 3 = o) of `rows` rows of a [rows, 4H] block.
Strided gate(float* block, int64_t rows, int64_t h, int k) {
  return Strided(block + k * h, rows, h, Eigen::OuterStride<>(4 * h));
}

void cell_forward_eigen(float* a, const float* cp, float* c, float* tc, float* h, int64_t N,
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

void cell_backward_eigen(const float* a_in, const float* cp, const float* tc_in,
                         const float* dh, const float* dh_in, float* dc, float* da, int64_t N,
                         int64_t H) {
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

// The cell of one step on the kernels active_isa() picks (rlpar/isa.h).
void cell_forward(float* a, const float* cp, float* c, float* tc, float* h, int64_t N,
                  int64_t H) {
#if defined(__AVX512F__)
  if (active_isa() == Isa::Avx512) return cell_forward_avx512(a, cp, c, tc, h, N, H);
#endif
  cell_forward_eigen(a, cp, c, tc, h, N, H);
}

void cell_backward(const float* a, const float* cp, const float* tc, const float* dh,
                   const float* dh_in, float* dc, float* da, int64_t N, int64_t H) {
#if defined(__AVX512F__)
  if (active_isa() == Isa::Avx512) {
    return cell_backward_avx512(a, cp, tc, dh, dh_in, dc, da, N, H);
  }
#endif
  cell_backward_eigen(a, cp, tc, dh, dh_in, dc, da, N, H);
}

// The bf16x3 backward's B scratch: Wh^T [4H, H] and Wx^T [4H, in] packed once, then dG [T N, 4H]
// packed step by step (elements from amx.b).
struct AmxBackLayout {
  int64_t wxt, dg;
  explicit AmxBackLayout(const LstmDims& d)
      : wxt(amx::packed_b_elems(4 * d.hidden, d.hidden)),
        dg(wxt + amx::packed_b_elems(4 * d.hidden, d.in)) {}
};

}  // namespace

int64_t amx_a_elems(const LstmDims& d) {
  const int64_t R = d.rows(), N = d.seqs, H = d.hidden, G = 4 * d.hidden;
  const int64_t sizes[] = {amx::packed_a_elems(N, 32 * packed_weight_tiles(d.in, H)),
                           amx::packed_a_elems(N, G), amx::packed_a_elems(d.in, R),
                           amx::packed_a_elems(H, R)};
  return *std::max_element(std::begin(sizes), std::end(sizes));
}

int64_t amx_b_elems(const LstmDims& d) {
  const int64_t back = AmxBackLayout(d).dg + amx::packed_b_elems(d.rows(), 4 * d.hidden);
  return std::max(packed_weight_elems(d.in, d.hidden), back);
}

int64_t packed_weight_tiles(int64_t in, int64_t hidden) {
  return amx::k_tiles(in) + amx::k_tiles(hidden);
}

int64_t packed_weight_elems(int64_t in, int64_t hidden) {
  return amx::packed_b_elems(32 * packed_weight_tiles(in, hidden), 4 * hidden);
}

void pack_weights(uint16_t* dst, const float* wx, const float* wh, int64_t in, int64_t hidden) {
  const int64_t G = 4 * hidden, kw = packed_weight_tiles(in, hidden);
  amx::pack_b_part(dst, wx, in, G, G, false, 0, kw);
  amx::pack_b_part(dst, wh, hidden, G, G, false, amx::k_tiles(in), kw);
}

void forward(const LstmDims& d, const float* x, const float* wx, const float* wh, const float* b,
             const float* state0, const uint8_t* resets, float* h, const LstmTape& tape,
             float* state_out, const AmxScratch& amx) {
  const int64_t N = d.seqs, H = d.hidden, G = 4 * H;
  // float32: the input projections of every step in one GEMM, gates = x Wx + b, then + h Wh
  // step by step. The linear kernels read the weights in place (no packed copy per call, which
  // dominated an actor's one-step call) and sum each row in a fixed order whatever the number of
  // rows.
  // bf16x3: one product per step, gates = b + [x_t | h] [Wx; Wh], the weights packed once for
  // every step (or by the caller): the step's gates stay in cache from the product to the cell.
  const int64_t kx = amx::k_tiles(d.in), kw = packed_weight_tiles(d.in, H);
  const uint16_t* w_tiles = amx.w;
  if (amx.a != nullptr && w_tiles == nullptr) {
    pack_weights(amx.b, wx, wh, d.in, H);
    w_tiles = amx.b;
  }
  if (amx.a == nullptr) layers::linear_forward(tape.gates, x, wx, b, d.rows(), d.in, G, false);
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
      amx::pack_a_part(amx.a, x + r0 * d.in, N, d.in, d.in, false, 0, kw);
      amx::pack_a_part(amx.a, hp, N, H, H, false, kx, kw);
      amx::gemm(a, G, amx.a, w_tiles, N, G, 32 * kw, amx::Start::kBias, b);
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

int64_t backward_dgates_floats(const LstmDims& d, bool amx) {
  return (amx ? std::min(d.seqs + 31, d.rows()) : d.rows()) * 4 * d.hidden;
}

int64_t backward_panel_floats(const LstmDims& d) {
  return layers::linear_dx_panel_floats(d.hidden, 4 * d.hidden);
}

namespace {

// bf16x3 backward through time. Each step's gate gradients are used while in cache: packed for
// the step's recurrent gradient (and dx's rows, sharing that packed operand), summed into db,
// and packed into dG's K tiles (those all of whose rows are done) for the weight gradients,
// which run once at the end over all T N rows. So dG never exists whole: `dgates` holds the
// step's rows, after them the rows of later steps whose K tile is not packed yet (< 32).
void backward_amx(const LstmDims& d, const float* x, const float* wx, const float* wh,
                  const uint8_t* resets, const LstmTape& tape, const float* dh, float* dgates,
                  float* dstate, float* dx, float* dwx, float* dwh, float* db,
                  const AmxScratch& amx) {
  const int64_t N = d.seqs, H = d.hidden, G = 4 * H, R = d.rows();
  const AmxBackLayout lay(d);
  uint16_t* wht = amx.b;            // Wh^T [4H, H]
  uint16_t* wxt = amx.b + lay.wxt;  // Wx^T [4H, in]
  uint16_t* dg = amx.b + lay.dg;    // dG [T N, 4H]
  const int64_t kr = amx::k_tiles(R);
  if (d.steps >= 2) amx::pack_b(wht, wh, G, H, G, true);
  if (dx != nullptr) amx::pack_b(wxt, wx, G, d.in, G, true);
  float* dc_next = dstate;          // [N, H]: gradient w.r.t. c_t arriving from step t + 1
  float* dh_prev = dstate + N * H;  // [N, H]: gradient w.r.t. h_t arriving from step t + 1
  std::memset(dc_next, 0, sizeof(float) * N * H);
  int64_t packed_from = kr;  // dG's K tiles [packed_from, kr) are packed
  int64_t left = 0;          // rows of later steps not packed yet, at the start of dgates
  for (int64_t t = d.steps; t-- > 0;) {
    const int64_t r0 = t * N;
    float* da = dgates;  // rows [r0, r0 + N), then the `left` rows after them
    std::memmove(dgates + N * G, dgates, sizeof(float) * left * G);
    cell_backward(tape.gates + r0 * G, tape.c_prev + r0 * H, tape.tanh_c + r0 * H, dh + r0 * H,
                  t + 1 < d.steps ? dh_prev : nullptr, dc_next, da, N, H);
    layers::add_column_sums(db, da, N, G, G);
    const int64_t first = (r0 + 31) / 32;  // K tiles whose rows are all done
    if (first < packed_from) {
      const int64_t k0 = first * 32, k1 = std::min(packed_from * 32, R);
      amx::pack_b_part(dg, dgates + (k0 - r0) * G, k1 - k0, G, G, false, first, kr);
      packed_from = first;
    }
    left = std::min(first * 32, R) - r0;
    if (t > 0 || dx != nullptr) amx::pack_a(amx.a, da, N, G, G, false);
    if (dx != nullptr) {
      amx::gemm(dx + r0 * d.in, d.in, amx.a, wxt, N, d.in, G, amx::Start::kOverwrite);
    }
    if (t == 0) break;  // truncated: nothing flows into the initial state
    // Into step t - 1, except where step t started from zeros.
    amx::gemm(dh_prev, H, amx.a, wht, N, H, G, amx::Start::kOverwrite);
    if (resets != nullptr) {
      zero_reset_rows(dc_next, resets + r0, N, H);
      zero_reset_rows(dh_prev, resets + r0, N, H);
    }
  }
  amx::pack_a(amx.a, x, d.in, R, d.in, true);
  amx::gemm(dwx, G, amx.a, dg, d.in, G, R);
  amx::pack_a(amx.a, tape.h_prev, H, R, H, true);
  amx::gemm(dwh, G, amx.a, dg, H, G, R);
}

}  // namespace

void backward(const LstmDims& d, const float* x, const float* wx, const float* wh,
              const uint8_t* resets, const LstmTape& tape, const float* dh, float* dgates,
              float* dstate, float* wh_panels, float* dx, float* dwx, float* dwh, float* db,
              const AmxScratch& amx) {
  if (amx.a != nullptr) {
    backward_amx(d, x, wx, wh, resets, tape, dh, dgates, dstate, dx, dwx, dwh, db, amx);
    return;
  }
  const int64_t N = d.seqs, H = d.hidden, G = 4 * H;
  float* dc_next = dstate;  // [N, H]: gradient w.r.t. c_t arriving from step t + 1
  std::memset(dc_next, 0, sizeof(float) * N * H);
  // Every step's recurrent gradient reads Wh's transposed panels: laid out once, here, instead
  // of once per step (rlpar's data-gradient kernel; measured against Eigen's GEMM at [256, 1024]
  // x [1024, 256], 20 steps, in one process: 20-25 ms against 28-32).
  if (d.steps < 2) wh_panels = nullptr;  // no recurrent gradient
  if (wh_panels != nullptr) layers::pack_linear_dx_panels(wh_panels, wh, H, G, 0, 1);
  float* dh_prev = dstate + N * H;  // [N, H]: gradient w.r.t. h_t arriving from step t + 1
  for (int64_t t = d.steps; t-- > 0;) {
    const int64_t r0 = t * N;
    float* da = dgates + r0 * G;
    cell_backward(tape.gates + r0 * G, tape.c_prev + r0 * H, tape.tanh_c + r0 * H, dh + r0 * H,
                  t + 1 < d.steps ? dh_prev : nullptr, dc_next, da, N, H);
    if (t == 0) break;  // truncated: nothing flows into the initial state
    // Into step t - 1, except where step t started from zeros.
    layers::linear_data_grad(dh_prev, da, wh, N, H, G, wh_panels);
    if (resets != nullptr) {
      zero_reset_rows(dc_next, resets + r0, N, H);
      zero_reset_rows(dh_prev, resets + r0, N, H);
    }
  }
  const int64_t R = d.rows();
  ConstMatMap DA(dgates, R, G);
  MatMap(dwx, d.in, G).noalias() += ConstMatMap(x, R, d.in).transpose() * DA;
  MatMap(dwh, H, G).noalias() += ConstMatMap(tape.h_prev, R, H).transpose() * DA;
  layers::add_column_sums(db, dgates, R, G, G);
  if (dx != nullptr) layers::linear_data_grad(dx, dgates, wx, R, d.in, G);
}

}  // namespace rlpar::lstm
