// The bf16x3 AMX probe (issue 13): how fast are this machine's AMX tiles, and how do rlpar's
// bf16x3 products (rlpar/amx.h; their accuracy is native/tests/test_amx.cc's) compare with its
// float32 kernels on the LSTM learner's GEMMs? Prints, on one core:
//   1. the tiles' own rate: dot products on tiles already loaded, and with a tile load per dot
//      product (a bf16x3 GEMM loads 8 tiles per 12 products);
//   2. the LSTM learner's GEMM shapes ([T=20, B=256], 256 -> 256 hidden), bf16x3 against
//      rlpar's float32 kernels, alternating, best of 5, in float32-equivalent GFLOP/s
//      (2 m n k / time; packing included). float32's forward runs X Wx once and h Wh per step;
//      bf16x3's one product per step over [x_t | h] (lstm.cc), timed here on that shape.
// Build and run from the repository root (needs g++ >= 12 and the dev install's cmeel-eigen):
//   bash experiments/amx_bf16x3/run.sh
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "rlpar/amx.h"
#include "rlpar/layers.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Shape {
  int64_t m, n, k;
  bool ta, tb;  // A stored [K, M] / B stored [N, K]
};

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-bf16"))) void tile_rates() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) static uint16_t buf[4 * 512] = {};
  const double flop = 4 * 2.0 * 16 * 16 * 32;  // four dot products of 16 x 16 x 32
  for (int rep = 0; rep < 3; ++rep) {
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const long it = 1000000;
    double t0 = now();
    for (long i = 0; i < it; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    const double no_loads = flop * it / (now() - t0) / 1e9;
    t0 = now();
    for (long i = 0; i < it; ++i) {
      _tile_loadd(4, buf, 64);
      _tile_loadd(6, buf + 512, 64);
      _tile_loadd(5, buf + 1024, 64);
      _tile_loadd(7, buf + 1536, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    const double with_loads = flop * it / (now() - t0) / 1e9;
    std::printf("bf16 tile dot products, GFLOP/s: %.0f on loaded tiles, %.0f with a tile load "
                "each from L1\n", no_loads, with_loads);
  }
  _tile_release();
}

// One LSTM learner GEMM: bf16x3 (packing included) and float32 (rlpar's kernel), `reps` calls.
struct Gemm {
  const char* name;
  Shape s;
  int reps;
};

double run_bf16x3(const Gemm& g, const std::vector<float>& a, const std::vector<float>& b,
                  std::vector<float>& c) {
  const Shape& s = g.s;
  std::vector<uint16_t> pa(rlpar::amx::packed_a_elems(s.m, s.k));
  std::vector<uint16_t> pb(rlpar::amx::packed_b_elems(s.k, s.n));
  const double t0 = now();
  rlpar::amx::pack_b(pb.data(), b.data(), s.k, s.n, s.tb ? s.k : s.n, s.tb);
  for (int r = 0; r < g.reps; ++r) {
    rlpar::amx::pack_a(pa.data(), a.data(), s.m, s.k, s.ta ? s.m : s.k, s.ta);
    rlpar::amx::gemm(c.data(), s.n, pa.data(), pb.data(), s.m, s.n, s.k);
  }
  return now() - t0;
}

double run_float32(const Gemm& g, const std::vector<float>& a, const std::vector<float>& b,
                   std::vector<float>& c) {
  const Shape& s = g.s;
  std::vector<float> db(s.n, 0.0f);
  const double t0 = now();
  for (int r = 0; r < g.reps; ++r) {
    if (s.ta) {  // c [M, N] += a^T b: the weight gradient, a [K, M], b [K, N]
      rlpar::layers::linear_weight_grad(c.data(), db.data(), b.data(), a.data(), s.k, s.m, s.n, 0,
                                        1);
    } else if (s.tb) {  // c = a b^T: the data gradient, b [N, K]
      rlpar::layers::linear_data_grad(c.data(), a.data(), b.data(), s.m, s.n, s.k);
    } else {
      rlpar::layers::linear_forward_add(c.data(), a.data(), b.data(), s.m, s.k, s.n);
    }
  }
  return now() - t0;
}

}  // namespace

int main() {
  if (!rlpar::amx::available()) {
    std::printf("this CPU or OS has no AMX-BF16 tiles\n");
    return 1;
  }
  tile_rates();
  const Gemm gemms[] = {
      {"gates = X Wx (forward, once)", {5120, 1024, 256, false, false}, 1},
      {"gates += h Wh (forward, x20)", {256, 1024, 256, false, false}, 20},
      {"gates = [x|h] [Wx;Wh] (fwd, x20)", {256, 1024, 512, false, false}, 20},
      {"dh = dG Wh^T (backward, x20)", {256, 256, 1024, false, true}, 20},
      {"dWx += X^T dG (backward, once)", {256, 1024, 5120, true, false}, 1},
  };
  for (const Gemm& g : gemms) {
    const Shape& s = g.s;
    const auto a = randn(s.m * s.k, 3), b = randn(s.k * s.n, 4);
    std::vector<float> c(s.m * s.n, 0.0f);
    const double flop = 2.0 * s.m * s.n * s.k * g.reps;
    double best_amx = 1e30, best_f32 = 1e30;
    for (int round = 0; round < 5; ++round) {  // alternating, best of 5
      best_amx = std::fmin(best_amx, run_bf16x3(g, a, b, c));
      best_f32 = std::fmin(best_f32, run_float32(g, a, b, c));
    }
    std::printf("%-32s bf16x3 %5.1f ms (%3.0f GFLOP/s)  float32 %5.1f ms (%3.0f GFLOP/s)\n",
                g.name, best_amx * 1e3, flop / best_amx / 1e9, best_f32 * 1e3,
                flop / best_f32 / 1e9);
  }
  return 0;
}
