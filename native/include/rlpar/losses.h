// rlpar/losses.h — actor-critic losses with their gradients w.r.t. the net's outputs.
//
// One function covers A3C (on-policy n-step returns, Mnih et al. 2016) and IMPALA (V-trace,
// Espeholt et al. 2018): with `importance_weighting` off every ratio pi/mu is taken as 1 and the
// targets are the n-step returns bootstrapped at the unroll's end; with it on they are V-trace
// targets with clipped ratios. Written with time-suffixed names in comments, like the papers:
//
//   rho_t   = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)),   c_t = min(c_bar, pi/mu)
//   delta_t = rho_t (r_t + gb_t V(x_{t+1}) - V(x_t))        gb_t = gamma (1 - terminated_t)
//   vs_t    = V(x_t) + delta_t + gt_t c_t (vs_{t+1} - V(x_{t+1}))   gt_t = gamma (1 - done_t)
//   A_t     = rho_pg_t (r_t + gb_t vnext_t - V(x_t)),  vnext_t = done_t ? V(x_{t+1}) : vs_{t+1}
//
// gb bootstraps through a truncation (x_{t+1} is then the episode's final observation); gt stops
// every trace at an episode's end, so nothing flows from one episode into the next. Steps with
// mask_t = 0 (the env's autoreset step) carry no loss. Losses are means over valid steps:
//
//   L = mean_t [ -A_t log pi(a_t|x_t) + value_coef * 0.5 (vs_t - V(x_t))^2 - entropy_coef H_t ]
//
// vs_t and A_t are targets (no gradient flows through them).
#pragma once

#include <cstdint>
#include <vector>

namespace rlpar::losses {

// Categorical: one action over num_actions logits. Gaussian: a diagonal Gaussian over
// num_actions dimensions. MultiCategorical: one independent Categorical per action dimension
// d over action_dims[d] consecutive logits (gymnasium's MultiDiscrete; MultiBinary as
// dimensions of 2), log pi(a|x) = sum_d log pi_d(a_d|x) and H = sum_d H_d.
enum class Policy { Categorical, Gaussian, MultiCategorical };

struct ActorCriticArgs {
  int64_t T = 0;  // unroll length
  int64_t N = 0;  // columns (rollouts x envs)
  int64_t O = 0;  // net output size
  Policy policy = Policy::Categorical;
  int64_t policy_begin = 0;   // first logit (categorical) or first mean (gaussian) column
  int64_t num_actions = 0;    // logits, or action dimensions
  int64_t log_std_begin = 0;  // gaussian: first log-std column
  int64_t value_col = 0;
  std::vector<int64_t> action_dims;  // multi-categorical: logits per dimension (sum: num_actions)
  double gamma = 0.99;
  bool importance_weighting = false;
  double rho_bar = 1.0;
  double c_bar = 1.0;
  double pg_rho_bar = 1.0;
  double value_coef = 0.5;
  double entropy_coef = 0.01;
};

struct ActorCriticMetrics {
  double loss = 0, policy_loss = 0, value_loss = 0, entropy = 0;
  double mean_rho = 0, rho_clipped_fraction = 0, mean_advantage = 0, mean_value = 0;
  int64_t valid_steps = 0;
};

// out: [T+1, N, O] outputs of the learner's net at x_0..x_T (row T bootstraps).
// behaviour: [T, N, O] the actors' outputs when acting (read only when importance_weighting).
// actions: int64 [T, N] (categorical), float [T, N, A] (gaussian) or int64 [T, N, D]
// (multi-categorical, D = action_dims.size()).
// rewards: [T, N]; terminated, truncated, mask: uint8 [T, N].
// dout: [T+1, N, O], written (zero where no gradient).
ActorCriticMetrics actor_critic_loss(const ActorCriticArgs& a, const float* out,
                                     const float* behaviour, const void* actions,
                                     const float* rewards, const uint8_t* terminated,
                                     const uint8_t* truncated, const uint8_t* mask, float* dout);

// PPO's clipped surrogate on asynchronous rollouts (APPO: Schulman et al. 2017 on IMPALA's
// actors, as Sample Factory and IMPACT run it). The ratio is against the behaviour policy mu
// that acted, so one call needs nothing but the minibatch and the current outputs:
//
//   r_t     = pi(a_t|x_t) / mu(a_t|x_t)
//   V(x)    = value_mean + value_std * out_v(x)          (out_v: the value head, normalised)
//   vs_t    = V-trace targets as above, with rho_t = min(rho_bar, r_t) and the traces
//             c_t = lambda min(c_bar, r_t)
//   A_t     = r_t + gb_t vnext_t - V(x_t)        advantage = VTrace (IMPALA's, without rho_pg:
//                                                the surrogate's r_t is the weight at step t)
//           = vs_t - V(x_t)                      advantage = Gae: GAE(lambda) on the truncated
//                                                importance weights (on-policy: GAE exactly)
//   Â_t     = (A_t - mean A) / (std A + 1e-8)    normalize_advantages, over the valid steps
//   L_pg    = -min(r_t Â_t, clip(r_t, lo, hi) Â_t)    [lo, hi] = [1 - eps, 1 + eps] (Symmetric)
//                                                 or [1 / (1 + eps), 1 + eps] (Reciprocal)
//   y_t     = (vs_t - value_mean) / value_std     the value target, normalised
//   L_v     = 0.5 (out_v - y_t)^2, or with value_clip > 0 and the actor's value out_v^mu:
//             0.5 max((out_v - y_t)^2, (out_v^mu + clip(out_v - out_v^mu, -value_clip,
//             value_clip) - y_t)^2)
//   L       = mean_t [ L_pg + value_coef L_v - entropy_coef H_t ]      over the valid steps
//
// vs_t, A_t, Â_t and y_t are targets (no gradient flows through them).
enum class Advantage { VTrace, Gae };
enum class RatioClip { Symmetric, Reciprocal };

struct PpoArgs {
  // Layout, gamma, rho_bar, c_bar, value_coef, entropy_coef as above (importance_weighting and
  // pg_rho_bar are not read: the ratio always weighs, and the surrogate clips it).
  ActorCriticArgs base;
  double clip_eps = 0.2;
  RatioClip clip = RatioClip::Symmetric;
  Advantage advantage = Advantage::VTrace;
  double lambda = 1.0;
  bool normalize_advantages = true;
  double value_clip = 0.0;  // 0: no value clipping
  double value_mean = 0.0, value_std = 1.0;
};

struct PpoMetrics {
  double loss = 0, policy_loss = 0, value_loss = 0, entropy = 0;
  double approx_kl = 0;            // mean of (r - 1) - log r, Schulman's low-variance estimator
  double clip_fraction = 0;        // share of steps with r outside [lo, hi]
  double value_clip_fraction = 0;  // share of steps whose clipped value term is the larger
  double ratio_mean = 0, ratio_min = 0, ratio_max = 0;
  double explained_variance = 0;   // 1 - Var(vs - V) / Var(vs), denormalised values
  double mean_advantage = 0, advantage_std = 0;  // A_t before normalisation
  double mean_value = 0, mean_rho = 0;
  double target_mean = 0, target_sq_mean = 0;    // of vs_t: what running value statistics need
  int64_t valid_steps = 0;
};

// Arrays as for actor_critic_loss; behaviour is always read (it is mu).
PpoMetrics ppo_loss(const PpoArgs& a, const float* out, const float* behaviour,
                    const void* actions, const float* rewards, const uint8_t* terminated,
                    const uint8_t* truncated, const uint8_t* mask, float* dout);

}  // namespace rlpar::losses
