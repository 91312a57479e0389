// Bindings of the actor-critic losses: check arrays (expected vs got), release the GIL, compute.
// Every option is a required keyword: the defaults live in rlpar/losses.py alone.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "convert.h"
#include "gil.h"
#include "loss_py.h"
#include "rlpar/losses.h"

namespace py = pybind11;

namespace rlpar_py {
namespace {

// The arrays of one loss call, checked against the shapes `out` [T+1, N, O] implies, and the
// layout fields of `a` set from them.
struct LossArrays {
  py::array out, behaviour, actions, rewards, terminated, truncated, mask;

  LossArrays(rlpar::losses::ActorCriticArgs& a, py::handle out_h, py::handle behaviour_h,
             py::handle actions_h, py::handle rewards_h, py::handle terminated_h,
             py::handle truncated_h, py::handle mask_h, const std::string& policy,
             int64_t policy_begin, int64_t num_actions, int64_t log_std_begin,
             int64_t value_col, const std::vector<int64_t>& action_dims) {
    auto o = py::array::ensure(out_h);
    if (!o || o.ndim() != 3 || o.shape(0) < 2 || o.shape(1) < 1) {
      throw py::value_error("out must be a float32 array [T+1, N, O] with T, N >= 1, got " +
                            (o ? shape_str(o) : std::string("a non-array")));
    }
    a.T = o.shape(0) - 1;
    a.N = o.shape(1);
    a.O = o.shape(2);
    set_layout(a, policy, policy_begin, num_actions, log_std_begin, value_col, action_dims);
    const py::ssize_t T = a.T, N = a.N, O = a.O;
    const auto D = static_cast<py::ssize_t>(action_dims.size());
    out = input_array<float>(out_h, "out", {T + 1, N, O});
    behaviour = input_array<float>(behaviour_h, "behaviour", {T, N, O});
    if (a.policy == rlpar::losses::Policy::Gaussian) {
      actions = input_array<float>(actions_h, "actions", {T, N, num_actions});
    } else if (a.policy == rlpar::losses::Policy::MultiCategorical) {
      actions = input_array<int64_t>(actions_h, "actions", {T, N, D});
    } else {
      actions = input_array<int64_t>(actions_h, "actions", {T, N});
    }
    rewards = input_array<float>(rewards_h, "rewards", {T, N});
    terminated = input_array<uint8_t>(terminated_h, "terminated", {T, N});
    truncated = input_array<uint8_t>(truncated_h, "truncated", {T, N});
    mask = input_array<uint8_t>(mask_h, "mask", {T, N});
  }

