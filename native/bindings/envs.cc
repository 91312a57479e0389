// Bindings of rlpar::VecEnv (native envs), rlpar::CategoricalSampler and rlpar::unroll (the
// fused actor loop): conversion, argument checks and the GIL only.
//
// GIL: a step releases it when K * flops_per_step is above rlpar's threshold (gil.h;
// release_gil=None), or always / never with release_gil=True / False; an unroll compares its
// whole work (T steps of env steps and forwards) with the same threshold. Everything Python is
// allocated and inspected before the release; only raw pointers cross into the released region.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "convert.h"
#include "envs_py.h"
#include "gil.h"
#include "rlpar/envs.h"
#include "rlpar/net.h"
#include "rlpar/ticket_queue.h"
#include "rlpar/unroll.h"
#include "snapshot_py.h"

namespace py = pybind11;

namespace rlpar_py {
namespace {

using rlpar::CategoricalSampler;
using rlpar::Net;
using rlpar::VecEnv;

// A contiguous int64 [K] copy or view of `obj`; any integer dtype is accepted (cast), others are
// a TypeError, a wrong shape a ValueError.
py::array_t<int64_t> checked_actions(const VecEnv& envs, py::handle obj) {
  py::array a = as_array(obj, "actions", true);
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw py::type_error("actions must be integers (int64) for Discrete(" +
                         std::to_string(envs.spec().num_actions) + "), got dtype " + dtype_str(a));
  }
  if (a.ndim() != 1 || a.shape(0) != envs.num_envs()) {
    throw py::value_error("actions must have shape (" + std::to_string(envs.num_envs()) +
                          ",), one per env, got " + shape_str(a));
  }
  return py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
}

py::array obs_buffer(const VecEnv& envs, int64_t leading) {
  std::vector<py::ssize_t> shape;
  if (leading >= 0) shape.push_back(leading);
  for (int64_t d : envs.spec().obs_shape) shape.push_back(d);
  if (envs.spec().obs_uint8) return py::array_t<uint8_t>(shape);
  return py::array_t<float>(shape);
}

py::array_t<uint64_t> checked_seeds(const VecEnv& envs, py::handle obj) {
  py::array a = as_array(obj, "seeds", true);
  if (!rlpar_py::same_dtype<uint64_t>(a)) {
    throw py::type_error("seeds must be a uint64 array, got dtype " + dtype_str(a));
  }
  if (a.ndim() != 1 || a.shape(0) != envs.num_envs()) {
    throw py::value_error("seeds must have shape (" + std::to_string(envs.num_envs()) +
                          ",), one per env, got " + shape_str(a));
  }
  return py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
}

py::array_t<double> checked_state(const VecEnv& envs, py::handle obj) {
  py::array a = as_array(obj, "state", true);
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u') {
    throw py::type_error("state must be numbers (float64), got dtype " + dtype_str(a));
  }
  const int64_t n = envs.spec().state_size;
  if (a.ndim() != 1 || a.shape(0) != n) {
    throw py::value_error(envs.spec().name + " state must have shape (" + std::to_string(n) +
                          ",), got " + shape_str(a));
  }
  return py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a);
}

py::dict save_state(const VecEnv& envs) {
  const auto k = static_cast<py::ssize_t>(envs.num_envs());
  py::array_t<double> game({k, static_cast<py::ssize_t>(envs.spec().state_size)});
  py::array_t<uint64_t> rng({k, static_cast<py::ssize_t>(4)});
  py::array_t<int64_t> elapsed(k);
  py::array_t<bool> needs_reset(k);
  envs.save_state(game.mutable_data(), rng.mutable_data(), elapsed.mutable_data(),
                  needs_reset.mutable_data());
  py::dict out;
  out["game"] = game;
  out["rng"] = rng;
  out["elapsed"] = elapsed;
  out["needs_reset"] = needs_reset;
  return out;
}

