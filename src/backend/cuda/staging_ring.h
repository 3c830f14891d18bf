// Where the GPU backend stages a small host-to-device upload in its pinned buffer, so that the
// copy runs asynchronously in stream order (a copy from pageable memory is staged by the driver
// on CUDA and, on HIP, made synchronous: the backend waited for the GPU after each one). Plain
// C++, tested on the host (tests/unit/test_staging_ring.cpp).
//
// The buffer is `chunks` chunks of `chunk_bytes`. Uploads take consecutive 16-byte-aligned
// places in the current chunk; one that does not fit moves the ring on to the next chunk,
// wrapping round. A place may be written only once the copies that read it before have run: the
// backend records an event on its stream when the ring leaves a chunk (every copy from that chunk
// is enqueued by then) and waits for that event before the ring writes into the chunk again.
#pragma once

#include <cstdint>
#include <vector>

namespace zaya {

class StagingRing {
 public:
  struct Place {
    int64_t offset = 0;  // bytes from the buffer's start
    int chunk = 0;       // the chunk it lies in
    int left = -1;       // the chunk the ring has just left (record its event now), or -1
    bool wait = false;   // wait for `chunk`'s event before writing: the ring left it before
  };

  // chunk_bytes: a positive multiple of 16; chunks: at least 2 (with one, leaving the chunk and
  // coming back would wait for every copy at once).
  StagingRing(int64_t chunk_bytes, int chunks)
      : chunk_bytes_(chunk_bytes), chunks_(chunks), left_before_(size_t(chunks > 0 ? chunks : 0), false) {}

  bool valid() const { return chunk_bytes_ > 0 && chunk_bytes_ % 16 == 0 && chunks_ >= 2; }
  int64_t chunk_bytes() const { return chunk_bytes_; }
  int chunks() const { return chunks_; }
  int64_t bytes() const { return chunk_bytes_ * chunks_; }

  // The place for an upload of `bytes` (1 to chunk_bytes()).
  Place reserve(int64_t bytes) {
    const int64_t size = (bytes + 15) / 16 * 16;
    Place p;
    if (used_ + size > chunk_bytes_) {
      p.left = current_;
      left_before_[size_t(current_)] = true;
      current_ = (current_ + 1) % chunks_;
      used_ = 0;
      p.wait = left_before_[size_t(current_)];
    }
    p.chunk = current_;
    p.offset = int64_t(current_) * chunk_bytes_ + used_;
    used_ += size;
    return p;
  }

 private:
  int64_t chunk_bytes_;
  int chunks_;
  int current_ = 0;
  int64_t used_ = 0;                // bytes taken in the current chunk
  std::vector<bool> left_before_;   // whether the ring has left each chunk at least once
};

}  // namespace zaya
