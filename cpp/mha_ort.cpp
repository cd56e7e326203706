// mha_ort: run an mha-export ONNX model with the ONNX Runtime C++ API. The inputs and outputs are
// the ones the model declares (full: x -> y; masked: x, attention_mask -> y; kv-cache: x,
// attention_mask, past_key, past_value -> y, present_key, present_value), always fed and fetched
// by name. One session runs every case, so one process exercises the model's dynamic axes at
// several shapes. Exit codes, the .npy format and the two command-line forms: see npy.hpp.
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "npy.hpp"
#include "ort_cuda.hpp"
#include "ort_session.hpp"

namespace {

const char* const kUsage =
    "usage: mha_ort MODEL.onnx CASE_DIR [CASE_DIR ...] [--provider cpu|cuda] [--cuda-graph] [--threads N] [--info]\n"
    "               [--verbose]\n"
    "       mha_ort MODEL.onnx IN.npy OUT.npy [IN2.npy OUT2.npy ...] [options]   (one-input, one-output models)\n"
    "  CASE_DIR             a folder holding NAME.npy for every input the model declares (see --info);\n"
    "                       every declared output is written there as NAME.npy. One session runs them all\n"
    "  --provider cpu|cuda  execution provider (default cpu); cuda never falls back to the CPU:\n"
    "                       if the CUDA provider cannot start, exit 3 with the reason\n"
    "  --threads N          intra-op threads (default: ONNX Runtime's, one per physical core); they sleep\n"
    "                       after each run (session.intra_op.allow_spinning = 0): an app that runs one\n"
    "                       session per layer in turn, beside other work, wants that (docs/cpp.md)\n"
    "  --spin               ONNX Runtime's default instead: threads spin after a run\n"
    "  --info               print the model's inputs/outputs (name, dtype, symbolic dims) and its metadata\n"
    "  --verbose            echo ONNX Runtime's log (warnings and errors) to stderr\n"
    "  --generate 5,1,1     a static-cache model (x, past_key, past_value, past_lengths[, position_ids]):\n"
    "                       CASE_DIR holds x.npy [B, L, d_in] and the buffers past_key.npy / past_value.npy\n"
    "                       [B, K, capacity, H]; calls of 5, 1, 1 tokens (summing to L) run with ONE buffer\n"
    "                       bound as past and present (Ort::IoBinding: written in place, never copied),\n"
    "                       past_lengths and position_ids advanced by each call; writes y.npy [B, L, dim]\n"
    "                       and the buffers after the last call (present_key.npy, present_value.npy).\n"
    "                       An int8-cache model (--kv-cache-dtype int8) takes int8 buffers ('|i1' .npy:\n"
    "                       codes, value = code * the model's scale) and writes its int8 codes back\n"
    "  --cuda-graph         with --provider cuda, a static-cache model: each case's shape gets its own\n"
    "                       session (symbolic dims fixed, enable_cuda_graph=1), every input and output bound\n"
    "                       once on the device (present_* = past_*'s buffers); the case's inputs are copied\n"
    "                       in, run 3 times (ONNX Runtime captures), copied in again and replayed once;\n"
    "                       the outputs are those of the replay. A shape ONNX Runtime will not capture runs\n"
    "                       without a graph, said on stderr. With --generate: one device cache of the\n"
    "                       program's bound by each step shape's session, a shape's later calls replayed\n"
    "float inputs: float32 or float16 .npy (converted to the model's float type); float outputs are\n"
    "written as float32; int64 inputs (attention_mask) must be int64 .npy\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad input, 3 requested provider unavailable";

using mha::Clock;
using mha::ms_since;

using mha::append_provider;
using mha::OrtLog;

std::string type_name(ONNXTensorElementDataType t) {
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
        default: return "type#" + std::to_string(static_cast<int>(t));
    }
}

mha::Kind kind_of(ONNXTensorElementDataType t) {
    switch (t) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return mha::Kind::Float;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return mha::Kind::Int64;
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return mha::Kind::Int8;
        default: return mha::Kind::Other;
    }
}

