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
// it (exported before 0.5, or written elsewhere) gets what its graph needs, as in Python
// (session_options.needed): float8 initializers ask for the fold. A half-precision file's
// symmetric MatMulNBits ask for {"ep.cuda.fpa_intb_gemm": "1"}: the CUDA provider's fpA_intB
// kernels (ignored by the CPU provider).
#pragma once

#include <onnxruntime_cxx_api.h>

#include <cctype>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "npy.hpp"

namespace mha {

using SessionEntries = std::map<std::string, std::string>;

// The config entries a file is opened with, and why (for the programs' lines).
struct FileEntries {
    SessionEntries entries;
    std::string why;
};

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

// --- protobuf's wire format, as much as reading an initializer's type needs ----------------
inline bool read_varint(std::istream& in, uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        const int c = in.get();
        if (c == std::char_traits<char>::eof()) return false;
        value |= static_cast<uint64_t>(c & 0x7f) << shift;
        if (!(c & 0x80)) return true;
    }
    return false;
}

struct WireField {
    uint64_t number;
    int wire;        // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
    uint64_t varint; // wire 0's value
    std::streamoff end;
};

// Calls visit(field) for each field of the message ending at `end`, the stream at the field's
// value (visit may read inside it; the walk seeks past it after). False on malformed bytes.
template <class Visit>
bool walk_fields(std::istream& in, std::streamoff end, Visit&& visit) {
    while (in && static_cast<std::streamoff>(in.tellg()) < end) {
        uint64_t key = 0, length = 0;
        if (!read_varint(in, key)) return false;
        WireField f{key >> 3, static_cast<int>(key & 7), 0, 0};
        const auto width = f.wire == 1 ? 8 : f.wire == 5 ? 4 : -1;
        if (f.wire == 0 && !read_varint(in, f.varint)) return false;
        if (f.wire == 2 && !read_varint(in, length)) return false;
        if (f.wire != 0 && f.wire != 2 && width < 0) return false;
        f.end = static_cast<std::streamoff>(in.tellg()) +
                static_cast<std::streamoff>(f.wire == 2 ? length : f.wire == 0 ? 0 : width);
        if (!in || f.end > end) return false;
        visit(f);
        in.clear();
        in.seekg(f.end);
    }
    return static_cast<bool>(in);
}

// Whether the graph's initializers hold float8 (E4M3FN) tensors: ModelProto.graph (7) ->
// GraphProto.initializer (5) -> TensorProto.data_type (2). Python's session_options.needed.
inline bool has_float8_initializers(const std::string& path) {
    constexpr uint64_t kFloat8E4M3FN = 17;  // onnx.TensorProto.FLOAT8E4M3FN
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    const std::streamoff size = in ? static_cast<std::streamoff>(in.tellg()) : 0;
    in.seekg(0);
    bool found = false;
    walk_fields(in, size, [&](const WireField& model) {
        if (model.number != 7 || model.wire != 2) return;
        walk_fields(in, model.end, [&](const WireField& graph) {
            if (graph.number != 5 || graph.wire != 2) return;
            walk_fields(in, graph.end, [&](const WireField& tensor) {
                found |= tensor.number == 2 && tensor.wire == 0 && tensor.varint == kFloat8E4M3FN;
            });
        });
    });
    return found;
}

// The config entries the file names, each a known one; a file without the record: what its
// graph needs (float8 initializers: the fold), said as such.
inline FileEntries declared_session_options(Ort::Session& session, const std::string& path) {
    static const std::set<std::string> known{"session.disable_quant_qdq", "ep.cuda.fpa_intb_gemm"};
    Ort::AllocatorWithDefaultOptions alloc;
    Ort::ModelMetadata meta = session.GetModelMetadata();
    auto value = meta.LookupCustomMetadataMapAllocated("mha_export.session_options", alloc);
    if (!value) {
        if (!has_float8_initializers(path)) return {};
        return {{{"session.disable_quant_qdq", "1"}},
                "its float8 weights need it; the file, written before 0.5 or elsewhere, names no options"};
    }
    SessionEntries entries = parse_session_entries(value.get(), path);
    for (const auto& entry : entries)
        if (!known.count(entry.first))
            throw UsageError(path + ": metadata mha_export.session_options names '" + entry.first +
                             "', which a file may not set (known: session.disable_quant_qdq, "
                             "ep.cuda.fpa_intb_gemm)");
    return {entries, "the file asks for it"};
}

inline void add_entries(Ort::SessionOptions& options, const SessionEntries& entries) {
    for (const auto& [key, value] : entries) options.AddConfigEntry(key.c_str(), value.c_str());
}

// The session, with the entries the file names added to `options` (and returned in `entries`).
// `known`: the file's entries already read (another session of the same file): one open.
// ONNX Runtime's exceptions reach the caller (which names the cause).
inline std::unique_ptr<Ort::Session> open_session(Ort::Env& env, const std::string& path,
                                                  Ort::SessionOptions& options,
                                                  FileEntries& entries,
                                                  const FileEntries* known = nullptr) {
    if (known) {
        entries = *known;
        add_entries(options, entries.entries);
        return std::make_unique<Ort::Session>(env, path.c_str(), options);
    }
    auto session = std::make_unique<Ort::Session>(env, path.c_str(), options);
    entries = declared_session_options(*session, path);
    if (entries.entries.empty()) return session;
    add_entries(options, entries.entries);
    session.reset();
    return std::make_unique<Ort::Session>(env, path.c_str(), options);
}

}  // namespace mha
