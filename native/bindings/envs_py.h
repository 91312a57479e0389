// Python face of the native envs (rlpar/envs.h) and of the fused actor loop: called once from
// module.cc's PYBIND11_MODULE.
#pragma once

#include <pybind11/pybind11.h>

namespace rlpar_py {

void bind_envs(pybind11::module_& m);

}  // namespace rlpar_py