// One declared input or output as the session reports it: name, element type, dims (-1 and a
// symbolic name where dynamic).
struct OrtTensor {
    mha::TensorDecl decl;
    ONNXTensorElementDataType type;
};

OrtTensor describe(const std::string& name, const Ort::TypeInfo& type_info) {
    OrtTensor t;
    t.decl.name = name;
    if (type_info.GetONNXType() != ONNX_TYPE_TENSOR) {
        t.type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        t.decl.kind = mha::Kind::Other;
        t.decl.type_text = "non-tensor";
        return t;
    }
    const auto info = type_info.GetTensorTypeAndShapeInfo();
    t.type = info.GetElementType();
    t.decl.kind = kind_of(t.type);
    t.decl.type_text = type_name(t.type);
    t.decl.known_rank = true;
    t.decl.dims = info.GetShape();
    std::vector<const char*> names(t.decl.dims.size(), "");
    info.GetSymbolicDimensions(names.data(), names.size());
    for (size_t i = 0; i < names.size(); ++i) t.decl.symbols.emplace_back(t.decl.dims[i] >= 0 ? "" : names[i]);
    return t;
}

struct ModelIO {
    std::vector<OrtTensor> inputs, outputs;
    mha::Declaration decl;
};

ModelIO model_io(Ort::Session& session) {
    Ort::AllocatorWithDefaultOptions alloc;
    ModelIO io;
    for (size_t i = 0; i < session.GetInputCount(); ++i)
        io.inputs.push_back(describe(session.GetInputNameAllocated(i, alloc).get(), session.GetInputTypeInfo(i)));
    for (size_t i = 0; i < session.GetOutputCount(); ++i)
        io.outputs.push_back(describe(session.GetOutputNameAllocated(i, alloc).get(), session.GetOutputTypeInfo(i)));
    for (const auto& t : io.inputs) io.decl.inputs.push_back(t.decl);
    for (const auto& t : io.outputs) io.decl.outputs.push_back(t.decl);
    return io;
}

// Only float32/float16/int64 tensors go through .npy here, and int8 ones (a static cache's
// codes) under --generate; anything else is refused up front.
void require_supported(const ModelIO& io, const std::string& path, bool generating) {
    for (const auto* list : {&io.inputs, &io.outputs})
        for (const auto& t : *list)
            if (t.decl.kind == mha::Kind::Other || (t.decl.kind == mha::Kind::Int8 && !generating))
                throw mha::UsageError(path + ": " + std::string(list == &io.inputs ? "input" : "output") + " '" +
                                      t.decl.name + "' is " + t.decl.type_text +
                                      ": only float32, float16 and int64 tensors are supported" +
                                      (t.decl.kind == mha::Kind::Int8 ? " (an int8 cache runs with --generate)" : ""));
}

void print_info(const std::string& path, Ort::Session& session, const ModelIO& io) {
    Ort::AllocatorWithDefaultOptions alloc;
    std::cout << "model: " << path << "\n";
    mha::print_declaration(io.decl);
    Ort::ModelMetadata meta = session.GetModelMetadata();
    std::vector<std::string> keys;
    for (const auto& k : meta.GetCustomMetadataMapKeysAllocated(alloc)) keys.emplace_back(k.get());
    std::sort(keys.begin(), keys.end());
    std::cout << "metadata:" << (keys.empty() ? " (none)" : "") << "\n";
    for (const auto& k : keys)
        std::cout << "  " << k << ": " << meta.LookupCustomMetadataMapAllocated(k.c_str(), alloc).get() << "\n";
}

