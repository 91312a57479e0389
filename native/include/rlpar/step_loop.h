// rlpar/step_loop.h — an actor's step loop over envs that step elsewhere, one call per env step.
//
// The fused loop (rlpar/unroll.h) owns its envs. A Python vector env steps in Python, so its
// actor calls in between two env steps instead; a `StepLoop` keeps the unroll bound across those
// calls and runs the unroll's body in pieces (begin_core, act_rows, record_rows):
//
//     rlpar::StepLoop loop(net, K, &sampler);
//     loop.begin(bind);                  // the rollout's arrays, the episodes carried, params
//     loop.act(0, &first_obs);           // obs[0] stored; behaviour[0], actions[0]
//     for t in 1 .. T-1:
//         (the caller steps its envs with actions[t - 1])
//         loop.step(t, results);         // rewards / terminated / truncated[t - 1] and obs[t]
//                                        // stored, episodes carried; then act step t
//     (the caller steps its envs with actions[T - 1])
//     loop.record(T - 1, results);       // the last step's results, obs[T]
//     auto [episodes, seconds] = loop.end();   // unbinds; the episodes that ended, in order
//
// Each call may work on envs [begin, end) of the K only. An actor whose envs step in its own
// thread double-buffers with them: `act` and `step` with side = true run the forward and the
// draw of one half on the loop's side thread (rlpar/side_worker.h) and return at once, so the
// caller steps the other half meanwhile. Every call first waits for the act in flight, so acts
// run one at a time, in the order they were asked for: the same draws in the same order as
// without side = true, and the same rollout bit for bit.
//
// The caller brings the envs' data through a `StepInput`, which the loop asks to write into the
// rollout's rows once it may (after the act in flight, after the checks), and may take part in
// the loop's waits and forwards through `StepLoopHooks` (a Python binding lets go of its lock
// there). One loop per actor thread: a second call while one is running, from another thread or
// from inside a hook, throws std::invalid_argument instead of racing on the arrays. Misuse (no
// unroll bound, a step or an env range out of bounds, a second begin) throws
// std::invalid_argument before anything is written; what act_rows throws (a diverged net) comes
// from the call that ran the act, or from the next call for an act on the side thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "rlpar/net.h"
#include "rlpar/side_worker.h"
#include "rlpar/unroll.h"

