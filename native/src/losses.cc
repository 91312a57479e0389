#include "rlpar/losses.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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
  if (a.policy == Policy::MultiCategorical) {
    int64_t sum = 0;
    for (int64_t n : a.action_dims) {
      if (n < 1) fail("every action dimension needs >= 1 logit");
      sum += n;
    }
    if (a.action_dims.empty() || sum != a.num_actions) {
      fail("a multi-categorical policy's action_dims must sum to num_actions (" +
           std::to_string(a.num_actions) + "), got a sum of " + std::to_string(sum) + " over " +
           std::to_string(a.action_dims.size()) + " dimensions");
    }
  }
  if (!(a.gamma >= 0 && a.gamma <= 1)) fail("gamma must be in [0, 1]");
  if (!(a.rho_bar > 0 && a.c_bar > 0 && a.pg_rho_bar > 0)) fail("rho_bar, c_bar, pg_rho_bar must be > 0");
}

// The columns and step layout of one loss call: row (t, n) of [T(+1), N, O] arrays.
struct Layout {
  const ActorCriticArgs& args;
  const float* out;
  bool categorical() const { return args.policy == Policy::Categorical; }
  bool multi() const { return args.policy == Policy::MultiCategorical; }
  // Scratch doubles the gradient of a discrete policy needs: its largest logit count.
  int64_t probs_size() const {
    if (categorical()) return args.num_actions;
    int64_t m = 0;
    for (int64_t n : args.action_dims) m = std::max(m, n);
    return m;
  }
  int64_t index(int64_t t, int64_t n) const { return t * args.N + n; }
  const float* row(const float* base, int64_t t, int64_t n) const {
    return base + index(t, n) * args.O;
  }
  double value(int64_t t, int64_t n) const {
    return static_cast<double>(row(out, t, n)[args.value_col]);
  }
};

// Per-step terms of the current policy pi and the behaviour policy mu (phase 1).
struct PolicyTerms {
  std::vector<double> logp_t, entropy_t;  // log pi(a_t|x_t), H(pi(.|x_t))
  std::vector<double> rho_t, c_t, rho_pg_t;  // clipped pi/mu (1 without importance weighting)
  std::vector<double> ratio_t;                // pi/mu unclipped (1 without importance weighting)
  int64_t valid_steps = 0, clipped = 0;
};

// Per-step targets (phase 2): vs_t (value targets) and A_t (policy-gradient advantages).
struct Targets {
  std::vector<double> vs_t, adv_t;
};

StepPolicy step_policy(const Layout& l, const float* row, const void* actions, int64_t i) {
  const ActorCriticArgs& a = l.args;
  if (l.categorical()) {
    return categorical(row + a.policy_begin, a.num_actions, static_cast<const int64_t*>(actions)[i]);
  }
  if (l.multi()) {  // independent dimensions: log-probs and entropies add
    const int64_t D = static_cast<int64_t>(a.action_dims.size());
    const int64_t* act = static_cast<const int64_t*>(actions) + i * D;
    StepPolicy s;
    const float* logits = row + a.policy_begin;
    for (int64_t d = 0; d < D; ++d) {
      const StepPolicy one = categorical(logits, a.action_dims[d], act[d]);
      s.logp += one.logp;
      s.entropy += one.entropy;
      logits += a.action_dims[d];
    }
    return s;
  }
  const float* act = static_cast<const float*>(actions) + i * a.num_actions;
  return gaussian(row + a.policy_begin, row + a.log_std_begin, a.num_actions, act);
}

