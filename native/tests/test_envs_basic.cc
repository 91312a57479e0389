// Single-threaded behaviour of the native envs and the fused unroll: NEXT_STEP autoreset, the
// time limit, seeding, bad actions and states, Catch's rules, the sampler. Equivalence with
// gymnasium's dynamics is tested from Python (tests/test_envs.py), where gymnasium lives.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "rlpar/envs.h"
#include "rlpar/net.h"
#include "rlpar/unroll.h"

using rlpar::VecEnv;

namespace {

struct Step {
  std::vector<float> obs, rewards;
  std::vector<char> terminated, truncated;  // not vector<bool>: step() writes bool arrays
};

Step step(VecEnv& envs, const std::vector<int64_t>& actions) {
  const int64_t k = envs.num_envs();
  Step s;
  s.obs.resize(k * envs.spec().obs_size());
  s.rewards.resize(k);
  s.terminated.resize(k);
  s.truncated.resize(k);
  envs.step(actions.data(), s.obs.data(), s.rewards.data(),
            reinterpret_cast<bool*>(s.terminated.data()),
            reinterpret_cast<bool*>(s.truncated.data()));
  return s;
}

std::vector<double> state_of(const VecEnv& envs, int64_t i, int64_t* elapsed = nullptr) {
  std::vector<double> s(envs.spec().state_size);
  envs.get_state(i, s.data(), elapsed);
  return s;
}

void test_autoreset_and_time_limit() {
  const int64_t k = 8, limit = 30;
  VecEnv envs("CartPole-v1", k, limit);
  std::vector<std::uint64_t> seeds(k);
  for (int64_t i = 0; i < k; ++i) seeds[i] = 100 + i;
  std::vector<float> obs(k * 4);
  envs.reset(seeds.data(), obs.data());
  std::vector<char> prev_done(k, 0);
  std::vector<int64_t> elapsed(k, 0);
  int ends = 0;
  for (int t = 0; t < 400; ++t) {
    // a balancing controller on even envs (they reach the time limit), a constant push on odd
    std::vector<int64_t> actions(k);
    for (int64_t i = 0; i < k; ++i) {
      actions[i] = (i % 2 == 0) ? (3.0f * obs[i * 4 + 2] + obs[i * 4 + 3] > 0) : 1;
    }
    Step s = step(envs, actions);
    for (int64_t i = 0; i < k; ++i) {
      if (prev_done[i]) {
        CHECK(s.rewards[i] == 0.0f && !s.terminated[i] && !s.truncated[i]);
        elapsed[i] = 0;
      } else {
        CHECK(s.rewards[i] == 1.0f);
        elapsed[i] += 1;
      }
      CHECK(static_cast<bool>(s.truncated[i]) == (elapsed[i] >= limit));
      int64_t e = -1;
      state_of(envs, i, &e);
      CHECK(e == elapsed[i]);
      prev_done[i] = s.terminated[i] || s.truncated[i];
      CHECK(envs.needs_reset(i) == static_cast<bool>(prev_done[i]));
      ends += prev_done[i];
    }
    obs = s.obs;
    std::vector<float> seen(k * 4);
    envs.observe(seen.data());
    CHECK(seen == obs);
  }
  CHECK(ends > 50);
}

void test_seeding() {
  // env i's trajectory depends on its own seed only: K = 1 with seed 7 == env 2 of K = 4.
  VecEnv one("Acrobot-v1", 1), four("Acrobot-v1", 4);
  std::uint64_t s1[1] = {7}, s4[4] = {5, 6, 7, 8};
  std::vector<float> o1(6), o4(24);
  one.reset(s1, o1.data());
  four.reset(s4, o4.data());
  CHECK(std::memcmp(o1.data(), o4.data() + 12, 6 * sizeof(float)) == 0);
  CHECK(std::memcmp(o4.data(), o4.data() + 6, 6 * sizeof(float)) != 0);
  for (int t = 0; t < 600; ++t) {  // past the first time limit: autoresets continue the stream
    Step a = step(one, {t % 3});
    Step b = step(four, {0, 1, t % 3, 2});
    CHECK(std::memcmp(a.obs.data(), b.obs.data() + 12, 6 * sizeof(float)) == 0);
  }
  // reset(nullptr) continues each env's stream; the same seeds replay it.
  VecEnv a("Catch-v0", 3), b("Catch-v0", 3);
  std::uint64_t s[3] = {1, 2, 3};
  std::vector<std::uint8_t> fa(300), fb(300);
  a.reset(s, nullptr);
  b.reset(s, nullptr);
  for (int r = 0; r < 20; ++r) {
    a.reset(nullptr, fa.data());
    b.reset(nullptr, fb.data());
    CHECK(fa == fb);
  }
}

void test_bad_actions_change_nothing() {
  VecEnv envs("Acrobot-v1", 3), twin("Acrobot-v1", 3);
  for (int t = 0; t < 10; ++t) {
    step(envs, {0, 1, 2});
    step(twin, {0, 1, 2});
  }
  std::vector<std::vector<double>> before;
  for (int64_t i = 0; i < 3; ++i) before.push_back(state_of(envs, i));
  CHECK_THROWS(std::invalid_argument, step(envs, {0, 3, 1}));
  CHECK_THROWS(std::invalid_argument, step(envs, {-1, 0, 1}));
  try {
    step(envs, {0, 1, 7});
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) ==
          "action 7 for env 2 is out of range: Acrobot-v1 takes actions 0..2");
  }
  for (int64_t i = 0; i < 3; ++i) CHECK(state_of(envs, i) == before[i]);
  for (int t = 0; t < 20; ++t) {
    Step a = step(envs, {2, 2, 0});
    Step b = step(twin, {2, 2, 0});
    CHECK(a.obs == b.obs);
  }
}

