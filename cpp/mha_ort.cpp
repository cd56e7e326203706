// mha_ort: run an mha-export ONNX model (x [batch, seq, d_in] -> y [batch, seq, dim]) with the
// ONNX Runtime C++ API. One session runs every IN/OUT pair, so one process exercises the model's
// dynamic axes at several shapes. Exit codes and the .npy format: see npy.hpp.
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "npy.hpp"

namespace {

const char* const kUsage =
    "usage: mha_ort MODEL.onnx IN.npy OUT.npy [IN2.npy OUT2.npy ...] [--provider cpu|cuda] "
    "[--threads N] [--info] [--verbose]\n"
    "  --provider cpu|cuda  execution provider (default cpu); cuda never falls back to the CPU:\n"
    "                       if the CUDA provider cannot start, exit 3 with the reason\n"
    "  --threads N          intra-op threads (default: ONNX Runtime's, one per physical core)\n"
    "  --info               print the model's inputs/outputs (symbolic dims) and its metadata\n"
    "  --verbose            echo ONNX Runtime's log (warnings and errors) to stderr\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad input, 3 requested provider unavailable";

using mha::Clock;
using mha::ms_since;

// ONNX Runtime's log goes here rather than to stderr, so that errors stay one line; the lines
// are searched for the real cause when a provider library fails to load.
struct OrtLog {
    std::vector<std::string> lines;
    bool echo = false;
};

void ORT_API_CALL log_sink(void* param, OrtLoggingLevel, const char*, const char*, const char*,
                           const char* message) {
    auto* log = static_cast<OrtLog*>(param);
    log->lines.emplace_back(message);
    if (log->echo) std::cerr << "[onnxruntime] " << message << std::endl;
}

// "libcublasLt.so.13: cannot open shared object file: ..." out of ORT's load failure line.
std::string load_cause(const OrtLog& log, const std::string& exception_text) {
    std::vector<std::string> texts{exception_text};
    texts.insert(texts.end(), log.lines.rbegin(), log.lines.rend());
    for (const auto& text : texts)
        if (auto at = text.find("with error: "); at != std::string::npos) return mha::first_line(text.substr(at + 12));
    return mha::first_line(exception_text);
}

// Appends the requested provider. CUDA that cannot load is DeviceUnavailable (exit 3): this
// program never runs on the CPU when CUDA was asked for.
void append_provider(Ort::SessionOptions& options, const std::string& provider, const OrtLog& log) {
    if (provider == "cpu") return;  // the CPU provider is always there
    const auto available = Ort::GetAvailableProviders();
    if (std::find(available.begin(), available.end(), "CUDAExecutionProvider") == available.end())
        throw mha::DeviceUnavailable("--provider cuda: this ONNX Runtime library has no CUDAExecutionProvider "
                                     "(use the onnxruntime-gpu build)");
    const OrtApi& api = Ort::GetApi();
    OrtCUDAProviderOptionsV2* cuda = nullptr;
    try {
        Ort::ThrowOnError(api.CreateCUDAProviderOptions(&cuda));
        // Strict float32 matmuls (no TF32), so results stay within float32 parity of the CPU.
        const char* keys[] = {"device_id", "use_tf32"};
        const char* values[] = {"0", "0"};
        Ort::ThrowOnError(api.UpdateCUDAProviderOptions(cuda, keys, values, 2));
        options.AppendExecutionProvider_CUDA_V2(*cuda);
        api.ReleaseCUDAProviderOptions(cuda);
    } catch (const Ort::Exception& e) {
        if (cuda) api.ReleaseCUDAProviderOptions(cuda);
        throw mha::DeviceUnavailable("--provider cuda: CUDAExecutionProvider could not be loaded (" +
                                     load_cause(log, e.what()) + "); not falling back to CPU");
    }
}

std::string type_name(ONNXTensorElementDataType t) {
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
        default: return "type#" + std::to_string(static_cast<int>(t));
    }
}

// "[batch, seq, 64]": symbolic names where the dimension is dynamic.
std::string dims_text(const Ort::ConstTensorTypeAndShapeInfo& info) {
    const auto shape = info.GetShape();
    std::vector<const char*> names(shape.size(), "");
    info.GetSymbolicDimensions(names.data(), names.size());
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        s += i ? ", " : "";
        s += shape[i] >= 0 ? std::to_string(shape[i]) : (*names[i] ? names[i] : "?");
    }
    return s + "]";
}

void print_info(const std::string& path, Ort::Session& session) {
    Ort::AllocatorWithDefaultOptions alloc;
    std::cout << "model: " << path << "\n";
    auto print_io = [&](const char* title, size_t count, auto name_of, auto type_of) {
        std::cout << title << ":\n";
        for (size_t i = 0; i < count; ++i) {
            auto type_info = type_of(i);
            auto info = type_info.GetTensorTypeAndShapeInfo();
            std::cout << "  " << name_of(i).get() << ": " << type_name(info.GetElementType()) << " "
                      << dims_text(info) << "\n";
        }
    };
    print_io("inputs", session.GetInputCount(),
             [&](size_t i) { return session.GetInputNameAllocated(i, alloc); },
             [&](size_t i) { return session.GetInputTypeInfo(i); });
    print_io("outputs", session.GetOutputCount(),
             [&](size_t i) { return session.GetOutputNameAllocated(i, alloc); },
             [&](size_t i) { return session.GetOutputTypeInfo(i); });
    Ort::ModelMetadata meta = session.GetModelMetadata();
    std::vector<std::string> keys;
    for (const auto& k : meta.GetCustomMetadataMapKeysAllocated(alloc)) keys.emplace_back(k.get());
    std::sort(keys.begin(), keys.end());
    std::cout << "metadata:" << (keys.empty() ? " (none)" : "") << "\n";
    for (const auto& k : keys)
        std::cout << "  " << k << ": " << meta.LookupCustomMetadataMapAllocated(k.c_str(), alloc).get() << "\n";
}