// One array of `state` (a save_state dict): exactly this dtype and shape, C-contiguous copy.
template <class T>
py::array_t<T, py::array::c_style> state_part(py::dict state, const char* key,
                                              std::vector<py::ssize_t> shape) {
  if (!state.contains(key)) {
    throw py::key_error(std::string("env state has no '") + key +
                        "' (expected the keys of VecEnv.save_state: game, rng, elapsed, "
                        "needs_reset)");
  }
  py::array a = as_array(state[key], key, true);
  if (!same_dtype<T>(a)) {
    throw py::type_error(std::string("env state '") + key + "' must be " + dtype_name<T>() +
                         ", got " + dtype_str(a));
  }
  if (!has_dims(a, shape)) {
    throw py::value_error(std::string("env state '") + key + "' must have shape " +
                          dims_str(shape) + ", got " + shape_str(a));
  }
  return py::array_t<T, py::array::c_style>::ensure(a);
}

void load_state(VecEnv& envs, py::dict state) {
  const auto k = static_cast<py::ssize_t>(envs.num_envs());
  auto game = state_part<double>(state, "game", {k, static_cast<py::ssize_t>(envs.spec().state_size)});
  auto rng = state_part<uint64_t>(state, "rng", {k, 4});
  auto elapsed = state_part<int64_t>(state, "elapsed", {k});
  auto needs_reset = state_part<bool>(state, "needs_reset", {k});
  try {
    envs.load_state(game.data(), rng.data(), elapsed.data(), needs_reset.data());
  } catch (const std::invalid_argument& e) {
    throw py::value_error(envs.spec().name + " state: " + e.what());
  }
}

double step_flops(const VecEnv& envs) {
  return envs.spec().flops_per_step * static_cast<double>(envs.num_envs());
}

py::tuple do_step(VecEnv& envs, py::handle actions, py::handle release_gil) {
  py::array_t<int64_t> a = checked_actions(envs, actions);
  const int64_t k = envs.num_envs();
  py::array obs = obs_buffer(envs, k);
  py::array_t<float> rewards(k);
  py::array_t<bool> terminated(k), truncated(k);
  const int64_t* ap = a.data();
  void* op = obs.mutable_data();
  float* rp = rewards.mutable_data();
  bool* tp = terminated.mutable_data();
  bool* up = truncated.mutable_data();
  {
    const bool release = want_release(release_gil, step_flops(envs));
    CallScope scope(release, false);
    envs.step(ap, op, rp, tp, up);
  }
  return py::make_tuple(obs, rewards, terminated, truncated);
}


// ---------------------------------------------------------------------------------------------
// Fused unroll

