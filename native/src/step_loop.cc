// The step loop: see rlpar/step_loop.h.
#include "rlpar/step_loop.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include "rlpar/one_call.h"

namespace rlpar {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void check_step(int64_t t, int64_t last, const char* what) {
  if (t < 0 || t > last) {
    throw std::invalid_argument(std::string(what) + ": t must be in [0, " + std::to_string(last) +
                                "], got " + std::to_string(t));
  }
}

StepLoopHooks& default_hooks() {
  static StepLoopHooks hooks;
  return hooks;
}

}  // namespace

// One call at a time: a loop used from two threads at once would race on its arrays.
class StepLoop::Call : public OneCall {
 public:
  explicit Call(StepLoop& loop)
      : OneCall(loop.busy_, [] {
          return std::invalid_argument(
              "StepLoop: a call is already in progress (one loop per actor thread, no re-entry)");
        }) {}
};

StepLoop::StepLoop(std::shared_ptr<const Net> net, int64_t num_envs, CategoricalSampler* sampler,
                   StepLoopHooks* hooks)
    : net_(std::move(net)),
      k_(num_envs),
      sampler_(sampler),
      hooks_(hooks != nullptr ? hooks : &default_hooks()) {
  if (!net_) throw std::invalid_argument("StepLoop: net must not be null");
  if (k_ < 1) throw std::invalid_argument("num_envs must be >= 1, got " + std::to_string(k_));
  if (sampler_ != nullptr) logits_ = categorical_logits(*net_);
}

StepLoop::~StepLoop() = default;

uint64_t StepLoop::begin(const std::function<StepUnroll()>& bind) {
  const Call call(*this);
  finish_pending();
  if (bound_) throw std::invalid_argument("begin: the previous unroll was not ended (call end())");
  StepUnroll u = bind();
  const UnrollArrays& a = u.arrays;
  if (a.steps < 1) {
    throw std::invalid_argument("the rollout needs at least 1 step, got " +
                                std::to_string(a.steps));
  }
  if (net_->recurrent()) {
    const int64_t s = net_->state_size();
    if (a.state == nullptr || a.starts == nullptr || a.core_state == nullptr) {
      throw std::invalid_argument("the net has an LSTM core: begin needs state float32 [K, " +
                                  std::to_string(s) + "] and starts bool [K]");
    }
    if (a.core_state < a.state + k_ * s && a.state < a.core_state + k_ * s) {
      throw std::invalid_argument("rollout.core_state and state must not share memory");
    }
    begin_core(a, k_, s);
  }
  u_ = std::move(u);
  ends_.clear();
  busy_ns_ = 0;
  packed_.reset();
  bound_ = true;
  return u_.version;
}

void StepLoop::act(int64_t t, StepInput* obs, int64_t begin, int64_t end, bool side) {
  const Call call(*this);
  const int64_t t0 = now_ns();
  finish_pending();
  const auto [b, e] = cols(begin, end);
  check_step(t, u_.arrays.steps - 1, side ? "act_async" : "act");
  if (side) check_side();
  if (obs != nullptr) obs->write_obs(obs_rows(t, b), e - b);
  side ? submit_act(t, b, e) : run_act(t, b, e);
  busy_ns_ += now_ns() - t0;
}

void StepLoop::record(int64_t t, StepInput& in, int64_t begin, int64_t end) {
  const Call call(*this);
  const int64_t t0 = now_ns();
  finish_pending();
  const auto [b, e] = cols(begin, end);
  check_step(t, u_.arrays.steps - 1, "record");
  run_record(t, b, e, in);
  busy_ns_ += now_ns() - t0;
}

void StepLoop::step(int64_t t, StepInput& in, int64_t begin, int64_t end, bool side) {
  const Call call(*this);
  const int64_t t0 = now_ns();
  finish_pending();
  const auto [b, e] = cols(begin, end);
  const int64_t steps = u_.arrays.steps;
  if (t < 1 || t >= steps) {
    throw std::invalid_argument(std::string(side ? "step_async" : "step") + ": t must be in [1, " +
                                std::to_string(steps - 1) + "], got " + std::to_string(t) +
                                " (act(0, obs) starts an unroll)");
  }
  if (side) check_side();
  run_record(t - 1, b, e, in);
  side ? submit_act(t, b, e) : run_act(t, b, e);
  busy_ns_ += now_ns() - t0;
}

