// Tensors <-> the .npy arrays of npy.hpp, shared by the libtorch programs (mha_torch, mha_aoti).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "npy.hpp"

namespace mha {

// from_blob borrows the array's memory; .to() copies only when the device differs.
inline torch::Tensor to_tensor(const Array& a, const torch::Device& device) {
    void* data = a.kind == Kind::Int64 ? static_cast<void*>(const_cast<int64_t*>(a.ints.data()))
                                       : static_cast<void*>(const_cast<float*>(a.data.data()));
    return torch::from_blob(data, a.shape, a.kind == Kind::Int64 ? torch::kInt64 : torch::kFloat32).to(device);
}

// int64 stays int64; every float tensor is written as float32.
inline Array to_array(const torch::Tensor& t) {
    Array out;
    out.shape = t.sizes().vec();
    if (t.scalar_type() == torch::kInt64) {
        const torch::Tensor y = t.to(torch::kCPU).contiguous();
        out.kind = Kind::Int64;
        out.ints.assign(y.data_ptr<int64_t>(), y.data_ptr<int64_t>() + y.numel());
    } else {
        const torch::Tensor y = t.to(torch::kCPU, torch::kFloat32).contiguous();
        out.data.assign(y.data_ptr<float>(), y.data_ptr<float>() + y.numel());
    }
    return out;
}

inline std::vector<Array> to_arrays(const std::vector<torch::Tensor>& tensors) {
    std::vector<Array> out;
    for (const auto& t : tensors) out.push_back(to_array(t));
    return out;
}

}  // namespace mha
