// GPU backend core: device selection and the warp-size check, the stream, the caching memory
// pool behind alloc/free and every temporary, host<->device copies, bf16 operand staging, and
// the factory. Passed on an H100.
#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/gpu_gemv.h"
#include "backend/cuda/gpu_grouped_gemm.h"
#include "core/log.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

namespace zaya {

namespace {

__global__ void k_report_warp_size(int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *out = GPU_WARP_SIZE;
}

int64_t round_bytes(int64_t bytes) {
  if (bytes < 1) bytes = 1;
  return (bytes + 255) / 256 * 256;
}

}  // namespace

DeviceBuffer::DeviceBuffer(CudaBackend* be, int64_t bytes) : be_(be), p_(be->pool_get(bytes)) {}
DeviceBuffer::~DeviceBuffer() {
  if (p_) be_->pool_put(p_);
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) be_->pool_put(p_);
    be_ = o.be_;
    p_ = o.p_;
    o.p_ = nullptr;
  }
  return *this;
}

CudaBackend::CudaBackend(const CudaBackendOptions& options)
    : options_(options), staging_(options.upload_staging_chunk_bytes, options.upload_staging_chunks) {
  if (options_.upload_staging_chunks != 0 && !staging_.valid())  // before anything is allocated
    fail("cuda", "upload staging of " + std::to_string(options_.upload_staging_chunks) + " chunks of " +
                     std::to_string(options_.upload_staging_chunk_bytes) + " bytes",
         "expected at least 2 chunks of a positive multiple of 16 bytes, or 0 chunks (off)");
  int count = 0;
  if (gpuGetDeviceCount(&count) != gpuSuccess || count == 0)
    fail("cuda", "no GPU device is available", "run on a machine with a GPU, or use the cpu backend");
  if (options_.device < 0 || options_.device >= count)
    fail("cuda", "device " + std::to_string(options_.device) + " does not exist (" + std::to_string(count) + " found)");
  GPU_CHECK(gpuSetDevice(options_.device));
  GPU_CHECK(gpuStreamCreate(&stream_));
  // The kernels' compile-time warp size must match the device's (wave32 vs wave64 on AMD).
  const int host_warp = gpu_device_warp_size(options_.device);
  {
    DeviceBuffer w(this, 4);
    gpu_launch(k_report_warp_size, 1, 1, 0, stream_, w.i());
    GPU_LAUNCH_CHECK();
    int dev_warp = 0;
    GPU_CHECK(gpuMemcpyAsync(&dev_warp, w.i(), 4, gpuMemcpyDeviceToHost, stream_));
    GPU_CHECK(gpuStreamSynchronize(stream_));
    if (dev_warp != host_warp)
      fail("cuda", "kernels were compiled for warp size " + std::to_string(dev_warp) + " but the device reports " +
                       std::to_string(host_warp),
           "rebuild for this device's architecture");
    warp_size_ = host_warp;
  }
#if defined(ZAYA_GPU_MMA_SYNC)
  // bf16 WMMA: an sm_80 or newer device running code compiled for sm_80 or newer (a build for
  // older targets only, JIT-compiled here, has the WMMA path compiled out to a trap), unless the
  // portable kernels are asked for.
  wmma_ = !options_.portable_gemm && gpu_device_compute_major(options_.device) >= 8 &&
          grouped_gemm_compiled_arch() >= 80;
  max_shared_per_block_ = gpu_device_max_shared_per_block(options_.device);
#endif
  multiprocessors_ = gpu_device_multiprocessors(options_.device);
  start_upload_staging();
  gemm_ = std::make_unique<GpuGemm>(stream_, options_.portable_gemm);
  if (wmma_ && options_.bf16_matmul && (options_.attention_flash_tc || options_.moe_device_grouped))
    check_mma_sync_at_start();
}

