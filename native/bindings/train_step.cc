// Bindings of rlpar::train (train_step.h): a built-in loss's optimizer step as one call that
// holds the GIL only to check its arguments and to return the metrics. Every option is a
// required argument: the defaults live in rlpar/losses.py and rlpar/optim.py alone.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "batch_py.h"
#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "inbox_py.h"
#include "loss_py.h"
#include "snapshot_py.h"
#include "rlpar/learn_loop.h"
#include "rlpar/net.h"
#include "rlpar/thread_pool.h"
#include "rlpar/train_step.h"

namespace py = pybind11;
using rlpar::train::LossKind;
using rlpar::train::OptimKind;

namespace rlpar_py {
namespace {

// A loss for train_step, built once (an agent's): the LossSpec and the bounds it points into.
struct TrainLoss {
  rlpar::train::LossSpec spec;
  std::vector<double> low, high;
};

template <typename T>
T option(const py::dict& options, const char* key) {
  if (!options.contains(key)) {
    throw py::key_error(std::string("loss options: expected a value for '") + key + "'");
  }
  try {
    return options[key].cast<T>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string("loss options: '") + key + "' has the wrong type, got " +
                         type_name(options[key]));
  }
}

std::unique_ptr<TrainLoss> make_train_loss(const std::string& kind, const std::string& policy,
                                           int64_t policy_begin, int64_t num_actions,
                                           int64_t log_std_begin, int64_t value_col,
                                           const std::vector<int64_t>& action_dims,
                                           const py::dict& options, py::handle low,
                                           py::handle high, double bound_cost) {
  auto t = std::make_unique<TrainLoss>();
  auto& s = t->spec;
  s.kind = pick("kind", kind, "actor_critic", LossKind::ActorCritic, "ppo", LossKind::Ppo);
  rlpar::losses::ActorCriticArgs& a = s.kind == LossKind::Ppo ? s.ppo.base : s.actor_critic;
  set_layout(a, policy, policy_begin, num_actions, log_std_begin, value_col, action_dims);
  a.gamma = option<double>(options, "gamma");
  a.rho_bar = option<double>(options, "rho_bar");
  a.c_bar = option<double>(options, "c_bar");
  a.value_coef = option<double>(options, "value_coef");
  a.entropy_coef = option<double>(options, "entropy_coef");
  if (s.kind == LossKind::ActorCritic) {
    a.importance_weighting = option<bool>(options, "importance_weighting");
    a.pg_rho_bar = option<double>(options, "pg_rho_bar");
  } else {
    a.importance_weighting = true;
    s.ppo.clip_eps = option<double>(options, "clip_eps");
    s.ppo.clip = pick("ratio_clip", option<std::string>(options, "ratio_clip"), "symmetric",
                      rlpar::losses::RatioClip::Symmetric, "reciprocal",
                      rlpar::losses::RatioClip::Reciprocal);
    s.ppo.advantage = pick("advantage", option<std::string>(options, "advantage"), "vtrace",
                           rlpar::losses::Advantage::VTrace, "gae", rlpar::losses::Advantage::Gae);
    s.ppo.lambda = option<double>(options, "gae_lambda");
    s.ppo.normalize_advantages = option<bool>(options, "normalize_advantages");
    s.ppo.value_clip = option<double>(options, "value_clip");
  }
  if (!(bound_cost >= 0)) {
    throw py::value_error("bound_cost must be >= 0, got " + std::to_string(bound_cost));
  }
  if (bound_cost > 0 && a.policy == rlpar::losses::Policy::Gaussian) {
    const py::ssize_t A = num_actions;
    py::array l = input_array<double>(low, "low", {A});
    py::array h = input_array<double>(high, "high", {A});
    const auto* lp = static_cast<const double*>(l.data());
    const auto* hp = static_cast<const double*>(h.data());
    t->low.assign(lp, lp + A);
    t->high.assign(hp, hp + A);
    s.bound_cost = bound_cost;
    s.low = t->low.data();
    s.high = t->high.data();
  }
  return t;
}

// (kind, lr, beta1, beta2, alpha, momentum, eps, weight_decay, nesterov, step, buf0, buf1, buf2)
// as rlpar.Optimizer._native_step writes it; the buffers are the optimizer's own arrays.
rlpar::train::OptimStep optim_step(const py::tuple& o, int64_t n) {
  if (o.size() != 13) {
    throw py::value_error("optimizer: expected a 13-tuple from Optimizer._native_step, got " +
                          std::to_string(o.size()) + " items");
  }
  rlpar::train::OptimStep s;
  const auto kind = o[0].cast<std::string>();
  if (kind == "sgd") s.kind = OptimKind::Sgd;
  else if (kind == "rmsprop") s.kind = OptimKind::RmsProp;
  else if (kind == "adam") s.kind = OptimKind::Adam;
  else throw py::value_error("optimizer: expected 'sgd', 'rmsprop' or 'adam', got '" + kind + "'");
  s.lr = o[1].cast<float>();
  s.beta1 = o[2].cast<float>();
  s.beta2 = o[3].cast<float>();
  s.alpha = o[4].cast<float>();
  s.momentum = o[5].cast<float>();
  s.eps = o[6].cast<float>();
  s.weight_decay = o[7].cast<float>();
  s.nesterov = o[8].cast<bool>();
  s.step = o[9].cast<int64_t>();
  const char* names[3] = {"optimizer buffer 0", "optimizer buffer 1", "optimizer buffer 2"};
  float** bufs[3] = {&s.buf0, &s.buf1, &s.buf2};
  for (int i = 0; i < 3; ++i) {
    py::handle b = o[10 + i];
    *bufs[i] = b.is_none() ? nullptr : output_array<float>(b, names[i], {n});
  }
  if (s.kind == OptimKind::Adam && (!s.buf0 || !s.buf1)) {
    throw py::value_error("optimizer: Adam needs its exp_avg and exp_avg_sq buffers");
  }
  if (s.kind == OptimKind::RmsProp && !s.buf0) {
    throw py::value_error("optimizer: RMSProp needs its square_avg buffer");
  }
  return s;
}

// One optimizer step's column set: None (all N columns, in order) or int64 indices [M >= 1].
struct Columns {
  py::array array;  // empty for all columns
  const int64_t* data = nullptr;
  int64_t M = 0;
};

Columns parse_columns(py::handle columns, int64_t N, const std::string& what) {
  Columns c;
  c.M = N;
  if (columns.is_none()) return c;
  c.array = as_array(columns, what.c_str(), true);
  require_dtype<int64_t>(c.array, what.c_str());
  if (c.array.ndim() != 1 || c.array.shape(0) < 1) {
    throw py::value_error(what + " must be int64 indices [M] with M >= 1, got shape " +
                          shape_str(c.array));
  }
  c.array = contiguous(c.array);
  c.data = static_cast<const int64_t*>(c.array.data());
  c.M = c.array.shape(0);
  return c;
}

// The checked arguments shared by train_step, train_steps and learn_loop: the batch's arrays
// are kept alive here (converted copies included) for as long as the view points into them.
struct StepArgs {
  float* params = nullptr;
  float* grad = nullptr;
  rlpar::train::OptimStep opt;
  BatchArrays batch;
  rlpar::train::LossSpec spec;
  rlpar::ThreadPool* pool = nullptr;
};

void parse_step_args(StepArgs& a, const rlpar::Net& net, py::handle params, py::handle grad,
                     const TrainLoss& loss, py::handle batch, double value_mean,
                     double value_std, const py::tuple& optimizer, py::handle pool_obj) {
  const py::ssize_t P = net.num_params();
  a.params = output_array<float>(params, "params", {P});
  a.grad = output_array<float>(grad, "grad", {P});
  a.opt = optim_step(optimizer, P);
  a.batch = batch_arrays(batch, net, loss.spec.layout());
  if (!pool_obj.is_none()) {
    if (!py::isinstance<rlpar::ThreadPool>(pool_obj)) {
      throw py::type_error("pool must be an rlpar.ThreadPool or None, got " + type_name(pool_obj));
    }
    a.pool = &pool_obj.cast<rlpar::ThreadPool&>();
  }
  a.spec = loss.spec;
  a.spec.ppo.value_mean = value_mean;
  a.spec.ppo.value_std = value_std;
}

py::tuple step_result(const rlpar::train::LossSpec& spec, const rlpar::train::StepResult& res) {
  py::dict metrics = spec.kind == LossKind::Ppo ? metrics_dict(res.ppo)
                                                : metrics_dict(res.actor_critic);
  if (spec.bound_cost > 0) metrics["bound_loss"] = res.bound_loss;
  return py::make_tuple(metrics, res.grad_norm, res.applied);
}

py::tuple train_step(const std::shared_ptr<rlpar::Net>& net, py::handle params, py::handle grad,
                     const TrainLoss& loss, py::handle batch, py::handle columns,
                     double value_mean, double value_std,
                     double max_grad_norm, const py::tuple& optimizer, py::handle pool_obj) {
  StepArgs a;
  parse_step_args(a, *net, params, grad, loss, batch, value_mean, value_std, optimizer, pool_obj);
  const Columns cols = parse_columns(columns, a.batch.view.N, "columns");
  const double flops =
      3.0 * net->flops_per_sample() * static_cast<double>((a.batch.view.T + 1) * cols.M);
  const bool release = want_release(py::none(), flops);
  rlpar::train::StepResult res;
  {
    CallScope scope(release, net->has_external());
    res = rlpar::train::train_step(*net, a.params, a.grad, a.batch.view, cols.data, cols.M, a.spec,
                                   max_grad_norm, a.opt, a.pool);
  }
  return step_result(a.spec, res);
}

// Several optimizer steps in a row (PPO's epochs x minibatches) in one call: step s on
// columns[s], the optimizer's step count advancing with each step taken. It stops after the
// first step whose gradient was not finite (that step is not applied), so the caller can count
// it and decide, as it does for one step; the returned list then is shorter than columns.
// `done` (int64 [1]) counts the steps finished so far: when a step raises (a Python layer's
// error), the ones before it were applied, and the caller learns how many from it.
py::list train_steps(const std::shared_ptr<rlpar::Net>& net, py::handle params, py::handle grad,
                     const TrainLoss& loss, py::handle batch, const py::sequence& columns,
                     py::handle done, double value_mean,
                     double value_std, double max_grad_norm, const py::tuple& optimizer,
                     py::handle pool_obj) {
  int64_t* finished = output_array<int64_t>(done, "done", {1});
  *finished = 0;
  StepArgs a;
  parse_step_args(a, *net, params, grad, loss, batch, value_mean, value_std, optimizer, pool_obj);
  const py::ssize_t S = py::len(columns);
  if (S < 1) throw py::value_error("columns: expected at least one step's columns, got none");
  std::vector<Columns> cols;
  cols.reserve(static_cast<size_t>(S));
  double flops = 0;
  for (py::ssize_t s = 0; s < S; ++s) {
    cols.push_back(parse_columns(columns[s], a.batch.view.N, "columns[" + std::to_string(s) + "]"));
    const double steps = static_cast<double>((a.batch.view.T + 1) * cols.back().M);
    flops += 3.0 * net->flops_per_sample() * steps;
  }
  // A column outside [0, N) would throw part-way, after earlier steps were applied: check all
  // before the first step changes anything.
  for (py::ssize_t s = 0; s < S; ++s) {
    for (int64_t i = 0; cols[s].data && i < cols[s].M; ++i) {
      const int64_t c = cols[s].data[i];
      if (c < 0 || c >= a.batch.view.N) {
        throw py::value_error("columns[" + std::to_string(s) + "]: expected indices in [0, " +
                              std::to_string(a.batch.view.N) + "), got " + std::to_string(c));
      }
    }
  }
  const bool release = want_release(py::none(), flops);
  std::vector<rlpar::train::StepResult> results;
  results.reserve(static_cast<size_t>(S));
  {
    CallScope scope(release, net->has_external());
    rlpar::train::OptimStep opt = a.opt;
    for (py::ssize_t s = 0; s < S; ++s) {
      results.push_back(rlpar::train::train_step(*net, a.params, a.grad, a.batch.view, cols[s].data,
                                                 cols[s].M, a.spec, max_grad_norm, opt, a.pool));
      *finished = s + 1;
      if (!results.back().applied) break;
      ++opt.step;
    }
  }
  py::list out;
  for (const auto& res : results) out.append(step_result(a.spec, res));
  return out;
}

// learn_loop's result as Python reads it (rlpar._native.LearnLoopResult, read-only fields):
// rlpar::train::LearnLoopResult with the last batch's passes and metrics in Python's terms.
struct LearnLoopOut {
  int64_t batches = 0, filled = 0, dropped = 0, applied = 0, skipped_publishes = 0;
  double lag_mean = 0;
  int64_t lag_max = 0;
  py::object metrics = py::none();  // the last step's (dict), None without one
  py::tuple passes;                 // the last batch's (grad_norm, applied), one per pass
  double take_s = 0, learn_s = 0, publish_s = 0;
};

// The learner's whole loop for a built-in actor-critic loss, as one call without the GIL: take
// a batch from the inbox (rlpar/inbox.h; waiting, copying, handing buffers back), `passes`
// optimizer steps on it (train_step.h; none with passes = 0, a benchmark's idle learner),
// publish the parameters as the next version, and again, until `budget_s` has passed. What a
// learner thread in Python does between those pieces (its stats, its hooks, the stop flag) then
// runs once a call instead of once a step.
//
// The batch's arrays (its fields `names`, in the inbox's layout order) are the take's and the
// step's at once: a call that ends part-way through a batch leaves it in them, and the next
// call goes on from `start` = the columns already filled. A step whose gradient is not finite
// is not applied (the batch's other passes are, as train_steps would), and the call ends after
// that batch's publish so the caller can count it. `done` (int64 [2]): batches finished and
// optimizer steps applied so far, also when a step raises.
LearnLoopOut learn_loop(py::handle inbox, py::handle batch, const py::sequence& names,
                        py::handle versions, int64_t start, int64_t learner_version,
                        py::object max_lag, const std::shared_ptr<rlpar::Net>& net,
                        py::handle params, py::handle grad, const TrainLoss& loss,
                        int64_t passes, double max_grad_norm, const py::tuple& optimizer,
                        const PyStore& store, py::handle pool_obj, double budget_s,
                        py::handle done) {
  int64_t* finished = output_array<int64_t>(done, "done", {2});
  finished[0] = finished[1] = 0;
  if (passes < 0) {
    throw py::value_error("passes: expected an integer >= 0, got " + std::to_string(passes));
  }
  if (!(budget_s >= 0) || std::isinf(budget_s)) {
    throw py::value_error("budget_s: expected a finite number of seconds >= 0, got " +
                          std::to_string(budget_s));
  }
  if (!(max_grad_norm > 0)) {
    throw py::value_error("max_grad_norm: expected a number > 0, got " +
                          std::to_string(max_grad_norm));
  }
  const int64_t lag = max_lag.is_none() ? -1 : max_lag.cast<int64_t>();
  if (lag < 0 && !max_lag.is_none()) {
    throw py::value_error("max_lag: expected None or an integer >= 0, got " + std::to_string(lag));
  }
  if (loss.spec.kind != LossKind::ActorCritic) {
    throw py::value_error("loss: learn_loop runs the actor-critic losses (IMPALA's, A3C's); got "
                          "a PPO loss (its minibatches and value statistics stay in Python)");
  }
  const char* fields[8] = {"obs",       "behaviour", "actions", "rewards",
                           "terminated", "truncated", "mask",    "core_state"};
  bool named[8] = {};
  py::list dst;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!py::isinstance<py::str>(names[i])) {
      throw py::type_error("names[" + std::to_string(i) + "]: expected a field name (str), got " +
                           type_name(names[i]));
    }
    const auto name = names[i].cast<std::string>();
    size_t f = 0;
    while (f < 8 && name != fields[f]) ++f;
    if (f == 8 || named[f]) {
      throw py::value_error("names: expected each of obs, behaviour, actions, rewards, "
                            "terminated, truncated, mask, core_state once, got '" + name + "'");
    }
    named[f] = true;
    if (!py::hasattr(batch, fields[f])) {
      throw py::type_error("batch: expected an rlpar.Batch, got " + type_name(batch) +
                           " without '" + name + "'");
    }
    dst.append(batch.attr(fields[f]));
  }
  for (size_t f = 0; f < 8; ++f) {
    if (!named[f]) throw py::value_error(std::string("names: '") + fields[f] + "' is missing");
  }
  StepArgs a;
  parse_step_args(a, *net, params, grad, loss, batch, 0.0, 1.0, optimizer, pool_obj);
  const InboxAccess in = inbox_access(inbox, dst, versions);
  // The step must read the very arrays the take fills (not a converted copy of one of them).
  const rlpar::train::BatchView& view = a.batch.view;
  const void* step_reads[8] = {view.obs,  view.behaviour,  view.actions, view.rewards,
                               view.terminated, view.truncated, view.mask, view.core_state};
  for (size_t i = 0; i < names.size(); ++i) {
    const auto name = names[i].cast<std::string>();
    for (size_t f = 0; f < 8; ++f) {
      if (name == fields[f] && step_reads[f] != nullptr && step_reads[f] != in.dst[i]) {
        throw py::type_error("batch." + name + ": another dtype or layout than the net's step "
                             "reads (a copy would be trained on, not the array the take fills)");
      }
    }
  }
  if (start < 0 || start > in.count) {
    throw py::value_error("start: expected an integer in [0, " + std::to_string(in.count) +
                          "], got " + std::to_string(start));
  }
  const py::ssize_t P = net->num_params();
  if (store.store->size() != static_cast<size_t>(P)) {
    throw py::value_error("store: expected a SnapshotStore of the net's " + std::to_string(P) +
                          " parameters, got one of " + std::to_string(store.store->size()));
  }
  if (learner_version < 0 ||
      static_cast<uint64_t>(learner_version) + 1 <= store.store->latest_version()) {
    throw py::value_error("learner_version: the next publish (learner_version + 1) must be > "
                          "the store's latest_version (" +
                          std::to_string(store.store->latest_version()) + "), got " +
                          std::to_string(learner_version));
  }

  rlpar::train::LearnLoop loop;
  loop.inbox = in.core;
  loop.dst = in.dst;
  loop.versions = in.versions;
  loop.count = in.count;
  loop.max_lag = lag;
  loop.net = net.get();
  loop.params = a.params;
  loop.grad = a.grad;
  loop.batch = a.batch.view;
  loop.loss = a.spec;
  loop.passes = passes;
  loop.max_grad_norm = max_grad_norm;
  loop.optim = a.opt;
  loop.pool = a.pool;
  loop.store = store.store.get();
  rlpar::train::LearnLoopResult r;
  r.filled = start;
  {
    CallScope scope(true, net->has_external());
    if (scope.released()) {  // else the interpreter is exiting: nothing is taken
      r = rlpar::train::learn_loop(loop, start, learner_version, budget_s, finished);
    }
  }
  const double waited = r.take_s;
  // The take's time went mostly to waiting for rollouts: not native work (gil.h's meter)
  GilMeter& meter = thread_gil_meter();
  meter.released_ns -= std::min<int64_t>(meter.released_ns, static_cast<int64_t>(waited * 1e9));
  LearnLoopOut out;
  py::list last_passes;
  for (const auto& step : r.last) last_passes.append(py::make_tuple(step.grad_norm, step.applied));
  out.passes = py::tuple(last_passes);
  if (!r.last.empty()) out.metrics = step_result(a.spec, r.last.back())[0];
  out.batches = r.batches;
  out.filled = r.filled;
  out.dropped = r.dropped;
  out.applied = r.applied;
  out.skipped_publishes = r.skipped_publishes;
  out.lag_mean = r.lag_mean;
  out.lag_max = r.lag_max;
  out.take_s = r.take_s;
  out.learn_s = r.learn_s;
  out.publish_s = r.publish_s;
  return out;
}

}  // namespace

