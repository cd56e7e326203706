// mha_torch: run an mha-export TorchScript model (model.pt) with libtorch. The module's forward
// takes the declared inputs positionally in declared order; model.pt carries the declaration as
// the attributes input_names / output_names (a model.pt without them is the old x -> y export).
// Files are matched to inputs and outputs by those names, never by position. One loaded module
// runs every case. Exit codes, the .npy format and the two command-line forms: see npy.hpp.
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
#include "torch_io.hpp"

namespace {

const char* const kUsage =
    "usage: mha_torch MODEL.pt CASE_DIR [CASE_DIR ...] [--device cpu|cuda] [--threads N] [--repeat N]\n"
    "       [--info]\n"
    "       mha_torch MODEL.pt IN.npy OUT.npy [IN2.npy OUT2.npy ...] [options]   (one-input, one-output models)\n"
    "  CASE_DIR           a folder holding NAME.npy for every input the model declares (see --info);\n"
    "                     every declared output is written there as NAME.npy. One loaded module runs them all\n"
    "  --device cpu|cuda  where the module runs (default cpu); cuda without a usable GPU: exit 3\n"
    "  --threads N        intra-op threads (at::set_num_threads; default: libtorch's)\n"
    "  --repeat N         after each case, time N more forward calls alone (inputs made once, outputs\n"
    "                     not converted; a static cache rewrites the same entries): median, min\n"
    "  --info             print the module's declared inputs/outputs (input_names / output_names)\n"
    "float inputs: float32 or float16 .npy (run as float32); int64 .npy stay int64 (attention_mask);\n"
    "outputs are written as float32\n"
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

std::vector<std::string> string_list(const torch::jit::Module& module, const std::string& attr,
                                     const std::string& path) {
    const torch::IValue value = module.attr(attr);
    if (!value.isList()) throw mha::UsageError(path + ": attribute " + attr + " is not a list of names");
    std::vector<std::string> names;
    for (const auto& item : value.toListRef()) {
        if (!item.isString()) throw mha::UsageError(path + ": attribute " + attr + " is not a list of names");
        names.push_back(item.toStringRef());
    }
    return names;
}

// The module's declaration. model.pt holds names only: dtypes and shapes are known for x (float32
// [batch, seq, d_in], d_in from the first projection); other inputs take float or int64 files as
// given (config.json "io" beside model.pt has their declared dtypes and shapes).
mha::Declaration declaration(torch::jit::Module& module, const std::string& path, bool& declared) {
    declared = module.hasattr("input_names") && module.hasattr("output_names");
    const std::vector<std::string> ins = declared ? string_list(module, "input_names", path) : std::vector<std::string>{"x"};
    const std::vector<std::string> outs = declared ? string_list(module, "output_names", path) : std::vector<std::string>{"y"};
    if (ins.empty() || outs.empty()) throw mha::UsageError(path + ": input_names / output_names is empty");
    // forward's arguments after self: the declared inputs first; any further ones must have a
    // default (a rotary layer's optional position_ids when it is not declared).
    const auto& args = module.get_method("forward").function().getSchema().arguments();
    const size_t takes = args.size() - 1;  // - self
    size_t required = takes;
    while (required > 0 && args[required].default_value().has_value()) --required;
    if (ins.size() < required || ins.size() > takes)
        throw mha::UsageError(path + ": forward takes " + std::to_string(required) + "-" +
                              std::to_string(takes) + " inputs but input_names lists " +
                              std::to_string(ins.size()));
    const int64_t width = input_width(module);
    mha::Declaration d;
    for (const auto& name : ins) {
        mha::TensorDecl t;
        t.name = name;
        t.type_text = "Tensor (dtype and dims not recorded in model.pt)";
        if (name == "x") {
            t.kind = mha::Kind::Float;
            t.type_text = "float32";
            t.known_rank = true;
            t.dims = {-1, -1, width};
            t.symbols = {"batch", "seq", width >= 0 ? "" : "d_in"};
        }
        d.inputs.push_back(t);
    }
    for (const auto& name : outs) {
        mha::TensorDecl t;
        t.name = name;
        t.type_text = "Tensor (dtype and dims not recorded in model.pt)";
        d.outputs.push_back(t);
    }
    return d;
}

std::vector<mha::Array> forward(torch::jit::Module& module, const mha::Declaration& decl, const mha::Case& c,
                                const torch::Device& device, int repeat) {
    c10::InferenceMode guard;
    std::vector<torch::IValue> inputs;
    for (const mha::Array& a : c.inputs) inputs.emplace_back(mha::to_tensor(a, device));
    const torch::IValue result = module.forward(inputs);
    if (repeat) std::cout << c.label << ": " << mha::time_calls(repeat, [&] { module.forward(inputs); }) << "\n";
    std::vector<torch::Tensor> tensors;
    if (result.isTensor()) {
        tensors.push_back(result.toTensor());
    } else if (result.isTuple()) {
        for (const auto& item : result.toTupleRef().elements()) {
            if (!item.isTensor()) throw std::runtime_error("the model returned a tuple holding a non-tensor");
            tensors.push_back(item.toTensor());
        }
    } else if (result.isTensorList()) {  // a kind's own cache (DeepSeek-V4's): y, present_*
        for (const auto& item : result.toTensorVector()) tensors.push_back(item);
    } else {
        throw std::runtime_error("the model returned neither a tensor nor a tuple or list of tensors");
    }
    if (tensors.size() != decl.outputs.size())
        throw std::runtime_error("the model returned " + std::to_string(tensors.size()) + " tensors, output_names lists " +
                                 std::to_string(decl.outputs.size()));
    return mha::to_arrays(tensors);
}

int main_torch(int argc, char** argv) {
    const mha::Args args = mha::parse_args(argc, argv, kUsage, {"--device", "--threads", "--repeat"},
                                               {"--info"}, {"--info"});
    const std::string device_name = args.option("--device", "cpu");
    if (device_name != "cpu" && device_name != "cuda")
        throw mha::UsageError("--device must be cpu or cuda, got '" + device_name + "'");
    if (args.options.count("--threads"))
        at::set_num_threads(mha::parse_positive_int("--threads", args.option("--threads", "")));
    mha::require_file(args.model, "model");

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
    bool declared = false;
    const mha::Declaration decl = declaration(module, args.model, declared);

    // Every input of every case is read and checked before anything runs: bad input leaves no
    // output behind.
    const std::vector<mha::Case> cases = mha::read_cases(args, decl);
    const int repeat = mha::repeat_count(args);

    std::cout << "libtorch " << TORCH_VERSION << ", device: " << device << ", threads: " << at::get_num_threads()
              << ", load " << load_time << "\n";
    if (args.flag("--info")) {
        std::cout << "model: " << args.model
                  << (declared ? "" : " (no input_names / output_names: an older x -> y export)") << "\n";
        mha::print_declaration(decl);
    }
    return mha::run_cases(decl, cases, [&](const mha::Case& c) {
        try {
            return forward(module, decl, c, device, repeat);
        } catch (const c10::Error& e) {
            throw std::runtime_error("forward failed on " + c.label + ": " + mha::first_line(e.what_without_backtrace()));
        }
    });
}

}  // namespace

int main(int argc, char** argv) {
    return mha::guarded_main([&] { return main_torch(argc, argv); });
}
