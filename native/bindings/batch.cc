// batch_py.h: a batch's arrays into rlpar::train::BatchView.
#include "batch_py.h"

#include <string>
#include <vector>

#include "convert.h"

namespace py = pybind11;

namespace rlpar_py {
namespace {

py::object field(py::handle batch, const char* name) {
  if (!py::hasattr(batch, name)) {
    throw py::type_error(std::string("batch: expected an rlpar.Batch (obs, behaviour, actions, "
                                     "rewards, terminated, truncated, mask, core_state), got ") +
                         type_name(batch) + " without '" + name + "'");
  }
  return batch.attr(name);
}

}  // namespace

BatchArrays batch_arrays(py::handle batch, const rlpar::Net& net,
                         const rlpar::losses::ActorCriticArgs& layout) {
  BatchArrays a;
  // Shapes follow from rewards [T, N] and the net.
  py::array r = as_array(field(batch, "rewards"), "batch.rewards");
  if (r.ndim() != 2 || r.shape(0) < 1 || r.shape(1) < 1) {
    throw py::value_error("batch.rewards must be a float32 array [T, N] with T, N >= 1, got " +
                          shape_str(r));
  }
  const py::ssize_t T = r.shape(0), N = r.shape(1), O = net.output_size();
  std::vector<py::ssize_t> obs_dims{T + 1, N};
  for (int64_t d : net.spec().input_shape) obs_dims.push_back(d);
  py::object obs = field(batch, "obs");
  a.obs = net.spec().input_uint8 ? input_array<uint8_t>(obs, "batch.obs", obs_dims)
                                 : input_array<float>(obs, "batch.obs", obs_dims);
  py::object actions = field(batch, "actions");
  const auto D = static_cast<py::ssize_t>(layout.action_dims.size());
  switch (layout.policy) {
    case rlpar::losses::Policy::Categorical:
      a.actions = input_array<int64_t>(actions, "batch.actions", {T, N});
      break;
    case rlpar::losses::Policy::MultiCategorical:
      a.actions = input_array<int64_t>(actions, "batch.actions", {T, N, D});
      break;
    case rlpar::losses::Policy::Gaussian:
      a.actions = input_array<float>(actions, "batch.actions", {T, N, layout.num_actions});
      break;
  }
  a.behaviour = input_array<float>(field(batch, "behaviour"), "batch.behaviour", {T, N, O});
  a.rewards = input_array<float>(r, "batch.rewards", {T, N});
  a.terminated = input_array<uint8_t>(field(batch, "terminated"), "batch.terminated", {T, N});
  a.truncated = input_array<uint8_t>(field(batch, "truncated"), "batch.truncated", {T, N});
  a.mask = input_array<uint8_t>(field(batch, "mask"), "batch.mask", {T, N});
  // (a default py::array is an empty array, not None: test recurrent())
  if (net.recurrent()) {
    py::object state = field(batch, "core_state");
    if (state.is_none()) {
      throw py::value_error("batch.core_state: this net has an LSTM core, so the batch needs "
                            "the state its actors stored, float32 [N, " +
                            std::to_string(net.state_size()) + "], got None");
    }
    a.core_state = input_array<float>(state, "batch.core_state", {N, net.state_size()});
  }

  rlpar::train::BatchView& b = a.view;
  b.T = T;
  b.N = N;
  b.obs = a.obs.data();
  b.behaviour = static_cast<const float*>(a.behaviour.data());
  b.actions = a.actions.data();
  b.rewards = static_cast<const float*>(a.rewards.data());
  b.terminated = static_cast<const uint8_t*>(a.terminated.data());
  b.truncated = static_cast<const uint8_t*>(a.truncated.data());
  b.mask = static_cast<const uint8_t*>(a.mask.data());
  b.core_state = net.recurrent() ? static_cast<const float*>(a.core_state.data()) : nullptr;
  return a;
}

}  // namespace rlpar_py
