// Shared by mha_ort and mha_torch: .npy files in and out (float32, float16, int64; int8 for
// mha_ort's int8 cache buffers), argument
// parsing, the model's declared inputs/outputs, the case loop, and the exit codes of the Python
// CLI.
//
//   exit 0  success
//   exit 1  unexpected runtime failure (an error inside ONNX Runtime / libtorch while running)
//   exit 2  bad input: missing or unreadable file, not an .npy, wrong dtype / rank / dimension, a
//           model file that does not load, bad arguments                    (UsageError)
//   exit 3  the requested device cannot run here (--provider cuda / --device cuda without a
//           working CUDA): never silently replaced by the CPU               (DeviceUnavailable)
//
// Every error is one line on stderr: "Error: <what>".
//
// Two ways to name the files (both programs):
//   MODEL CASE_DIR [CASE_DIR ...]      every declared input NAME is read from CASE_DIR/NAME.npy,
//                                      every declared output is written to CASE_DIR/NAME.npy
//   MODEL IN.npy OUT.npy [IN OUT ...]  models with exactly one input and one output only
#pragma once

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace mha {

// ---- errors and exit codes -------------------------------------------------------------------

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct DeviceUnavailable : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The first line of a (possibly multi-line) library message, without trailing blanks.
inline std::string first_line(const std::string& s) {
    std::string line = s.substr(0, s.find('\n'));
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    return line;
}

// Runs body() and maps what it throws to one stderr line and the exit codes above.
inline int guarded_main(const std::function<int()>& body) {
    auto fail = [](int code, const std::string& what) {
        std::cout.flush();
        std::cerr << "Error: " << first_line(what) << std::endl;
        return code;
    };
    try {
        return body();
    } catch (const UsageError& e) {
        return fail(2, e.what());
    } catch (const DeviceUnavailable& e) {
        return fail(3, e.what());
    } catch (const std::exception& e) {
        return fail(1, e.what());
    }
}

// ---- command line: MODEL (CASE_DIR ... | IN OUT ...) [--opt value] [--flag] ----------------

using Pairs = std::vector<std::pair<std::string, std::string>>;

struct Args {
    std::string model;
    std::vector<std::string> case_dirs;  // CASE_DIR form
    Pairs pairs;                         // legacy IN.npy OUT.npy form
    std::map<std::string, std::string> options;  // "--threads" -> "4"
    std::set<std::string> flags;                 // "--info"

    std::string option(const std::string& name, const std::string& fallback) const {
        auto it = options.find(name);
        return it == options.end() ? fallback : it->second;
    }
    bool flag(const std::string& name) const { return flags.count(name) > 0; }
};

inline bool is_directory(const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_directory(path, ec);
}

// valued: options that take a value; flags: options that do not. With a flag in no_io_flags
// (e.g. --info) the case folders / file pairs may be left out. Operands that are all existing
// folders are the CASE_DIR form; otherwise they are IN.npy OUT.npy pairs.
inline Args parse_args(int argc, char** argv, const std::string& usage,
                       const std::set<std::string>& valued, const std::set<std::string>& flags,
                       const std::set<std::string>& no_io_flags = {}) {
    const std::string usage_line = usage.substr(0, usage.find('\n'));
    Args a;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            std::cout << usage << std::endl;
            std::exit(0);
        }
        if (arg.rfind("--", 0) == 0) {
            std::string name = arg, value;
            bool inline_value = false;
            if (auto eq = arg.find('='); eq != std::string::npos) {
                name = arg.substr(0, eq);
                value = arg.substr(eq + 1);
                inline_value = true;
            }
            if (valued.count(name)) {
                if (!inline_value) {
                    if (i + 1 >= argc) throw UsageError(name + " needs a value");
                    value = argv[++i];
                }
                a.options[name] = value;
            } else if (flags.count(name) && !inline_value) {
                a.flags.insert(name);
            } else {
                throw UsageError("unknown option " + arg + " (" + usage_line + ")");
            }
        } else {
            positional.push_back(arg);
        }
    }
    bool io_optional = false;
    for (const auto& f : no_io_flags) io_optional = io_optional || a.flag(f);
    if (positional.empty()) throw UsageError("missing MODEL (" + usage_line + ")");
    a.model = positional[0];
    const std::vector<std::string> operands(positional.begin() + 1, positional.end());
    if (operands.empty()) {
        if (!io_optional) throw UsageError("missing CASE_DIR (or IN.npy OUT.npy) (" + usage_line + ")");
        return a;
    }
    size_t dirs = 0;
    for (const auto& op : operands) dirs += is_directory(op);
    if (dirs == operands.size()) {
        a.case_dirs = operands;
        return a;
    }
    if (dirs > 0)
        for (const auto& op : operands)
            if (!is_directory(op))
                throw UsageError(op + " is not a folder: give either CASE_DIR folders or IN.npy OUT.npy pairs, not both");
    if (operands.size() % 2 != 0)
        throw UsageError("inputs and outputs come in pairs: IN.npy OUT.npy, got an odd one out: " +
                         operands.back() + " (or is it a CASE_DIR that does not exist?)");
    for (size_t i = 0; i + 1 < operands.size(); i += 2) a.pairs.emplace_back(operands[i], operands[i + 1]);
    return a;
}

