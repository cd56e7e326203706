// mha_aoti: run an mha-export AOTInductor package (model.pt2: torch.export + AOTInductor) with
// libtorch's torch::inductor::AOTIModelPackageLoader, no Python. The package's metadata carries
// the declared names (mha_export.input_names / mha_export.output_names); inputs are passed in
// that order and every file is matched by name. One loaded package runs every case. Exit codes,
// the .npy format and the two command-line forms: see npy.hpp.
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/version.h>

#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "npy.hpp"
#include "torch_io.hpp"

namespace {

const char* const kUsage =
    "usage: mha_aoti MODEL.pt2 CASE_DIR [CASE_DIR ...] [--threads N] [--repeat N] [--info]\n"
    "       mha_aoti MODEL.pt2 IN.npy OUT.npy [IN2.npy OUT2.npy ...] [options]   (one-input, one-output models)\n"
    "  CASE_DIR     a folder holding NAME.npy for every input the package declares (see --info);\n"
    "               every declared output is written there as NAME.npy. One loaded package runs them all\n"
    "  --threads N  intra-op threads (at::set_num_threads; default: libtorch's)\n"
    "  --repeat N   after each case, time N more calls of the package alone (inputs made once,\n"
    "               outputs not converted; a static cache rewrites the same entries): median, min\n"
    "  --info       print the package's declared inputs/outputs\n"
    "float inputs: float32 or float16 .npy (run as float32); int64 .npy stay int64; outputs are\n"
    "written as float32. The package runs on the device it was compiled for (mha-export aoti --device)\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad input";

std::vector<std::string> split_names(const std::string& text) {
    std::vector<std::string> names;
    std::stringstream in(text);
    for (std::string name; std::getline(in, name, ',');)
        if (!name.empty()) names.push_back(name);
    return names;
}

// The input shapes the package was compiled for ("2,?,32;..." per input: '?' dynamic). Run at
// another shape, an AOTInductor package reads out of bounds instead of raising: every case is
// checked against them before anything runs.
void require_compiled_shapes(const std::string& spec, const mha::Declaration& decl, const mha::Case& c) {
    std::vector<std::string> per_input;
    std::stringstream in(spec);
    for (std::string one; std::getline(in, one, ';');) per_input.push_back(one);
    for (size_t i = 0; i < c.inputs.size() && i < per_input.size(); ++i) {
        std::vector<std::string> dims;
        std::stringstream d(per_input[i]);
        for (std::string one; std::getline(d, one, ',');) dims.push_back(one);
        const auto& shape = c.inputs[i].shape;
        bool ok = dims.size() == shape.size();
        for (size_t j = 0; ok && j < dims.size(); ++j) ok = dims[j] == "?" || std::stoll(dims[j]) == shape[j];
        if (!ok)
            throw mha::UsageError(c.label + ": the package was compiled for " + decl.inputs[i].name + " [" +
                                  per_input[i] + "] ('?' dynamic), got " + mha::shape_str(shape));
    }
}

mha::Declaration declaration(torch::inductor::AOTIModelPackageLoader& loader, const std::string& path,
                             std::string& device) {
    const auto meta = loader.get_metadata();
    const auto ins = meta.find("mha_export.input_names"), outs = meta.find("mha_export.output_names");
    if (ins == meta.end() || outs == meta.end())
        throw mha::UsageError(path + ": not an mha-export package (no mha_export.input_names in its metadata)");
    const auto dev = meta.find("mha_export.device");
    device = dev == meta.end() ? "cpu" : dev->second;
    mha::Declaration d;
    for (const auto& name : split_names(ins->second)) {
        mha::TensorDecl t;
        t.name = name;
        t.kind = name == "attention_mask" || name == "position_ids" || name == "past_lengths" ? mha::Kind::Int64
                                                                                               : mha::Kind::Float;
        t.type_text = t.kind == mha::Kind::Int64 ? "int64" : "float32";
        d.inputs.push_back(t);
    }
    for (const auto& name : split_names(outs->second)) {
        mha::TensorDecl t;
        t.name = name;
        t.type_text = "float32";
        d.outputs.push_back(t);
    }
    return d;
}

int main_aoti(int argc, char** argv) {
    const mha::Args args = mha::parse_args(argc, argv, kUsage, {"--threads", "--repeat"}, {"--info"},
                                               {"--info"});
    if (args.options.count("--threads"))
        at::set_num_threads(mha::parse_positive_int("--threads", args.option("--threads", "")));
    mha::require_file(args.model, "model");
    const auto t0 = mha::Clock::now();
    std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
    try {
        loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(args.model);
    } catch (const std::exception& e) {
        throw mha::UsageError("cannot load package " + args.model + ": " + mha::first_line(e.what()));
    }
    const std::string load_time = mha::ms_since(t0);
    std::string device_name;
    const mha::Declaration decl = declaration(*loader, args.model, device_name);
    const torch::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
    const auto meta = loader->get_metadata();
    const auto shapes = meta.find("mha_export.input_shapes");
    if (shapes == meta.end())
        throw mha::UsageError(args.model + ": not an mha-export package (no mha_export.input_shapes in its metadata)");
    const std::vector<mha::Case> cases = mha::read_cases(
        args, decl, [&](const mha::Case& c) { require_compiled_shapes(shapes->second, decl, c); });
    const int repeat = mha::repeat_count(args);

    std::cout << "libtorch " << TORCH_VERSION << " AOTInductor, device: " << device
              << ", threads: " << at::get_num_threads() << ", load " << load_time << "\n";
    if (args.flag("--info")) {
        std::cout << "model: " << args.model << "\n";
        mha::print_declaration(decl);
    }
    return mha::run_cases(decl, cases, [&](const mha::Case& c) {
        c10::InferenceMode guard;
        std::vector<at::Tensor> inputs;
        for (const mha::Array& a : c.inputs) inputs.push_back(mha::to_tensor(a, device));
        try {
            std::vector<mha::Array> outputs = mha::to_arrays(loader->run(inputs));
            if (repeat) std::cout << c.label << ": " << mha::time_calls(repeat, [&] { loader->run(inputs); }) << "\n";
            return outputs;
        } catch (const std::exception& e) {
            throw std::runtime_error("run failed on " + c.label + ": " + mha::first_line(e.what()));
        }
    });
}

}  // namespace

int main(int argc, char** argv) {
    return mha::guarded_main([&] { return main_aoti(argc, argv); });
}