void bind_train_step(py::module_& m) {
  py::class_<TrainLoss>(m, "TrainLoss",
                        "A built-in loss for train_step (rlpar.NativeLoss builds it).")
      .def(py::init(&make_train_loss), py::arg("kind"), py::arg("policy"),
           py::arg("policy_begin"), py::arg("num_actions"), py::arg("log_std_begin"),
           py::arg("value_col"), py::arg("action_dims"), py::arg("options"), py::arg("low"),
           py::arg("high"),
           py::arg("bound_cost"));
  m.def("train_step", &train_step, py::arg("net"), py::arg("params"), py::arg("grad"),
        py::arg("loss"), py::arg("batch"), py::arg("columns"), py::kw_only(), py::arg("value_mean"),
        py::arg("value_std"), py::arg("max_grad_norm"), py::arg("optimizer"), py::arg("pool"),
        "One optimizer step of a built-in loss on a batch's columns (batch: an rlpar.Batch) as "
        "one call: gather, "
        "forward, loss, backward, clip, optimizer (native/include/rlpar/train_step.h). Returns "
        "(metrics, grad_norm, applied).");
  m.def("train_steps", &train_steps, py::arg("net"), py::arg("params"), py::arg("grad"),
        py::arg("loss"), py::arg("batch"), py::arg("columns"), py::kw_only(), py::arg("done"),
        py::arg("value_mean"),
        py::arg("value_std"), py::arg("max_grad_norm"), py::arg("optimizer"), py::arg("pool"),
        "train_step on each of columns (a sequence of int64 [M] or None) in turn as one call "
        "(PPO's epochs x minibatches), the optimizer's step count advancing with each step "
        "taken; stops after a step whose gradient was not finite. done (int64 [1]) counts the "
        "steps finished, also when one raises. Returns a list of (metrics, grad_norm, "
        "applied), one per step run.");
  py::class_<LearnLoopOut>(m, "LearnLoopResult", "What a learn_loop call did (read-only).")
      .def_readonly("batches", &LearnLoopOut::batches, "Learner steps finished (each published).")
      .def_readonly("filled", &LearnLoopOut::filled,
                    "Column blocks of a batch left part-taken in the batch's arrays.")
      .def_readonly("dropped", &LearnLoopOut::dropped,
                    "Rollouts handed back unused: older than max_lag.")
      .def_readonly("applied", &LearnLoopOut::applied, "Optimizer steps applied.")
      .def_readonly("skipped_publishes", &LearnLoopOut::skipped_publishes)
      .def_readonly("lag_mean", &LearnLoopOut::lag_mean, "The last batch's mean policy lag.")
      .def_readonly("lag_max", &LearnLoopOut::lag_max, "The last batch's largest policy lag.")
      .def_readonly("metrics", &LearnLoopOut::metrics,
                    "The last step's loss metrics (a dict), None without a step.")
      .def_readonly("passes", &LearnLoopOut::passes,
                    "The last batch's steps: (grad_norm, applied) each.")
      .def_readonly("take_s", &LearnLoopOut::take_s, "Seconds taking batches (waiting too).")
      .def_readonly("learn_s", &LearnLoopOut::learn_s, "Seconds in the optimizer steps.")
      .def_readonly("publish_s", &LearnLoopOut::publish_s, "Seconds publishing.");
  m.def("learn_loop", &learn_loop, py::arg("inbox"), py::arg("batch"), py::arg("names"),
        py::arg("versions"), py::arg("start"), py::arg("learner_version"), py::arg("max_lag"),
        py::arg("net"), py::arg("params"), py::arg("grad"), py::arg("loss"), py::kw_only(),
        py::arg("passes"), py::arg("max_grad_norm"), py::arg("optimizer"), py::arg("store"),
        py::arg("pool"), py::arg("budget_s"), py::arg("done"),
        "The learner's loop for an actor-critic loss as one call without the GIL, for up to "
        "budget_s seconds: take a batch of versions.shape[0] rollouts from inbox into "
        "batch's arrays (an rlpar.Batch; its fields names, in the inbox's layout order; from "
        "column block start), passes optimizer steps on it (passes = 0: "
        "none, an idle learner), publish the parameters to store as learner_version + 1, and "
        "again. Returns a LearnLoopResult. done (int64 [2]): batches "
        "and optimizer steps finished, also when a step raises.");
}

}  // namespace rlpar_py
