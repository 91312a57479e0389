// rlpar/train_step.h — one optimizer step of a built-in loss as one native call.
//
// A learner step of the built-in agents is a chain of native pieces: gather the minibatch's
// columns, forward the unroll (Net::forward_train_seq), the loss and its output gradient
// (losses.h), the gradient (Net::backward), clip its global norm, the optimizer (optim.h).
// `train_step` runs the chain in one call, so a binding releases the GIL once per optimizer step
// instead of once per piece, and holds it only to check the arguments and return the metrics:
//
//   cols    = columns of the batch this step reads (all of them when null)
//   out     = net(obs[:, cols])                      [T+1, M, O], from core_state[cols]
//   dout    = d loss / d out                         (actor_critic_loss or ppo_loss)
//           + bound penalty                          (a Gaussian policy's mean beyond its bounds)
//   grad    = backward(dout);  norm = |grad|;  grad *= min(1, max_norm / norm)
//   params  = optimizer(params, grad)                only when norm is finite
//
// The pieces are the same functions as the separate calls, in the same order, so a step is the
// same bit for bit as the chain the Python side would run. Nothing here is shared between calls
// but the net (const) and the caller's buffers: concurrent calls on distinct params, grads and
// optimizer buffers are safe.
#pragma once

#include <cstdint>

#include "rlpar/losses.h"
#include "rlpar/net.h"

namespace rlpar::train {

// A batch of N columns [T, N, ...] (time-major, C-contiguous), as rlpar.Batch holds it.
struct BatchView {
  int64_t T = 0, N = 0;
  const void* obs = nullptr;         // [T+1, N, *input_shape], float32 or uint8 (the net's)
  const float* behaviour = nullptr;  // [T, N, O]
  const void* actions = nullptr;     // int64 [T, N] (categorical) or float32 [T, N, A]
  const float* rewards = nullptr;    // [T, N], as the loss sees them
  const uint8_t* terminated = nullptr;
  const uint8_t* truncated = nullptr;
  const uint8_t* mask = nullptr;
  const float* core_state = nullptr;  // [N, state_size]; recurrent nets only
};

enum class LossKind { ActorCritic, Ppo };

// The loss: its args' T, N and O are set by train_step from the batch and the columns.
struct LossSpec {
  LossKind kind = LossKind::ActorCritic;
  losses::ActorCriticArgs actor_critic;  // kind ActorCritic
  losses::PpoArgs ppo;                   // kind Ppo (its base holds the layout)
  // A Gaussian policy with bounded actions: cost * sum_a max(0, |mean_a - centre_a| -
  // half_a)^2 per valid step t < T, averaged over the valid steps; 0 or null bounds: none.
  double bound_cost = 0.0;
  const double* low = nullptr;   // [A]
  const double* high = nullptr;  // [A]
  const losses::ActorCriticArgs& layout() const {
    return kind == LossKind::Ppo ? ppo.base : actor_critic;
  }
};

enum class OptimKind { Sgd, RmsProp, Adam };

// One optimizer's step (optim.h): the update rule, its hyper-parameters and state buffers.
struct OptimStep {
  OptimKind kind = OptimKind::Adam;
  float lr = 0;
  float beta1 = 0.9f, beta2 = 0.999f;    // Adam
  float alpha = 0.99f;                   // RMSProp
  float momentum = 0;                    // SGD, RMSProp
  float eps = 1e-8f;                     // Adam, RMSProp
  float weight_decay = 0;
  bool nesterov = false;                 // SGD
  int64_t step = 1;                      // Adam: this step's count (>= 1)
  float* buf0 = nullptr;  // Adam exp_avg, RMSProp square_avg, SGD momentum_buffer (nullable)
  float* buf1 = nullptr;  // Adam exp_avg_sq, RMSProp grad_avg (nullable: not centered)
  float* buf2 = nullptr;  // RMSProp momentum_buffer (nullable)
};

struct StepResult {
  losses::ActorCriticMetrics actor_critic;  // kind ActorCritic
  losses::PpoMetrics ppo;                   // kind Ppo
  double bound_loss = 0.0;                  // added into the loss metric too
  double grad_norm = 0.0;                   // before clipping; NaN or inf: no step was taken
  bool applied = false;                     // the optimizer step was taken
};

// The step on columns `cols` [M] of `batch` (null: all N in order). `grad` [num_params] is
// overwritten with the clipped gradient; `params` is updated in place when the norm is finite.
// `pool` (nullable): the forward's and backward's torso rows on its threads (net.h).
// Throws std::invalid_argument for a column outside [0, N), M < 1, or what the pieces refuse;
// nothing is written to params or the optimizer's buffers then.
StepResult train_step(const Net& net, float* params, float* grad, const BatchView& batch,
                      const int64_t* cols, int64_t M, const LossSpec& loss, double max_grad_norm,
                      const OptimStep& optim, ThreadPool* pool = nullptr);

}  // namespace rlpar::train