inline int parse_positive_int(const std::string& name, const std::string& text) {
    try {
        size_t used = 0;
        long v = std::stol(text, &used);
        if (used == text.size() && v > 0 && v <= 4096) return static_cast<int>(v);
    } catch (const std::exception&) {
    }
    throw UsageError(name + " expects a positive integer, got '" + text + "'");
}

inline void require_file(const std::string& path, const std::string& what) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError(what + " not found or unreadable: " + path + " (" + std::strerror(errno) + ")");
    if (is_directory(path)) throw UsageError(what + " is a folder, not a file: " + path);
}

// ---- arrays and .npy (NumPy format 1.0 / 2.0 / 3.0, little-endian, C order) ---------------------

// What an input holds in memory: float32 (float16 files are widened on reading; a float16 model's
// runner narrows them again), int64, or int8 (a static cache's codes: only ever read as int8).
enum class Kind { Float, Int64, Int8, Any /* float or int64: the model does not say */,
                  Other /* unsupported */ };

inline const char* kind_name(Kind k) {
    switch (k) {
        case Kind::Float: return "float32";
        case Kind::Int64: return "int64";
        case Kind::Int8: return "int8";
        case Kind::Any: return "float32 or int64";
        default: return "unsupported";
    }
}

// The number of elements of an array of this shape.
inline int64_t element_count(const std::vector<int64_t>& shape) {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

struct Array {
    std::vector<int64_t> shape;
    Kind kind = Kind::Float;     // Float, Int64 or Int8
    std::vector<float> data;     // C order, when kind == Float
    std::vector<int64_t> ints;   // C order, when kind == Int64
    std::vector<int8_t> codes;   // C order, when kind == Int8

    int64_t dim(size_t i) const { return shape.at(i); }
    int64_t count() const {
        return element_count(shape);
    }
};

inline std::string shape_str(const std::vector<int64_t>& shape) {
    std::ostringstream s;
    s << '[';
    for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
    s << ']';
    return s.str();
}

namespace detail {

// The value text of 'key' in the header dict, e.g. "'<f4'" or "(2, 16, 64)".
inline std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
    size_t k = header.find("'" + key + "'");
    if (k == std::string::npos) throw UsageError(path + ": not a valid .npy header (no '" + key + "')");
    size_t colon = header.find(':', k);
    if (colon == std::string::npos) throw UsageError(path + ": not a valid .npy header");
    const size_t start = header.find_first_not_of(' ', colon + 1);
    if (start == std::string::npos) throw UsageError(path + ": not a valid .npy header");
    const size_t close = header[start] == '(' ? header.find(')', start) : header.find_first_of(",}", start);
    if (close == std::string::npos) throw UsageError(path + ": not a valid .npy header");
    const size_t end = header[start] == '(' ? close + 1 : close;
    return header.substr(start, end - start);
}

inline std::vector<int64_t> parse_shape(const std::string& tuple, const std::string& path) {
    std::vector<int64_t> shape;
    std::string inner = tuple.substr(1, tuple.size() - 2);
    std::stringstream ss(inner);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t b = item.find_first_not_of(' ');
        if (b == std::string::npos) continue;  // "(5,)" has an empty last item
        try {
            size_t used = 0;
            long long v = std::stoll(item.substr(b), &used);
            if (v < 0) throw std::invalid_argument("negative");
            shape.push_back(v);
        } catch (const std::exception&) {
            throw UsageError(path + ": bad shape " + tuple + " in .npy header");
        }
    }
    return shape;
}

