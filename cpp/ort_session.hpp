// Shared by mha_ort and mha_layers: opening an mha-export ONNX file the way the Python runners
// do, and tensors over the app's own memory.
//
// A file can name ONNX Runtime config entries it needs from the app (metadata
// "mha_export.session_options": a flat JSON object of strings; mha_export/lossy/projections/
// session_options.py), e.g. float8 weights: {"session.disable_quant_qdq": "1"}, which lets ONNX
// Runtime fold their DequantizeLinear at load (a float MatMul) instead of dequantizing at every
// call (~9x slower). open_session applies them: a file that names entries is opened once more
// with them added (a file without any, once). Only known entries are accepted: a file must not
// override what the app chose (its threads, say). The record is read as written; a file without
// it runs with the app's options only.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "npy.hpp"

namespace mha {

using SessionEntries = std::map<std::string, std::string>;

// A tensor over `data` (not a copy: ORT reads it and, bound as an output, writes that memory).
template <class T>
Ort::Value cpu_tensor(std::vector<T>& data, const std::vector<int64_t>& shape) {
    const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    return Ort::Value::CreateTensor<T>(cpu, data.data(), data.size(), shape.data(), shape.size());
}

// {"key": "value", ...}: plain strings without escapes, nothing after the closing brace.
inline SessionEntries parse_session_entries(const std::string& text, const std::string& path) {
    SessionEntries out;
    size_t i = 0;
    const auto fail = [&] {
        throw UsageError(path + ": metadata mha_export.session_options is not a flat JSON object "
                         "of plain strings");
    };
    const auto skip = [&] { while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i; };
    const auto string = [&] {
        skip();
        if (i >= text.size() || text[i] != '"') fail();
        const size_t end = text.find('"', i + 1);
        if (end == std::string::npos) fail();
        std::string s = text.substr(i + 1, end - i - 1);
        if (s.find('\\') != std::string::npos) fail();
        i = end + 1;
        return s;
    };
    const auto close = [&] {
        ++i;
        skip();
        if (i != text.size()) fail();
        return out;
    };
    skip();
    if (i >= text.size() || text[i++] != '{') fail();
    skip();
    if (i < text.size() && text[i] == '}') return close();
    while (true) {
        const std::string key = string();
        skip();
        if (i >= text.size() || text[i++] != ':') fail();
        out[key] = string();
        skip();
        if (i < text.size() && text[i] == ',') { ++i; continue; }
        if (i < text.size() && text[i] == '}') return close();
        fail();
    }
}

// The config entries the file names (empty: none), each a known one.
inline SessionEntries declared_session_options(Ort::Session& session, const std::string& path) {
    static const std::set<std::string> known{"session.disable_quant_qdq"};
    Ort::AllocatorWithDefaultOptions alloc;
    Ort::ModelMetadata meta = session.GetModelMetadata();
    auto value = meta.LookupCustomMetadataMapAllocated("mha_export.session_options", alloc);
    if (!value) return {};
    SessionEntries entries = parse_session_entries(value.get(), path);
    for (const auto& entry : entries)
        if (!known.count(entry.first))
            throw UsageError(path + ": metadata mha_export.session_options names '" + entry.first +
                             "', which a file may not set (known: session.disable_quant_qdq)");
    return entries;
}

inline void add_entries(Ort::SessionOptions& options, const SessionEntries& entries) {
    for (const auto& [key, value] : entries) options.AddConfigEntry(key.c_str(), value.c_str());
}

// The session, with the entries the file names added to `options` (and returned in `entries`).
// `known`: the file's entries already read (another session of the same file): one open.
// ONNX Runtime's exceptions reach the caller (which names the cause).
inline std::unique_ptr<Ort::Session> open_session(Ort::Env& env, const std::string& path,
                                                  Ort::SessionOptions& options,
                                                  SessionEntries& entries,
                                                  const SessionEntries* known = nullptr) {
    if (known) {
        entries = *known;
        add_entries(options, entries);
        return std::make_unique<Ort::Session>(env, path.c_str(), options);
    }
    auto session = std::make_unique<Ort::Session>(env, path.c_str(), options);
    entries = declared_session_options(*session, path);
    if (entries.empty()) return session;
    add_entries(options, entries);
    session.reset();
    return std::make_unique<Ort::Session>(env, path.c_str(), options);
}

}  // namespace mha
