// Shared by mha_ort and mha_layers: opening an mha-export ONNX file the way the Python runners
// do, and tensors over the app's own memory.
//
// A file can name ONNX Runtime config entries it needs from the app (metadata
// "mha_export.session_options": a flat JSON object of strings), e.g. float8 weights:
// {"session.disable_quant_qdq": "1"}, which lets ONNX Runtime fold their DequantizeLinear at
// load (a float MatMul) instead of dequantizing at every call (~10x slower). open_session
// applies them: a file that names entries is opened once more with them added (a
// file without any, once).
#pragma once

#include <onnxruntime_cxx_api.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "npy.hpp"

namespace mha {

// A tensor over `data` (not a copy: ORT reads it and, bound as an output, writes that memory).
template <class T>
Ort::Value cpu_tensor(std::vector<T>& data, const std::vector<int64_t>& shape) {
    const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    return Ort::Value::CreateTensor<T>(cpu, data.data(), data.size(), shape.data(), shape.size());
}

// {"key": "value", ...} with plain strings (what the exporter writes); anything else refused.
inline std::map<std::string, std::string> parse_flat_json(const std::string& text) {
    std::map<std::string, std::string> out;
    size_t i = 0;
    const auto fail = [&] { throw UsageError("metadata mha_export.session_options is not a flat JSON object: " + text); };
    const auto skip = [&] { while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i; };
    const auto string = [&] {
        skip();
        if (i >= text.size() || text[i] != '"') fail();
        const size_t end = text.find('"', i + 1);
        if (end == std::string::npos) fail();
        std::string s = text.substr(i + 1, end - i - 1);
        i = end + 1;
        return s;
    };
    skip();
    if (i >= text.size() || text[i++] != '{') fail();
    skip();
    if (i < text.size() && text[i] == '}') return out;
    while (true) {
        const std::string key = string();
        skip();
        if (i >= text.size() || text[i++] != ':') fail();
        out[key] = string();
        skip();
        if (i < text.size() && text[i] == ',') { ++i; continue; }
        if (i < text.size() && text[i] == '}') return out;
        fail();
    }
}

// The config entries the file names (empty: none).
inline std::map<std::string, std::string> declared_session_options(Ort::Session& session) {
    Ort::AllocatorWithDefaultOptions alloc;
    Ort::ModelMetadata meta = session.GetModelMetadata();
    auto value = meta.LookupCustomMetadataMapAllocated("mha_export.session_options", alloc);
    return value ? parse_flat_json(value.get()) : std::map<std::string, std::string>{};
}

// The session, with the entries the file names added to `options` (returned in `applied`,
// "key=value" each). ONNX Runtime's exceptions reach the caller (which names the cause).
inline std::unique_ptr<Ort::Session> open_session(Ort::Env& env, const std::string& path,
                                                  Ort::SessionOptions& options,
                                                  std::vector<std::string>* applied = nullptr) {
    auto session = std::make_unique<Ort::Session>(env, path.c_str(), options);
    const auto entries = declared_session_options(*session);
    if (entries.empty()) return session;
    for (const auto& [key, value] : entries) {
        options.AddConfigEntry(key.c_str(), value.c_str());
        if (applied) applied->push_back(key + "=" + value);
    }
    session.reset();
    return std::make_unique<Ort::Session>(env, path.c_str(), options);
}

}  // namespace mha
