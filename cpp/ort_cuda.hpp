// Shared by mha_ort and mha_layers: the CUDA provider appended (never a CPU fallback: exit 3 with
// ONNX Runtime's own cause), and --cuda-graph's sessions, as an app replays a static-cache step
// (mha_export/check/runners/ort_graphs.py does the same from Python): per input shape a session
// whose symbolic dimensions are fixed (AddFreeDimensionOverrideByName: every shape computation
// folds away, no node is left on the CPU) with the CUDA provider's enable_cuda_graph on, its
// inputs and outputs bound ONCE to device buffers from the session's CUDA allocator,
// present_key/present_value to past_key/past_value's own memory (written in place). ONNX Runtime
// (1.31) captures on a shape's 2nd/3rd run and replays the graph from then on; a session it will
// not capture ("This session cannot use the graph capture feature ...") runs without one, said.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_runtime_loader.hpp"
#include "npy.hpp"
#include "ort_session.hpp"

namespace mha {

// ONNX Runtime's log goes here rather than to stderr, so that errors stay one line; the lines
// are searched for the real cause when a provider library fails to load.
struct OrtLog {
    std::vector<std::string> lines;
    bool echo = false;
};

inline void ORT_API_CALL log_sink(void* param, OrtLoggingLevel, const char*, const char*, const char*,
                                  const char* message) {
    auto* log = static_cast<OrtLog*>(param);
    log->lines.emplace_back(message);
    if (log->echo) std::cerr << "[onnxruntime] " << message << std::endl;
}

// "libcublasLt.so.13: cannot open shared object file: ..." out of ORT's load failure line.
inline std::string load_cause(const OrtLog& log, const std::string& exception_text) {
    std::vector<std::string> texts{exception_text};
    texts.insert(texts.end(), log.lines.rbegin(), log.lines.rend());
    for (const auto& text : texts)
        if (auto at = text.find("with error: "); at != std::string::npos) return first_line(text.substr(at + 12));
    return first_line(exception_text);
}

// The CUDA provider's options beyond device 0 and use_tf32=0.
struct CudaExtras {
    bool graph = false;      // enable_cuda_graph = 1
    void* stream = nullptr;  // user_compute_stream: the app's cudaStream_t (the session runs on it)
};

// Appends the requested provider. CUDA that cannot load is DeviceUnavailable (exit 3): these
// programs never run on the CPU when CUDA was asked for.
inline void append_provider(Ort::SessionOptions& options, const std::string& provider, const OrtLog& log,
                            const CudaExtras& extras = {}) {
    if (provider == "cpu") return;  // the CPU provider is always there
    const auto available = Ort::GetAvailableProviders();
    if (std::find(available.begin(), available.end(), "CUDAExecutionProvider") == available.end())
        throw DeviceUnavailable("--provider cuda: this ONNX Runtime library has no CUDAExecutionProvider "
                                "(use the onnxruntime-gpu build)");
    const OrtApi& api = Ort::GetApi();
    OrtCUDAProviderOptionsV2* cuda = nullptr;
    try {
        Ort::ThrowOnError(api.CreateCUDAProviderOptions(&cuda));
        // Strict float32 matmuls (no TF32), so results stay within float32 parity of the CPU.
        const char* keys[] = {"device_id", "use_tf32", "enable_cuda_graph"};
        const char* values[] = {"0", "0", extras.graph ? "1" : "0"};
        Ort::ThrowOnError(api.UpdateCUDAProviderOptions(cuda, keys, values, 3));
        if (extras.stream)  // a pointer-valued option (the string form cannot carry it)
            Ort::ThrowOnError(api.UpdateCUDAProviderOptionsWithValue(cuda, "user_compute_stream", extras.stream));
        options.AppendExecutionProvider_CUDA_V2(*cuda);
        api.ReleaseCUDAProviderOptions(cuda);
    } catch (const Ort::Exception& e) {
        if (cuda) api.ReleaseCUDAProviderOptions(cuda);
        throw DeviceUnavailable("--provider cuda: CUDAExecutionProvider could not be loaded (" +
                                load_cause(log, e.what()) + "); not falling back to CPU");
    }
}

// A session that failed to open: the CUDA session's failure is DeviceUnavailable (exit 3).
[[noreturn]] inline void open_failed(const std::string& provider, const std::string& path, const std::string& what) {
    if (provider == "cuda" && (what.find("CUDA") != std::string::npos || what.find("cuda") != std::string::npos))
        throw DeviceUnavailable("--provider cuda: the CUDA session could not start (" + first_line(what) +
                                "); not falling back to CPU");
    throw UsageError("cannot load model " + path + ": " + first_line(what));
}

// ---- --cuda-graph ------------------------------------------------------------------------------

// The words of ONNX Runtime's refusal to capture a session (1.31), before its reason.
constexpr const char* kCaptureRefused = "This session cannot use the graph capture feature as requested by the user";

using Dims = std::map<std::string, int64_t>;  // symbolic dimension -> its size

// {symbolic dimension of the session's inputs: its size in `shapes`} (batch, seq, max_cache).
inline Dims fixed_dims(Ort::Session& declared, const std::map<std::string, std::vector<int64_t>>& shapes) {
    Dims dims;
    Ort::AllocatorWithDefaultOptions alloc;
    for (size_t i = 0; i < declared.GetInputCount(); ++i) {
        const auto shape = shapes.find(declared.GetInputNameAllocated(i, alloc).get());
        if (shape == shapes.end()) continue;
        const Ort::TypeInfo type = declared.GetInputTypeInfo(i);  // outlives its info
        const auto info = type.GetTensorTypeAndShapeInfo();
        std::vector<const char*> names(info.GetDimensionsCount(), "");
        info.GetSymbolicDimensions(names.data(), names.size());
        for (size_t d = 0; d < names.size() && d < shape->second.size(); ++d)
            if (names[d][0] != '\0') dims[names[d]] = shape->second[d];
    }
    return dims;
}

// "batch=1 seq=5" (the buffer's size, max_cache, left out: every case has its own).
inline std::string dims_label(const Dims& dims) {
    std::string label;
    for (const auto& [name, size] : dims)
        if (name != "max_cache") label += (label.empty() ? "" : " ") + name + "=" + std::to_string(size);
    return label.empty() ? "(no symbolic dimensions)" : label;
}

struct GraphSession {
    std::unique_ptr<Ort::Session> session;
    bool captured = false;
    std::string why;  // ONNX Runtime's reason when it would not capture this shape
    std::string describe(const Dims& dims) const {
        return dims_label(dims) + (captured ? ": replayed as a CUDA graph" : ": without a graph (" + why + ")");
    }
};

// A CUDA session with `dims` fixed and graph capture on; if ONNX Runtime will not capture it,
// the same session without the graph (`why` says why: the caller tells the user, never silently).
inline GraphSession open_graph_session(Ort::Env& env, const std::string& path, const Ort::SessionOptions& base,
                                       const Dims& dims, const OrtLog& log, void* stream, FileEntries& entries,
                                       const FileEntries* known = nullptr) {
    GraphSession s;
    for (const bool graph : {true, false}) {
        Ort::SessionOptions options = base.Clone();
        for (const auto& [name, size] : dims)
            Ort::ThrowOnError(Ort::GetApi().AddFreeDimensionOverrideByName(options, name.c_str(), size));
        append_provider(options, "cuda", log, {graph, stream});
        try {
            s.session = open_session(env, path, options, entries, known);
            s.captured = graph;
            return s;
        } catch (const Ort::Exception& e) {
            const std::string what = e.what();
            const size_t at = what.find(kCaptureRefused);
            if (!graph || at == std::string::npos) open_failed("cuda", path, what);
            s.why = first_line(what.substr(at + std::string(kCaptureRefused).size()));
            while (!s.why.empty() && (s.why.front() == ' ' || s.why.front() == '.')) s.why.erase(0, 1);
            if (s.why.empty()) s.why = "ONNX Runtime would not capture it";
        }
    }
    return s;  // not reached: the second try returns or throws
}

inline size_t element_size(ONNXTensorElementDataType t) {
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return 4;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return 2;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return 1;
        default:
            throw UsageError("--cuda-graph binds float32, float16, int64 and int8 tensors, not type #" +
                             std::to_string(static_cast<int>(t)));
    }
}

