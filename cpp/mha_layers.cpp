// mha_layers: several layers' ONNX Runtime sessions in one process, stepped in turn, as an app
// that decodes through a whole model runs them; times a decode step (one token through every
// layer) under each way the sessions can share the CPU's threads. A static-cache model (x,
// past_key, past_value, past_lengths[, position_ids] -> y, present_key, present_value, the
// cache written in place through an IO binding) is loaded --copies times: each session holds its
// own weights, as the layers of a model do, so the step reads them from memory. --cuda-graph: the
// same steps on CUDA, each layer's session replaying its step as a CUDA graph (ort_cuda.hpp),
// timed with CUDA events on the one stream every session runs on.
#include <onnxruntime_cxx_api.h>
#include <onnxruntime_run_options_config_keys.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "npy.hpp"
#include "ort_cuda.hpp"
#include "ort_session.hpp"

namespace {

const char* const kUsage =
    "usage: mha_layers MODEL.onnx [MODEL.onnx ...] [--copies N] [--past P] [--steps S] [--threads T]\n"
    "                  [--pool idle|spin|shared|shared-spin] [--cuda-graph]\n"
    "  MODEL.onnx         a static-cache decode model (mha-export onnx --static-cache), float32 cache\n"
    "  --copies N         sessions per model, each with its own weights (default 4): the layers\n"
    "  --past P           cached tokens before the first timed step (default 1024)\n"
    "  --steps S          timed steps (default 20), after 3 untimed ones; one token each, batch 1\n"
    "  --threads T        intra-op threads (default 2)\n"
    "  --pool             how the sessions share threads (default idle):\n"
    "                       idle         each session its own pool, asleep after a run\n"
    "                                    (session.intra_op.allow_spinning = 0)\n"
    "                       spin         each session its own pool, spinning after a run (ORT's default)\n"
    "                       shared       one pool for every session (CreateEnvWithGlobalThreadPools +\n"
    "                                    DisablePerSessionThreads), spinning off (SetGlobalSpinControl(0))\n"
    "                       shared-spin  the same pool, spinning on\n"
    "  --cuda-graph       on CUDA instead: each session has its shapes fixed (batch 1, one token, the\n"
    "                     cache of P + 3 + S), its buffers bound once on the device, enable_cuda_graph=1,\n"
    "                     and runs on one CUDA stream of this program's (user_compute_stream); after 3\n"
    "                     capture runs and 3 untimed steps, S steps back to back (every layer replayed\n"
    "                     at past P each step; runs not synchronized: disable_synchronize_execution_\n"
    "                     providers, which a replay honours since onnxruntime PR #28686, 1.31; before,\n"
    "                     each replay synced), a CUDA event recorded after each step. Any float/int8 cache type\n"
    "prints: the median ms of a step (every layer once) and of one layer's call\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad input, 3 CUDA unavailable (--cuda-graph)";

constexpr int kWarmup = 3;

struct Layer {
    std::unique_ptr<Ort::Session> session;
    std::vector<float> key, value;  // the app's cache buffers [1, K, capacity, H]
    std::vector<int64_t> cache_shape;
    std::vector<std::string> inputs;
    mha::FileEntries applied;  // config entries the file needs (float8: folded at load)
};

std::vector<int64_t> input_shape(Ort::Session& s, size_t i) {
    return s.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetShape();
}

// {input name: its index} of a static-cache model (x, past_key, past_value, past_lengths[,
// position_ids]), the names in order in `names`; else UsageError.
std::map<std::string, size_t> static_inputs(Ort::Session& session, const std::string& path,
                                            std::vector<std::string>& names) {
    Ort::AllocatorWithDefaultOptions allocator;
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < session.GetInputCount(); ++i) {
        names.push_back(session.GetInputNameAllocated(i, allocator).get());
        index[names.back()] = i;
    }
    for (const char* name : {"x", "past_key", "past_value", "past_lengths"})
        if (!index.count(name))
            throw mha::UsageError(path + ": not a static-cache model (no input " + name +
                                  "; export it with --static-cache)");
    for (const auto& [name, i] : index)
        if (name != "x" && name != "past_key" && name != "past_value" && name != "past_lengths" &&
            name != "position_ids")
            throw mha::UsageError("unexpected input " + name);
    return index;
}