// The mma.sync kernels run only where their primitives agree with plain products on this device
// (gpu_mma_check.cu: one warp, a few microseconds). A disagreement keeps them off with a warning
// rather than training on wrong products. Only when a path that uses them is asked for: the
// default paths never depend on the check.
void CudaBackend::check_mma_sync_at_start() {
  std::vector<std::string> mismatches;
  try {
    mismatches = check_mma_primitives(0x7a617961u);
  } catch (const Error& e) {
    fail("cuda", "the start-up check of the tensor-core (mma.sync) primitives did not run: " + e.message(),
         "unset ZAYA_ATTN_FLASH and ZAYA_MOE_DEVICE_GROUPED to train without the kernels that use them");
  }
  mma_sync_ok_ = mismatches.empty();
  if (mma_sync_ok_) {
    mma_check_ = "agree with plain products";
    return;
  }
  mma_check_ = "disagree with plain products (" + mismatches.front() + "): flash attention and pipelined grouped GEMMs off";
  std::string all;
  for (const auto& m : mismatches) all += "\n  " + m;
  log::warn("cuda: the tensor-core (mma.sync) primitives disagree with plain products on this GPU, so the flash "
            "attention (ZAYA_ATTN_FLASH) and the pipelined grouped GEMMs (ZAYA_MOE_DEVICE_GROUPED) stay off and "
            "their GEMM-engine and WMMA paths serve instead:" + all);
}

CudaBackend::~CudaBackend() {
  {  // the shadows' buffers go back to the pool first (moved out: pool_put looks at shadows_)
    auto dying = std::move(shadows_);
    shadows_.clear();
    shadow_keys_.clear();
  }
  upload_cache_.clear();
  if (stream_) (void)gpuStreamSynchronize(stream_);
  for (gpuEvent_t e : staging_events_) (void)gpuEventDestroy(e);
  if (staging_buffer_) (void)gpuFreeHost(staging_buffer_);
  gemm_.reset();
  for (auto& kv : live_) (void)gpuFree(kv.first);
  for (auto& kv : free_) (void)gpuFree(kv.second);
  if (stream_) (void)gpuStreamDestroy(stream_);
}

// ---- the caching pool: blocks are reused in stream order (one stream), never freed early ----

void* CudaBackend::pool_get(int64_t bytes) {
  bytes = round_bytes(bytes);
  auto it = free_.lower_bound(bytes);
  if (it != free_.end() && it->first <= 2 * bytes) {  // best fit, at most 2x waste
    void* p = it->second;
    live_[p] = it->first;
    free_.erase(it);
    return p;
  }
  void* p = nullptr;
  if (gpuMalloc(&p, size_t(bytes)) != gpuSuccess) {
    (void)gpuGetLastError();
    release_free_blocks();
    const gpuError_t again = gpuMalloc(&p, size_t(bytes));
    if (again == gpuErrorMemoryAllocation) fail_out_of_memory(bytes);
    GPU_CHECK(again);
  }
  live_[p] = bytes;
  reserved_bytes_ += bytes;
  peak_reserved_bytes_ = std::max(peak_reserved_bytes_, reserved_bytes_);
  return p;
}

void CudaBackend::fail_out_of_memory(int64_t bytes) {
  (void)gpuGetLastError();
  const auto gib = [](double b) {  // GiB, or MiB below one GiB
    char s[32];
    if (b < double(int64_t(1) << 30))
      std::snprintf(s, sizeof(s), "%.1f MiB", b / double(1 << 20));
    else
      std::snprintf(s, sizeof(s), "%.2f GiB", b / double(int64_t(1) << 30));
    return std::string(s);
  };
  size_t free_bytes = 0, total_bytes = 0;
  const bool known = gpuMemGetInfo(&free_bytes, &total_bytes) == gpuSuccess;
  (void)gpuGetLastError();
  fail("cuda",
       "out of device memory on GPU " + std::to_string(options_.device) + ": " + gib(double(bytes)) +
           " asked for while zaya holds " + gib(double(reserved_bytes_)) + " (at most " +
           gib(double(peak_reserved_bytes_)) + " so far)" +
           (known ? "; the device has " + gib(double(free_bytes)) + " free of " + gib(double(total_bytes)) : ""),
       "hold less at once: in training a smaller batch.micro_batch or data.seq_len, or "
       "batch.recompute_activations = true (docs/training.md, \"Activation memory\"); in serving or "
       "generation a smaller batch or context");
}

void CudaBackend::pool_put(void* p) {
  if (!p) return;
  auto it = live_.find(p);
  ZAYA_CHECK(it != live_.end(), "cuda free: pointer was not allocated by this backend");
  const int64_t bytes = it->second;
  free_.emplace(bytes, p);
  live_.erase(it);
  drop_shadows_over(p, bytes);
}