// One forward pass: every declared input fed by name, every declared output fetched by name.
// float16 inputs are narrowed from the float32 arrays; float16 outputs widened back to float32.
std::vector<mha::Array> run(Ort::Session& session, const ModelIO& io, const mha::Case& c) {
    const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    std::vector<std::vector<Ort::Float16_t>> halves(io.inputs.size());
    std::vector<Ort::Value> inputs;
    std::vector<const char*> in_names, out_names;
    for (size_t i = 0; i < io.inputs.size(); ++i) {
        // The arrays stay owned by the case; ORT only reads them.
        auto& a = const_cast<mha::Array&>(c.inputs[i]);
        in_names.push_back(io.inputs[i].decl.name.c_str());
        const size_t n = static_cast<size_t>(a.count());
        if (io.inputs[i].type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
            inputs.push_back(Ort::Value::CreateTensor<int64_t>(cpu, a.ints.data(), n, a.shape.data(), a.shape.size()));
        } else if (io.inputs[i].type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
            halves[i].reserve(std::max<size_t>(n, 1));
            for (float v : a.data) halves[i].emplace_back(v);  // Float16_t(float) rounds to nearest
            inputs.push_back(
                Ort::Value::CreateTensor<Ort::Float16_t>(cpu, halves[i].data(), n, a.shape.data(), a.shape.size()));
        } else {
            inputs.push_back(Ort::Value::CreateTensor<float>(cpu, a.data.data(), n, a.shape.data(), a.shape.size()));
        }
    }
    for (const auto& t : io.outputs) out_names.push_back(t.decl.name.c_str());
    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_names.data(), inputs.data(), inputs.size(),
                               out_names.data(), out_names.size());

    std::vector<mha::Array> result;
    for (size_t i = 0; i < outputs.size(); ++i) {
        auto info = outputs[i].GetTensorTypeAndShapeInfo();
        mha::Array y;
        y.shape = info.GetShape();
        const size_t n = info.GetElementCount();
        switch (info.GetElementType()) {
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: {
                const auto* p = outputs[i].GetTensorData<Ort::Float16_t>();
                y.data.resize(n);
                std::transform(p, p + n, y.data.begin(), [](Ort::Float16_t h) { return h.ToFloat(); });
                break;
            }
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
                const float* p = outputs[i].GetTensorData<float>();
                y.data.assign(p, p + n);
                break;
            }
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: {
                const int64_t* p = outputs[i].GetTensorData<int64_t>();
                y.kind = mha::Kind::Int64;
                y.ints.assign(p, p + n);
                break;
            }
            default:
                throw std::runtime_error("output '" + io.outputs[i].decl.name + "' has unsupported type " +
                                         type_name(info.GetElementType()));
        }
        result.push_back(std::move(y));
    }
    return result;
}

// ---- --generate: a decode loop over one app-owned static cache -----------------------------------

std::vector<int64_t> parse_steps(const std::string& text) {
    std::vector<int64_t> steps;
    size_t at = 0;
    while (at <= text.size()) {
        const size_t comma = std::min(text.find(',', at), text.size());
        steps.push_back(mha::parse_positive_int("--generate", text.substr(at, comma - at)));
        at = comma + 1;
    }
    return steps;
}

size_t input_index(const ModelIO& io, const std::string& name) {
    for (size_t i = 0; i < io.inputs.size(); ++i)
        if (io.inputs[i].decl.name == name) return i;
    throw mha::UsageError("--generate needs a static-cache model (inputs x, past_key, past_value, "
                          "past_lengths): this model has no input '" + name + "'");
}

// A cache buffer's elements: float32 values, or an int8 cache's codes.
template <class T>
std::vector<T>& elements(mha::Array& a);
template <>
std::vector<float>& elements<float>(mha::Array& a) { return a.data; }
template <>
std::vector<int8_t>& elements<int8_t>(mha::Array& a) { return a.codes; }

// --generate runs float32 models whose cache is float32 or int8 (codes): x and y float32,
// past_key, past_value, present_key and present_value all of one of those two types. Returns it.
ONNXTensorElementDataType generate_cache_type(const ModelIO& io) {
    const ONNXTensorElementDataType cache = io.inputs[input_index(io, "past_key")].type;
    input_index(io, "past_lengths");
    const bool cache_ok = cache == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || cache == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    const std::set<std::string> buffers{"past_key", "past_value", "present_key", "present_value"};
    for (const auto* list : {&io.inputs, &io.outputs})
        for (const auto& t : *list) {
            const bool buffer = buffers.count(t.decl.name) > 0;
            const bool ok = buffer ? cache_ok && t.type == cache
                                   : t.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || t.decl.kind == mha::Kind::Int64;
            if (!ok)
                throw mha::UsageError("--generate runs float32 models with a float32 or int8 cache; " +
                                      std::string(list == &io.inputs ? "input" : "output") + " '" + t.decl.name +
                                      "' is " + t.decl.type_text +
                                      (buffer && cache_ok ? ", past_key " + type_name(cache) : ""));
        }
    return cache;
}

