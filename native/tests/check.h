// Minimal checking for the native tests: each test is a plain main() that returns non-zero on
// failure, so ctest needs no framework. CHECK records a failure and keeps going, so that one run
// reports every broken expectation.
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace rlpar_test {

struct Tally {
  int checks = 0;
  int failures = 0;
};

inline Tally& tally() {
  static Tally t;
  return t;
}

inline bool check(bool ok, const char* expr, const char* file, int line) {
  ++tally().checks;
  if (!ok) {
    ++tally().failures;
    std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, expr);
  }
  return ok;
}

// Prints the one-line summary and returns main()'s exit status.
inline int finish(const char* name) {
  const Tally& t = tally();
  std::printf("%s: %s (%d checks, %d failed)\n", name, t.failures ? "FAIL" : "PASS", t.checks,
              t.failures);
  return t.failures ? 1 : 0;
}

// n normal floats with standard deviation `scale`, the same for a given seed.
inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace rlpar_test

#define CHECK(cond) ::rlpar_test::check(static_cast<bool>(cond), #cond, __FILE__, __LINE__)

// Checks that `stmt` throws `exc`.
#define CHECK_THROWS(exc, stmt)                                       \
  do {                                                                \
    bool rlpar_thrown_ = false;                                       \
    try {                                                             \
      stmt;                                                           \
    } catch (const exc&) {                                            \
      rlpar_thrown_ = true;                                           \
    }                                                                 \
    ::rlpar_test::check(rlpar_thrown_, "throws " #exc ": " #stmt, __FILE__, __LINE__); \
  } while (0)