void check_action(const Layout& l, const void* actions, int64_t t, int64_t n) {
  if (l.categorical()) {
    const int64_t act = static_cast<const int64_t*>(actions)[l.index(t, n)];
    if (act < 0 || act >= l.args.num_actions) {
      throw std::invalid_argument("action " + std::to_string(act) + " at step " +
                                  std::to_string(t) + ", column " + std::to_string(n) +
                                  " is outside [0, " + std::to_string(l.args.num_actions) + ")");
    }
  } else if (l.multi()) {
    const auto D = static_cast<int64_t>(l.args.action_dims.size());
    const int64_t* act = static_cast<const int64_t*>(actions) + l.index(t, n) * D;
    for (int64_t d = 0; d < D; ++d) {
      if (act[d] < 0 || act[d] >= l.args.action_dims[d]) {
        throw std::invalid_argument("action " + std::to_string(act[d]) + " of dimension " +
                                    std::to_string(d) + " at step " + std::to_string(t) +
                                    ", column " + std::to_string(n) + " is outside [0, " +
                                    std::to_string(l.args.action_dims[d]) + ")");
      }
    }
  }
}

// How phase 1 weighs: off (every ratio 1), or the clips of rho, c (times lambda) and rho_pg.
struct Clips {
  bool weighting = false;
  double rho_bar = 1, c_bar = 1, pg_rho_bar = 1, lambda = 1;
};

// Phase 1: log pi, entropy and the clipped importance ratios of every valid step.
PolicyTerms policy_terms(const Layout& l, const Clips& k, const float* behaviour,
                         const void* actions, const uint8_t* mask) {
  const ActorCriticArgs& a = l.args;
  const int64_t steps = a.T * a.N;
  PolicyTerms p;
  p.logp_t.assign(steps, 0.0);
  p.entropy_t.assign(steps, 0.0);
  p.rho_t.assign(steps, 1.0);
  p.c_t.assign(steps, k.lambda);
  p.rho_pg_t.assign(steps, 1.0);
  p.ratio_t.assign(steps, 1.0);
  for (int64_t t = 0; t < a.T; ++t) {
    for (int64_t n = 0; n < a.N; ++n) {
      const int64_t i = l.index(t, n);
      if (!mask[i]) continue;
      check_action(l, actions, t, n);
      const StepPolicy pi = step_policy(l, l.row(l.out, t, n), actions, i);
      p.logp_t[i] = pi.logp;
      p.entropy_t[i] = pi.entropy;
      if (k.weighting) {
        const StepPolicy mu = step_policy(l, l.row(behaviour, t, n), actions, i);
        const double ratio = std::exp(pi.logp - mu.logp);
        p.ratio_t[i] = ratio;
        p.rho_t[i] = std::min(k.rho_bar, ratio);
        p.c_t[i] = k.lambda * std::min(k.c_bar, ratio);
        p.rho_pg_t[i] = std::min(k.pg_rho_bar, ratio);
        p.clipped += ratio > k.rho_bar;
      }
      p.valid_steps += 1;
    }
  }
  return p;
}

// V(x_t) [T+1, N] from the value column: value_mean + value_std * out_v.
std::vector<double> state_values(const Layout& l, double value_mean, double value_std) {
  const ActorCriticArgs& a = l.args;
  std::vector<double> v((a.T + 1) * a.N);
  for (int64_t t = 0; t <= a.T; ++t) {
    for (int64_t n = 0; n < a.N; ++n) v[l.index(t, n)] = value_mean + value_std * l.value(t, n);
  }
  return v;
}

