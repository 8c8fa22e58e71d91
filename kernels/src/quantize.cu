// quantize/dequantize kernels. The arithmetic is quantize.h's, in the same fp32 order as
// quantize_cpu.cc (IEEE division and reciprocal, no fused multiply-add, round to nearest even), so
// the CUDA and CPU results are bit-identical.
//   Vec8 kernels (8 divides the group; for quantize also group / 8 a power of two <= 32): a thread owns
//     8 consecutive elements (one 16-byte float load, one 8-byte code store); the group's max is
//     reduced over its group / 8 lanes with warp shuffles.
//   Generic kernels (any group size and alignment): a warp per group (quantize), a thread per element
//     (dequantize), with byte-wise loads and stores.
// Grid: x over a block's vectors or groups, y over blocks (grid-striding past 65535 blocks).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "quantize_launch.h"

namespace kvtier::kernels::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxGridY = 65535;

__device__ __forceinline__ float MinScale() { return __int_as_float(0x00800000); }  // 2^-126

__device__ __forceinline__ bool Aligned(const void* p, unsigned long long n) {
  return (reinterpret_cast<unsigned long long>(p) & (n - 1)) == 0;
}

__device__ __forceinline__ uint4 Load16(const unsigned char* p) {
  if (Aligned(p, 16)) return *reinterpret_cast<const uint4*>(p);
  uint4 v;
  memcpy(&v, p, 16);
  return v;
}

__device__ __forceinline__ void Store16(unsigned char* p, uint4 v) {
  if (Aligned(p, 16)) {
    *reinterpret_cast<uint4*>(p) = v;
  } else {
    memcpy(p, &v, 16);
  }
}

__device__ __forceinline__ uint2 Load8(const unsigned char* p) {
  if (Aligned(p, 8)) return *reinterpret_cast<const uint2*>(p);
  uint2 v;
  memcpy(&v, p, 8);
  return v;
}

__device__ __forceinline__ void Store8(unsigned char* p, uint2 v) {
  if (Aligned(p, 8)) {
    *reinterpret_cast<uint2*>(p) = v;
  } else {
    memcpy(p, &v, 8);
  }
}

__device__ __forceinline__ float LoadF32(const unsigned char* p) {
  if (Aligned(p, 4)) return *reinterpret_cast<const float*>(p);
  float v;
  memcpy(&v, p, 4);
  return v;
}

__device__ __forceinline__ void StoreF32(unsigned char* p, float v) {
  if (Aligned(p, 4)) {
    *reinterpret_cast<float*>(p) = v;
  } else {
    memcpy(p, &v, 4);
  }
}

