// kernel_bench: GPU bandwidth of kvtier's kernels (gather, scatter, quantize, dequantize) at realistic
// sizes, timed with CUDA events, against cudaMemcpy of the same bytes on the same device. Every case is
// also checked against the CPU reference on sampled blocks (all blocks with --smoke).
//
//   kernel_bench [--smoke] [--iters N]
//
// Bandwidth counts bytes read plus bytes written per call (a copy of B bytes moves 2B), for the kernels
// and for cudaMemcpy alike, so "of memcpy" compares like with like. Without CUDA or without a device it
// prints why and exits 0. Exit status 1 when a kernel fails or a check finds a wrong byte.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvtier/kernels/device.h"
#include "kvtier/kernels/gather_scatter.h"
#include "kvtier/kernels/quantize.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::kernels {
namespace {

#if KVTIER_HAVE_CUDA

#define KB_CUDA(x)                                                                           \
  do {                                                                                       \
    const cudaError_t kb_err = (x);                                                          \
    if (kb_err != cudaSuccess) {                                                             \
      std::fprintf(stderr, "kernel_bench: %s failed: %s\n", #x, cudaGetErrorString(kb_err)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

#define KB_OK(x)                                                                                     \
  do {                                                                                               \
    const KernelStatus kb_s = (x);                                                                   \
    if (!kb_s.ok()) {                                                                                \
      std::fprintf(stderr, "kernel_bench: %s failed: %d %s\n", #x, kb_s.code, kb_s.message.c_str()); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

struct Options {
  bool smoke = false;
  int iters = 20;
};

class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) { KB_CUDA(cudaMalloc(&ptr_, bytes)); }
  ~DeviceMemory() { cudaFree(ptr_); }
  DeviceMemory(DeviceMemory&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Fills device memory by tiling a random host chunk (fast, and the contents are not all equal).
void FillRandom(const DeviceMemory& mem, uint64_t seed) {
  static std::vector<unsigned char> chunk;
  if (chunk.empty()) {
    chunk.resize(8 << 20);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i + 1 < chunk.size(); i += 2) {
      float v = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      chunk[i] = static_cast<unsigned char>(bits >> 16);  // a bf16 value, little-endian
      chunk[i + 1] = static_cast<unsigned char>(bits >> 24);
    }
  }
  const size_t shift = (seed * 4099) % 1024 * 2;
  for (size_t off = 0; off < mem.bytes(); off += chunk.size() - shift) {
    const size_t n = std::min(chunk.size() - shift, mem.bytes() - off);
    KB_CUDA(cudaMemcpy(mem.get() + off, chunk.data() + shift, n, cudaMemcpyHostToDevice));
  }
}

template <typename Fn>
double TimeMs(Fn fn, int iters) {
  for (int i = 0; i < 2; ++i) fn();
  cudaEvent_t start, stop;
  KB_CUDA(cudaEventCreate(&start));
  KB_CUDA(cudaEventCreate(&stop));
  KB_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) fn();
  KB_CUDA(cudaEventRecord(stop));
  KB_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  KB_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

// cudaMemcpy device-to-device of `bytes`, in GB/s of bytes read plus written; cached per size.
double MemcpyGbps(size_t bytes, int iters) {
  static std::map<size_t, double> cache;
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  DeviceMemory a(bytes), b(bytes);
  const double ms = TimeMs([&] { KB_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice)); }, iters);
  const double gbps = 2.0 * bytes / (ms * 1e6);
  cache[bytes] = gbps;
  return gbps;
}

int g_failures = 0;

void Report(const std::string& name, double ms, double bytes_moved, double baseline_gbps, const char* baseline_name) {
  const double gbps = bytes_moved / (ms * 1e6);
  std::printf("%-58s %9.3f ms %9.1f GB/s %6.1f%% of %s\n", name.c_str(), ms, gbps, 100.0 * gbps / baseline_gbps,
              baseline_name);
  std::fflush(stdout);
}

std::vector<unsigned char> Download(const void* src, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  KB_CUDA(cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost));
  return out;
}

struct PagedCase {
  std::string name;
  PagedCacheSpec spec;
  int32_t num_blocks;
};

int64_t CacheOffset(const PagedCacheSpec& spec, int32_t kv, int32_t page) {
  return (spec.layout == EngineLayout::kKvFirst ? int64_t{kv} * spec.num_pages + page
                                                : int64_t{page} * spec.block.NumKv() + kv) *
         spec.PageBytes();
}

// Compares, run by run, sampled blocks with the cache pages the table names (the CPU reference's
// definition: gather_scatter.h). Returns the number of wrong runs.
int CheckRuns(const PagedCacheSpec& spec, const std::vector<void*>& caches, const std::vector<void*>& blocks,
              const std::vector<int32_t>& table, const std::vector<int32_t>& sample) {
  int wrong = 0;
  const int64_t pb = spec.PageBytes();
  for (int32_t b : sample) {
    const std::vector<unsigned char> block = Download(blocks[b], spec.BlockBytes());
    for (int32_t l = 0; l < spec.block.num_layers; ++l) {
      for (int32_t kv = 0; kv < spec.block.NumKv(); ++kv) {
        for (int32_t p = 0; p < spec.PagesPerBlock(); ++p) {
          const int32_t page = table[int64_t{b} * spec.PagesPerBlock() + p];
          const std::vector<unsigned char> run =
              Download(static_cast<unsigned char*>(caches[l]) + CacheOffset(spec, kv, page), pb);
          const int64_t off = ((int64_t{l} * spec.block.NumKv() + kv) * spec.PagesPerBlock() + p) * pb;
          if (std::memcmp(run.data(), block.data() + off, pb) != 0) ++wrong;
        }
      }
    }
  }
  return wrong;
}

void BenchPaged(const PagedCase& c, const Options& o) {
  const PagedCacheSpec& spec = c.spec;
  KB_OK(spec.Validate());
  std::vector<DeviceMemory> cache_mem, block_mem;
  std::vector<void*> caches, blocks;
  for (int32_t l = 0; l < spec.block.num_layers; ++l) {
    cache_mem.emplace_back(spec.LayerBytes());
    FillRandom(cache_mem.back(), l);
    caches.push_back(cache_mem.back().get());
  }
  for (int32_t b = 0; b < c.num_blocks; ++b) {
    block_mem.emplace_back(spec.BlockBytes());
    blocks.push_back(block_mem.back().get());
  }
  // Distinct pages in random order: realistic (an engine's free list is shuffled) and valid for scatter.
  std::vector<int32_t> table(spec.num_pages);
  for (int32_t i = 0; i < spec.num_pages; ++i) table[i] = i;
  std::mt19937_64 rng(7);
  std::shuffle(table.begin(), table.end(), rng);
  table.resize(int64_t{c.num_blocks} * spec.PagesPerBlock());

  const double bytes = 2.0 * spec.BlockBytes() * c.num_blocks;  // read + write
  const double base = MemcpyGbps(static_cast<size_t>(spec.BlockBytes()) * c.num_blocks, o.iters);
  std::vector<int32_t> sample;
  for (int32_t b = 0; b < c.num_blocks; ++b) {
    if (o.smoke || b == 0 || b == c.num_blocks - 1 || b == c.num_blocks / 2) sample.push_back(b);
  }
  std::vector<const void*> ccaches(caches.begin(), caches.end());
  std::vector<const void*> cblocks(blocks.begin(), blocks.end());

  double ms =
      TimeMs([&] { KB_OK(GatherCuda(spec, ccaches.data(), table.data(), c.num_blocks, blocks.data())); }, o.iters);
  Report("gather  " + c.name, ms, bytes, base, "memcpy");
  KB_CUDA(cudaDeviceSynchronize());
  int wrong = CheckRuns(spec, caches, blocks, table, sample);

  // The same with tables already on the device: the kernel alone, no staging copy.
  DeviceMemory d_caches(sizeof(void*) * caches.size()), d_blocks(sizeof(void*) * blocks.size()),
      d_table(sizeof(int32_t) * table.size());
  KB_CUDA(cudaMemcpy(d_caches.get(), caches.data(), d_caches.bytes(), cudaMemcpyHostToDevice));
  KB_CUDA(cudaMemcpy(d_blocks.get(), blocks.data(), d_blocks.bytes(), cudaMemcpyHostToDevice));
  KB_CUDA(cudaMemcpy(d_table.get(), table.data(), d_table.bytes(), cudaMemcpyHostToDevice));
  CudaLaunchOptions dev;
  dev.tables_on_device = true;
  ms = TimeMs(
      [&] {
        KB_OK(GatherCuda(spec, reinterpret_cast<const void* const*>(d_caches.get()),
                         reinterpret_cast<const int32_t*>(d_table.get()), c.num_blocks,
                         reinterpret_cast<void* const*>(d_blocks.get()), dev));
      },
      o.iters);
  Report("gather  " + c.name + " (device tables)", ms, bytes, base, "memcpy");

  // Scatter: put different bytes in the blocks first, so the check sees them move.
  for (size_t b = 0; b < block_mem.size(); ++b) FillRandom(block_mem[b], 1000 + b);
  ms = TimeMs([&] { KB_OK(ScatterCuda(spec, cblocks.data(), table.data(), c.num_blocks, caches.data())); }, o.iters);
  Report("scatter " + c.name, ms, bytes, base, "memcpy");
  KB_CUDA(cudaDeviceSynchronize());
  wrong += CheckRuns(spec, caches, blocks, table, sample);
  if (wrong != 0) {
    std::printf("  CHECK FAILED: %d runs differ from the CPU reference's layout\n", wrong);
    ++g_failures;
  }
}

// Gather straight into mapped pinned host memory (a host tier), against cudaMemcpy device-to-host.
void BenchGatherToHost(const PagedCase& c, const Options& o) {
  const PagedCacheSpec& spec = c.spec;
  std::vector<DeviceMemory> cache_mem;
  std::vector<const void*> caches;
  for (int32_t l = 0; l < spec.block.num_layers; ++l) {
    cache_mem.emplace_back(spec.LayerBytes());
    FillRandom(cache_mem.back(), l);
    caches.push_back(cache_mem.back().get());
  }
  std::vector<void*> blocks(c.num_blocks);
  for (auto& b : blocks) KB_CUDA(cudaHostAlloc(&b, spec.BlockBytes(), cudaHostAllocMapped));
  std::vector<int32_t> table(int64_t{c.num_blocks} * spec.PagesPerBlock());
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7) % spec.num_pages);
  const size_t total = static_cast<size_t>(spec.BlockBytes()) * c.num_blocks;
  // Baseline: one contiguous device-to-host copy of the same bytes into pinned memory (one way).
  DeviceMemory src(total);
  void* host = nullptr;
  KB_CUDA(cudaHostAlloc(&host, total, cudaHostAllocDefault));
  const double d2h_ms =
      TimeMs([&] { KB_CUDA(cudaMemcpyAsync(host, src.get(), total, cudaMemcpyDeviceToHost)); }, o.iters);
  const double d2h_gbps = total / (d2h_ms * 1e6);
  std::printf("%-58s %9.3f ms %9.1f GB/s (one way)\n",
              ("cudaMemcpy D2H " + std::to_string(total >> 20) + " MiB").c_str(), d2h_ms, d2h_gbps);
  const double ms =
      TimeMs([&] { KB_OK(GatherCuda(spec, caches.data(), table.data(), c.num_blocks, blocks.data())); }, o.iters);
  Report("gather  " + c.name + " -> pinned host (one way)", ms, static_cast<double>(total), d2h_gbps, "memcpy D2H");
  cudaFreeHost(host);
  for (auto& b : blocks) cudaFreeHost(b);
}

void BenchQuant(const std::string& name, const QuantSpec& spec, int32_t num_blocks, const Options& o) {
  KB_OK(spec.Validate());
  std::vector<DeviceMemory> f_mem, q_mem;
  std::vector<void*> f, q;
  for (int32_t b = 0; b < num_blocks; ++b) {
    f_mem.emplace_back(spec.FloatBlockBytes());
    FillRandom(f_mem.back(), b);
    q_mem.emplace_back(spec.QuantizedBlockBytes());
    f.push_back(f_mem.back().get());
    q.push_back(q_mem.back().get());
  }
  std::vector<const void*> cf(f.begin(), f.end()), cq(q.begin(), q.end());
  const double bytes = static_cast<double>(spec.FloatBlockBytes() + spec.QuantizedBlockBytes()) * num_blocks;
  const double base = MemcpyGbps(static_cast<size_t>(bytes / 2), o.iters);

  // Check block 0 (all with --smoke) against the CPU reference before timing (timing repeats the work).
  int wrong = 0;
  KB_OK(QuantizeCuda(spec, cf.data(), num_blocks, q.data()));
  KB_CUDA(cudaDeviceSynchronize());
  for (int32_t b = 0; b < (o.smoke ? num_blocks : 1); ++b) {
    const std::vector<unsigned char> in = Download(f[b], spec.FloatBlockBytes());
    const std::vector<unsigned char> got = Download(q[b], spec.QuantizedBlockBytes());
    std::vector<unsigned char> want(spec.QuantizedBlockBytes());
    const void* in_p = in.data();
    void* want_p = want.data();
    KB_OK(QuantizeCpu(spec, &in_p, 1, &want_p));
    if (got != want) ++wrong;
  }
  const double qms = TimeMs([&] { KB_OK(QuantizeCuda(spec, cf.data(), num_blocks, q.data())); }, o.iters);
  Report("quantize   " + name, qms, bytes, base, "memcpy");
  const double dms = TimeMs([&] { KB_OK(DequantizeCuda(spec, cq.data(), num_blocks, f.data())); }, o.iters);
  Report("dequantize " + name, dms, bytes, base, "memcpy");
  KB_CUDA(cudaDeviceSynchronize());
  for (int32_t b = 0; b < (o.smoke ? num_blocks : 1); ++b) {
    const std::vector<unsigned char> in = Download(q[b], spec.QuantizedBlockBytes());
    const std::vector<unsigned char> got = Download(f[b], spec.FloatBlockBytes());
    std::vector<unsigned char> want(spec.FloatBlockBytes());
    const void* in_p = in.data();
    void* want_p = want.data();
    KB_OK(DequantizeCpu(spec, &in_p, 1, &want_p));
    if (got != want) ++wrong;
  }
  if (wrong != 0) {
    std::printf("  CHECK FAILED: %d blocks differ from the CPU reference\n", wrong);
    ++g_failures;
  }
}

PagedCacheSpec Standard(EngineLayout layout, int32_t layers, int32_t heads, int32_t dim, int32_t page,
                        int32_t block_tokens, int32_t num_blocks) {
  PagedCacheSpec spec;
  spec.layout = layout;
  spec.block.num_layers = layers;
  spec.block.num_kv_heads = heads;
  spec.block.head_dim = dim;
  spec.block.block_tokens = block_tokens;
  spec.page_size = page;
  spec.element_bytes = 2;
  spec.num_pages = num_blocks * (block_tokens / page) * 5 / 4;
  return spec;
}

PagedCacheSpec Mla(int32_t layers, int32_t latent, int32_t page, int32_t block_tokens, int32_t num_blocks) {
  PagedCacheSpec spec;
  spec.layout = EngineLayout::kMla;
  spec.block.kind = BlockKind::kMla;
  spec.block.num_layers = layers;
  spec.block.latent_dim = latent;
  spec.block.block_tokens = block_tokens;
  spec.page_size = page;
  spec.element_bytes = 2;
  spec.num_pages = num_blocks * (block_tokens / page) * 5 / 4;
  return spec;
}

int Run(const Options& o) {
  cudaDeviceProp prop;
  KB_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("kernel_bench: %s, %.1f GiB, %d SMs, %s\n", prop.name, prop.totalGlobalMem / double(1 << 30),
              prop.multiProcessorCount, o.smoke ? "smoke sizes" : "full sizes");
  std::printf("GB/s = (bytes read + bytes written) / time; memcpy = cudaMemcpyAsync D2D of the same bytes\n");
  if (o.smoke) {
    BenchPaged({"tiny kv_first L2 H2 D64 p16 bt32 x4", Standard(EngineLayout::kKvFirst, 2, 2, 64, 16, 32, 4), 4}, o);
    BenchPaged({"tiny page_first L2 H2 D64 p16 bt32 x4", Standard(EngineLayout::kPageFirst, 2, 2, 64, 16, 32, 4), 4},
               o);
    BenchPaged({"tiny mla L2 576 p1 bt8 x4", Mla(2, 576, 1, 8, 4), 4}, o);
    BenchGatherToHost({"tiny kv_first", Standard(EngineLayout::kKvFirst, 2, 2, 64, 16, 32, 4), 4}, o);
    QuantSpec q;
    q.block = Standard(EngineLayout::kKvFirst, 2, 2, 64, 16, 32, 4).block;
    q.float_type = FloatType::kBf16;
    q.codec = QuantCodec::kFp8E4m3;
    BenchQuant("tiny bf16->fp8 g64 x4", q, 4, o);
    q.codec = QuantCodec::kInt8;
    q.quant_group_size = 24;  // generic kernels
    q.block.head_dim = 72;
    BenchQuant("tiny bf16->int8 g24 x4", q, 4, o);
  } else {
    // Llama-3.1-8B, TP 1: 32 layers, 8 KV heads of 128, vLLM pages of 16, kvtier blocks of 256 tokens.
    const int32_t n = 64;
    BenchPaged({"Llama-3.1-8B kv_first p16 bt256 x64", Standard(EngineLayout::kKvFirst, 32, 8, 128, 16, 256, n), n}, o);
    BenchPaged({"Llama-3.1-8B page_first p16 bt256 x64", Standard(EngineLayout::kPageFirst, 32, 8, 128, 16, 256, n), n},
               o);
    // DeepSeek-V3 MLA: 61 layers, latent 512 + rope 64 = 576, pages of 64 (vLLM) and of 1 (SGLang).
    BenchPaged({"DeepSeek-V3 mla p64 bt256 x16", Mla(61, 576, 64, 256, 16), 16}, o);
    BenchPaged({"DeepSeek-V3 mla p1 bt256 x16", Mla(61, 576, 1, 256, 16), 16}, o);
    BenchGatherToHost(
        {"Llama-3.1-8B kv_first p16 bt256 x8", Standard(EngineLayout::kKvFirst, 32, 8, 128, 16, 256, 8), 8}, o);
    QuantSpec q;
    q.block = Standard(EngineLayout::kKvFirst, 32, 8, 128, 16, 256, n).block;
    for (FloatType t : {FloatType::kBf16, FloatType::kFp16}) {
      for (QuantCodec codec : {QuantCodec::kFp8E4m3, QuantCodec::kInt8}) {
        q.float_type = t;
        q.codec = codec;
        q.quant_group_size = 64;
        BenchQuant(std::string("Llama-3.1-8B ") + (t == FloatType::kBf16 ? "bf16" : "fp16") + "->" +
                       (codec == QuantCodec::kInt8 ? "int8" : "fp8") + " g64 x64",
                   q, n, o);
      }
    }
    q.float_type = FloatType::kBf16;
    q.codec = QuantCodec::kFp8E4m3;
    q.quant_group_size = 128;
    BenchQuant("Llama-3.1-8B bf16->fp8 g128 x64", q, n, o);
  }
  std::printf("kernel_bench: %s\n", g_failures == 0 ? "all checks passed" : "CHECKS FAILED");
  return g_failures == 0 ? 0 : 1;
}

#endif  // KVTIER_HAVE_CUDA

}  // namespace
}  // namespace kvtier::kernels

int main(int argc, char** argv) {
  using namespace kvtier::kernels;
#if KVTIER_HAVE_CUDA
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      o.smoke = true;
      o.iters = 3;
    } else if (a == "--iters" && i + 1 < argc) {
      o.iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: kernel_bench [--smoke] [--iters N]\n");
      return 2;
    }
  }
  if (!CudaAvailable()) {
    KernelStatus why;
    DeviceCount(&why);
    std::printf("kernel_bench: no CUDA device (%s); nothing to measure\n", why.message.c_str());
    return 0;
  }
  return Run(o);
#else
  (void)argc;
  (void)argv;
  std::printf("kernel_bench: built without CUDA (flavour %s); nothing to measure\n", BuildFlavor());
  return 0;
#endif
}
