// mha_executorch: run an mha-export ExecuTorch program (model.pte) with the ExecuTorch runtime of
// the pip wheel (libexecutorch.so, its XNNPACK delegate and CPU kernels; find_package(executorch)).
// The program names forward's inputs and outputs itself (its constant methods input_names and
// output_names); files are matched to them by name. A static cache lives inside the program
// (methods get_cache / set_cache beside forward): a case folder then also holds past_key.npy and
// past_value.npy, set into the program before the call, and gets present_key.npy /
// present_value.npy, the buffers read back after it. --carry: only the first case's buffers are
// set; every later case steps on what the program holds (an app's prefill and steps).
// Exit codes, the .npy format and the command-line forms: see npy.hpp.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <cstdio>
#include <iostream>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "npy.hpp"

namespace {

const char* const kUsage =
    "usage: mha_executorch MODEL.pte CASE_DIR [CASE_DIR ...] [--repeat N] [--carry] [--info]\n"
    "  CASE_DIR   a folder holding NAME.npy for every input the program declares (see --info); every\n"
    "             declared output is written there as NAME.npy. One loaded program runs them all\n"
    "  --repeat N after each case, time N more forward calls alone (median, min)\n"
    "  --carry    a static cache inside the program: set the first case's past_key / past_value only;\n"
    "             later cases step on what the program holds (their past_* files are read, not used)\n"
    "  --info     print the program's methods and declared inputs/outputs\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad input";

namespace et = executorch;
using et::extension::Module;
using et::runtime::EValue;
using ScalarType = et::aten::ScalarType;

std::string error_text(et::runtime::Error e) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%x", static_cast<unsigned>(e));
    return text;
}

template <class T>
T checked(et::runtime::Result<T> result, const std::string& what) {
    if (!result.ok()) throw std::runtime_error(what + " failed with error " + error_text(result.error()));
    return std::move(result.get());
}

std::vector<std::string> split(std::string_view text) {
    std::vector<std::string> names;
    std::stringstream in{std::string(text)};
    for (std::string name; std::getline(in, name, ',');) names.push_back(name);
    return names;
}

// A constant method's string (input_names / output_names), split at commas.
std::vector<std::string> names_of(Module& module, const std::string& method, const std::string& path) {
    auto out = module.execute(method);
    if (!out.ok() || out->size() != 1 || !(*out)[0].isString())
        throw mha::UsageError(path + ": the program has no " + method + " (exported before 0.6: re-export it)");
    return split((*out)[0].toString());
}

mha::Kind kind_of(ScalarType type) {
    return type == ScalarType::Long ? mha::Kind::Int64 : type == ScalarType::Float ? mha::Kind::Float
                                                                                  : mha::Kind::Other;
}

mha::TensorDecl tensor_decl(const std::string& name, const et::runtime::TensorInfo& info, bool bounded) {
    mha::TensorDecl t;
    t.name = name;
    t.kind = kind_of(info.scalar_type());
    t.type_text = mha::kind_name(t.kind);
    t.known_rank = true;
    for (int32_t size : info.sizes()) {  // a bounded axis: any size up to this one
        t.dims.push_back(bounded ? -1 : size);
        t.symbols.push_back("");
    }
    return t;
}

mha::TensorDecl output_decl(const std::string& name) {
    mha::TensorDecl t;
    t.name = name;
    t.kind = mha::Kind::Float;
    t.type_text = "float32";
    return t;
}

struct Program {
    std::vector<std::string> forward_inputs, forward_outputs;
    bool cache_inside = false;
    mha::Declaration decl;  // the case folders' files: forward's, and the cache's
};

Program describe(Module& module, const std::string& path) {
    Program p;
    p.forward_inputs = names_of(module, "input_names", path);
    p.forward_outputs = names_of(module, "output_names", path);
    const auto methods = checked(module.method_names(), "reading the program's methods");
    p.cache_inside = methods.count("get_cache") > 0;
    const auto forward = checked(module.method_meta("forward"), "forward's metadata");
    if (forward.num_inputs() != p.forward_inputs.size())
        throw mha::UsageError(path + ": forward takes " + std::to_string(forward.num_inputs()) +
                              " inputs but input_names lists " + std::to_string(p.forward_inputs.size()));
    for (size_t i = 0; i < p.forward_inputs.size(); ++i)
        p.decl.inputs.push_back(tensor_decl(p.forward_inputs[i], checked(forward.input_tensor_meta(i), "input"), true));
    for (const auto& name : p.forward_outputs) p.decl.outputs.push_back(output_decl(name));
    if (p.cache_inside) {
        const auto get = checked(module.method_meta("get_cache"), "get_cache's metadata");
        for (size_t i = 0; i < 2; ++i) {
            mha::TensorDecl t = tensor_decl(i ? "past_value" : "past_key", checked(get.output_tensor_meta(i), "cache"),
                                            true);
            p.decl.inputs.push_back(t);
            p.decl.outputs.push_back(output_decl(i ? "present_value" : "present_key"));
        }
    }
    return p;
}

et::extension::TensorPtr tensor_of(const mha::Array& a) {
    std::vector<et::aten::SizesType> sizes(a.shape.begin(), a.shape.end());
    if (a.kind == mha::Kind::Int64)
        return et::extension::from_blob(const_cast<int64_t*>(a.ints.data()), sizes, ScalarType::Long);
    return et::extension::from_blob(const_cast<float*>(a.data.data()), sizes, ScalarType::Float);
}

