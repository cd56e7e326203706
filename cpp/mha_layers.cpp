// mha_layers: several layers' ONNX Runtime sessions in one process, stepped in turn, as an app
// that decodes through a whole model runs them; times a decode step (one token through every
// layer) under each way the sessions can share the CPU's threads. A static-cache model (x,
// past_key, past_value, past_lengths[, position_ids] -> y, present_key, present_value, the
// cache written in place through an IO binding) is loaded --copies times: each session holds its
// own weights, as the layers of a model do, so the step reads them from memory.
#include <onnxruntime_cxx_api.h>

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
#include "ort_session.hpp"

namespace {

const char* const kUsage =
    "usage: mha_layers MODEL.onnx [MODEL.onnx ...] [--copies N] [--past P] [--steps S] [--threads T]\n"
    "                  [--pool idle|spin|shared|shared-spin]\n"
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
    "prints: the median ms of a step (every layer once) and of one layer's call\n"
    "exit codes: 0 ok, 1 runtime failure, 2 bad input";

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
    Ort::AllocatorWithDefaultOptions allocator;
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < layer.session->GetInputCount(); ++i) {
        layer.inputs.push_back(layer.session->GetInputNameAllocated(i, allocator).get());
        index[layer.inputs.back()] = i;
    }
    for (const char* name : {"x", "past_key", "past_value", "past_lengths"})
        if (!index.count(name))
            throw mha::UsageError(path + ": not a static-cache model (no input " + name +
                                  "; export it with --static-cache)");
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

// MODEL.onnx ... and --name VALUE options (mha::parse_args takes one model and its cases).
struct LayerArgs {
    std::vector<std::string> models;
    std::map<std::string, std::string> options;
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
    Ort::SessionOptions options;
    options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
    if (shared) {
        Ort::ThreadingOptions pools;
        pools.SetGlobalIntraOpNumThreads(threads);
        pools.SetGlobalInterOpNumThreads(1);
        pools.SetGlobalSpinControl(spinning ? 1 : 0);
        env = std::make_unique<Ort::Env>(pools, ORT_LOGGING_LEVEL_ERROR, "mha_layers");
        options.DisablePerSessionThreads();
    } else {
        env = std::make_unique<Ort::Env>(ORT_LOGGING_LEVEL_ERROR, "mha_layers");
        options.SetIntraOpNumThreads(threads);
        options.SetInterOpNumThreads(1);
        options.AddConfigEntry("session.intra_op.allow_spinning", spinning ? "1" : "0");
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