// Phase 2: V-trace targets vs_t and advantages A_t, last step first (see losses.h), on the
// state values v [T+1, N].
Targets targets(const Layout& l, const PolicyTerms& p, const std::vector<double>& v,
                const float* r_t, const uint8_t* terminated, const uint8_t* truncated,
                const uint8_t* mask) {
  const ActorCriticArgs& a = l.args;
  Targets g;
  g.vs_t.assign(a.T * a.N, 0.0);
  g.adv_t.assign(a.T * a.N, 0.0);
  for (int64_t n = 0; n < a.N; ++n) {
    double vs_tp1 = v[l.index(a.T, n)];
    for (int64_t t = a.T - 1; t >= 0; --t) {
      const int64_t i = l.index(t, n);
      const double v_t = v[i], v_tp1 = v[l.index(t + 1, n)];
      if (!mask[i]) {
        g.vs_t[i] = v_t;  // never read: the step before an autoreset step ends its episode
        vs_tp1 = v_t;
        continue;
      }
      const bool done = terminated[i] || truncated[i];
      const double gb = terminated[i] ? 0.0 : a.gamma;
      const double gt = done ? 0.0 : a.gamma;
      const double delta_t = p.rho_t[i] * (r_t[i] + gb * v_tp1 - v_t);
      g.vs_t[i] = v_t + delta_t + gt * p.c_t[i] * (vs_tp1 - v_tp1);
      const double vnext_t = done ? v_tp1 : vs_tp1;
      g.adv_t[i] = p.rho_pg_t[i] * (r_t[i] + gb * vnext_t - v_t);
      vs_tp1 = g.vs_t[i];
    }
  }
  return g;
}

// d(-adv_t log p_a - entropy_coef H)/dlogit_j over the `num_actions` logits at `logits`.
// `probs`: scratch of num_actions doubles.
// `n` logits at `logits`, their gradients written to `d` (the same columns of dout's row);
// entropy_t is this categorical's own entropy.
void categorical_grad(const ActorCriticArgs& a, const float* logits, int64_t n, int64_t action,
                      double adv_t, double entropy_t, double scale, double* probs, float* d) {
  double mx = logits[0];
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, static_cast<double>(logits[j]));
  double z = 0;
  for (int64_t j = 0; j < n; ++j) z += (probs[j] = std::exp(logits[j] - mx));
  for (int64_t j = 0; j < n; ++j) {
    probs[j] /= z;
    const double onehot = j == action ? 1.0 : 0.0;
    // d(-A log p_a)/dlogit_j = -A (1[j=a] - p_j);  d(-c H)/dlogit_j = c p_j (log p_j + H)
    const double g =
        -adv_t * (onehot - probs[j]) + a.entropy_coef * probs[j] * (std::log(probs[j]) + entropy_t);
    d[j] = static_cast<float>(g * scale);
  }
}

// The same for a diagonal Gaussian: gradients w.r.t. its means and log-stds.
void gaussian_grad(const ActorCriticArgs& a, const float* row, const float* act, double adv_t,
                   double scale, float* d) {
  const float* mean = row + a.policy_begin;
  const float* log_std = row + a.log_std_begin;
  for (int64_t k = 0; k < a.num_actions; ++k) {
    const double inv_var = std::exp(-2.0 * log_std[k]);
    const double diff = act[k] - mean[k];
    // d log pi / d mean = (a - mean) / var;  d log pi / d log_std = (a - mean)^2 / var - 1
    d[a.policy_begin + k] = static_cast<float>(-adv_t * diff * inv_var * scale);
    const double g = -adv_t * (diff * diff * inv_var - 1.0) - a.entropy_coef;
    d[a.log_std_begin + k] = static_cast<float>(g * scale);
  }
}

// The policy's gradients for step i (row `o`, dout row `d`) weighted by adv_t: a categorical,
// each dimension of a multi-categorical (with its own entropy), or a Gaussian.
void policy_grad(const Layout& l, const float* o, const void* actions, int64_t i, double adv_t,
                 double entropy_t, double scale, double* probs, float* d) {
  const ActorCriticArgs& a = l.args;
  if (l.categorical()) {
    const int64_t action = static_cast<const int64_t*>(actions)[i];
    categorical_grad(a, o + a.policy_begin, a.num_actions, action, adv_t, entropy_t, scale, probs,
                     d + a.policy_begin);
  } else if (l.multi()) {
    const auto D = static_cast<int64_t>(a.action_dims.size());
    const int64_t* act = static_cast<const int64_t*>(actions) + i * D;
    int64_t begin = a.policy_begin;
    for (int64_t k = 0; k < D; ++k) {
      const int64_t n = a.action_dims[k];
      const double h = categorical(o + begin, n, act[k]).entropy;
      categorical_grad(a, o + begin, n, act[k], adv_t, h, scale, probs, d + begin);
      begin += n;
    }
  } else {
    const float* act = static_cast<const float*>(actions) + i * a.num_actions;
    gaussian_grad(a, o, act, adv_t, scale, d);
  }
}

