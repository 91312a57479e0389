// train_step (rlpar/train_step.h) against the chain of separate calls it fuses — gather the
// columns, forward_train_seq, the loss, backward, clip, the optimizer — bit for bit, for the
// actor-critic and PPO losses, a recurrent net, a Gaussian policy with its bound penalty and the
// three optimizers; its refusals (nothing written to params then); and several threads stepping
// their own params on one shared net at once, each equal to its single-threaded twin (under
// ThreadSanitizer: no shared mutable state beyond the net's workspace pool).
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "check.h"
#include "rlpar/inbox.h"
#include "rlpar/learn_loop.h"
#include "rlpar/losses.h"
#include "rlpar/net.h"
#include "rlpar/optim.h"
#include "rlpar/snapshot.h"
#include "rlpar/ticket_queue.h"
#include "rlpar/train_step.h"

using rlpar::HeadKind;
using rlpar::LayerSpec;
using rlpar::train::LossKind;
using rlpar::train::OptimKind;

namespace {

rlpar::NetSpec spec(bool lstm, bool gaussian) {
  rlpar::NetSpec s;
  s.input_shape = {5};
  s.layers = {LayerSpec::linear(16), LayerSpec::tanh()};
  if (gaussian) {
    s.heads = {{HeadKind::Gaussian, 2}, {HeadKind::Value, 1}};
  } else {
    s.heads = {{HeadKind::Categorical, 3}, {HeadKind::Value, 1}};
  }
  s.lstm_hidden = lstm ? 8 : 0;
  return s;
}

// A batch [T, N] with its arrays, episode ends and autoreset steps.
struct Data {
  int64_t T, N;
  std::vector<float> obs, behaviour, rewards, core_state, actions_f;
  std::vector<int64_t> actions_i;
  std::vector<uint8_t> terminated, truncated, mask;

  Data(const rlpar::Net& net, int64_t T_, int64_t N_, bool gaussian, uint32_t seed)
      : T(T_), N(N_) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    obs = rlpar_test::random_vector((T + 1) * N * net.input_size(), seed, 1.0f);
    behaviour = rlpar_test::random_vector(T * N * net.output_size(), seed + 1, 0.5f);
    rewards = rlpar_test::random_vector(T * N, seed + 2, 1.0f);
    core_state = rlpar_test::random_vector(N * net.state_size(), seed + 3, 0.3f);
    terminated.assign(T * N, 0);
    truncated.assign(T * N, 0);
    mask.assign(T * N, 1);
    for (int64_t i = 0; i < T * N; ++i) {
      terminated[i] = u(rng) > 0.8f;
      truncated[i] = !terminated[i] && u(rng) > 0.9f;
      if (i >= N && (terminated[i - N] || truncated[i - N])) mask[i] = 0;
    }
    if (gaussian) {
      actions_f = rlpar_test::random_vector(T * N * 2, seed + 4, 2.0f);  // some out of bounds
      // Means far out of [-1, 1]: the bound penalty has work to do.
      for (int64_t i = 0; i < T * N; ++i) behaviour[i * net.output_size()] += 3.0f;
    } else {
      actions_i.resize(T * N);
      for (auto& a : actions_i) a = static_cast<int64_t>(rng() % 3);
    }
  }

  rlpar::train::BatchView view() const {
    rlpar::train::BatchView b;
    b.T = T;
    b.N = N;
    b.obs = obs.data();
    b.behaviour = behaviour.data();
    b.actions = actions_f.empty() ? static_cast<const void*>(actions_i.data()) : actions_f.data();
    b.rewards = rewards.data();
    b.terminated = terminated.data();
    b.truncated = truncated.data();
    b.mask = mask.data();
    b.core_state = core_state.empty() ? nullptr : core_state.data();
    return b;
  }
};

const double kLow[2] = {-0.05, -0.02};
const double kHigh[2] = {0.05, 0.02};

rlpar::train::LossSpec loss_spec(const rlpar::Net& net, LossKind kind, bool gaussian) {
  rlpar::train::LossSpec l;
  l.kind = kind;
  rlpar::losses::ActorCriticArgs& a = kind == LossKind::Ppo ? l.ppo.base : l.actor_critic;
  a.policy = gaussian ? rlpar::losses::Policy::Gaussian : rlpar::losses::Policy::Categorical;
  a.policy_begin = 0;
  a.num_actions = gaussian ? 2 : 3;
  a.log_std_begin = gaussian ? 2 : 0;
  a.value_col = net.output_size() - 1;
  a.importance_weighting = true;
  l.ppo.value_mean = 0.3;
  l.ppo.value_std = 1.7;
  l.ppo.value_clip = 0.2;
  if (gaussian) {
    l.bound_cost = 0.7;
    l.low = kLow;
    l.high = kHigh;
  }
  return l;
}