py::tuple do_unroll(VecEnv& envs, const std::shared_ptr<Net>& net, py::handle params,
                    CategoricalSampler& sampler, py::handle obs, py::handle actions,
                    py::handle rewards, py::handle terminated, py::handle truncated,
                    py::handle mask, py::handle behaviour, py::handle ep_return,
                    py::handle ep_length, py::handle state, py::handle starts,
                    py::handle core_state, py::handle release_gil) {
  rlpar::check_unroll_net(*net, envs);
  if (!py::isinstance<py::array>(actions)) {
    throw py::type_error("actions must be a numpy array, got " + type_name(actions));
  }
  const auto act_arr = py::reinterpret_borrow<py::array>(actions);
  if (act_arr.ndim() < 1 || act_arr.shape(0) < 1) {
    throw py::value_error("actions must have shape (T, K) with T >= 1, got " + shape_str(act_arr));
  }
  const py::ssize_t t = act_arr.shape(0);
  const py::ssize_t k = envs.num_envs();
  std::vector<py::ssize_t> obs_shape{t + 1, k};
  for (int64_t d : envs.spec().obs_shape) obs_shape.push_back(d);
  rlpar::UnrollArrays a;
  a.steps = t;
  a.obs = envs.spec().obs_uint8
              ? static_cast<void*>(output_array<uint8_t>(obs, "obs", obs_shape))
              : static_cast<void*>(output_array<float>(obs, "obs", obs_shape));
  a.actions = output_array<int64_t>(actions, "actions", {t, k});
  a.rewards = output_array<float>(rewards, "rewards", {t, k});
  a.terminated = output_array<bool>(terminated, "terminated", {t, k});
  a.truncated = output_array<bool>(truncated, "truncated", {t, k});
  a.mask = output_array<bool>(mask, "mask", {t, k});
  a.behaviour = output_array<float>(behaviour, "behaviour", {t, k, net->output_size()});
  double* ret = output_array<double>(ep_return, "ep_return", {k});
  int64_t* len = output_array<int64_t>(ep_length, "ep_length", {k});
  if (net->recurrent()) {
    const py::ssize_t s = net->state_size();
    if (state.is_none() || starts.is_none() || core_state.is_none()) {
      throw py::value_error("the net has an LSTM core: fused_unroll needs state float32 [K, " +
                            std::to_string(s) + "], starts bool [K] and core_state float32 [K, " +
                            std::to_string(s) + "]");
    }
    a.state = output_array<float>(state, "state", {k, s});
    a.starts = output_array<bool>(starts, "starts", {k});
    a.core_state = output_array<float>(core_state, "core_state", {k, s});
    // core_state is written from state at the start: the two must not share memory.
    if (a.core_state < a.state + k * s && a.state < a.core_state + k * s) {
      throw py::value_error("core_state and state must not share memory");
    }
  } else if (!state.is_none() || !starts.is_none() || !core_state.is_none()) {
    throw py::value_error(
        "state, starts and core_state are for a recurrent net; this net is feed-forward");
  }
  const ParamsRef p = params_ref(*net, params);
  std::vector<rlpar::EpisodeEnd> ends;
  {
    const double flops = static_cast<double>(t) * static_cast<double>(k) *
                         (envs.spec().flops_per_step + net->flops_per_sample());
    const bool release = want_release(release_gil, flops);
    CallScope scope(release, net->has_external());
    const auto packed = net->core_weights(p.data, p.owner(), p.version, true);
    ends = rlpar::unroll(*net, p.data, envs, sampler, a, ret, len, packed.get());
  }
  py::list episodes;
  for (const auto& e : ends) episodes.append(py::make_tuple(e.ret, e.length));
  return py::make_tuple(p.version, episodes);
}

