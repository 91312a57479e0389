// rlpar/learn_loop.h: the learner's whole loop for a built-in loss.
#include "rlpar/learn_loop.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace rlpar::train {

LearnLoopResult learn_loop(const LearnLoop& loop, int64_t start, int64_t version, double budget_s,
                           int64_t* done) {
  if (loop.inbox == nullptr || loop.net == nullptr || loop.store == nullptr ||
      loop.versions == nullptr || loop.count < 1 || loop.passes < 0) {
    throw std::invalid_argument("learn_loop: expected an inbox, a net, a store, versions, "
                                "count >= 1 and passes >= 0");
  }
  if (start < 0 || start > loop.count) {
    throw std::invalid_argument("learn_loop: start must be in [0, count], got " +
                                std::to_string(start));
  }
  if (version < 0 || static_cast<uint64_t>(version) + 1 <= loop.store->latest_version()) {
    throw std::invalid_argument("learn_loop: the next publish (version + 1) must be > the "
                                "store's latest version");
  }
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const auto begin = Clock::now();
  const size_t n = static_cast<size_t>(loop.net->num_params());
  LearnLoopResult r;
  r.filled = start;
  r.last.reserve(static_cast<size_t>(loop.passes));
  OptimStep optim = loop.optim;
  for (;;) {
    if (r.filled < loop.count) {
      const double left = budget_s - seconds(Clock::now() - begin);
      if (left <= 0) break;
      const auto t0 = Clock::now();
      const RolloutInbox::Take t = loop.inbox->take(loop.dst, loop.versions, r.filled, loop.count,
                                                    version, loop.max_lag, left);
      r.take_s += seconds(Clock::now() - t0);
      r.filled = t.filled;
      r.dropped += t.dropped;
      if (r.filled < loop.count) break;  // the budget ran out waiting
    }
    const auto t1 = Clock::now();
    r.last.clear();
    bool finite = true;
    for (int64_t p = 0; p < loop.passes; ++p) {
      r.last.push_back(train_step(*loop.net, loop.params, loop.grad, loop.batch, nullptr,
                                  loop.batch.N, loop.loss, loop.max_grad_norm, optim, loop.pool));
      if (r.last.back().applied) {
        ++optim.step;
        ++r.applied;
        if (done != nullptr) done[1] = r.applied;
      } else {
        finite = false;
      }
    }
    const auto t2 = Clock::now();
    if (!loop.store->publish(loop.params, n, static_cast<uint64_t>(version) + 1)) {
      ++r.skipped_publishes;
    }
    r.publish_s += seconds(Clock::now() - t2);
    r.learn_s += seconds(t2 - t1);
    int64_t sum = 0;
    r.lag_max = 0;
    for (int64_t i = 0; i < loop.count; ++i) {
      const int64_t lag = version - loop.versions[i];
      sum += lag;
      r.lag_max = std::max(r.lag_max, lag);
    }
    r.lag_mean = static_cast<double>(sum) / static_cast<double>(loop.count);
    ++version;
    ++r.batches;
    if (done != nullptr) done[0] = r.batches;
    r.filled = 0;
    if (!finite || seconds(Clock::now() - begin) >= budget_s) break;
  }
  return r;
}

}  // namespace rlpar::train