// --generate's calls must cover the case's x exactly.
void check_steps(const mha::Case& c, const std::vector<int64_t>& steps, int64_t length) {
    int64_t total = 0;
    for (int64_t n : steps) total += n;
    if (total != length)
        throw mha::UsageError(c.label + ": --generate steps sum to " + std::to_string(total) +
                              ", x.npy holds " + std::to_string(length) + " tokens");
}

// The case's x split into calls of `steps` tokens; the case's buffers (elements T: float32, or
// int8 codes) bound as past_* AND present_* of every call, so the model writes them in place (an
// output that comes back at another address is a copy: an error). Returns y [B, L, dim] and the
// buffers, in output order.
template <class T>
std::vector<mha::Array> generate(Ort::Session& session, const ModelIO& io, const mha::Case& c,
                                 const std::vector<int64_t>& steps) {
    const mha::Array& x = c.inputs[0];  // the case holds x, past_key, past_value (in this order)
    const int64_t batch = x.dim(0), length = x.dim(1), width = x.dim(2);
    check_steps(c, steps, length);
    mha::Array key = c.inputs[1], value = c.inputs[2];  // the app's buffers, owned here
    std::vector<T>& key_data = elements<T>(key);
    std::vector<T>& value_data = elements<T>(value);
    Ort::Value key_value = mha::cpu_tensor(key_data, key.shape), value_value = mha::cpu_tensor(value_data, value.shape);
    const bool rotary = std::any_of(io.inputs.begin(), io.inputs.end(),
                                    [](const OrtTensor& t) { return t.decl.name == "position_ids"; });
    std::vector<int64_t> lengths(batch, 0);
    std::vector<float> y_all;
    int64_t out_width = 0, start = 0;
    Ort::IoBinding binding(session);
    for (int64_t n : steps) {
        std::vector<float> chunk;  // x[:, start:start + n, :]
        for (int64_t b = 0; b < batch; ++b)
            chunk.insert(chunk.end(), x.data.begin() + (b * length + start) * width,
                         x.data.begin() + (b * length + start + n) * width);
        std::vector<int64_t> past_lengths = lengths, positions;
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t i = 0; i < n; ++i) positions.push_back(lengths[b] + i);
        Ort::Value x_value = mha::cpu_tensor(chunk, {batch, n, width});
        Ort::Value lengths_value = mha::cpu_tensor(past_lengths, {batch});
        Ort::Value positions_value = mha::cpu_tensor(positions, {batch, n});
        binding.ClearBoundInputs();
        binding.ClearBoundOutputs();
        binding.BindInput("x", x_value);
        binding.BindInput("past_key", key_value);
        binding.BindInput("past_value", value_value);
        binding.BindInput("past_lengths", lengths_value);
        if (rotary) binding.BindInput("position_ids", positions_value);
        binding.BindOutput("present_key", key_value);
        binding.BindOutput("present_value", value_value);
        binding.BindOutput("y", Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault));
        session.Run(Ort::RunOptions{nullptr}, binding);
        std::vector<Ort::Value> outs = binding.GetOutputValues();  // in binding order
        if (outs[0].GetTensorData<T>() != key_data.data() || outs[1].GetTensorData<T>() != value_data.data())
            throw std::runtime_error("present_key/present_value came back as a copy: the buffer was not written in place");
        const auto y_shape = outs[2].GetTensorTypeAndShapeInfo().GetShape();
        out_width = y_shape[2];
        if (y_all.empty()) y_all.resize(batch * length * out_width);
        const float* y = outs[2].GetTensorData<float>();
        for (int64_t b = 0; b < batch; ++b)
            std::copy(y + b * n * out_width, y + (b + 1) * n * out_width,
                      y_all.begin() + (b * length + start) * out_width);
        for (auto& l : lengths) l += n;
        start += n;
    }
    mha::Array y;
    y.shape = {batch, length, out_width};
    y.data = std::move(y_all);
    return {y, key, value};
}

