// CRC32C (Castagnoli) checksums for stored KV blocks: a table-driven portable reference and an
// SSE4.2 path chosen at run time. Both follow the usual convention (pre- and post-inverted), so
// crc32c(b, crc32c(a)) == crc32c(a || b) and crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ct::store {

// Fastest available implementation; `crc` continues a previous result (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// Byte-at-a-time table implementation: the reference the fast path is tested against.
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

// True when crc32c() uses the SSE4.2 instruction on this CPU.
bool crc32c_hardware_available();

}  // namespace ct::store
