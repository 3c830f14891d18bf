// The fiber scheduler and the warp-wide instructions of the host GPU emulation (simt_runtime.h).
// Each thread of a block is a fiber with its own stack (simt_fiber_context.h). The block runs in
// passes: each pass resumes, in the schedule's order, every fiber that is not waiting, until all
// have exited. A fiber that waits or exits picks the pass's next runnable fiber itself and
// switches straight to it (one switch per wait, not two through the scheduler); the scheduler
// only starts each pass and sees it end. A fiber waits at a barrier (the block's, or its warp's
// for a collective) until the barrier's generation moves on.
// Collective deposits are double-buffered by the barrier's generation: a lane can only overwrite
// a slot after every lane has passed the next barrier, so after it has read the slot.
#include "simt_runtime.h"

#include "simt_fiber_context.h"
#include "simt_racecheck.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define ZAYA_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZAYA_SIMT_ASAN 1
#endif
#endif
#if defined(ZAYA_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace zaya::simt {

namespace {

constexpr size_t kStackBytes = size_t(256) << 10;
constexpr int kWarp = GPU_WARP_SIZE;

struct Barrier {
  int arrived = 0;
  uint64_t generation = 0;
  // What the race checking orders a generation's arrivals before its departures by
  // (simt_racecheck.h): one of two per barrier of a fiber set, by the generation's parity. The
  // threads of one generation take theirs before any thread reaches the next one, which takes
  // the other.
  const unsigned char* order = nullptr;
};

// Barrier::order's objects: per fiber set, the block's barrier, then each warp's.
constexpr int kMaxWarps = 1024 / GPU_WARP_SIZE;
unsigned char g_barrier_order[racecheck::kFiberSets][1 + kMaxWarps][2];
// The race checking's order of the host before each block and of every block before the host
// after the launch.
unsigned char g_block_start, g_launch_end;

struct PendingCopy {
  void* dst = nullptr;
  unsigned char bytes[16] = {};
};

struct Fiber {
  FiberContext ctx;
  unsigned char* stack = nullptr;  // one of g_stacks
  void* race_fiber = nullptr;       // the race checking's fiber (simt_racecheck.h), or null
  dim3 tid;
  int linear = 0;
  bool done = false;
  const uint64_t* wait_generation = nullptr;  // waiting while *wait_generation == wait_value
  uint64_t wait_value = 0;
  std::vector<PendingCopy> open_group;
  std::vector<std::vector<PendingCopy>> committed;
#if defined(ZAYA_SIMT_ASAN)
  void* fake_stack = nullptr;
#endif
};

struct WarpState {
  Barrier barrier;
  Collective kind[2][kWarp] = {};
  unsigned char slots[2][kWarp][kWarpDepositBytes] = {};
};

// Frees what std::aligned_alloc returned.
struct AlignedFree {
  void operator()(unsigned char* p) const { std::free(p); }
};

// Where the running pass (run_block) stands: the next thread in the schedule's order to look at,
// whether any thread ran, how many are alive, and (for the "ahead" order) the barrier releases
// seen, so that a release starts the scan over.
struct Pass {
  size_t next = 0;
  bool progress = false;
  int alive = 0;
  uint64_t seen_releases = 0;
};

struct Block {
  dim3 grid, dim, idx;
  std::unique_ptr<unsigned char[], AlignedFree> smem;  // 128-byte aligned, as the hardware's
  unsigned char* shared = nullptr;  // the dynamic shared memory: smem, or the race checking's buffer
  size_t smem_bytes = 0;
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  Barrier barrier;
  int exited = 0;
  uint64_t releases = 0;  // barriers released so far (the block's or a warp's)
  Pass pass;
  const std::function<void()>* kernel = nullptr;
};

// The schedule ZAYA_SIMT_SCHEDULE names (simt_runtime.h); a word it does not know stops the run.
Schedule schedule_from_environment() {
  Schedule s;
  const char* env = std::getenv("ZAYA_SIMT_SCHEDULE");
  if (!env) return s;
  const std::string list = env;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string word = list.substr(start, end - start);
    if (word == "ahead") s.round_robin = false;
    else if (word == "reverse") s.reverse = true;
    else if (word == "copies_at_issue") s.copies_at_issue = true;
    else if (!word.empty()) {
      std::fprintf(stderr, "simt: ZAYA_SIMT_SCHEDULE=%s: unknown word '%s' (expected ahead, reverse, copies_at_issue)\n",
                   env, word.c_str());
      std::exit(2);
    }
    start = end + 1;
  }
  return s;
}