// rlpar::unroll_loop bound once to one actor's envs, net, store, sampler, queues and buffers:
// every array is checked here, once, and kept alive by this object; run() then lets go of the
// GIL for as many unrolls as fit in its time budget. One thread at a time may run it.
class FusedActorLoop {
 public:
  FusedActorLoop(std::shared_ptr<VecEnv> envs, std::shared_ptr<Net> net, const PyStore& store,
                 py::object sampler, std::shared_ptr<rlpar::TicketQueue> free,
                 std::shared_ptr<rlpar::TicketQueue> out, const py::sequence& buffers,
                 const py::sequence& out_tickets, py::handle ep_return, py::handle ep_length,
                 py::handle prev_done, py::handle obs, py::handle state, py::handle starts,
                 int64_t seq)
      : envs_(std::move(envs)), net_(std::move(net)), store_(store.store),
        sampler_obj_(std::move(sampler)), free_(std::move(free)), out_(std::move(out)),
        seq_(seq) {
    if (!envs_ || !net_ || !store_ || !free_ || !out_) {
      throw py::type_error("FusedActorLoop: envs, net, store, free and out must not be None");
    }
    if (static_cast<int64_t>(store_->size()) != net_->num_params()) {
      throw py::value_error("store: holds " + std::to_string(store_->size()) +
                            " values, the net has " + std::to_string(net_->num_params()));
    }
    sampler_ = sampler_obj_.cast<CategoricalSampler*>();
    rlpar::check_unroll_net(*net_, *envs_);
    const py::ssize_t k = envs_->num_envs();
    if (buffers.size() < 1 || buffers.size() != out_tickets.size()) {
      throw py::value_error("buffers and out_tickets: expected two lists of the same length >= 1, "
                            "got " + std::to_string(buffers.size()) + " and " +
                            std::to_string(out_tickets.size()));
    }
    carry_.ep_return = output_array<double>(keep(ep_return), "ep_return", {k});
    carry_.ep_length = output_array<int64_t>(keep(ep_length), "ep_length", {k});
    carry_.prev_done = output_array<bool>(keep(prev_done), "prev_done", {k});
    std::vector<py::ssize_t> obs_row{k};
    for (int64_t d : envs_->spec().obs_shape) obs_row.push_back(d);
    carry_.obs = obs_array(keep(obs), "obs", obs_row);
    const bool recurrent = net_->recurrent();
    const py::ssize_t s = net_->state_size();
    float* state_p = nullptr;
    bool* starts_p = nullptr;
    if (recurrent) {
      if (state.is_none() || starts.is_none()) {
        throw py::value_error("the net has an LSTM core: FusedActorLoop needs state float32 [K, " +
                              std::to_string(s) + "] and starts bool [K]");
      }
      state_p = output_array<float>(keep(state), "state", {k, s});
      starts_p = output_array<bool>(keep(starts), "starts", {k});
    } else if (!state.is_none() || !starts.is_none()) {
      throw py::value_error("state and starts are for a recurrent net; this net is feed-forward");
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      const py::handle r = buffers[i];
      const std::string at = "buffers[" + std::to_string(i) + "].";
      const auto field = [&](const char* name) { return keep(r.attr(name)); };
      const py::array actions = py::reinterpret_borrow<py::array>(field("actions"));
      if (!py::isinstance<py::array>(actions) || actions.ndim() < 1 || actions.shape(0) < 1) {
        throw py::value_error(at + "actions: expected int64 [T, K] with T >= 1");
      }
      const py::ssize_t t = actions.shape(0);
      std::vector<py::ssize_t> obs_shape{t + 1};
      obs_shape.insert(obs_shape.end(), obs_row.begin(), obs_row.end());
      rlpar::LoopBuffer b;
      rlpar::UnrollArrays& a = b.arrays;
      a.steps = t;
      a.obs = obs_array(field("obs"), (at + "obs").c_str(), obs_shape);
      a.actions = output_array<int64_t>(actions, (at + "actions").c_str(), {t, k});
      a.rewards = output_array<float>(field("rewards"), (at + "rewards").c_str(), {t, k});
      a.terminated = output_array<bool>(field("terminated"), (at + "terminated").c_str(), {t, k});
      a.truncated = output_array<bool>(field("truncated"), (at + "truncated").c_str(), {t, k});
      a.mask = output_array<bool>(field("mask"), (at + "mask").c_str(), {t, k});
      a.behaviour = output_array<float>(field("behaviour"), (at + "behaviour").c_str(),
                                        {t, k, net_->output_size()});
      if (recurrent) {
        a.state = state_p;
        a.starts = starts_p;
        a.core_state = output_array<float>(field("core_state"), (at + "core_state").c_str(),
                                           {k, s});
        if (a.core_state < state_p + k * s && state_p < a.core_state + k * s) {
          throw py::value_error(at + "core_state and state must not share memory");
        }
      }
      b.stamp = output_array<int64_t>(field("stamp"), (at + "stamp").c_str(), {2});
      b.out_ticket = py::cast<int64_t>(out_tickets[i]);
      if (b.out_ticket < 0) {
        throw py::value_error("out_tickets[" + std::to_string(i) + "]: expected a ticket >= 0, got " +
                              std::to_string(b.out_ticket));
      }
      buffers_.push_back(b);
    }
  }

