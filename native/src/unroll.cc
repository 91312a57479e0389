// The fused actor loop: see rlpar/unroll.h.
#include "rlpar/unroll.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "rlpar/snapshot.h"
#include "rlpar/ticket_queue.h"

namespace rlpar {

void CategoricalSampler::sample(const float* logits, int64_t batch, int64_t stride,
                                int64_t offset, int64_t n, int64_t* actions) {
  // Rows are small (a handful of actions), so a stack buffer of weights covers the common case.
  constexpr int64_t kSmall = 64;
  double small[kSmall];
  std::vector<double> large;
  double* w = small;
  if (n > kSmall) {
    large.resize(n);
    w = large.data();
  }
  for (int64_t b = 0; b < batch; ++b) {
    const float* l = logits + b * stride + offset;
    // -inf is a masked-out action (weight 0); NaN or +inf mean a diverged net.
    double m = -std::numeric_limits<double>::infinity();
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) {
      bad |= std::isnan(l[i]) || l[i] == std::numeric_limits<float>::infinity();
      m = l[i] > m ? l[i] : m;
    }
    if (bad || m == -std::numeric_limits<double>::infinity()) {
      throw std::invalid_argument("logits of row " + std::to_string(b) +
                                  (bad ? " hold NaN or +inf" : " are all -inf") +
                                  ": cannot sample an action");
    }
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      w[i] = std::exp(static_cast<double>(l[i]) - m);
      total += w[i];
    }
    const double threshold = rng_.uniform() * total;
    int64_t choice = -1;
    double cum = 0;
    for (int64_t i = 0; i < n; ++i) {
      cum += w[i];
      if (cum > threshold) {
        choice = i;
        break;
      }
    }
    if (choice < 0) {
      // Rounding left the threshold at the very end of the sum: take the last possible action.
      for (int64_t i = n - 1; i >= 0 && choice < 0; --i) {
        if (w[i] > 0) choice = i;
      }
    }
    actions[b] = choice;
  }
}

LogitsSlice categorical_logits(const Net& net) {
  LogitsSlice slice;
  int found = 0;
  for (const OutputInfo& o : net.outputs()) {
    if (o.name == "logits") {
      slice.offset = o.begin;
      slice.size = o.size;
      ++found;
    }
  }
  if (found != 1) {
    throw std::invalid_argument("native sampling needs a net with exactly one Categorical head, "
                                "this one has " + std::to_string(found));
  }
  return slice;
}

LogitsSlice check_unroll_net(const Net& net, const VecEnv& envs) {
  const EnvSpec& spec = envs.spec();
  const LogitsSlice slice = categorical_logits(net);
  if (slice.size != spec.num_actions) {
    throw std::invalid_argument("the net's Categorical head has " + std::to_string(slice.size) +
                                " logits, " + spec.name + " has " +
                                std::to_string(spec.num_actions) + " actions");
  }
  if (net.spec().input_uint8 != spec.obs_uint8 || net.input_size() != spec.obs_size()) {
    throw std::invalid_argument(
        "the net takes " + std::string(net.spec().input_uint8 ? "uint8" : "float32") + " inputs " +
        shape_str(net.spec().input_shape) + ", " + spec.name + " gives " +
        (spec.obs_uint8 ? "uint8" : "float32") + " observations " + shape_str(spec.obs_shape));
  }
  return slice;
}

void begin_core(const UnrollArrays& a, int64_t num_envs, int64_t state_size) {
  for (int64_t i = 0; i < num_envs; ++i) {
    if (a.starts[i]) std::fill_n(a.state + i * state_size, state_size, 0.0f);
    a.starts[i] = false;
  }
  std::copy_n(a.state, num_envs * state_size, a.core_state);
}

void act_rows(const Net& net, const float* params, const UnrollArrays& a, int64_t num_envs,
              int64_t t, int64_t begin, int64_t end, CategoricalSampler* sampler,
              const LogitsSlice& logits, const PackedCore* packed_core) {
  const int64_t rows = end - begin;
  const int64_t first = t * num_envs + begin;
  const int64_t out_size = net.output_size();
  const int64_t obs_bytes = net.input_size() * (net.spec().input_uint8 ? 1 : 4);
  const char* obs = static_cast<const char*>(a.obs) + first * obs_bytes;
  float* out = a.behaviour + first * out_size;
  if (net.recurrent()) {
    float* state = a.state + begin * net.state_size();
    SeqArgs seq;
    seq.steps = 1;
    seq.seqs = rows;
    seq.state0 = state;
    // starts is bool [K]: one byte per env holding 0 or 1, as resets are read.
    seq.resets = reinterpret_cast<const uint8_t*>(a.starts + begin);
    seq.state_out = state;
    seq.packed_core = packed_core;
    net.forward_seq(params, obs, seq, out);
  } else {
    net.forward(params, obs, rows, out);
  }
  if (sampler != nullptr) {
    sampler->sample(out, rows, out_size, logits.offset, logits.size, a.actions + first);
  }
}