// Phase 3: the gradient of the mean loss w.r.t. every output (zero on rows without loss).
void output_gradients(const Layout& l, const PolicyTerms& p, const Targets& g,
                      const void* actions, const uint8_t* mask, float* dout) {
  const ActorCriticArgs& a = l.args;
  std::memset(dout, 0, sizeof(float) * (a.T + 1) * a.N * a.O);
  const double scale = p.valid_steps > 0 ? 1.0 / static_cast<double>(p.valid_steps) : 0.0;
  std::vector<double> probs(l.probs_size());
  for (int64_t t = 0; t < a.T; ++t) {
    for (int64_t n = 0; n < a.N; ++n) {
      const int64_t i = l.index(t, n);
      if (!mask[i]) continue;
      const float* o = l.row(l.out, t, n);
      float* d = dout + i * a.O;
      d[a.value_col] = static_cast<float>(-a.value_coef * (g.vs_t[i] - l.value(t, n)) * scale);
      policy_grad(l, o, actions, i, g.adv_t[i], p.entropy_t[i], scale, probs.data(), d);
    }
  }
}

// Phase 4: the loss and its parts, as means over valid steps.
ActorCriticMetrics metrics(const Layout& l, const PolicyTerms& p, const Targets& g,
                           const uint8_t* mask) {
  const ActorCriticArgs& a = l.args;
  ActorCriticMetrics m;
  m.valid_steps = p.valid_steps;
  for (int64_t t = 0; t < a.T; ++t) {
    for (int64_t n = 0; n < a.N; ++n) {
      const int64_t i = l.index(t, n);
      if (!mask[i]) continue;
      const double v_t = l.value(t, n);
      m.policy_loss += -g.adv_t[i] * p.logp_t[i];
      m.value_loss += 0.5 * (g.vs_t[i] - v_t) * (g.vs_t[i] - v_t);
      m.entropy += p.entropy_t[i];
      m.mean_rho += p.rho_t[i];
      m.mean_advantage += g.adv_t[i];
      m.mean_value += v_t;
    }
  }
  const double scale = p.valid_steps > 0 ? 1.0 / static_cast<double>(p.valid_steps) : 0.0;
  for (double* x : {&m.policy_loss, &m.value_loss, &m.entropy, &m.mean_rho, &m.mean_advantage,
                    &m.mean_value}) {
    *x *= scale;
  }
  m.rho_clipped_fraction = static_cast<double>(p.clipped) * scale;
  m.loss = m.policy_loss + a.value_coef * m.value_loss - a.entropy_coef * m.entropy;
  return m;
}


// ---------------------------------------------------------------------------- PPO (APPO)

void check_ppo(const PpoArgs& a) {
  check(a.base);
  auto fail = [](const std::string& m) { throw std::invalid_argument(m); };
  if (!(a.clip_eps > 0)) fail("clip_eps must be > 0");
  if (!(a.lambda >= 0 && a.lambda <= 1)) fail("lambda must be in [0, 1]");
  if (!(a.value_clip >= 0)) fail("value_clip must be >= 0");
  if (!(a.value_std > 0) || !std::isfinite(a.value_std) || !std::isfinite(a.value_mean)) {
    fail("value_std must be a finite number > 0 and value_mean finite");
  }
}

// The advantages A_t (VTrace or Gae, see losses.h) and their normalised Â_t (valid steps).
struct PpoAdvantages {
  std::vector<double> adv_t, norm_t;
  double mean = 0, std = 0;
};

