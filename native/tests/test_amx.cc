// The bf16x3 AMX products (rlpar/amx.h) against a float64 reference: every layout of A and B,
// shapes with partial tiles, operands side by side along K, accumulation into c, rows
// independent of the call's row count, and several threads at once (bit-identical to one
// thread; races show under TSan). On a CPU without AMX only the sizes are checked.
#include "rlpar/amx.h"

#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "check.h"

using rlpar_test::random_vector;

namespace {

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

using rlpar::amx::Start;

// c0 + A B (or A B, or bias + A B, as `start` says) with A [M, K] and B [K, N] stored as
// `ta`/`tb` say, in bf16x3 on AMX.
std::vector<float> amx_product(const Case& s, const std::vector<float>& a,
                               const std::vector<float>& b, const std::vector<float>& c0,
                               Start start = Start::kAccumulate,
                               const float* bias = nullptr) {
  std::vector<uint16_t> pa(rlpar::amx::packed_a_elems(s.m, s.k));
  std::vector<uint16_t> pb(rlpar::amx::packed_b_elems(s.k, s.n));
  rlpar::amx::pack_a(pa.data(), a.data(), s.m, s.k, s.ta ? s.m : s.k, s.ta);
  rlpar::amx::pack_b(pb.data(), b.data(), s.k, s.n, s.tb ? s.k : s.n, s.tb);
  std::vector<float> c = c0;
  rlpar::amx::gemm(c.data(), s.n, pa.data(), pb.data(), s.m, s.n, s.k, start, bias);
  return c;
}

void check_case(const Case& s, uint32_t seed, Start start) {
  const auto a = random_vector(s.m * s.k, seed, 1.0f);
  const auto b = random_vector(s.k * s.n, seed + 1, 1.0f);
  const auto c0 = random_vector(s.m * s.n, seed + 2, 1.0f);
  const auto bias = random_vector(s.n, seed + 3, 1.0f);
  const auto c = amx_product(s, a, b, c0, start, bias.data());
  double worst = 0.0;  // |error| / sum |a_k b_k|
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double ref = start == Start::kAccumulate ? c0[i * s.n + j]
                   : start == Start::kBias     ? bias[j]
                                               : 0.0;
      double mag = std::fabs(ref);
      for (int64_t p = 0; p < s.k; ++p) {
        const double x = s.ta ? a[p * s.m + i] : a[i * s.k + p];
        const double y = s.tb ? b[j * s.k + p] : b[p * s.n + j];
        ref += x * y;
        mag += std::fabs(x * y);
      }
      worst = std::fmax(worst, std::fabs(c[i * s.n + j] - ref) / std::fmax(mag, 1e-30));
    }
  }
  // bf16x3 drops the lo * lo term (~2^-16 of each product) and rounds the halves: ~1e-5; one
  // bf16 pass would be ~4e-3, float32 ~1e-7.
  const bool ok = worst < 4e-5;
  CHECK(ok);
  if (!ok) {
    std::fprintf(stderr, "  m=%lld n=%lld k=%lld ta=%d tb=%d start=%d: relative error %.3g\n",
                 (long long)s.m, (long long)s.n, (long long)s.k, s.ta, s.tb,
                 static_cast<int>(start), worst);
  }
}

// Rows 0..r of an M-row product are the same floats as the product of those r rows alone.
void check_row_independence() {
  const Case whole{70, 48, 100, false, false}, part{17, 48, 100, false, false};
  const auto a = random_vector(whole.m * whole.k, 7, 1.0f);
  const auto b = random_vector(whole.k * whole.n, 8, 1.0f);
  const std::vector<float> zero(whole.m * whole.n, 0.0f);
  const auto c = amx_product(whole, a, b, zero);
  const std::vector<float> a_part(a.begin(), a.begin() + part.m * part.k);
  const auto cp = amx_product(part, a_part, b, std::vector<float>(part.m * part.n, 0.0f));
  bool same = true;
  for (int64_t i = 0; i < part.m * part.n; ++i) same = same && c[i] == cp[i];
  CHECK(same);
}

