// Row-major Eigen views over the raw float buffers the kernels work on. Internal to src/: the
// public headers (include/rlpar) stay free of Eigen.
#pragma once

#include <Eigen/Core>

namespace rlpar {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstRowVec = Eigen::Map<const Eigen::RowVectorXf>;
using ArrMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrMap = Eigen::Map<const Eigen::ArrayXf>;

}  // namespace rlpar
