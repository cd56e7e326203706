// tests/test_cpp.py builds this against build/cpp's ONNX Runtime: mha_ort's --cuda-graph path
// (GraphReplays: a session per input shape with its symbolic dims fixed, every input and output
// bound once, present_* written in place into past_*'s buffers, the copies in and out, the
// outputs' order and shapes) run on the CPU provider, whose allocator gives the buffers instead of
// CUDA's. What only CUDA has (the capture itself, the device copies, the stream) is not here.
// usage: graph_replays_on_cpu MODEL.onnx CASE_DIR...
#define main mha_ort_main
#include "mha_ort.cpp"
#undef main

int main(int argc, char** argv) {
    return mha::guarded_main([&] {
        mha::Args args;
        args.model = argv[1];
        for (int i = 2; i < argc; ++i) args.case_dirs.push_back(argv[i]);
        Ort::Env env;
        Ort::SessionOptions options;
        mha::FileEntries applied;
        auto declared = mha::open_session(env, args.model, options, applied);
        const ModelIO io = model_io(*declared);
        require_static_step(io, args.model);
        const auto cases = mha::read_cases(args, io.decl);
        OrtLog log;
        GraphReplays replays{env, args.model, options, log, applied, *declared, io, {}};
        for (const auto& c : cases) {  // each new shape opened as open_graph_session does, on the CPU
            std::vector<std::vector<int64_t>> key;
            for (const auto& a : c.inputs) key.push_back(a.shape);
            if (replays.calls.count(key)) continue;
            const auto plan = replays.plan(c);
            Ort::SessionOptions fixed = options.Clone();
            for (const auto& [name, size] : plan.dims)
                Ort::ThrowOnError(Ort::GetApi().AddFreeDimensionOverrideByName(fixed, name.c_str(), size));
            mha::GraphSession session;
            session.session = std::make_unique<Ort::Session>(env, args.model.c_str(), fixed);
            session.why = "the CPU provider";
            std::cout << "shape " << session.describe(plan.dims) << "\n";
            replays.calls[key] = mha::bind_graph(std::move(session), plan.inputs, plan.outputs, true);
        }
        return mha::run_cases(io.decl, cases, [&](const mha::Case& c) { return replays(c); });
    });
}