struct OptimState {
  std::vector<float> b0, b1, b2;
  rlpar::train::OptimStep step;
  OptimState(OptimKind kind, int64_t n) : b0(n, 0.0f), b1(n, 0.0f), b2(n, 0.0f) {
    step.kind = kind;
    step.lr = 0.01f;
    step.momentum = kind == OptimKind::Adam ? 0.0f : 0.9f;
    step.weight_decay = 0.01f;
    step.nesterov = true;
    step.eps = 1e-5f;
    step.buf0 = b0.data();
    step.buf1 = kind == OptimKind::Sgd ? nullptr : b1.data();
    step.buf2 = kind == OptimKind::RmsProp ? b2.data() : nullptr;
  }
};

// The chain train_step fuses, written out with the separate calls.
double by_hand(const rlpar::Net& net, float* params, float* grad, const Data& d,
               const std::vector<int64_t>& cols, const rlpar::train::LossSpec& loss,
               double max_norm, const rlpar::train::OptimStep& o) {
  const int64_t M = static_cast<int64_t>(cols.size()), T = d.T, O = net.output_size();
  const int64_t D = net.input_size(), S = net.state_size();
  const bool gaussian = !d.actions_f.empty();
  const int64_t A = gaussian ? 2 : 1;
  std::vector<float> obs((T + 1) * M * D), beh(T * M * O), rew(T * M), state(M * S), act_f;
  std::vector<int64_t> act_i;
  std::vector<uint8_t> te(T * M), tr(T * M), mk(T * M), resets((T + 1) * M, 0);
  if (gaussian) act_f.resize(T * M * A); else act_i.resize(T * M);
  for (int64_t t = 0; t <= T; ++t) {
    for (int64_t j = 0; j < M; ++j) {
      const int64_t src = t * d.N + cols[j], dst = t * M + j;
      std::memcpy(&obs[dst * D], &d.obs[src * D], sizeof(float) * D);
      if (t == T) continue;
      std::memcpy(&beh[dst * O], &d.behaviour[src * O], sizeof(float) * O);
      rew[dst] = d.rewards[src];
      te[dst] = d.terminated[src];
      tr[dst] = d.truncated[src];
      mk[dst] = d.mask[src];
      if (gaussian) {
        std::memcpy(&act_f[dst * A], &d.actions_f[src * A], sizeof(float) * A);
      } else {
        act_i[dst] = d.actions_i[src];
      }
      resets[(t + 1) * M + j] = d.mask[src] ? 0 : 1;
    }
  }
  for (int64_t j = 0; j < M; ++j) {
    if (S) std::memcpy(&state[j * S], &d.core_state[cols[j] * S], sizeof(float) * S);
  }
  rlpar::SeqArgs seq;
  seq.steps = T + 1;
  seq.seqs = M;
  if (S) {
    seq.state0 = state.data();
    seq.resets = resets.data();
  }
  std::vector<float> out((T + 1) * M * O), dout(out.size());
  auto tape = net.forward_train_seq(params, obs.data(), seq, out.data());
  rlpar::train::LossSpec l = loss;
  auto& dims = l.kind == LossKind::Ppo ? l.ppo.base : l.actor_critic;
  dims.T = T;
  dims.N = M;
  dims.O = O;
  const void* ap = gaussian ? static_cast<const void*>(act_f.data()) : act_i.data();
  if (l.kind == LossKind::Ppo) {
    rlpar::losses::ppo_loss(l.ppo, out.data(), beh.data(), ap, rew.data(), te.data(), tr.data(),
                            mk.data(), dout.data());
  } else {
    rlpar::losses::actor_critic_loss(l.actor_critic, out.data(), beh.data(), ap, rew.data(),
                                     te.data(), tr.data(), mk.data(), dout.data());
  }
  if (l.bound_cost > 0) {
    int64_t valid = 0;
    for (uint8_t m : mk) valid += m;
    const double denom = valid ? static_cast<double>(valid) : 1.0;
    for (int64_t i = 0; i < T * M; ++i) {
      for (int64_t k = 0; k < A && mk[i]; ++k) {
        const double c = (l.high[k] + l.low[k]) / 2, h = (l.high[k] - l.low[k]) / 2;
        const double off = static_cast<double>(out[i * O + k]) - c;
        const double ex = std::max(std::fabs(off) - h, 0.0);
        if (ex > 0) dout[i * O + k] += static_cast<float>(2.0 * l.bound_cost / denom * ex * (off > 0 ? 1 : -1));
      }
    }
  }
  net.backward(params, *tape, dout.data(), grad, false);
  const size_t n = static_cast<size_t>(net.num_params());
  const double norm = rlpar::optim::clip_by_global_norm(grad, n, max_norm);
  if (!std::isfinite(norm)) return norm;
  switch (o.kind) {
    case OptimKind::Sgd:
      rlpar::optim::sgd_step(params, grad, o.buf0, n, o.lr, o.momentum, o.weight_decay, o.nesterov);
      break;
    case OptimKind::RmsProp:
      rlpar::optim::rmsprop_step(params, grad, o.buf0, o.buf1, o.buf2, n, o.lr, o.alpha, o.eps,
                                 o.momentum, o.weight_decay);
      break;
    case OptimKind::Adam:
      rlpar::optim::adam_step(params, grad, o.buf0, o.buf1, n, o.step, o.lr, o.beta1, o.beta2,
                              o.eps, o.weight_decay);
      break;
  }
  return norm;
}