// ---- --cuda-graph: the static step replayed as a CUDA graph, as an app replays it -------------

constexpr int kCaptureRuns = 3;  // ONNX Runtime (1.31) runs a shape twice before it captures

bool declares(const std::vector<OrtTensor>& list, const std::string& name) {
    return std::any_of(list.begin(), list.end(), [&](const OrtTensor& t) { return t.decl.name == name; });
}

// --cuda-graph replays the static-cache step only: x, past_key, past_value, past_lengths[,
// position_ids] -> y, present_key, present_value (the shapes and addresses a graph fixes).
void require_static_step(const ModelIO& io, const std::string& path) {
    const std::string why = "--cuda-graph replays fixed shapes and addresses: only the static-cache step "
                            "(mha-export onnx --static-cache) has them; " + path;
    for (const char* name : {"x", "past_key", "past_value", "past_lengths"})
        if (!declares(io.inputs, name)) throw mha::UsageError(why + " has no input '" + name + "'");
    for (const char* name : {"y", "present_key", "present_value"})
        if (!declares(io.outputs, name)) throw mha::UsageError(why + " has no output '" + name + "'");
    for (const auto& t : io.outputs)
        if (t.decl.name != "y" && !mha::in_place_outputs().count(t.decl.name))
            throw mha::UsageError(why + " also gives '" + t.decl.name + "', which --cuda-graph does not bind");
    for (const auto& t : io.outputs)
        if (t.decl.name == "y" && t.decl.dims.size() != 3) throw mha::UsageError(path + ": y is not [B, T, D]");
}

// Per input shape a bound, captured session (mha_export/check/runners/ort_graphs.py's
// GraphReplays): a new shape's runs repeat the same writes into the cache (idempotent), then the
// case's inputs are copied in again and the call whose outputs are written is a replay.
struct GraphReplays {
    using Shapes = std::map<std::string, std::vector<int64_t>>;  // input name -> its shape

    Ort::Env& env;
    const std::string& path;
    const Ort::SessionOptions& base;  // threads, optimization level; no provider yet
    const OrtLog& log;
    const mha::FileEntries& known;    // the file's config entries (read once)
    Ort::Session& declared;           // names the symbolic dimensions
    const ModelIO& io;
    std::map<std::vector<std::vector<int64_t>>, std::unique_ptr<mha::BoundGraph>> calls;
    // tests/cpp/graph_replays_on_cpu.cpp: a CPU session per shape and buffers on the host (this
    // code checked without CUDA); the program: open_graph_session and device buffers
    std::function<mha::GraphSession(const mha::Dims&)> open_session = nullptr;
    bool on_host = false;

    // A call's shape: the buffers to bind (y [B, T, D]; present_* are past_*'s) and the symbolic
    // dimensions it fixes.
    struct Plan {
        std::vector<mha::BufferSpec> inputs, outputs;
        mha::Dims dims;
    };

    Plan plan(const Shapes& shapes) const {
        Plan p;
        for (const auto& t : io.inputs) p.inputs.push_back({t.decl.name, t.type, shapes.at(t.decl.name)});
        for (const auto& t : io.outputs) {
            std::vector<int64_t> shape;
            if (t.decl.name == "y") {
                const auto& x = shapes.at("x");
                if (t.decl.dims[2] <= 0) throw mha::UsageError(path + ": y's last dimension is not fixed");
                shape = {x[0], x[1], t.decl.dims[2]};
            }
            p.outputs.push_back({t.decl.name, t.type, shape});
        }
        p.dims = mha::fixed_dims(declared, shapes);
        return p;
    }