Schedule g_schedule = schedule_from_environment();
// Fiber stacks, reused by every launch; one set per fiber set of the race checking.
std::vector<std::unique_ptr<unsigned char[]>> g_stacks[racecheck::kFiberSets];
void* g_scheduler_race_fiber = nullptr;
Block* g_block = nullptr;
Fiber* g_current = nullptr;
FiberContext g_scheduler;
#if defined(ZAYA_SIMT_ASAN)
void* g_scheduler_fake_stack = nullptr;
const void* g_scheduler_stack_bottom = nullptr;
size_t g_scheduler_stack_size = 0;
bool g_switching_from_scheduler = false;  // fiber_entry learns the scheduler's stack from that switch
#endif

// A kernel's fault, reported from a fiber: no exception can unwind from a fiber's stack to
// simt::launch's caller, so the run stops here with the reason.
[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "simt: %s\n", why.c_str());
  std::abort();
}

Fiber& current() {
  if (!g_current) fail("simt", "a GPU builtin was called outside simt::launch");
  return *g_current;
}

// Whether [p, p + bytes) lies in the running block's shared memory.
bool in_shared(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  return c >= g_block->shared && c + bytes <= g_block->shared + g_block->smem_bytes;
}

bool runnable(const Fiber& f) {
  return !f.done && !(f.wait_generation && *f.wait_generation == f.wait_value);
}

// The running pass's next thread to run, or null when the pass is over. Round robin: each
// thread in turn, once. Ahead: the first runnable thread after the last one run, and after a
// barrier was released, the first runnable thread from the start (the threads it freed may
// come first).
Fiber* next_in_pass() {
  Block& blk = *g_block;
  Pass& p = blk.pass;
  const size_t n = blk.fibers.size();
  if (!g_schedule.round_robin && blk.releases != p.seen_releases) {
    p.seen_releases = blk.releases;
    p.next = 0;
  }
  for (; p.next < n; ++p.next) {
    Fiber& f = blk.fibers[g_schedule.reverse ? n - 1 - p.next : p.next];
    if (g_schedule.round_robin) {
      if (f.done) continue;
      ++p.alive;
    }
    if (!runnable(f)) continue;
    f.wait_generation = nullptr;
    ++p.next;
    p.progress = true;
    return &f;
  }
  return nullptr;
}

