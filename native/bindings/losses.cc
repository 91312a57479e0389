// Bindings of the actor-critic losses: check arrays (expected vs got), release the GIL, compute.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "convert.h"
#include "gil.h"
#include "rlpar/losses.h"

namespace py = pybind11;

namespace rlpar_py {

void bind_losses(py::module_& m) {
  m.def(
      "actor_critic_loss",
      [](py::handle out, py::handle behaviour, py::handle actions, py::handle rewards,
         py::handle terminated, py::handle truncated, py::handle mask, const std::string& policy,
         int64_t policy_begin, int64_t num_actions, int64_t log_std_begin, int64_t value_col,
         double gamma, bool importance_weighting, double rho_bar, double c_bar, double pg_rho_bar,
         double value_coef, double entropy_coef) {
        rlpar::losses::ActorCriticArgs a;
        auto o = py::array::ensure(out);
        if (!o || o.ndim() != 3 || o.shape(0) < 2 || o.shape(1) < 1) {
          throw py::value_error("out must be a float32 array [T+1, N, O] with T, N >= 1, got " +
                                (o ? shape_str(o) : std::string("a non-array")));
        }
        a.T = o.shape(0) - 1;
        a.N = o.shape(1);
        a.O = o.shape(2);
        if (policy == "categorical") {
          a.policy = rlpar::losses::Policy::Categorical;
        } else if (policy == "gaussian") {
          a.policy = rlpar::losses::Policy::Gaussian;
        } else {
          throw py::value_error("policy must be 'categorical' or 'gaussian', got '" + policy + "'");
        }
        a.policy_begin = policy_begin;
        a.num_actions = num_actions;
        a.log_std_begin = log_std_begin;
        a.value_col = value_col;
        a.gamma = gamma;
        a.importance_weighting = importance_weighting;
        a.rho_bar = rho_bar;
        a.c_bar = c_bar;
        a.pg_rho_bar = pg_rho_bar;
        a.value_coef = value_coef;
        a.entropy_coef = entropy_coef;
        const py::ssize_t T = a.T, N = a.N, O = a.O;
        auto o_arr = input_array<float>(out, "out", {T + 1, N, O});
        auto b_arr = input_array<float>(behaviour, "behaviour", {T, N, O});
        const bool cat = a.policy == rlpar::losses::Policy::Categorical;
        auto act = cat ? input_array<int64_t>(actions, "actions", {T, N})
                       : input_array<float>(actions, "actions", {T, N, num_actions});
        auto r = input_array<float>(rewards, "rewards", {T, N});
        auto te = input_array<uint8_t>(terminated, "terminated", {T, N});
        auto tr = input_array<uint8_t>(truncated, "truncated", {T, N});
        auto mk = input_array<uint8_t>(mask, "mask", {T, N});
        py::array_t<float> dout({T + 1, N, O});
        const float* op = static_cast<const float*>(o_arr.data());
        const float* bp = static_cast<const float*>(b_arr.data());
        const void* ap = act.data();
        const float* rp = static_cast<const float*>(r.data());
        const auto* tep = static_cast<const uint8_t*>(te.data());
        const auto* trp = static_cast<const uint8_t*>(tr.data());
        const auto* mp = static_cast<const uint8_t*>(mk.data());
        float* dp = dout.mutable_data();
        rlpar::losses::ActorCriticMetrics res;
        {
          CallScope scope(true, false);
          res = rlpar::losses::actor_critic_loss(a, op, bp, ap, rp, tep, trp, mp, dp);
        }
        py::dict metrics;
        metrics["loss"] = res.loss;
        metrics["policy_loss"] = res.policy_loss;
        metrics["value_loss"] = res.value_loss;
        metrics["entropy"] = res.entropy;
        metrics["mean_rho"] = res.mean_rho;
        metrics["rho_clipped_fraction"] = res.rho_clipped_fraction;
        metrics["mean_advantage"] = res.mean_advantage;
        metrics["mean_value"] = res.mean_value;
        metrics["valid_steps"] = res.valid_steps;
        return py::make_tuple(dout, metrics);
      },
      py::arg("out"), py::arg("behaviour"), py::arg("actions"), py::arg("rewards"),
      py::arg("terminated"), py::arg("truncated"), py::arg("mask"), py::kw_only(),
      py::arg("policy"), py::arg("policy_begin"), py::arg("num_actions"),
      py::arg("log_std_begin") = 0, py::arg("value_col"), py::arg("gamma"),
      py::arg("importance_weighting"), py::arg("rho_bar") = 1.0, py::arg("c_bar") = 1.0,
      py::arg("pg_rho_bar") = 1.0, py::arg("value_coef") = 0.5, py::arg("entropy_coef") = 0.01,
      "A3C (importance_weighting=False) or IMPALA V-trace loss and its gradient w.r.t. `out` "
      "[T+1, N, O]; see native/include/rlpar/losses.h. Returns (dout, metrics).");
}

}  // namespace rlpar_py