  py::tuple run(double budget_s) {
    if (!(budget_s >= 0) || std::isinf(budget_s)) {
      throw py::value_error("budget_s: expected a finite number of seconds >= 0, got " +
                            std::to_string(budget_s));
    }
    bool idle = false;
    if (!running_.compare_exchange_strong(idle, true)) {
      throw std::logic_error("FusedActorLoop.run: already running on another thread");
    }
    struct Done {
      std::atomic<bool>& flag;
      ~Done() { flag.store(false); }
    } done{running_};
    rlpar::LoopResult r;
    {
      CallScope scope(true, net_->has_external());
      // Once the interpreter is exiting the GIL is kept (gil.h): no waiting then.
      if (scope.released() || net_->has_external()) {
        r = rlpar::unroll_loop(*net_, store_, *envs_, *sampler_, *free_, *out_, buffers_, carry_,
                               seq_, budget_s);
      }
    }
    py::list episodes;
    for (const auto& e : r.ends) episodes.append(py::make_tuple(e.ret, e.length));
    return py::make_tuple(r.rollouts, episodes, r.wait_s);
  }

  int64_t seq() const { return seq_; }

 private:
  py::handle keep(py::handle obj) {
    kept_.push_back(py::reinterpret_borrow<py::object>(obj));
    return obj;
  }
  void* obs_array(py::handle obj, const char* what, const std::vector<py::ssize_t>& dims) {
    return envs_->spec().obs_uint8 ? static_cast<void*>(output_array<uint8_t>(obj, what, dims))
                                   : static_cast<void*>(output_array<float>(obj, what, dims));
  }

  std::shared_ptr<VecEnv> envs_;
  std::shared_ptr<Net> net_;
  std::shared_ptr<const rlpar::SnapshotStore> store_;
  py::object sampler_obj_;
  CategoricalSampler* sampler_ = nullptr;
  std::shared_ptr<rlpar::TicketQueue> free_, out_;
  std::vector<rlpar::LoopBuffer> buffers_;
  rlpar::LoopCarry carry_;
  std::vector<py::object> kept_;
  int64_t seq_ = 0;
  std::atomic<bool> running_{false};
};

}  // namespace

