// mha_torch: run an mha-export TorchScript model (model.pt: x [batch, seq, d_in] -> y [batch, seq,
// dim]) with libtorch. One loaded module runs every IN/OUT pair. Exit codes and the .npy format:
// see npy.hpp.
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "npy.hpp"

namespace {

const char* const kUsage =
    "usage: mha_torch MODEL.pt IN.npy OUT.npy [IN2.npy OUT2.npy ...] [--device cpu|cuda] [--threads N]\n"
    "  --device cpu|cuda  where the module runs (default cpu); cuda without a usable GPU: exit 3\n"
    "  --threads N        intra-op threads (at::set_num_threads; default: libtorch's)\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad input, 3 requested device unavailable";

using mha::Clock;
using mha::ms_since;

// The input width the module expects: every mha-export layout's first weight is a q (or fused
// qkv) projection stored [out, d_in]. -1 when the module has no such parameter.
int64_t input_width(const torch::jit::Module& module) {
    for (const auto& p : module.named_parameters(/*recurse=*/true))
        if (p.value.dim() == 2) return p.value.size(1);
    return -1;
}

mha::Array forward(torch::jit::Module& module, const mha::Array& x, const torch::Device& device) {
    c10::InferenceMode guard;
    // from_blob borrows the array's memory; .to() copies only when the device differs.
    const torch::Tensor input =
        torch::from_blob(const_cast<float*>(x.data.data()), x.shape, torch::kFloat32).to(device);
    const torch::IValue result = module.forward({input});
    if (!result.isTensor()) throw std::runtime_error("the model did not return one tensor");
    const torch::Tensor y = result.toTensor().to(torch::kCPU, torch::kFloat32).contiguous();
    mha::Array out;
    out.shape = y.sizes().vec();
    out.data.assign(y.data_ptr<float>(), y.data_ptr<float>() + y.numel());
    return out;
}

int main_torch(int argc, char** argv) {
    const mha::Args args = mha::parse_args(argc, argv, kUsage, {"--device", "--threads"}, {});
    const std::string device_name = args.option("--device", "cpu");
    if (device_name != "cpu" && device_name != "cuda")
        throw mha::UsageError("--device must be cpu or cuda, got '" + device_name + "'");
    if (args.options.count("--threads"))
        at::set_num_threads(mha::parse_positive_int("--threads", args.option("--threads", "")));

    // Every input is read and checked before anything runs: bad input leaves no output behind.
    mha::require_file(args.model, "model");
    std::vector<mha::Array> inputs;
    for (const auto& [in, out] : args.pairs) inputs.push_back(mha::read_npy(in));

    if (device_name == "cuda" && !torch::cuda::is_available())
        throw mha::DeviceUnavailable("--device cuda: libtorch sees no usable CUDA device (CPU-only libtorch, "
                                     "no GPU or no driver); not falling back to CPU");
    const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);

    const auto t0 = Clock::now();
    torch::jit::Module module;
    try {
        module = torch::jit::load(args.model, device);
    } catch (const c10::Error& e) {
        // libtorch's message goes on with advice on corrupt checkpoints: keep its first sentence.
        const std::string what = mha::first_line(e.what_without_backtrace());
        throw mha::UsageError("cannot load model " + args.model + ": " + what.substr(0, what.find(". ")));
    }
    module.eval();
    const std::string load_time = ms_since(t0);

    mha::check_widths(args.pairs, inputs, input_width(module));

    std::cout << "libtorch " << TORCH_VERSION << ", device: " << device << ", threads: " << at::get_num_threads()
              << ", load " << load_time << "\n";
    return mha::run_pairs(args.pairs, inputs, [&](mha::Array& x, const std::string& name) {
        try {
            return forward(module, x, device);
        } catch (const c10::Error& e) {
            throw std::runtime_error("forward failed on " + name + ": " +
                                     mha::first_line(e.what_without_backtrace()));
        }
    });
}

}  // namespace

int main(int argc, char** argv) {
    return mha::guarded_main([&] { return main_torch(argc, argv); });
}