// From a fiber to the pass's next thread, or to the scheduler when the pass is over (ended: the
// fiber has exited and is never resumed).
void switch_away(bool ended) {
  Fiber& f = current();
  Fiber* next = next_in_pass();
  FiberContext finished;  // where an ended fiber's registers go: never resumed
  FiberContext& from = ended ? finished : f.ctx;
#if defined(ZAYA_SIMT_ASAN)
  if (next)
    __sanitizer_start_switch_fiber(ended ? nullptr : &f.fake_stack, next->stack, kStackBytes);
  else
    __sanitizer_start_switch_fiber(ended ? nullptr : &f.fake_stack, g_scheduler_stack_bottom,
                                   g_scheduler_stack_size);
#endif
  if (next) {
    g_current = next;
#if defined(ZAYA_SIMT_ASAN)
    g_switching_from_scheduler = false;  // a thread that starts now learns no scheduler stack
#endif
    racecheck::switching_to(next->race_fiber);
    fiber_switch(from, next->ctx);
  } else {
    racecheck::switching_to(g_scheduler_race_fiber);
    fiber_switch(from, g_scheduler);
  }
  // Resumed (never when ended): by the scheduler or by another fiber, which set g_current.
#if defined(ZAYA_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

void wait_at(Barrier& b, int expected) {
  const uint64_t generation = b.generation;
  const unsigned char* order = b.order + (generation & 1);
  racecheck::release(order);
  if (++b.arrived >= expected) {
    b.arrived = 0;
    ++b.generation;
    ++g_block->releases;
    racecheck::acquire(order);
    return;
  }
  Fiber& f = current();
  f.wait_generation = &b.generation;
  f.wait_value = generation;
  switch_away(false);
  racecheck::acquire(order);
}

// Threads that exited count as arrived at the block barrier (as on the hardware).
void release_block_barrier_if_complete() {
  Block& blk = *g_block;
  const int live = int(blk.fibers.size()) - blk.exited;
  if (blk.barrier.arrived > 0 && blk.barrier.arrived >= live) {
    blk.barrier.arrived = 0;
    ++blk.barrier.generation;
    ++blk.releases;
  }
}

void fiber_entry() {
#if defined(ZAYA_SIMT_ASAN)
  if (g_switching_from_scheduler) {
    g_switching_from_scheduler = false;
    __sanitizer_finish_switch_fiber(nullptr, &g_scheduler_stack_bottom, &g_scheduler_stack_size);
  } else {
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
  }
#endif
  racecheck::acquire(&g_block_start);
  (*g_block->kernel)();
  // An exited thread counts as arrived at the block's later barriers.
  racecheck::release(&g_launch_end);
  racecheck::release(g_block->barrier.order);
  racecheck::release(g_block->barrier.order + 1);
  Fiber& f = current();
  f.done = true;
  ++g_block->exited;
  release_block_barrier_if_complete();
  switch_away(true);
}

// From the scheduler to the pass's first thread; returns when the pass is over.
void run_pass_from(Fiber& f) {
  g_current = &f;
#if defined(ZAYA_SIMT_ASAN)
  g_switching_from_scheduler = true;
  __sanitizer_start_switch_fiber(&g_scheduler_fake_stack, f.stack, kStackBytes);
#endif
  racecheck::switching_to(f.race_fiber);
  fiber_switch(g_scheduler, f.ctx);
#if defined(ZAYA_SIMT_ASAN)
  g_switching_from_scheduler = false;
  __sanitizer_finish_switch_fiber(g_scheduler_fake_stack, nullptr, nullptr);
#endif
  g_current = nullptr;
}

// A fresh context on the fiber's stack that starts in fiber_entry.
// Each fiber's stack top is offset by a different multiple of 4 KiB + 64 bytes (under 64 KiB):
// stacks 256 KiB apart would otherwise all map their tops to the same cache sets, and every
// switch would miss.
// Under ASan, the top of the stack is made addressable again first: stacks are reused, and the
// frames a finished fiber left without returning (fiber_entry's, switch_away's) would otherwise
// leave their redzones poisoned where the next thread's frames go.
void make_fiber_context(Fiber& f) {
  const size_t color = (size_t(f.linear) * 4160) % (size_t(64) << 10);
#if defined(ZAYA_SIMT_ASAN)
  constexpr size_t kTop = size_t(8) << 10;
  ASAN_UNPOISON_MEMORY_REGION(f.stack + kStackBytes - color - kTop, kTop);
#endif
  fiber_context_init(f.ctx, f.stack, kStackBytes - color, fiber_entry);
}

// Runs the block on fiber set `set` (simt_racecheck.h).
void run_block(Block& blk, int set) {
  const int threads = int(blk.dim.x * blk.dim.y * blk.dim.z);
  for (int t = 0; t < threads; ++t) {
    Fiber& f = blk.fibers[size_t(t)];
    f.tid = dim3(unsigned(t) % blk.dim.x, unsigned(t) / blk.dim.x % blk.dim.y, unsigned(t) / (blk.dim.x * blk.dim.y));
    f.linear = t;
    f.stack = g_stacks[set][size_t(t)].get();
    f.race_fiber = racecheck::fiber(set, t / kWarp);
    f.done = false;
    f.wait_generation = nullptr;
    f.open_group.clear();
    f.committed.clear();
    make_fiber_context(f);
  }
  blk.exited = 0;
  blk.barrier = Barrier{};
  blk.barrier.order = g_barrier_order[set][0];
  for (size_t w = 0; w < blk.warps.size(); ++w) {
    blk.warps[w].barrier = Barrier{};
    blk.warps[w].barrier.order = g_barrier_order[set][1 + w];
  }
  racecheck::reset_shared();                      // the new block's shared memory
  std::memset(blk.shared, 0xff, blk.smem_bytes);  // NaN in fp32 and bf16 until written
  racecheck::release(&g_block_start);
  for (;;) {
    blk.pass = Pass{};
    blk.pass.seen_releases = blk.releases;
    // Round robin counts the live threads as the pass meets them; ahead, before it starts.
    if (!g_schedule.round_robin) blk.pass.alive = int(blk.fibers.size()) - blk.exited;
    if (Fiber* first = next_in_pass()) run_pass_from(*first);
    const int alive = blk.pass.alive;
    if (alive == 0) return;
    if (!blk.pass.progress)
      fail("simt", "block (" + std::to_string(blk.idx.x) + ", " + std::to_string(blk.idx.y) + ", " +
                       std::to_string(blk.idx.z) + "): " + std::to_string(alive) +
                       " threads wait at a barrier or a warp-wide instruction that the others never reach");
  }
}

float bf16_value(uint32_t pair, bool high) {
  const uint32_t bits = high ? (pair & 0xffff0000u) : (pair << 16);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

const dim3& thread_idx() { return current().tid; }
const dim3& block_idx() { return g_block->idx; }
const dim3& block_dim() { return g_block->dim; }
const dim3& grid_dim() { return g_block->grid; }
int lane() { return current().linear % kWarp; }
unsigned char* dynamic_shared() { return g_block->shared; }

void sync_block() {
  Block& blk = *g_block;
  wait_at(blk.barrier, int(blk.fibers.size()) - blk.exited);
}

WarpDeposits warp_exchange(Collective kind, const void* mine, size_t bytes) {
  if (bytes > kWarpDepositBytes) die("warp_exchange: deposit too large");
  Fiber& f = current();
  const int warp = f.linear / kWarp, ln = f.linear % kWarp;
  if (size_t(warp) >= g_block->warps.size() || g_block->fibers.size() < size_t(kWarp * (warp + 1)))
    die("a warp-wide instruction in a block that is not a whole number of warps");
  WarpState& w = g_block->warps[size_t(warp)];
  const int slot = int(w.barrier.generation & 1);
  {
    const racecheck::Quiet quiet;  // the deposits are the emulation's, ordered by the exchange
    std::memcpy(w.slots[slot][ln], mine, bytes);
  }
  w.kind[slot][ln] = kind;
  // The last lane to arrive checks that every lane is at this instruction, before any lane
  // goes on to read the deposits.
  if (w.barrier.arrived == kWarp - 1) {
    for (int l = 0; l < kWarp; ++l)
      if (w.kind[slot][l] != kind)
        die("block (" + std::to_string(g_block->idx.x) + ", " + std::to_string(g_block->idx.y) + ", " +
            std::to_string(g_block->idx.z) + ") warp " + std::to_string(warp) + ": lanes " + std::to_string(ln) +
            " and " + std::to_string(l) + " are at different warp-wide instructions");
  }
  wait_at(w.barrier, kWarp);
  return WarpDeposits(&w.slots[slot][0][0]);
}

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct Deposit {
    uint32_t a[4], b[2];
  };
  if (kWarp != 32) die("mma.sync in a build whose warps are not 32 lanes");
  Deposit mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  const WarpDeposits deposits = warp_exchange(Collective::Mma, &mine, sizeof(Deposit));
  Deposit all[32];
  for (int l = 0; l < 32; ++l) all[l] = deposits.of<Deposit>(l);
  // PTX ISA, mma.m16n8k16 (lane = 4 group + quad): A(r, k) is in lane 4 (r % 8) + (k % 8) / 2,
  // register (r >= 8) + 2 (k >= 8), high half when k is odd; B(k, n) in lane 4 n + (k % 8) / 2,
  // register k >= 8, high half when k is odd; D(r, c), r = group (+ 8 for d[2], d[3]),
  // c = 2 quad (+ 1 for d[1], d[3]).
  const auto A = [&](int r, int k) {
    return bf16_value(all[4 * (r % 8) + (k % 8) / 2].a[(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], (k & 1) != 0);
  };
  const auto B = [&](int k, int n) { return bf16_value(all[4 * n + (k % 8) / 2].b[k >= 8 ? 1 : 0], (k & 1) != 0); };
  const int ln = lane(), group = ln / 4, quad = ln % 4;
  for (int i = 0; i < 4; ++i) {
    const int r = group + (i >= 2 ? 8 : 0), c = 2 * quad + (i & 1);
    float s = d[i];
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, c);
    d[i] = s;
  }
}

namespace {

template <int N>
void ldmatrix_trans(uint32_t (&r)[N], const uint16_t* row, Collective kind) {
  if (kWarp != 32) die("ldmatrix in a build whose warps are not 32 lanes");
  if (!in_shared(row, 16) || reinterpret_cast<uintptr_t>(row) % 16 != 0)
    die("ldmatrix: a row address outside shared memory or not 16-byte aligned");
  racecheck::reads(row, 16);  // this lane's row: the one it names
  const WarpDeposits rows = warp_exchange(kind, &row, sizeof(row));
  // Matrix j's row i is at lane 8 j + i's address; transposed, lane (4 group + quad) receives
  // rows 2 quad and 2 quad + 1 of column group.
  const int ln = lane(), group = ln / 4, quad = ln % 4;
  for (int j = 0; j < N; ++j) {
    const uint16_t lo = rows.of<const uint16_t*>(8 * j + 2 * quad)[group],
                   hi = rows.of<const uint16_t*>(8 * j + 2 * quad + 1)[group];
    r[j] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  // The warp reads shared memory at one moment: no lane goes on (and may store) before every
  // lane has read.
  const unsigned char done = 1;
  warp_exchange(kind, &done, 1);
}

}  // namespace

void ldmatrix_trans2(uint32_t (&r)[2], const uint16_t* row) { ldmatrix_trans<2>(r, row, Collective::Ldmatrix2); }
void ldmatrix_trans4(uint32_t (&r)[4], const uint16_t* row) { ldmatrix_trans<4>(r, row, Collective::Ldmatrix4); }

void sync_warp() {
  const unsigned char here = 1;
  warp_exchange(Collective::SyncWarp, &here, 1);
}

void set_schedule(const Schedule& s) { g_schedule = s; }
const Schedule& schedule() { return g_schedule; }

void cp_async16(void* shared_dst, const void* global_src, bool valid) {
  if (!in_shared(shared_dst, 16) || reinterpret_cast<uintptr_t>(shared_dst) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(global_src) % 16 != 0)
    die("cp.async: a destination outside shared memory, or an address not 16-byte aligned");
  if (valid) racecheck::reads(global_src, 16);
  // The copy writes its destination at some moment between its issue and its thread's wait, so
  // the race checking records the write at both: at the issue, against reads not ordered before
  // it (a prefetch into a tile another warp may still be reading); at the wait (below), against
  // reads not ordered after it.
  racecheck::writes(shared_dst, 16);
  if (g_schedule.copies_at_issue) {
    if (valid) std::memcpy(shared_dst, global_src, 16);
    else std::memset(shared_dst, 0, 16);
    return;
  }
  const racecheck::Quiet quiet;  // the copies in flight are the emulation's
  PendingCopy c;
  c.dst = shared_dst;
  if (valid) std::memcpy(c.bytes, global_src, 16);
  current().open_group.push_back(c);
}

void cp_async_commit() {
  const racecheck::Quiet quiet;
  Fiber& f = current();
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}

void cp_async_wait(int pending) {
  Fiber& f = current();
  while (int(f.committed.size()) > pending) {
    for (const PendingCopy& c : f.committed.front()) racecheck::writes(c.dst, 16);
    const racecheck::Quiet quiet;
    for (const PendingCopy& c : f.committed.front()) std::memcpy(c.dst, c.bytes, 16);
    f.committed.erase(f.committed.begin());
  }
}

void launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& kernel) {
  if (g_block) fail("simt", "launch from inside a kernel");
  const size_t threads = size_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024) fail("simt", "launch: " + std::to_string(threads) + " threads per block");
  Block blk;
  blk.grid = grid;
  blk.dim = block;
  blk.kernel = &kernel;
  blk.fibers.resize(threads);
  // Stacks are kept from launch to launch (a whole backend's tests launch thousands of kernels).
  for (auto& stacks : g_stacks)
    while (stacks.size() < threads) stacks.emplace_back(new unsigned char[kStackBytes]);
  g_scheduler_race_fiber = racecheck::host_fiber();
  blk.warps.resize(threads / kWarp);
  blk.smem_bytes = smem_bytes;
#if defined(ZAYA_SIMT_RACECHECK)
  if (smem_bytes > racecheck::kDynamicSharedBytes)
    fail("simt", "launch: " + std::to_string(smem_bytes) + " bytes of dynamic shared memory, more than the race checking's " +
                     std::to_string(racecheck::kDynamicSharedBytes));
  blk.shared = racecheck::dynamic_shared_memory();
#else
  blk.smem.reset(static_cast<unsigned char*>(std::aligned_alloc(128, (smem_bytes + 127) / 128 * 128 + 128)));
  blk.shared = blk.smem.get();
#endif
  g_block = &blk;
  try {
    size_t linear = 0;  // consecutive blocks run on different fiber sets
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          blk.idx = dim3(x, y, z);
          run_block(blk, int(linear++ % racecheck::kFiberSets));
        }
  } catch (...) {
    racecheck::acquire(&g_launch_end);
    g_block = nullptr;
#if defined(ZAYA_SIMT_ASAN)
    // Fibers abandoned at a barrier left their frames on these stacks: all addressable again.
    for (auto& stacks : g_stacks)
      for (size_t t = 0; t < threads; ++t) ASAN_UNPOISON_MEMORY_REGION(stacks[t].get(), kStackBytes);
#endif
    throw;
  }
  racecheck::acquire(&g_launch_end);
  g_block = nullptr;
}

}  // namespace zaya::simt
