// Binding of the actor's step loop for envs that step in Python (rlpar/step_loop.h): conversion,
// argument checks and the GIL only.
//
// One call per env step, `step(t, obs, reward, terminated, truncated)`: the env's results are
// cast into the rollout's rows where the core asks for them (PyStepInput), the forward runs with
// the GIL released when its work is above the threshold (gil.h), and `act_async` / `step_async`
// (double buffering for envs that step in the actor's own thread) wait for the side thread with
// the GIL released. The core's std::invalid_argument becomes ValueError.
#include "rlpar/step_loop.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "rlpar/net.h"
#include "rlpar/unroll.h"

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
  const bool same_bytes = same_dtype<T>(a) || (std::is_same_v<T, uint8_t> && same_dtype<bool>(a));
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

// One call's envs data, written where the core loop points (rlpar::StepInput): obs [n,
// *input_shape] and reward, terminated, truncated [n], each anything numpy takes, cast.
class PyStepInput final : public rlpar::StepInput {
 public:
  PyStepInput(const Net& net, const std::vector<py::ssize_t>& row_dims, py::handle obs,
              py::handle reward = py::handle(), py::handle terminated = py::handle(),
              py::handle truncated = py::handle())
      : net_(net),
        row_dims_(row_dims),
        obs_(obs),
        reward_(reward),
        terminated_(terminated),
        truncated_(truncated) {}

  void write_obs(void* dst, int64_t rows) override {
    std::vector<py::ssize_t> dims = row_dims_;
    dims[0] = rows;
    if (net_.spec().input_uint8) {
      copy_cast<uint8_t>(obs_, static_cast<uint8_t*>(dst), dims, "obs");
    } else {
      copy_cast<float>(obs_, static_cast<float*>(dst), dims, "obs");
    }
  }

  const double* write_results(float* rewards, bool* terminated, bool* truncated,
                              int64_t rows) override {
    copy_cast<float>(reward_, rewards, {rows}, "reward");
    // Episode returns from the env's own doubles (as numpy would add them), not float32's.
    const double* raw = nullptr;
    if (py::isinstance<py::array>(reward_)) {
      const auto r = py::reinterpret_borrow<py::array>(reward_);
      if (same_dtype<double>(r) && (r.flags() & py::array::c_style)) {
        raw = static_cast<const double*>(r.data());
      }
    }
    copy_cast<bool>(terminated_, terminated, {rows}, "terminated");
    copy_cast<bool>(truncated_, truncated, {rows}, "truncated");
    return raw;
  }

 private:
  const Net& net_;
  const std::vector<py::ssize_t>& row_dims_;
  py::handle obs_, reward_, terminated_, truncated_;
};

CategoricalSampler* sampler_ptr(const py::object& sampler) {
  if (sampler.is_none()) return nullptr;
  if (!py::isinstance<CategoricalSampler>(sampler)) {
    throw py::type_error("sampler must be a CategoricalSampler or None, got " + type_name(sampler));
  }
  return &sampler.cast<CategoricalSampler&>();
}

// rlpar::StepLoop with Python arguments: it converts them, keeps the bound unroll's arrays and
// parameters alive until the core lets go of them (unbound), and decides about the GIL around
// the core's forwards and waits (its hooks).
class StepLoop final : rlpar::StepLoopHooks {
 public:
  StepLoop(std::shared_ptr<Net> net, int64_t num_envs, py::object sampler)
      : net_(net),
        sampler_obj_(std::move(sampler)),
        loop_(std::move(net), num_envs, sampler_ptr(sampler_obj_), this) {
    // [K, *input_shape]: the rows one step writes.
    row_dims_.push_back(num_envs);
    for (int64_t d : net_->spec().input_shape) row_dims_.push_back(d);
  }

  // Binds one unroll's arrays (held until `end`) and pins `params` for it. Returns the version.
  uint64_t begin(py::handle params, py::handle rollout, py::handle prev_done, py::handle ep_return,
                 py::handle ep_length, py::handle state, py::handle starts) {
    return loop_.begin(
        [&] { return bind(params, rollout, prev_done, ep_return, ep_length, state, starts); });
  }

  // Stores obs as obs[t, begin:end] (None: already there) and acts step t on those envs.
  void act(int64_t t, py::handle obs, int64_t begin, int64_t end) {
    act_on(t, obs, begin, end, false);
  }