namespace rlpar {

// One call's data from the envs, written by the caller into the rows the loop points it to:
// the `rows` = end - begin envs of the call, in order.
class StepInput {
 public:
  virtual ~StepInput() = default;
  // dst: [rows, *input_shape] of the net's input dtype (uint8_t if spec.input_uint8, else float).
  virtual void write_obs(void* dst, int64_t rows) = 0;
  // The step's rewards, terminated and truncated, [rows] each. Returns the env's own rewards in
  // double ([rows], alive until the call returns) when it has them, so that the episodes' returns
  // add those rather than their float32 roundings; else null.
  virtual const double* write_results(float* rewards, bool* terminated, bool* truncated,
                                      int64_t rows) = 0;
};

// What a caller may do around the loop's work in its thread (the defaults just run it).
class StepLoopHooks {
 public:
  virtual ~StepLoopHooks() = default;
  // Runs `act`: the forward (and draw) of `rows` envs in the calling thread.
  virtual void run_act(int64_t rows, const std::function<void()>& act) {
    (void)rows;
    act();
  }
  // Runs `wait`, which blocks until the act on the side thread has finished.
  virtual void block(const std::function<void()>& wait) { wait(); }
  // The loop no longer points into the unroll's memory (end): what kept it alive may go.
  virtual void unbound() {}
};

// One unroll's memory, bound by begin until end.
struct StepUnroll {
  // steps = T, obs, rewards, terminated, truncated, mask, behaviour; actions with a sampler;
  // state, starts and core_state for a recurrent net (state and core_state must not overlap).
  UnrollArrays arrays;
  EpisodeCarry carry;                 // [K] each, read and updated
  const float* params = nullptr;      // [net.num_params()], unchanged until end
  std::shared_ptr<const void> owner;  // the params' snapshot store (Net::core_weights), or null
  uint64_t version = 0;               // the params' snapshot version (0: none)
};

struct StepLoopEnd {
  std::vector<EpisodeEnd> episodes;  // each episode that ended, in step then env order
  double seconds = 0;                // spent inside the loop's calls since begin, waits included
};

class StepLoop {
 public:
  // sampler: draws actions[t] from the net's one Categorical head (categorical_logits), or null
  // (the caller writes actions[t] after each act). hooks: null for the defaults. Neither is
  // owned; both must outlive the loop.
  StepLoop(std::shared_ptr<const Net> net, int64_t num_envs, CategoricalSampler* sampler,
           StepLoopHooks* hooks = nullptr);
  ~StepLoop();  // waits for an act in flight
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // Binds the unroll that `bind` returns (called once the act in flight, if any, has finished
  // and the previous unroll was ended) and starts a recurrent core (begin_core). Returns its
  // version.
  uint64_t begin(const std::function<StepUnroll()>& bind);
  // Stores obs[t] of envs [begin, end) (end < 0: K) from `obs` (null: already stored) and acts
  // step t on them; with `side`, on the side thread (can_act_async), returning at once.
  void act(int64_t t, StepInput* obs, int64_t begin = 0, int64_t end = -1, bool side = false);
  // Records step t: the envs' results and obs[t + 1], then carries their episodes.
  void record(int64_t t, StepInput& in, int64_t begin = 0, int64_t end = -1);
  // record(t - 1, in) then act(t): one call between two env steps, t in [1, T - 1].
  void step(int64_t t, StepInput& in, int64_t begin = 0, int64_t end = -1, bool side = false);
  // Waits for the act in flight, if any, and rethrows its error.
  void wait();
  // Unbinds the unroll, after the act in flight (unbound even if that act threw, which then
  // comes from here).
  StepLoopEnd end();

  // Whether acts can run on the side thread: a sampler draws the actions, and the net has no
  // external layer (one that must run in the caller's thread).
  bool can_act_async() const { return sampler_ != nullptr && !net_->has_external(); }
  bool bound() const { return bound_; }
  int64_t num_envs() const { return k_; }
  const Net& net() const { return *net_; }
  // Acts submitted to the side thread, and those of them the calling thread ran itself because
  // the side thread had not started them.
  uint64_t side_submitted() const { return side_ ? side_->submitted() : 0; }
  uint64_t side_stolen() const { return side_ ? side_->stolen() : 0; }

 private:
  class Call;  // one call at a time; counts its time

  void finish_pending();
  void unbind();
  std::pair<int64_t, int64_t> cols(int64_t begin, int64_t end) const;
  void check_side() const;
  void* obs_rows(int64_t t, int64_t begin) const;
  void run_act(int64_t t, int64_t b, int64_t e);
  void submit_act(int64_t t, int64_t b, int64_t e);
  void run_record(int64_t t, int64_t b, int64_t e, StepInput& in);
  const PackedCore* packed();

  std::shared_ptr<const Net> net_;
  int64_t k_;
  CategoricalSampler* sampler_;
  StepLoopHooks* hooks_;
  LogitsSlice logits_;
  // The bound unroll.
  bool bound_ = false;
  StepUnroll u_;
  std::shared_ptr<const PackedCore> packed_;
  std::vector<EpisodeEnd> ends_;
  int64_t busy_ns_ = 0;
  std::atomic<bool> busy_{false};
  bool in_flight_ = false;  // an act submitted to side_ and not waited for
  // Last, so that it is destroyed first: its destructor waits for an act in flight, which uses
  // the members above.
  std::unique_ptr<SideWorker> side_;
};

}  // namespace rlpar