void test_constructor_and_state_errors() {
  CHECK_THROWS(std::invalid_argument, VecEnv("Pong-v5", 1));
  CHECK_THROWS(std::invalid_argument, VecEnv("CartPole-v1", 0));
  VecEnv c("Catch-v0", 2);
  const double bad_row[3] = {9, 0, 0}, bad_col[3] = {0, 10, 0}, half[3] = {0, 0, 0.5};
  const double ok[3] = {4, 3, 2};
  CHECK_THROWS(std::invalid_argument, c.set_state(0, bad_row, 0));
  CHECK_THROWS(std::invalid_argument, c.set_state(0, bad_col, 0));
  CHECK_THROWS(std::invalid_argument, c.set_state(0, half, 0));
  CHECK_THROWS(std::invalid_argument, c.set_state(2, ok, 0));
  CHECK_THROWS(std::invalid_argument, c.set_state(0, ok, -1));
  c.set_state(1, ok, 4);
  int64_t e = 0;
  CHECK(state_of(c, 1, &e) == std::vector<double>({4, 3, 2}) && e == 4);
  VecEnv cp("CartPole-v1", 1);
  const double nan_state[4] = {NAN, 0, 0, 0};
  CHECK_THROWS(std::invalid_argument, cp.set_state(0, nan_state, 0));
}