inline bool little_endian_host() {
    const uint16_t one = 1;
    return *reinterpret_cast<const uint8_t*>(&one) == 1;
}

// IEEE 754 binary16 -> binary32 (exact).
inline float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;  // +-0
        } else {          // subnormal: normalise
            int e = -1;
            do { ++e; mant <<= 1; } while ((mant & 0x400) == 0);
            bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
        }
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

template <class T>
void read_exact(std::ifstream& f, T* out, int64_t count, const std::string& path, const std::vector<int64_t>& shape,
                size_t item) {
    const int64_t bytes = count * static_cast<int64_t>(item);
    f.read(reinterpret_cast<char*>(out), bytes);
    if (f.gcount() != bytes)
        throw UsageError(path + ": truncated data: shape " + shape_str(shape) + " needs " + std::to_string(bytes) +
                         " bytes");
}

}  // namespace detail

// Reads an array whose dtype fits `want` (Float: '<f4' or '<f2', widened to float32; Int64: '<i8';
// Int8: '|i1'; Any: float or int64). `what` names it in messages ("input 'x'"). Every failure is a one-line UsageError.
inline Array read_npy(const std::string& path, Kind want = Kind::Float, const std::string& what = "input") {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError(what + " not found or unreadable: " + path + " (" + std::strerror(errno) + ")");
    char magic[8] = {};
    f.read(magic, 8);
    if (f.gcount() != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0)
        throw UsageError(path + ": not an .npy file (bad magic)");
    const int major = static_cast<unsigned char>(magic[6]);
    if (major < 1 || major > 3)
        throw UsageError(path + ": unsupported .npy version " + std::to_string(major) + "." +
                         std::to_string(static_cast<unsigned char>(magic[7])));
    uint32_t header_len = 0;
    unsigned char len_bytes[4] = {};
    const int len_size = major == 1 ? 2 : 4;
    f.read(reinterpret_cast<char*>(len_bytes), len_size);
    if (f.gcount() != len_size) throw UsageError(path + ": truncated .npy header");
    for (int i = len_size - 1; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];
    if (header_len > (1u << 20)) throw UsageError(path + ": implausible .npy header length");
    std::string header(header_len, '\0');
    f.read(header.data(), header_len);
    if (static_cast<uint32_t>(f.gcount()) != header_len) throw UsageError(path + ": truncated .npy header");

    const std::string descr = detail::dict_value(header, "descr", path);
    const bool is_f4 = descr == "'<f4'", is_f2 = descr == "'<f2'", is_i8 = descr == "'<i8'";
    const bool is_i1 = descr == "'|i1'";
    const bool float_ok = want == Kind::Float || want == Kind::Any, int_ok = want == Kind::Int64 || want == Kind::Any;
    if (!((float_ok && (is_f4 || is_f2)) || (int_ok && is_i8) || (want == Kind::Int8 && is_i1))) {
        std::string expected, fix;
        if (want == Kind::Int64) {
            expected = "int64 ('<i8')";
            fix = "np.save(path, a.astype(np.int64))";
        } else if (want == Kind::Int8) {
            expected = "int8 ('|i1')";
            fix = "np.save(path, codes.astype(np.int8))";
        } else if (want == Kind::Float) {
            expected = "float32 ('<f4') or float16 ('<f2')";
            fix = "np.save(path, a.astype(np.float32))";
        } else {
            expected = "float32 ('<f4'), float16 ('<f2') or int64 ('<i8')";
            fix = "np.save(path, a.astype(np.float32))";
        }
        throw UsageError(path + ": dtype " + descr + " is not " + expected + " as " + what + " needs: save with " + fix);
    }
    if (detail::dict_value(header, "fortran_order", path) != "False")
        throw UsageError(path + ": Fortran-ordered array: save a C-ordered one (np.ascontiguousarray)");
    const std::string shape_text = detail::dict_value(header, "shape", path);
    if (shape_text.front() != '(') throw UsageError(path + ": bad shape in .npy header");
    if (!detail::little_endian_host()) throw UsageError("big-endian hosts are not supported");

    Array a;
    a.shape = detail::parse_shape(shape_text, path);
    int64_t count = 1;
    for (int64_t d : a.shape) {
        if (d != 0 && count > (int64_t{1} << 40) / d) throw UsageError(path + ": array too large " + shape_str(a.shape));
        count *= d;
    }
    a.kind = is_i8 ? Kind::Int64 : is_i1 ? Kind::Int8 : Kind::Float;
    // capacity >= 1: data() is never null, even for a zero-size array (an empty past_key).
    if (is_i1) {
        a.codes.reserve(static_cast<size_t>(std::max<int64_t>(count, 1)));
        a.codes.resize(static_cast<size_t>(count));
        detail::read_exact(f, a.codes.data(), count, path, a.shape, 1);
    } else if (is_i8) {
        a.ints.reserve(static_cast<size_t>(std::max<int64_t>(count, 1)));
        a.ints.resize(static_cast<size_t>(count));
        detail::read_exact(f, a.ints.data(), count, path, a.shape, 8);
    } else if (is_f4) {
        a.data.reserve(static_cast<size_t>(std::max<int64_t>(count, 1)));
        a.data.resize(static_cast<size_t>(count));
        detail::read_exact(f, a.data.data(), count, path, a.shape, 4);
    } else {
        std::vector<uint16_t> halves(static_cast<size_t>(count));
        detail::read_exact(f, halves.data(), count, path, a.shape, 2);
        a.data.reserve(static_cast<size_t>(std::max<int64_t>(count, 1)));
        for (uint16_t h : halves) a.data.push_back(detail::half_to_float(h));
    }
    return a;
}

