// rlpar/learn_loop.h — the learner's whole loop for a built-in loss, with no Python.
//
// Beside actors that queue their rollouts natively (inbox.h), a learner step of a built-in
// agent is three native pieces: take a batch (RolloutInbox::take), its optimizer steps
// (train_step.h), publish the parameters (snapshot.h). `learn_loop` runs them again and again
// for up to `budget_s` seconds, so a binding lets go of the GIL once for many learner steps:
//
//   for each batch, until the budget is spent:
//     take count rollouts into dst          (waiting for them; buffers handed back)
//     passes x train_step(batch)            (a non-finite gradient: that step not applied)
//     store.publish(params, version + 1);  ++version
//
// A call that runs out of budget part-way through a batch leaves it in dst and returns `filled`:
// the next call goes on from there (start). The call ends after a batch with a non-finite step,
// so that the caller can count it. With passes = 0 the loop takes each batch and publishes the
// parameters unchanged as the next version: a learner that only costs what the runtime costs
// around its step (a benchmark's idle learner). The batch view must point into dst (the arrays
// the take fills). One thread at a time per inbox (inbox.h); the store's one writer is this thread.
#pragma once

#include <cstdint>
#include <vector>

#include "rlpar/inbox.h"
#include "rlpar/snapshot.h"
#include "rlpar/train_step.h"

namespace rlpar::train {

struct LearnLoop {
  RolloutInbox* inbox = nullptr;
  std::vector<void*> dst;      // the batch arrays, one a field of the inbox's layout
  int64_t* versions = nullptr;  // [count]: each batch column block's acted version
  int64_t count = 0;            // rollouts a batch
  int64_t max_lag = -1;         // < 0: no limit
  const Net* net = nullptr;
  float* params = nullptr;      // [num_params], published after each batch
  float* grad = nullptr;        // [num_params], scratch
  BatchView batch;              // over dst: [T, N = count * K]
  LossSpec loss;
  int64_t passes = 1;           // >= 0; 0: take and publish, no step
  double max_grad_norm = 40.0;
  OptimStep optim;              // its step count advances with each step applied
  ThreadPool* pool = nullptr;
  SnapshotStore* store = nullptr;
};

struct LearnLoopResult {
  int64_t batches = 0;   // learner steps finished (each published)
  int64_t filled = 0;    // column blocks of a batch left part-taken in dst
  int64_t dropped = 0;   // rollouts handed back unused: older than max_lag
  int64_t applied = 0;   // optimizer steps applied
  int64_t skipped_publishes = 0;
  double lag_mean = 0;   // the last batch's policy lag
  int64_t lag_max = 0;
  std::vector<StepResult> last;  // the last batch's passes
  double take_s = 0, learn_s = 0, publish_s = 0;  // wall time in each piece
};

// Runs `loop` from `start` filled column blocks at learner version `version` (the next publish
// is version + 1, which must exceed the store's latest) for up to budget_s seconds. done[0],
// done[1] (nullable) count the batches and optimizer steps finished as they finish, so a caller
// knows them when a step throws (std::invalid_argument from the pieces; nothing of that step is
// applied then).
LearnLoopResult learn_loop(const LearnLoop& loop, int64_t start, int64_t version, double budget_s,
                           int64_t* done = nullptr);

}  // namespace rlpar::train
