#include <cuda_runtime_api.h>

#include "common/error.hpp"
#include "memory/cuda.hpp"

namespace kvt::cuda {

bool available() noexcept { return true; }

bool device_present(int device) noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error for later callers
    return false;
  }
  return device >= 0 && device < count;
}

kvt_status alloc(void **out, size_t bytes, int device) noexcept {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMalloc(out, bytes);
  cudaSetDevice(prev);
  if (e == cudaErrorMemoryAllocation)
    return fail(KVT_ERR_NO_MEMORY, "cudaMalloc of %zu bytes on device %d: %s", bytes, device,
                cudaGetErrorString(e));
  if (e != cudaSuccess)
    return fail(KVT_ERR_CUDA, "cudaMalloc of %zu bytes on device %d: %s", bytes, device,
                cudaGetErrorString(e));
  return KVT_OK;
}

void free(void *p, int device) noexcept {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaFree(p);
  cudaSetDevice(prev);
}

bool host_register(void *p, size_t bytes) noexcept {
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) == cudaSuccess)
    return true;
  cudaGetLastError();
  return false;
}

void host_unregister(void *p) noexcept { cudaHostUnregister(p); }

bool on_device(const void *p, int device) noexcept {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) &&
         a.device == device;
}

bool event_done(void *event) noexcept {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) cudaGetLastError();
  return true;
}

}  // namespace kvt::cuda
