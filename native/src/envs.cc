// Native envs: see rlpar/envs.h for the games, the autoreset rule and the seeding.
//
// Exactness. The classic-control games repeat gymnasium's double-precision operations in its
// order (Python evaluates left to right, as C++ does for the same expression), and call the same
// libm cos/sin that numpy calls for float64 scalars. Two things could still change the last bit:
// FMA contraction, which GCC does by default under -std=gnu++17 with -march=native, and
// -ffast-math-style reassociation (not enabled by the build). Contraction is switched off for
// this whole file, before any header, so that every inline function compiled here agrees (GCC
// refuses to inline across different optimize options). It costs nothing measurable: the
// dynamics are a few dozen operations next to four transcendental calls.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "rlpar/envs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlpar/one_call.h"
#include "rlpar/rng.h"

namespace rlpar {

// ---------------------------------------------------------------------------------------------
// Games. Each is a plain struct: its state, reset(rng), step(action, terminated) -> reward,
// observe(out), and get/set of the state as doubles.

namespace {

constexpr double kPi = 3.141592653589793;  // == math.pi == numpy.pi
constexpr double kInf = std::numeric_limits<double>::infinity();

// gymnasium's Acrobot squares with `x**2` on float64 scalars, which numpy and Python evaluate
// with libm's pow(); pow(x, 2) differs from x * x in the last bit for about 1 input in 1000, and
// Acrobot is chaotic enough for that bit to change an episode. GCC folds pow(x, 2.0) into x * x,
// so the exponent is read from a volatile to keep the real call.
volatile double g_two = 2.0;
double py_square(double x) { return std::pow(x, g_two); }

// x rounded to float32 (and widened back), as numpy's astype(np.float32) stores it. Through a
// volatile, because a plain static_cast<float> in Acrobot::reset did not survive GCC 12 at -O3:
// its SLP vectorizer packs the four draws into one vector and drops the narrowing and widening
// conversions (seen with -march=x86-64-v3, znver3 and icelake-server; -fno-tree-slp-vectorize
// keeps them), so reset states were off float32 by up to 4e-9 in some builds and not in others.
double round_to_float32(double x) {
  volatile float f = static_cast<float>(x);
  return f;
}

bool all_finite(const double* x, int n) {
  for (int i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

struct CartPole {
  using Obs = float;
  static constexpr int kStateSize = 4;
  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassPole + kMassCart;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;
  static constexpr double kThetaThreshold = 12 * 2 * kPi / 360;
  static constexpr double kXThreshold = 2.4;

  double x = 0, x_dot = 0, theta = 0, theta_dot = 0;

  void reset(Rng& rng) {
    x = rng.uniform(-0.05, 0.05);
    x_dot = rng.uniform(-0.05, 0.05);
    theta = rng.uniform(-0.05, 0.05);
    theta_dot = rng.uniform(-0.05, 0.05);
  }

  // gymnasium CartPoleEnv.step, "euler" integrator.
  float step(int64_t action, bool& terminated) {
    const double force = action == 1 ? kForceMag : -kForceMag;
    const double costheta = std::cos(theta);
    const double sintheta = std::sin(theta);
    const double temp =
        (force + kPoleMassLength * (theta_dot * theta_dot) * sintheta) / kTotalMass;
    const double thetaacc =
        (kGravity * sintheta - costheta * temp) /
        (kLength * (4.0 / 3.0 - kMassPole * (costheta * costheta) / kTotalMass));
    const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
    x = x + kTau * x_dot;
    x_dot = x_dot + kTau * xacc;
    theta = theta + kTau * theta_dot;
    theta_dot = theta_dot + kTau * thetaacc;
    terminated = x < -kXThreshold || x > kXThreshold || theta < -kThetaThreshold ||
                 theta > kThetaThreshold;
    return 1.0f;
  }

  void observe(float* o) const {
    o[0] = static_cast<float>(x);
    o[1] = static_cast<float>(x_dot);
    o[2] = static_cast<float>(theta);
    o[3] = static_cast<float>(theta_dot);
  }

  void get(double* s) const {
    s[0] = x;
    s[1] = x_dot;
    s[2] = theta;
    s[3] = theta_dot;
  }
  void set(const double* s, bool /*terminal*/ = false) {
    if (!all_finite(s, kStateSize)) throw std::invalid_argument("CartPole state must be finite");
    x = s[0];
    x_dot = s[1];
    theta = s[2];
    theta_dot = s[3];
  }

  static EnvSpec spec() {
    EnvSpec e;
    e.name = "CartPole-v1";
    e.obs_shape = {4};
    e.obs_high = {kXThreshold * 2, kInf, kThetaThreshold * 2, kInf};
    e.obs_low = {-e.obs_high[0], -kInf, -e.obs_high[2], -kInf};
    e.num_actions = 2;
    e.state_size = kStateSize;
    e.max_episode_steps = 500;
    e.flops_per_step = 60;  // see EnvSpec::flops_per_step
    return e;
  }
};

struct Acrobot {
  using Obs = float;
  static constexpr int kStateSize = 4;
  static constexpr double kDt = 0.2;
  static constexpr double kL1 = 1.0;    // LINK_LENGTH_1
  static constexpr double kM1 = 1.0;    // LINK_MASS_1
  static constexpr double kM2 = 1.0;    // LINK_MASS_2
  static constexpr double kLc1 = 0.5;   // LINK_COM_POS_1
  static constexpr double kLc2 = 0.5;   // LINK_COM_POS_2
  static constexpr double kI1 = 1.0;    // LINK_MOI
  static constexpr double kI2 = 1.0;
  static constexpr double kG = 9.8;
  static constexpr double kMaxVel1 = 4 * kPi;
  static constexpr double kMaxVel2 = 9 * kPi;
  static constexpr double kTorque[3] = {-1.0, 0.0, 1.0};

  double s[kStateSize] = {0, 0, 0, 0};

  void reset(Rng& rng) {
    // gymnasium draws in double and stores the state as float32.
    for (double& v : s) v = round_to_float32(rng.uniform(-0.1, 0.1));
  }

  // AcrobotEnv._dsdt, "book" dynamics. y = (theta1, theta2, dtheta1, dtheta2, torque). The
  // squares of constants (lc1**2, ...) are exact, so only those of variables call pow.
  static void dsdt(const double* y, double* dy) {
    const double a = y[4];
    const double theta1 = y[0], theta2 = y[1], dtheta1 = y[2], dtheta2 = y[3];
    const double d1 = kM1 * (kLc1 * kLc1) +
                      kM2 * (kL1 * kL1 + kLc2 * kLc2 + 2 * kL1 * kLc2 * std::cos(theta2)) + kI1 +
                      kI2;
    const double d2 = kM2 * (kLc2 * kLc2 + kL1 * kLc2 * std::cos(theta2)) + kI2;
    const double phi2 = kM2 * kLc2 * kG * std::cos(theta1 + theta2 - kPi / 2.0);
    const double phi1 = -kM2 * kL1 * kLc2 * py_square(dtheta2) * std::sin(theta2) -
                        2 * kM2 * kL1 * kLc2 * dtheta2 * dtheta1 * std::sin(theta2) +
                        (kM1 * kLc1 + kM2 * kL1) * kG * std::cos(theta1 - kPi / 2) + phi2;
    const double ddtheta2 =
        (a + d2 / d1 * phi1 - kM2 * kL1 * kLc2 * py_square(dtheta1) * std::sin(theta2) - phi2) /
        (kM2 * (kLc2 * kLc2) + kI2 - py_square(d2) / d1);
    const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    dy[0] = dtheta1;
    dy[1] = dtheta2;
    dy[2] = ddtheta1;
    dy[3] = ddtheta2;
    dy[4] = 0.0;
  }

  static double wrap(double x, double m, double big_m) {
    const double diff = big_m - m;
    while (x > big_m) x = x - diff;
    while (x < m) x = x + diff;
    return x;
  }

  // Python's min(max(x, m), M): max returns x unless m > x, min returns it unless M < it.
  static double bound(double x, double m, double big_m) {
    const double lo = m > x ? m : x;
    return big_m < lo ? big_m : lo;
  }

  float step(int64_t action, bool& terminated) {
    // acrobot.rk4 over t = [0, dt]: one classic RK4 step on the state augmented by the torque.
    constexpr int n = 5;
    constexpr double dt = kDt - 0;
    constexpr double dt2 = dt / 2.0;
    const double y0[n] = {s[0], s[1], s[2], s[3], kTorque[action]};
    double k1[n], k2[n], k3[n], k4[n], y[n];
    dsdt(y0, k1);
    for (int i = 0; i < n; ++i) y[i] = y0[i] + dt2 * k1[i];
    dsdt(y, k2);
    for (int i = 0; i < n; ++i) y[i] = y0[i] + dt2 * k2[i];
    dsdt(y, k3);
    for (int i = 0; i < n; ++i) y[i] = y0[i] + dt * k3[i];
    dsdt(y, k4);
    for (int i = 0; i < kStateSize; ++i) {
      s[i] = y0[i] + dt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
    }
    s[0] = wrap(s[0], -kPi, kPi);
    s[1] = wrap(s[1], -kPi, kPi);
    s[2] = bound(s[2], -kMaxVel1, kMaxVel1);
    s[3] = bound(s[3], -kMaxVel2, kMaxVel2);
    terminated = -std::cos(s[0]) - std::cos(s[1] + s[0]) > 1.0;
    return terminated ? 0.0f : -1.0f;
  }

  void observe(float* o) const {
    o[0] = static_cast<float>(std::cos(s[0]));
    o[1] = static_cast<float>(std::sin(s[0]));
    o[2] = static_cast<float>(std::cos(s[1]));
    o[3] = static_cast<float>(std::sin(s[1]));
    o[4] = static_cast<float>(s[2]);
    o[5] = static_cast<float>(s[3]);
  }

  void get(double* out) const { std::memcpy(out, s, sizeof(s)); }
  void set(const double* in, bool /*terminal*/ = false) {
    if (!all_finite(in, kStateSize)) throw std::invalid_argument("Acrobot state must be finite");
    std::memcpy(s, in, sizeof(s));
  }

  static EnvSpec spec() {
    EnvSpec e;
    e.name = "Acrobot-v1";
    e.obs_shape = {6};
    e.obs_high = {1.0, 1.0, 1.0, 1.0, kMaxVel1, kMaxVel2};
    for (double h : e.obs_high) e.obs_low.push_back(-h);
    e.num_actions = 3;
    e.state_size = kStateSize;
    e.max_episode_steps = 500;
    e.flops_per_step = 1000;  // 4 derivative evaluations with 7 cos/sin/pow calls each
    return e;
  }
};

struct Catch {
  using Obs = std::uint8_t;
  static constexpr int kRows = 10;
  static constexpr int kCols = 10;
  static constexpr int kStateSize = 3;
  static constexpr std::uint8_t kOn = 255;

  int ball_row = 0, ball_col = 0, paddle_col = kCols / 2;

  void reset(Rng& rng) {
    ball_row = 0;
    ball_col = static_cast<int>(rng.below(kCols));
    paddle_col = kCols / 2;
  }

  float step(int64_t action, bool& terminated) {
    const int moved = paddle_col + static_cast<int>(action) - 1;
    paddle_col = moved < 0 ? 0 : (moved >= kCols ? kCols - 1 : moved);
    ball_row += 1;
    terminated = ball_row == kRows - 1;
    if (!terminated) return 0.0f;
    return ball_col == paddle_col ? 1.0f : -1.0f;
  }

  void observe(std::uint8_t* o) const {
    std::memset(o, 0, kRows * kCols);
    o[ball_row * kCols + ball_col] = kOn;
    o[(kRows - 1) * kCols + paddle_col] = kOn;
  }

  void get(double* s) const {
    s[0] = ball_row;
    s[1] = ball_col;
    s[2] = paddle_col;
  }
  // `terminal`: the state an episode ended in (the ball in the bottom row) is allowed.
  void set(const double* s, bool terminal = false) {
    auto cell = [&](double v, int hi, const char* what) {
      if (!(v >= 0 && v <= hi && v == std::floor(v))) {
        std::ostringstream o;
        o << "Catch state: " << what << " must be an integer in [0, " << hi << "], got " << v;
        throw std::invalid_argument(o.str());
      }
      return static_cast<int>(v);
    };
    // Row kRows - 1 is where episodes end: a state there has no next step (only a terminal
    // state, whose next step is the reset step, may hold it).
    const int r = cell(s[0], terminal ? kRows - 1 : kRows - 2, "ball_row");
    const int c = cell(s[1], kCols - 1, "ball_col");
    const int p = cell(s[2], kCols - 1, "paddle_col");
    ball_row = r;
    ball_col = c;
    paddle_col = p;
  }

  static EnvSpec spec() {
    EnvSpec e;
    e.name = "Catch-v0";
    e.obs_shape = {kRows, kCols, 1};
    e.obs_uint8 = true;
    e.obs_low.assign(kRows * kCols, 0.0);
    e.obs_high.assign(kRows * kCols, 255.0);
    e.num_actions = 3;
    e.state_size = kStateSize;
    e.max_episode_steps = 0;
    e.flops_per_step = 12;  // a 100-byte clear and a few integer operations
    return e;
  }
};

struct Registry {
  std::vector<EnvSpec> specs{CartPole::spec(), Acrobot::spec(), Catch::spec()};
};

const Registry& registry() {
  static const Registry r;
  return r;
}

std::string known_names() {
  std::string s;
  for (const auto& e : registry().specs) s += (s.empty() ? "" : ", ") + e.name;
  return s;
}

}  // namespace

int64_t EnvSpec::obs_size() const {
  int64_t n = 1;
  for (int64_t d : obs_shape) n *= d;
  return n;
}

std::vector<std::string> env_names() {
  std::vector<std::string> names;
  for (const auto& e : registry().specs) names.push_back(e.name);
  return names;
}

const EnvSpec& env_spec(const std::string& name) {
  for (const auto& e : registry().specs) {
    if (e.name == name) return e;
  }
  throw std::invalid_argument("unknown native env '" + name + "', expected one of " +
                              known_names());
}

// ---------------------------------------------------------------------------------------------
// VecEnv

// Turns a second, concurrent call on the same VecEnv into an error instead of a data race.
class VecEnvGuard : public OneCall {
 public:
  explicit VecEnvGuard(const VecEnv& envs)
      : OneCall(envs.busy_, [&envs] {
          return std::logic_error("VecEnv(" + envs.spec().name +
                                  ") is already in use by another thread: each thread must own "
                                  "its envs");
        }) {}
};

class VecEnv::Impl {
 public:
  virtual ~Impl() = default;
  virtual void reset(const std::uint64_t* seeds, void* obs) = 0;
  virtual void step(const int64_t* actions, void* obs, float* rewards, bool* terminated,
                    bool* truncated) = 0;
  virtual void observe(void* obs) const = 0;
  virtual bool needs_reset(int64_t i) const = 0;
  virtual void get_state(int64_t i, double* state, int64_t* elapsed) const = 0;
  virtual void set_state(int64_t i, const double* state, int64_t elapsed) = 0;
  virtual void save_state(double* game, std::uint64_t* rng, int64_t* elapsed,
                          bool* needs_reset) const = 0;
  virtual void load_state(const double* game, const std::uint64_t* rng, const int64_t* elapsed,
                          const bool* needs_reset) = 0;
};

namespace {

// K envs of one game: the per-env loop is compiled once per game, with no virtual call inside.
template <class Game>
class GameEnvs final : public VecEnv::Impl {
  using Obs = typename Game::Obs;

 public:
  GameEnvs(int64_t num_envs, int64_t max_episode_steps, int64_t obs_size)
      : slots_(num_envs), max_steps_(max_episode_steps), obs_size_(obs_size) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      slots_[i].rng.reseed(i);
      slots_[i].game.reset(slots_[i].rng);
    }
  }

  void reset(const std::uint64_t* seeds, void* obs) override {
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (seeds) s.rng.reseed(seeds[i]);
      s.game.reset(s.rng);
      s.elapsed = 0;
      s.needs_reset = false;
    }
    if (obs) observe(obs);
  }