void record_rows(const UnrollArrays& a, int64_t num_envs, int64_t t, int64_t begin, int64_t end,
                 const EpisodeCarry& carry, bool* starts, std::vector<EpisodeEnd>& ends,
                 const double* raw_rewards) {
  const int64_t tk = t * num_envs;
  for (int64_t i = begin; i < end; ++i) {
    const bool valid = !carry.prev_done[i];
    const bool done = a.terminated[tk + i] || a.truncated[tk + i];
    a.mask[tk + i] = valid;
    if (valid) {
      carry.ep_return[i] += raw_rewards ? raw_rewards[i - begin] : a.rewards[tk + i];
      carry.ep_length[i] += 1;
    }
    if (done) {
      ends.push_back(EpisodeEnd{i, t, carry.ep_return[i], carry.ep_length[i]});
      carry.ep_return[i] = 0;
      carry.ep_length[i] = 0;
    }
    carry.prev_done[i] = done;
    if (starts != nullptr) starts[i] = !valid;
  }
}

std::vector<EpisodeEnd> unroll(const Net& net, const float* params, VecEnv& envs,
                               CategoricalSampler& sampler, const UnrollArrays& a,
                               double* ep_return, int64_t* ep_length,
                               const PackedCore* packed_core) {
  const LogitsSlice logits = check_unroll_net(net, envs);
  if (a.steps < 1) {
    throw std::invalid_argument("an unroll needs at least 1 step, got " + std::to_string(a.steps));
  }
  const bool recurrent = net.recurrent();
  if (recurrent && (a.state == nullptr || a.starts == nullptr || a.core_state == nullptr)) {
    throw std::invalid_argument("the net has an LSTM core: the fused unroll needs its state, "
                                "starts and core_state arrays");
  }
  const int64_t k = envs.num_envs();
  if (recurrent) begin_core(a, k, net.state_size());
  std::shared_ptr<const PackedCore> own_packed;
  if (packed_core == nullptr) {
    own_packed = net.core_weights(params, nullptr, 0, true);
    packed_core = own_packed.get();
  }
  const int64_t obs_bytes = envs.spec().obs_size() * (envs.spec().obs_uint8 ? 1 : 4);
  char* obs = static_cast<char*>(a.obs);
  std::unique_ptr<bool[]> prev_done(new bool[k]);
  for (int64_t i = 0; i < k; ++i) prev_done[i] = envs.needs_reset(i);
  const EpisodeCarry carry{prev_done.get(), ep_return, ep_length};
  std::vector<EpisodeEnd> ends;

  envs.observe(obs);
  for (int64_t t = 0; t < a.steps; ++t) {
    const int64_t tk = t * k;
    act_rows(net, params, a, k, t, 0, k, &sampler, logits, packed_core);
    envs.step(a.actions + tk, obs + (tk + k) * obs_bytes, a.rewards + tk, a.terminated + tk,
              a.truncated + tk);
    record_rows(a, k, t, 0, k, carry, recurrent ? a.starts : nullptr, ends);
  }
  return ends;
}

LoopResult unroll_loop(const Net& net, const std::shared_ptr<const SnapshotStore>& store,
                       VecEnv& envs, CategoricalSampler& sampler, TicketQueue& free,
                       TicketQueue& out, const std::vector<LoopBuffer>& buffers,
                       const LoopCarry& carry, int64_t& seq, double budget_s) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const int64_t k = envs.num_envs();
  const int64_t obs_bytes = envs.spec().obs_size() * (envs.spec().obs_uint8 ? 1 : 4);
  const std::shared_ptr<const void> owner = store;
  LoopResult result;
  for (;;) {
    const double left = budget_s - seconds_since(start);
    if (left <= 0) break;
    int64_t ticket = 0;
    const auto asked = Clock::now();
    const bool got = free.pop(ticket, left);
    result.wait_s += seconds_since(asked);
    if (!got) break;
    if (ticket < 0 || ticket >= static_cast<int64_t>(buffers.size())) {
      throw std::invalid_argument("unroll_loop: the free queue gave ticket " +
                                  std::to_string(ticket) + ", expected a buffer index in [0, " +
                                  std::to_string(buffers.size()) + ")");
    }
    const LoopBuffer& b = buffers[static_cast<size_t>(ticket)];
    std::vector<EpisodeEnd> ends;
    {
      Pin pin = store->pin();
      const auto packed = net.core_weights(pin.data(), owner, pin.version(), true);
      ends = unroll(net, pin.data(), envs, sampler, b.arrays, carry.ep_return, carry.ep_length,
                    packed.get());
      b.stamp[0] = static_cast<int64_t>(pin.version());
    }
    b.stamp[1] = seq++;
    const int64_t last = (b.arrays.steps - 1) * k;
    for (int64_t i = 0; i < k; ++i) {
      carry.prev_done[i] = b.arrays.terminated[last + i] || b.arrays.truncated[last + i];
    }
    std::memcpy(carry.obs, static_cast<const char*>(b.arrays.obs) + b.arrays.steps * k * obs_bytes,
                static_cast<size_t>(k * obs_bytes));
    result.ends.insert(result.ends.end(), ends.begin(), ends.end());
    bool wake = false;
    if (!out.try_push(b.out_ticket, wake)) {
      throw std::logic_error("unroll_loop: the out queue is full; it must have room for every "
                             "buffer");
    }
    if (wake) out.wake_popper();
    ++result.rollouts;
  }
  return result;
}

}  // namespace rlpar