void CudaBackend::release_free_blocks() {
  GPU_CHECK(gpuStreamSynchronize(stream_));
  for (auto& kv : free_) {
    GPU_CHECK(gpuFree(kv.second));
    reserved_bytes_ -= kv.first;
  }
  free_.clear();
}

float* CudaBackend::alloc(int64_t n) { return static_cast<float*>(pool_get(n * 4)); }
void CudaBackend::free(void* p) { pool_put(p); }

std::string CudaBackend::diagnostics() const {
  return std::string("gemm engine ") + gemm_->engine() + ", " + std::to_string(gemm_->plans_built()) +
         " GEMM plans built in " + std::to_string(gemm_->plan_seconds()) + " s of host time, " +
         std::to_string(gemm_->ragged_fallbacks()) + " ragged-plan and " +
         std::to_string(gemm_->epilogue_fallbacks()) + " bias-epilogue fallbacks, MoE experts " +
         (options_.moe_device_grouped && options_.bf16_matmul ? std::string("as device-grouped GEMMs")
          : options_.bf16_matmul && options_.moe_few_rows_gemv ? "per expert from host offsets (calls of up to " +
                                       std::to_string(kGroupedGemvMaxRows) + " tokens as device GEMVs)"
                                 : std::string("per expert from host offsets")) +
         (options_.linear_few_rows_gemv
              ? ", linears of up to " + std::to_string(kLinearGemvMaxRows) + " rows as device GEMVs"
              : std::string()) +
         (lm_head_tf32x3() ? ", LM head 3xTF32" : ", LM head exact fp32") + ", Newton-Schulz " +
         (newton_schulz_bf16_iterates() ? "bf16 with bf16 iterates (" + std::to_string(bf16_out_fallbacks_) +
                                              " GEMMs the fp32 way)"
          : newton_schulz_bf16()   ? std::string("bf16")
          : options_.bf16_matmul   ? std::string("TF32")
                                   : std::string("exact fp32")) + ", attention " +
         (attention_flash_tc_enabled() ? "forward and backward flash on the tensor cores" : "through the GEMM engine") +
         ", mma.sync primitives " + mma_check_ +
         ", decode attention keys split " +
         (options_.attention_key_splits > 0 ? "in " + std::to_string(options_.attention_key_splits)
                                             : std::string("by size")) +
         " on " + std::to_string(multiprocessors_) + " multiprocessors, " +
         std::to_string(shadows_built_) + " bf16 weight shadows built (" + std::to_string(shadows_.size()) +
         " held, " + std::to_string(shadow_bytes_) + " bytes; " + std::to_string(shadows_declined_) +
         " declined over the budget), " + std::to_string(uploads_reused_) + " position uploads reused (" +
         std::to_string(uploads_cached_) + " made), " +
         (staging_buffer_ != nullptr ? std::to_string(uploads_staged_) + " uploads staged in " +
                                           std::to_string(staging_.bytes()) + " pinned bytes (" +
                                           std::to_string(staging_waits_) + " waits for the ring)"
                                     : std::string("uploads from pageable memory"));
}

void CudaBackend::synchronize() { GPU_CHECK(gpuStreamSynchronize(stream_)); }

void CudaBackend::start_upload_staging() {
  if (!staging_.valid()) return;  // off (the constructor refused any other invalid ring)
  void* p = nullptr;
  if (gpuMallocHost(&p, size_t(staging_.bytes())) != gpuSuccess) {
    (void)gpuGetLastError();  // no pinned memory: uploads copy from the caller's memory
    return;
  }
  staging_buffer_ = static_cast<unsigned char*>(p);
  staging_events_.resize(size_t(staging_.chunks()), nullptr);
  for (gpuEvent_t& e : staging_events_) GPU_CHECK(gpuEventCreateWithFlags(&e, gpuEventDisableTiming));
}