std::vector<float> init_params(const rlpar::Net& net, uint32_t seed) {
  return rlpar_test::random_vector(net.num_params(), seed, 0.3f);
}

void check_equals_by_hand(bool lstm, bool gaussian, LossKind kind, OptimKind optim) {
  rlpar::Net net(spec(lstm, gaussian));
  const Data d(net, 6, 8, gaussian, 11);
  const auto loss = loss_spec(net, kind, gaussian);
  const std::vector<int64_t> cols = {6, 1, 3, 4};
  auto p1 = init_params(net, 5), p2 = p1;
  std::vector<float> g1(net.num_params()), g2(net.num_params());
  OptimState o1(optim, net.num_params()), o2(optim, net.num_params());
  for (int step = 1; step <= 3; ++step) {  // optimizer state carried from step to step
    o1.step.step = o2.step.step = step;
    auto r = rlpar::train::train_step(net, p1.data(), g1.data(), d.view(), cols.data(),
                                      static_cast<int64_t>(cols.size()), loss, 0.5, o1.step);
    const double norm = by_hand(net, p2.data(), g2.data(), d, cols, loss, 0.5, o2.step);
    CHECK(r.applied);
    CHECK(r.grad_norm == norm);
    CHECK(!gaussian || r.bound_loss > 0);
  }
  CHECK(p1 == p2);
  CHECK(g1 == g2);
  CHECK(o1.b0 == o2.b0 && o1.b1 == o2.b1 && o1.b2 == o2.b2);
  CHECK(p1 != init_params(net, 5));

  // All columns in order (no gather) is the same step as naming them 0..N-1.
  auto q1 = init_params(net, 5), q2 = q1;
  OptimState a(optim, net.num_params()), b(optim, net.num_params());
  std::vector<int64_t> all(d.N);
  for (int64_t j = 0; j < d.N; ++j) all[j] = j;
  rlpar::train::train_step(net, q1.data(), g1.data(), d.view(), nullptr, 0, loss, 0.5, a.step);
  rlpar::train::train_step(net, q2.data(), g2.data(), d.view(), all.data(), d.N, loss, 0.5,
                           b.step);
  CHECK(q1 == q2);
}

void check_refusals() {
  rlpar::Net net(spec(true, false));
  const Data d(net, 4, 3, false, 2);
  const auto loss = loss_spec(net, LossKind::ActorCritic, false);
  auto p = init_params(net, 1);
  const auto before = p;
  std::vector<float> g(net.num_params());
  OptimState o(OptimKind::Adam, net.num_params());
  const std::vector<int64_t> bad = {0, 3};
  CHECK_THROWS(std::invalid_argument, rlpar::train::train_step(net, p.data(), g.data(), d.view(),
                                                               bad.data(), 2, loss, 0.5, o.step));
  CHECK_THROWS(std::invalid_argument, rlpar::train::train_step(net, p.data(), g.data(), d.view(),
                                                               nullptr, 0, loss, 0.0, o.step));
  auto no_state = d.view();
  no_state.core_state = nullptr;
  CHECK_THROWS(std::invalid_argument, rlpar::train::train_step(net, p.data(), g.data(), no_state,
                                                               nullptr, 0, loss, 0.5, o.step));
  auto bad_gamma = loss;
  bad_gamma.actor_critic.gamma = 2.0;
  CHECK_THROWS(std::invalid_argument, rlpar::train::train_step(net, p.data(), g.data(), d.view(),
                                                               nullptr, 0, bad_gamma, 0.5, o.step));
  CHECK(p == before);
  CHECK(o.b0 == std::vector<float>(net.num_params(), 0.0f));

  // A non-finite gradient: no step, the norm says why.
  Data nan = d;
  nan.rewards[2] = std::nanf("");
  auto r = rlpar::train::train_step(net, p.data(), g.data(), nan.view(), nullptr, 0, loss, 0.5,
                                    o.step);
  CHECK(!r.applied);
  CHECK(!std::isfinite(r.grad_norm));
  CHECK(p == before);
}

