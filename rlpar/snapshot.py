"""Lock-free, versioned parameter snapshots: one writer (the learner), many readers (actors).

::

    store = SnapshotStore(net.num_params, num_slots=8)
    store.publish(params)                  # learner: copy into a free slot; never waits
    with store.pin() as snap:              # actor: wait-free; one version for a whole unroll
        out = net.forward(snap, obs)       # a Snapshot is accepted as `params` directly
        snap.version, snap.params          # read-only zero-copy float32 view [num_params]

Guarantees: readers never lock, wait or make a system call; the writer never waits for readers
(when every spare slot is pinned, `publish` returns False and counts a skip); memory is a fixed
pool of ``num_slots`` buffers; versions only grow; a pinned snapshot never changes. A view from
``snap.params`` keeps the pin alive on its own, so it stays valid after ``snap.release()``.
Choose ``num_slots`` >= (pins held at once) + 2 and no publish is ever skipped.
"""

from rlpar._native import Snapshot, SnapshotStore

__all__ = ["Snapshot", "SnapshotStore"]
