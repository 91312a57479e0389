// rlpar/lstm.h — an LSTM core over a whole sequence: forward, and backward through time.
//
// Rows are time-major: row t * N + n is step t of sequence n (T steps, N sequences). Gates are
// laid out [i, f, g, o], each H wide, in one [*, 4H] row:
//
//     a_t = x_t Wx + h Wh + b              (Wx [in, 4H], Wh [H, 4H], b [4H])
//     i, f, o = sigmoid(a_i, a_f, a_o);  g = tanh(a_g)
//     c_t = f * c + i * g;  h_t = o * tanh(c_t)
//
// where (h, c) is the previous step's state, or zeros where `resets[t, n]` is set (an episode
// starts at step t), or the given initial state at t = 0 (unless reset there too). Backward is
// truncated at the sequence start: no gradient flows into the initial state.
//
// The state of one sequence is one row of 2H floats: [h, c].
//
// Each function works on raw pointers and writes only its outputs and the `LstmTape` buffers,
// which the caller provides (the net's workspace): so any number of threads may run them at once.
#pragma once

#include <cstdint>

namespace rlpar::lstm {

struct LstmDims {
  int64_t steps;   // T
  int64_t seqs;    // N
  int64_t in;      // input features
  int64_t hidden;  // H
  int64_t rows() const { return steps * seqs; }
};

// Activations a forward keeps for backward, each [T * N, width]:
struct LstmTape {
  float* gates;   // [T N, 4H] activated gates i, f, g, o
  float* h_prev;  // [T N, H]  h fed into step t (after resets)
  float* c_prev;  // [T N, H]  c fed into step t (after resets)
  float* c;       // [T N, H]  c_t
  float* tanh_c;  // [T N, H]  tanh(c_t)
};

// Scratch for bf16x3 products on AMX tiles (rlpar/amx.h) instead of float32 ones: the packed
// operands, amx_a_elems(d) and amx_b_elems(d) bfloat16 elements. Null `a`: float32 products.
// forward may take the weights already packed (pack_weights) in `w`; `b` is then not needed.
struct AmxScratch {
  uint16_t* a = nullptr;
  uint16_t* b = nullptr;
  const uint16_t* w = nullptr;
};
int64_t amx_a_elems(const LstmDims& d);
int64_t amx_b_elems(const LstmDims& d);

// The bf16x3 forward's B operand: [Wx; Wh] ([in + H, 4H], each part padded to whole K tiles),
// packed_weight_elems(in, H) bfloat16 elements, packed_weight_tiles(in, H) K tiles.
int64_t packed_weight_tiles(int64_t in, int64_t hidden);
int64_t packed_weight_elems(int64_t in, int64_t hidden);
void pack_weights(uint16_t* dst, const float* wx, const float* wh, int64_t in, int64_t hidden);

// x: [T N, in]; state0: [N, 2H] or null for zeros; resets: [T, N] bytes (0/1) or null for none.
// Writes h: [T N, H] (the outputs, which are also the next step's h), the tape, and, when not
// null, state_out: [N, 2H] after the last step (may alias state0).
void forward(const LstmDims& d, const float* x, const float* wx, const float* wh, const float* b,
             const float* state0, const uint8_t* resets, float* h, const LstmTape& tape,
             float* state_out, const AmxScratch& amx = {});

// dh: [T N, H] gradient w.r.t. the outputs h. `dgates` is scratch of
// backward_dgates_floats(d, amx.a != nullptr) floats ([T N, 4H]; with `amx` only the rows of
// about one step), `dstate` scratch [N, 2H], `wh_panels` scratch of backward_panel_floats(d)
// floats (nullptr when that is 0, or with `amx`).
// Adds dWx, dWh, db into dwx, dwh, db and writes dx [T N, in] (nullable).
void backward(const LstmDims& d, const float* x, const float* wx, const float* wh,
              const uint8_t* resets, const LstmTape& tape, const float* dh, float* dgates,
              float* dstate, float* wh_panels, float* dx, float* dwx, float* dwh, float* db,
              const AmxScratch& amx = {});
int64_t backward_dgates_floats(const LstmDims& d, bool amx);
// Floats of backward's `wh_panels`: Wh laid out once for every step's recurrent gradient.
int64_t backward_panel_floats(const LstmDims& d);

}  // namespace rlpar::lstm
