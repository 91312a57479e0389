// StepLoop (rlpar/step_loop.h), the actor's loop over envs that step elsewhere, under threads
// (run under ThreadSanitizer by ctest). Actors double-buffer: each half's act runs on the loop's
// side thread while the actor steps the other half's envs, reading the actions the side thread
// just drew; several such actors share one Net and one parameter vector at once. Their rollouts
// and episodes equal, bit for bit, those of the same calls run in the caller's thread, for a
// feed-forward net and for one with an LSTM core. A second call while one is running (from
// another thread, or from inside a hook) is refused; misuse throws std::invalid_argument; an
// act's error on the side thread comes from the next call, and end unbinds all the same.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "rlpar/net.h"
#include "rlpar/step_loop.h"
#include "rlpar/unroll.h"

namespace {

using rlpar::StepLoop;

constexpr int64_t kEnvs = 8;
constexpr int64_t kHalf = kEnvs / 2;
constexpr int64_t kSteps = 16;
constexpr int64_t kObs = 4;
constexpr int kUnrolls = 40;

std::shared_ptr<const rlpar::Net> make_net(bool recurrent) {
  using rlpar::HeadKind;
  using rlpar::LayerSpec;
  rlpar::NetSpec spec;
  spec.input_shape = {kObs};
  spec.layers = {LayerSpec::linear(16), LayerSpec::tanh()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}};
  spec.lstm_hidden = recurrent ? 8 : 0;
  return std::make_shared<const rlpar::Net>(spec);
}

// A toy vector env, deterministic from its seed: each env walks a position by its actions,
// pays a double reward, and ends its episode every few steps (terminated or truncated, then
// autoresets).
class ToyEnvs {
 public:
  explicit ToyEnvs(uint64_t seed) : x_(kEnvs), len_(kEnvs, 0) {
    for (int64_t i = 0; i < kEnvs; ++i) x_[i] = 0.1 * static_cast<double>(seed * 31 + i);
  }
  void obs(int64_t i, float* dst) const {
    for (int64_t j = 0; j < kObs; ++j) dst[j] = static_cast<float>(std::sin(x_[i] + j));
  }
  // Steps env i with `action`: its reward, terminated, truncated.
  void step(int64_t i, int64_t action, double& reward, bool& term, bool& trunc) {
    x_[i] += 0.3 * static_cast<double>(action) - 0.25;
    reward = 0.1 * x_[i] + 1.0 / 3.0;  // not a float32: the episode returns add the doubles
    ++len_[i];
    term = std::fabs(x_[i]) > 1.5;
    trunc = !term && len_[i] >= 11;
    if (term || trunc) {
      x_[i] = 0.05 * static_cast<double>(i);
      len_[i] = 0;
    }
  }

 private:
  std::vector<double> x_;
  std::vector<int64_t> len_;
};

// One call's data for envs [b, e), as a Python env would hand it over.
struct Input : rlpar::StepInput {
  std::vector<float> obs;
  std::vector<double> reward;
  std::vector<char> term, trunc;

  void write_obs(void* dst, int64_t rows) override {
    std::memcpy(dst, obs.data(), static_cast<size_t>(rows * kObs) * sizeof(float));
  }
  const double* write_results(float* rewards, bool* terminated, bool* truncated,
                              int64_t rows) override {
    for (int64_t i = 0; i < rows; ++i) {
      rewards[i] = static_cast<float>(reward[i]);
      terminated[i] = term[i] != 0;
      truncated[i] = trunc[i] != 0;
    }
    return reward.data();
  }
};

struct Rollout {
  std::vector<float> obs, rewards, behaviour, state, core_state;
  std::vector<int64_t> actions, ep_length;
  std::vector<char> term, trunc, mask, starts, prev_done;
  std::vector<double> ep_return;

  explicit Rollout(const rlpar::Net& net)
      : obs((kSteps + 1) * kEnvs * kObs),
        rewards(kSteps * kEnvs),
        behaviour(kSteps * kEnvs * net.output_size()),
        state(kEnvs * net.state_size()),
        core_state(kEnvs * net.state_size()),
        actions(kSteps * kEnvs),
        ep_length(kEnvs),
        term(kSteps * kEnvs),
        trunc(kSteps * kEnvs),
        mask(kSteps * kEnvs),
        starts(kEnvs),
        prev_done(kEnvs),
        ep_return(kEnvs) {}

