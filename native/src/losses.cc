#include "rlpar/losses.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlpar::losses {
namespace {

constexpr double kHalfLog2Pi = 0.91893853320467274178;  // 0.5 * log(2 pi)

struct StepPolicy {
  double logp = 0;     // log pi(a|x)
  double entropy = 0;  // H(pi(.|x))
};

// Categorical over `n` logits at `row`: log-prob of action `a` and entropy.
StepPolicy categorical(const float* row, int64_t n, int64_t a) {
  double mx = row[0];
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double z = 0;
  for (int64_t j = 0; j < n; ++j) z += std::exp(row[j] - mx);
  const double lse = mx + std::log(z);
  StepPolicy s;
  s.logp = row[a] - lse;
  for (int64_t j = 0; j < n; ++j) {
    const double lp = row[j] - lse;
    s.entropy -= std::exp(lp) * lp;
  }
  return s;
}

// Diagonal Gaussian with means at `mean` and log-stds at `log_std`.
StepPolicy gaussian(const float* mean, const float* log_std, int64_t n, const float* a) {
  StepPolicy s;
  for (int64_t i = 0; i < n; ++i) {
    const double z = (a[i] - mean[i]) * std::exp(-static_cast<double>(log_std[i]));
    s.logp += -0.5 * z * z - log_std[i] - kHalfLog2Pi;
    s.entropy += log_std[i] + 0.5 + kHalfLog2Pi;
  }
  return s;
}

void check(const ActorCriticArgs& a) {
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (a.T < 1 || a.N < 1) fail("T and N must be >= 1");
  if (a.num_actions < 1) fail("num_actions must be >= 1");
  if (a.value_col < 0 || a.value_col >= a.O) fail("value column outside the output");
  if (a.policy_begin < 0 || a.policy_begin + a.num_actions > a.O) {
    fail("policy columns outside the output");
  }
  if (a.policy == Policy::Gaussian &&
      (a.log_std_begin < 0 || a.log_std_begin + a.num_actions > a.O)) {
    fail("log_std columns outside the output");
  }
  if (!(a.gamma >= 0 && a.gamma <= 1)) fail("gamma must be in [0, 1]");
  if (!(a.rho_bar > 0 && a.c_bar > 0 && a.pg_rho_bar > 0)) fail("rho_bar, c_bar, pg_rho_bar must be > 0");
}

}  // namespace