// An .npy array as the bytes of a tensor of type t (float16 narrowed, rounding to nearest).
inline std::vector<uint8_t> host_bytes(const Array& a, ONNXTensorElementDataType t) {
    const size_t n = static_cast<size_t>(a.count());
    std::vector<uint8_t> bytes(n * element_size(t));
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: {
            auto* out = reinterpret_cast<Ort::Float16_t*>(bytes.data());
            for (size_t i = 0; i < n; ++i) out[i] = Ort::Float16_t(a.data[i]);
            break;
        }
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: std::copy_n(a.data.data(), n, reinterpret_cast<float*>(bytes.data())); break;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: std::copy_n(a.ints.data(), n, reinterpret_cast<int64_t*>(bytes.data())); break;
        default: std::copy_n(a.codes.data(), n, reinterpret_cast<int8_t*>(bytes.data())); break;
    }
    return bytes;
}

// A tensor's bytes as an .npy array: floats as float32, int8 as codes, int64 as is.
inline Array from_bytes(const std::vector<uint8_t>& bytes, ONNXTensorElementDataType t, const std::vector<int64_t>& shape) {
    Array a;
    a.shape = shape;
    const size_t n = bytes.size() / element_size(t);
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: {
            const auto* p = reinterpret_cast<const Ort::Float16_t*>(bytes.data());
            a.data.resize(n);
            std::transform(p, p + n, a.data.begin(), [](Ort::Float16_t h) { return h.ToFloat(); });
            break;
        }
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
            const auto* p = reinterpret_cast<const float*>(bytes.data());
            a.data.resize(n);
            std::copy_n(p, n, a.data.begin());
            break;
        }
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: {
            const auto* p = reinterpret_cast<const int64_t*>(bytes.data());
            a.kind = Kind::Int64;
            a.ints.resize(n);
            std::copy_n(p, n, a.ints.begin());
            break;
        }
        default: {
            const auto* p = reinterpret_cast<const int8_t*>(bytes.data());
            a.kind = Kind::Int8;
            a.codes.resize(n);
            std::copy_n(p, n, a.codes.begin());
            break;
        }
    }
    return a;
}

