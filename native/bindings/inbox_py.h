// What the learner's native loop (train_step.cc: learn_loop) needs of an
// rlpar._native.RolloutInbox (ticket_queue.cc): its core and a batch's arrays checked against
// its layout, with the inbox held for the calling thread.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "rlpar/inbox.h"

namespace rlpar_py {

struct InboxAccess {
  rlpar::RolloutInbox* core = nullptr;
  std::vector<void*> dst;     // the batch arrays, one a field: the layout's, `count` buffers wide
  int64_t* versions = nullptr;  // [count]
  int64_t count = 0;
  std::shared_ptr<void> hold;  // the inbox is this thread's until this goes
};

// `inbox` must be a RolloutInbox, `dst` its layout's arrays for `versions.shape[0]` buffers
// (C-contiguous, writable), `versions` int64 [B]: TypeError/ValueError naming what came
// otherwise, and RuntimeError while another thread uses the inbox. Under the GIL.
InboxAccess inbox_access(pybind11::handle inbox, const pybind11::sequence& dst,
                         pybind11::handle versions);

}  // namespace rlpar_py
