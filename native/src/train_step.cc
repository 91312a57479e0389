#include "rlpar/train_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlpar/optim.h"

namespace rlpar::train {

namespace {

// The columns `cols` of a [rows, N, item] array, as [rows, M, item] in `dst`.
void gather(const void* src, int64_t rows, int64_t N, int64_t item_bytes, const int64_t* cols,
            int64_t M, std::vector<char>& dst) {
  dst.resize(static_cast<size_t>(rows * M * item_bytes));
  const char* s = static_cast<const char*>(src);
  char* d = dst.data();
  for (int64_t r = 0; r < rows; ++r) {
    const char* row = s + r * N * item_bytes;
    for (int64_t j = 0; j < M; ++j, d += item_bytes) {
      std::memcpy(d, row + cols[j] * item_bytes, static_cast<size_t>(item_bytes));
    }
  }
}

// The bound penalty of LossSpec on the means in out [T+1, M, O], added to dout; returns the loss.
// The same sums as agents' bound_penalty: per element in double, the gradient cast to float.
double add_bound_penalty(const LossSpec& loss, const float* out, const uint8_t* mask, int64_t T,
                         int64_t M, int64_t O, float* dout) {
  const losses::ActorCriticArgs& a = loss.layout();
  int64_t valid = 0;
  for (int64_t i = 0; i < T * M; ++i) valid += mask[i] != 0;
  const double denom = valid > 0 ? static_cast<double>(valid) : 1.0;
  const double scale = 2.0 * loss.bound_cost / denom;
  double sum = 0.0;
  for (int64_t i = 0; i < T * M; ++i) {
    if (!mask[i]) continue;
    for (int64_t k = 0; k < a.num_actions; ++k) {
      const double centre = (loss.high[k] + loss.low[k]) / 2;
      const double half = (loss.high[k] - loss.low[k]) / 2;
      const double offset = static_cast<double>(out[i * O + a.policy_begin + k]) - centre;
      const double excess = std::max(std::fabs(offset) - half, 0.0);
      if (excess == 0.0) continue;
      sum += excess * excess;
      const double sign = offset > 0 ? 1.0 : -1.0;
      dout[i * O + a.policy_begin + k] += static_cast<float>(scale * excess * sign);
    }
  }
  return loss.bound_cost * sum / denom;
}

void optimizer_step(const OptimStep& o, float* p, const float* g, size_t n) {
  switch (o.kind) {
    case OptimKind::Sgd:
      optim::sgd_step(p, g, o.buf0, n, o.lr, o.momentum, o.weight_decay, o.nesterov);
      return;
    case OptimKind::RmsProp:
      optim::rmsprop_step(p, g, o.buf0, o.buf1, o.buf2, n, o.lr, o.alpha, o.eps, o.momentum,
                          o.weight_decay);
      return;
    case OptimKind::Adam:
      optim::adam_step(p, g, o.buf0, o.buf1, n, o.step, o.lr, o.beta1, o.beta2, o.eps,
                       o.weight_decay);
      return;
  }
}

// Per thread, so that steady-state steps allocate nothing (the net's workspaces are pooled too).
struct Scratch {
  std::vector<char> obs, actions, behaviour, rewards, terminated, truncated, mask, state;
  std::vector<uint8_t> resets;
  std::vector<float> out, dout;
};

}  // namespace

StepResult train_step(const Net& net, float* params, float* grad, const BatchView& b,
                      const int64_t* cols, int64_t M, const LossSpec& loss, double max_grad_norm,
                      const OptimStep& optim, ThreadPool* pool) {
  const int64_t T = b.T, N = b.N, O = net.output_size();
  if (T < 1 || N < 1) {
    throw std::invalid_argument("train_step: expected a batch with T, N >= 1, got T = " +
                                std::to_string(T) + ", N = " + std::to_string(N));
  }
  if (cols == nullptr) M = N;
  if (M < 1) throw std::invalid_argument("train_step: expected at least one column, got none");
  if (!(max_grad_norm > 0)) {
    throw std::invalid_argument("max_grad_norm must be > 0, got " + std::to_string(max_grad_norm));
  }
  if (cols != nullptr) {
    for (int64_t j = 0; j < M; ++j) {
      if (cols[j] < 0 || cols[j] >= N) {
        throw std::invalid_argument("train_step: column " + std::to_string(cols[j]) +
                                    " is outside the batch's " + std::to_string(N) + " columns");
      }
    }
  }
  if (loss.bound_cost > 0 && (loss.low == nullptr || loss.high == nullptr)) {
    throw std::invalid_argument("train_step: a bound penalty needs the action bounds");
  }
  const losses::ActorCriticArgs& layout = loss.layout();
  const bool gaussian = layout.policy == losses::Policy::Gaussian;
  const int64_t obs_bytes = net.input_size() * (net.spec().input_uint8 ? 1 : 4);
  const int64_t action_bytes = gaussian ? 4 * layout.num_actions
                               : layout.policy == losses::Policy::MultiCategorical
                                   ? 8 * static_cast<int64_t>(layout.action_dims.size())
                                   : 8;
  const int64_t S = net.state_size();

  thread_local Scratch sc;
  BatchView v = b;  // the step's columns, gathered when they are not all of them in order
  if (cols != nullptr) {
    gather(b.obs, T + 1, N, obs_bytes, cols, M, sc.obs);
    gather(b.actions, T, N, action_bytes, cols, M, sc.actions);
    gather(b.behaviour, T, N, 4 * O, cols, M, sc.behaviour);
    gather(b.rewards, T, N, 4, cols, M, sc.rewards);
    gather(b.terminated, T, N, 1, cols, M, sc.terminated);
    gather(b.truncated, T, N, 1, cols, M, sc.truncated);
    gather(b.mask, T, N, 1, cols, M, sc.mask);
    v.obs = sc.obs.data();
    v.actions = sc.actions.data();
    v.behaviour = reinterpret_cast<const float*>(sc.behaviour.data());
    v.rewards = reinterpret_cast<const float*>(sc.rewards.data());
    v.terminated = reinterpret_cast<const uint8_t*>(sc.terminated.data());
    v.truncated = reinterpret_cast<const uint8_t*>(sc.truncated.data());
    v.mask = reinterpret_cast<const uint8_t*>(sc.mask.data());
    if (S > 0) {
      gather(b.core_state, 1, N, 4 * S, cols, M, sc.state);
      v.core_state = reinterpret_cast<const float*>(sc.state.data());
    }
  }
  v.N = M;

  SeqArgs seq;
  seq.steps = T + 1;
  seq.seqs = M;
  if (S > 0) {
    if (v.core_state == nullptr) {
      throw std::invalid_argument("train_step: this net has an LSTM core: the batch needs its core_state");
    }
    // Where an episode starts inside the unroll (rlpar.episode_starts): after an autoreset step.
    sc.resets.assign(static_cast<size_t>((T + 1) * M), 0);
    for (int64_t i = 0; i < T * M; ++i) sc.resets[M + i] = v.mask[i] ? 0 : 1;
    seq.state0 = v.core_state;
    seq.resets = sc.resets.data();
  }

  sc.out.resize(static_cast<size_t>((T + 1) * M * O));
  sc.dout.resize(sc.out.size());
  auto tape = net.forward_train_seq(params, v.obs, seq, sc.out.data(), pool);

  StepResult r;
  LossSpec l = loss;  // its T, N, O are this step's
  losses::ActorCriticArgs* dims = l.kind == LossKind::Ppo ? &l.ppo.base : &l.actor_critic;
  dims->T = T;
  dims->N = M;
  dims->O = O;
  const float* op = sc.out.data();
  float* dp = sc.dout.data();
  double* total = nullptr;
  if (l.kind == LossKind::Ppo) {
    r.ppo = losses::ppo_loss(l.ppo, op, v.behaviour, v.actions, v.rewards, v.terminated,
                             v.truncated, v.mask, dp);
    total = &r.ppo.loss;
  } else {
    r.actor_critic = losses::actor_critic_loss(l.actor_critic, op, v.behaviour, v.actions,
                                               v.rewards, v.terminated, v.truncated, v.mask, dp);
    total = &r.actor_critic.loss;
  }
  if (loss.bound_cost > 0 && gaussian) {
    r.bound_loss = add_bound_penalty(loss, op, v.mask, T, M, O, dp);
    *total += r.bound_loss;
  }

  net.backward(params, *tape, dp, grad, /*accumulate=*/false, pool);
  tape.reset();  // the workspace goes back before the optimizer's pass
  const auto n = static_cast<size_t>(net.num_params());
  r.grad_norm = optim::clip_by_global_norm(grad, n, max_grad_norm);
  if (std::isfinite(r.grad_norm)) {
    optimizer_step(optim, params, grad, n);
    r.applied = true;
  }
  return r;
}

}  // namespace rlpar::train