    std::unique_ptr<mha::BoundGraph> open(const Shapes& shapes, const mha::SharedValues& shared = {}) {
        const Plan p = plan(shapes);
        mha::FileEntries entries;
        mha::GraphSession graph = open_session ? open_session(p.dims)
                                               : mha::open_graph_session(env, path, base, p.dims, log, nullptr,
                                                                         entries, &known);
        if (graph.captured)
            std::cout << "cuda graph: " << graph.describe(p.dims) << " (captured on its runs 2-3)\n";
        else
            std::cerr << "mha_ort: warning: " << graph.describe(p.dims) << "\n";
        return mha::bind_graph(std::move(graph), p.inputs, p.outputs, on_host, shared);
    }

    void load(mha::BoundGraph& call, const mha::Case& c) {
        for (size_t i = 0; i < io.inputs.size(); ++i)
            call.load(io.inputs[i].decl.name, mha::host_bytes(c.inputs[i], io.inputs[i].type));
    }

    // One case: its shape's call (opened and captured at the shape's first case), its inputs
    // copied in, a replay; the outputs in declared order.
    std::vector<mha::Array> operator()(const mha::Case& c) {
        std::vector<std::vector<int64_t>> key;
        Shapes shapes;
        for (size_t i = 0; i < c.inputs.size(); ++i) {
            key.push_back(c.inputs[i].shape);
            shapes[io.inputs[i].decl.name] = c.inputs[i].shape;
        }
        auto& call = calls[key];
        const bool fresh = !call;
        if (fresh) call = open(shapes);
        load(*call, c);
        if (fresh) {
            for (int i = 0; i < kCaptureRuns; ++i) call->run(Ort::RunOptions{nullptr});
            load(*call, c);  // the original past buffers again: the captures wrote the cache
        }
        call->run(Ort::RunOptions{nullptr});  // a replay
        std::vector<mha::Array> result;
        for (const auto& t : io.outputs) {
            const auto past = mha::in_place_outputs().find(t.decl.name);
            const std::string source = past == mha::in_place_outputs().end() ? t.decl.name : past->second;
            const mha::BufferSpec& spec = call->specs.at(source);
            result.push_back(mha::from_bytes(call->fetch(source), spec.type, spec.shape));
        }
        return result;
    }

