// rlpar/inbox.h — the learner's side of the rollout hand-off, with no Python: take B rollouts
// from the inbox queue, copy them side by side into a batch, hand their buffers back.
//
// Actors queue their rollout buffers on the learner's inbox (a TicketQueue) by ticket; each
// ticket names a registered buffer: its arrays, the actor's free queue and the ticket that
// names it there, and its stamp (the version it was acted with, written before it was queued).
// take() fills batch columns: for every field f of the layout, a buffer's [rows_f, row_bytes_f]
// block goes to the batch's [rows_f, count * row_bytes_f] at column block p (time-major arrays
// [R, K, ...] concatenated along K; a [K, S] core state is one row). Then the buffer goes back
// to its actor's free queue, before the learner step that uses the copy.
//
//     rlpar::RolloutInbox inbox(queue, {21, 20, ...}, {1024, 512, ...});
//     inbox.add(ticket, {fields, &actor_free, 0, stamp});      // every buffer, before any take
//     auto t = inbox.take(dst, versions, 0, B, version, -1, 0.05);   // t.filled == B: a batch
//
// add() must not run while take() does; take() is for one thread at a time (the learner).
#pragma once

#include <cstdint>
#include <vector>

#include "rlpar/ticket_queue.h"

namespace rlpar {

struct InboxEntry {
  std::vector<const void*> fields;  // one per layout field, [rows_f, row_bytes_f] contiguous
  TicketQueue* free = nullptr;      // the actor's free buffers (must have room: unbounded)
  int64_t free_ticket = 0;          // what names this buffer there
  const int64_t* stamp = nullptr;   // [>= 1]: stamp[0] is the version it was acted with
};

class RolloutInbox {
 public:
  // rows[f], row_bytes[f]: each field's rows and bytes a row in one buffer (same sizes).
  RolloutInbox(TicketQueue& inbox, std::vector<int64_t> rows, std::vector<int64_t> row_bytes);

  // Registers the buffer that `ticket` (>= 0) names on the inbox.
  void add(int64_t ticket, InboxEntry entry);

  struct Take {
    int64_t filled = 0;   // batch columns filled so far (start + those taken by this call)
    int64_t dropped = 0;  // rollouts handed back unused: older than max_lag
  };

  // Fills column blocks start .. count - 1 of `dst` (one pointer a field, [rows_f, count *
  // row_bytes_f]) and versions[p], from rollouts taken in queue order, waiting at most
  // timeout_s seconds in all (< 0: no limit). A rollout whose version is more than max_lag
  // (>= 0; < 0: no limit) behind learner_version is handed back and counted instead. Returns
  // early on timeout; call again with start = filled. Throws std::invalid_argument for a
  // ticket that names no buffer (nothing else is changed then).
  Take take(const std::vector<void*>& dst, int64_t* versions, int64_t start, int64_t count,
            int64_t learner_version, int64_t max_lag, double timeout_s);

  struct Accepted {
    bool kept = false;             // copied (else older than max_lag)
    TicketQueue* wake = nullptr;   // call wake->wake_popper(): the actor waits for the buffer
  };

  // One rollout, already popped from the inbox: copied into column block p (< count) with its
  // version in versions[p] (kept), or, older than max_lag, not; either way its buffer is handed
  // back, and an actor blocked on it is left for the caller to wake (after letting go of what
  // it holds: the GIL). Throws std::invalid_argument for a ticket that names no buffer.
  Accepted accept(int64_t ticket, const std::vector<void*>& dst, int64_t* versions, int64_t p,
                  int64_t count, int64_t learner_version, int64_t max_lag);

  int64_t num_fields() const { return static_cast<int64_t>(rows_.size()); }

 private:
  TicketQueue& inbox_;
  std::vector<int64_t> rows_, row_bytes_;
  std::vector<InboxEntry> entries_;  // by ticket
  std::vector<bool> known_;
};

}  // namespace rlpar
