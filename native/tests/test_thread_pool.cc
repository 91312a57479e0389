// The intra-op ThreadPool and the net calls that use it (no Python). Under ThreadSanitizer this
// shows that a pool's runs hand their work over without races, and that a net's torso split
// over batch rows keeps the parts apart; the results must be deterministic for a pool size.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "specs.h"
#include "rlpar/layers.h"
#include "rlpar/net.h"
#include "rlpar/thread_pool.h"

using rlpar::HeadKind;
using rlpar::LayerSpec;

namespace {

using rlpar_test::random_vector;
using rlpar_test::wide_linear_spec;

void every_task_runs_once() {
  rlpar::ThreadPool pool(4);
  CHECK(pool.threads() == 4);
  for (int64_t tasks : {0, 1, 3, 4, 9, 100}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(tasks, 1)));
    for (int round = 0; round < 20; ++round) {
      pool.run(tasks, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
    }
    for (int64_t i = 0; i < tasks; ++i) CHECK(hits[static_cast<size_t>(i)].load() == 20);
  }
  bool threw = false;
  try {
    rlpar::ThreadPool bad(0);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("got 0") != std::string::npos;
  }
  CHECK(threw);
}

void exceptions_reach_the_caller() {
  rlpar::ThreadPool pool(3);
  std::atomic<int> ran{0};
  std::string what;
  try {
    pool.run(12, [&](int64_t i) {
      ran.fetch_add(1);
      if (i == 7 || i == 4) throw std::runtime_error("task " + std::to_string(i));
    });
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  CHECK(what == "task 4");  // the lowest-numbered failure, after every task ran
  CHECK(ran.load() == 12);
  // The pool is usable afterwards.
  std::atomic<int> after{0};
  pool.run(5, [&](int64_t) { after.fetch_add(1); });
  CHECK(after.load() == 5);
}

void nested_and_shared_runs() {
  rlpar::ThreadPool pool(3);
  // A task that runs the same pool again runs the inner tasks inline.
  std::atomic<int> inner{0};
  pool.run(4, [&](int64_t) { pool.run(3, [&](int64_t) { inner.fetch_add(1); }); });
  CHECK(inner.load() == 12);
  // Callers on several threads take turns.
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 50; ++round) {
        std::vector<int64_t> out(16, -1);
        pool.run(16, [&](int64_t i) { out[static_cast<size_t>(i)] = i * c; });
        for (int64_t i = 0; i < 16; ++i) {
          if (out[static_cast<size_t>(i)] != i * c) bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  CHECK(bad.load() == 0);
}

struct Result {
  std::vector<float> out, grad;
};

Result train_once(const rlpar::Net& net, const std::vector<float>& params,
                  const std::vector<float>& obs, const std::vector<float>& dout,
                  const rlpar::SeqArgs& seq, rlpar::ThreadPool* pool,
                  const std::vector<float>* start = nullptr) {
  const int64_t rows = seq.steps * seq.seqs;
  Result r;
  r.out.assign(rows * net.output_size(), 0.0f);
  r.grad = start ? *start : std::vector<float>(net.num_params(), 0.0f);
  auto tape = net.forward_train_seq(params.data(), obs.data(), seq, r.out.data(), pool);
  net.backward(params.data(), *tape, dout.data(), r.grad.data(), start != nullptr, pool);
  return r;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1e-6;
  for (float x : b) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst / scale;
}

// The split call against the whole one: the same outputs and gradients bit for bit (the AVX-512
// kernels sum every float in the same order; the portable GEMM path only within rounding), for
// pools of several sizes; and the same results whatever the calling thread, with threads sharing
// the pool or each having its own.
// `fix_obs` (nullable) makes the random inputs valid for the net (an embedding's indices).
void split_matches_whole(const char* name, const rlpar::NetSpec& spec, int64_t steps,
                         int64_t seqs,
                         void (*fix_obs)(std::vector<float>&, int64_t rows) = nullptr) {
  const rlpar::Net net(spec);
  const auto params = random_vector(net.num_params(), 5, 0.15f);
  const int64_t rows = steps * seqs;
  auto obs = random_vector(rows * net.input_size(), 6, 1.0f);
  if (fix_obs) fix_obs(obs, rows);
  const auto dout = random_vector(rows * net.output_size(), 7, 1.0f);
  const auto state0 = random_vector(seqs * net.state_size(), 8, 0.5f);
  std::vector<uint8_t> resets(rows, 0);
  for (int64_t i = 0; i < rows; i += 7) resets[i] = 1;
  rlpar::SeqArgs seq;
  seq.steps = steps;
  seq.seqs = seqs;
  if (net.recurrent()) {
    seq.state0 = state0.data();
    seq.resets = resets.data();
  }
  rlpar::ThreadPool pool(4);
  const int64_t parts = net.torso_parts(&pool, rows);
  CHECK(parts == 4);
  CHECK(net.torso_parts(nullptr, rows) == 1);
  CHECK(net.torso_parts(&pool, 1) == 1);

  const Result whole = train_once(net, params, obs, dout, seq, nullptr);
  const Result split = train_once(net, params, obs, dout, seq, &pool);
  const double rel = max_rel_diff(split.grad, whole.grad);
#if defined(__AVX512F__)
  CHECK(split.out == whole.out);
  CHECK(split.grad == whole.grad);
  for (int64_t size : {2, 3, 7}) {
    rlpar::ThreadPool other(size);
    const Result r = train_once(net, params, obs, dout, seq, &other);
    CHECK(r.out == whole.out && r.grad == whole.grad);
  }
#else
  CHECK(max_rel_diff(split.out, whole.out) < 1e-5);  // Eigen's GEMM blocks by the row count
  CHECK(rel < 1e-4);
#endif
  // accumulate = true adds the same gradient onto what was there.
  const auto start = random_vector(net.num_params(), 9, 1.0f);
  const Result added = train_once(net, params, obs, dout, seq, &pool, &start);
  std::vector<float> want(start);
  for (size_t i = 0; i < want.size(); ++i) want[i] += split.grad[i];
  CHECK(max_rel_diff(added.grad, want) < 1e-5);

  constexpr int kThreads = 3, kIters = 4;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      rlpar::ThreadPool own(4);
      for (int i = 0; i < kIters; ++i) {
        const Result r = train_once(net, params, obs, dout, seq, (t + i) % 2 ? &pool : &own);
        if (r.out != split.out || r.grad != split.grad) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches.load() == 0);
  std::printf("%s: %lld rows in %lld parts, gradient within %.1e of the whole call, %d mismatches\n",
              name, static_cast<long long>(rows), static_cast<long long>(parts), rel,
              mismatches.load());
}

// A Linear backward reading panels packed once, a slice per part on the pool (as a split
// backward and an LSTM's steps do), gives the floats of the calls that pack their own: widths
// with tail tiles, more than one 512-output block, dy passes with a short last one, and more
// parts than there are tiles or passes (some parts pack nothing).
void shared_panels_match_own() {
  namespace L = rlpar::layers;
  rlpar::ThreadPool pool(3);
  int checked = 0;
  for (const auto& [batch, in, out] : {std::array<int64_t, 3>{70, 600, 520},
                                       std::array<int64_t, 3>{130, 130, 1030},
                                       std::array<int64_t, 3>{5, 40, 300},
                                       std::array<int64_t, 3>{64, 77, 100}}) {
    const auto w = random_vector(in * out, 11, 0.1f);
    const auto dy = random_vector(batch * out, 12, 1.0f);
    const auto x = random_vector(batch * in, 13, 1.0f);
    std::vector<float> own_dx(batch * in), own_dw(in * out, 0.5f), own_db(out, 0.25f);
    L::linear_data_grad(own_dx.data(), dy.data(), w.data(), batch, in, out);
    L::linear_weight_grad(own_dw.data(), own_db.data(), dy.data(), x.data(), batch, in, out, 0, 1);
    for (int64_t parts : {1, 2, 5, 40}) {
      std::vector<float> wt(L::linear_dx_panel_floats(in, out));
      std::vector<float> dyp(L::linear_dy_panel_floats(batch, out));
      pool.run(parts, [&](int64_t p) {
        L::pack_linear_dx_panels(wt.data(), w.data(), in, out, p, parts);
        L::pack_linear_dy_panels(dyp.data(), dy.data(), batch, out, p, parts);
      });
      const float* wt_or_null = wt.empty() ? nullptr : wt.data();
      const float* dyp_or_null = dyp.empty() ? nullptr : dyp.data();
      std::vector<float> dx(batch * in), dw(in * out, 0.5f), db(out, 0.25f);
      pool.run(parts, [&](int64_t p) {
        int64_t r0, r1;
        L::split_range(batch, parts, p, &r0, &r1);
        L::linear_data_grad(dx.data() + r0 * in, dy.data() + r0 * out, w.data(), r1 - r0, in,
                            out, wt_or_null);
        L::linear_weight_grad(dw.data(), db.data(), dy.data(), x.data(), batch, in, out, p, parts,
                              dyp_or_null);
      });
#if defined(__AVX512F__)
      CHECK(!wt.empty());
      CHECK(dyp.empty() == (out < 256));
      CHECK(dx == own_dx && dw == own_dw && db == own_db);
#else
      CHECK(wt.empty() && dyp.empty());  // the Eigen path reads no panels
      CHECK(max_rel_diff(dx, own_dx) < 1e-5 && max_rel_diff(dw, own_dw) < 1e-5);
#endif
      ++checked;
    }
  }
  std::printf("shared panels: %d shapes x parts, same floats as the calls' own panels\n", checked);
}

rlpar::NetSpec wide_conv_spec(int64_t lstm) {
  rlpar::NetSpec spec;
  spec.input_shape = {9, 9, 3};
  spec.layers = {LayerSpec::conv2d(70, 3, 1, 0), LayerSpec::relu(), LayerSpec::conv2d(20, 3, 2, 1),
                 LayerSpec::relu(), LayerSpec::flatten(), LayerSpec::linear(300), LayerSpec::relu(),
                 LayerSpec::linear(40), LayerSpec::tanh()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}, {HeadKind::Gaussian, 2}};
  spec.lstm_hidden = lstm;
  return spec;
}

rlpar::NetSpec scaled_input_spec() {
  rlpar::NetSpec spec;
  spec.input_shape = {12, 12, 2};
  spec.input_scale = 0.5f;
  spec.layers = {LayerSpec::conv2d(32, 4, 2, 0), LayerSpec::relu(), LayerSpec::flatten(),
                 LayerSpec::linear(64), LayerSpec::relu()};
  spec.heads = {{HeadKind::Categorical, 4}, {HeadKind::Value, 1}};
  return spec;
}

}  // namespace

int main() {
  every_task_runs_once();
  exceptions_reach_the_caller();
  nested_and_shared_runs();
  shared_panels_match_own();
  split_matches_whole("conv torso", wide_conv_spec(0), 1, 43);
  split_matches_whole("conv torso + LSTM", wide_conv_spec(16), 6, 7);
  split_matches_whole("scaled input", scaled_input_spec(), 1, 150);
  // The whole call's 150 rows read packed weight panels; parts of 75 or 50 rows packed panels,
  // of 37 the weight in place, of 21 the few-rows tiles.
  split_matches_whole("wide linear + LSTM", wide_linear_spec(), 1, 150);
  split_matches_whole("pool, layernorm, residual blocks", rlpar_test::blocks_spec(), 1, 90);
  split_matches_whole("concat branches, embedding", rlpar_test::concat_spec(), 1, 400,
                      rlpar_test::concat_indices);
  return rlpar_test::finish("test_thread_pool");
}