    // --generate: the case's x in calls of `steps` tokens over ONE cache of the app's (AppBuffer),
    // bound as past and present by every step shape's session; a shape's first call runs
    // kCaptureRuns + 1 times (the same writes: idempotent), its later calls are replays. Sessions
    // are the case's own (a captured graph holds the cache's address). y and the buffers, in
    // declared output order.
    std::vector<mha::Array> generate(const mha::Case& c, const std::vector<int64_t>& steps) {
        const mha::Array& x = c.inputs[0];  // the case holds x, past_key, past_value (in this order)
        const int64_t batch = x.dim(0), length = x.dim(1), width = x.dim(2);
        check_steps(c, steps, length);
        std::map<std::string, mha::BufferSpec> cache;
        std::vector<std::unique_ptr<mha::AppBuffer>> memory;  // outlives the values and sessions
        std::map<std::string, Ort::Value> values;
        mha::SharedValues shared;
        for (size_t i : {1, 2}) {
            const OrtTensor& t = io.inputs[input_index(io, i == 1 ? "past_key" : "past_value")];
            const mha::BufferSpec spec{t.decl.name, t.type, c.inputs[i].shape};
            const std::vector<uint8_t> bytes = mha::host_bytes(c.inputs[i], t.type);
            memory.push_back(std::make_unique<mha::AppBuffer>(bytes.size(), on_host));
            values.emplace(spec.name, memory.back()->tensor(spec));
            shared[spec.name] = &values.at(spec.name);
            cache[spec.name] = spec;
            copy(memory.back()->data(), bytes.data(), bytes.size());
        }
        const bool rotary = declares(io.inputs, "position_ids");
        std::map<int64_t, std::unique_ptr<mha::BoundGraph>> step_calls;  // the case's own sessions
        std::vector<int64_t> lengths(batch, 0);
        std::vector<float> y_all;
        int64_t out_width = 0, start = 0;
        for (int64_t n : steps) {
            mha::Array chunk, past_lengths, positions;  // x[:, start:start + n, :]
            chunk.shape = std::vector<int64_t>{batch, n, width};
            for (int64_t b = 0; b < batch; ++b)
                chunk.data.insert(chunk.data.end(), x.data.begin() + (b * length + start) * width,
                                  x.data.begin() + (b * length + start + n) * width);
            past_lengths.kind = positions.kind = mha::Kind::Int64;
            past_lengths.shape = std::vector<int64_t>{batch};
            past_lengths.ints = lengths;
            positions.shape = std::vector<int64_t>{batch, n};
            for (int64_t b = 0; b < batch; ++b)
                for (int64_t i = 0; i < n; ++i) positions.ints.push_back(lengths[b] + i);
            auto& call = step_calls[n];
            const bool fresh = !call;
            if (fresh) {
                Shapes shapes{{"x", chunk.shape}, {"past_lengths", {batch}}, {"position_ids", positions.shape}};
                for (const auto& [name, spec] : cache) shapes[name] = spec.shape;
                if (!rotary) shapes.erase("position_ids");
                call = open(shapes, shared);
            }
            const std::map<std::string, const mha::Array*> fresh_inputs{
                {"x", &chunk}, {"past_lengths", &past_lengths}, {"position_ids", &positions}};
            for (const auto& [name, array] : fresh_inputs)
                if (name != "position_ids" || rotary)
                    call->load(name, mha::host_bytes(*array, call->specs.at(name).type));
            for (int i = 0; i < (fresh ? kCaptureRuns + 1 : 1); ++i) call->run(Ort::RunOptions{nullptr});
            const mha::BufferSpec& y_spec = call->specs.at("y");
            const mha::Array y = mha::from_bytes(call->fetch("y"), y_spec.type, y_spec.shape);
            out_width = y_spec.shape[2];
            if (y_all.empty()) y_all.resize(batch * length * out_width);
            for (int64_t b = 0; b < batch; ++b)
                std::copy(y.data.begin() + b * n * out_width, y.data.begin() + (b + 1) * n * out_width,
                          y_all.begin() + (b * length + start) * out_width);
            for (auto& l : lengths) l += n;
            start += n;
        }
        std::vector<mha::Array> result;
        for (const auto& t : io.outputs) {
            if (t.decl.name == "y") {
                mha::Array y;
                y.shape = std::vector<int64_t>{batch, length, out_width};
                y.data = y_all;
                result.push_back(std::move(y));
                continue;
            }
            const mha::BufferSpec& spec = cache.at(mha::in_place_outputs().at(t.decl.name));
            std::vector<uint8_t> bytes(static_cast<size_t>(mha::element_count(spec.shape)) *
                                       mha::element_size(spec.type));
            copy(bytes.data(), values.at(spec.name).GetTensorMutableRawData(), bytes.size());
            result.push_back(mha::from_bytes(bytes, spec.type, spec.shape));
        }
        return result;
    }

    void copy(void* dst, const void* src, size_t bytes) const {
        if (on_host) std::copy_n(static_cast<const uint8_t*>(src), bytes, static_cast<uint8_t*>(dst));
        else mha::CudaRuntime::get().copy(dst, src, bytes);
    }
};

