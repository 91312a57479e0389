// Stress test of one shared Net (no Python): many threads run forward and forward+backward at once
// on the same net and the same parameters, and must reproduce the single-threaded results bit for
// bit; meanwhile a learner thread trains its own copy of the parameters and publishes them through
// a SnapshotStore that reader threads pin and run inference on. Under ThreadSanitizer this proves
// that the net keeps no shared mutable state beyond its workspace pool.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <thread>
#include <vector>

#include "check.h"
#include "specs.h"
#include "rlpar/amx.h"
#include "rlpar/net.h"
#include "rlpar/optim.h"
#include "rlpar/snapshot.h"

using rlpar::HeadKind;
using rlpar::LayerSpec;

namespace {

rlpar::NetSpec conv_spec() {
  rlpar::NetSpec spec;
  spec.input_shape = {6, 6, 2};
  spec.layers = {LayerSpec::conv2d(4, 3, 1, 1), LayerSpec::relu(), LayerSpec::flatten(),
                 LayerSpec::linear(16), LayerSpec::tanh()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}, {HeadKind::Gaussian, 2}};
  return spec;
}

// Wider layers: several 64-channel tiles with masked tails, an unpadded and a padded conv, and a
// linear weight gradient over dy panels (300 outputs) next to one per column tile (40).
rlpar::NetSpec wide_spec() {
  rlpar::NetSpec spec;
  spec.input_shape = {9, 9, 3};
  spec.layers = {LayerSpec::conv2d(70, 3, 1, 0), LayerSpec::relu(), LayerSpec::conv2d(20, 3, 2, 1),
                 LayerSpec::relu(), LayerSpec::flatten(), LayerSpec::linear(300), LayerSpec::relu(),
                 LayerSpec::linear(40), LayerSpec::tanh()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}};
  return spec;
}

using rlpar_test::random_vector;
using rlpar_test::wide_linear_spec;

struct Result {
  std::vector<float> out, grad;
};

Result run_once(const rlpar::Net& net, const float* params, const std::vector<float>& obs,
                const std::vector<float>& dout, int64_t batch) {
  Result r;
  r.out.resize(batch * net.output_size());
  r.grad.resize(net.num_params());
  auto tape = net.forward_train(params, obs.data(), batch, r.out.data());
  net.backward(params, *tape, dout.data(), r.grad.data(), false);
  return r;
}

// `fix_obs` (nullable) makes the random inputs valid for the net (an embedding's indices).
void shared_net_is_deterministic_across_threads(
    const rlpar::NetSpec& spec, void (*fix_obs)(std::vector<float>&, int64_t rows) = nullptr) {
  const rlpar::Net net(spec);
  const auto params = random_vector(net.num_params(), 1, 0.2f);
  const int64_t batches[] = {1, 3, 17, 70};  // wide_linear_spec: every linear path
  std::vector<std::vector<float>> obs, douts;
  std::vector<Result> expected;
  for (int64_t b : batches) {
    obs.push_back(random_vector(b * net.input_size(), 10 + b, 1.0f));
    if (fix_obs) fix_obs(obs.back(), b);
    douts.push_back(random_vector(b * net.output_size(), 20 + b, 1.0f));
    expected.push_back(run_once(net, params.data(), obs.back(), douts.back(), b));
  }
  constexpr int kThreads = 8, kIters = 60;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        const size_t k = (t + i) % std::size(batches);
        Result r = run_once(net, params.data(), obs[k], douts[k], batches[k]);
        if (r.out != expected[k].out || r.grad != expected[k].grad) ++mismatches;
        std::vector<float> out(batches[k] * net.output_size());
        net.forward(params.data(), obs[k].data(), batches[k], out.data());
        if (out != expected[k].out) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches.load() == 0);
  const auto stats = net.workspace_stats();
  CHECK(stats.workspaces <= kThreads + 1);
  CHECK(stats.idle == stats.workspaces);
  std::printf("shared net: %d threads x %d iterations, %d mismatches, %lld workspaces\n", kThreads,
              kIters, mismatches.load(), static_cast<long long>(stats.workspaces));
}