// Writes a C-ordered array (format 1.0, descr e.g. "<f4", "|i1") via a temporary file renamed into place,
// so a failure never leaves a partial file.
inline void write_npy_raw(const std::string& path, const std::vector<int64_t>& shape, const std::string& descr,
                          const void* data, size_t item_size) {
    std::ostringstream dict;
    dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
    for (size_t i = 0; i < shape.size(); ++i) dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    dict << "), }";
    std::string header = dict.str();
    const size_t preamble = 10;  // magic (6) + version (2) + header length (2)
    header.append(64 - (preamble + header.size() + 1) % 64, ' ');  // pad: data 64-byte aligned
    header.push_back('\n');
    const int64_t count = element_count(shape);

    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) throw UsageError("cannot write " + path + " (" + std::strerror(errno) + ")");
        const uint16_t len = static_cast<uint16_t>(header.size());
        const char version[2] = {1, 0};
        f.write("\x93NUMPY", 6);
        f.write(version, 2);
        const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
        f.write(len_bytes, 2);
        f.write(header.data(), static_cast<std::streamsize>(header.size()));
        if (count > 0) f.write(static_cast<const char*>(data), count * static_cast<int64_t>(item_size));
        if (!f) {
            f.close();
            std::remove(tmp.c_str());
            throw UsageError("cannot write " + path + " (disk full?)");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw UsageError("cannot write " + path + " (" + std::strerror(errno) + ")");
    }
}

inline void write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
    write_npy_raw(path, shape, "<f4", data, sizeof(float));
}

inline void write_npy(const std::string& path, const std::vector<int64_t>& shape, const int64_t* data) {
    write_npy_raw(path, shape, "<i8", data, sizeof(int64_t));
}

inline void write_npy(const std::string& path, const std::vector<int64_t>& shape, const int8_t* data) {
    write_npy_raw(path, shape, "|i1", data, sizeof(int8_t));
}

inline void write_npy(const std::string& path, const Array& a) {
    if (a.kind == Kind::Int64) write_npy(path, a.shape, a.ints.data());
    else if (a.kind == Kind::Int8) write_npy(path, a.shape, a.codes.data());
    else write_npy(path, a.shape, a.data.data());
}

// ---- the model's declared inputs and outputs ----------------------------------------------------

// One declared tensor. dims: -1 where symbolic (then symbols[i] names it, e.g. "batch",
// "past_seq + seq"); rank -1 (empty dims, known_rank false) when the model does not say.
struct TensorDecl {
    std::string name;
    Kind kind = Kind::Any;
    std::string type_text;  // "float32", "float16", "int64", ... as the model declares it
    bool known_rank = false;
    std::vector<int64_t> dims;
    std::vector<std::string> symbols;

    std::string dims_text() const {
        if (!known_rank) return "[?]";
        std::string s = "[";
        for (size_t i = 0; i < dims.size(); ++i) {
            s += i ? ", " : "";
            s += dims[i] >= 0 ? std::to_string(dims[i]) : (symbols[i].empty() ? "?" : symbols[i]);
        }
        return s + "]";
    }
    std::string describe() const { return known_rank ? type_text + " " + dims_text() : type_text; }
};

