// The binding functions PYBIND11_MODULE (module.cc) calls, one per binding file.
#pragma once

#include <pybind11/pybind11.h>

namespace rlpar_py {

void bind_net(pybind11::module_& m);     // net.cc: Net, Tape
void bind_optim(pybind11::module_& m);   // optim.cc: optimizers, gradient norms
void bind_losses(pybind11::module_& m);  // losses.cc: actor-critic losses
void bind_train_step(pybind11::module_& m);  // train_step.cc: TrainLoss, train_step
void bind_step_loop(pybind11::module_& m);  // step_loop.cc: StepLoop (envs stepped in Python)
void bind_ticket_queue(pybind11::module_& m);  // ticket_queue.cc: TicketQueue (rollout hand-offs)
void bind_gil_calibration(pybind11::module_& m);  // gil_calibration.cc: gil_calibration
void calibrate_release_threshold();  // gil_calibration.cc: measures, sets g_release_threshold
void bind_isa(pybind11::module_& m);  // isa.cc: simd_kernels, build_arch
// isa.cc: reads RLPAR_MAX_ISA; throws std::invalid_argument (ImportError at import) on a bad value.
void check_isa_setting();

}  // namespace rlpar_py