void bind_envs(py::module_& m) {
  m.def("native_env_names", &rlpar::env_names, "Names of the games VecEnv can run.");

  py::class_<VecEnv, std::shared_ptr<VecEnv>>(
      m, "VecEnv",
      "K copies of one native game stepped in one call, with gymnasium's NEXT_STEP autoreset "
      "and one generator per env (see native/include/rlpar/envs.h).")
      .def(py::init([](const std::string& name, int64_t num_envs, py::object max_episode_steps) {
             int64_t limit = -1;
             if (!max_episode_steps.is_none()) {
               limit = max_episode_steps.cast<int64_t>();
               if (limit < 0) {
                 throw py::value_error(
                     "max_episode_steps must be >= 0 (0: no limit) or None, got " +
                     std::to_string(limit));
               }
             }
             return std::make_shared<VecEnv>(name, num_envs, limit);
           }),
           py::arg("name"), py::arg("num_envs"), py::arg("max_episode_steps") = py::none())
      .def_property_readonly("name", [](const VecEnv& e) { return e.spec().name; })
      .def_property_readonly("num_envs", &VecEnv::num_envs)
      .def_property_readonly("max_episode_steps", &VecEnv::max_episode_steps)
      .def_property_readonly(
          "obs_shape", [](const VecEnv& e) { return py::tuple(py::cast(e.spec().obs_shape)); })
      .def_property_readonly("obs_dtype",
                             [](const VecEnv& e) {
                               return e.spec().obs_uint8 ? py::dtype::of<uint8_t>()
                                                         : py::dtype::of<float>();
                             })
      .def_property_readonly(
          "obs_low", [](const VecEnv& e) { return py::array(py::cast(e.spec().obs_low)); })
      .def_property_readonly(
          "obs_high", [](const VecEnv& e) { return py::array(py::cast(e.spec().obs_high)); })
      .def_property_readonly("num_actions", [](const VecEnv& e) { return e.spec().num_actions; })
      .def_property_readonly("state_size", [](const VecEnv& e) { return e.spec().state_size; })
      .def_property_readonly("flops_per_step",
                             [](const VecEnv& e) { return e.spec().flops_per_step; })
      .def("reset",
           [](VecEnv& e, py::object seeds) {
             py::array obs = obs_buffer(e, e.num_envs());
             py::array_t<uint64_t> s;
             if (!seeds.is_none()) s = checked_seeds(e, seeds);
             const uint64_t* sp = seeds.is_none() ? nullptr : s.data();
             e.reset(sp, obs.mutable_data());
             return obs;
           },
           py::arg("seeds") = py::none(),
           "Reset every env; seeds: uint64 [K] reseeds env i with seeds[i] first (None: each "
           "env continues its stream). Returns obs [K, *obs_shape].")
      .def("step", &do_step, py::arg("actions"), py::arg("release_gil") = py::none(),
           "Step every env (NEXT_STEP autoreset). actions: integers [K] in [0, num_actions). "
           "Returns new arrays (obs [K, *obs_shape], rewards float32 [K], terminated bool [K], "
           "truncated bool [K]).")
      .def("observe",
           [](VecEnv& e) {
             py::array obs = obs_buffer(e, e.num_envs());
             e.observe(obs.mutable_data());
             return obs;
           },
           "The observation each env returned last.")
      .def("needs_reset", &VecEnv::needs_reset, py::arg("index"),
           "True when the env's next step is its reset step.")
      .def("get_state",
           [](const VecEnv& e, int64_t i) {
             py::array_t<double> s(e.spec().state_size);
             int64_t elapsed = 0;
             e.get_state(i, s.mutable_data(), &elapsed);
             return py::make_tuple(s, elapsed);
           },
           py::arg("index"), "(state float64 [state_size], steps since the reset) of env `index`.")
      .def("set_state",
           [](VecEnv& e, int64_t i, py::handle state, int64_t elapsed) {
             py::array_t<double> s = checked_state(e, state);
             e.set_state(i, s.data(), elapsed);
           },
           py::arg("index"), py::arg("state"), py::arg("elapsed") = 0,
           "Put env `index` in `state` with `elapsed` steps since its reset; its next step is a "
           "normal step.")
      .def("save_state", &save_state,
           "The whole batch's state (for checkpoints), new arrays: {'game': float64 [K, "
           "state_size], 'rng': uint64 [K, 4], 'elapsed': int64 [K], 'needs_reset': bool [K]}.")
      .def("load_state", &load_state, py::arg("state"),
           "Put every env back in what save_state returned. Checks every array and env first "
           "(KeyError/TypeError/ValueError naming it); a refused state changes nothing.");

  py::class_<CategoricalSampler>(
      m, "CategoricalSampler",
      "Draws actions from categorical logits with its own xoshiro256** generator: the sampler "
      "of the fused unroll, also usable from Python (same draws from the same seed).")
      .def(py::init<uint64_t>(), py::arg("seed"))
      .def("sample",
           [](CategoricalSampler& s, py::handle logits) {
             py::array a = as_array(logits, "logits", true);
             if (!rlpar_py::same_dtype<float>(a)) {
               throw py::type_error("logits must be float32, got " + dtype_str(a));
             }
             if (a.ndim() != 2 || a.shape(0) < 1 || a.shape(1) < 1) {
               throw py::value_error("logits must have shape (K, n) with K, n >= 1, got " +
                                     shape_str(a));
             }
             auto c = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
             const int64_t rows = c.shape(0), n = c.shape(1);
             py::array_t<int64_t> actions(rows);
             s.sample(c.data(), rows, n, 0, n, actions.mutable_data());
             return actions;
           },
           py::arg("logits"), "One action per row of logits float32 [K, n] -> int64 [K].")
      .def_property(
          "state", [](const CategoricalSampler& s) { return py::tuple(py::cast(s.rng().state())); },
          [](CategoricalSampler& s, const std::array<uint64_t, 4>& state) {
            if (state[0] == 0 && state[1] == 0 && state[2] == 0 && state[3] == 0) {
              throw py::value_error("an all-zero generator state never changes: not a valid state");
            }
            s.rng().set_state(state);
          },
          "The generator's state (4 ints), to save and restore.");

  m.def("check_fused_unroll",
        [](const VecEnv& envs, const std::shared_ptr<Net>& net) {
          rlpar::check_unroll_net(*net, envs);
        },
        py::arg("envs"), py::arg("net"),
        "Raise ValueError (saying why) unless fused_unroll can run this net on these envs.");
  py::class_<FusedActorLoop>(
      m, "FusedActorLoop",
      "An actor's whole loop over rlpar's native envs (rlpar/unroll.h, unroll_loop): take a free "
      "buffer's ticket, pin the store's latest snapshot, run a fused unroll into the buffer, "
      "write its stamp (version, seq), queue its out ticket; repeated without the GIL until "
      "run()'s time budget is spent. Built once per actor: the arrays are checked here and kept.")
      .def(py::init<std::shared_ptr<VecEnv>, std::shared_ptr<Net>, const PyStore&, py::object,
                    std::shared_ptr<rlpar::TicketQueue>, std::shared_ptr<rlpar::TicketQueue>,
                    const py::sequence&, const py::sequence&, py::handle, py::handle, py::handle,
                    py::handle, py::handle, py::handle, int64_t>(),
           py::arg("envs"), py::arg("net"), py::arg("store"), py::arg("sampler"), py::arg("free"),
           py::arg("out"), py::arg("buffers"), py::arg("out_tickets"), py::arg("ep_return"),
           py::arg("ep_length"), py::arg("prev_done"), py::arg("obs"),
           py::arg("state") = py::none(), py::arg("starts") = py::none(), py::arg("seq") = 0,
           "buffers: objects with a rollout's arrays as attributes (rlpar.Rollout: obs, actions, "
           "rewards, terminated, truncated, mask, behaviour, core_state) and stamp int64 [2]; "
           "ticket i of `free` names buffers[i], which goes to `out` as out_tickets[i]. "
           "ep_return float64 [K], ep_length int64 [K] carry the episodes; prev_done bool [K] and "
           "obs [K, *obs_shape] receive the last step's ends and next input after each unroll; a "
           "recurrent net also carries state float32 [K, state_size] and starts bool [K].")
      .def("run", &FusedActorLoop::run, py::arg("budget_s"),
           "Unroll into free buffers for budget_s seconds (checked between unrolls), or until no "
           "buffer comes free within what is left of it. Returns (rollouts queued, [(return, "
           "length) of each episode that ended, in order], seconds spent waiting for a buffer).")
      .def_property_readonly("seq", &FusedActorLoop::seq, "Rollouts made so far (the next seq).");
  m.def("fused_unroll", &do_unroll, py::arg("envs"), py::arg("net"), py::arg("params"),
        py::arg("sampler"), py::arg("obs"), py::arg("actions"), py::arg("rewards"),
        py::arg("terminated"), py::arg("truncated"), py::arg("mask"), py::arg("behaviour"),
        py::arg("ep_return"), py::arg("ep_length"), py::arg("state") = py::none(),
        py::arg("starts") = py::none(), py::arg("core_state") = py::none(),
        py::arg("release_gil") = py::none(),
        "One whole unroll of T steps over the K envs in one call (rlpar/unroll.h), written "
        "into the rollout arrays (obs [T+1, K, ...], actions int64 [T, K], rewards float32, "
        "terminated / truncated / mask bool [T, K], behaviour float32 [T, K, output_size]); "
        "ep_return float64 [K] and ep_length int64 [K] carry the episodes in progress. "
        "A recurrent net also takes state float32 [K, state_size] and starts bool [K] (the "
        "actor's carried core state and pending episode starts, updated in place) and writes "
        "the state fed into step 0 to core_state float32 [K, state_size]. "
        "Returns (version of params, [(return, length) of each episode that ended]).");
}

}  // namespace rlpar_py
