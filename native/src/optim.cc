#include "rlpar/optim.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace rlpar::optim {

namespace {
void require_momentum_buffer(float momentum, const float* buf) {
  if (momentum != 0.0f && buf == nullptr) {
    throw std::invalid_argument("momentum > 0 needs a momentum_buffer");
  }
}
}  // namespace

void sgd_step(float* p, const float* g, float* buf, size_t n, float lr, float momentum,
              float weight_decay, bool nesterov) {
  require_momentum_buffer(momentum, buf);
  if (momentum == 0.0f) {
    for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + weight_decay * p[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + weight_decay * p[i];
    buf[i] = momentum * buf[i] + gi;
    p[i] -= lr * (nesterov ? gi + momentum * buf[i] : buf[i]);
  }
}

void rmsprop_step(float* p, const float* g, float* square_avg, float* grad_avg, float* buf,
                  size_t n, float lr, float alpha, float eps, float momentum, float weight_decay) {
  require_momentum_buffer(momentum, buf);
  if (momentum == 0.0f) buf = nullptr;  // a buffer passed without momentum is left alone
  const float one_minus = 1.0f - alpha;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + weight_decay * p[i];
    const float sq = alpha * square_avg[i] + one_minus * gi * gi;
    square_avg[i] = sq;
    float var = sq;
    if (grad_avg != nullptr) {
      const float ga = alpha * grad_avg[i] + one_minus * gi;
      grad_avg[i] = ga;
      // Rounding can make the variance estimate slightly negative for near-constant gradients.
      var = std::max(sq - ga * ga, 0.0f);
    }
    const float step = gi / (std::sqrt(var) + eps);
    if (buf != nullptr) {
      buf[i] = momentum * buf[i] + step;
      p[i] -= lr * buf[i];
    } else {
      p[i] -= lr * step;
    }
  }
}

void adam_step(float* p, const float* g, float* m, float* v, size_t n, int64_t step, float lr,
               float beta1, float beta2, float eps, float weight_decay) {
  if (step < 1) {
    throw std::invalid_argument("adam step count must be >= 1, got " + std::to_string(step));
  }
  const double t = static_cast<double>(step);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(beta2), t)));
  const float step_size = lr / bc1;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + weight_decay * p[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

double global_norm(const float* g, size_t n) {
  // 16 running sums, element i into sum i % 16, added up in order at the end: independent lanes
  // the compiler keeps in vector registers (one chain of dependent adds ran at one element per
  // add latency, 4 % of a MinAtar learner step). The order is fixed by n alone.
  constexpr size_t kLanes = 16;
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double v = g[i + j];
      lane[j] += v * v;
    }
  }
  for (size_t j = 0; i < n; ++i, ++j) {
    const double v = g[i];
    lane[j] += v * v;
  }
  double s = 0.0;
  for (size_t j = 0; j < kLanes; ++j) s += lane[j];
  return std::sqrt(s);
}

double clip_by_global_norm(float* g, size_t n, double max_norm) {
  if (!(max_norm > 0)) {
    throw std::invalid_argument("max_norm must be > 0, got " + std::to_string(max_norm));
  }
  const double norm = global_norm(g, n);
  if (norm > max_norm && norm > 0.0) {
    const float scale = static_cast<float>(max_norm / norm);
    for (size_t i = 0; i < n; ++i) g[i] *= scale;
  }
  return norm;
}

}  // namespace rlpar::optim
