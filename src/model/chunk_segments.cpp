// chunk_segments: the document-start tables of one context-parallel chunk (see chunk_segments.h).
#include "model/chunk_segments.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace zaya {

ChunkSegments chunk_segments(const int32_t* absolute, const int64_t* pos0, int64_t B, int64_t T, int64_t P) {
  ChunkSegments out;
  out.relative.resize(size_t(B * T));
  out.extended.resize(size_t(B * (P + T)));
  out.starts_at_chunk.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = absolute + b * T;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t position = pos0[b] + t, start = row[t];
      if (start < 0 || start > position || (t > 0 && start != position && start != row[t - 1]))
        fail("model",
             "document start table of context-parallel chunk row " + std::to_string(b) + " (positions " +
                 std::to_string(pos0[b]) + ".." + std::to_string(pos0[b] + T - 1) + "): position " +
                 std::to_string(position) + " has start " + std::to_string(start),
             "each entry must equal its own position (a document starts) or the previous entry, and the "
             "first may be any earlier position");
      out.relative[size_t(b * T + t)] = int32_t(start - pos0[b]);
    }
    out.starts_at_chunk[size_t(b)] = row[0] == pos0[b];
    // Row e of the extended rows is position pos0 - P + e. The received rows before the chunk's
    // first document form a document of their own from e = 0 (their outputs are unused).
    const int64_t origin = pos0[b] - P;
    const int64_t first = row[0] - origin;  // the first document's start, in extended rows
    int32_t* ext = out.extended.data() + b * (P + T);
    for (int64_t e = 0; e < P; ++e) ext[e] = int32_t(first > 0 && e >= first ? first : 0);
    // A document that begins at the sequence's first position starts at e = 0: the rows the first
    // chunk receives are zeros, as before a start.
    for (int64_t t = 0; t < T; ++t)
      ext[P + t] = int32_t(row[t] == 0 ? 0 : std::max<int64_t>(0, row[t] - origin));
    out.conv_has_starts =
        out.conv_has_starts || std::any_of(ext, ext + P + T, [](int32_t v) { return v != 0; });
  }
  return out;
}

}  // namespace zaya
