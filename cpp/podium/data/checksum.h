// podium::data::word_sum — the checksum of a summed read (podium.rdma's
// read_into(..., checksum=True), docs/data_summed.md).
//
// A reader that checks what it read (the RL example's weight slots, docs/rl.md) would make a
// second pass over the bytes after the transfer; podium computes the sum instead on the thread
// that completes the transfer, right after the copy, while the bytes are still in its cache
// (python/bindings/data_transfer.cc, DA-41). The engine itself does not know about it.
//
// Threads: pure functions, no state.
// Invariants:
//   DA-40 word_sum(p, n) is the wrapping (mod 2^64) sum of the little-endian 64-bit words of
//         the n bytes at p, the last partial word zero-padded: equal, whatever p's alignment
//         and on any host byte order, to summing numpy.frombuffer(bytes + zero padding,
//         "<u8") with uint64 wrap-around. So the sum of a whole is the sum of its parts when
//         they are cut at multiples of 8 bytes (a reader subtracts a header's words).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace podium::data {

// DA-40. Reads each byte once, 16 at a time, into 4 accumulators: near the cache's read
// bandwidth.
uint64_t word_sum(const void* data, size_t size);
// DA-40: what the `size` bytes at `data`, bytes [at, at + size) of a region, bring to the
// region's word_sum: byte j of them weighs 2^(8 * ((at + j) % 8)). So a region's sum is the
// sum of its parts' word_sum_at, wherever they are cut; word_sum(p, n) is word_sum_at(p, n, 0).
uint64_t word_sum_at(const void* data, size_t size, size_t at);

// The little-endian encoding of `sums` (8 bytes each): how a transfer's reply carries them.
std::string encode_sums(const std::vector<uint64_t>& sums);
// The k-th sum of such an encoding (its bytes [8k, 8k + 8) must be there).
uint64_t sum_at(std::string_view encoded, size_t k);

}  // namespace podium::data