// save_state / load_state: a loaded batch continues bit for bit (resets included, from each
// env's own generator), and a state refused for one env leaves every env as it was.
void test_save_and_load_state() {
  for (const char* name : {"CartPole-v1", "Acrobot-v1", "Catch-v0"}) {
    VecEnv a(name, 4), b(name, 4);
    const std::vector<std::uint64_t> seeds = {7, 8, 9, 10};
    a.reset(seeds.data(), nullptr);
    const int64_t n = a.spec().state_size;
    std::vector<double> game(4 * n);
    std::vector<std::uint64_t> rng(16);
    std::vector<int64_t> elapsed(4);
    bool needs_reset[4] = {};
    bool ended = false;
    for (int t = 0; t < 2000 && !ended; ++t) {
      step(a, {1, 0, 1, t % 2});
      a.save_state(game.data(), rng.data(), elapsed.data(), needs_reset);
      ended = std::any_of(needs_reset, needs_reset + 4, [](bool x) { return x; });
    }
    CHECK(ended);
    b.load_state(game.data(), rng.data(), elapsed.data(), needs_reset);
    for (int t = 0; t < 300; ++t) {
      const std::vector<int64_t> actions = {t % 2, 1, (t / 3) % 2, 0};
      Step x = step(a, actions), y = step(b, actions);
      // Bytes, not floats: Catch writes uint8 frames into the buffer (255s read as a NaN).
      CHECK(std::memcmp(x.obs.data(), y.obs.data(), x.obs.size() * sizeof(float)) == 0);
      CHECK(x.rewards == y.rewards && x.terminated == y.terminated && x.truncated == y.truncated);
    }
    // Refusals: a NaN (or off-board) game state, an all-zero generator, a negative count.
    std::vector<double> game_b(4 * n);
    std::vector<std::uint64_t> rng_b(16);
    std::vector<int64_t> elapsed_b(4);
    bool reset_b[4] = {};
    b.save_state(game_b.data(), rng_b.data(), elapsed_b.data(), reset_b);
    std::vector<double> bad_game = game_b;
    bad_game[2 * n] = NAN;
    CHECK_THROWS(std::invalid_argument,
                 b.load_state(bad_game.data(), rng_b.data(), elapsed_b.data(), reset_b));
    std::vector<std::uint64_t> zero_rng = rng_b;
    std::fill(zero_rng.begin() + 4, zero_rng.begin() + 8, 0);
    CHECK_THROWS(std::invalid_argument,
                 b.load_state(game_b.data(), zero_rng.data(), elapsed_b.data(), reset_b));
    std::vector<int64_t> negative = elapsed_b;
    negative[3] = -1;
    CHECK_THROWS(std::invalid_argument,
                 b.load_state(game_b.data(), rng_b.data(), negative.data(), reset_b));
    std::vector<double> game_c(4 * n);
    std::vector<std::uint64_t> rng_c(16);
    std::vector<int64_t> elapsed_c(4);
    bool reset_c[4] = {};
    b.save_state(game_c.data(), rng_c.data(), elapsed_c.data(), reset_c);
    CHECK(game_c == game_b && rng_c == rng_b && elapsed_c == elapsed_b &&
          std::equal(reset_b, reset_b + 4, reset_c));
  }
}

void test_catch_rules() {
  VecEnv envs("Catch-v0", 1);
  const double start[3] = {0, 9, 5};  // ball in the right column, paddle in the middle
  envs.set_state(0, start, 0);
  int64_t col = 5;
  for (int t = 0; t < 9; ++t) {
    const int64_t a = t < 4 ? 2 : 1;  // move right 4 times: under the ball at column 9
    col = std::min<int64_t>(9, col + a - 1);
    std::vector<std::uint8_t> frame(100);
    float r = 0;
    bool term = false, trunc = false;
    envs.step(&a, frame.data(), &r, &term, &trunc);
    int on = 0;
    for (std::uint8_t v : frame) on += v == 255;
    CHECK(frame[(t + 1) * 10 + 9] == 255 && frame[90 + col] == 255);
    CHECK(on == (t == 8 ? 1 : 2));  // at the end the ball sits on the paddle
    CHECK(term == (t == 8) && !trunc);
    CHECK(r == (t == 8 ? 1.0f : 0.0f));
  }
  envs.set_state(0, start, 0);
  for (int t = 0; t < 9; ++t) {
    const int64_t left = 0;
    std::vector<std::uint8_t> frame(100);
    float r = 0;
    bool term = false, trunc = false;
    envs.step(&left, frame.data(), &r, &term, &trunc);
    CHECK(frame[90 + std::max(0, 4 - t)] == 255);  // moves left, then stops at the wall
    if (t == 8) CHECK(term && r == -1.0f);
  }
}