// A device buffer to bind: name, element type, shape.
struct BufferSpec {
    std::string name;
    ONNXTensorElementDataType type;
    std::vector<int64_t> shape;
};

// One shape's graph session with every input and output bound once to device memory from the
// session's CUDA allocator; present_key/present_value bound to past_key/past_value's buffers.
// Members in this order: the values are freed through the allocator, which the session owns.
struct BoundGraph {
    GraphSession graph;
    std::unique_ptr<Ort::Allocator> allocator;
    std::map<std::string, Ort::Value> values;  // inputs, and outputs other than present_*
    std::map<std::string, BufferSpec> specs;
    std::unique_ptr<Ort::IoBinding> binding;
    bool on_host = false;  // buffers from a CPU session's allocator (a check of this code on a CPU)

    void load(const std::string& name, const std::vector<uint8_t>& bytes) {
        if (bytes.size() != size_of(name))  // never past the bound buffer's end
            throw std::logic_error(name + ": " + std::to_string(bytes.size()) + " bytes for a buffer of " +
                                   std::to_string(size_of(name)));
        copy(values.at(name).GetTensorMutableRawData(), bytes.data(), bytes.size());
    }
    std::vector<uint8_t> fetch(const std::string& name) {
        std::vector<uint8_t> bytes(size_of(name));
        copy(bytes.data(), values.at(name).GetTensorMutableRawData(), bytes.size());
        return bytes;
    }
    size_t size_of(const std::string& name) const {
        const BufferSpec& spec = specs.at(name);
        return static_cast<size_t>(element_count(spec.shape)) * element_size(spec.type);
    }
    void copy(void* dst, const void* src, size_t bytes) const {
        if (on_host) std::copy_n(static_cast<const uint8_t*>(src), bytes, static_cast<uint8_t*>(dst));
        else CudaRuntime::get().copy(dst, src, bytes);
    }
    void run(const Ort::RunOptions& options) { graph.session->Run(options, *binding); }

};