// `known`: the file's entries when an earlier copy read them (no second open then).
Layer open_layer(Ort::Env& env, const std::string& path, const Ort::SessionOptions& options,
                 int64_t capacity, const mha::FileEntries* known) {
    Layer layer;
    try {
        Ort::SessionOptions own = options.Clone();  // the file's entries for this file only
        layer.session = mha::open_session(env, path, own, layer.applied, known);
    } catch (const Ort::Exception& e) {
        throw mha::UsageError("cannot load model " + path + ": " + mha::first_line(e.what()));
    }
    std::map<std::string, size_t> index = static_inputs(*layer.session, path, layer.inputs);
    const auto kv = input_shape(*layer.session, index["past_key"]);  // [B, K, capacity, H]
    if (kv.size() != 4 || kv[1] <= 0 || kv[3] <= 0 ||
        layer.session->GetInputTypeInfo(index["past_key"]).GetTensorTypeAndShapeInfo().GetElementType() !=
            ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
        throw mha::UsageError(path + ": past_key must be float32 [B, K, capacity, H] with K and H fixed");
    layer.cache_shape = {1, kv[1], capacity, kv[3]};
    layer.key.assign(static_cast<size_t>(kv[1] * capacity * kv[3]), 0.0f);
    layer.value = layer.key;
    return layer;
}

int64_t model_width(Ort::Session& s) {
    const auto x = input_shape(s, 0);
    if (x.size() != 3 || x[2] <= 0) throw mha::UsageError("input x must be [B, T, d_in] with d_in fixed");
    return x[2];
}

// One token through one layer at position `past`: x fed, the cache bound as past and present.
void step(Layer& layer, std::vector<float>& x, int64_t width, int64_t past) {
    std::vector<int64_t> lengths{past}, positions{past};
    Ort::IoBinding binding(*layer.session);
    Ort::Value key = mha::cpu_tensor(layer.key, layer.cache_shape), value = mha::cpu_tensor(layer.value, layer.cache_shape);
    Ort::Value x_value = mha::cpu_tensor(x, {1, 1, width});
    Ort::Value lengths_value = mha::cpu_tensor(lengths, {1}), positions_value = mha::cpu_tensor(positions, {1, 1});
    for (const auto& name : layer.inputs) {
        if (name == "x") binding.BindInput("x", x_value);
        else if (name == "past_key") binding.BindInput("past_key", key);
        else if (name == "past_value") binding.BindInput("past_value", value);
        else if (name == "past_lengths") binding.BindInput("past_lengths", lengths_value);
        else if (name == "position_ids") binding.BindInput("position_ids", positions_value);
        else throw mha::UsageError("unexpected input " + name);
    }
    const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    binding.BindOutput("y", cpu);
    binding.BindOutput("present_key", key);
    binding.BindOutput("present_value", value);
    layer.session->Run(Ort::RunOptions{nullptr}, binding);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---- --cuda-graph: every layer's step replayed as a CUDA graph, timed with CUDA events --------

// One model's buffers at batch 1, one token, a cache of `capacity` (types as declared): what each
// of its sessions binds, the symbolic dimensions that fixes, the config entries the file names.
struct GraphPlan {
    std::vector<mha::BufferSpec> inputs, outputs;
    mha::Dims dims;
    mha::FileEntries entries;
};

GraphPlan plan_graph(Ort::Env& env, const std::string& path, const Ort::SessionOptions& options, int64_t capacity) {
    GraphPlan plan;
    Ort::SessionOptions declaring = options.Clone();  // names and shapes only: no optimization
    declaring.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_DISABLE_ALL);
    std::unique_ptr<Ort::Session> session;
    try {
        session = mha::open_session(env, path, declaring, plan.entries);
    } catch (const Ort::Exception& e) {
        throw mha::UsageError("cannot load model " + path + ": " + mha::first_line(e.what()));
    }
    std::vector<std::string> names;
    const std::map<std::string, size_t> index = static_inputs(*session, path, names);
    std::map<std::string, std::vector<int64_t>> shapes{
        {"x", {1, 1, model_width(*session)}}, {"past_lengths", {1}}, {"position_ids", {1, 1}}};
    for (const char* name : {"past_key", "past_value"}) {
        auto shape = input_shape(*session, index.at(name));  // [B, K, capacity, H]
        if (shape.size() != 4 || shape[1] <= 0 || shape[3] <= 0)
            throw mha::UsageError(path + ": " + name + " must be [B, K, capacity, H] with K and H fixed");
        shape[0] = 1;
        shape[2] = capacity;
        shapes[name] = shape;
    }
    for (const auto& name : names)
        plan.inputs.push_back({name, session->GetInputTypeInfo(index.at(name)).GetTensorTypeAndShapeInfo().GetElementType(),
                               shapes.at(name)});
    Ort::AllocatorWithDefaultOptions allocator;
    for (size_t i = 0; i < session->GetOutputCount(); ++i) {
        const std::string name = session->GetOutputNameAllocated(i, allocator).get();
        const Ort::TypeInfo type = session->GetOutputTypeInfo(i);  // outlives its info
        const auto info = type.GetTensorTypeAndShapeInfo();
        const auto declared = info.GetShape();
        if (name == "y" && (declared.size() != 3 || declared[2] <= 0))
            throw mha::UsageError(path + ": y must be [B, T, D] with D fixed");
        if (name != "y" && !mha::in_place_outputs().count(name))
            throw mha::UsageError(path + ": output '" + name + "': --cuda-graph binds y, present_key and present_value");
        plan.outputs.push_back({name, info.GetElementType(),
                                name == "y" ? std::vector<int64_t>{1, 1, declared[2]} : shapes.at(mha::in_place_outputs().at(name))});
    }
    plan.dims = mha::fixed_dims(*session, shapes);
    return plan;
}

// A buffer's first contents: x seeded normal values, a zero cache, position `past`.
std::vector<uint8_t> start_bytes(const mha::BufferSpec& spec, int64_t past) {
    mha::Array a;
    a.shape = spec.shape;
    const size_t n = static_cast<size_t>(mha::element_count(spec.shape));
    if (spec.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
        a.kind = mha::Kind::Int64;
        a.ints.assign(n, past);
    } else if (spec.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8) {
        a.kind = mha::Kind::Int8;
        a.codes.assign(n, 0);
    } else {
        a.data.assign(n, 0.0f);
        std::mt19937 rng(0);
        std::normal_distribution<float> normal;
        if (spec.name == "x") for (auto& v : a.data) v = normal(rng);
    }
    return mha::host_bytes(a, spec.type);
}

struct GraphTiming {
    std::vector<double> step_ms;
    size_t sessions = 0, captured = 0;
};

// Every copy of every model a bound graph session on one stream; 3 capture runs each, kWarmup
// untimed steps, then `steps` steps back to back, a CUDA event recorded after each.
GraphTiming time_graphs(Ort::Env& env, const Ort::SessionOptions& options, const mha::OrtLog& log,
                        const std::vector<std::string>& models, int copies, int64_t past, int steps) {
    const int64_t capacity = past + kWarmup + steps;
    std::vector<GraphPlan> plans;
    for (const auto& m : models) plans.push_back(plan_graph(env, m, options, capacity));
    Ort::SessionOptions probe = options.Clone();  // CUDA starts (else exit 3) before the stream
    mha::append_provider(probe, "cuda", log);
    const mha::CudaRuntime& cuda = mha::CudaRuntime::get();
    cuda.require_device();
    void* stream = cuda.create_stream();
    GraphTiming timing;
    std::vector<std::unique_ptr<mha::BoundGraph>> layers;
    for (int c = 0; c < copies; ++c)
        for (size_t i = 0; i < models.size(); ++i) {
            mha::FileEntries entries;
            mha::GraphSession graph =
                mha::open_graph_session(env, models[i], options, plans[i].dims, log, stream, entries, &plans[i].entries);
            if (!graph.captured && c == 0)
                std::cerr << "mha_layers: warning: " << models[i] << ": " << graph.describe(plans[i].dims) << "\n";
            timing.captured += graph.captured;
            layers.push_back(mha::bind_graph(std::move(graph), plans[i].inputs, plans[i].outputs));
            for (const auto& spec : plans[i].inputs) layers.back()->load(spec.name, start_bytes(spec, past));
        }
    timing.sessions = layers.size();
    for (auto& layer : layers)
        for (int k = 0; k < 3; ++k) layer->run(Ort::RunOptions{nullptr});  // ONNX Runtime captures
    Ort::RunOptions unsynchronized;
    unsynchronized.AddConfigEntry(kOrtRunOptionsConfigDisableSynchronizeExecutionProviders, "1");
    for (int s = 0; s < kWarmup; ++s)
        for (auto& layer : layers) layer->run(unsynchronized);
    std::vector<mha::CudaRuntime::Event> events;
    for (int s = 0; s <= steps; ++s) events.push_back(cuda.create_event());
    cuda.record(events[0], stream);
    for (int s = 0; s < steps; ++s) {
        for (auto& layer : layers) layer->run(unsynchronized);
        cuda.record(events[s + 1], stream);
    }
    cuda.wait(events.back());
    for (int s = 0; s < steps; ++s) timing.step_ms.push_back(cuda.elapsed_ms(events[s], events[s + 1]));
    for (auto e : events) cuda.destroy(e);
    cuda.synchronize();
    return timing;
}

// MODEL.onnx ... and --name VALUE options (mha::parse_args takes one model and its cases).
struct LayerArgs {
    std::vector<std::string> models;
    std::map<std::string, std::string> options;
    bool cuda_graph = false;
    std::string option(const std::string& name, const std::string& fallback) const {
        const auto it = options.find(name);
        return it == options.end() ? fallback : it->second;
    }
};

LayerArgs parse_layer_args(int argc, char** argv) {
    const std::vector<std::string> valued{"--copies", "--past", "--steps", "--threads", "--pool"};
    LayerArgs a;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            std::cout << kUsage << std::endl;
            std::exit(0);
        }
        if (arg.rfind("--", 0) != 0) {
            a.models.push_back(arg);
            continue;
        }
        if (arg == "--cuda-graph") {
            a.cuda_graph = true;
            continue;
        }
        if (std::find(valued.begin(), valued.end(), arg) == valued.end())
            throw mha::UsageError("unknown option " + arg);
        if (i + 1 >= argc) throw mha::UsageError(arg + " needs a value");
        a.options[arg] = argv[++i];
    }
    return a;
}

