// XXH64 (Yann Collet's xxHash, 64-bit variant, seed 0): the checkpoint checksums. Fast enough to run
// over every byte written at memory speed; written "xxh64:<16 hex digits>" in metadata.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dlm::ckpt::detail {

std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed = 0);
std::string checksum_string(const void* data, std::size_t size);

}  // namespace dlm::ckpt::detail