// Threads stepping their own params, optimizer and columns on one net at once, each as its
// single-threaded twin computed first.
void check_threads() {
  rlpar::Net net(spec(true, false));
  const Data d(net, 8, 12, false, 7);
  const auto loss = loss_spec(net, LossKind::Ppo, false);
  constexpr int kThreads = 4, kSteps = 20;
  std::vector<std::vector<float>> want(kThreads), got(kThreads);
  auto run = [&](int i, std::vector<float>& params) {
    params = init_params(net, 100 + i);
    std::vector<float> g(net.num_params());
    OptimState o(OptimKind::Adam, net.num_params());
    std::vector<int64_t> cols = {i, (i + 5) % 12, (i + 7) % 12};
    for (int s = 1; s <= kSteps; ++s) {
      o.step.step = s;
      rlpar::train::train_step(net, params.data(), g.data(), d.view(), cols.data(), 3, loss, 0.5,
                               o.step);
    }
  };
  for (int i = 0; i < kThreads; ++i) run(i, want[i]);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(run, i, std::ref(got[i]));
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) CHECK(got[i] == want[i]);
}

// learn_loop (learn_loop.h) fed by two actor threads that write their rollout buffers and queue
// them, with a reader pinning the published snapshots meanwhile: every buffer holds the same
// rollout, so the loop's parameters must equal that many train_steps on it in one thread, and
// every version must be published in order (under ThreadSanitizer: the buffers' writes ordered
// before the learner's reads by the queues, the store's one writer against its readers).
void check_learn_loop_under_threads() {
  rlpar::Net net(spec(false, false));
  constexpr int64_t T = 6, K = 4, kCount = 2, kActors = 2, kBuffers = 2, kSteps = 200;
  const Data d(net, T, K, false, 11);
  const int64_t D = net.input_size(), O = net.output_size();
  // The inbox's fields, time-major: rows and bytes a row of one buffer.
  const std::vector<int64_t> rows = {T + 1, T, T, T, T, T, T};
  const std::vector<int64_t> row_bytes = {K * D * 4, K * O * 4, K * 8, K * 4, K, K, K};
  const std::vector<const void*> src = {d.obs.data(), d.behaviour.data(), d.actions_i.data(),
                                        d.rewards.data(), d.terminated.data(),
                                        d.truncated.data(), d.mask.data()};
  struct Buffer {
    std::vector<std::vector<char>> fields;
    std::array<int64_t, 2> stamp{};
  };
  std::vector<Buffer> buffers(kActors * kBuffers);
  rlpar::TicketQueue inbox(0);
  rlpar::RolloutInbox take_from(inbox, rows, row_bytes);
  std::vector<std::unique_ptr<rlpar::TicketQueue>> frees;
  for (int64_t a = 0; a < kActors; ++a) {
    frees.push_back(std::make_unique<rlpar::TicketQueue>(0));
    for (int64_t i = 0; i < kBuffers; ++i) {
      Buffer& b = buffers[a * kBuffers + i];
      std::vector<const void*> fields;
      for (size_t f = 0; f < rows.size(); ++f) {
        b.fields.emplace_back(rows[f] * row_bytes[f]);
        fields.push_back(b.fields.back().data());
      }
      take_from.add(a * kBuffers + i, {fields, frees[a].get(), i, b.stamp.data()});
      bool wake = false;
      CHECK(frees[a]->try_push(i, wake));
    }
  }
  // The batch: count buffers side by side along K.
  std::vector<std::vector<char>> dst_fields;
  std::vector<void*> dst;
  for (size_t f = 0; f < rows.size(); ++f) {
    dst_fields.emplace_back(rows[f] * row_bytes[f] * kCount);
    dst.push_back(dst_fields.back().data());
  }
  std::vector<int64_t> versions(kCount);
  rlpar::train::BatchView batch;
  batch.T = T;
  batch.N = kCount * K;
  batch.obs = dst[0];
  batch.behaviour = static_cast<const float*>(dst[1]);
  batch.actions = dst[2];
  batch.rewards = static_cast<const float*>(dst[3]);
  batch.terminated = static_cast<const uint8_t*>(dst[4]);
  batch.truncated = static_cast<const uint8_t*>(dst[5]);
  batch.mask = static_cast<const uint8_t*>(dst[6]);

  rlpar::SnapshotStore store(net.num_params(), 4);
  std::vector<float> params = init_params(net, 5), grad(net.num_params());
  const std::vector<float> start_params = params;
  CHECK(store.publish(params.data(), params.size(), 1));
  OptimState o(OptimKind::Adam, net.num_params());
  rlpar::train::LearnLoop loop;
  loop.inbox = &take_from;
  loop.dst = dst;
  loop.versions = versions.data();
  loop.count = kCount;
  loop.net = &net;
  loop.params = params.data();
  loop.grad = grad.data();
  loop.batch = batch;
  loop.loss = loss_spec(net, LossKind::ActorCritic, false);
  loop.passes = 2;
  loop.optim = o.step;
  loop.store = &store;

  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};  // CHECK is for the main thread only
  std::vector<std::thread> threads;
  for (int64_t a = 0; a < kActors; ++a) {
    threads.emplace_back([&, a] {
      while (!stop.load()) {
        int64_t i = 0;
        if (!frees[a]->pop(i, 0.01)) continue;
        Buffer& b = buffers[a * kBuffers + i];
        for (size_t f = 0; f < rows.size(); ++f) {
          std::memcpy(b.fields[f].data(), src[f], b.fields[f].size());
        }
        b.stamp[0] = static_cast<int64_t>(store.latest_version());
        if (!inbox.push(a * kBuffers + i, 1.0)) ++failures;
      }
    });
  }
  threads.emplace_back([&] {
    uint64_t last = 0;
    while (!stop.load()) {
      rlpar::Pin pin = store.pin();
      if (pin.version() < last || pin.data()[0] != pin.data()[0]) ++failures;
      last = pin.version();
    }
  });
  int64_t steps = 0, filled = 0, version = 1, applied = 0;
  for (int call = 0; call < 10000 && steps < kSteps; ++call) {
    int64_t done[2] = {0, 0};
    const auto r = rlpar::train::learn_loop(loop, filled, version, 0.002, done);
    CHECK(done[0] == r.batches && done[1] == r.applied);
    CHECK(r.dropped == 0 && r.skipped_publishes == 0);
    steps += r.batches;
    applied += r.applied;
    version += r.batches;
    filled = r.filled;
    loop.optim.step += r.applied;
  }
  stop.store(true);
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  CHECK(steps >= kSteps && applied == 2 * steps);
  CHECK(store.latest_version() == static_cast<uint64_t>(1 + steps));
  // The same steps in one thread on the batch every buffer held.
  std::vector<std::vector<char>> copy = dst_fields;
  rlpar::train::BatchView same = batch;
  same.obs = copy[0].data();
  same.behaviour = reinterpret_cast<const float*>(copy[1].data());
  same.actions = copy[2].data();
  same.rewards = reinterpret_cast<const float*>(copy[3].data());
  same.terminated = reinterpret_cast<const uint8_t*>(copy[4].data());
  same.truncated = reinterpret_cast<const uint8_t*>(copy[5].data());
  same.mask = reinterpret_cast<const uint8_t*>(copy[6].data());
  std::vector<float> want = start_params;
  OptimState w(OptimKind::Adam, net.num_params());
  for (int64_t s = 0; s < 2 * steps; ++s) {
    w.step.step = s + 1;
    rlpar::train::train_step(net, want.data(), grad.data(), same, nullptr, same.N, loop.loss,
                             loop.max_grad_norm, w.step);
  }
  CHECK(params == want);
  rlpar::Pin pin = store.pin();
  CHECK(std::memcmp(pin.data(), params.data(), params.size() * sizeof(float)) == 0);
}

}  // namespace

int main() {
  for (bool lstm : {false, true}) {
    for (LossKind kind : {LossKind::ActorCritic, LossKind::Ppo}) {
      check_equals_by_hand(lstm, false, kind, OptimKind::Adam);
    }
  }
  check_equals_by_hand(false, true, LossKind::ActorCritic, OptimKind::RmsProp);
  check_equals_by_hand(false, true, LossKind::Ppo, OptimKind::Sgd);
  check_refusals();
  check_threads();
  check_learn_loop_under_threads();
  return rlpar_test::finish("test_train_step");
}