  rlpar::StepUnroll unroll(const rlpar::Net& net, const float* params) {
    rlpar::StepUnroll u;
    rlpar::UnrollArrays& a = u.arrays;
    a.steps = kSteps;
    a.obs = obs.data();
    a.actions = actions.data();
    a.rewards = rewards.data();
    a.terminated = reinterpret_cast<bool*>(term.data());
    a.truncated = reinterpret_cast<bool*>(trunc.data());
    a.mask = reinterpret_cast<bool*>(mask.data());
    a.behaviour = behaviour.data();
    if (net.recurrent()) {
      a.state = state.data();
      a.starts = reinterpret_cast<bool*>(starts.data());
      a.core_state = core_state.data();
    }
    u.carry.prev_done = reinterpret_cast<bool*>(prev_done.data());
    u.carry.ep_return = ep_return.data();
    u.carry.ep_length = ep_length.data();
    u.params = params;
    return u;
  }
};

// Everything an actor produced over its unrolls. (CHECK is for the main thread: an actor
// thread notes what went wrong in `ok`.)
struct Trace {
  bool ok = true;
  std::vector<int64_t> actions;
  std::vector<float> outputs;
  std::vector<char> flags;
  std::vector<double> episodes;
  bool operator==(const Trace& o) const {
    return actions == o.actions && outputs == o.outputs && flags == o.flags &&
           episodes == o.episodes;
  }
};

// The envs [b, e)'s next step with the actions the loop drew at step t.
void env_step(ToyEnvs& envs, const Rollout& r, int64_t t, int64_t b, int64_t e, Input& in) {
  const int64_t n = e - b;
  in.obs.assign(n * kObs, 0.0f);
  in.reward.assign(n, 0.0);
  in.term.assign(n, 0);
  in.trunc.assign(n, 0);
  for (int64_t i = b; i < e; ++i) {
    bool term = false, trunc = false;
    envs.step(i, r.actions[t * kEnvs + i], in.reward[i - b], term, trunc);
    in.term[i - b] = term;
    in.trunc[i - b] = trunc;
    envs.obs(i, in.obs.data() + (i - b) * kObs);
  }
}

void first_obs(const ToyEnvs& envs, int64_t b, int64_t e, Input& in) {
  in.obs.assign((e - b) * kObs, 0.0f);
  for (int64_t i = b; i < e; ++i) envs.obs(i, in.obs.data() + (i - b) * kObs);
}

// An actor's unrolls, double-buffered as the runtime's sync actor does: while one half's act
// runs (on the side thread when `side`), the actor steps the other half's envs.
Trace actor(std::shared_ptr<const rlpar::Net> net, const float* params, uint64_t seed, bool side) {
  rlpar::CategoricalSampler sampler(seed);
  StepLoop loop(net, kEnvs, &sampler);
  ToyEnvs envs(seed);
  Rollout r(*net);
  Input in0, in1;
  Trace trace;
  trace.ok = loop.can_act_async();
  for (int u = 0; u < kUnrolls; ++u) {
    loop.begin([&] { return r.unroll(*net, params); });
    first_obs(envs, 0, kHalf, in0);
    loop.act(0, &in0, 0, kHalf, side);
    first_obs(envs, kHalf, kEnvs, in1);
    loop.act(0, &in1, kHalf, kEnvs, side);
    for (int64_t t = 1; t < kSteps; ++t) {
      // The first half's act finished in the last call; the second half's may be running.
      env_step(envs, r, t - 1, 0, kHalf, in0);
      loop.step(t, in0, 0, kHalf, side);
      env_step(envs, r, t - 1, kHalf, kEnvs, in1);
      loop.step(t, in1, kHalf, kEnvs, side);
    }
    env_step(envs, r, kSteps - 1, 0, kHalf, in0);
    loop.record(kSteps - 1, in0, 0, kHalf);
    env_step(envs, r, kSteps - 1, kHalf, kEnvs, in1);
    loop.record(kSteps - 1, in1, kHalf, kEnvs);
    const rlpar::StepLoopEnd end = loop.end();
    trace.ok = trace.ok && !loop.bound() && end.seconds > 0;
    for (const auto& x : end.episodes) {
      trace.episodes.push_back(static_cast<double>(x.env));
      trace.episodes.push_back(static_cast<double>(x.step));
      trace.episodes.push_back(x.ret);
      trace.episodes.push_back(static_cast<double>(x.length));
    }
    trace.actions.insert(trace.actions.end(), r.actions.begin(), r.actions.end());
    for (const auto* v : {&r.obs, &r.rewards, &r.behaviour, &r.core_state}) {
      trace.outputs.insert(trace.outputs.end(), v->begin(), v->end());
    }
    for (const auto* v : {&r.term, &r.trunc, &r.mask}) {
      trace.flags.insert(trace.flags.end(), v->begin(), v->end());
    }
  }
  const uint64_t acts = side ? kUnrolls * kSteps * 2 : 0;
  trace.ok =
      trace.ok && loop.side_submitted() == acts && loop.side_stolen() <= loop.side_submitted();
  return trace;
}

