// CRC-32 (the zip polynomial, 0xEDB88320 reflected) of torch.save archives' entries (libckpt internal).
#pragma once

#include <cstdint>
#include <span>

namespace dlm::ckpt::detail {

std::uint32_t crc32(std::span<const std::uint8_t> bytes, std::uint32_t previous = 0);

}  // namespace dlm::ckpt::detail