struct Declaration {
    std::vector<TensorDecl> inputs, outputs;
};

inline void print_declaration(const Declaration& d) {
    for (const auto* list : {&d.inputs, &d.outputs}) {
        std::cout << (list == &d.inputs ? "inputs" : "outputs") << ":\n";
        for (const auto& t : *list) std::cout << "  " << t.name << ": " << t.describe() << "\n";
    }
}

namespace detail {

inline std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace detail

// Checks one case's arrays against the declaration: rank, fixed sizes, no zero size but on a
// "past_seq" axis, and that every symbolic
// axis has one size across the inputs ("batch" agrees everywhere; "past_seq + seq" is the sum of
// "past_seq" and "seq" when both are known). Messages name the file and the input.
inline void check_against(const std::vector<TensorDecl>& decls, const std::vector<Array>& arrays,
                          const std::vector<std::string>& paths) {
    std::map<std::string, std::pair<int64_t, std::string>> sizes;  // symbol -> (size, where seen)
    for (size_t i = 0; i < decls.size(); ++i) {
        const TensorDecl& d = decls[i];
        const Array& a = arrays[i];
        if (!d.known_rank) continue;
        if (a.shape.size() != d.dims.size())
            throw UsageError(paths[i] + ": input '" + d.name + "' needs a rank-" + std::to_string(d.dims.size()) +
                             " array " + d.dims_text() + ", got shape " + shape_str(a.shape));
        for (size_t k = 0; k < d.dims.size(); ++k) {
            if (d.dims[k] >= 0 && a.shape[k] != d.dims[k])
                throw UsageError(paths[i] + ": input '" + d.name + "' needs " + d.dims_text() + ", got shape " +
                                 shape_str(a.shape) + ": dimension " + std::to_string(k) + " is " +
                                 std::to_string(a.shape[k]) + ", not " + std::to_string(d.dims[k]));
            if (d.dims[k] >= 0) continue;
            // Only a cache may be empty (past_seq 0 at prefill; a kind's own cache: its axes named
            // past_*, DeepSeek-V4's past_rows ...): no batch, no tokens is bad input.
            if (a.shape[k] == 0 && d.symbols[k].find("past_") == std::string::npos)
                throw UsageError(paths[i] + ": input '" + d.name + "' is empty: axis '" +
                                 (d.symbols[k].empty() ? std::to_string(k) : d.symbols[k]) + "' is 0 (shape " +
                                 shape_str(a.shape) + ")");
            if (d.symbols[k].empty()) continue;
            auto [it, fresh] = sizes.emplace(d.symbols[k], std::make_pair(a.shape[k], paths[i]));
            if (!fresh && it->second.first != a.shape[k])
                throw UsageError(paths[i] + ": axis '" + d.symbols[k] + "' of input '" + d.name + "' is " +
                                 std::to_string(a.shape[k]) + " but " + std::to_string(it->second.first) + " in " +
                                 it->second.second);
        }
    }
    for (const auto& [symbol, seen] : sizes) {  // "a + b" axes
        const size_t plus = symbol.find('+');
        if (plus == std::string::npos) continue;
        auto a = sizes.find(detail::trim(symbol.substr(0, plus))), b = sizes.find(detail::trim(symbol.substr(plus + 1)));
        if (a == sizes.end() || b == sizes.end()) continue;
        if (a->second.first + b->second.first != seen.first)
            throw UsageError(seen.second + ": axis '" + symbol + "' is " + std::to_string(seen.first) + ", but " +
                             a->first + " + " + b->first + " = " + std::to_string(a->second.first) + " + " +
                             std::to_string(b->second.first) + " (from " + a->second.second + ", " +
                             b->second.second + ")");
    }
}

// ---- cases: what one run reads and writes ---------------------------------------------------------

struct Case {
    std::string label;                      // CASE_DIR, or the IN.npy of a pair
    std::vector<Array> inputs;              // in the declared input order
    std::vector<std::string> input_paths;   // same order
    std::vector<std::string> output_paths;  // in the declared output order
    bool pair = false;                      // legacy IN OUT form
};

inline std::string join_path(const std::string& dir, const std::string& file) {
    return (std::filesystem::path(dir) / file).string();
}

// Reads and checks every input of every case before anything runs: bad input leaves no output
// behind. extra_check(case) may add program-specific checks.
inline std::vector<Case> read_cases(const Args& args, const Declaration& decl,
                                    const std::function<void(const Case&)>& extra_check = {}) {
    std::vector<Case> cases;
    if (!args.pairs.empty()) {
        if (decl.inputs.size() != 1 || decl.outputs.size() != 1) {
            std::string names;
            for (const auto& t : decl.inputs) names += (names.empty() ? "" : ", ") + t.name;
            throw UsageError(args.model + " takes " + std::to_string(decl.inputs.size()) + " inputs (" + names +
                             ") and gives " + std::to_string(decl.outputs.size()) +
                             " outputs: IN.npy OUT.npy pairs only serve one-input, one-output models; "
                             "use the CASE_DIR form (a folder holding NAME.npy for every input)");
        }
        for (const auto& [in, out] : args.pairs) {
            Case c;
            c.label = in;
            c.pair = true;
            c.input_paths = {in};
            c.output_paths = {out};
            c.inputs.push_back(read_npy(in, decl.inputs[0].kind, "input '" + decl.inputs[0].name + "'"));
            cases.push_back(std::move(c));
        }
    }
    for (const auto& dir : args.case_dirs) {
        Case c;
        c.label = dir;
        for (const auto& t : decl.inputs) {
            const std::string path = join_path(dir, t.name + ".npy");
            std::error_code ec;
            if (!std::filesystem::exists(path, ec))
                throw UsageError(dir + ": no " + t.name + ".npy for the model's input '" + t.name + "' (" +
                                 t.describe() + ")");
            c.input_paths.push_back(path);
            c.inputs.push_back(read_npy(path, t.kind, "input '" + t.name + "'"));
        }
        for (const auto& t : decl.outputs) c.output_paths.push_back(join_path(dir, t.name + ".npy"));
        cases.push_back(std::move(c));
    }
    for (const auto& c : cases) {
        check_against(decl.inputs, c.inputs, c.input_paths);
        if (extra_check) extra_check(c);
    }
    return cases;
}

// ---- timing and the run loop ------------------------------------------------------------------------
using Clock = std::chrono::steady_clock;

inline std::string ms_since(Clock::time_point t0) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f ms", std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    return text;
}

