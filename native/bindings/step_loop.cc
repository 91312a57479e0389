// Binding of the actor's step loop for envs that step in Python (rlpar/unroll.h's begin_core,
// act_rows, record_rows): conversion, argument checks and the GIL only.
//
// One call per env step, `step(t, obs, reward, terminated, truncated)`: it writes the env's
// results of step t - 1 into the bound rollout (cast to the rollout's dtypes), carries the
// episodes, stores obs[t], runs the forward (GIL released when its work is above the threshold,
// gil.h) and, with a sampler, draws actions[t]. What the runtime's Python did between two env
// steps in a dozen numpy calls is now one native call.
//
// Double buffering for envs that step in the actor's own thread ("sync"): `act_async` and
// `step_async` run the forward and the draw of one half of the envs on the loop's side thread
// (rlpar/side_worker.h, without the GIL) and return at once, so the actor steps the other half
// meanwhile. Every call first waits for the act in flight (the GIL released while it waits),
// so acts run one at a time, in the order they were asked for: the same draws in the same
// order as the synchronous calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "rlpar/net.h"
#include "rlpar/side_worker.h"
#include "rlpar/unroll.h"
#include "snapshot_py.h"

namespace py = pybind11;

namespace rlpar_py {
namespace {

using rlpar::CategoricalSampler;
using rlpar::Net;

// Casts n contiguous elements of `a` (dtype S) into dst, element by element as numpy casts.
template <typename S, typename T>
bool cast_from(const py::array& a, T* dst, py::ssize_t n) {
  if (!same_dtype<S>(a)) return false;
  const S* s = static_cast<const S*>(a.data());
  for (py::ssize_t i = 0; i < n; ++i) dst[i] = static_cast<T>(s[i]);
  return true;
}

// Copies `src` (an array, or anything np.asarray takes) of shape `dims` into `dst` as T:
// memcpy when it is already T (or bool into uint8: the same bytes) and contiguous, a loop for
// the casts envs give every step (float64 or an integer into float32), else numpy's cast
// (numbers and bools only).
template <typename T>
void copy_cast(py::handle src, T* dst, const std::vector<py::ssize_t>& dims, const char* what) {
  py::array a = as_array(src, what, true);
  if (!has_dims(a, dims)) {
    throw py::value_error(std::string(what) + " must have shape " + dims_str(dims) + ", got " +
                          shape_str(a));
  }
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b') {
    throw py::type_error(std::string(what) + " must be numbers (" + dtype_name<T>() +
                         "), got dtype " + dtype_str(a));
  }
  const bool contiguous = (a.flags() & py::array::c_style) != 0;
  const bool same_bytes =
      same_dtype<T>(a) || (std::is_same_v<T, uint8_t> && same_dtype<bool>(a));
  if (contiguous && same_bytes) {
    std::memcpy(dst, a.data(), static_cast<size_t>(a.size()) * sizeof(T));
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    const py::ssize_t n = a.size();
    if (contiguous && (cast_from<double>(a, dst, n) || cast_from<int64_t>(a, dst, n) ||
                       cast_from<int32_t>(a, dst, n))) {
      return;
    }
  }
  a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!a) throw py::error_already_set();
  std::memcpy(dst, a.data(), static_cast<size_t>(a.size()) * sizeof(T));
}

