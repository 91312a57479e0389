// The GIL release threshold, measured when the module is imported: a call releases the GIL when
// the work it does takes longer than handing the GIL to a waiting thread and getting it back
// costs on this machine (gil.h, want_release).
//
// Measured here once, natively, in a few milliseconds:
//  * the hand-off: waking a thread that slept 100 us on a condition variable, as a thread
//    waiting for the GIL sleeps while another runs Python; the median of 30 (on a 2-vCPU VM
//    ~25 us, where a thread woken right after it went to sleep takes ~2-5 us);
//  * the kernels' speed: a 64-64-64 tanh MLP forward at batch 64, the best of several runs,
//    in flops per nanosecond.
// threshold = 2 x hand-off (ns) x speed (flops / ns), within [kMinThreshold, kMaxThreshold]:
// with another thread waiting, a release costs two hand-offs (the GIL goes to it, then comes
// back), and a call of less work would spend more time handing the GIL over than working
// without it.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "bindings.h"
#include "gil.h"
#include "rlpar/net.h"

namespace rlpar_py {
namespace {

constexpr double kMinThreshold = 70e3;  // the small MLP at batch 8 (docs/performance.md)
constexpr double kMaxThreshold = 16e6;  // a conv forward of a few envs always releases

int64_t median(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Waking a thread that sleeps waiting for a turn, as a thread waiting for the GIL does while
// another runs Python: the median, over `trips` turns, of the time from the notify to the
// waiter running, after the waiter slept `sleep_ns` (a VM halts an idle vCPU after a short
// poll, and waking it costs far more than waking a thread that just went to sleep).
int64_t measure_handoff_ns(int trips, int64_t sleep_ns) {
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;
  int64_t sent_at = 0;
  std::vector<int64_t> latency;
  latency.reserve(trips);
  std::thread other([&] {
    for (int i = 0; i < trips; ++i) {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return turn == 1; });
      latency.push_back(now_ns() - sent_at);
      turn = 0;
      cv.notify_one();
    }
  });
  for (int i = 0; i < trips; ++i) {
    const int64_t until = now_ns() + sleep_ns;  // the waiter sleeps meanwhile
    while (now_ns() < until) {
    }
    std::unique_lock<std::mutex> lock(m);
    turn = 1;
    sent_at = now_ns();
    cv.notify_one();
    cv.wait(lock, [&] { return turn == 0; });
  }
  other.join();
  return median(latency);
}

// flops per ns of a small MLP forward (the best of `runs`).
double measure_flops_per_ns(int runs) {
  rlpar::NetSpec spec;
  spec.input_shape = {64};
  spec.layers = {rlpar::LayerSpec::linear(64), rlpar::LayerSpec::tanh(),
                 rlpar::LayerSpec::linear(64), rlpar::LayerSpec::tanh()};
  spec.heads = {rlpar::HeadSpec{rlpar::HeadKind::Value, 1}};
  const rlpar::Net net(spec);
  const int64_t batch = 64;
  std::vector<float> params(net.num_params(), 0.01f), x(batch * 64, 0.5f),
      y(batch * net.output_size());
  int64_t best = INT64_MAX;
  for (int r = 0; r < runs; ++r) {
    const int64_t t0 = now_ns();
    net.forward(params.data(), x.data(), batch, y.data());
    best = std::min(best, now_ns() - t0);
  }
  return net.flops_per_sample() * batch / static_cast<double>(std::max<int64_t>(best, 1));
}

struct Calibration {
  int64_t handoff_ns = 0;
  double flops_per_ns = 0;
  double threshold = 0;
};

Calibration g_calibration;

}  // namespace

void calibrate_release_threshold() {
  Calibration c;
  c.handoff_ns = measure_handoff_ns(30, 100000);
  c.flops_per_ns = measure_flops_per_ns(20);
  c.threshold = std::clamp(2.0 * static_cast<double>(c.handoff_ns) * c.flops_per_ns, kMinThreshold,
                           kMaxThreshold);
  g_calibration = c;
  g_release_threshold.store(c.threshold);
}

void bind_gil_calibration(pybind11::module_& m) {
  m.def(
      "gil_calibration",
      [] {
        const Calibration& c = g_calibration;
        pybind11::dict d;
        d["handoff_ns"] = c.handoff_ns;
        d["flops_per_ns"] = c.flops_per_ns;
        d["threshold_flops"] = c.threshold;
        return d;
      },
      "What the GIL release threshold was set from when rlpar was imported: {'handoff_ns': one "
      "hand-off between two sleeping threads, 'flops_per_ns': the kernels' speed on a small MLP, "
      "'threshold_flops': 2 x their product within [70e3, 16e6]} (set_gil_release_threshold "
      "overrides it).");
}

}  // namespace rlpar_py
