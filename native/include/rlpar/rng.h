// rlpar/rng.h — the small, fast, seedable generator used by native envs and action sampling.
//
//     rlpar::Rng rng(seed);            // any 64-bit seed; nearby seeds give unrelated streams
//     double u = rng.uniform();        // [0, 1), 53 random bits
//     double x = rng.uniform(lo, hi);  // lo + (hi - lo) * u, like numpy's Generator.uniform
//     uint64_t k = rng.below(n);       // [0, n)
//
// xoshiro256** (Blackman & Vigna, 2018) with its state filled by four outputs of splitmix64 run
// from the seed, as its authors recommend: splitmix64 turns seeds 0, 1, 2, ... into well-mixed,
// distinct states, so env i of a batch can simply be seeded with `seed + i`. The state is four
// words that can be read and written back (checkpoints, tests). Not cryptographic. Plain value
// type: one generator per env or per actor, never shared between threads.
#pragma once

#include <array>
#include <cstdint>

namespace rlpar {

inline std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  using State = std::array<std::uint64_t, 4>;

  explicit Rng(std::uint64_t seed = 0) { reseed(seed); }

  void reseed(std::uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }

  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // The top 53 bits: every double in [0, 1) that is a multiple of 2^-53, equally likely.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }

  // Multiply-shift (Lemire) without the rejection step: the bias is below n / 2^64, far below
  // anything a test or an agent could see, and the cost is one multiplication.
  std::uint64_t below(std::uint64_t n) {
    __extension__ typedef unsigned __int128 u128;  // GCC and Clang; __extension__: -Wpedantic
    return static_cast<std::uint64_t>((static_cast<u128>(next()) * n) >> 64);
  }

  const State& state() const { return s_; }
  // An all-zero state is the one fixed point of xoshiro: refused by callers that take user input.
  void set_state(const State& s) { s_ = s; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  State s_{};
};

}  // namespace rlpar
