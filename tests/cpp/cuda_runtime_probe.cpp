// tests/test_cpp.py builds this beside the programs: the CUDA runtime loader of mha_ort and
// mha_layers (cpp/cuda_runtime_loader.hpp) asked for a usable device, as --cuda-graph asks once
// the CUDA provider has loaded. Without a GPU (or without libcudart, or a driver) it must exit 3
// with one line; with one, 0.
#include "cuda_runtime_loader.hpp"

int main() {
    return mha::guarded_main([] {
        const mha::CudaRuntime& cuda = mha::CudaRuntime::get();
        cuda.require_device();
        std::cout << "a CUDA device through " << cuda.library() << std::endl;
        return 0;
    });
}
