// rlpar/envs.h — batched native environments: K copies of one game stepped in one call.
//
//     rlpar::VecEnv envs("CartPole-v1", 64);                  // K = 64, default time limit
//     std::vector<std::uint64_t> seeds = {...};                 // one per env
//     envs.reset(seeds.data(), obs);                            // obs: [K, *obs_shape]
//     envs.step(actions, obs, rewards, terminated, truncated);  // actions: int64 [K]
//
// Games (`env_names()`), each a faithful port of its reference:
//   CartPole-v1  gymnasium 1.4 classic_control/cartpole.py: euler integration in double, same
//                constants, +1 per step (the terminal step included), terminated when |x| > 2.4
//                or |theta| > 12 degrees; obs float32 [4] = (x, x_dot, theta, theta_dot);
//                2 actions; reset state uniform in [-0.05, 0.05)^4; time limit 500.
//   Acrobot-v1   gymnasium 1.4 classic_control/acrobot.py: "book" dynamics integrated by one RK4
//                step of dt = 0.2, angles wrapped to [-pi, pi], velocities clipped to 4pi / 9pi,
//                reward -1 per step and 0 on the terminal step, terminated when
//                -cos(t1) - cos(t1 + t2) > 1; obs float32 [6] = (cos t1, sin t1, cos t2, sin t2,
//                dt1, dt2); 3 actions (torque -1, 0, +1); reset state uniform in [-0.1, 0.1)^4
//                rounded to float32 (gymnasium stores it as float32); time limit 500.
//   Catch-v0     bsuite's Catch on a 10 x 10 board: the ball starts in the top row at a random
//                column and falls one row per step; the paddle starts in the middle of the bottom
//                row and moves left / stays / right (actions 0, 1, 2), clipped at the walls. When
//                the ball reaches the bottom row the episode terminates with reward +1 if the
//                paddle is under it, else -1; every other step gives 0. Every episode lasts 9
//                steps. obs uint8 [10, 10, 1]: 255 at the ball and the paddle, 0 elsewhere (so
//                a net that scales uint8 by 1/255 sees 0/1). No time limit.
// The classic-control dynamics repeat gymnasium's floating point operations in the same order,
// with libm's cos, sin and pow where numpy calls them (`x**2` is pow, not x * x), and
// src/envs.cc is compiled without FMA contraction, so from the same state and actions the
// trajectories agree with gymnasium's bit for bit (tested), not only within a tolerance. (One
// exception: gymnasium computes the observation of Acrobot's float32 reset state in float32,
// the native env in double, so that one observation may differ in its last bit.)
//
// Autoreset: gymnasium's NEXT_STEP mode (its default for vector envs). When an env's episode
// ends at a step (terminated or truncated), that step returns the real final observation; the
// env's next step is a reset step: the action is ignored, the observation is the new episode's
// first one, the reward is 0 and both flags are false.
// Time limit: truncated = (steps since the reset >= max_episode_steps), as gymnasium's TimeLimit
// computes it; both flags can be set on the same step. max_episode_steps = 0 disables it.
//
// Randomness: each env owns an rlpar::Rng (xoshiro256**, rng.h). reset(seeds) reseeds env i
// with seeds[i] and draws its initial state; every later reset (autoreset or reset(nullptr))
// continues that env's stream. So an env's trajectory depends only on its own seed and actions,
// not on K or on its neighbours. A new VecEnv has env i seeded with i and reset.
//
// Errors: std::invalid_argument with a message naming what was expected and what came, thrown
// before any env changes (bad name, K < 1, an out-of-range action, a bad state). A VecEnv is
// not thread-safe, but it is cheap to guard: a call that finds another call in progress throws
// std::logic_error instead of racing.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rlpar {