PpoAdvantages ppo_advantages(const PpoArgs& a, const PolicyTerms& p, const Targets& g,
                             const std::vector<double>& v, const uint8_t* mask) {
  const int64_t steps = a.base.T * a.base.N;
  PpoAdvantages s;
  s.adv_t = g.adv_t;
  if (a.advantage == Advantage::Gae) {
    for (int64_t i = 0; i < steps; ++i) s.adv_t[i] = mask[i] ? g.vs_t[i] - v[i] : 0.0;
  }
  const double scale = p.valid_steps > 0 ? 1.0 / static_cast<double>(p.valid_steps) : 0.0;
  for (int64_t i = 0; i < steps; ++i) s.mean += mask[i] ? s.adv_t[i] : 0.0;
  s.mean *= scale;
  for (int64_t i = 0; i < steps; ++i) {
    if (mask[i]) s.std += (s.adv_t[i] - s.mean) * (s.adv_t[i] - s.mean);
  }
  s.std = std::sqrt(s.std * scale);
  s.norm_t = s.adv_t;
  if (a.normalize_advantages) {
    for (int64_t i = 0; i < steps; ++i) {
      s.norm_t[i] = mask[i] ? (s.adv_t[i] - s.mean) / (s.std + 1e-8) : 0.0;
    }
  }
  return s;
}

// Phases 3 and 4 of PPO: dout and the metrics, one pass over the valid steps.
PpoMetrics ppo_gradients(const Layout& l, const PpoArgs& a, const PolicyTerms& p,
                         const Targets& g, const PpoAdvantages& adv, const std::vector<double>& v,
                         const float* behaviour, const void* actions, const uint8_t* mask,
                         float* dout) {
  const ActorCriticArgs& b = a.base;
  std::memset(dout, 0, sizeof(float) * (b.T + 1) * b.N * b.O);
  const double scale = p.valid_steps > 0 ? 1.0 / static_cast<double>(p.valid_steps) : 0.0;
  const double hi = 1.0 + a.clip_eps;
  const double lo = a.clip == RatioClip::Symmetric ? 1.0 - a.clip_eps : 1.0 / (1.0 + a.clip_eps);
  std::vector<double> probs(l.probs_size());
  PpoMetrics m;
  m.valid_steps = p.valid_steps;
  m.ratio_min = p.valid_steps > 0 ? std::numeric_limits<double>::infinity() : 1.0;
  m.ratio_max = p.valid_steps > 0 ? -std::numeric_limits<double>::infinity() : 1.0;
  double res_sq = 0, res_sum = 0;  // of vs - V, for the explained variance
  int64_t clipped = 0, value_clipped = 0;
  for (int64_t t = 0; t < b.T; ++t) {
    for (int64_t n = 0; n < b.N; ++n) {
      const int64_t i = l.index(t, n);
      if (!mask[i]) continue;
      const float* o = l.row(l.out, t, n);
      float* d = dout + i * b.O;
      // Policy: -min(r Â, clip(r) Â); its gradient w.r.t. log pi is -r Â where the unclipped
      // term is the smaller (or they are equal), 0 where the clip binds.
      const double r = p.ratio_t[i], an = adv.norm_t[i];
      const double rc = std::min(hi, std::max(lo, r));
      const bool active = r * an <= rc * an;
      const double weight = active ? r * an : 0.0;
      policy_grad(l, o, actions, i, weight, p.entropy_t[i], scale, probs.data(), d);
      // Value: 0.5 (out_v - y)^2, or the larger of it and the clipped term.
      const double out_v = o[b.value_col];
      const double y = (g.vs_t[i] - a.value_mean) / a.value_std;
      double lv = 0.5 * (out_v - y) * (out_v - y), dv = out_v - y;
      if (a.value_clip > 0) {
        const double old_v = l.row(behaviour, t, n)[b.value_col];
        const double vc = old_v + std::min(a.value_clip, std::max(-a.value_clip, out_v - old_v));
        const double lc = 0.5 * (vc - y) * (vc - y);
        if (lc > lv) {  // the clip binds (inside it the two terms are equal): no gradient
          lv = lc;
          dv = 0.0;
          value_clipped += 1;
        }
      }
      d[b.value_col] = static_cast<float>(b.value_coef * dv * scale);
      // Metrics.
      m.policy_loss += -std::min(r * an, rc * an);
      m.value_loss += lv;
      m.entropy += p.entropy_t[i];
      m.approx_kl += (r - 1.0) - std::log(r);
      clipped += r < lo || r > hi;
      m.ratio_mean += r;
      m.ratio_min = std::min(m.ratio_min, r);
      m.ratio_max = std::max(m.ratio_max, r);
      m.mean_rho += p.rho_t[i];
      m.mean_value += v[i];
      m.target_mean += g.vs_t[i];
      m.target_sq_mean += g.vs_t[i] * g.vs_t[i];
      res_sum += g.vs_t[i] - v[i];
      res_sq += (g.vs_t[i] - v[i]) * (g.vs_t[i] - v[i]);
    }
  }
  for (double* x : {&m.policy_loss, &m.value_loss, &m.entropy, &m.approx_kl, &m.ratio_mean,
                    &m.mean_rho, &m.mean_value, &m.target_mean, &m.target_sq_mean}) {
    *x *= scale;
  }
  m.clip_fraction = static_cast<double>(clipped) * scale;
  m.value_clip_fraction = static_cast<double>(value_clipped) * scale;
  m.mean_advantage = adv.mean;
  m.advantage_std = adv.std;
  const double var_y = m.target_sq_mean - m.target_mean * m.target_mean;
  const double var_res = res_sq * scale - (res_sum * scale) * (res_sum * scale);
  m.explained_variance = var_y > 1e-12 ? 1.0 - var_res / var_y : 0.0;
  m.loss = m.policy_loss + b.value_coef * m.value_loss - b.entropy_coef * m.entropy;
  return m;
}

}  // namespace