ActorCriticMetrics actor_critic_loss(const ActorCriticArgs& a, const float* out,
                                     const float* behaviour, const void* actions,
                                     const float* rewards, const uint8_t* terminated,
                                     const uint8_t* truncated, const uint8_t* mask, float* dout) {
  check(a);
  const int64_t T = a.T, N = a.N, O = a.O, A = a.num_actions;
  const bool cat = a.policy == Policy::Categorical;
  const auto* act_i = static_cast<const int64_t*>(actions);
  const auto* act_f = static_cast<const float*>(actions);
  auto row = [&](const float* base, int64_t t, int64_t n) { return base + (t * N + n) * O; };
  auto V = [&](int64_t t, int64_t n) { return static_cast<double>(row(out, t, n)[a.value_col]); };

  std::vector<double> rho(T * N, 1.0), c(T * N, 1.0), rho_pg(T * N, 1.0), ent(T * N, 0.0);
  ActorCriticMetrics m;
  int64_t clipped = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = t * N + n;
      if (!mask[i]) continue;
      const float* o = row(out, t, n);
      StepPolicy pi;
      if (cat) {
        const int64_t act = act_i[i];
        if (act < 0 || act >= A) {
          throw std::invalid_argument("action " + std::to_string(act) + " at step " +
                                      std::to_string(t) + ", column " + std::to_string(n) +
                                      " is outside [0, " + std::to_string(A) + ")");
        }
        pi = categorical(o + a.policy_begin, A, act);
      } else {
        pi = gaussian(o + a.policy_begin, o + a.log_std_begin, A, act_f + i * A);
      }
      ent[i] = pi.entropy;
      if (a.importance_weighting) {
        const float* b = row(behaviour, t, n);
        const StepPolicy mu = cat ? categorical(b + a.policy_begin, A, act_i[i])
                                  : gaussian(b + a.policy_begin, b + a.log_std_begin, A,
                                             act_f + i * A);
        const double ratio = std::exp(pi.logp - mu.logp);
        rho[i] = std::min(a.rho_bar, ratio);
        c[i] = std::min(a.c_bar, ratio);
        rho_pg[i] = std::min(a.pg_rho_bar, ratio);
        clipped += ratio > a.rho_bar;
      }
      m.valid_steps += 1;
    }
  }

  // Targets, last step first: vs (value targets) and A (policy-gradient advantages).
  std::vector<double> vs(T * N), adv(T * N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double vs_next = V(T, n);
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t i = t * N + n;
      const double v_t = V(t, n), v_next = V(t + 1, n);
      if (!mask[i]) {
        vs[i] = v_t;  // never read: the step before an autoreset step ends its episode
        vs_next = v_t;
        continue;
      }
      const bool done = terminated[i] || truncated[i];
      const double gb = terminated[i] ? 0.0 : a.gamma;
      const double gt = done ? 0.0 : a.gamma;
      const double delta = rho[i] * (rewards[i] + gb * v_next - v_t);
      vs[i] = v_t + delta + gt * c[i] * (vs_next - v_next);
      const double boot = done ? v_next : vs_next;
      adv[i] = rho_pg[i] * (rewards[i] + gb * boot - v_t);
      vs_next = vs[i];
    }
  }

  // Gradients w.r.t. the outputs, averaged over valid steps.
  std::memset(dout, 0, sizeof(float) * (T + 1) * N * O);
  const double scale = m.valid_steps > 0 ? 1.0 / static_cast<double>(m.valid_steps) : 0.0;
  std::vector<double> p(cat ? A : 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = t * N + n;
      if (!mask[i]) continue;
      const float* o = row(out, t, n);
      float* d = dout + (t * N + n) * O;
      const double v_t = V(t, n);
      const double A_t = adv[i];
      d[a.value_col] = static_cast<float>(-a.value_coef * (vs[i] - v_t) * scale);
      if (cat) {
        const float* lg = o + a.policy_begin;
        double mx = lg[0];
        for (int64_t j = 1; j < A; ++j) mx = std::max(mx, static_cast<double>(lg[j]));
        double z = 0;
        for (int64_t j = 0; j < A; ++j) z += (p[j] = std::exp(lg[j] - mx));
        const double H = ent[i];
        for (int64_t j = 0; j < A; ++j) {
          p[j] /= z;
          const double onehot = j == act_i[i] ? 1.0 : 0.0;
          // d(-A log p_a)/dlogit_j = -A (1[j=a] - p_j);  d(-c H)/dlogit_j = c p_j (log p_j + H)
          const double g = -A_t * (onehot - p[j]) + a.entropy_coef * p[j] * (std::log(p[j]) + H);
          d[a.policy_begin + j] = static_cast<float>(g * scale);
        }
      } else {
        const float* mean = o + a.policy_begin;
        const float* log_std = o + a.log_std_begin;
        const float* act = act_f + i * A;
        for (int64_t k = 0; k < A; ++k) {
          const double inv_var = std::exp(-2.0 * log_std[k]);
          const double diff = act[k] - mean[k];
          // d log pi / d mean = (a - mean) / var;  d log pi / d log_std = (a - mean)^2 / var - 1
          d[a.policy_begin + k] = static_cast<float>(-A_t * diff * inv_var * scale);
          const double g = -A_t * (diff * diff * inv_var - 1.0) - a.entropy_coef;
          d[a.log_std_begin + k] = static_cast<float>(g * scale);
        }
      }
      const double logp = cat ? categorical(o + a.policy_begin, A, act_i[i]).logp
                              : gaussian(o + a.policy_begin, o + a.log_std_begin, A, act_f + i * A).logp;
      m.policy_loss += -A_t * logp;
      m.value_loss += 0.5 * (vs[i] - v_t) * (vs[i] - v_t);
      m.entropy += ent[i];
      m.mean_rho += rho[i];
      m.mean_advantage += A_t;
      m.mean_value += v_t;
    }
  }
  for (double* x : {&m.policy_loss, &m.value_loss, &m.entropy, &m.mean_rho, &m.mean_advantage,
                    &m.mean_value}) {
    *x *= scale;
  }
  m.rho_clipped_fraction = static_cast<double>(clipped) * scale;
  m.loss = m.policy_loss + a.value_coef * m.value_loss - a.entropy_coef * m.entropy;
  return m;
}

}  // namespace rlpar::losses
