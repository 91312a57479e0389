// Python face of the snapshot store, shared with module.cc so that Net.forward can take a pinned
// snapshot directly as its parameters (no numpy array built per call).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "rlpar/snapshot.h"

namespace rlpar_py {

// A pin that keeps its store alive: `store` is declared first, so the pin is released before the
// store can be destroyed.
struct SharedPin {
  std::shared_ptr<const rlpar::SnapshotStore> store;
  rlpar::Pin pin;
};

// A pinned snapshot. Its SharedPin is shared with every numpy view handed out (through a capsule)
// and with tapes recorded from it, so the pin is released when the last of them goes.
struct PySnapshot {
  std::shared_ptr<SharedPin> pin;
};

// The Python SnapshotStore: the store, shared with whatever pins it.
struct PyStore {
  std::shared_ptr<rlpar::SnapshotStore> store;
};

void bind_snapshot(pybind11::module_& m);

}  // namespace rlpar_py
