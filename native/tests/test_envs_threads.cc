// Native envs and the fused unroll under threads (run under ThreadSanitizer by ctest): actor
// threads each own their envs and share one Net and one SnapshotStore while a writer publishes;
// their rollouts equal those of a lone thread, for a feed-forward net and for one with an LSTM
// core (each actor carrying its own state). The actor's whole loop (unroll_loop), its buffers
// going round through two TicketQueues to a consumer thread, gives the same rollouts. Two threads misusing one VecEnv get an error
// from its guard instead of a data race.
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "check.h"
#include "rlpar/envs.h"
#include "rlpar/net.h"
#include "rlpar/snapshot.h"
#include "rlpar/ticket_queue.h"
#include "rlpar/unroll.h"

namespace {

constexpr int64_t kEnvs = 16;
constexpr int64_t kSteps = 20;
constexpr int kUnrolls = 30;

struct Buffers {
  std::vector<float> obs, rewards, behaviour, state, core_state;
  std::vector<int64_t> actions;
  std::vector<char> term, trunc, mask, starts;
  rlpar::UnrollArrays arrays;

  Buffers(int64_t out_size, int64_t state_size)
      : obs((kSteps + 1) * kEnvs * 4), rewards(kSteps * kEnvs),
        behaviour(kSteps * kEnvs * out_size), state(kEnvs * state_size),
        core_state(kEnvs * state_size), actions(kSteps * kEnvs), term(kSteps * kEnvs),
        trunc(kSteps * kEnvs), mask(kSteps * kEnvs), starts(kEnvs) {
    arrays.steps = kSteps;
    arrays.obs = obs.data();
    arrays.actions = actions.data();
    arrays.rewards = rewards.data();
    arrays.terminated = reinterpret_cast<bool*>(term.data());
    arrays.truncated = reinterpret_cast<bool*>(trunc.data());
    arrays.mask = reinterpret_cast<bool*>(mask.data());
    arrays.behaviour = behaviour.data();
    if (state_size > 0) {
      arrays.state = state.data();
      arrays.starts = reinterpret_cast<bool*>(starts.data());
      arrays.core_state = core_state.data();
    }
  }
};

// All actions and outputs (and start states) of kUnrolls unrolls; the params are constant
// (every publish writes the same).
struct Trace {
  std::vector<int64_t> actions;
  std::vector<float> outputs;
  bool operator==(const Trace& o) const { return actions == o.actions && outputs == o.outputs; }
};

Trace actor(const rlpar::Net& net, const rlpar::SnapshotStore& store,
                           std::uint64_t seed) {
  rlpar::VecEnv envs("CartPole-v1", kEnvs);
  std::vector<std::uint64_t> seeds(kEnvs);
  for (int64_t i = 0; i < kEnvs; ++i) seeds[i] = seed * 1000 + i;
  envs.reset(seeds.data(), nullptr);
  rlpar::CategoricalSampler sampler(seed);
  Buffers b(net.output_size(), net.state_size());
  std::vector<double> ret(kEnvs, 0);
  std::vector<int64_t> len(kEnvs, 0);
  Trace all;
  for (int u = 0; u < kUnrolls; ++u) {
    rlpar::Pin pin = store.pin();
    rlpar::unroll(net, pin.data(), envs, sampler, b.arrays, ret.data(), len.data());
    all.actions.insert(all.actions.end(), b.actions.begin(), b.actions.end());
    all.outputs.insert(all.outputs.end(), b.behaviour.begin(), b.behaviour.end());
    all.outputs.insert(all.outputs.end(), b.core_state.begin(), b.core_state.end());
  }
  return all;
}

// A CartPole policy: 4 -> 32 tanh (-> LSTM) -> 2 logits and a value.
rlpar::NetSpec cartpole_spec(int64_t lstm_hidden) {
  rlpar::NetSpec spec;
  spec.input_shape = {4};
  spec.layers = {rlpar::LayerSpec::linear(32), rlpar::LayerSpec::tanh()};
  spec.heads = {{rlpar::HeadKind::Categorical, 2}, {rlpar::HeadKind::Value, 1}};
  spec.lstm_hidden = lstm_hidden;
  return spec;
}

void test_actors_share_net_and_store(int64_t lstm_hidden) {
  const rlpar::Net net(cartpole_spec(lstm_hidden));
  std::vector<float> params(net.num_params());
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.05f * static_cast<float>(i % 7) - 0.15f;
  rlpar::SnapshotStore store(params.size(), 8);
  store.publish(params.data(), params.size());

  std::vector<Trace> alone(3);
  for (int a = 0; a < 3; ++a) alone[a] = actor(net, store, a + 1);

  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load()) store.publish(params.data(), params.size());
  });
  std::vector<Trace> together(3);
  std::vector<std::thread> actors;
  for (int a = 0; a < 3; ++a) {
    actors.emplace_back([&, a] { together[a] = actor(net, store, a + 1); });
  }
  for (auto& t : actors) t.join();
  stop.store(true);
  writer.join();
  for (int a = 0; a < 3; ++a) CHECK(alone[a] == together[a]);
  if (lstm_hidden > 0) CHECK(alone[0].outputs != alone[1].outputs);
}

