// The few CUDA runtime functions mha_ort and mha_layers call under --cuda-graph (copies between
// the host and the bound device buffers, the app's own buffers, a stream, events), found at run time in the libcudart
// that ONNX Runtime's CUDA provider has loaded: no CUDA headers or CUDA link at build time. Call
// CudaRuntime::get() only once a CUDA session exists (its provider library loaded libcudart).
// Every status is checked; a failure is one line naming the call and CUDA's own words.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "npy.hpp"

namespace mha {

class CudaRuntime {
  public:
    using Stream = void*;  // cudaStream_t
    using Event = void*;   // cudaEvent_t

    // The runtime already in the process (libcudart.so.13, else .12), else one opened here.
    // DeviceUnavailable (exit 3) when neither can be found or lacks a function.
    static const CudaRuntime& get() {
        static const CudaRuntime runtime;
        return runtime;
    }

    // Host <-> device (cudaMemcpyDefault: the pointers say which way), the device synced before
    // and after: the sessions' streams do not wait on the legacy stream cudaMemcpy uses.
    void copy(void* dst, const void* src, size_t bytes) const {
        synchronize();
        check(memcpy_(dst, src, bytes, kMemcpyDefault), "cudaMemcpy");
        synchronize();
    }
    void synchronize() const { check(device_synchronize_(), "cudaDeviceSynchronize"); }
    // DeviceUnavailable (exit 3) unless a CUDA device is usable: appending the provider loads
    // its libraries without touching a device, so a host with them and no GPU or driver ends here.
    void require_device() const {
        int count = 0;
        check(device_count_(&count), "cudaGetDeviceCount");
        if (count == 0) throw DeviceUnavailable("--cuda-graph: no CUDA device (cudaGetDeviceCount: 0)");
    }
    void* allocate(size_t bytes) const {
        void* p = nullptr;
        check(malloc_(&p, bytes), "cudaMalloc");
        return p;
    }
    void release(void* p) const { free_(p); }  // in destructors: never throws

    Stream create_stream() const {  // non-blocking: the legacy default stream does not wait on it
        Stream s = nullptr;
        check(stream_create_(&s, kStreamNonBlocking), "cudaStreamCreateWithFlags");
        return s;
    }
    Event create_event() const {
        Event e = nullptr;
        check(event_create_(&e), "cudaEventCreate");
        return e;
    }
    void record(Event e, Stream s) const { check(event_record_(e, s), "cudaEventRecord"); }
    void wait(Event e) const { check(event_synchronize_(e), "cudaEventSynchronize"); }
    float elapsed_ms(Event start, Event end) const {
        float ms = 0;
        check(event_elapsed_(&ms, start, end), "cudaEventElapsedTime");
        return ms;
    }
    void destroy(Event e) const { event_destroy_(e); }
    const std::string& library() const { return library_; }

  private:
    static constexpr int kMemcpyDefault = 4;      // cudaMemcpyDefault
    static constexpr unsigned kStreamNonBlocking = 1;  // cudaStreamNonBlocking

    CudaRuntime() {
        const char* const names[] = {"libcudart.so.13", "libcudart.so.12"};
        void* handle = nullptr;
        for (int flags : {RTLD_NOW | RTLD_NOLOAD, RTLD_NOW})
            for (const char* name : names)
                if (!handle && (handle = dlopen(name, flags))) library_ = name;
        if (!handle) {
            const char* why = dlerror();
            throw DeviceUnavailable("--cuda-graph: the CUDA runtime (libcudart.so.13 or .12) is not loaded "
                                    "and cannot be opened (" + std::string(why ? why : "not found") + ")");
        }
        find(handle, "cudaMemcpy", memcpy_);
        find(handle, "cudaDeviceSynchronize", device_synchronize_);
        find(handle, "cudaGetDeviceCount", device_count_);
        find(handle, "cudaMalloc", malloc_);
        find(handle, "cudaFree", free_);
        find(handle, "cudaGetErrorString", error_string_);
        find(handle, "cudaStreamCreateWithFlags", stream_create_);
        find(handle, "cudaEventCreate", event_create_);
        find(handle, "cudaEventRecord", event_record_);
        find(handle, "cudaEventSynchronize", event_synchronize_);
        find(handle, "cudaEventElapsedTime", event_elapsed_);
        find(handle, "cudaEventDestroy", event_destroy_);
    }

    template <class F>
    void find(void* handle, const char* name, F& fn) {
        fn = reinterpret_cast<F>(dlsym(handle, name));
        if (!fn) throw DeviceUnavailable("--cuda-graph: " + library_ + " has no " + name);
    }

    // A failed call is one line naming it and CUDA's words; no usable device or driver is
    // DeviceUnavailable (exit 3), anything else a runtime failure (exit 1).
    void check(int status, const char* call) const {
        if (status == 0) return;
        const std::string what = std::string(call) + " failed: CUDA error " + std::to_string(status) + " (" +
                                 error_string_(status) + ")";
        // initialization, stub library, insufficient driver, devices unavailable, no device,
        // system not ready, driver mismatch, compat not supported (driver_types.h, CUDA 13.0)
        for (int unavailable : {3, 34, 35, 46, 100, 802, 803, 804})
            if (status == unavailable) throw DeviceUnavailable("--cuda-graph: " + what);
        throw std::runtime_error(what);
    }

    std::string library_;
    int (*memcpy_)(void*, const void*, size_t, int) = nullptr;
    int (*device_synchronize_)() = nullptr;
    int (*device_count_)(int*) = nullptr;
    int (*malloc_)(void**, size_t) = nullptr;
    int (*free_)(void*) = nullptr;
    const char* (*error_string_)(int) = nullptr;
    int (*stream_create_)(Stream*, unsigned) = nullptr;
    int (*event_create_)(Event*) = nullptr;
    int (*event_record_)(Event, Stream) = nullptr;
    int (*event_synchronize_)(Event) = nullptr;
    int (*event_elapsed_)(float*, Event, Event) = nullptr;
    int (*event_destroy_)(Event) = nullptr;
};

}  // namespace mha