// One 16-bit float (raw bits) -> fp32, exactly.
template <bool kBf16>
__device__ __forceinline__ float BitsToF32(unsigned int bits16) {
  if (kBf16) return __uint_as_float(bits16 << 16);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

// fp32 -> one 16-bit float (raw bits), round to nearest even.
template <bool kBf16>
__device__ __forceinline__ unsigned int F32ToBits(float v) {
  if (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  return __half_as_ushort(__float2half_rn(v));
}

// Clamped, scaled value -> one code byte.
template <bool kFp8>
__device__ __forceinline__ unsigned int Encode(float y) {
  if (kFp8) return __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
  return static_cast<unsigned int>(__float2int_rn(y)) & 0xFFu;
}

// One code byte -> fp32, exactly (every e4m3 value is an fp16 value).
template <bool kFp8>
__device__ __forceinline__ float Decode(unsigned int code) {
  if (kFp8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
    return __half2float(__half(h));
  }
  return static_cast<float>(static_cast<signed char>(code));
}

template <bool kFp8>
__device__ __forceinline__ void ScaleFromMax(float amax, float* scale, float* inv) {
  const float qmax = kFp8 ? 448.0f : 127.0f;
  *scale = 0.0f;
  *inv = 0.0f;
  if (amax > 0.0f) {
    *scale = fmaxf(__fdiv_rn(amax, qmax), MinScale());
    *inv = __fdiv_rn(1.0f, *scale);
  }
}

template <bool kFp8>
__device__ __forceinline__ unsigned int Quantize(float x, float inv) {
  const float qmax = kFp8 ? 448.0f : 127.0f;
  return Encode<kFp8>(fminf(fmaxf(__fmul_rn(x, inv), -qmax), qmax));
}

template <bool kBf16, bool kFp8>
__global__ void __launch_bounds__(kThreads) QuantizeVec8Kernel(QuantParams p) {
  const long long nvec = p.num_elements / 8;
  const int lanes = p.group / 8;  // a power of two <= 32: groups never straddle a warp
  const long long v = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  const bool active = v < nvec;
  for (int b = blockIdx.y; b < p.num_blocks; b += gridDim.y) {
    const unsigned char* in = static_cast<const unsigned char*>(p.in_blocks[b]);
    unsigned char* out = static_cast<unsigned char*>(p.out_blocks[b]);
    if (in == nullptr || out == nullptr) continue;  // the same for the whole CTA
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    if (active) raw = Load16(in + v * 16);
    const unsigned int words[4] = {raw.x, raw.y, raw.z, raw.w};
    float x[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = BitsToF32<kBf16>(words[i] & 0xFFFFu);
      x[2 * i + 1] = BitsToF32<kBf16>(words[i] >> 16);
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
    for (int o = lanes >> 1; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    float scale, inv;
    ScaleFromMax<kFp8>(amax, &scale, &inv);
    if (!active) continue;
    unsigned int packed[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) packed[i / 4] |= Quantize<kFp8>(x[i], inv) << (8 * (i % 4));
    Store8(out + v * 8, make_uint2(packed[0], packed[1]));
    if ((v & (lanes - 1)) == 0) StoreF32(out + p.num_elements + (v / lanes) * 4, scale);
  }
}

template <bool kBf16, bool kFp8>
__global__ void __launch_bounds__(kThreads) DequantizeVec8Kernel(QuantParams p) {
  const long long nvec = p.num_elements / 8;
  const long long v = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (v >= nvec) return;
  const long long vec_per_group = p.group / 8;
  for (int b = blockIdx.y; b < p.num_blocks; b += gridDim.y) {
    const unsigned char* in = static_cast<const unsigned char*>(p.in_blocks[b]);
    unsigned char* out = static_cast<unsigned char*>(p.out_blocks[b]);
    if (in == nullptr || out == nullptr) continue;
    const uint2 codes = Load8(in + v * 8);
    const float scale = LoadF32(in + p.num_elements + (v / vec_per_group) * 4);
    unsigned int words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int c = (i < 2 ? codes.x : codes.y) >> (16 * (i % 2));
      const float lo = __fmul_rn(Decode<kFp8>(c & 0xFFu), scale);
      const float hi = __fmul_rn(Decode<kFp8>((c >> 8) & 0xFFu), scale);
      words[i] = F32ToBits<kBf16>(lo) | (F32ToBits<kBf16>(hi) << 16);
    }
    Store16(out + v * 16, make_uint4(words[0], words[1], words[2], words[3]));
  }
}

template <bool kBf16>
__device__ __forceinline__ float LoadElement(const unsigned char* p) {
  return BitsToF32<kBf16>(static_cast<unsigned int>(p[0]) | (static_cast<unsigned int>(p[1]) << 8));
}

template <bool kBf16, bool kFp8>
__global__ void __launch_bounds__(kThreads) QuantizeWarpKernel(QuantParams p) {
  const int lane = threadIdx.x & 31;
  const long long warp = (static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const long long warps = (static_cast<long long>(gridDim.x) * kThreads) >> 5;
  const long long groups = p.num_elements / p.group;
  for (int b = blockIdx.y; b < p.num_blocks; b += gridDim.y) {
    const unsigned char* in = static_cast<const unsigned char*>(p.in_blocks[b]);
    unsigned char* out = static_cast<unsigned char*>(p.out_blocks[b]);
    if (in == nullptr || out == nullptr) continue;
    for (long long g = warp; g < groups; g += warps) {  // the same for the whole warp
      const unsigned char* x = in + g * p.group * 2;
      float amax = 0.0f;
      for (int i = lane; i < p.group; i += 32) amax = fmaxf(amax, fabsf(LoadElement<kBf16>(x + 2 * i)));
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
      float scale, inv;
      ScaleFromMax<kFp8>(amax, &scale, &inv);
      unsigned char* q = out + g * p.group;
      for (int i = lane; i < p.group; i += 32) {
        q[i] = static_cast<unsigned char>(Quantize<kFp8>(LoadElement<kBf16>(x + 2 * i), inv));
      }
      if (lane == 0) StoreF32(out + p.num_elements + g * 4, scale);
    }
  }
}

template <bool kBf16, bool kFp8>
__global__ void __launch_bounds__(kThreads) DequantizeScalarKernel(QuantParams p) {
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (int b = blockIdx.y; b < p.num_blocks; b += gridDim.y) {
    const unsigned char* in = static_cast<const unsigned char*>(p.in_blocks[b]);
    unsigned char* out = static_cast<unsigned char*>(p.out_blocks[b]);
    if (in == nullptr || out == nullptr) continue;
    for (long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; i < p.num_elements; i += stride) {
      const float scale = LoadF32(in + p.num_elements + (i / p.group) * 4);
      const unsigned int bits = F32ToBits<kBf16>(__fmul_rn(Decode<kFp8>(in[i]), scale));
      out[2 * i] = static_cast<unsigned char>(bits & 0xFFu);
      out[2 * i + 1] = static_cast<unsigned char>(bits >> 8);
    }
  }
}

unsigned int GridY(int num_blocks) {
  return static_cast<unsigned int>(num_blocks < kMaxGridY ? num_blocks : kMaxGridY);
}

unsigned int GridX(long long items_per_block, long long items_per_cta) {
  long long x = (items_per_block + items_per_cta - 1) / items_per_cta;
  if (x < 1) x = 1;
  if (x > (1LL << 30)) x = 1LL << 30;
  return static_cast<unsigned int>(x);
}

template <bool kBf16, bool kFp8>
void QuantizeTyped(const QuantParams& p, cudaStream_t stream) {
  const int lanes = p.group / 8;
  if (p.group % 8 == 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0) {
    const dim3 grid(GridX(p.num_elements / 8, kThreads), GridY(p.num_blocks));
    QuantizeVec8Kernel<kBf16, kFp8><<<grid, kThreads, 0, stream>>>(p);
  } else {
    const long long groups = p.num_elements / p.group;
    const unsigned int x = GridX(groups, kThreads / 32);  // 8 warps per CTA, a group per warp
    const dim3 grid(x > (1u << 20) ? (1u << 20) : x, GridY(p.num_blocks));
    QuantizeWarpKernel<kBf16, kFp8><<<grid, kThreads, 0, stream>>>(p);
  }
}

template <bool kBf16, bool kFp8>
void DequantizeTyped(const QuantParams& p, cudaStream_t stream) {
  if (p.group % 8 == 0) {
    const dim3 grid(GridX(p.num_elements / 8, kThreads), GridY(p.num_blocks));
    DequantizeVec8Kernel<kBf16, kFp8><<<grid, kThreads, 0, stream>>>(p);
  } else {
    const unsigned int x = GridX(p.num_elements, kThreads);
    const dim3 grid(x > (1u << 20) ? (1u << 20) : x, GridY(p.num_blocks));
    DequantizeScalarKernel<kBf16, kFp8><<<grid, kThreads, 0, stream>>>(p);
  }
}

}  // namespace

cudaError_t LaunchQuantize(const QuantParams& p, cudaStream_t stream) {
  if (p.num_blocks == 0 || p.num_elements == 0) return cudaSuccess;
  if (p.bf16) {
    p.fp8 ? QuantizeTyped<true, true>(p, stream) : QuantizeTyped<true, false>(p, stream);
  } else {
    p.fp8 ? QuantizeTyped<false, true>(p, stream) : QuantizeTyped<false, false>(p, stream);
  }
  return cudaGetLastError();
}

cudaError_t LaunchDequantize(const QuantParams& p, cudaStream_t stream) {
  if (p.num_blocks == 0 || p.num_elements == 0) return cudaSuccess;
  if (p.bf16) {
    p.fp8 ? DequantizeTyped<true, true>(p, stream) : DequantizeTyped<true, false>(p, stream);
  } else {
    p.fp8 ? DequantizeTyped<false, true>(p, stream) : DequantizeTyped<false, false>(p, stream);
  }
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::internal
