// What the loss bindings share (losses.cc, train_step.cc): enum options by name, and the
// metrics of a loss call as a Python dict. Call them with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rlpar/losses.h"

namespace rlpar_py {

namespace py = pybind11;

// The enum value named `got`: `a` named `name_a` or `b` named `name_b`, or a ValueError naming
// `key`, the two names and what came.
template <typename E>
E pick(const char* key, const std::string& got, const char* name_a, E a, const char* name_b,
       E b) {
  if (got == name_a) return a;
  if (got == name_b) return b;
  throw py::value_error(std::string(key) + " must be '" + name_a + "' or '" + name_b +
                        "', got '" + got + "'");
}

// Where the policy and the value sit in a row of the net's output. `action_dims`: the logits
// of each dimension of a "multi_categorical" policy (empty for the others).
inline void set_layout(rlpar::losses::ActorCriticArgs& a, const std::string& policy,
                       int64_t policy_begin, int64_t num_actions, int64_t log_std_begin,
                       int64_t value_col, const std::vector<int64_t>& action_dims) {
  if (policy == "multi_categorical") {
    a.policy = rlpar::losses::Policy::MultiCategorical;
    if (action_dims.empty()) {
      throw py::value_error("policy 'multi_categorical' needs action_dims (the logits of each "
                            "action dimension), got none");
    }
  } else {
    if (policy != "categorical" && policy != "gaussian") {
      throw py::value_error("policy must be 'categorical', 'gaussian' or 'multi_categorical', "
                            "got '" + policy + "'");
    }
    a.policy = policy == "categorical" ? rlpar::losses::Policy::Categorical
                                       : rlpar::losses::Policy::Gaussian;
    if (!action_dims.empty()) {
      throw py::value_error("action_dims is for policy 'multi_categorical', got it with '" +
                            policy + "'");
    }
  }
  a.action_dims = action_dims;
  a.policy_begin = policy_begin;
  a.num_actions = num_actions;
  a.log_std_begin = log_std_begin;
  a.value_col = value_col;
}

inline py::dict metrics_dict(const rlpar::losses::ActorCriticMetrics& res) {
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
  return metrics;
}

inline py::dict metrics_dict(const rlpar::losses::PpoMetrics& res) {
  py::dict metrics;
  metrics["loss"] = res.loss;
  metrics["policy_loss"] = res.policy_loss;
  metrics["value_loss"] = res.value_loss;
  metrics["entropy"] = res.entropy;
  metrics["approx_kl"] = res.approx_kl;
  metrics["clip_fraction"] = res.clip_fraction;
  metrics["value_clip_fraction"] = res.value_clip_fraction;
  metrics["ratio_mean"] = res.ratio_mean;
  metrics["ratio_min"] = res.ratio_min;
  metrics["ratio_max"] = res.ratio_max;
  metrics["explained_variance"] = res.explained_variance;
  metrics["mean_advantage"] = res.mean_advantage;
  metrics["advantage_std"] = res.advantage_std;
  metrics["mean_value"] = res.mean_value;
  metrics["mean_rho"] = res.mean_rho;
  metrics["target_mean"] = res.target_mean;
  metrics["target_sq_mean"] = res.target_sq_mean;
  metrics["valid_steps"] = res.valid_steps;
  return metrics;
}

}  // namespace rlpar_py