struct EnvSpec {
  std::string name;                 // "CartPole-v1", "Acrobot-v1", "Catch-v0"
  std::vector<int64_t> obs_shape;   // per env: {4}, {6}, {10, 10, 1}
  bool obs_uint8 = false;           // observation dtype: uint8 frames, else float32
  std::vector<double> obs_low, obs_high;  // per element (the gymnasium Box bounds)
  int64_t num_actions = 0;          // Discrete(n): actions 0 .. n - 1
  int64_t state_size = 0;           // doubles in get_state / set_state
  int64_t max_episode_steps = 0;    // default time limit (0: none)
  // Cost of one env step in the unit of the bindings' GIL threshold (flops), for their GIL
  // policy: they release the GIL when K * flops_per_step is above it. Calibrated from measured
  // time per step (CartPole ~17 ns, Acrobot ~280 ns, Catch ~3.5 ns here) at 3.5 flop/ns, so the
  // default 20 kflop threshold means ~6 us of env work: measured here, two threads stepping
  // their own envs then run >= 1.4x one thread, while below it the GIL hand-off costs more than
  // it frees (K = 64 CartPoles, ~1 us: 2 threads with release ran 1.0x or less).
  double flops_per_step = 0;

  int64_t obs_size() const;  // elements per env
};

std::vector<std::string> env_names();
// Throws std::invalid_argument listing the known names.
const EnvSpec& env_spec(const std::string& name);

class VecEnv {
 public:
  // max_episode_steps < 0: the game's default; 0: no time limit.
  VecEnv(const std::string& name, int64_t num_envs, int64_t max_episode_steps = -1);
  ~VecEnv();
  VecEnv(const VecEnv&) = delete;
  VecEnv& operator=(const VecEnv&) = delete;

  const EnvSpec& spec() const { return spec_; }
  int64_t num_envs() const { return num_envs_; }
  int64_t max_episode_steps() const { return max_episode_steps_; }

  // Resets every env: seeds[i] reseeds env i first; seeds == nullptr continues each env's
  // stream. obs: [K, *obs_shape] of the spec's dtype (nullptr: not written).
  void reset(const std::uint64_t* seeds, void* obs);

  // Checks every action first (std::invalid_argument, nothing changed), then steps every env.
  // actions: [K]; obs: [K, *obs_shape]; rewards: [K]; terminated, truncated: [K].
  void step(const int64_t* actions, void* obs, float* rewards, bool* terminated, bool* truncated);

  // The observation each env returned last (the final one after an episode's end).
  void observe(void* obs) const;

  // True for envs whose next step is the reset step (their last step ended an episode).
  bool needs_reset(int64_t i) const;

  // One env's state, for tests that drive the native envs and gymnasium's from the same point.
  // CartPole: (x, x_dot, theta, theta_dot); Acrobot: (theta1, theta2, dtheta1, dtheta2);
  // Catch: (ball_row, ball_col, paddle_col), integers. `elapsed`: steps since the reset.
  // set_state validates (Catch cells on the board, finite values; std::invalid_argument), makes
  // the env's next step a normal one, and leaves its generator alone.
  void get_state(int64_t i, double* state, int64_t* elapsed) const;
  void set_state(int64_t i, const double* state, int64_t elapsed);

  // The whole batch's state, for checkpoints: what decides every env's future given its
  // actions. Per env i: game[i * state_size ...] (as get_state), its generator's four words
  // rng[4 * i ...], elapsed[i] (steps since the reset) and needs_reset[i] (its next step is the
  // reset step; the game state is then the final one, which a Catch ball may hold in the bottom
  // row). load_state checks every env first (finite and on-board game states, no all-zero
  // generator, 0 <= elapsed, and elapsed < max_episode_steps unless needs_reset) and throws
  // std::invalid_argument naming the env before any env changes. After load_state, `observe`
  // and every later step are what they were after save_state.
  void save_state(double* game, std::uint64_t* rng, int64_t* elapsed, bool* needs_reset) const;
  void load_state(const double* game, const std::uint64_t* rng, const int64_t* elapsed,
                  const bool* needs_reset);

  class Impl;  // one implementation per game (src/envs.cc)

 private:
  friend class VecEnvGuard;
  const EnvSpec& spec_;
  int64_t num_envs_;
  int64_t max_episode_steps_;
  std::unique_ptr<Impl> impl_;
  mutable std::atomic<bool> busy_{false};
};

}  // namespace rlpar
