// rlpar/unroll.h — the fused actor loop: one whole unroll over K native envs in one call.
//
// What an rlpar actor does in Python (rlpar/runtime/actor.py), fused into one native loop that
// needs no GIL (unless the net has Python layers):
//
//     obs[0] = envs' current observations
//     (recurrent net) state[starts] = 0; starts = false; core_state = state
//     for t in 0 .. T-1:
//         behaviour[t] = net.forward(params, obs[t])              // [K, output_size]
//                        (recurrent net: from `state` with resets = starts; state advances)
//         actions[t]   = sampler.sample(logits of behaviour[t])   // [K]
//         mask[t]      = !(episode ended at step t - 1)           // False on autoreset steps
//         obs[t + 1], rewards[t], terminated[t], truncated[t] = envs.step(actions[t])
//         episode bookkeeping (returns and lengths count only steps where mask is true)
//         (recurrent net) starts = !mask[t]   // obs[t + 1] begins an episode: reset there
//
// The arrays are those of rlpar.runtime.rollout.Rollout, written in place, with the same meaning
// and invariants as the Python path. `params` must stay unchanged for the whole call (a pinned
// snapshot): one policy version per unroll.
//
//     rlpar::CategoricalSampler sampler(seed);   // one per actor thread
//     rlpar::UnrollArrays a{T, obs, actions, rewards, terminated, truncated, mask, behaviour};
//     auto ends = rlpar::unroll(net, pin.data(), envs, sampler, a, ep_return, ep_length);
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "rlpar/envs.h"
#include "rlpar/net.h"
#include "rlpar/rng.h"

namespace rlpar {

// Draws one action per row from categorical logits, with its own generator. Algorithm (fixed, so
// rollouts are reproducible from the seed): m = max logit; w_i = exp(l_i - m) in double;
// u = rng.uniform(); the action is the first i with w_0 + ... + w_i > u * sum(w) (the last
// i with w_i > 0 if rounding leaves none). One uniform draw per row, rows in order.
class CategoricalSampler {
 public:
  explicit CategoricalSampler(std::uint64_t seed = 0) : rng_(seed) {}

  // logits: `batch` rows of `stride` floats, the n logits of each starting at column `offset`;
  // actions: [batch]. A -inf logit is an action never taken; a row with NaN or +inf, or all
  // -inf, throws std::invalid_argument (a NaN would otherwise silently pick the last action).
  void sample(const float* logits, int64_t batch, int64_t stride, int64_t offset, int64_t n,
              int64_t* actions);

  Rng& rng() { return rng_; }
  const Rng& rng() const { return rng_; }