int main_ort(int argc, char** argv) {
    const mha::Args args = mha::parse_args(argc, argv, kUsage, {"--provider", "--threads", "--generate"},
                                           {"--info", "--verbose", "--spin", "--cuda-graph"}, {"--info"});
    const std::string provider = args.option("--provider", "cpu");
    if (provider != "cpu" && provider != "cuda")
        throw mha::UsageError("--provider must be cpu or cuda, got '" + provider + "'");
    const int threads = args.options.count("--threads") ? mha::parse_positive_int("--threads", args.option("--threads", "")) : 0;
    mha::require_file(args.model, "model");
    const bool graph = args.flag("--cuda-graph");
    if (graph && provider != "cuda")
        throw mha::UsageError("--cuda-graph needs --provider cuda: a CUDA graph replays the CUDA provider's "
                              "kernels");

    OrtLog log;
    log.echo = args.flag("--verbose");
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "mha_ort", mha::log_sink, &log);
    Ort::SessionOptions options;
    options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
    if (threads) options.SetIntraOpNumThreads(threads);
    options.SetInterOpNumThreads(1);
    // Sessions run in turn (one per layer) must not leave threads spinning for the next one.
    options.AddConfigEntry("session.intra_op.allow_spinning", args.flag("--spin") ? "1" : "0");
    // --cuda-graph: this session only declares the inputs and outputs (on the CPU, unoptimized);
    // each input shape gets its own CUDA session (GraphReplays)
    Ort::SessionOptions declaring = graph ? options.Clone() : Ort::SessionOptions{nullptr};
    if (graph) declaring.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_DISABLE_ALL);
    else append_provider(options, provider, log);

    const auto t0 = Clock::now();
    std::unique_ptr<Ort::Session> session;
    mha::FileEntries applied;  // the config entries the file needs (float8: folded at load)
    try {
        session = mha::open_session(env, args.model, graph ? declaring : options, applied);
    } catch (const Ort::Exception& e) {
        mha::open_failed(provider, args.model, e.what());
    }
    const std::string session_time = ms_since(t0);
    const ModelIO io = model_io(*session);
    if (graph) {  // refused before CUDA is tried; CUDA must start before any line says it runs
        require_static_step(io, args.model);
        Ort::SessionOptions probe = options.Clone();
        append_provider(probe, provider, log);
        mha::CudaRuntime::get().require_device();  // the provider loaded; is there a device?
    }

    // The provider reported is the one appended above: session creation throws if it cannot start.
    std::cout << "onnxruntime " << Ort::GetVersionString() << ", provider: "
              << (graph ? "CUDAExecutionProvider replaying CUDA graphs (a session per input shape)"
                  : provider == "cuda" ? "CUDAExecutionProvider (nodes it lacks run on CPUExecutionProvider)"
                                       : "CPUExecutionProvider")
              << ", intra-op threads: " << (threads ? std::to_string(threads) : "default")
              << (args.flag("--spin") ? " (spinning)" : " (asleep between runs)") << ", session "
              << session_time;
    for (const auto& [key, value] : applied.entries)
        std::cout << ", " << key << "=" << value << " (" << applied.why << "; opened twice)";
    std::cout << "\n";
    if (args.flag("--info")) print_info(args.model, *session, io);
    if (args.case_dirs.empty() && args.pairs.empty()) return 0;  // --info alone

    // Every input of every case is read and checked before anything runs: bad input leaves no
    // output behind.
    const bool generating = args.options.count("--generate") > 0;
    require_supported(io, args.model, generating || graph);
    if (generating) {
        const std::vector<int64_t> steps = parse_steps(args.option("--generate", ""));
        mha::Declaration given = io.decl;  // past_lengths and position_ids are made per call
        given.inputs.clear();
        for (const char* name : {"x", "past_key", "past_value"}) given.inputs.push_back(io.decl.inputs[input_index(io, name)]);
        if (graph) {  // any float or int8 cache the device buffers hold (require_static_step)
            const std::vector<mha::Case> cases = mha::read_cases(args, given);
            GraphReplays replays{env, args.model, options, log, applied, *session, io, {}};
            return mha::run_cases(given, cases, [&](const mha::Case& c) { return replays.generate(c, steps); });
        }
        const auto generate_case =
            generate_cache_type(io) == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 ? generate<int8_t> : generate<float>;
        const std::vector<mha::Case> cases = mha::read_cases(args, given);
        return mha::run_cases(given, cases, [&](const mha::Case& c) { return generate_case(*session, io, c, steps); });
    }
    const std::vector<mha::Case> cases = mha::read_cases(args, io.decl);
    if (graph) {
        GraphReplays replays{env, args.model, options, log, applied, *session, io, {}};
        return mha::run_cases(io.decl, cases, [&](const mha::Case& c) { return replays(c); });
    }

    return mha::run_cases(io.decl, cases, [&](const mha::Case& c) { return run(*session, io, c); });
}

}  // namespace

int main(int argc, char** argv) {
    return mha::guarded_main([&] { return main_ort(argc, argv); });
}
