// rlpar/one_call.h — one call at a time on an object that must not be shared: a second call
// while one is running (another thread's, or a re-entry from a callback inside the first) gets
// an error instead of a data race.
//
//     std::atomic<bool> busy_{false};   // a member of the object
//
//     void Thing::step() {
//       const OneCall call(busy_, [] { return std::logic_error("Thing: already in use"); });
//       ...   // only one thread at a time gets here
//     }
//
// The error is built only for a call that is refused (so a message may be costly to build), and
// its type is the caller's choice: bindings turn std::invalid_argument into ValueError and
// std::logic_error into RuntimeError. A call that goes through costs one atomic exchange and one
// store; the exchange acquires and the store releases, so what one call wrote is visible to the
// next, on whatever thread it runs. A refused call never held the flag and leaves it as it was.
#pragma once

#include <atomic>

namespace rlpar {

class OneCall {
 public:
  // Takes `busy`, or throws make_error() if another call holds it.
  template <typename MakeError>
  OneCall(std::atomic<bool>& busy, MakeError&& make_error) : busy_(busy) {
    if (busy_.exchange(true, std::memory_order_acquire)) throw make_error();
  }
  ~OneCall() { busy_.store(false, std::memory_order_release); }
  OneCall(const OneCall&) = delete;
  OneCall& operator=(const OneCall&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace rlpar