  // Runs `loss(out, behaviour, actions, rewards, terminated, truncated, mask, dout)` with the
  // GIL released; returns dout [T+1, N, O] and what `loss` returned.
  template <typename F>
  auto run(const rlpar::losses::ActorCriticArgs& a, F&& loss) {
    py::array_t<float> dout({a.T + 1, a.N, a.O});
    const auto* op = static_cast<const float*>(out.data());
    const auto* bp = static_cast<const float*>(behaviour.data());
    const void* ap = actions.data();
    const auto* rp = static_cast<const float*>(rewards.data());
    const auto* tep = static_cast<const uint8_t*>(terminated.data());
    const auto* trp = static_cast<const uint8_t*>(truncated.data());
    const auto* mp = static_cast<const uint8_t*>(mask.data());
    float* dp = dout.mutable_data();
    auto metrics = [&] {  // a plain struct: nothing Python is touched without the GIL
      CallScope scope(true, false);
      return loss(op, bp, ap, rp, tep, trp, mp, dp);
    }();
    return std::make_pair(std::move(dout), metrics);
  }
};

#define RLPAR_LOSS_ARRAY_ARGS                                                                   \
  py::arg("out"), py::arg("behaviour"), py::arg("actions"), py::arg("rewards"),                 \
      py::arg("terminated"), py::arg("truncated"), py::arg("mask"), py::kw_only(),              \
      py::arg("policy"), py::arg("policy_begin"), py::arg("num_actions"),                       \
      py::arg("log_std_begin"), py::arg("value_col"), py::arg("action_dims")

}  // namespace

void bind_losses(py::module_& m) {
  m.def(
      "actor_critic_loss",
      [](py::handle out, py::handle behaviour, py::handle actions, py::handle rewards,
         py::handle terminated, py::handle truncated, py::handle mask, const std::string& policy,
         int64_t policy_begin, int64_t num_actions, int64_t log_std_begin, int64_t value_col,
         const std::vector<int64_t>& action_dims, double gamma, bool importance_weighting,
         double rho_bar, double c_bar, double pg_rho_bar,
         double value_coef, double entropy_coef) {
        rlpar::losses::ActorCriticArgs a;
        LossArrays arrays(a, out, behaviour, actions, rewards, terminated, truncated, mask,
                          policy, policy_begin, num_actions, log_std_begin, value_col,
                          action_dims);
        a.gamma = gamma;
        a.importance_weighting = importance_weighting;
        a.rho_bar = rho_bar;
        a.c_bar = c_bar;
        a.pg_rho_bar = pg_rho_bar;
        a.value_coef = value_coef;
        a.entropy_coef = entropy_coef;
        auto [dout, res] = arrays.run(a, [&](auto... p) {
          return rlpar::losses::actor_critic_loss(a, p...);
        });
        return py::make_tuple(dout, metrics_dict(res));
      },
      RLPAR_LOSS_ARRAY_ARGS, py::arg("gamma"), py::arg("importance_weighting"),
      py::arg("rho_bar"), py::arg("c_bar"), py::arg("pg_rho_bar"), py::arg("value_coef"),
      py::arg("entropy_coef"),
      "A3C (importance_weighting=False) or IMPALA V-trace loss and its gradient w.r.t. `out` "
      "[T+1, N, O]; see native/include/rlpar/losses.h. Returns (dout, metrics).");

  m.def(
      "ppo_loss",
      [](py::handle out, py::handle behaviour, py::handle actions, py::handle rewards,
         py::handle terminated, py::handle truncated, py::handle mask, const std::string& policy,
         int64_t policy_begin, int64_t num_actions, int64_t log_std_begin, int64_t value_col,
         const std::vector<int64_t>& action_dims, double gamma, double rho_bar, double c_bar,
         double value_coef, double entropy_coef,
         double clip_eps, const std::string& ratio_clip, const std::string& advantage,
         double gae_lambda, bool normalize_advantages, double value_clip, double value_mean,
         double value_std) {
        rlpar::losses::PpoArgs a;
        LossArrays arrays(a.base, out, behaviour, actions, rewards, terminated, truncated, mask,
                          policy, policy_begin, num_actions, log_std_begin, value_col,
                          action_dims);
        a.base.gamma = gamma;
        a.base.importance_weighting = true;
        a.base.rho_bar = rho_bar;
        a.base.c_bar = c_bar;
        a.base.value_coef = value_coef;
        a.base.entropy_coef = entropy_coef;
        a.clip_eps = clip_eps;
        a.clip = pick("ratio_clip", ratio_clip, "symmetric", rlpar::losses::RatioClip::Symmetric,
                      "reciprocal", rlpar::losses::RatioClip::Reciprocal);
        a.advantage = pick("advantage", advantage, "vtrace", rlpar::losses::Advantage::VTrace,
                           "gae", rlpar::losses::Advantage::Gae);
        a.lambda = gae_lambda;
        a.normalize_advantages = normalize_advantages;
        a.value_clip = value_clip;
        a.value_mean = value_mean;
        a.value_std = value_std;
        auto [dout, res] = arrays.run(a.base, [&](auto... p) {
          return rlpar::losses::ppo_loss(a, p...);
        });
        return py::make_tuple(dout, metrics_dict(res));
      },
      RLPAR_LOSS_ARRAY_ARGS, py::arg("gamma"), py::arg("rho_bar"), py::arg("c_bar"),
      py::arg("value_coef"), py::arg("entropy_coef"), py::arg("clip_eps"), py::arg("ratio_clip"),
      py::arg("advantage"), py::arg("gae_lambda"), py::arg("normalize_advantages"),
      py::arg("value_clip"), py::arg("value_mean"), py::arg("value_std"),
      "PPO's clipped surrogate on V-trace or GAE(lambda) advantages against the behaviour "
      "policy, and its gradient w.r.t. `out` [T+1, N, O]; see native/include/rlpar/losses.h. "
      "Returns (dout, metrics).");
}

#undef RLPAR_LOSS_ARRAY_ARGS

}  // namespace rlpar_py