class StepLoop {
 public:
  StepLoop(std::shared_ptr<Net> net, int64_t num_envs, py::object sampler)
      : net_(std::move(net)), k_(num_envs), sampler_obj_(std::move(sampler)) {
    if (k_ < 1) throw py::value_error("num_envs must be >= 1, got " + std::to_string(k_));
    if (!sampler_obj_.is_none()) {
      if (!py::isinstance<CategoricalSampler>(sampler_obj_)) {
        throw py::type_error("sampler must be a CategoricalSampler or None, got " +
                             type_name(sampler_obj_));
      }
      sampler_ = &sampler_obj_.cast<CategoricalSampler&>();
      try {
        logits_ = rlpar::categorical_logits(*net_);
      } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
      }
    }
    // [K, *input_shape]: the rows one step writes.
    row_dims_.push_back(k_);
    for (int64_t d : net_->spec().input_shape) row_dims_.push_back(d);
  }

  // Binds one unroll's arrays (held until `end`) and pins `params` for it. Returns the version.
  uint64_t begin(py::handle params, py::handle rollout, py::handle prev_done,
                 py::handle ep_return, py::handle ep_length, py::handle state,
                 py::handle starts) {
    Busy busy(this);
    finish_pending();
    if (bound_) throw py::value_error("begin: the previous unroll was not ended (call end())");
    params_ = params_ref(*net_, params);
    const Net& net = *net_;
    keep_.clear();
    auto field = [&](const char* name) {
      py::object o = rollout.attr(name);
      keep_.push_back(o);
      return o;
    };
    py::object rewards = field("rewards");
    if (!py::isinstance<py::array>(rewards) || py::reinterpret_borrow<py::array>(rewards).ndim() != 2) {
      throw py::value_error("rollout.rewards must be a float32 array [T, K]");
    }
    const py::ssize_t t = py::reinterpret_borrow<py::array>(rewards).shape(0);
    if (t < 1) throw py::value_error("the rollout needs at least 1 step, got 0");
    steps_ = t;
    const py::ssize_t k = k_;
    std::vector<py::ssize_t> obs_dims{t + 1};
    obs_dims.insert(obs_dims.end(), row_dims_.begin(), row_dims_.end());
    rlpar::UnrollArrays& a = a_;
    a = rlpar::UnrollArrays{};
    a.steps = t;
    py::object obs = field("obs");
    if (net.spec().input_uint8) {
      a.obs = output_array<uint8_t>(obs, "rollout.obs", obs_dims);
    } else {
      a.obs = output_array<float>(obs, "rollout.obs", obs_dims);
    }
    py::object actions = field("actions");
    if (sampler_ != nullptr) a.actions = output_array<int64_t>(actions, "rollout.actions", {t, k});
    a.rewards = output_array<float>(rewards, "rollout.rewards", {t, k});
    a.terminated = output_array<bool>(field("terminated"), "rollout.terminated", {t, k});
    a.truncated = output_array<bool>(field("truncated"), "rollout.truncated", {t, k});
    a.mask = output_array<bool>(field("mask"), "rollout.mask", {t, k});
    a.behaviour =
        output_array<float>(field("behaviour"), "rollout.behaviour", {t, k, net.output_size()});
    keep_.push_back(py::reinterpret_borrow<py::object>(prev_done));
    keep_.push_back(py::reinterpret_borrow<py::object>(ep_return));
    keep_.push_back(py::reinterpret_borrow<py::object>(ep_length));
    carry_.prev_done = output_array<bool>(prev_done, "prev_done", {k});
    carry_.ep_return = output_array<double>(ep_return, "ep_return", {k});
    carry_.ep_length = output_array<int64_t>(ep_length, "ep_length", {k});
    if (net.recurrent()) {
      const py::ssize_t s = net.state_size();
      if (state.is_none() || starts.is_none()) {
        throw py::value_error("the net has an LSTM core: begin needs state float32 [K, " +
                              std::to_string(s) + "] and starts bool [K]");
      }
      keep_.push_back(py::reinterpret_borrow<py::object>(state));
      keep_.push_back(py::reinterpret_borrow<py::object>(starts));
      a.state = output_array<float>(state, "state", {k, s});
      a.starts = output_array<bool>(starts, "starts", {k});
      a.core_state = output_array<float>(field("core_state"), "rollout.core_state", {k, s});
      if (a.core_state < a.state + k * s && a.state < a.core_state + k * s) {
        throw py::value_error("rollout.core_state and state must not share memory");
      }
      rlpar::begin_core(a, k, s);
    } else if (!state.is_none() || !starts.is_none()) {
      throw py::value_error("state and starts are for a recurrent net; this net is feed-forward");
    }
    ends_.clear();
    busy_ns_ = 0;
    packed_.reset();
    bound_ = true;
    return params_.version;
  }

  // Stores obs as obs[t, begin:end] (None: already there) and acts step t on those envs.
  void act(int64_t t, py::handle obs, int64_t begin, int64_t end) {
    act_impl(t, obs, begin, end, false);
  }

  void act_impl(int64_t t, py::handle obs, int64_t begin, int64_t end, bool side) {
    Busy busy(this);
    const int64_t t0 = now_ns();
    finish_pending();
    const auto [b, e] = cols(begin, end);
    check_step(t, steps_ - 1, side ? "act_async" : "act");
    if (side) check_side();
    if (!obs.is_none()) store_obs(t, b, e, obs);
    side ? submit_act(t, b, e) : run_act(t, b, e);
    busy_ns_ += now_ns() - t0;
  }

  // The envs' results of step t (obs is their next observation, obs[t + 1]).
  void record(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
              py::handle truncated, int64_t begin, int64_t end) {
    Busy busy(this);
    const int64_t t0 = now_ns();
    finish_pending();
    const auto [b, e] = cols(begin, end);
    check_step(t, steps_ - 1, "record");
    run_record(t, b, e, obs, reward, terminated, truncated);
    busy_ns_ += now_ns() - t0;
  }

  // record(t - 1, ...) then act(t): one call between two env steps; with `side`, the act runs
  // on the side thread and the call returns at once.
  void step(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
            py::handle truncated, int64_t begin, int64_t end) {
    step_impl(t, obs, reward, terminated, truncated, begin, end, false);
  }

  void step_impl(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
                 py::handle truncated, int64_t begin, int64_t end, bool side) {
    Busy busy(this);
    const int64_t t0 = now_ns();
    finish_pending();
    const auto [b, e] = cols(begin, end);
    const char* what = side ? "step_async" : "step";
    if (t < 1 || t >= steps_) {
      throw py::value_error(std::string(what) + ": t must be in [1, " +
                            std::to_string(steps_ - 1) + "], got " + std::to_string(t) +
                            " (act(0, obs) starts an unroll)");
    }
    if (side) check_side();
    run_record(t - 1, b, e, obs, reward, terminated, truncated);
    side ? submit_act(t, b, e) : run_act(t, b, e);
    busy_ns_ += now_ns() - t0;
  }

  void act_async(int64_t t, py::handle obs, int64_t begin, int64_t end) {
    act_impl(t, obs, begin, end, true);
  }

  void step_async(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
                  py::handle truncated, int64_t begin, int64_t end) {
    step_impl(t, obs, reward, terminated, truncated, begin, end, true);
  }

  // Waits for the act in flight, if any (and raises its error).
  void wait() {
    Busy busy(this);
    const int64_t t0 = now_ns();
    finish_pending();
    busy_ns_ += now_ns() - t0;
  }

  // Whether acts can run on the side thread: a native sampler draws the actions, and the net
  // has no Python layer.
  bool can_act_async() const { return sampler_ != nullptr && !net_->has_external(); }

  // Unbinds the unroll (releases the arrays and the pin). Returns ([(return, length) of each
  // episode that ended, in step then env order], seconds spent in this loop's calls).
  py::tuple end() {
    Busy busy(this);
    {
      const int64_t t0 = now_ns();
      try {
        finish_pending();
      } catch (...) {
        busy_ns_ += now_ns() - t0;
        unbind();
        throw;
      }
      busy_ns_ += now_ns() - t0;
    }
    py::list episodes;
    for (const auto& x : ends_) episodes.append(py::make_tuple(x.ret, x.length));
    const double seconds = static_cast<double>(busy_ns_) * 1e-9;
    unbind();
    return py::make_tuple(episodes, seconds);
  }

  bool bound() const { return bound_; }
  py::tuple side_counts() const {
    if (!side_) return py::make_tuple(0, 0);
    return py::make_tuple(side_->submitted(), side_->stolen());
  }
  int64_t num_envs() const { return k_; }

 private:
  // One call at a time: a loop used from two threads at once would race on its arrays.
  struct Busy {
    explicit Busy(StepLoop* s) : self(s) {
      if (self->busy_.exchange(true, std::memory_order_acquire)) {
        throw py::value_error("StepLoop: a call is already in progress (one loop per actor thread, no re-entry)");
      }
    }
    ~Busy() { self->busy_.store(false, std::memory_order_release); }
    StepLoop* self;
  };

  void unbind() {
    ends_.clear();
    keep_.clear();
    packed_.reset();
    params_ = ParamsRef{};
    bound_ = false;
  }

  void check_side() const {
    if (!can_act_async()) {
      throw py::value_error("act_async / step_async: acts run on the side thread only with a "
                            "native sampler and a net without Python layers");
    }
  }

  // Runs act_rows for step t on envs [b, e) on the side thread. The arrays, the pinned
  // parameters and the packed weights stay bound until end(), which waits for it first.
  void submit_act(int64_t t, int64_t b, int64_t e) {
    const Net& net = *net_;
    if (!packed_) packed_ = net.core_weights(params_.data, params_.owner(), params_.version, true);
    if (!side_) side_ = std::make_unique<rlpar::SideWorker>();
    const float* params = params_.data;
    const rlpar::PackedCore* packed = packed_.get();
    side_->submit([this, &net, params, packed, t, b, e] {
      rlpar::act_rows(net, params, a_, k_, t, b, e, sampler_, logits_, packed);
    });
    in_flight_ = true;
  }

  // Waits for the act in flight (the GIL released while it runs on) and raises its error.
  void finish_pending() {
    if (!in_flight_) return;
    in_flight_ = false;
    if (side_->pending()) {
      CallScope scope(true, false);
      side_->wait();
    } else {
      side_->wait();
    }
  }

  std::pair<int64_t, int64_t> cols(int64_t begin, int64_t end) const {
    if (!bound_) throw py::value_error("no unroll is bound: call begin() first");
    if (end < 0) end = k_;
    if (begin < 0 || begin >= end || end > k_) {
      throw py::value_error("envs [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") are not a non-empty range of the " + std::to_string(k_));
    }
    return {begin, end};
  }

  static void check_step(int64_t t, int64_t last, const char* what) {
    if (t < 0 || t > last) {
      throw py::value_error(std::string(what) + ": t must be in [0, " + std::to_string(last) +
                            "], got " + std::to_string(t));
    }
  }

  std::vector<py::ssize_t> rows_dims(int64_t rows) const {
    std::vector<py::ssize_t> dims = row_dims_;
    dims[0] = rows;
    return dims;
  }

  void store_obs(int64_t t, int64_t b, int64_t e, py::handle obs) {
    const std::vector<py::ssize_t> dims = rows_dims(e - b);
    const int64_t first = (t * k_ + b) * net_->input_size();
    if (net_->spec().input_uint8) {
      copy_cast<uint8_t>(obs, static_cast<uint8_t*>(a_.obs) + first, dims, "obs");
    } else {
      copy_cast<float>(obs, static_cast<float*>(a_.obs) + first, dims, "obs");
    }
  }

  void run_act(int64_t t, int64_t b, int64_t e) {
    const Net& net = *net_;
    const bool release = want_release(py::none(), net.flops_per_sample() * (e - b));
    CallScope scope(release, net.has_external());
    if (!packed_) packed_ = net.core_weights(params_.data, params_.owner(), params_.version, true);
    rlpar::act_rows(net, params_.data, a_, k_, t, b, e, sampler_, logits_, packed_.get());
  }

  void run_record(int64_t t, int64_t b, int64_t e, py::handle obs, py::handle reward,
                  py::handle terminated, py::handle truncated) {
    const int64_t rows = e - b;
    const int64_t first = t * k_ + b;
    copy_cast<float>(reward, a_.rewards + first, {rows}, "reward");
    // Episode returns from the env's own doubles (as numpy would add them), not float32's.
    const double* raw = nullptr;
    if (py::isinstance<py::array>(reward)) {
      const auto r = py::reinterpret_borrow<py::array>(reward);
      if (same_dtype<double>(r) && (r.flags() & py::array::c_style)) {
        raw = static_cast<const double*>(r.data());
      }
    }
    copy_cast<bool>(terminated, a_.terminated + first, {rows}, "terminated");
    copy_cast<bool>(truncated, a_.truncated + first, {rows}, "truncated");
    store_obs(t + 1, b, e, obs);
    rlpar::record_rows(a_, k_, t, b, e, carry_, net_->recurrent() ? a_.starts : nullptr, ends_,
                       raw);
  }

  std::shared_ptr<Net> net_;
  int64_t k_;
  py::object sampler_obj_;  // keeps the sampler alive
  CategoricalSampler* sampler_ = nullptr;
  rlpar::LogitsSlice logits_;
  std::vector<py::ssize_t> row_dims_;
  // The bound unroll.
  bool bound_ = false;
  int64_t steps_ = 0;
  ParamsRef params_;
  std::vector<py::object> keep_;  // the arrays the raw pointers below point into
  rlpar::UnrollArrays a_;
  rlpar::EpisodeCarry carry_;
  std::shared_ptr<const rlpar::PackedCore> packed_;
  std::vector<rlpar::EpisodeEnd> ends_;
  int64_t busy_ns_ = 0;
  std::atomic<bool> busy_{false};
  bool in_flight_ = false;  // an act submitted to side_ and not waited for
  // Last, so that it is destroyed first: its destructor waits for an act in flight, which uses
  // the members above.
  std::unique_ptr<rlpar::SideWorker> side_;
};

}  // namespace

