// What the fused kernels share: TensorFlow's headers, element conversions, one registration macro.
// The kernels are built as one library (fused_ops.cc includes each kernel's header); see build.py.
#pragma once
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "tensorflow/core/util/work_sharder.h"

// Registers KERNEL<float> and KERNEL<bfloat16> as the CPU kernels of op NAME (its attr "T").
#define GPT_TF_REGISTER_CPU(NAME, KERNEL)                                                                   \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(::tensorflow::DEVICE_CPU).TypeConstraint<float>("T"), KERNEL<float>); \
  REGISTER_KERNEL_BUILDER(Name(NAME).Device(::tensorflow::DEVICE_CPU).TypeConstraint<::tensorflow::bfloat16>("T"), \
                          KERNEL<::tensorflow::bfloat16>);

namespace gpt_tf {

using ::tensorflow::bfloat16;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using CPUDevice = Eigen::ThreadPoolDevice;

inline ::absl::Status SameShapeAsInput0(::tensorflow::shape_inference::InferenceContext* c) {
  c->set_output(0, c->input(0));
  return ::absl::OkStatus();
}

// Element conversions the compiler vectorises: bfloat16 is the high half of a float32; float32 to
// bfloat16 rounds to nearest even, NaN to the quiet NaN (as Eigen's conversion does).
inline float ToFloat(float x) { return x; }
inline float ToFloat(bfloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(Eigen::numext::bit_cast<uint16_t>(x)) << 16;
  return Eigen::numext::bit_cast<float>(bits);
}
inline void Store(float f, float* out) { *out = f; }
inline void Store(float f, bfloat16* out) {
  const uint32_t u = Eigen::numext::bit_cast<uint32_t>(f);
  const uint32_t rounded = (f != f) ? 0x7fc00000u : u + 0x7fffu + ((u >> 16) & 1u);
  *out = Eigen::numext::bit_cast<bfloat16>(static_cast<uint16_t>(rounded >> 16));
}

}  // namespace gpt_tf