  void act_async(int64_t t, py::handle obs, int64_t begin, int64_t end) {
    act_on(t, obs, begin, end, true);
  }

  // The envs' results of step t (obs is their next observation, obs[t + 1]).
  void record(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
              py::handle truncated, int64_t begin, int64_t end) {
    PyStepInput in(*net_, row_dims_, obs, reward, terminated, truncated);
    loop_.record(t, in, begin, end);
  }

  // record(t - 1, ...) then act(t): one call between two env steps; step_async runs the act on
  // the side thread and returns at once.
  void step(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
            py::handle truncated, int64_t begin, int64_t end) {
    step_on(t, obs, reward, terminated, truncated, begin, end, false);
  }

  void step_async(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
                  py::handle truncated, int64_t begin, int64_t end) {
    step_on(t, obs, reward, terminated, truncated, begin, end, true);
  }

  void wait() { loop_.wait(); }

  // Unbinds the unroll (releases the arrays and the pin). Returns ([(return, length) of each
  // episode that ended, in step then env order], seconds spent in this loop's calls).
  py::tuple end() {
    const rlpar::StepLoopEnd r = loop_.end();
    py::list episodes;
    for (const auto& x : r.episodes) episodes.append(py::make_tuple(x.ret, x.length));
    return py::make_tuple(episodes, r.seconds);
  }

  bool can_act_async() const { return loop_.can_act_async(); }
  bool bound() const { return loop_.bound(); }
  py::tuple side_counts() const {
    return py::make_tuple(loop_.side_submitted(), loop_.side_stolen());
  }
  int64_t num_envs() const { return loop_.num_envs(); }

 private:
  void act_on(int64_t t, py::handle obs, int64_t begin, int64_t end, bool side) {
    PyStepInput in(*net_, row_dims_, obs);
    loop_.act(t, obs.is_none() ? nullptr : &in, begin, end, side);
  }

  void step_on(int64_t t, py::handle obs, py::handle reward, py::handle terminated,
               py::handle truncated, int64_t begin, int64_t end, bool side) {
    PyStepInput in(*net_, row_dims_, obs, reward, terminated, truncated);
    loop_.step(t, in, begin, end, side);
  }

  // The forward of `rows` envs: the GIL released when its work is above the threshold.
  void run_act(int64_t rows, const std::function<void()>& act) override {
    const bool release = want_release(py::none(), net_->flops_per_sample() * rows);
    CallScope scope(release, net_->has_external());
    act();
  }

  // A wait for the side thread's act, with the GIL released.
  void block(const std::function<void()>& wait) override {
    CallScope scope(true, false);
    wait();
  }

  void unbound() override {
    keep_.clear();
    params_ = ParamsRef{};
  }

