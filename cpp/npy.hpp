// Shared by mha_ort and mha_torch: float32 .npy files in and out, argument parsing, and the exit
// codes of the Python CLI.
//
//   exit 0  success
//   exit 1  unexpected runtime failure (an error inside ONNX Runtime / libtorch while running)
//   exit 2  bad input: missing or unreadable file, not an .npy, wrong dtype / rank / width, a
//           model file that does not load, bad arguments                    (UsageError)
//   exit 3  the requested device cannot run here (--provider cuda / --device cuda without a
//           working CUDA): never silently replaced by the CPU               (DeviceUnavailable)
//
// Every error is one line on stderr: "Error: <what>".
#pragma once

#include <cctype>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
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

// ---- command line: MODEL IN OUT [IN OUT ...] [--opt value] [--flag] --------------------------

struct Args {
    std::string model;
    std::vector<std::pair<std::string, std::string>> pairs;  // (input .npy, output .npy)
    std::map<std::string, std::string> options;               // "--threads" -> "4"
    std::set<std::string> flags;                              // "--info"

    std::string option(const std::string& name, const std::string& fallback) const {
        auto it = options.find(name);
        return it == options.end() ? fallback : it->second;
    }
    bool flag(const std::string& name) const { return flags.count(name) > 0; }
};

// valued: options that take a value; flags: options that do not. With a flag in no_pairs_flags
// (e.g. --info) the input/output pairs may be left out.
inline Args parse_args(int argc, char** argv, const std::string& usage,
                       const std::set<std::string>& valued, const std::set<std::string>& flags,
                       const std::set<std::string>& no_pairs_flags = {}) {
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
                throw UsageError("unknown option " + arg + " (" + usage.substr(0, usage.find('\n')) + ")");
            }
        } else {
            positional.push_back(arg);
        }
    }
    bool pairs_optional = false;
    for (const auto& f : no_pairs_flags) pairs_optional = pairs_optional || a.flag(f);
    if (positional.empty()) throw UsageError("missing MODEL (" + usage.substr(0, usage.find('\n')) + ")");
    a.model = positional[0];
    if (positional.size() % 2 == 0)
        throw UsageError("inputs and outputs come in pairs: IN.npy OUT.npy, got an odd one out: " +
                         positional.back());
    if (positional.size() == 1 && !pairs_optional)
        throw UsageError("missing IN.npy OUT.npy (" + usage.substr(0, usage.find('\n')) + ")");
    for (size_t i = 1; i + 1 < positional.size(); i += 2) a.pairs.emplace_back(positional[i], positional[i + 1]);
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
}

// ---- float32 .npy (NumPy format 1.0 / 2.0 / 3.0, little-endian '<f4', C order, rank 3) --------

struct Array {
    std::vector<int64_t> shape;
    std::vector<float> data;  // C order

    int64_t dim(size_t i) const { return shape.at(i); }
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

}  // namespace detail

// Reads a float32 array of the given rank; every failure is a one-line UsageError.
inline Array read_npy(const std::string& path, size_t rank = 3) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError("input not found or unreadable: " + path + " (" + std::strerror(errno) + ")");
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
    if (descr != "'<f4'")
        throw UsageError(path + ": dtype " + descr + " is not float32 ('<f4'): save with "
                         "np.save(path, x.astype(np.float32))");
    if (detail::dict_value(header, "fortran_order", path) != "False")
        throw UsageError(path + ": Fortran-ordered array: save a C-ordered one (np.ascontiguousarray)");
    const std::string shape_text = detail::dict_value(header, "shape", path);
    if (shape_text.front() != '(') throw UsageError(path + ": bad shape in .npy header");

    Array a;
    a.shape = detail::parse_shape(shape_text, path);
    if (a.shape.size() != rank)
        throw UsageError(path + ": expected a rank-" + std::to_string(rank) + " array [batch, seq, width], got shape " +
                         shape_str(a.shape));
    int64_t count = 1;
    for (int64_t d : a.shape) {
        if (d == 0) throw UsageError(path + ": empty array, shape " + shape_str(a.shape));
        if (count > (int64_t{1} << 40) / d) throw UsageError(path + ": array too large " + shape_str(a.shape));
        count *= d;
    }
    a.data.resize(static_cast<size_t>(count));
    f.read(reinterpret_cast<char*>(a.data.data()), count * static_cast<int64_t>(sizeof(float)));
    if (f.gcount() != count * static_cast<int64_t>(sizeof(float)))
        throw UsageError(path + ": truncated data: shape " + shape_str(a.shape) + " needs " +
                         std::to_string(count * 4) + " bytes");
    if (!detail::little_endian_host()) throw UsageError("big-endian hosts are not supported");
    return a;
}

// Writes a float32 C-ordered array (format 1.0) via a temporary file renamed into place, so a
// failure never leaves a partial OUT.npy.
inline void write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
    std::ostringstream dict;
    dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
    for (size_t i = 0; i < shape.size(); ++i) dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    dict << "), }";
    std::string header = dict.str();
    const size_t preamble = 10;  // magic (6) + version (2) + header length (2)
    header.append(64 - (preamble + header.size() + 1) % 64, ' ');  // pad: data 64-byte aligned
    header.push_back('\n');
    const int64_t count = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());

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
        f.write(reinterpret_cast<const char*>(data), count * static_cast<int64_t>(sizeof(float)));
        if (!f) {
            std::remove(tmp.c_str());
            throw UsageError("cannot write " + path + " (disk full?)");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw UsageError("cannot write " + path + " (" + std::strerror(errno) + ")");
    }
}

// --- shared by both programs: timing, the width check and the IN -> OUT loop ----------------------
using Clock = std::chrono::steady_clock;

inline std::string ms_since(Clock::time_point t0) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f ms", std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    return text;
}

using Pairs = std::vector<std::pair<std::string, std::string>>;

// Every input's last dimension must be the model's input width (skipped when that is unknown, -1).
inline void check_widths(const Pairs& pairs, const std::vector<Array>& inputs, int64_t width) {
    for (size_t i = 0; i < inputs.size(); ++i)
        if (width >= 0 && inputs[i].shape[2] != width)
            throw UsageError(pairs[i].first + ": width " + std::to_string(inputs[i].shape[2]) +
                             " does not match the model's input width " + std::to_string(width) +
                             " (shape " + shape_str(inputs[i].shape) + ")");
}

// Runs forward(input, input path) on every pair through one loaded model and writes each output.
template <class Forward>
int run_pairs(const Pairs& pairs, std::vector<Array>& inputs, Forward forward) {
    for (size_t i = 0; i < inputs.size(); ++i) {
        const auto t = Clock::now();
        const Array y = forward(inputs[i], pairs[i].first);
        const std::string run_time = ms_since(t);
        write_npy(pairs[i].second, y.shape, y.data.data());
        std::cout << pairs[i].first << " " << shape_str(inputs[i].shape) << " -> " << pairs[i].second << " "
                  << shape_str(y.shape) << " in " << run_time << "\n";
    }
    return 0;
}

}  // namespace mha