void* CudaBackend::stage_upload(const void* host, int64_t bytes) {
  const StagingRing::Place place = staging_.reserve(bytes);
  if (place.left >= 0) GPU_CHECK(gpuEventRecord(staging_events_[size_t(place.left)], stream_));
  if (place.wait) {  // back at a chunk: its earlier copies must have run before it is rewritten
    gpuEvent_t e = staging_events_[size_t(place.chunk)];
    const gpuError_t done = gpuEventQuery(e);
    if (done == gpuErrorNotReady) {
      (void)gpuGetLastError();  // HIP keeps "not ready" as the last error, which the next launch check would report
      ++staging_waits_;
      GPU_CHECK(gpuEventSynchronize(e));
    } else {
      GPU_CHECK(done);
    }
  }
  unsigned char* staged = staging_buffer_ + place.offset;
  std::memcpy(staged, host, size_t(bytes));
  ++uploads_staged_;
  return staged;
}

void CudaBackend::copy_to_device(void* dst, const void* host, int64_t bytes) {
  if (bytes <= 0) return;
  if (staging_buffer_ != nullptr && bytes <= staging_.chunk_bytes()) {
    GPU_CHECK(gpuMemcpyAsync(dst, stage_upload(host, bytes), size_t(bytes), gpuMemcpyHostToDevice, stream_));
    return;
  }
  GPU_CHECK(gpuMemcpyAsync(dst, host, size_t(bytes), gpuMemcpyHostToDevice, stream_));
#if defined(ZAYA_GPU_HIP)
  synchronize();  // HIP's pageable async copies: do not rely on staging semantics
#endif
}

DeviceBuffer CudaBackend::upload(const void* host, int64_t bytes) {
  DeviceBuffer b(this, bytes);
  copy_to_device(b.f(), host, bytes);
  return b;
}

const void* CudaBackend::upload_reused(const void* host, int64_t bytes, DeviceBuffer& holder) {
  if (bytes <= 0 || bytes > kUploadCacheMaxBytes) {
    holder = upload(host, bytes);
    return holder.f();
  }
  const auto* h = static_cast<const unsigned char*>(host);
  ++upload_clock_;
  ReusedUpload* slot = nullptr;
  for (ReusedUpload& u : upload_cache_) {
    if (int64_t(u.bytes.size()) == bytes && std::equal(u.bytes.begin(), u.bytes.end(), h)) {
      u.last_used = upload_clock_;
      ++uploads_reused_;
      return u.device.f();
    }
    if (slot == nullptr || u.last_used < slot->last_used) slot = &u;
  }
  if (int(upload_cache_.size()) < kUploadCacheSlots) {
    upload_cache_.emplace_back();
    slot = &upload_cache_.back();
  }
  // The slot's old copy may still be read by kernels already enqueued: the new bytes go into a
  // fresh buffer (the old one returns to the pool, reused in stream order).
  slot->bytes.assign(h, h + bytes);
  slot->device = upload(host, bytes);
  slot->last_used = upload_clock_;
  ++uploads_cached_;
  return slot->device.f();
}