// --repeat N: the model call alone (inputs made once, outputs not converted) timed N more times
// after the call whose outputs are written: "N calls, median X ms, min Y ms".
template <class Call>
std::string time_calls(int repeat, Call call) {
    std::vector<double> ms;
    for (int i = 0; i < repeat; ++i) {
        const auto t = Clock::now();
        call();
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
    }
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    const double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    char text[96];
    std::snprintf(text, sizeof text, "%zu calls, median %.4f ms, min %.4f ms", n, median, ms.front());
    return text;
}

inline int repeat_count(const Args& args) {
    return args.options.count("--repeat") ? parse_positive_int("--repeat", args.option("--repeat", "")) : 0;
}

// Runs forward(case) -> outputs in declared order on every case through one loaded model and
// writes each output. One line per case on stdout.
template <class Forward>
int run_cases(const Declaration& decl, const std::vector<Case>& cases, Forward forward) {
    for (const Case& c : cases) {
        const auto t = Clock::now();
        const std::vector<Array> outputs = forward(c);
        const std::string run_time = ms_since(t);
        if (outputs.size() != decl.outputs.size())
            throw std::runtime_error("the model gave " + std::to_string(outputs.size()) + " outputs, it declares " +
                                     std::to_string(decl.outputs.size()));
        for (size_t i = 0; i < outputs.size(); ++i) write_npy(c.output_paths[i], outputs[i]);
        if (c.pair) {
            std::cout << c.label << " " << shape_str(c.inputs[0].shape) << " -> " << c.output_paths[0] << " "
                      << shape_str(outputs[0].shape) << " in " << run_time << "\n";
            continue;
        }
        std::cout << c.label << ":";
        for (size_t i = 0; i < c.inputs.size(); ++i)
            std::cout << (i ? ", " : " ") << decl.inputs[i].name << " " << shape_str(c.inputs[i].shape);
        std::cout << " ->";
        for (size_t i = 0; i < outputs.size(); ++i)
            std::cout << (i ? ", " : " ") << decl.outputs[i].name << " " << shape_str(outputs[i].shape);
        std::cout << " in " << run_time << "\n";
    }
    return 0;
}

}  // namespace mha
