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

namespace rlpar::losses {

enum class Policy { Categorical, Gaussian };

struct ActorCriticArgs {
  int64_t T = 0;  // unroll length
  int64_t N = 0;  // columns (rollouts x envs)
  int64_t O = 0;  // net output size
  Policy policy = Policy::Categorical;
  int64_t policy_begin = 0;   // first logit (categorical) or first mean (gaussian) column
  int64_t num_actions = 0;    // logits, or action dimensions
  int64_t log_std_begin = 0;  // gaussian: first log-std column
  int64_t value_col = 0;
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
// actions: int64 [T, N] (categorical) or float [T, N, A] (gaussian).
// rewards: [T, N]; terminated, truncated, mask: uint8 [T, N].
// dout: [T+1, N, O], written (zero where no gradient).
ActorCriticMetrics actor_critic_loss(const ActorCriticArgs& a, const float* out,
                                     const float* behaviour, const void* actions,
                                     const float* rewards, const uint8_t* terminated,
                                     const uint8_t* truncated, const uint8_t* mask, float* dout);

}  // namespace rlpar::losses