  void step(const int64_t* actions, void* obs, float* rewards, bool* terminated,
            bool* truncated) override {
    Obs* o = static_cast<Obs*>(obs);
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      bool term = false, trunc = false;
      float reward = 0.0f;
      if (s.needs_reset) {
        s.game.reset(s.rng);
        s.elapsed = 0;
        s.needs_reset = false;
      } else {
        reward = s.game.step(actions[i], term);
        s.elapsed += 1;
        trunc = max_steps_ > 0 && s.elapsed >= max_steps_;
        s.needs_reset = term || trunc;
      }
      rewards[i] = reward;
      terminated[i] = term;
      truncated[i] = trunc;
      s.game.observe(o + i * obs_size_);
    }
  }

  void observe(void* obs) const override {
    Obs* o = static_cast<Obs*>(obs);
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].game.observe(o + i * obs_size_);
  }

  bool needs_reset(int64_t i) const override { return slots_[i].needs_reset; }

  void get_state(int64_t i, double* state, int64_t* elapsed) const override {
    slots_[i].game.get(state);
    if (elapsed) *elapsed = slots_[i].elapsed;
  }

  void set_state(int64_t i, const double* state, int64_t elapsed) override {
    Slot& s = slots_[i];
    Game g = s.game;
    g.set(state);  // validates before anything changes
    s.game = g;
    s.elapsed = elapsed;
    s.needs_reset = false;
  }

  void save_state(double* game, std::uint64_t* rng, int64_t* elapsed,
                  bool* needs_reset) const override {
    const int64_t n = Game::kStateSize;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      s.game.get(game + i * n);
      const Rng::State& r = s.rng.state();
      std::copy(r.begin(), r.end(), rng + 4 * i);
      elapsed[i] = s.elapsed;
      needs_reset[i] = s.needs_reset;
    }
  }

  void load_state(const double* game, const std::uint64_t* rng, const int64_t* elapsed,
                  const bool* needs_reset) override {
    const int64_t n = Game::kStateSize;
    std::vector<Slot> next(slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i) {  // everything checked before anything changes
      Slot& s = next[i];
      auto fail = [&](const std::string& what) {
        throw std::invalid_argument("env " + std::to_string(i) + ": " + what);
      };
      try {
        s.game.set(game + i * n, needs_reset[i]);
      } catch (const std::invalid_argument& e) {
        fail(e.what());
      }
      Rng::State r;
      std::copy(rng + 4 * i, rng + 4 * i + 4, r.begin());
      if (r[0] == 0 && r[1] == 0 && r[2] == 0 && r[3] == 0) {
        fail("an all-zero generator state never changes: not a valid state");
      }
      s.rng.set_state(r);
      if (elapsed[i] < 0) fail("elapsed steps must be >= 0, got " + std::to_string(elapsed[i]));
      if (max_steps_ > 0 && !needs_reset[i] && elapsed[i] >= max_steps_) {
        fail("elapsed steps " + std::to_string(elapsed[i]) + " reach the time limit " +
             std::to_string(max_steps_) + ", so the env must be waiting for its reset step");
      }
      s.elapsed = elapsed[i];
      s.needs_reset = needs_reset[i];
    }
    slots_.swap(next);
  }

 private:
  struct Slot {
    Game game;
    Rng rng;
    int64_t elapsed = 0;
    bool needs_reset = false;
  };
  std::vector<Slot> slots_;
  int64_t max_steps_;
  int64_t obs_size_;
};

}  // namespace

