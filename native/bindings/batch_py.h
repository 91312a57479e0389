// The one conversion of a batch (an rlpar.Batch, or any object with its array fields) into the
// core's view of it (rlpar::train::BatchView, train_step.h), for every train call of the
// bindings: the shape and dtype checks of its arrays, written once.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "rlpar/losses.h"
#include "rlpar/net.h"
#include "rlpar/train_step.h"

namespace rlpar_py {

// A batch's arrays, kept alive (converted copies included) for as long as `view` points into
// them.
struct BatchArrays {
  pybind11::array obs, behaviour, actions, rewards, terminated, truncated, mask, core_state;
  rlpar::train::BatchView view;
};

// `batch`'s fields as the net and the loss's layout read them, [T, N] from batch.rewards:
//   obs         [T+1, N, *input_shape]  float32 or uint8 (the net's input dtype)
//   behaviour   [T, N, output_size]     float32
//   actions     [T, N] int64 (categorical) or [T, N, num_actions] float32 (Gaussian)
//   rewards     [T, N]                  float32
//   terminated, truncated, mask [T, N]  uint8 or bool
//   core_state  [N, state_size]         float32; read for a recurrent net alone (else may be None)
// C-contiguous (a copy where not). TypeError for a missing field or a wrong dtype, ValueError for
// a wrong shape, each naming the field ("batch.rewards") with what was expected and what came.
BatchArrays batch_arrays(pybind11::handle batch, const rlpar::Net& net,
                         const rlpar::losses::ActorCriticArgs& layout);

}  // namespace rlpar_py