  rlpar::StepUnroll bind(py::handle params, py::handle rollout, py::handle prev_done,
                         py::handle ep_return, py::handle ep_length, py::handle state,
                         py::handle starts) {
    params_ = params_ref(*net_, params);
    const Net& net = *net_;
    keep_.clear();
    auto field = [&](const char* name) {
      py::object o = rollout.attr(name);
      keep_.push_back(o);
      return o;
    };
    py::object rewards = field("rewards");
    if (!py::isinstance<py::array>(rewards) ||
        py::reinterpret_borrow<py::array>(rewards).ndim() != 2) {
      throw py::value_error("rollout.rewards must be a float32 array [T, K]");
    }
    const py::ssize_t t = py::reinterpret_borrow<py::array>(rewards).shape(0);
    if (t < 1) throw py::value_error("the rollout needs at least 1 step, got 0");
    const py::ssize_t k = loop_.num_envs();
    std::vector<py::ssize_t> obs_dims{t + 1};
    obs_dims.insert(obs_dims.end(), row_dims_.begin(), row_dims_.end());
    rlpar::StepUnroll u;
    rlpar::UnrollArrays& a = u.arrays;
    a.steps = t;
    py::object obs = field("obs");
    if (net.spec().input_uint8) {
      a.obs = output_array<uint8_t>(obs, "rollout.obs", obs_dims);
    } else {
      a.obs = output_array<float>(obs, "rollout.obs", obs_dims);
    }
    py::object actions = field("actions");
    if (!sampler_obj_.is_none()) {
      a.actions = output_array<int64_t>(actions, "rollout.actions", {t, k});
    }
    a.rewards = output_array<float>(rewards, "rollout.rewards", {t, k});
    a.terminated = output_array<bool>(field("terminated"), "rollout.terminated", {t, k});
    a.truncated = output_array<bool>(field("truncated"), "rollout.truncated", {t, k});
    a.mask = output_array<bool>(field("mask"), "rollout.mask", {t, k});
    a.behaviour =
        output_array<float>(field("behaviour"), "rollout.behaviour", {t, k, net.output_size()});
    keep_.push_back(py::reinterpret_borrow<py::object>(prev_done));
    keep_.push_back(py::reinterpret_borrow<py::object>(ep_return));
    keep_.push_back(py::reinterpret_borrow<py::object>(ep_length));
    u.carry.prev_done = output_array<bool>(prev_done, "prev_done", {k});
    u.carry.ep_return = output_array<double>(ep_return, "ep_return", {k});
    u.carry.ep_length = output_array<int64_t>(ep_length, "ep_length", {k});
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
    } else if (!state.is_none() || !starts.is_none()) {
      throw py::value_error("state and starts are for a recurrent net; this net is feed-forward");
    }
    u.params = params_.data;
    u.owner = params_.owner();
    u.version = params_.version;
    return u;
  }

  std::shared_ptr<Net> net_;
  py::object sampler_obj_;  // keeps the sampler alive
  std::vector<py::ssize_t> row_dims_;
  ParamsRef params_;              // the bound unroll's parameters (pinned)
  std::vector<py::object> keep_;  // the arrays the core's raw pointers point into
  // Last, so that it is destroyed first: it waits for an act in flight, which uses the members
  // above.
  rlpar::StepLoop loop_;
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
      .def("begin", &StepLoop::begin, py::arg("params"), py::arg("rollout"), py::arg("prev_done"),
           py::arg("ep_return"), py::arg("ep_length"), py::arg("state") = py::none(),
           py::arg("starts") = py::none(),
           "Bind one unroll: params (a Snapshot or float32 [num_params], kept pinned until "
           "end), the rollout (an rlpar.Rollout: obs [T+1, K, ...] of the net's input dtype, "
           "actions int64 [T, K] with a sampler, rewards float32, terminated / truncated / "
           "mask bool [T, K], behaviour float32 [T, K, output_size], core_state), the "
           "episodes carried (prev_done bool [K], ep_return float64 [K], ep_length int64 [K], "
           "updated in place) and a recurrent net's state float32 [K, state_size] and starts "
           "bool [K] (their pending starts are applied and the state stored in "
           "rollout.core_state). Returns the params' version (0 for an array).")
      .def("act", &StepLoop::act, py::arg("t"), py::arg("obs") = py::none(), py::arg("begin") = 0,
           py::arg("end") = -1,
           "Store obs [n, ...] (None: already stored) as obs[t] of envs [begin, end) (end -1: "
           "K) and act step t on them: behaviour[t] and, with a sampler, actions[t].")
      .def("record", &StepLoop::record, py::arg("t"), py::arg("obs"), py::arg("reward"),
           py::arg("terminated"), py::arg("truncated"), py::arg("begin") = 0, py::arg("end") = -1,
           "Write the envs' results of step t ([n] each; any number or bool dtype, cast) and "
           "their next observations obs[t + 1], and carry their episodes.")
      .def("step", &StepLoop::step, py::arg("t"), py::arg("obs"), py::arg("reward"),
           py::arg("terminated"), py::arg("truncated"), py::arg("begin") = 0, py::arg("end") = -1,
           "record(t - 1, ...) then act(t): one call between env steps.")
      .def("act_async", &StepLoop::act_async, py::arg("t"), py::arg("obs") = py::none(),
           py::arg("begin") = 0, py::arg("end") = -1,
           "act, with the forward and the draw on the loop's side thread: returns at once "
           "(after storing obs); the next call waits for it. Needs a sampler and a net without "
           "Python layers (can_act_async).")
      .def("step_async", &StepLoop::step_async, py::arg("t"), py::arg("obs"), py::arg("reward"),
           py::arg("terminated"), py::arg("truncated"), py::arg("begin") = 0, py::arg("end") = -1,
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
