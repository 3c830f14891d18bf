// Document resets (reset_at_document_boundary) under context parallelism: each chunk row comes
// with its tokens' document starts as positions within the whole sequence, and the ops that see
// only the chunk need them restated. The attention takes them as given (keys are indexed over
// the gathered sequence); the delayed value takes them relative to the chunk; the convolution,
// which runs over the P rows received from the previous chunk followed by the chunk's own, takes
// a start table of those P + T rows, in which received rows of an earlier document fall into a
// separate (unused) document so that the chunk's first document sees zeros before its start. A
// document that begins at the sequence's first position starts at extended row 0: the rows the
// first chunk receives are zeros, so the chunk needs no start there.
#pragma once
#include <cstdint>
#include <vector>

namespace zaya {

struct ChunkSegments {
  std::vector<int32_t> relative;         // [B*T] start - pos0 (negative: began in an earlier chunk)
  std::vector<int32_t> extended;         // [B*(P+T)] per row: the received rows, then the chunk's
  std::vector<uint8_t> starts_at_chunk;  // [B] 1 when a document begins at the chunk's first token
  // Whether any extended row holds a document start (a nonzero entry). When none does, every
  // sequence's received rows and chunk are one document, and the convolution over them equals
  // the plain one from the received state, without a start table (the faster path).
  bool conv_has_starts = false;
};

// absolute [B*T]: for row b (pos0[b] = its chunk's first position), token t's document start,
// a position in [0, pos0[b] + t] that equals either the token's own position or the previous
// token's start (the first token of a chunk may start anywhere before it). Fails with an error
// naming the row and position otherwise. P: the rows the convolution receives (>= 0).
ChunkSegments chunk_segments(const int32_t* absolute, const int64_t* pos0, int64_t B, int64_t T, int64_t P);

}  // namespace zaya
