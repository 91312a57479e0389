// rlpar/inbox.h: the learner's take of a batch of rollouts.
#include "rlpar/inbox.h"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace rlpar {

RolloutInbox::RolloutInbox(TicketQueue& inbox, std::vector<int64_t> rows,
                           std::vector<int64_t> row_bytes)
    : inbox_(inbox), rows_(std::move(rows)), row_bytes_(std::move(row_bytes)) {
  if (rows_.size() != row_bytes_.size()) {
    throw std::invalid_argument("RolloutInbox: rows and row_bytes must have one entry a field");
  }
  for (size_t f = 0; f < rows_.size(); ++f) {
    if (rows_[f] < 0 || row_bytes_[f] < 0) {
      throw std::invalid_argument("RolloutInbox: field " + std::to_string(f) +
                                  " has negative rows or row bytes");
    }
  }
}

void RolloutInbox::add(int64_t ticket, InboxEntry entry) {
  if (ticket < 0) {
    throw std::invalid_argument("RolloutInbox.add: ticket must be >= 0, got " +
                                std::to_string(ticket));
  }
  if (entry.fields.size() != rows_.size() || entry.free == nullptr || entry.stamp == nullptr) {
    throw std::invalid_argument("RolloutInbox.add: expected " + std::to_string(rows_.size()) +
                                " fields, a free queue and a stamp");
  }
  const auto at = static_cast<size_t>(ticket);
  if (entries_.size() <= at) {
    entries_.resize(at + 1);
    known_.resize(at + 1, false);
  }
  entries_[at] = std::move(entry);
  known_[at] = true;
}

RolloutInbox::Take RolloutInbox::take(const std::vector<void*>& dst, int64_t* versions,
                                      int64_t start, int64_t count, int64_t learner_version,
                                      int64_t max_lag, double timeout_s) {
  if (start < 0 || start > count) {
    throw std::invalid_argument("RolloutInbox.take: start must be in [0, count], got " +
                                std::to_string(start) + " of " + std::to_string(count));
  }
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();
  Take t{start, 0};
  while (t.filled < count) {
    double left = -1;
    if (timeout_s >= 0) {
      left = timeout_s - std::chrono::duration<double>(Clock::now() - begin).count();
      if (left < 0) left = 0;
    }
    int64_t ticket = 0;
    if (!inbox_.pop(ticket, left)) break;
    const Accepted a = accept(ticket, dst, versions, t.filled, count, learner_version, max_lag);
    if (a.wake != nullptr) a.wake->wake_popper();
    if (a.kept) {
      ++t.filled;
    } else {
      ++t.dropped;
    }
  }
  return t;
}

RolloutInbox::Accepted RolloutInbox::accept(int64_t ticket, const std::vector<void*>& dst,
                                            int64_t* versions, int64_t p, int64_t count,
                                            int64_t learner_version, int64_t max_lag) {
  if (ticket < 0 || static_cast<size_t>(ticket) >= known_.size() || !known_[ticket]) {
    throw std::invalid_argument("RolloutInbox: the inbox gave ticket " + std::to_string(ticket) +
                                ", which names no registered buffer");
  }
  if (dst.size() != rows_.size() || p < 0 || p >= count) {
    throw std::invalid_argument("RolloutInbox: expected " + std::to_string(rows_.size()) +
                                " batch arrays and a column block in [0, " +
                                std::to_string(count) + "), got " + std::to_string(dst.size()) +
                                " and " + std::to_string(p));
  }
  const InboxEntry& e = entries_[static_cast<size_t>(ticket)];
  const int64_t version = e.stamp[0];
  const bool keep = max_lag < 0 || learner_version - version <= max_lag;
  if (keep) {
    for (size_t f = 0; f < rows_.size(); ++f) {
      const int64_t rb = row_bytes_[f];
      if (rb == 0) continue;
      const char* src = static_cast<const char*>(e.fields[f]);
      char* out = static_cast<char*>(dst[f]);
      for (int64_t r = 0; r < rows_[f]; ++r) {
        std::memcpy(out + (r * count + p) * rb, src + r * rb, static_cast<size_t>(rb));
      }
    }
    versions[p] = version;
  }
  bool wake = false;
  if (!e.free->try_push(e.free_ticket, wake)) {
    throw std::logic_error("RolloutInbox: an actor's free queue is full");
  }
  return {keep, wake ? e.free : nullptr};
}

}  // namespace rlpar