inline const std::map<std::string, std::string>& in_place_outputs() {
    static const std::map<std::string, std::string> cache{{"present_key", "past_key"}, {"present_value", "past_value"}};
    return cache;
}

// Memory of the app's own that several sessions bind (--generate's one cache, bound by every
// step's session): cudaMalloc'd, or host memory where a test binds on the CPU.
class AppBuffer {
  public:
    AppBuffer(size_t bytes, bool on_host) : on_host_(on_host), host_(on_host ? bytes : 0) {
        data_ = on_host ? static_cast<void*>(host_.data()) : CudaRuntime::get().allocate(bytes);
    }
    ~AppBuffer() {
        if (!on_host_) CudaRuntime::get().release(data_);
    }
    AppBuffer(const AppBuffer&) = delete;
    AppBuffer& operator=(const AppBuffer&) = delete;
    void* data() const { return data_; }
    // A tensor over this memory (not a copy; the buffer must outlive it).
    Ort::Value tensor(const BufferSpec& spec) const {
        const size_t bytes = static_cast<size_t>(element_count(spec.shape)) * element_size(spec.type);
        const Ort::MemoryInfo where = on_host_ ? Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault)
                                               : Ort::MemoryInfo("Cuda", OrtDeviceAllocator, 0, OrtMemTypeDefault);
        return Ort::Value::CreateTensor(where, data_, bytes, spec.shape.data(), spec.shape.size(), spec.type);
    }

  private:
    bool on_host_;
    std::vector<uint8_t> host_;
    void* data_ = nullptr;
};

using SharedValues = std::map<std::string, const Ort::Value*>;

// `on_host`: the buffers from a CPU session's allocator instead of the CUDA one (checks this
// binding on a machine without CUDA; the programs always bind on the device). `shared`: inputs
// bound to the caller's values (kept alive by the caller) instead of buffers of their own.
inline std::unique_ptr<BoundGraph> bind_graph(GraphSession graph, const std::vector<BufferSpec>& inputs,
                                              const std::vector<BufferSpec>& outputs, bool on_host = false,
                                              const SharedValues& shared = {}) {
    auto bound = std::make_unique<BoundGraph>();
    bound->graph = std::move(graph);
    bound->on_host = on_host;
    Ort::Session& session = *bound->graph.session;
    const Ort::MemoryInfo where = on_host ? Ort::MemoryInfo("Cpu", OrtDeviceAllocator, 0, OrtMemTypeDefault)
                                          : Ort::MemoryInfo("Cuda", OrtDeviceAllocator, 0, OrtMemTypeDefault);
    bound->allocator = std::make_unique<Ort::Allocator>(session, where);
    bound->binding = std::make_unique<Ort::IoBinding>(session);
    for (const auto& spec : inputs) {
        if (shared.count(spec.name)) {
            bound->binding->BindInput(spec.name.c_str(), *shared.at(spec.name));
            continue;
        }
        element_size(spec.type);  // a type this binds, or UsageError
        bound->specs[spec.name] = spec;
        bound->values.emplace(spec.name, Ort::Value::CreateTensor(*bound->allocator, spec.shape.data(),
                                                                  spec.shape.size(), spec.type));
        bound->binding->BindInput(spec.name.c_str(), bound->values.at(spec.name));
    }
    for (const auto& spec : outputs) {
        const auto past = in_place_outputs().find(spec.name);
        if (past != in_place_outputs().end()) {
            const auto outside = shared.find(past->second);
            bound->binding->BindOutput(spec.name.c_str(), outside != shared.end() ? *outside->second
                                                                                  : bound->values.at(past->second));
            continue;
        }
        element_size(spec.type);
        bound->specs[spec.name] = spec;
        bound->values.emplace(spec.name, Ort::Value::CreateTensor(*bound->allocator, spec.shape.data(),
                                                                  spec.shape.size(), spec.type));
        bound->binding->BindOutput(spec.name.c_str(), bound->values.at(spec.name));
    }
    return bound;
}

}  // namespace mha