ActorCriticMetrics actor_critic_loss(const ActorCriticArgs& args, const float* out,
                                     const float* behaviour, const void* actions,
                                     const float* rewards, const uint8_t* terminated,
                                     const uint8_t* truncated, const uint8_t* mask, float* dout) {
  check(args);
  const Layout layout{args, out};
  const Clips clips{args.importance_weighting, args.rho_bar, args.c_bar, args.pg_rho_bar, 1.0};
  const PolicyTerms terms = policy_terms(layout, clips, behaviour, actions, mask);
  const Targets targets_t = targets(layout, terms, state_values(layout, 0.0, 1.0), rewards,
                                    terminated, truncated, mask);
  output_gradients(layout, terms, targets_t, actions, mask, dout);
  return metrics(layout, terms, targets_t, mask);
}

PpoMetrics ppo_loss(const PpoArgs& args, const float* out, const float* behaviour,
                    const void* actions, const float* rewards, const uint8_t* terminated,
                    const uint8_t* truncated, const uint8_t* mask, float* dout) {
  check_ppo(args);
  const Layout layout{args.base, out};
  const Clips clips{true, args.base.rho_bar, args.base.c_bar, 1.0, args.lambda};
  PolicyTerms terms = policy_terms(layout, clips, behaviour, actions, mask);
  terms.rho_pg_t.assign(terms.rho_pg_t.size(), 1.0);  // the surrogate's r_t weighs step t
  const std::vector<double> v = state_values(layout, args.value_mean, args.value_std);
  const Targets g = targets(layout, terms, v, rewards, terminated, truncated, mask);
  const PpoAdvantages adv = ppo_advantages(args, terms, g, v, mask);
  return ppo_gradients(layout, args, terms, g, adv, v, behaviour, actions, mask, dout);
}

}  // namespace rlpar::losses