int main_layers(int argc, char** argv) {
    const LayerArgs args = parse_layer_args(argc, argv);
    const std::vector<std::string>& models = args.models;
    if (models.empty()) throw mha::UsageError("no model given");
    for (const auto& m : models) mha::require_file(m, "model");
    const int copies = mha::parse_positive_int("--copies", args.option("--copies", "4"));
    const int64_t past = mha::parse_positive_int("--past", args.option("--past", "1024"));
    const int steps = mha::parse_positive_int("--steps", args.option("--steps", "20"));
    const int threads = mha::parse_positive_int("--threads", args.option("--threads", "2"));
    const std::string pool = args.option("--pool", "idle");
    if (pool != "idle" && pool != "spin" && pool != "shared" && pool != "shared-spin")
        throw mha::UsageError("--pool must be idle, spin, shared or shared-spin, got '" + pool + "'");
    const bool shared = pool.rfind("shared", 0) == 0, spinning = pool == "spin" || pool == "shared-spin";

    std::unique_ptr<Ort::Env> env;
    mha::OrtLog log;  // --cuda-graph: ONNX Runtime's log, searched for why CUDA did not start
    Ort::SessionOptions options;
    options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
    if (shared) {
        Ort::ThreadingOptions pools;
        pools.SetGlobalIntraOpNumThreads(threads);
        pools.SetGlobalInterOpNumThreads(1);
        pools.SetGlobalSpinControl(spinning ? 1 : 0);
        env = args.cuda_graph ? std::make_unique<Ort::Env>(pools, mha::log_sink, &log, ORT_LOGGING_LEVEL_WARNING,
                                                           "mha_layers")
                              : std::make_unique<Ort::Env>(pools, ORT_LOGGING_LEVEL_ERROR, "mha_layers");
        options.DisablePerSessionThreads();
    } else {
        env = args.cuda_graph ? std::make_unique<Ort::Env>(ORT_LOGGING_LEVEL_WARNING, "mha_layers", mha::log_sink, &log)
                              : std::make_unique<Ort::Env>(ORT_LOGGING_LEVEL_ERROR, "mha_layers");
        options.SetIntraOpNumThreads(threads);
        options.SetInterOpNumThreads(1);
        options.AddConfigEntry("session.intra_op.allow_spinning", spinning ? "1" : "0");
    }
    if (args.cuda_graph) {
        const GraphTiming t = time_graphs(*env, options, log, models, copies, past, steps);
        const double m = median(t.step_ms);
        std::cout << "onnxruntime " << Ort::GetVersionString() << ", " << t.sessions << " sessions ("
                  << models.size() << " model(s) x " << copies << ") on CUDAExecutionProvider, " << t.captured
                  << " of them replayed as CUDA graphs, past " << past << "\n"
                  << steps << " steps, median " << m << " ms a step, " << m / t.sessions
                  << " ms a layer (CUDA events around back-to-back steps on the sessions' stream, runs not "
                     "synchronized; every step replays each layer at past " << past << ")\n";
        return 0;
    }
    const int64_t capacity = past + kWarmup + steps;
    std::vector<Layer> layers;
    layers.reserve(static_cast<size_t>(copies) * models.size());
    for (int c = 0; c < copies; ++c)
        for (size_t i = 0; i < models.size(); ++i)  // copies after the first reuse its entries
            layers.push_back(open_layer(*env, models[i], options, capacity,
                                        c ? &layers[i].applied : nullptr));
    const int64_t width = model_width(*layers[0].session);
    std::vector<float> x(static_cast<size_t>(width));
    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    for (auto& v : x) v = normal(rng);

    std::vector<double> step_ms;
    for (int s = 0; s < kWarmup + steps; ++s) {
        const auto t0 = mha::Clock::now();
        for (auto& layer : layers) step(layer, x, width, past + s);
        const double ms = std::chrono::duration<double, std::milli>(mha::Clock::now() - t0).count();
        if (s >= kWarmup) step_ms.push_back(ms);
    }
    const double m = median(step_ms);
    std::cout << "onnxruntime " << Ort::GetVersionString() << ", " << layers.size() << " sessions ("
              << models.size() << " model(s) x " << copies << "), pool " << pool << ", " << threads
              << " threads, past " << past << "\n"
              << steps << " steps, median " << m << " ms a step, " << m / layers.size()
              << " ms a layer\n";
    for (size_t i = 0; i < models.size(); ++i)  // the first copy of each model
        for (const auto& [key, value] : layers[i].applied.entries)
            std::cout << models[i] << ": " << key << "=" << value << " (" << layers[i].applied.why
                      << ")\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    return mha::guarded_main([&] { return main_layers(argc, argv); });
}
