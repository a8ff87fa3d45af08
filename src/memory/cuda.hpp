// The few CUDA runtime calls kvtier's memory needs. cuda_runtime.cpp implements them with
// CUDA; cuda_absent.cpp, built when CMake finds no CUDA, reports that there is none.
#pragma once

#include <cstddef>

#include "kvtier.h"

namespace kvt::cuda {

// True when the library was built with CUDA.
bool available() noexcept;

// True when the library was built with CUDA and `device` exists at run time.
bool device_present(int device) noexcept;

// Device memory on `device`; on failure returns the status and sets the message.
kvt_status alloc(void **out, size_t bytes, int device) noexcept;
void free(void *p, int device) noexcept;

// Pins host memory for fast DMA and maps it for kernels (KVT_CUDA_COPY_KERNEL); failure
// leaves it pageable and is not an error.
bool host_register(void *p, size_t bytes) noexcept;
void host_unregister(void *p) noexcept;

// True when p is device (or managed) memory that CUDA places on `device`.
bool on_device(const void *p, int device) noexcept;

// True once a recorded cudaEvent_t has completed (or failed: the wait is over either way).
bool event_done(void *event) noexcept;

}  // namespace kvt::cuda
