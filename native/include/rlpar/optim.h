// rlpar/optim.h — optimizers that update one flat float32 parameter buffer in place.
//
// Every function is a pure loop over (params, grad, state...) of length n, so an optimizer step
// is one pass over memory and its state is a few flat buffers (easy to checkpoint). The update
// rules follow PyTorch's definitions (eps outside the square root for RMSProp and Adam), so they
// can be checked against a numpy reference of those formulas.
//
// Domain errors (momentum > 0 without a buffer, an Adam step count < 1, max_norm <= 0) throw
// std::invalid_argument before anything is written.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rlpar::optim {

// g' = g + wd * p; with momentum: buf = m * buf + g'; step = nesterov ? g' + m * buf : buf;
// p -= lr * step. `buf` may be null when momentum == 0 (and is ignored then).
void sgd_step(float* p, const float* g, float* buf, size_t n, float lr, float momentum,
              float weight_decay, bool nesterov);

// sq = a * sq + (1 - a) g^2; centered: ga = a * ga + (1 - a) g, denom = sqrt(max(sq - ga^2, 0)) + eps,
// else denom = sqrt(sq) + eps; momentum: buf = m * buf + g / denom, p -= lr * buf;
// otherwise p -= lr * g / denom. `grad_avg` null = not centered; `buf` may be null when momentum == 0
// (and is ignored then).
void rmsprop_step(float* p, const float* g, float* square_avg, float* grad_avg, float* buf,
                  size_t n, float lr, float alpha, float eps, float momentum, float weight_decay);

// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), with t = step >= 1.
void adam_step(float* p, const float* g, float* m, float* v, size_t n, int64_t step, float lr,
               float beta1, float beta2, float eps, float weight_decay);

// sqrt(sum g^2), accumulated in double.
double global_norm(const float* g, size_t n);

// Scales g so that its global norm is at most max_norm; returns the norm before clipping.
double clip_by_global_norm(float* g, size_t n, double max_norm);

}  // namespace rlpar::optim