// unroll_loop on this thread, a consumer thread that records each rollout and hands its buffer
// back, a writer publishing (the same params): the rollouts are those of `actor` alone.
void test_loop_hands_buffers_round(int64_t lstm_hidden) {
  const rlpar::Net net(cartpole_spec(lstm_hidden));
  std::vector<float> params(net.num_params());
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  auto store = std::make_shared<rlpar::SnapshotStore>(params.size(), 8);
  store->publish(params.data(), params.size());
  const Trace alone = actor(net, *store, 4);

  rlpar::VecEnv envs("CartPole-v1", kEnvs);
  std::vector<std::uint64_t> seeds(kEnvs);
  for (int64_t i = 0; i < kEnvs; ++i) seeds[i] = 4 * 1000 + i;
  envs.reset(seeds.data(), nullptr);
  rlpar::CategoricalSampler sampler(4);
  std::vector<double> ret(kEnvs, 0);
  std::vector<int64_t> len(kEnvs, 0);
  std::vector<char> prev_done(kEnvs);
  std::vector<float> obs(kEnvs * 4);
  const rlpar::LoopCarry carry{ret.data(), len.data(), reinterpret_cast<bool*>(prev_done.data()),
                               obs.data()};
  std::vector<std::unique_ptr<Buffers>> owned;
  std::vector<rlpar::LoopBuffer> buffers;
  std::vector<std::array<int64_t, 2>> stamps(2);
  for (int i = 0; i < 2; ++i) {
    owned.push_back(std::make_unique<Buffers>(net.output_size(), net.state_size()));
    rlpar::LoopBuffer b;
    b.arrays = owned.back()->arrays;
    b.arrays.state = owned[0]->arrays.state;  // the carried core is the actor's, shared
    b.arrays.starts = owned[0]->arrays.starts;
    b.out_ticket = 10 + i;
    b.stamp = stamps[i].data();
    buffers.push_back(b);
  }
  rlpar::TicketQueue free(0), out(0);
  bool wake = false;
  CHECK(free.try_push(0, wake) && free.try_push(1, wake));

  Trace together;
  std::vector<int64_t> versions, seqs;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load()) store->publish(params.data(), params.size());
  });
  std::thread consumer([&] {
    for (int u = 0; u < kUnrolls; ++u) {
      int64_t ticket = -1;
      CHECK(out.pop(ticket, 10.0));
      const int i = static_cast<int>(ticket - 10);
      CHECK(i == 0 || i == 1);
      if (i != 0 && i != 1) return;
      const Buffers& b = *owned[i];
      together.actions.insert(together.actions.end(), b.actions.begin(), b.actions.end());
      together.outputs.insert(together.outputs.end(), b.behaviour.begin(), b.behaviour.end());
      together.outputs.insert(together.outputs.end(), b.core_state.begin(), b.core_state.end());
      versions.push_back(stamps[i][0]);
      seqs.push_back(stamps[i][1]);
      if (u < kUnrolls - 2) CHECK(free.push(i, 10.0));  // the last two stay out: the loop ends
    }
  });
  int64_t seq = 0, made = 0;
  for (int calls = 0; made < kUnrolls && calls < 10000; ++calls) {
    made += rlpar::unroll_loop(net, store, envs, sampler, free, out, buffers, carry, seq, 0.01)
                .rollouts;
  }
  consumer.join();
  stop.store(true);
  writer.join();
  CHECK(made == kUnrolls && seq == kUnrolls);
  CHECK(alone == together);
  for (int u = 0; u < static_cast<int>(seqs.size()); ++u) {
    CHECK(seqs[u] == u);
    CHECK(versions[u] >= 1 && (u == 0 || versions[u] >= versions[u - 1]));
  }
  // a ticket that names no buffer is refused, nothing queued
  CHECK(free.try_push(7, wake));
  bool refused = false;
  try {
    rlpar::unroll_loop(net, store, envs, sampler, free, out, buffers, carry, seq, 0.01);
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  CHECK(refused && out.size() == 0);
}

void test_shared_vecenv_is_refused_not_raced() {
  rlpar::VecEnv envs("Catch-v0", 8);
  std::atomic<int> ok{0}, refused{0};
  auto hammer = [&] {
    std::vector<int64_t> actions(8, 1);
    std::vector<std::uint8_t> obs(800);
    std::vector<float> rewards(8);
    std::vector<char> term(8), trunc(8);
    for (int i = 0; i < 5000; ++i) {
      try {
        envs.step(actions.data(), obs.data(), rewards.data(), reinterpret_cast<bool*>(term.data()),
                  reinterpret_cast<bool*>(trunc.data()));
        ++ok;
      } catch (const std::logic_error&) {
        ++refused;
      }
    }
  };
  std::thread a(hammer), b(hammer);
  a.join();
  b.join();
  CHECK(ok.load() + refused.load() == 10000);
  CHECK(ok.load() > 0);
}

}  // namespace

int main() {
  test_actors_share_net_and_store(0);
  test_actors_share_net_and_store(8);
  test_loop_hands_buffers_round(0);
  test_loop_hands_buffers_round(8);
  test_shared_vecenv_is_refused_not_raced();
  return rlpar_test::finish("test_envs_threads");
}