void StepLoop::wait() {
  const Call call(*this);
  const int64_t t0 = now_ns();
  finish_pending();
  busy_ns_ += now_ns() - t0;
}

StepLoopEnd StepLoop::end() {
  const Call call(*this);
  const int64_t t0 = now_ns();
  try {
    finish_pending();
  } catch (...) {
    busy_ns_ += now_ns() - t0;
    unbind();
    throw;
  }
  busy_ns_ += now_ns() - t0;
  StepLoopEnd out;
  out.episodes = std::move(ends_);
  out.seconds = static_cast<double>(busy_ns_) * 1e-9;
  unbind();
  return out;
}

void StepLoop::unbind() {
  ends_.clear();
  packed_.reset();
  u_ = StepUnroll{};
  bound_ = false;
  hooks_->unbound();
}

// Waits for the act in flight and rethrows its error; through the hooks only when it has not
// finished yet (a caller that lets go of a lock to wait then does so only when it must).
void StepLoop::finish_pending() {
  if (!in_flight_) return;
  in_flight_ = false;
  if (side_->pending()) {
    hooks_->block([this] { side_->wait(); });
  } else {
    side_->wait();
  }
}

std::pair<int64_t, int64_t> StepLoop::cols(int64_t begin, int64_t end) const {
  if (!bound_) throw std::invalid_argument("no unroll is bound: call begin() first");
  if (end < 0) end = k_;
  if (begin < 0 || begin >= end || end > k_) {
    throw std::invalid_argument("envs [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") are not a non-empty range of the " + std::to_string(k_));
  }
  return {begin, end};
}

void StepLoop::check_side() const {
  if (!can_act_async()) {
    throw std::invalid_argument(
        "act_async / step_async: acts run on the side thread only with a native sampler and a "
        "net without Python layers");
  }
}

void* StepLoop::obs_rows(int64_t t, int64_t begin) const {
  const int64_t first = (t * k_ + begin) * net_->input_size();
  if (net_->spec().input_uint8) return static_cast<uint8_t*>(u_.arrays.obs) + first;
  return static_cast<float*>(u_.arrays.obs) + first;
}

// The bf16x3 core's packed weights, once per unroll (shared between loops on one snapshot).
const PackedCore* StepLoop::packed() {
  if (!packed_) packed_ = net_->core_weights(u_.params, u_.owner, u_.version, true);
  return packed_.get();
}

void StepLoop::run_act(int64_t t, int64_t b, int64_t e) {
  // Two pointers captured: small enough for std::function to hold without an allocation.
  const int64_t step[3] = {t, b, e};
  hooks_->run_act(e - b, [this, &step] {
    const PackedCore* packed_core = packed();
    act_rows(*net_, u_.params, u_.arrays, k_, step[0], step[1], step[2], sampler_, logits_,
             packed_core);
  });
}

// Runs act_rows for step t on envs [b, e) on the side thread. The arrays, the parameters and the
// packed weights stay bound until end, which waits for it first.
void StepLoop::submit_act(int64_t t, int64_t b, int64_t e) {
  const PackedCore* packed_core = packed();
  if (!side_) side_ = std::make_unique<SideWorker>();
  side_->submit([this, packed_core, t, b, e] {
    act_rows(*net_, u_.params, u_.arrays, k_, t, b, e, sampler_, logits_, packed_core);
  });
  in_flight_ = true;
}

void StepLoop::run_record(int64_t t, int64_t b, int64_t e, StepInput& in) {
  const int64_t first = t * k_ + b;
  const UnrollArrays& a = u_.arrays;
  const double* raw =
      in.write_results(a.rewards + first, a.terminated + first, a.truncated + first, e - b);
  in.write_obs(obs_rows(t + 1, b), e - b);
  record_rows(a, k_, t, b, e, u_.carry, net_->recurrent() ? a.starts : nullptr, ends_, raw);
}

}  // namespace rlpar