// Threads, each an actor with its own loop, share one net and one parameter vector; each gets
// what the same calls give without the side thread, alone.
void actors_share_one_net(bool recurrent, int threads) {
  const auto net = make_net(recurrent);
  const std::vector<float> params = rlpar_test::random_vector(net->num_params(), 3, 0.5f);
  std::vector<Trace> expected;
  for (int i = 0; i < threads; ++i) expected.push_back(actor(net, params.data(), 100 + i, false));
  CHECK(!expected[0].episodes.empty());
  CHECK(!(expected[0] == expected[1]));  // the seeds matter
  std::vector<Trace> got(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] { got[i] = actor(net, params.data(), 100 + i, true); });
  }
  for (auto& th : pool) th.join();
  for (int i = 0; i < threads; ++i) {
    CHECK(expected[i].ok);
    CHECK(got[i].ok);
    CHECK(got[i] == expected[i]);
  }
}

// Counts what the loop asked of its hooks, and can call the loop from inside its forward.
struct Hooks final : rlpar::StepLoopHooks {
  StepLoop* reenter = nullptr;
  bool refused = false;
  int64_t rows = 0;
  int unbound_calls = 0;
  void run_act(int64_t n, const std::function<void()>& act) override {
    rows += n;
    if (reenter != nullptr) {
      try {
        reenter->wait();
      } catch (const std::invalid_argument& e) {
        refused = std::string(e.what()).find("already in progress") != std::string::npos;
      }
    }
    act();
  }
  void unbound() override { ++unbound_calls; }
};

void misuse_and_errors() {
  const auto net = make_net(false);
  std::vector<float> params = rlpar_test::random_vector(net->num_params(), 4, 0.5f);
  Hooks hooks;
  StepLoop no_sampler(net, kEnvs, nullptr, &hooks);
  CHECK(!no_sampler.can_act_async());
  CHECK_THROWS(std::invalid_argument, (void)StepLoop(net, 0, nullptr));
  Rollout r(*net);
  ToyEnvs envs(1);
  Input in;
  first_obs(envs, 0, kEnvs, in);
  CHECK_THROWS(std::invalid_argument, no_sampler.act(0, &in));  // nothing bound
  CHECK(no_sampler.begin([&] { return r.unroll(*net, params.data()); }) == 0);
  CHECK_THROWS(std::invalid_argument,
               no_sampler.begin([&] { return r.unroll(*net, params.data()); }));
  CHECK_THROWS(std::invalid_argument, no_sampler.act(kSteps, &in));
  CHECK_THROWS(std::invalid_argument, no_sampler.act(0, &in, 4, 2));
  CHECK_THROWS(std::invalid_argument, no_sampler.act(0, &in, 0, kEnvs, true));  // no sampler
  hooks.reenter = &no_sampler;
  no_sampler.act(0, &in);
  CHECK(hooks.refused);  // a call from inside the loop's own forward
  hooks.reenter = nullptr;
  CHECK(hooks.rows == kEnvs);
  CHECK_THROWS(std::invalid_argument, no_sampler.step(0, in));
  no_sampler.end();
  CHECK(hooks.unbound_calls == 1);

  // A second thread's call while the first is inside one (here, writing its obs).
  struct Blocking final : Input {
    std::atomic<bool> inside{false}, go{false};
    void write_obs(void* dst, int64_t rows) override {
      inside.store(true);
      while (!go.load()) std::this_thread::yield();
      Input::write_obs(dst, rows);
    }
  } blocking;
  first_obs(envs, 0, kEnvs, blocking);
  no_sampler.begin([&] { return r.unroll(*net, params.data()); });
  std::thread first([&] { no_sampler.act(0, &blocking); });
  while (!blocking.inside.load()) std::this_thread::yield();
  CHECK_THROWS(std::invalid_argument, no_sampler.wait());
  blocking.go.store(true);
  first.join();
  no_sampler.end();

  // A diverged net's act on the side thread: its error comes from the next call, and end
  // unbinds even when it is the call that rethrows it.
  for (float& p : params) p = std::nanf("");
  rlpar::CategoricalSampler sampler(1);
  StepLoop loop(net, kEnvs, &sampler);
  for (bool at_end : {false, true}) {
    loop.begin([&] { return r.unroll(*net, params.data()); });
    loop.act(0, &in, 0, kEnvs, true);
    if (!at_end) CHECK_THROWS(std::invalid_argument, loop.wait());
    if (at_end) CHECK_THROWS(std::invalid_argument, loop.end());
    if (!at_end) loop.end();
    CHECK(!loop.bound());
  }
}

}  // namespace

int main() {
  actors_share_one_net(false, 3);
  actors_share_one_net(true, 3);
  misuse_and_errors();
  return rlpar_test::finish("test_step_loop");
}
