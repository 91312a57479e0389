// Binds rlpar/isa.h: which kernel set runs, and what the build was compiled for.
#include "rlpar/isa.h"

#include <string>

#include "bindings.h"
#include "rlpar/layers.h"

namespace py = pybind11;

namespace rlpar_py {

void bind_isa(py::module_& m) {
  m.def("simd_kernels", [] { return std::string(rlpar::layers::conv2d_simd_kernels()); },
        "Which of rlpar's register-blocked kernels run: 'avx512' (Conv2d, Linear and the LSTM "
        "cell), 'avx2' (Conv2d only, AVX2 + FMA: an -march=x86-64-v3 build, or RLPAR_MAX_ISA=avx2; "
        "Linear stays on Eigen), or '' (the portable Eigen path everywhere). The best that the "
        "build, the CPU and the environment variable RLPAR_MAX_ISA allow, chosen once.");
  m.def("build_arch", [] { return std::string(rlpar::build_arch()); },
        "The -march the native core was compiled for ('native', 'x86-64-v3', 'x86-64', ...).");
}

void check_isa_setting() { (void)rlpar::active_isa(); }

}  // namespace rlpar_py