// A net with an LSTM core: learners run sequences with resets (forward_train_seq + backward
// through time) and actors carry their own state step by step (forward_seq, T = 1, state updated
// in place), all at once on one net; every result must match the single-threaded one bit for bit.
// `bf16x3`: the learners' LSTM products on AMX tiles (each thread loads its own tile state).
void recurrent_net_is_deterministic_across_threads(bool bf16x3) {
  rlpar::NetSpec spec;
  spec.input_shape = {5};
  spec.layers = {LayerSpec::linear(8), LayerSpec::tanh()};
  spec.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}};
  spec.lstm_hidden = 6;
  spec.lstm_bf16x3 = bf16x3;
  const rlpar::Net net(spec);
  const auto params = random_vector(net.num_params(), 3, 0.4f);
  // 77 rows: bf16x3's backward packs dG in 32-row K tiles, two of which straddle steps.
  const int64_t steps = 7, seqs = 11, rows = steps * seqs, s = net.state_size();
  const auto obs = random_vector(rows * net.input_size(), 30, 1.0f);
  const auto dout = random_vector(rows * net.output_size(), 31, 1.0f);
  const auto state0 = random_vector(seqs * s, 32, 0.5f);
  std::vector<uint8_t> resets(rows, 0);
  for (int64_t i = 0; i < rows; i += 5) resets[i] = 1;

  auto learner = [&](std::vector<float>& out, std::vector<float>& grad) {
    rlpar::SeqArgs seq;
    seq.steps = steps;
    seq.seqs = seqs;
    seq.state0 = state0.data();
    seq.resets = resets.data();
    out.assign(rows * net.output_size(), 0.0f);
    grad.assign(net.num_params(), 0.0f);
    auto tape = net.forward_train_seq(params.data(), obs.data(), seq, out.data());
    net.backward(params.data(), *tape, dout.data(), grad.data(), false);
  };
  // bf16x3: the actors' steps read the core's weights packed once for a snapshot (here: one
  // owner, version 1, through the net's shared cache), the reference packs them in its call.
  const auto owner = std::make_shared<int>(0);
  auto actor = [&](std::vector<float>& out, std::vector<float>& state, bool cached) {
    state = state0;
    out.assign(rows * net.output_size(), 0.0f);
    for (int64_t t = 0; t < steps; ++t) {
      rlpar::SeqArgs seq;
      seq.seqs = seqs;
      seq.state0 = state.data();
      seq.state_out = state.data();
      seq.resets = resets.data() + t * seqs;
      std::shared_ptr<const rlpar::PackedCore> packed;
      if (cached) packed = net.core_weights(params.data(), owner, 1, true);
      seq.packed_core = packed.get();
      net.forward_seq(params.data(), obs.data() + t * seqs * net.input_size(), seq,
                      out.data() + t * seqs * net.output_size());
    }
  };
  std::vector<float> want_out, want_grad, want_steps, want_state;
  learner(want_out, want_grad);
  actor(want_steps, want_state, false);
  constexpr int kThreads = 6, kIters = 40;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> a, b;
      for (int i = 0; i < kIters; ++i) {
        if ((t + i) % 2 == 0) {
          learner(a, b);
          if (a != want_out || b != want_grad) ++mismatches;
        } else {
          actor(a, b, bf16x3 && (i / 2) % 2 == 0);
          if (a != want_steps || b != want_state) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches.load() == 0);
  std::printf("recurrent net%s: %d threads x %d iterations, %d mismatches\n",
              bf16x3 ? " (bf16x3)" : "", kThreads, kIters, mismatches.load());
}

// One learner trains and publishes; readers pin and run forward on whatever version they get.
void learner_publishes_while_actors_infer() {
  const rlpar::Net net(conv_spec());
  const int64_t n = net.num_params();
  rlpar::SnapshotStore store(static_cast<size_t>(n), 8);
  auto params = random_vector(n, 2, 0.2f);
  store.publish(params.data(), params.size());

  std::atomic<bool> stop{false};
  std::atomic<int64_t> inferences{0};
  std::atomic<int> bad{0};
  std::vector<std::thread> actors;
  for (int a = 0; a < 4; ++a) {
    actors.emplace_back([&, a] {
      const int64_t batch = 4;
      const auto obs = random_vector(batch * net.input_size(), 100 + a, 1.0f);
      std::vector<float> out(batch * net.output_size());
      uint64_t last = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        rlpar::Pin pin = store.pin();
        if (pin.version() < last) ++bad;
        last = pin.version();
        net.forward(pin.data(), obs.data(), batch, out.data());
        if (!std::all_of(out.begin(), out.end(), [](float x) { return x == x; })) ++bad;
        ++inferences;
      }
    });
  }

  const int64_t batch = 16;
  const auto obs = random_vector(batch * net.input_size(), 7, 1.0f);
  const auto dout = random_vector(batch * net.output_size(), 8, 0.1f);
  std::vector<float> out(batch * net.output_size()), grad(n), sq(n, 0.0f);
  int steps = 0;
  for (; steps < 200; ++steps) {
    auto tape = net.forward_train(params.data(), obs.data(), batch, out.data());
    net.backward(params.data(), *tape, dout.data(), grad.data(), false);
    rlpar::optim::clip_by_global_norm(grad.data(), grad.size(), 1.0);
    rlpar::optim::rmsprop_step(params.data(), grad.data(), sq.data(), nullptr, nullptr, n, 1e-3f,
                               0.99f, 1e-5f, 0.0f, 0.0f);
    store.publish(params.data(), params.size());
  }
  stop.store(true);
  for (auto& th : actors) th.join();
  CHECK(bad.load() == 0);
  CHECK(store.skipped() == 0);
  CHECK(store.latest_version() == static_cast<uint64_t>(steps) + 1);
  CHECK(inferences.load() > 0);
  std::printf("learner + actors: %d publishes, %lld inferences, %d bad\n", steps,
              static_cast<long long>(inferences.load()), bad.load());
}

}  // namespace

int main() {
  shared_net_is_deterministic_across_threads(conv_spec());
  shared_net_is_deterministic_across_threads(wide_spec());
  shared_net_is_deterministic_across_threads(wide_linear_spec());
  shared_net_is_deterministic_across_threads(rlpar_test::blocks_spec());
  shared_net_is_deterministic_across_threads(rlpar_test::concat_spec(), rlpar_test::concat_indices);
  recurrent_net_is_deterministic_across_threads(false);
  if (rlpar::amx::available()) recurrent_net_is_deterministic_across_threads(true);
  learner_publishes_while_actors_infer();
  return rlpar_test::finish("test_net_stress");
}