mha::Array array_of(const et::aten::Tensor& t) {
    mha::Array a;
    a.shape.assign(t.sizes().begin(), t.sizes().end());
    const float* data = t.const_data_ptr<float>();
    a.data.assign(data, data + t.numel());
    return a;
}

// buffer (B', K, C, H) cut or zero-extended to rows [0, rows) and entries [0, length).
mha::Array fitted(const mha::Array& buffer, int64_t rows, int64_t length) {
    const int64_t heads = buffer.dim(1), entries = buffer.dim(2), width = buffer.dim(3);
    mha::Array out;
    out.shape = {rows, heads, length, width};
    out.data.assign(rows * heads * length * width, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t e = 0; e < std::min(length, entries); ++e)
                std::copy_n(&buffer.data[((r * heads + h) * entries + e) * width], width,
                            &out.data[((r * heads + h) * length + e) * width]);
    return out;
}

std::vector<mha::Array> run_case(Module& module, const Program& p, const mha::Case& c, bool set_cache, int repeat) {
    const size_t n = p.forward_inputs.size();
    std::vector<EValue> args;
    std::vector<et::extension::TensorPtr> keep;  // the tensors the EValues point at
    for (size_t i = 0; i < n; ++i) args.emplace_back(*keep.emplace_back(tensor_of(c.inputs[i])));
    const int64_t rows = c.inputs[0].dim(0);
    if (p.cache_inside && set_cache) {
        const auto capacity = checked(module.method_meta("get_cache"), "get_cache").output_tensor_meta(0)->sizes()[2];
        std::vector<mha::Array> buffers = {fitted(c.inputs[n], rows, capacity), fitted(c.inputs[n + 1], rows, capacity)};
        checked(module.execute("set_cache", {EValue(*tensor_of(buffers[0])), EValue(*tensor_of(buffers[1]))}),
                "set_cache on " + c.label);
    }
    std::vector<mha::Array> outputs;
    for (const EValue& v : checked(module.execute("forward", args), "forward on " + c.label))
        outputs.push_back(array_of(v.toTensor()));
    if (repeat) std::cout << c.label << ": " << mha::time_calls(repeat, [&] { (void)module.execute("forward", args); }) << "\n";
    if (p.cache_inside) {
        const auto cache = checked(module.execute("get_cache"), "get_cache on " + c.label);
        for (size_t i = 0; i < 2; ++i)  // cut to the case's rows and its buffers' length
            outputs.push_back(fitted(array_of(cache[i].toTensor()), rows, c.inputs[n + i].dim(2)));
    }
    return outputs;
}

// Whether the program names ExecuTorch's LLM operators (a program lists its operators by name).
bool names_llm_kernels(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return bytes.find("llama::custom_sdpa") != std::string::npos;
}

int main_executorch(int argc, char** argv) {
    const mha::Args args = mha::parse_args(argc, argv, kUsage, {"--repeat"}, {"--info", "--carry"}, {"--info"});
    mha::require_file(args.model, "model");
    const auto t0 = mha::Clock::now();
    // the methods' planned memory shared: the cache buffers forward writes are the ones
    // get_cache / set_cache reach (each method would otherwise get arenas of its own)
    Module module(args.model, Module::LoadMode::File, nullptr, nullptr, nullptr, /*share_memory_arenas=*/true);
    if (module.load() != et::runtime::Error::Ok)
        throw mha::UsageError("cannot load program " + args.model + " (not an ExecuTorch program?)");
    const Program program = describe(module, args.model);
    // a program of ExecuTorch's LLM kernels (mha-export executorch --kernels llm) names
    // llama:: operators that only executorch's custom_ops library registers (the runtime
    // would log its own lines on loading it: refused before)
    if (names_llm_kernels(args.model))
        throw mha::UsageError(args.model + ": forward uses operators this program does not link (a --kernels llm "
                              "program: ExecuTorch's llama::update_cache / custom_sdpa, in executorch's custom_ops "
                              "library; docs/executorch.md says what to link, or export with --kernels aten)");
    if (args.flag("--carry") && !program.cache_inside)
        throw mha::UsageError("--carry: " + args.model + " holds no cache (export it with --static-cache)");
    const std::string load_time = mha::ms_since(t0);
    const std::vector<mha::Case> cases = mha::read_cases(args, program.decl);
    const int repeat = mha::repeat_count(args);
    std::cout << "ExecuTorch (the wheel's runtime), load " << load_time
              << (program.cache_inside ? ", the cache inside the program" : "") << "\n";
    if (args.flag("--info")) {
        std::cout << "model: " << args.model << "\nmethods:";
        for (const auto& name : checked(module.method_names(), "methods")) std::cout << " " << name;
        std::cout << "\n";
        mha::print_declaration(program.decl);
    }
    bool first = true;
    return mha::run_cases(program.decl, cases, [&](const mha::Case& c) {
        const bool set = first || !args.flag("--carry");
        first = false;
        return run_case(module, program, c, set, repeat);
    });
}

}  // namespace

int main(int argc, char** argv) {
    return mha::guarded_main([&] { return main_executorch(argc, argv); });
}