VecEnv::VecEnv(const std::string& name, int64_t num_envs, int64_t max_episode_steps)
    : spec_(env_spec(name)), num_envs_(num_envs) {
  if (num_envs < 1) {
    throw std::invalid_argument("num_envs must be >= 1, got " + std::to_string(num_envs));
  }
  max_episode_steps_ = max_episode_steps < 0 ? spec_.max_episode_steps : max_episode_steps;
  const int64_t n = spec_.obs_size();
  if (spec_.name == "CartPole-v1") {
    impl_ = std::make_unique<GameEnvs<CartPole>>(num_envs, max_episode_steps_, n);
  } else if (spec_.name == "Acrobot-v1") {
    impl_ = std::make_unique<GameEnvs<Acrobot>>(num_envs, max_episode_steps_, n);
  } else {
    impl_ = std::make_unique<GameEnvs<Catch>>(num_envs, max_episode_steps_, n);
  }
}

VecEnv::~VecEnv() = default;

void VecEnv::reset(const std::uint64_t* seeds, void* obs) {
  VecEnvGuard guard(*this);
  impl_->reset(seeds, obs);
}

void VecEnv::step(const int64_t* actions, void* obs, float* rewards, bool* terminated,
                  bool* truncated) {
  VecEnvGuard guard(*this);
  // Every action is checked before any env moves, so a bad batch leaves all K envs untouched.
  // An env about to reset ignores its action, but a bad value there is still the caller's bug.
  const int64_t n = spec_.num_actions;
  for (int64_t i = 0; i < num_envs_; ++i) {
    if (actions[i] < 0 || actions[i] >= n) {
      std::ostringstream o;
      o << "action " << actions[i] << " for env " << i << " is out of range: " << spec_.name
        << " takes actions 0.." << n - 1;
      throw std::invalid_argument(o.str());
    }
  }
  impl_->step(actions, obs, rewards, terminated, truncated);
}