// Four threads at once, each its own product of shared packed operands: the same bits as one.
void check_threads() {
  const Case s{64, 96, 200, false, true};
  const auto a = random_vector(s.m * s.k, 11, 1.0f);
  const auto b = random_vector(s.k * s.n, 12, 1.0f);
  std::vector<uint16_t> pa(rlpar::amx::packed_a_elems(s.m, s.k));
  std::vector<uint16_t> pb(rlpar::amx::packed_b_elems(s.k, s.n));
  rlpar::amx::pack_a(pa.data(), a.data(), s.m, s.k, s.k, false);
  rlpar::amx::pack_b(pb.data(), b.data(), s.k, s.n, s.k, true);
  std::vector<float> want(s.m * s.n, 0.0f);
  rlpar::amx::gemm(want.data(), s.n, pa.data(), pb.data(), s.m, s.n, s.k);
  std::vector<std::vector<float>> got(4, std::vector<float>(s.m * s.n, 0.0f));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        std::fill(got[t].begin(), got[t].end(), 0.0f);
        rlpar::amx::gemm(got[t].data(), s.n, pa.data(), pb.data(), s.m, s.n, s.k);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(got[t] == want);
}

// Operands side by side along K (pack_a_part, pack_b_part): [A1 | A2] [B1; B2] = A1 B1 + A2 B2,
// with each part's K padded to whole tiles (45 and 70 here), in every layout.
void check_side_by_side(bool ta, bool tb) {
  const int64_t m = 19, n = 37, k1 = 45, k2 = 70;
  const int64_t kb = rlpar::amx::k_tiles(k1) + rlpar::amx::k_tiles(k2);
  const auto a1 = random_vector(m * k1, 21, 1.0f), a2 = random_vector(m * k2, 22, 1.0f);
  const auto b1 = random_vector(k1 * n, 23, 1.0f), b2 = random_vector(k2 * n, 24, 1.0f);
  std::vector<uint16_t> pa(rlpar::amx::packed_a_elems(m, 32 * kb), 0xFFFF);
  std::vector<uint16_t> pb(rlpar::amx::packed_b_elems(32 * kb, n), 0xFFFF);  // all overwritten
  rlpar::amx::pack_a_part(pa.data(), a1.data(), m, k1, ta ? m : k1, ta, 0, kb);
  rlpar::amx::pack_a_part(pa.data(), a2.data(), m, k2, ta ? m : k2, ta, rlpar::amx::k_tiles(k1),
                          kb);
  rlpar::amx::pack_b_part(pb.data(), b1.data(), k1, n, tb ? k1 : n, tb, 0, kb);
  rlpar::amx::pack_b_part(pb.data(), b2.data(), k2, n, tb ? k2 : n, tb, rlpar::amx::k_tiles(k1),
                          kb);
  std::vector<float> c(m * n);
  rlpar::amx::gemm(c.data(), n, pa.data(), pb.data(), m, n, 32 * kb, Start::kOverwrite);
  double worst = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int part = 0; part < 2; ++part) {
        const int64_t k = part == 0 ? k1 : k2;
        const std::vector<float>& a = part == 0 ? a1 : a2;
        const std::vector<float>& b = part == 0 ? b1 : b2;
        for (int64_t p = 0; p < k; ++p) {
          const double x = ta ? a[p * m + i] : a[i * k + p];
          const double y = tb ? b[j * k + p] : b[p * n + j];
          ref += x * y;
          mag += std::fabs(x * y);
        }
      }
      worst = std::fmax(worst, std::fabs(c[i * n + j] - ref) / mag);
    }
  }
  CHECK(worst < 4e-5);
}

}  // namespace

int main() {
  // Packed sizes: whole tiles of 16 x 32, hi and lo.
  CHECK(rlpar::amx::packed_a_elems(16, 32) == 2 * 512);
  CHECK(rlpar::amx::packed_a_elems(17, 33) == 2 * 4 * 512);
  CHECK(rlpar::amx::packed_b_elems(33, 17) == 2 * 4 * 512);
  CHECK(rlpar::amx::k_tiles(0) == 0 && rlpar::amx::k_tiles(32) == 1 && rlpar::amx::k_tiles(33) == 2);
  if (!rlpar::amx::available()) {
    std::printf("test_amx: this CPU or OS has no AMX-BF16 tiles; products not checked\n");
    return rlpar_test::finish("test_amx");
  }
  uint32_t seed = 1;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      // Whole tiles, partial tiles on every side, one row, no K, several K chunks (1024 each).
      for (const Case& s :
           {Case{32, 32, 64, ta, tb}, Case{37, 45, 71, ta, tb}, Case{1, 16, 5, ta, tb},
            Case{16, 1, 1, ta, tb}, Case{5, 20, 0, ta, tb}, Case{48, 33, 2100, ta, tb},
            Case{300, 70, 40, ta, tb}}) {
        for (const Start start : {Start::kAccumulate, Start::kOverwrite, Start::kBias}) {
          check_case(s, seed, start);
          seed += 4;
        }
      }
    }
  }
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) check_side_by_side(ta, tb);
  }
  check_row_independence();
  check_threads();
  return rlpar_test::finish("test_amx");
}