 private:
  Rng rng_;
};

// The rollout arrays of one unroll of T steps over K = envs.num_envs() envs, all C-contiguous.
struct UnrollArrays {
  int64_t steps = 0;            // T >= 1
  void* obs = nullptr;          // [T + 1, K, *obs_shape], the env's dtype
  int64_t* actions = nullptr;   // [T, K]
  float* rewards = nullptr;     // [T, K]
  bool* terminated = nullptr;   // [T, K]
  bool* truncated = nullptr;    // [T, K]
  bool* mask = nullptr;         // [T, K]
  float* behaviour = nullptr;   // [T, K, net.output_size()]
  // A recurrent net's core (rlpar/lstm.h), the same conventions as rlpar/runtime/recurrent.py;
  // all three are required for a recurrent net and ignored for a feed-forward one.
  float* state = nullptr;       // [K, net.state_size()] the actor's carried state (read, updated)
  bool* starts = nullptr;       // [K] the next observation begins an episode (read, updated)
  float* core_state = nullptr;  // [K, net.state_size()] written: the state fed into step 0
};

// An episode that ended during the unroll: its return and length count the steps where mask was
// true (the autoreset step that began it is not one).
struct EpisodeEnd {
  int64_t env = 0;
  int64_t step = 0;  // t at which it ended
  double ret = 0;
  int64_t length = 0;
};

// The net must have exactly one Categorical head with envs.spec().num_actions logits, and take
// the env's observations (same number of elements, uint8 input iff the env's frames are uint8);
// a recurrent net also needs arrays.state, starts and core_state.
// ep_return, ep_length: [K] the episodes in progress (read and updated). Throws
// std::invalid_argument on a mismatch, before any env moves; logits that cannot be sampled (a
// diverged net) throw from the step where they appear, with the arrays filled up to it.
// packed_core: a bf16x3 core's weights packed from `params` (Net::core_weights); null: packed
// here, once for the unroll.
std::vector<EpisodeEnd> unroll(const Net& net, const float* params, VecEnv& envs,
                               CategoricalSampler& sampler, const UnrollArrays& arrays,
                               double* ep_return, int64_t* ep_length,
                               const PackedCore* packed_core = nullptr);

// ---------------------------------------------------------------------------------------------
// The actor's whole loop, many unrolls in one call: what rlpar/runtime/actor.py does per rollout
// (take a free buffer, pin the latest snapshot, unroll, hand the buffer to the learner), with no
// Python between two rollouts. The buffers travel as tickets through two TicketQueues: `free`
// holds the indices of the buffers the learner gave back; a filled buffer i goes to `out` as
// out_ticket.
//
//     rlpar::LoopCarry carry{ep_return, ep_length, prev_done, obs};
//     int64_t seq = 0;
//     auto r = rlpar::unroll_loop(net, store, envs, sampler, free, out, buffers, carry, seq, 0.05);
//     // r.rollouts buffers were filled and queued; r.ends their episodes, in order
class SnapshotStore;
class TicketQueue;

struct LoopBuffer {
  UnrollArrays arrays;     // its state / starts are the actor's carried core (LoopCarry's)
  int64_t out_ticket = 0;  // what goes to `out` once it is filled
  int64_t* stamp = nullptr;  // [2] written before it goes: the snapshot's version, the seq
};

// What the actor carries from one unroll to the next besides the envs: ep_return / ep_length
// as for unroll; after each unroll prev_done [K] (the last step ended an episode) and obs
// [K, *obs_shape] (the next step's input, the env's dtype) are written, for checkpoints.
struct LoopCarry {
  double* ep_return = nullptr;
  int64_t* ep_length = nullptr;
  bool* prev_done = nullptr;
  void* obs = nullptr;
};

struct LoopResult {
  int64_t rollouts = 0;           // buffers filled and queued in `out`
  std::vector<EpisodeEnd> ends;   // the episodes that ended, in order
  double wait_s = 0;              // time spent waiting for a free buffer
};

// Unrolls into free buffers until `budget_s` seconds have passed (checked between unrolls, so
// the call can run over by one unroll) or no buffer came free within what is left of it. Each
// unroll pins the store's latest snapshot for its whole length. `seq` counts the rollouts
// (written into each stamp, then incremented). Throws std::invalid_argument for a ticket that
// names no buffer, std::logic_error when `out` is full (it must hold every buffer), and what
// unroll throws (the buffer it was filling is then not queued).
LoopResult unroll_loop(const Net& net, const std::shared_ptr<const SnapshotStore>& store,
                       VecEnv& envs, CategoricalSampler& sampler, TicketQueue& free,
                       TicketQueue& out, const std::vector<LoopBuffer>& buffers,
                       const LoopCarry& carry, int64_t& seq, double budget_s);

// The column range of the net's categorical logits, checked against the env (see unroll).
struct LogitsSlice {
  int64_t offset = 0;
  int64_t size = 0;
};
LogitsSlice check_unroll_net(const Net& net, const VecEnv& envs);

// The net's one Categorical head (invalid_argument unless it has exactly one).
LogitsSlice categorical_logits(const Net& net);

// ---------------------------------------------------------------------------------------------
// The unroll's body in pieces, for an actor whose envs step elsewhere (a Python vector env): the
// fused loop above is begin_core, then per step act_rows, envs.step, record_rows. Each piece
// works on the envs [begin, end) of the K in `a` (double buffering acts on one half while the
// other steps); rows are those of UnrollArrays.

// The episodes an actor carries from step to step and unroll to unroll, [K] each, updated.
struct EpisodeCarry {
  bool* prev_done = nullptr;  // the env's last step ended an episode: its next is the reset step
  double* ep_return = nullptr;
  int64_t* ep_length = nullptr;
};

// A recurrent net's unroll start: the state of envs whose next observation begins an episode is
// zeroed, starts cleared, and the state copied to core_state (what the learner re-runs from).
void begin_core(const UnrollArrays& a, int64_t num_envs, int64_t state_size);

// Act step t: behaviour[t, begin:end] = net(obs[t, begin:end]) (a recurrent net from the carried
// state, reset where starts is set; the state advances one step), then, with a sampler, draw
// actions[t, begin:end] from `logits` of it (rows in order). a.obs is the net's input dtype.
void act_rows(const Net& net, const float* params, const UnrollArrays& a, int64_t num_envs,
              int64_t t, int64_t begin, int64_t end, CategoricalSampler* sampler,
              const LogitsSlice& logits, const PackedCore* packed_core);

// Record step t, once rewards, terminated and truncated [t, begin:end] hold the envs' results:
// mask[t] = !prev_done, the valid steps added to their episodes, each episode that ended
// appended to `ends` (env order) and restarted, prev_done updated, and for a recurrent net
// (`starts` not null) starts = !mask[t] (the next observation begins an episode).
// raw_rewards: [end - begin] the env's rewards in double, when it gave doubles (the episode
// returns then add those, not their float32 roundings); null: rewards[t] is added.
void record_rows(const UnrollArrays& a, int64_t num_envs, int64_t t, int64_t begin, int64_t end,
                 const EpisodeCarry& carry, bool* starts, std::vector<EpisodeEnd>& ends,
                 const double* raw_rewards = nullptr);

}  // namespace rlpar