void VecEnv::observe(void* obs) const {
  VecEnvGuard guard(*this);
  impl_->observe(obs);
}

namespace {
void check_index(int64_t i, int64_t k) {
  if (i < 0 || i >= k) {
    throw std::invalid_argument("env index must be in [0, " + std::to_string(k - 1) + "], got " +
                                std::to_string(i));
  }
}
}  // namespace

bool VecEnv::needs_reset(int64_t i) const {
  check_index(i, num_envs_);
  return impl_->needs_reset(i);
}

void VecEnv::get_state(int64_t i, double* state, int64_t* elapsed) const {
  check_index(i, num_envs_);
  VecEnvGuard guard(*this);
  impl_->get_state(i, state, elapsed);
}

void VecEnv::set_state(int64_t i, const double* state, int64_t elapsed) {
  check_index(i, num_envs_);
  if (elapsed < 0) {
    throw std::invalid_argument("elapsed steps must be >= 0, got " + std::to_string(elapsed));
  }
  VecEnvGuard guard(*this);
  impl_->set_state(i, state, elapsed);
}

void VecEnv::save_state(double* game, std::uint64_t* rng, int64_t* elapsed,
                        bool* needs_reset) const {
  VecEnvGuard guard(*this);
  impl_->save_state(game, rng, elapsed, needs_reset);
}

void VecEnv::load_state(const double* game, const std::uint64_t* rng, const int64_t* elapsed,
                        const bool* needs_reset) {
  VecEnvGuard guard(*this);
  impl_->load_state(game, rng, elapsed, needs_reset);
}

}  // namespace rlpar