void test_sampler() {
  rlpar::CategoricalSampler s(1), same(1);
  const int64_t rows = 20000;
  std::vector<float> logits(rows * 3);
  for (int64_t i = 0; i < rows; ++i) {
    logits[i * 3] = 0.0f;
    logits[i * 3 + 1] = std::log(3.0f);
    logits[i * 3 + 2] = -INFINITY;
  }
  std::vector<int64_t> a(rows), b(rows);
  s.sample(logits.data(), rows, 3, 0, 3, a.data());
  same.sample(logits.data(), rows, 3, 0, 3, b.data());
  CHECK(a == b);
  int64_t ones = 0, twos = 0;
  for (int64_t x : a) {
    ones += x == 1;
    twos += x == 2;
  }
  CHECK(twos == 0);
  CHECK(std::fabs(static_cast<double>(ones) / rows - 0.75) < 0.015);
  std::vector<float> nan_row = {0.0f, NAN};
  CHECK_THROWS(std::invalid_argument, s.sample(nan_row.data(), 1, 2, 0, 2, a.data()));
}

void test_unroll_bookkeeping() {
  rlpar::NetSpec spec;
  spec.input_shape = {4};
  spec.layers = {rlpar::LayerSpec::linear(8), rlpar::LayerSpec::tanh()};
  spec.heads = {{rlpar::HeadKind::Categorical, 2}, {rlpar::HeadKind::Value, 1}};
  rlpar::Net net(spec);
  std::vector<float> params(net.num_params(), 0.01f);
  const int64_t k = 4, t_len = 50;
  VecEnv envs("CartPole-v1", k, 10);
  rlpar::CategoricalSampler sampler(0);
  std::vector<float> obs((t_len + 1) * k * 4), rewards(t_len * k), behaviour(t_len * k * 3);
  std::vector<int64_t> actions(t_len * k);
  std::vector<char> term(t_len * k), trunc(t_len * k), mask(t_len * k);
  rlpar::UnrollArrays a;
  a.steps = t_len;
  a.obs = obs.data();
  a.actions = actions.data();
  a.rewards = rewards.data();
  a.terminated = reinterpret_cast<bool*>(term.data());
  a.truncated = reinterpret_cast<bool*>(trunc.data());
  a.mask = reinterpret_cast<bool*>(mask.data());
  a.behaviour = behaviour.data();
  std::vector<double> ret(k, 0);
  std::vector<int64_t> len(k, 0);
  auto ends = rlpar::unroll(net, params.data(), envs, sampler, a, ret.data(), len.data());
  int64_t done = 0;
  for (int64_t i = 0; i < t_len * k; ++i) {
    done += term[i] || trunc[i];
    if (i >= k) CHECK(static_cast<bool>(mask[i]) == !(term[i - k] || trunc[i - k]));
    if (!mask[i]) CHECK(rewards[i] == 0.0f);
  }
  CHECK(static_cast<int64_t>(ends.size()) == done && done > 10);
  for (const auto& e : ends) CHECK(e.ret == static_cast<double>(e.length) && e.length <= 10);
  rlpar::NetSpec wrong = spec;
  wrong.heads = {{rlpar::HeadKind::Categorical, 3}};
  rlpar::Net wrong_net(wrong);
  std::vector<float> wrong_params(wrong_net.num_params(), 0.0f);
  std::vector<double> before = state_of(envs, 0);
  CHECK_THROWS(std::invalid_argument, rlpar::unroll(wrong_net, wrong_params.data(), envs, sampler,
                                                    a, ret.data(), len.data()));
  CHECK(state_of(envs, 0) == before);
  // A recurrent net without its state arrays is refused before any env moves.
  rlpar::NetSpec recurrent = spec;
  recurrent.lstm_hidden = 4;
  rlpar::Net lstm_net(recurrent);
  std::vector<float> lstm_params(lstm_net.num_params(), 0.01f);
  CHECK_THROWS(std::invalid_argument, rlpar::unroll(lstm_net, lstm_params.data(), envs, sampler,
                                                    a, ret.data(), len.data()));
  CHECK(state_of(envs, 0) == before);
}

}  // namespace

int main() {
  test_autoreset_and_time_limit();
  test_seeding();
  test_bad_actions_change_nothing();
  test_constructor_and_state_errors();
  test_save_and_load_state();
  test_catch_rules();
  test_sampler();
  test_unroll_bookkeeping();
  return rlpar_test::finish("test_envs_basic");
}