// The model's one input and first output, as this program feeds and reads them.
struct ModelIO {
    std::string input, output;
    ONNXTensorElementDataType input_type, output_type;
    int64_t width;  // input's last dimension; -1 when symbolic
};

ModelIO model_io(Ort::Session& session, const std::string& path) {
    Ort::AllocatorWithDefaultOptions alloc;
    if (session.GetInputCount() != 1 || session.GetOutputCount() < 1)
        throw mha::UsageError(path + ": expected one input and at least one output (an mha-export model)");
    const Ort::TypeInfo in_type = session.GetInputTypeInfo(0), out_type = session.GetOutputTypeInfo(0);
    const auto in = in_type.GetTensorTypeAndShapeInfo(), out = out_type.GetTensorTypeAndShapeInfo();
    if (in.GetShape().size() != 3)
        throw mha::UsageError(path + ": input is not [batch, seq, d_in] (not an mha-export model)");
    for (auto t : {in.GetElementType(), out.GetElementType()})
        if (t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16)
            throw mha::UsageError(path + ": " + type_name(t) + " tensors are not supported (float32/float16)");
    return {session.GetInputNameAllocated(0, alloc).get(), session.GetOutputNameAllocated(0, alloc).get(),
            in.GetElementType(), out.GetElementType(), in.GetShape()[2]};
}

// One forward pass. float16 models get their input converted from float32 and their output back.
mha::Array run(Ort::Session& session, const ModelIO& io, mha::Array& x) {
    const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    std::vector<Ort::Float16_t> x16;
    Ort::Value input{nullptr};
    if (io.input_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
        x16.reserve(x.data.size());
        for (float v : x.data) x16.emplace_back(v);  // Float16_t(float) rounds to nearest
        input = Ort::Value::CreateTensor<Ort::Float16_t>(cpu, x16.data(), x16.size(), x.shape.data(), x.shape.size());
    } else {
        input = Ort::Value::CreateTensor<float>(cpu, x.data.data(), x.data.size(), x.shape.data(), x.shape.size());
    }
    const char* in_names[] = {io.input.c_str()};
    const char* out_names[] = {io.output.c_str()};
    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_names, &input, 1, out_names, 1);

    auto info = outputs[0].GetTensorTypeAndShapeInfo();
    mha::Array y;
    y.shape = info.GetShape();
    const size_t n = info.GetElementCount();
    if (io.output_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
        const auto* p = outputs[0].GetTensorData<Ort::Float16_t>();
        y.data.resize(n);
        std::transform(p, p + n, y.data.begin(), [](Ort::Float16_t h) { return h.ToFloat(); });
    } else {
        const float* p = outputs[0].GetTensorData<float>();
        y.data.assign(p, p + n);
    }
    return y;
}

int main_ort(int argc, char** argv) {
    const mha::Args args = mha::parse_args(argc, argv, kUsage, {"--provider", "--threads"},
                                           {"--info", "--verbose"}, {"--info"});
    const std::string provider = args.option("--provider", "cpu");
    if (provider != "cpu" && provider != "cuda")
        throw mha::UsageError("--provider must be cpu or cuda, got '" + provider + "'");
    const int threads = args.options.count("--threads") ? mha::parse_positive_int("--threads", args.option("--threads", "")) : 0;

    // Every input is read and checked before anything runs: bad input leaves no output behind.
    mha::require_file(args.model, "model");
    std::vector<mha::Array> inputs;
    for (const auto& [in, out] : args.pairs) inputs.push_back(mha::read_npy(in));

    OrtLog log;
    log.echo = args.flag("--verbose");
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "mha_ort", log_sink, &log);
    Ort::SessionOptions options;
    options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
    if (threads) options.SetIntraOpNumThreads(threads);
    options.SetInterOpNumThreads(1);
    append_provider(options, provider, log);

    const auto t0 = Clock::now();
    std::unique_ptr<Ort::Session> session;
    try {
        session = std::make_unique<Ort::Session>(env, args.model.c_str(), options);
    } catch (const Ort::Exception& e) {
        const std::string what = e.what();
        if (provider == "cuda" && (what.find("CUDA") != std::string::npos || what.find("cuda") != std::string::npos))
            throw mha::DeviceUnavailable("--provider cuda: the CUDA session could not start (" + mha::first_line(what) +
                                         "); not falling back to CPU");
        throw mha::UsageError("cannot load model " + args.model + ": " + mha::first_line(what));
    }
    const std::string session_time = ms_since(t0);
    // The provider reported is the one appended above: session creation throws if it cannot start.
    std::cout << "onnxruntime " << Ort::GetVersionString() << ", provider: "
              << (provider == "cuda" ? "CUDAExecutionProvider (nodes it lacks run on CPUExecutionProvider)"
                                     : "CPUExecutionProvider")
              << ", intra-op threads: " << (threads ? std::to_string(threads) : "default") << ", session "
              << session_time << "\n";

    if (args.flag("--info")) print_info(args.model, *session);

    const ModelIO io = model_io(*session, args.model);
    mha::check_widths(args.pairs, inputs, io.width);
    return mha::run_pairs(args.pairs, inputs,
                          [&](mha::Array& x, const std::string&) { return run(*session, io, x); });
}

}  // namespace

int main(int argc, char** argv) {
    return mha::guarded_main([&] { return main_ort(argc, argv); });
}
