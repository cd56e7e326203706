// tests/test_cpp.py builds this against build/cpp's ONNX Runtime: mha_ort's --cuda-graph code
// (GraphReplays: a session per input shape with its symbolic dims fixed, every input and output
// bound once, present_* written in place into past_*'s buffers, the copies in and out, the
// outputs' order and shapes; --generate's one cache bound by every step's session) run on the
// CPU provider, the buffers on the host. What only CUDA has (the capture itself, the device
// copies and memory, the stream) is not here.
// usage: graph_replays_on_cpu MODEL.onnx CASE_DIR... [--generate 5,1,1]
#define main mha_ort_main
#include "mha_ort.cpp"
#undef main

int main(int argc, char** argv) {
    return mha::guarded_main([&] {
        mha::Args args;
        args.model = argv[1];
        std::vector<int64_t> steps;
        for (int i = 2; i < argc; ++i) {
            if (std::string(argv[i]) == "--generate") steps = parse_steps(argv[++i]);
            else args.case_dirs.push_back(argv[i]);
        }
        Ort::Env env;
        Ort::SessionOptions options;
        mha::FileEntries applied;
        auto declared = mha::open_session(env, args.model, options, applied);
        const ModelIO io = model_io(*declared);
        require_static_step(io, args.model);
        OrtLog log;
        GraphReplays replays{env, args.model, options, log, applied, *declared, io, {}};
        replays.on_host = true;
        replays.open_session = [&](const mha::Dims& dims) {  // as open_graph_session, on the CPU
            Ort::SessionOptions fixed = options.Clone();
            for (const auto& [name, size] : dims)
                Ort::ThrowOnError(Ort::GetApi().AddFreeDimensionOverrideByName(fixed, name.c_str(), size));
            mha::GraphSession session;
            session.session = std::make_unique<Ort::Session>(env, args.model.c_str(), fixed);
            session.why = "the CPU provider";
            return session;
        };
        if (steps.empty()) {
            const auto cases = mha::read_cases(args, io.decl);
            return mha::run_cases(io.decl, cases, [&](const mha::Case& c) { return replays(c); });
        }
        mha::Declaration given = io.decl;
        given.inputs.clear();
        for (const char* name : {"x", "past_key", "past_value"}) given.inputs.push_back(io.decl.inputs[input_index(io, name)]);
        const auto cases = mha::read_cases(args, given);
        return mha::run_cases(given, cases, [&](const mha::Case& c) { return replays.generate(c, steps); });
    });
}