void CudaBackend::copy(float* dst, const float* src, int64_t n) {
  drop_shadows_over(dst, n * 4);
  if (n > 0 && dst != src)
    GPU_CHECK(gpuMemcpyAsync(dst, src, size_t(n) * 4, gpuMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(float* dst, float value, int64_t n) {
  drop_shadows_over(dst, n * 4);
  gpu_fill(stream_, dst, value, n);
}

void CudaBackend::to_host(void* host, const void* src, int64_t bytes) {
  if (bytes > 0) GPU_CHECK(gpuMemcpyAsync(host, src, size_t(bytes), gpuMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::from_host(void* dst, const void* host, int64_t bytes) {
  drop_shadows_over(dst, bytes);
  copy_to_device(dst, host, bytes);
}

GemmOperand CudaBackend::operand(const float* p, int64_t rows, int64_t cols, int64_t ld, bool trans, bool bf16,
                                 DeviceBuffer& holder) {
  if (!bf16) return f32_operand(p, ld, trans);
  holder = DeviceBuffer(this, rows * cols * 2);
  gpu_to_bf16(stream_, p, rows, cols, ld, holder.h());
  return bf16_operand(holder.h(), cols, trans);
}

void CudaBackend::gemm_bf16_out(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A,
                                const GemmOperand& B, float beta, const bf16_t* C_in, bf16_t* D, int64_t ldc,
                                const GemmBatch& batch) {
  if (gemm_->run_bf16_out(M, N, K, alpha, A, B, beta, C_in, D, ldc, batch)) return;
  ZAYA_CHECK(ldc == N && (batch.count == 1 || batch.stride_c == M * N),
             "gemm_bf16_out: the fp32 way needs contiguous outputs");
  ++bf16_out_fallbacks_;
  const int64_t n = batch.count * M * N;
  DeviceBuffer c(this, n * 4);
  if (beta != 0.0f) gpu_from_bf16(stream_, C_in, n, c.f());
  GemmBatch b = batch;
  b.stride_c = M * N;
  gemm(M, N, K, alpha, A, B, beta, c.f(), N, b);
  gpu_to_bf16(stream_, c.f(), 1, n, n, D);
}

GemmOperand CudaBackend::weight_operand(const float* w, int64_t rows, int64_t cols, bool trans, bool bf16,
                                        DeviceBuffer& holder) {
  if (!bf16 || !weights_frozen_) return operand(w, rows, cols, cols, trans, bf16, holder);
  auto it = shadows_.find(reinterpret_cast<uintptr_t>(w));
  if (it != shadows_.end() && (it->second.rows != rows || it->second.cols != cols)) {
    WeightShadow stale = std::move(it->second);  // freed after the erase (pool_put reads shadows_)
    forget_shadow(stale);
    shadows_.erase(it);
    shadow_keys_.erase(reinterpret_cast<uintptr_t>(w));
    it = shadows_.end();
  }
  if (it == shadows_.end()) {
    if (shadow_bytes_ + rows * cols * 2 > shadow_budget_) {  // over the budget: convert per call
      ++shadows_declined_;
      return operand(w, rows, cols, cols, trans, bf16, holder);
    }
    WeightShadow sh;
    sh.bf16 = DeviceBuffer(this, rows * cols * 2);
    sh.rows = rows;
    sh.cols = cols;
    gpu_to_bf16(stream_, w, rows, cols, cols, sh.bf16.h());
    it = shadows_.emplace(reinterpret_cast<uintptr_t>(w), std::move(sh)).first;
    shadow_keys_.insert(reinterpret_cast<uintptr_t>(w));
    shadow_bytes_ += rows * cols * 2;
    ++shadows_built_;
  }
  return bf16_operand(it->second.bf16.h(), cols, trans);
}

void CudaBackend::set_weights_frozen(bool frozen) {
  if (frozen && !weights_frozen_) {
    shadow_budget_ = options_.weight_shadow_budget_bytes;
    if (shadow_budget_ < 0) {  // half of what is free on the device and cached in the pool
      size_t free_bytes = 0, total_bytes = 0;
      GPU_CHECK(gpuMemGetInfo(&free_bytes, &total_bytes));
      int64_t cached = 0;
      for (const auto& kv : free_) cached += kv.first;
      shadow_budget_ = (int64_t(free_bytes) + cached) / 2;
    }
  }
  weights_frozen_ = frozen;
  if (frozen) return;
  auto dying = std::move(shadows_);  // freed at the end of this scope, with shadows_ already empty
  shadows_.clear();
  shadow_keys_.clear();
  shadow_bytes_ = 0;
}

// The shadows are of distinct, non-overlapping weight matrices, so at most one starts before p
// and reaches into the range. Their buffers are released after the maps are updated (releasing
// calls pool_put, which comes back here).
void CudaBackend::drop_shadows_over(const void* p, int64_t bytes) {
  if (shadow_keys_.empty() || bytes <= 0) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + uintptr_t(bytes);
  auto key = shadow_keys_.lower_bound(lo);
  if (key != shadow_keys_.begin()) {
    const auto before = std::prev(key);
    const WeightShadow& sh = shadows_.at(*before);
    if (*before + uintptr_t(sh.rows * sh.cols * 4) > lo) key = before;
  }
  std::vector<WeightShadow> dying;
  while (key != shadow_keys_.end() && *key < hi) {
    auto it = shadows_.find(*key);
    forget_shadow(it->second);
    dying.push_back(std::move(it->second));
    shadows_.erase(it);
    key = shadow_keys_.erase(key);
  }
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

int cuda_device_count() {
  int count = 0;
  if (gpuGetDeviceCount(&count) != gpuSuccess) {
    (void)gpuGetLastError();
    return 0;
  }
  return count;
}

bool cuda_tensor_core_kernels_built() {
#if defined(ZAYA_GPU_MMA_SYNC)
  return true;
#else
  return false;
#endif
}

}  // namespace zaya