void bind_step_loop(py::module_& m) {
  py::class_<StepLoop>(
      m, "StepLoop",
      "One actor's step loop over envs that step in Python: between two env steps, one call "
      "writes the step's results into the rollout, carries the episodes, runs the forward "
      "(GIL released above the work threshold) and, with a sampler, draws the next actions "
      "(rlpar/unroll.h). One loop per actor thread; calls from two threads at once raise.")
      .def(py::init<std::shared_ptr<Net>, int64_t, py::object>(), py::arg("net"),
           py::arg("num_envs"), py::arg("sampler") = py::none(),
           "sampler: a CategoricalSampler drawing actions[t] from the net's one Categorical "
           "head, or None (the caller writes rollout.actions[t] after each act/step).")
      .def("begin", &StepLoop::begin, py::arg("params"), py::arg("rollout"),
           py::arg("prev_done"), py::arg("ep_return"), py::arg("ep_length"),
           py::arg("state") = py::none(), py::arg("starts") = py::none(),
           "Bind one unroll: params (a Snapshot or float32 [num_params], kept pinned until "
           "end), the rollout (an rlpar.Rollout: obs [T+1, K, ...] of the net's input dtype, "
           "actions int64 [T, K] with a sampler, rewards float32, terminated / truncated / "
           "mask bool [T, K], behaviour float32 [T, K, output_size], core_state), the "
           "episodes carried (prev_done bool [K], ep_return float64 [K], ep_length int64 [K], "
           "updated in place) and a recurrent net's state float32 [K, state_size] and starts "
           "bool [K] (their pending starts are applied and the state stored in "
           "rollout.core_state). Returns the params' version (0 for an array).")
      .def("act", &StepLoop::act, py::arg("t"), py::arg("obs") = py::none(),
           py::arg("begin") = 0, py::arg("end") = -1,
           "Store obs [n, ...] (None: already stored) as obs[t] of envs [begin, end) (end -1: "
           "K) and act step t on them: behaviour[t] and, with a sampler, actions[t].")
      .def("record", &StepLoop::record, py::arg("t"), py::arg("obs"), py::arg("reward"),
           py::arg("terminated"), py::arg("truncated"), py::arg("begin") = 0,
           py::arg("end") = -1,
           "Write the envs' results of step t ([n] each; any number or bool dtype, cast) and "
           "their next observations obs[t + 1], and carry their episodes.")
      .def("step", &StepLoop::step, py::arg("t"), py::arg("obs"), py::arg("reward"),
           py::arg("terminated"), py::arg("truncated"), py::arg("begin") = 0,
           py::arg("end") = -1, "record(t - 1, ...) then act(t): one call between env steps.")
      .def("act_async", &StepLoop::act_async, py::arg("t"), py::arg("obs") = py::none(),
           py::arg("begin") = 0, py::arg("end") = -1,
           "act, with the forward and the draw on the loop's side thread: returns at once "
           "(after storing obs); the next call waits for it. Needs a sampler and a net without "
           "Python layers (can_act_async).")
      .def("step_async", &StepLoop::step_async, py::arg("t"), py::arg("obs"),
           py::arg("reward"), py::arg("terminated"), py::arg("truncated"), py::arg("begin") = 0,
           py::arg("end") = -1,
           "record(t - 1, ...) now, then act(t) on the side thread (act_async): for double "
           "buffering envs that step in this thread.")
      .def("wait", &StepLoop::wait,
           "Wait for the act in flight, if any, and raise its error. Every other call waits "
           "for it first too.")
      .def_property_readonly("can_act_async", &StepLoop::can_act_async,
                             "Whether act_async and step_async can run here: a sampler, and a "
                             "net without Python layers.")
      .def("end", &StepLoop::end,
           "Unbind the unroll (after the act in flight). Returns ([(return, length) of each "
           "episode that ended], seconds spent inside this loop's calls since begin, waits for "
           "side-thread acts included).")
      .def_property_readonly("side_counts", &StepLoop::side_counts,
                             "(acts submitted to the side thread, acts of those the calling "
                             "thread ran itself because the side thread had not started them)")
      .def_property_readonly("bound", &StepLoop::bound)
      .def_property_readonly("num_envs", &StepLoop::num_envs);
}

}  // namespace rlpar_py
